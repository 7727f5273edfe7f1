//! `meta.k8s.io/v1` Table responses, which `kubectl get` asks for to print its columns.

use serde_json::{Value, json};

use crate::resources::ResourceDef;
use crate::store::Stored;

/// Whether an `Accept` header asks for a Table.
pub(crate) fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// Age as kubectl prints it (`45s`, `3m12s`, `5h`, `2d`).
pub(crate) fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    match s {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => format!("{m}m{}s", s % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if d < 8 => format!("{d}d{}h", h % 24),
        _ if d < 730 => format!("{d}d"),
        _ => format!("{}y", d / 365),
    }
}

fn age(obj: &Value, now: jiff::Timestamp) -> String {
    obj["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or_else(
            || "<unknown>".to_string(),
            |t| human_age(now.as_second() - t.as_second()),
        )
}

fn text(v: &Value) -> Value {
    match v {
        Value::Null => json!(""),
        Value::String(_) => v.clone(),
        other => json!(other.to_string()),
    }
}

fn access_modes(v: &Value) -> Value {
    let modes: Vec<&str> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|m| match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect();
    json!(modes.join(","))
}

/// Column names and the cells of one object (without Name and Age, which every type has).
fn columns(def: &ResourceDef) -> &'static [&'static str] {
    match (def.builtin, def.group.as_str(), def.plural.as_str()) {
        (true, "", "persistentvolumeclaims") => &[
            "Status",
            "Volume",
            "Capacity",
            "Access Modes",
            "StorageClass",
        ],
        (true, "", "persistentvolumes") => &[
            "Capacity",
            "Access Modes",
            "Reclaim Policy",
            "Status",
            "Claim",
            "StorageClass",
        ],
        (true, "storage.k8s.io", "storageclasses") => &[
            "Provisioner",
            "ReclaimPolicy",
            "VolumeBindingMode",
            "AllowVolumeExpansion",
        ],
        (true, "", "namespaces" | "pods") => &["Status"],
        (true, "coordination.k8s.io", "leases") => &["Holder"],
        (true, _, "events") => &["Type", "Reason", "Message"],
        _ => &[],
    }
}

fn cells(def: &ResourceDef, o: &Value) -> Vec<Value> {
    let spec = &o["spec"];
    let status = &o["status"];
    match (def.builtin, def.group.as_str(), def.plural.as_str()) {
        (true, "", "persistentvolumeclaims") => vec![
            text(&status["phase"]),
            text(&spec["volumeName"]),
            text(&status["capacity"]["storage"]),
            access_modes(&status["accessModes"]),
            text(&spec["storageClassName"]),
        ],
        (true, "", "persistentvolumes") => {
            let claim = &spec["claimRef"];
            let claim = if claim.is_object() {
                json!(format!(
                    "{}/{}",
                    claim["namespace"].as_str().unwrap_or_default(),
                    claim["name"].as_str().unwrap_or_default()
                ))
            } else {
                json!("")
            };
            vec![
                text(&spec["capacity"]["storage"]),
                access_modes(&spec["accessModes"]),
                text(&spec["persistentVolumeReclaimPolicy"]),
                text(&status["phase"]),
                claim,
                text(&spec["storageClassName"]),
            ]
        }
        (true, "storage.k8s.io", "storageclasses") => vec![
            text(&o["provisioner"]),
            text(&o["reclaimPolicy"]),
            text(&o["volumeBindingMode"]),
            json!(
                o["allowVolumeExpansion"]
                    .as_bool()
                    .unwrap_or(false)
                    .to_string()
            ),
        ],
        (true, "", "namespaces" | "pods") => vec![text(&status["phase"])],
        (true, "coordination.k8s.io", "leases") => vec![text(&spec["holderIdentity"])],
        (true, _, "events") => {
            let message = if o["note"].is_null() {
                &o["message"]
            } else {
                &o["note"]
            };
            vec![text(&o["type"]), text(&o["reason"]), text(message)]
        }
        _ => Vec::new(),
    }
}

fn row(def: &ResourceDef, obj: &Stored, include_object: bool, now: jiff::Timestamp) -> Value {
    let o = &obj.value;
    let mut cells = vec![text(&o["metadata"]["name"])];
    cells.extend(self::cells(def, o));
    cells.push(json!(age(o, now)));
    let object = if include_object {
        o.clone()
    } else {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})
    };
    json!({"cells": cells, "object": object})
}

/// A Table of `objects`; `list_meta` is the list's `metadata`.
pub(crate) fn table(
    def: &ResourceDef,
    objects: &[&Stored],
    list_meta: Value,
    include_object: bool,
) -> Value {
    let now = jiff::Timestamp::now();
    let mut defs = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}),
    ];
    for c in columns(def) {
        defs.push(
            json!({"name": c, "type": "string", "format": "", "description": c, "priority": 0}),
        );
    }
    defs.push(
        json!({"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0}),
    );
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| row(def, o, include_object, now))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(45), "45s");
        assert_eq!(human_age(192), "3m12s");
        assert_eq!(human_age(1800), "30m");
        assert_eq!(human_age(5 * 3600 + 60), "5h1m");
        assert_eq!(human_age(30 * 3600), "30h");
        assert_eq!(human_age(3 * 86400), "3d0h");
    }

    #[test]
    fn claim_rows_have_the_kubectl_columns() {
        let reg = Registry::with_builtins();
        let def = reg.lookup("", "v1", "persistentvolumeclaims").unwrap();
        let obj = Stored::new(
            json!({"metadata": {"name": "a", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"storageClassName": "fast", "volumeName": "pv"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}}),
        );
        let t = table(&def, &[&obj], json!({}), false);
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 7);
        let row = t["rows"][0]["cells"].as_array().unwrap();
        assert_eq!(
            row[..6],
            json!(["a", "Bound", "pv", "1Gi", "RWO", "fast"])
                .as_array()
                .unwrap()[..]
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wanted("application/json"));
    }
}
