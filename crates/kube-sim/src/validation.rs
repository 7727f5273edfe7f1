//! Validation a controller author would trip over on a real server: object names,
//! quantities and the required fields of the served types.

use kube_controller_kit::quantity::Quantity;
use serde_json::Value;

use crate::resources::ResourceDef;
use crate::status::{ApiError, ApiResult, Cause};

/// The message the real server gives for a string that is not a quantity.
const QUANTITY_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', \
regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or \
'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Problems of `name` as a DNS-1123 subdomain (a `prefix` may end in `-`).
pub(crate) fn dns1123_subdomain(name: &str, prefix: bool) -> Vec<String> {
    let checked = if prefix {
        name.strip_suffix('-').unwrap_or(name)
    } else {
        name
    };
    let mut errs = Vec::new();
    if name.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if !checked.split('.').all(is_label) {
        errs.push(SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// Problems of `name` as a DNS-1123 label (a `prefix` may end in `-`).
pub(crate) fn dns1123_label(name: &str, prefix: bool) -> Vec<String> {
    let checked = if prefix {
        name.strip_suffix('-').unwrap_or(name)
    } else {
        name
    };
    let mut errs = Vec::new();
    if name.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !is_label(checked) {
        errs.push(LABEL_MSG.to_string());
    }
    errs
}

fn str_at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(obj, |v, k| v.get(k))?.as_str()
}

fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(obj, |v, k| v.get(k))
        .filter(|v| !v.is_null())
}

/// Validates metadata: name (and generateName) and label values.
fn validate_meta(def: &ResourceDef, obj: &Value, causes: &mut Vec<Cause>) {
    let check = if def.builtin && def.plural == "namespaces" {
        dns1123_label
    } else {
        dns1123_subdomain
    };
    if let Some(prefix) = str_at(obj, &["metadata", "generateName"]).filter(|p| !p.is_empty()) {
        for msg in check(prefix, true) {
            causes.push(Cause::invalid(
                "metadata.generateName",
                &Value::from(prefix),
                &msg,
            ));
        }
    }
    match str_at(obj, &["metadata", "name"]) {
        None | Some("") => causes.push(Cause::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(name) if def.builtin && def.plural == "events" => {
            // Event names follow the object they describe plus a suffix: only length is checked.
            if name.len() > 253 {
                causes.push(Cause::invalid(
                    "metadata.name",
                    &Value::from(name),
                    "must be no more than 253 characters",
                ));
            }
        }
        Some(name) => {
            for msg in check(name, false) {
                causes.push(Cause::invalid("metadata.name", &Value::from(name), &msg));
            }
        }
    }
    if let Some(labels) = at(obj, &["metadata", "labels"]).and_then(Value::as_object) {
        for (k, v) in labels {
            let ok = v.as_str().is_some_and(|s| {
                s.len() <= 63
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                    && s.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
                    && s.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
            });
            if !ok {
                causes.push(Cause::invalid(
                    "metadata.labels",
                    v,
                    &format!(
                        "a valid label value for key {k:?} must be 63 characters or less, \
                              consist of alphanumeric characters, '-', '_' or '.', and begin \
                              and end with an alphanumeric character"
                    ),
                ));
            }
        }
    }
}

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
/// The volume sources of a PersistentVolume's spec, by their JSON names: the API server
/// wants exactly one.
pub const PV_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

fn check_access_modes(obj: &Value, causes: &mut Vec<Cause>, required_msg: &str) {
    match at(obj, &["spec", "accessModes"]).and_then(Value::as_array) {
        Some(modes) if !modes.is_empty() => {
            for m in modes {
                if !m.as_str().is_some_and(|m| ACCESS_MODES.contains(&m)) {
                    causes.push(Cause::not_supported("spec.accessModes", m, ACCESS_MODES));
                }
            }
        }
        _ => causes.push(Cause::required("spec.accessModes", required_msg)),
    }
}

/// Checks a storage quantity: unparseable is a 400 (decode error), not positive a 422 cause.
fn check_storage(
    def: &ResourceDef,
    field: &str,
    value: &Value,
    causes: &mut Vec<Cause>,
) -> ApiResult<()> {
    // A JSON number is read as its text, as the real server's decoder does.
    let parsed = match value {
        Value::String(s) => s.parse::<Quantity>().ok(),
        Value::Number(n) => n.to_string().parse::<Quantity>().ok(),
        _ => None,
    };
    match parsed {
        None => Err(ApiError::bad_request(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: {QUANTITY_FORMAT}",
            kind = def.kind
        ))),
        Some(q) if !q.is_positive() => {
            causes.push(Cause::invalid(field, value, "must be greater than zero"));
            Ok(())
        }
        Some(_) => Ok(()),
    }
}

fn check_one_of(obj: &Value, field: &str, allowed: &[&str], causes: &mut Vec<Cause>) {
    if let Some(v) = at(obj, &field.split('.').collect::<Vec<_>>())
        && !v.as_str().is_some_and(|s| allowed.contains(&s))
    {
        causes.push(Cause::not_supported(field, v, allowed));
    }
}

fn validate_builtin(def: &ResourceDef, obj: &Value, causes: &mut Vec<Cause>) -> ApiResult<()> {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "persistentvolumeclaims") => {
            check_access_modes(obj, causes, "at least 1 access mode is required");
            match at(obj, &["spec", "resources", "requests", "storage"]) {
                Some(v) => check_storage(def, "spec.resources[storage]", v, causes)?,
                None => causes.push(Cause::required("spec.resources[storage]", "")),
            }
            check_one_of(obj, "spec.volumeMode", &["Block", "Filesystem"], causes);
        }
        ("", "persistentvolumes") => {
            match at(obj, &["spec", "capacity", "storage"]) {
                Some(v) => check_storage(def, "spec.capacity[storage]", v, causes)?,
                None => causes.push(Cause::required("spec.capacity", "")),
            }
            check_access_modes(obj, causes, "must specify at least 1 access mode");
            let spec = at(obj, &["spec"]).and_then(Value::as_object);
            let sources = PV_SOURCES
                .iter()
                .filter(|s| spec.and_then(|m| m.get(**s)).is_some_and(|v| !v.is_null()))
                .count();
            if sources == 0 {
                causes.push(Cause::required("spec", "must specify a volume type"));
            } else if sources > 1 {
                causes.push(Cause::forbidden(
                    "spec",
                    "may not specify more than 1 volume type",
                ));
            }
            if let Some(csi) = at(obj, &["spec", "csi"]) {
                if str_at(csi, &["driver"]).is_none_or(str::is_empty) {
                    causes.push(Cause::required("spec.csi.driver", ""));
                }
                if str_at(csi, &["volumeHandle"]).is_none_or(str::is_empty) {
                    causes.push(Cause::required("spec.csi.volumeHandle", ""));
                }
            }
            check_one_of(
                obj,
                "spec.persistentVolumeReclaimPolicy",
                &["Delete", "Recycle", "Retain"],
                causes,
            );
            check_one_of(obj, "spec.volumeMode", &["Block", "Filesystem"], causes);
        }
        ("storage.k8s.io", "storageclasses") => {
            if str_at(obj, &["provisioner"]).is_none_or(str::is_empty) {
                causes.push(Cause::required("provisioner", ""));
            }
            check_one_of(obj, "reclaimPolicy", &["Delete", "Retain"], causes);
            check_one_of(
                obj,
                "volumeBindingMode",
                &["Immediate", "WaitForFirstConsumer"],
                causes,
            );
        }
        ("", "events") if at(obj, &["involvedObject"]).is_none() => {
            causes.push(Cause::required("involvedObject", ""));
        }
        ("events.k8s.io", "events") => {
            if at(obj, &["eventTime"]).is_none() {
                causes.push(Cause::required("eventTime", ""));
            }
            if str_at(obj, &["reportingController"]).is_none_or(str::is_empty) {
                causes.push(Cause::required("reportingController", ""));
            }
            check_one_of(obj, "type", &["Normal", "Warning"], causes);
        }
        ("", "configmaps") => check_config_map(obj, causes),
        ("", "pods") => {
            let containers = at(obj, &["spec", "containers"]).and_then(Value::as_array);
            if containers.is_none_or(Vec::is_empty) {
                causes.push(Cause::required("spec.containers", ""));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The most bytes a ConfigMap's `data` and `binaryData` may hold together (the real
/// server's `MaxSecretSize`, 1 MiB).
pub(crate) const MAX_CONFIG_MAP_BYTES: usize = 1024 * 1024;

/// Whether `key` may name a ConfigMap entry: `[-._a-zA-Z0-9]+`, at most 253 bytes, not `.`
/// or `..` (the real server's `IsConfigMapKey`).
fn is_config_map_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A ConfigMap's keys and size, as the real server checks them: every key valid and
/// unique across `data` and `binaryData`, values of `data` strings, and all values
/// together at most [`MAX_CONFIG_MAP_BYTES`] (`Too long: must have at most 1048576 bytes`).
fn check_config_map(obj: &Value, causes: &mut Vec<Cause>) {
    let mut total = 0usize;
    let mut seen = std::collections::HashSet::new();
    for field in ["data", "binaryData"] {
        let Some(map) = at(obj, &[field]).and_then(Value::as_object) else {
            continue;
        };
        for (key, value) in map {
            if !is_config_map_key(key) {
                causes.push(Cause::invalid(
                    format!("{field}[{key}]"),
                    &Value::String(key.clone()),
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' \
                     (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation \
                     is '[-._a-zA-Z0-9]+')",
                ));
            }
            if !seen.insert(key.clone()) {
                causes.push(Cause::invalid(
                    format!("{field}[{key}]"),
                    &Value::String(key.clone()),
                    "duplicate of key present in data",
                ));
            }
            match value.as_str() {
                Some(v) => total += v.len(),
                None => causes.push(Cause::invalid(
                    format!("{field}[{key}]"),
                    value,
                    "must be a string",
                )),
            }
        }
    }
    if total > MAX_CONFIG_MAP_BYTES {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: must have at most {MAX_CONFIG_MAP_BYTES} bytes"),
            field: String::new(),
        });
    }
}

/// Validates an object about to be stored.
///
/// # Errors
/// 422 Invalid with every cause, or 400 BadRequest for a value that cannot be decoded.
pub(crate) fn validate(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    let mut causes = Vec::new();
    validate_meta(def, obj, &mut causes);
    if def.builtin {
        validate_builtin(def, obj, &mut causes)?;
    }
    if def.builtin && def.plural == "customresourcedefinitions" {
        causes.extend(crate::crd::validate(obj));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        let name = str_at(obj, &["metadata", "name"]).unwrap_or_default();
        Err(ApiError::invalid(&def.group, &def.kind, name, causes))
    }
}

/// The beta annotation that named a claim's class before `spec.storageClassName`.
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// What every update of any type is checked for first, as the real server's
/// `ValidateObjectMetaAccessorUpdate`: a `metadata.uid` other than the stored one
/// (`field is immutable`; an empty uid means "keep it"), and new finalizers on an object
/// being deleted. Checked on the object as written, before the server-owned fields are
/// carried over.
pub(crate) fn meta_update_causes(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let old_uid = str_at(old, &["metadata", "uid"]).unwrap_or_default();
    if let Some(uid) = str_at(new, &["metadata", "uid"]).filter(|u| !u.is_empty() && *u != old_uid)
    {
        causes.push(Cause::invalid(
            "metadata.uid",
            &Value::from(uid),
            "field is immutable",
        ));
    }
    if str_at(old, &["metadata", "deletionTimestamp"]).is_some() {
        let finalizers = |obj: &Value| -> Vec<String> {
            at(obj, &["metadata", "finalizers"])
                .and_then(Value::as_array)
                .map(|list| {
                    list.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = finalizers(old);
        let mut added: Vec<String> = finalizers(new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        added.sort();
        added.dedup();
        if !added.is_empty() {
            // Go's `%#v` of a `[]string`.
            let shown: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
            causes.push(Cause::forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new \
                     finalizers []string{{{}}}",
                    shown.join(", ")
                ),
            ));
        }
    }
    causes
}

/// Validates an update: `first` (the causes of [`meta_update_causes`]), then the new
/// object as on create, then the fields the type does not let an update change, all in one
/// 422 as the real server reports them.
///
/// # Errors
/// 422 Invalid naming every violation; 400 for an unreadable quantity.
pub(crate) fn validate_update_all(
    def: &ResourceDef,
    old: &Value,
    new: &Value,
    mut first: Vec<Cause>,
) -> ApiResult<()> {
    if let Err(error) = validate(def, new) {
        if error.code != 422 {
            return Err(error);
        }
        first.extend(error.details.causes);
    }
    if let Err(error) = validate_update(def, old, new) {
        first.extend(error.details.causes);
    }
    if first.is_empty() {
        Ok(())
    } else {
        let name = str_at(new, &["metadata", "name"]).unwrap_or_default();
        Err(ApiError::invalid(&def.group, &def.kind, name, first))
    }
}

/// Checks the fields an update may not change.
///
/// A claim's spec is immutable (`ValidatePersistentVolumeClaimUpdate`) except: the storage
/// request of a Bound claim, `volumeAttributesClassName`, `volumeName` while it was unset,
/// and `storageClassName` while it was unset when set to the value of the beta annotation
/// `volume.beta.kubernetes.io/storage-class` (which is itself immutable).
///
/// # Errors
/// 422 Invalid naming the immutable field.
pub(crate) fn validate_update(def: &ResourceDef, old: &Value, new: &Value) -> ApiResult<()> {
    let mut causes = Vec::new();
    match (def.builtin, def.group.as_str(), def.plural.as_str()) {
        (true, "", "persistentvolumeclaims") => {
            let beta = |v: &Value| {
                at(v, &["metadata", "annotations", BETA_STORAGE_CLASS])
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let (old_beta, new_beta) = (beta(old), beta(new));
            if old_beta != new_beta {
                let shown = new_beta.clone().map_or(Value::Null, Value::from);
                causes.push(Cause::invalid(
                    format!("metadata.annotations[{BETA_STORAGE_CLASS}]"),
                    &shown,
                    "field is immutable",
                ));
            }
            let bound = str_at(new, &["status", "phase"]) == Some("Bound");
            let strip = |v: &Value| {
                let mut spec = v.get("spec").cloned().unwrap_or(Value::Null);
                if let Some(m) = spec.as_object_mut() {
                    if bound
                        && let Some(r) = m
                            .get_mut("resources")
                            .and_then(|r| r.get_mut("requests"))
                            .and_then(Value::as_object_mut)
                    {
                        r.remove("storage");
                    }
                    m.remove("volumeAttributesClassName");
                    let unset = |field: &str| {
                        old.get("spec")
                            .and_then(|s| s.get(field))
                            .is_none_or(|x| x.is_null() || x == "")
                    };
                    // volumeName may be set once.
                    if unset("volumeName") {
                        m.remove("volumeName");
                    }
                    // storageClassName may be set once, to the beta annotation's class.
                    let class = new
                        .get("spec")
                        .and_then(|s| s.get("storageClassName"))
                        .and_then(Value::as_str);
                    if unset("storageClassName") && class.is_some() && class == old_beta.as_deref()
                    {
                        m.remove("storageClassName");
                    }
                }
                spec
            };
            if strip(old) != strip(new) {
                causes.push(Cause::forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and \
                     volumeAttributesClassName for bound claims",
                ));
            }
        }
        (true, "storage.k8s.io", "storageclasses") => {
            for field in [
                "provisioner",
                "parameters",
                "reclaimPolicy",
                "volumeBindingMode",
            ] {
                if old.get(field) != new.get(field) {
                    causes.push(Cause::forbidden(
                        field,
                        &format!("updates to {field} are forbidden."),
                    ));
                }
            }
        }
        _ => {}
    }
    if causes.is_empty() {
        Ok(())
    } else {
        let name = str_at(new, &["metadata", "name"]).unwrap_or_default();
        Err(ApiError::invalid(&def.group, &def.kind, name, causes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    fn pvc_def() -> std::sync::Arc<ResourceDef> {
        Registry::with_builtins()
            .lookup("", "v1", "persistentvolumeclaims")
            .unwrap()
    }

    #[test]
    fn config_maps_are_checked_for_keys_and_size_as_the_real_server_does() {
        let def = Registry::with_builtins()
            .lookup("", "v1", "configmaps")
            .unwrap();
        let cm = |data: Value| json!({"metadata": {"name": "j", "namespace": "ns"}, "data": data});
        assert!(validate(&def, &cm(json!({"e.abc-1_2": "{}"}))).is_ok());
        let bad_key = validate(&def, &cm(json!({"a/b": "x"}))).unwrap_err();
        assert_eq!(bad_key.code, 422, "{bad_key:?}");
        assert!(bad_key.message.contains("data[a/b]"), "{}", bad_key.message);
        let exactly = "x".repeat(MAX_CONFIG_MAP_BYTES);
        assert!(validate(&def, &cm(json!({ "k": exactly }))).is_ok());
        let over = validate(&def, &cm(json!({"k": exactly, "l": "y"}))).unwrap_err();
        assert_eq!(over.code, 422);
        assert!(
            over.message
                .contains("Too long: must have at most 1048576 bytes"),
            "{}",
            over.message
        );
        let both =
            json!({"metadata": {"name": "j"}, "data": {"k": "x"}, "binaryData": {"k": "eA=="}});
        assert!(
            validate(&def, &both)
                .unwrap_err()
                .message
                .contains("duplicate")
        );
    }

    #[test]
    fn subdomain_names() {
        assert!(dns1123_subdomain("a.b-c.d1", false).is_empty());
        assert!(!dns1123_subdomain("Bad_Name", false).is_empty());
        assert!(!dns1123_subdomain("-a", false).is_empty());
        assert!(!dns1123_subdomain("a..b", false).is_empty());
        assert!(dns1123_subdomain("claim-", true).is_empty());
        assert!(!dns1123_subdomain("claim-", false).is_empty());
        assert_eq!(dns1123_subdomain(&"a".repeat(254), false).len(), 1);
    }

    #[test]
    fn label_names() {
        assert!(dns1123_label("my-ns", false).is_empty());
        assert!(!dns1123_label("my.ns", false).is_empty());
        assert!(!dns1123_label(&"a".repeat(64), false).is_empty());
    }

    #[test]
    fn bad_claim_name_gets_the_real_message() {
        let obj = json!({"metadata": {"name": "Bad_Name"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}});
        let err = validate(&pvc_def(), &obj).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.starts_with(
            "PersistentVolumeClaim \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": \
             a lowercase RFC 1123 subdomain must consist of"
        ), "{}", err.message);
    }

    #[test]
    fn claim_required_fields_and_quantities() {
        let err =
            validate(&pvc_def(), &json!({"metadata": {"name": "a"}, "spec": {}})).unwrap_err();
        assert_eq!(err.details.causes.len(), 2);
        let bad = json!({"metadata": {"name": "a"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "lots"}}}});
        assert_eq!(validate(&pvc_def(), &bad).unwrap_err().code, 400);
        let zero = json!({"metadata": {"name": "a"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "0"}}}});
        assert_eq!(validate(&pvc_def(), &zero).unwrap_err().code, 422);
    }

    #[test]
    fn claim_class_is_immutable_but_volume_name_is_set_once() {
        let old = json!({"spec": {"storageClassName": "a", "accessModes": ["ReadWriteOnce"]}});
        let bound = json!({"spec": {"storageClassName": "a", "accessModes": ["ReadWriteOnce"], "volumeName": "pv"}});
        assert!(validate_update(&pvc_def(), &old, &bound).is_ok());
        let moved = json!({"spec": {"storageClassName": "b", "accessModes": ["ReadWriteOnce"]}});
        assert_eq!(
            validate_update(&pvc_def(), &old, &moved).unwrap_err().code,
            422
        );
    }

    #[test]
    fn a_claim_class_is_set_later_only_to_its_beta_annotation() {
        let claim = |annotation: Option<&str>, class: Option<&str>| {
            let mut c =
                json!({"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"]}});
            if let Some(a) = annotation {
                c["metadata"]["annotations"] = json!({BETA_STORAGE_CLASS: a});
            }
            if let Some(class) = class {
                c["spec"]["storageClassName"] = json!(class);
            }
            c
        };
        let upgraded = validate_update(
            &pvc_def(),
            &claim(Some("a"), None),
            &claim(Some("a"), Some("a")),
        );
        assert!(upgraded.is_ok(), "{upgraded:?}");
        let other =
            validate_update(&pvc_def(), &claim(None, None), &claim(None, Some("a"))).unwrap_err();
        assert_eq!(other.details.causes[0].field, "spec");
        let annotation =
            validate_update(&pvc_def(), &claim(Some("a"), None), &claim(Some("b"), None))
                .unwrap_err();
        assert_eq!(
            annotation.message,
            "PersistentVolumeClaim \"c\" is invalid: \
             metadata.annotations[volume.beta.kubernetes.io/storage-class]: Invalid value: \"b\": \
             field is immutable"
        );
    }

    #[test]
    fn a_storage_request_changes_only_on_a_bound_claim() {
        let claim = |size: &str, phase: &str| {
            json!({"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}}}, "status": {"phase": phase}})
        };
        assert!(
            validate_update(&pvc_def(), &claim("1Gi", "Bound"), &claim("2Gi", "Bound")).is_ok()
        );
        let pending = validate_update(
            &pvc_def(),
            &claim("1Gi", "Pending"),
            &claim("2Gi", "Pending"),
        );
        assert_eq!(pending.unwrap_err().details.causes[0].field, "spec");
    }

    #[test]
    fn a_changed_uid_and_new_finalizers_on_a_deleted_object_are_invalid() {
        let old = json!({"metadata": {"name": "c", "uid": "u1", "finalizers": ["a"],
            "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        let new = json!({"metadata": {"name": "c", "uid": "u2", "finalizers": ["a", "b"]}});
        let causes = meta_update_causes(&old, &new);
        assert_eq!(causes.len(), 2);
        assert_eq!(
            (causes[0].field.as_str(), causes[0].message.as_str()),
            ("metadata.uid", "Invalid value: \"u2\": field is immutable")
        );
        assert_eq!(
            causes[1].message,
            "Forbidden: no new finalizers can be added if the object is being deleted, found new \
             finalizers []string{\"b\"}"
        );
        let same = json!({"metadata": {"name": "c", "uid": "", "finalizers": []}});
        assert!(meta_update_causes(&old, &same).is_empty());
    }
}
