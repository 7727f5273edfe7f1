//! Discovery documents (the legacy, unaggregated form kubectl falls back to) and `/version`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::http::auth;
use crate::resources::{Registry, ResourceDef};

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-kube-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": format!("{}/{}", std::env::consts::OS, arch()),
    })
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// `/api`.
pub(crate) fn core_versions(address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    })
}

/// Served versions per group (not the core group), in registration order.
fn groups(reg: &Registry) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    groups.insert(auth::GROUP.to_string(), vec!["v1".to_string()]);
    for def in reg.all().filter(|d| !d.group.is_empty()) {
        let versions = groups.entry(def.group.clone()).or_default();
        for (v, _) in &def.versions {
            if !versions.contains(v) {
                versions.push(v.clone());
            }
        }
    }
    groups
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
}

/// `/apis`.
pub(crate) fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = groups(reg).iter().map(|(g, vs)| group_doc(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`, if served.
pub(crate) fn group(reg: &Registry, name: &str) -> Option<Value> {
    let groups = groups(reg);
    let versions = groups.get(name)?;
    let mut doc = group_doc(name, versions);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

fn entries(def: &ResourceDef, version: &str) -> Vec<Value> {
    let mut main = json!({
        "name": def.plural,
        "singularName": def.singular,
        "namespaced": def.namespaced,
        "kind": def.kind,
        "verbs": VERBS,
    });
    if !def.short_names.is_empty() {
        main["shortNames"] = json!(def.short_names);
    }
    if !def.builtin {
        main["categories"] = json!(["all"]);
    }
    let mut out = vec![main];
    if def.has_status(version) {
        out.push(json!({
            "name": format!("{}/status", def.plural),
            "singularName": "",
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    out
}

/// `/api/v1` or `/apis/{group}/{version}`, if served.
pub(crate) fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources: Vec<Value> = reg
        .all()
        .filter(|d| d.group == group && d.serves(version))
        .flat_map(|d| entries(d, version))
        .collect();
    if group == auth::GROUP && version == "v1" {
        resources.extend(auth::resources());
    }
    if resources.is_empty() && !(group.is_empty() && version == "v1") {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_resources_list_status_subresources_and_short_names() {
        let reg = Registry::with_builtins();
        let doc = resource_list(&reg, "", "v1").unwrap();
        let names: Vec<&str> = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"persistentvolumeclaims/status"));
        assert!(!names.contains(&"events/status"));
        let pvc = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "persistentvolumeclaims")
            .unwrap();
        assert_eq!(pvc["shortNames"], json!(["pvc"]));
        assert!(resource_list(&reg, "nope.io", "v1").is_none());
    }

    #[test]
    fn groups_have_a_preferred_version() {
        let reg = Registry::with_builtins();
        let list = group_list(&reg);
        let storage = list["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "storage.k8s.io")
            .unwrap();
        assert_eq!(
            storage["preferredVersion"]["groupVersion"],
            "storage.k8s.io/v1"
        );
        assert_eq!(
            group(&reg, "coordination.k8s.io").unwrap()["kind"],
            "APIGroup"
        );
        let auth = resource_list(&reg, "authorization.k8s.io", "v1").unwrap();
        assert_eq!(
            auth["resources"][0]["name"], "selfsubjectaccessreviews",
            "{auth}"
        );
    }
}
