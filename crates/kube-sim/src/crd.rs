//! CustomResourceDefinitions: validation, defaults, the `Established` status, and the
//! [`ResourceDef`] a CRD registers.

use serde_json::{Value, json};

use crate::meta::now_rfc3339;
use crate::resources::{ResourceDef, res_key};
use crate::status::Cause;

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Required fields of a CRD (the OpenAPI schema is not checked).
pub(crate) fn validate(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let group = s(crd, &["spec", "group"]);
    let plural = s(crd, &["spec", "names", "plural"]);
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    }
    if s(crd, &["spec", "names", "kind"]).is_empty() {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    let name = s(crd, &["metadata", "name"]);
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            &Value::from(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = crd
        .get("spec")
        .and_then(|sp| sp.get("scope"))
        .unwrap_or(&Value::Null);
    if !matches!(scope.as_str(), Some("Namespaced" | "Cluster")) {
        causes.push(Cause::not_supported(
            "spec.scope",
            scope,
            &["Cluster", "Namespaced"],
        ));
    }
    let versions = crd
        .get("spec")
        .and_then(|sp| sp.get("versions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::invalid(
            "spec.versions",
            &json!([]),
            "must have exactly one version marked as storage version",
        ));
    } else {
        let storage = versions
            .iter()
            .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
            .count();
        if storage != 1 {
            causes.push(Cause::invalid(
                "spec.versions",
                &Value::from(storage),
                "must have exactly one version marked as storage version",
            ));
        }
        for (i, v) in versions.iter().enumerate() {
            if s(v, &["name"]).is_empty() {
                causes.push(Cause::required(format!("spec.versions[{i}].name"), ""));
            }
        }
    }
    causes
}

/// Fills in defaulted names (singular, listKind) and sets the status a real server reaches
/// once the names are accepted: `NamesAccepted` and `Established` True.
pub(crate) fn establish(crd: &mut Value) {
    let kind = s(crd, &["spec", "names", "kind"]).to_string();
    let names = &mut crd["spec"]["names"];
    if s(names, &["singular"]).is_empty() {
        names["singular"] = Value::from(kind.to_lowercase());
    }
    if s(names, &["listKind"]).is_empty() {
        names["listKind"] = Value::from(format!("{kind}List"));
    }
    let accepted = names.clone();
    let storage: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let now = now_rfc3339();
    crd["status"] = json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": storage,
    });
}

/// The resource type a (validated, established) CRD serves.
pub(crate) fn resource_def(crd: &Value) -> ResourceDef {
    let group = s(crd, &["spec", "group"]).to_string();
    let plural = s(crd, &["spec", "names", "plural"]).to_string();
    let versions = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("served") != Some(&Value::Bool(false)))
        .map(|v| {
            let status = v
                .get("subresources")
                .and_then(|sr| sr.get("status"))
                .is_some_and(|st| !st.is_null());
            (s(v, &["name"]).to_string(), status)
        })
        .collect();
    let short_names = crd["spec"]["names"]["shortNames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    ResourceDef {
        key: res_key(&group, &plural),
        group,
        versions,
        singular: s(crd, &["spec", "names", "singular"]).to_string(),
        kind: s(crd, &["spec", "names", "kind"]).to_string(),
        list_kind: s(crd, &["spec", "names", "listKind"]).to_string(),
        namespaced: s(crd, &["spec", "scope"]) == "Namespaced",
        short_names,
        plural,
        builtin: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cns(status: bool) -> Value {
        let mut version = json!({"name": "v1alpha1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
        if status {
            version["subresources"] = json!({"status": {}});
        }
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "cnsvolumemetadatas.cns.vmware.com"},
            "spec": {"group": "cns.vmware.com", "scope": "Namespaced",
                "names": {"plural": "cnsvolumemetadatas", "kind": "CnsVolumeMetadata"},
                "versions": [version]}
        })
    }

    #[test]
    fn a_valid_crd_registers_its_names_and_status_subresource() {
        for status in [false, true] {
            let mut crd = cns(status);
            assert!(validate(&crd).is_empty());
            establish(&mut crd);
            assert_eq!(crd["spec"]["names"]["singular"], "cnsvolumemetadata");
            assert_eq!(crd["status"]["conditions"][1]["type"], "Established");
            let def = resource_def(&crd);
            assert_eq!(def.list_kind, "CnsVolumeMetadataList");
            assert!(def.namespaced);
            assert_eq!(def.has_status("v1alpha1"), status);
        }
    }

    #[test]
    fn a_crd_name_must_be_plural_dot_group() {
        let mut crd = cns(false);
        crd["metadata"]["name"] = json!("wrong");
        let causes = validate(&crd);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "metadata.name");
    }
}
