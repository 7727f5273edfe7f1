//! A minimal OpenAPI v3 description: one document per group version, listing the PATCH
//! operation of every resource with its `x-kubernetes-group-version-kind` and the
//! `fieldValidation` query parameter.
//!
//! That is what kubectl's default (strict) validation looks for: when the server supports
//! `fieldValidation`, kubectl leaves validation to the server and never downloads schemas.
//! No schemas are served, and strategic merge is not advertised, so `kubectl apply` builds
//! its patches from its built-in types (or a JSON merge patch for custom resources).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::resources::Registry;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Group versions served, in a stable order.
fn group_versions(reg: &Registry) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for def in reg.all() {
        for (v, _) in &def.versions {
            let gv = (def.group.clone(), v.clone());
            if !out.contains(&gv) {
                out.push(gv);
            }
        }
    }
    out
}

/// A short content hash, so clients re-fetch a document after a CRD changes it.
fn hash(doc: &Value) -> String {
    let text = doc.to_string();
    let h = text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    format!("{h:016X}")
}

/// `/openapi/v3`: the paths of the per-group-version documents.
pub(crate) fn root(reg: &Registry) -> Value {
    let mut paths = BTreeMap::new();
    for (group, version) in group_versions(reg) {
        let doc = document(reg, &group, &version).unwrap_or_default();
        let path = gv_path(&group, &version);
        let url = format!("/openapi/v3/{path}?hash={}", hash(&doc));
        paths.insert(path, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

fn param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/{group}/{version}`, if served.
pub(crate) fn document(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for def in reg.all().filter(|d| d.group == group && d.serves(version)) {
        let prefix = format!("/{}", gv_path(group, version));
        let item = if def.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", def.plural)
        } else {
            format!("{prefix}/{}/{{name}}", def.plural)
        };
        let mut content = Map::new();
        for media in [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ] {
            content.insert(media.into(), json!({"schema": {"type": "object"}}));
        }
        let patch = json!({
            "operationId": format!("patch{}", def.kind),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": def.kind},
            "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation"), param("force")],
            "requestBody": {"content": content, "required": true},
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(item, json!({"patch": patch}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-kube-sim"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_version_has_a_document_with_field_validation() {
        let reg = Registry::with_builtins();
        let root = root(&reg);
        let url = root["paths"]["apis/storage.k8s.io/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/storage.k8s.io/v1?hash="));
        let doc = document(&reg, "storage.k8s.io", "v1").unwrap();
        let op = &doc["paths"]["/apis/storage.k8s.io/v1/storageclasses/{name}"]["patch"];
        assert_eq!(
            op["x-kubernetes-group-version-kind"]["kind"],
            "StorageClass"
        );
        assert!(
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(document(&reg, "nope", "v1").is_none());
    }
}
