//! Object metadata the server owns: uid, timestamps, generation, generated names, and the
//! per-type defaults controllers rely on.

use serde_json::{Map, Value, json};

use crate::resources::ResourceDef;

/// The current time as RFC 3339 with seconds precision, as the real server writes it.
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A random 5-character suffix from the alphabet the real server uses.
pub(crate) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// `obj.metadata`, created when missing.
pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object")
}

/// A string field of `metadata`.
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// The finalizer the `StorageObjectInUseProtection` admission plugin puts on each claim.
pub(crate) const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The finalizer the `StorageObjectInUseProtection` admission plugin puts on each volume.
pub(crate) const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Adds the protection finalizer of a claim or volume being created (once), as the
/// `StorageObjectInUseProtection` admission plugin does; other objects are left alone.
pub(crate) fn add_protection_finalizer(def: &ResourceDef, obj: &mut Value) {
    let finalizer = match (def.builtin, def.group.as_str(), def.plural.as_str()) {
        (true, "", "persistentvolumeclaims") => PVC_PROTECTION,
        (true, "", "persistentvolumes") => PV_PROTECTION,
        _ => return,
    };
    let meta = meta_mut(obj);
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    let list = list.as_array_mut().expect("made an array above");
    if !list.iter().any(|f| f == finalizer) {
        list.push(json!(finalizer));
    }
}

/// Whether the object has at least one finalizer.
pub(crate) fn has_finalizers(obj: &Value) -> bool {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// Sets a default only when the field is missing or null.
fn default_at(obj: &mut Value, path: &[&str], value: Value) {
    let mut cur = obj;
    for key in &path[..path.len() - 1] {
        if !cur.get(*key).is_some_and(Value::is_object) {
            cur[*key] = json!({});
        }
        cur = &mut cur[*key];
    }
    let last = path[path.len() - 1];
    if cur.get(last).is_none_or(Value::is_null) {
        cur[last] = value;
    }
}

/// Applies the type's defaults and resets status where the real server does on create.
pub(crate) fn apply_create_defaults(def: &ResourceDef, obj: &mut Value) {
    if !def.builtin {
        if def.any_status()
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        return;
    }
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "persistentvolumeclaims") => {
            obj["status"] = json!({"phase": "Pending"});
            default_at(obj, &["spec", "volumeMode"], json!("Filesystem"));
        }
        ("", "persistentvolumes") => {
            obj["status"] = json!({"phase": "Pending"});
            default_at(
                obj,
                &["spec", "persistentVolumeReclaimPolicy"],
                json!("Retain"),
            );
            default_at(obj, &["spec", "volumeMode"], json!("Filesystem"));
        }
        ("", "namespaces") => {
            obj["status"] = json!({"phase": "Active"});
        }
        ("", "pods") => {
            obj["status"] = json!({"phase": "Pending"});
        }
        ("storage.k8s.io", "storageclasses") => {
            default_at(obj, &["reclaimPolicy"], json!("Delete"));
            default_at(obj, &["volumeBindingMode"], json!("Immediate"));
        }
        _ => {}
    }
}

/// Sets uid, creationTimestamp and generation of a new object.
pub(crate) fn init_meta(def: &ResourceDef, obj: &mut Value) {
    let tracks = def.tracks_generation();
    let meta = meta_mut(obj);
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    for field in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
    ] {
        meta.remove(field);
    }
    if tracks {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
}

/// The part of an object whose change bumps `metadata.generation`.
fn generation_part<'a>(def: &ResourceDef, obj: &'a Value) -> Vec<(&'a str, &'a Value)> {
    let Some(map) = obj.as_object() else {
        return Vec::new();
    };
    if def.builtin {
        return map
            .get("spec")
            .map(|s| vec![("spec", s)])
            .unwrap_or_default();
    }
    let status_apart = def.any_status();
    map.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "apiVersion" | "kind"))
        .filter(|(k, _)| !(status_apart && k.as_str() == "status"))
        .map(|(k, v)| (k.as_str(), v))
        .collect()
}

/// Carries server-owned metadata from `old` to `new` and bumps generation on spec changes.
pub(crate) fn carry_meta(def: &ResourceDef, old: &Value, new: &mut Value) {
    let old_meta = old
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let spec_changed = generation_part(def, old) != generation_part(def, new);
    let meta = meta_mut(new);
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "name",
    ] {
        match old_meta.get(field) {
            Some(v) => meta.insert(field.to_string(), v.clone()),
            None => meta.remove(field),
        };
    }
    if def.tracks_generation() {
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        meta.insert(
            "generation".into(),
            json!(if spec_changed {
                generation + 1
            } else {
                generation
            }),
        );
    } else {
        meta.remove("generation");
    }
    if !meta.contains_key("managedFields")
        && let Some(mf) = old_meta.get("managedFields")
    {
        meta.insert("managedFields".into(), mf.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    #[test]
    fn suffix_is_five_allowed_characters() {
        let s = name_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
    }

    #[test]
    fn generation_bumps_only_on_spec_change() {
        let reg = Registry::with_builtins();
        let pvc = reg.lookup("", "v1", "persistentvolumeclaims").unwrap();
        let old = json!({"metadata": {"uid": "u", "generation": 1}, "spec": {"a": 1}});
        let mut same = json!({"metadata": {"labels": {"x": "y"}}, "spec": {"a": 1}});
        carry_meta(&pvc, &old, &mut same);
        assert_eq!(same["metadata"]["generation"], 1);
        assert_eq!(same["metadata"]["uid"], "u");
        let mut changed = json!({"metadata": {}, "spec": {"a": 2}});
        carry_meta(&pvc, &old, &mut changed);
        assert_eq!(changed["metadata"]["generation"], 2);
    }

    #[test]
    fn timestamps_have_seconds_precision() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z'));
    }
}
