//! `meta.k8s.io/v1` Table responses, which `kubectl get` asks for to print its columns.

use serde_json::{Value, json};

use crate::events;
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

/// `<unset>`, as kubectl prints an empty VolumeAttributesClass.
fn or_unset(v: &Value) -> Value {
    match v.as_str() {
        Some(s) if !s.is_empty() => json!(s),
        _ => json!("<unset>"),
    }
}

/// The columns of a type: name and priority (1 only shows with `-o wide`). Every type
/// starts with Name and ends with Age, except events, which read like `kubectl get events`.
fn columns(def: &ResourceDef) -> &'static [(&'static str, u8)] {
    match (def.builtin, def.group.as_str(), def.plural.as_str()) {
        (true, "", "persistentvolumeclaims") => &[
            ("Name", 0),
            ("Status", 0),
            ("Volume", 0),
            ("Capacity", 0),
            ("Access Modes", 0),
            ("StorageClass", 0),
            ("VolumeAttributesClass", 0),
            ("Age", 0),
            ("VolumeMode", 1),
        ],
        (true, "", "persistentvolumes") => &[
            ("Name", 0),
            ("Capacity", 0),
            ("Access Modes", 0),
            ("Reclaim Policy", 0),
            ("Status", 0),
            ("Claim", 0),
            ("StorageClass", 0),
            ("VolumeAttributesClass", 0),
            ("Reason", 0),
            ("Age", 0),
            ("VolumeMode", 1),
        ],
        (true, "storage.k8s.io", "storageclasses") => &[
            ("Name", 0),
            ("Provisioner", 0),
            ("ReclaimPolicy", 0),
            ("VolumeBindingMode", 0),
            ("AllowVolumeExpansion", 0),
            ("Age", 0),
        ],
        (true, "", "namespaces" | "pods") => &[("Name", 0), ("Status", 0), ("Age", 0)],
        (true, "coordination.k8s.io", "leases") => &[("Name", 0), ("Holder", 0), ("Age", 0)],
        (true, _, "events") => &[
            ("Last Seen", 0),
            ("Type", 0),
            ("Reason", 0),
            ("Object", 0),
            ("Subobject", 1),
            ("Source", 1),
            ("Message", 0),
            ("First Seen", 1),
            ("Count", 1),
            ("Name", 1),
        ],
        _ => &[("Name", 0), ("Age", 0)],
    }
}

/// The cells of a core/v1 Event (an `events.k8s.io/v1` Event is converted first).
fn event_cells(o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let since = |field: &Value| {
        field
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| human_age(now.as_second() - t.as_second()))
    };
    let first = since(&o["firstTimestamp"])
        .or_else(|| since(&o["eventTime"]))
        .unwrap_or_else(|| "<unknown>".to_string());
    let (last, count) = if o["series"].is_object() {
        (
            since(&o["series"]["lastObservedTime"]).unwrap_or_else(|| first.clone()),
            o["series"]["count"].as_i64().unwrap_or(1),
        )
    } else {
        (
            since(&o["lastTimestamp"]).unwrap_or_else(|| first.clone()),
            o["count"].as_i64().filter(|c| *c > 0).unwrap_or(1),
        )
    };
    let involved = &o["involvedObject"];
    let kind = involved["kind"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let target = match involved["name"].as_str() {
        Some(name) if !name.is_empty() => format!("{kind}/{name}"),
        _ => kind,
    };
    let source = o["source"]["component"]
        .as_str()
        .filter(|c| !c.is_empty())
        .or_else(|| o["reportingComponent"].as_str())
        .unwrap_or_default();
    let source = match o["source"]["host"].as_str() {
        Some(host) if !host.is_empty() => format!("{source}, {host}"),
        _ => source.to_string(),
    };
    vec![
        json!(last),
        text(&o["type"]),
        text(&o["reason"]),
        json!(target),
        text(&involved["fieldPath"]),
        json!(source),
        json!(o["message"].as_str().unwrap_or_default().trim()),
        json!(first),
        json!(count),
        text(&o["metadata"]["name"]),
    ]
}

fn cells(def: &ResourceDef, o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let spec = &o["spec"];
    let status = &o["status"];
    let name = text(&o["metadata"]["name"]);
    let age = json!(age(o, now));
    match (def.builtin, def.group.as_str(), def.plural.as_str()) {
        (true, "", "persistentvolumeclaims") => vec![
            name,
            text(&status["phase"]),
            text(&spec["volumeName"]),
            text(&status["capacity"]["storage"]),
            access_modes(&status["accessModes"]),
            text(&spec["storageClassName"]),
            or_unset(&spec["volumeAttributesClassName"]),
            age,
            text(&spec["volumeMode"]),
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
                name,
                text(&spec["capacity"]["storage"]),
                access_modes(&spec["accessModes"]),
                text(&spec["persistentVolumeReclaimPolicy"]),
                text(&status["phase"]),
                claim,
                text(&spec["storageClassName"]),
                or_unset(&spec["volumeAttributesClassName"]),
                text(&status["reason"]),
                age,
                text(&spec["volumeMode"]),
            ]
        }
        (true, "storage.k8s.io", "storageclasses") => vec![
            name,
            text(&o["provisioner"]),
            text(&o["reclaimPolicy"]),
            text(&o["volumeBindingMode"]),
            json!(
                o["allowVolumeExpansion"]
                    .as_bool()
                    .unwrap_or(false)
                    .to_string()
            ),
            age,
        ],
        (true, "", "namespaces" | "pods") => vec![name, text(&status["phase"]), age],
        (true, "coordination.k8s.io", "leases") => vec![name, text(&spec["holderIdentity"]), age],
        (true, "", "events") => event_cells(o, now),
        (true, _, "events") => match events::counterpart(events::V1, o) {
            Some((_, core)) => event_cells(&core, now),
            None => event_cells(o, now),
        },
        _ => vec![name, age],
    }
}

fn row(def: &ResourceDef, obj: &Stored, include_object: bool, now: jiff::Timestamp) -> Value {
    let o = &obj.value;
    let object = if include_object {
        o.clone()
    } else {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})
    };
    json!({"cells": cells(def, o, now), "object": object})
}

/// A Table of `objects`; `list_meta` is the list's `metadata`.
pub(crate) fn table(
    def: &ResourceDef,
    objects: &[&Stored],
    list_meta: Value,
    include_object: bool,
) -> Value {
    let now = jiff::Timestamp::now();
    let defs: Vec<Value> = columns(def)
        .iter()
        .map(|(name, priority)| {
            let format = if *name == "Name" { "name" } else { "" };
            let kind = if *name == "Count" {
                "integer"
            } else {
                "string"
            };
            json!({"name": name, "type": kind, "format": format, "description": name,
                   "priority": priority})
        })
        .collect();
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
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 9);
        assert_eq!(t["columnDefinitions"][6]["name"], "VolumeAttributesClass");
        let row = t["rows"][0]["cells"].as_array().unwrap();
        assert_eq!(
            row[..7],
            json!(["a", "Bound", "pv", "1Gi", "RWO", "fast", "<unset>"])
                .as_array()
                .unwrap()[..]
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wanted("application/json"));
    }

    #[test]
    fn event_rows_read_like_kubectl_get_events() {
        let reg = Registry::with_builtins();
        let def = reg.lookup("events.k8s.io", "v1", "events").unwrap();
        let obj = Stored::new(json!({
            "metadata": {"name": "e"},
            "regarding": {"kind": "PersistentVolumeClaim", "name": "claim-1"},
            "reason": "ProvisioningFailed", "note": " no space ", "type": "Warning",
            "reportingController": "csi",
            "eventTime": "2020-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2020-01-01T00:00:00.000000Z"},
        }));
        let t = table(&def, &[&obj], json!({}), false);
        assert_eq!(t["columnDefinitions"][0]["name"], "Last Seen");
        let row = &t["rows"][0]["cells"];
        assert_eq!(row[1], "Warning");
        assert_eq!(row[3], "persistentvolumeclaim/claim-1");
        assert_eq!(row[5], "csi");
        assert_eq!(row[6], "no space");
        assert_eq!(row[8], 3);
        assert_eq!(row[9], "e");
    }
}
