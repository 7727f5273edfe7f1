//! Strategic merge patch for the built-in types, the subset kube-rs and kubectl send.
//!
//! Maps merge recursively and `null` deletes a key. Lists whose Go field carries a patch
//! merge key (`containers` by `name`, `conditions` by `type`, `ownerReferences` by `uid`,
//! ...) merge element by element; `finalizers` merges as a set of strings; every other list
//! is replaced. Directives: `$patch: replace|delete` (in maps and list elements),
//! `$deleteFromPrimitiveList/<field>`, `$retainKeys`; `$setElementOrder/<field>` is ignored.

use serde_json::{Map, Value};

/// The merge key of a list field, by field name (the same key wherever the field occurs).
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "conditions" | "addresses" => "type",
        "ownerReferences" => "uid",
        "taints" => "key",
        "hostAliases" => "ip",
        _ => return None,
    })
}

/// List fields of strings that merge as sets.
fn merges_primitives(field: &str) -> bool {
    field == "finalizers"
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// Applies a strategic merge `patch` to `target`.
///
/// # Errors
/// A description of a malformed patch (not an object, unknown `$patch` value).
pub(crate) fn apply(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(p) = patch else {
        return Err("strategic merge patch must be a JSON object".into());
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        unreachable!("target was just made an object")
    };
    merge_map(t, p)
}

fn merge_map(target: &mut Map<String, Value>, patch: &Map<String, Value>) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = match strip_directives(&Value::Object(patch.clone())) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            return Ok(());
        }
        Some("delete") => {
            target.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other:?}")),
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()) || patch.contains_key(k));
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = value.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = target.get_mut(field) {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(pm) => {
                if let Some(d) =
                    directive(value).filter(|d| !matches!(*d, "replace" | "merge" | "delete"))
                {
                    return Err(format!("unknown patch type: {d:?}"));
                }
                if directive(value) == Some("delete") {
                    target.remove(key);
                } else if let Some(Value::Object(tm)) = target.get_mut(key) {
                    merge_map(tm, pm)?;
                } else {
                    target.insert(key.clone(), strip_directives(value));
                }
            }
            Value::Array(pl) => {
                let merged = match target.remove(key) {
                    Some(Value::Array(tl)) => merge_list(key, tl, pl)?,
                    _ => merge_list(key, Vec::new(), pl)?,
                };
                target.insert(key.clone(), Value::Array(merged));
            }
            scalar => {
                target.insert(key.clone(), scalar.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(field: &str, mut target: Vec<Value>, patch: &[Value]) -> Result<Vec<Value>, String> {
    if patch.iter().any(|e| directive(e) == Some("replace")) {
        return Ok(patch
            .iter()
            .filter(|e| directive(e) != Some("replace"))
            .map(strip_directives)
            .collect());
    }
    if merges_primitives(field) {
        for item in patch {
            if !target.contains(item) {
                target.push(item.clone());
            }
        }
        return Ok(target);
    }
    let Some(key) = merge_key(field) else {
        return Ok(patch
            .iter()
            .filter(|e| directive(e).is_none())
            .map(strip_directives)
            .collect());
    };
    for item in patch {
        let Some(id) = item.get(key) else {
            if directive(item).is_none() {
                target.push(strip_directives(item));
            }
            continue;
        };
        let pos = target.iter().position(|t| t.get(key) == Some(id));
        match (directive(item), pos) {
            (Some("delete"), Some(i)) => {
                target.remove(i);
            }
            (Some("delete"), None) => {}
            (_, Some(i)) => {
                if let (Value::Object(tm), Value::Object(pm)) = (&mut target[i], item) {
                    merge_map(tm, pm)?;
                } else {
                    target[i] = strip_directives(item);
                }
            }
            (_, None) => target.push(strip_directives(item)),
        }
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(target: Value, patch: Value) -> Value {
        let mut t = target;
        apply(&mut t, &patch).unwrap();
        t
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        let out = patched(t, json!({"metadata": {"labels": {"a": null, "c": "3"}}}));
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": 1}})
        );
    }

    #[test]
    fn containers_merge_by_name() {
        let t = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        let out = patched(
            t,
            json!({"spec": {"containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}]}}),
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "a", "image": "x"}, {"name": "b", "image": "z"}, {"name": "c", "image": "w"}])
        );
    }

    #[test]
    fn conditions_merge_by_type_and_delete_directive_removes() {
        let t =
            json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "B"}]}});
        let out = patched(
            t,
            json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "$patch": "delete"}]}}),
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "A", "status": "True"}])
        );
    }

    #[test]
    fn finalizers_merge_as_a_set_and_delete_from_primitive_list() {
        let t = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = patched(t.clone(), json!({"metadata": {"finalizers": ["b", "c"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let out = patched(
            t,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn lists_without_merge_key_are_replaced() {
        let t = json!({"spec": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}});
        let out = patched(
            t,
            json!({"spec": {"accessModes": ["ReadWriteMany"], "$setElementOrder/x": []}}),
        );
        assert_eq!(out["spec"]["accessModes"], json!(["ReadWriteMany"]));
    }

    #[test]
    fn replace_directive_replaces_a_map() {
        let t = json!({"spec": {"a": 1, "b": 2}});
        let out = patched(t, json!({"spec": {"$patch": "replace", "c": 3}}));
        assert_eq!(out["spec"], json!({"c": 3}));
    }

    #[test]
    fn rejects_unknown_directives_and_non_objects() {
        let mut t = json!({});
        assert!(apply(&mut t, &json!([1])).is_err());
        assert!(
            apply(
                &mut t,
                &json!({"spec": {"$patch": "explode"}, "x": {"$patch": "bad"}})
            )
            .is_err()
        );
    }
}
