//! Compares the PersistentVolumes two provisioners made for the same claims, field by
//! field: `kubectl get pv -o json` of each run, normalised (names, uids, timestamps and the
//! driver's own ids aside), paired by the claim each PV is bound to.
//!
//! Used to compare our CSI sidecar with kubernetes-csi/external-provisioner in front of
//! the same CSI driver (`cargo run -p integration-tests --bin pv-diff -- upstream.json
//! ours.json`); every remaining difference is either a bug or a row of
//! docs/porting-notes.md.

use std::collections::BTreeMap;

use serde_json::Value;

/// Fields that differ between any two runs: object identity, server bookkeeping, and the
/// values the driver or the provisioner make up per run.
const IGNORED: &[&str] = &[
    "/metadata/uid",
    "/metadata/resourceVersion",
    "/metadata/creationTimestamp",
    "/metadata/deletionTimestamp",
    "/metadata/generation",
    "/metadata/managedFields",
    "/metadata/selfLink",
    "/spec/claimRef/uid",
    "/spec/claimRef/resourceVersion",
    "/status/lastPhaseTransitionTime",
];

/// Values that name a run's own objects: kept as present, their value replaced.
const MASKED: &[&str] = &[
    "/metadata/name",
    "/spec/csi/volumeHandle",
    "/spec/csi/volumeAttributes/storage.kubernetes.io~1csiProvisionerIdentity",
];

/// One PV, flattened to JSON-pointer paths and normalised.
pub type Flat = BTreeMap<String, String>;

/// The PVs of one `kubectl get pv -o json` (a `List`) or of one PV, keyed by the claim
/// they are bound to (`namespace/name`; unbound PVs by their own name).
///
/// # Errors
/// The text is not JSON, or not a PV or a list of them.
pub fn by_claim(json: &str) -> Result<BTreeMap<String, Flat>, String> {
    let value: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let items = match value.get("items") {
        Some(Value::Array(items)) => items.clone(),
        _ if value.get("kind") == Some(&Value::from("PersistentVolume")) => vec![value],
        _ => return Err("neither a PersistentVolume nor a list of them".into()),
    };
    let mut out = BTreeMap::new();
    for pv in items {
        let claim = pv.pointer("/spec/claimRef").map(|r| {
            format!(
                "{}/{}",
                r["namespace"].as_str().unwrap_or_default(),
                r["name"].as_str().unwrap_or_default()
            )
        });
        let key = claim.unwrap_or_else(|| {
            let name = pv.pointer("/metadata/name").and_then(Value::as_str);
            format!("(unbound) {}", name.unwrap_or_default())
        });
        out.insert(key, normalise(&pv));
    }
    Ok(out)
}

/// `pv` flattened, without the fields that differ between any two runs (names, uids,
/// timestamps) and with the values that name a run masked; the PV's
/// own name inside any other value (a secret name templated from `${pv.name}`, the
/// `csi.storage.k8s.io/pv/name` parameter a driver echoes into its volume context) becomes
/// `<pv-name>`.
#[must_use]
pub fn normalise(pv: &Value) -> Flat {
    let mut flat = Flat::new();
    flatten(pv, String::new(), &mut flat);
    if let Some(name) = pv
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        for value in flat.values_mut() {
            if value.contains(name) {
                *value = value.replace(name, "<pv-name>");
            }
        }
    }
    flat.retain(|path, _| {
        !IGNORED
            .iter()
            .any(|i| path == i || path.starts_with(&format!("{i}/")))
    });
    for path in MASKED {
        if let Some(value) = flat.get_mut(*path) {
            *value = "<masked>".into();
        }
    }
    flat
}

fn flatten(value: &Value, path: String, out: &mut Flat) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let key = key.replace('~', "~0").replace('/', "~1");
                flatten(v, format!("{path}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(v, format!("{path}/{i}"), out);
            }
        }
        other => {
            out.insert(path, other.to_string());
        }
    }
}

/// The differences between two runs, one line each: `claim: path: left | right`
/// (`-` where a side lacks the field or the claim).
#[must_use]
pub fn diff(left: &BTreeMap<String, Flat>, right: &BTreeMap<String, Flat>) -> Vec<String> {
    let empty = Flat::new();
    let mut claims: Vec<&String> = left.keys().chain(right.keys()).collect();
    claims.sort();
    claims.dedup();
    let mut lines = Vec::new();
    for claim in claims {
        let (l, r) = (left.get(claim), right.get(claim));
        if l.is_none() || r.is_none() {
            let side = if l.is_none() { "left" } else { "right" };
            lines.push(format!("{claim}: no PV on the {side}"));
            continue;
        }
        let (l, r) = (l.unwrap_or(&empty), r.unwrap_or(&empty));
        let mut paths: Vec<&String> = l.keys().chain(r.keys()).collect();
        paths.sort();
        paths.dedup();
        for path in paths {
            let (a, b) = (l.get(path), r.get(path));
            if a != b {
                let show = |v: Option<&String>| v.map_or("-".to_owned(), Clone::clone);
                lines.push(format!("{claim}: {path}: {} | {}", show(a), show(b)));
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, claim: &str, handle: &str, fs: &str) -> String {
        serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-12-05T09:00:00Z",
                "annotations": {"pv.kubernetes.io/provisioned-by": "hostpath.csi.k8s.io"}},
            "spec": {"claimRef": {"namespace": "ns", "name": claim, "uid": "x"},
                "csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": handle, "fsType": fs,
                    "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": name}}},
        })
        .to_string()
    }

    #[test]
    fn identical_runs_differ_in_nothing_but_names_uids_and_handles() {
        let a = by_claim(&pv("pvc-1", "data", "h-1", "ext4")).unwrap();
        let b = by_claim(&pv("pvc-2", "data", "h-2", "ext4")).unwrap();
        assert_eq!(diff(&a, &b), Vec::<String>::new());
    }

    #[test]
    fn a_field_that_differs_is_one_line_naming_claim_and_path() {
        let a = by_claim(&pv("pvc-1", "data", "h-1", "ext4")).unwrap();
        let b = by_claim(&pv("pvc-2", "data", "h-2", "xfs")).unwrap();
        assert_eq!(
            diff(&a, &b),
            ["ns/data: /spec/csi/fsType: \"ext4\" | \"xfs\""]
        );
        let list = format!("{{\"items\": [{}]}}", pv("pvc-3", "other", "h", ""));
        let c = by_claim(&list).unwrap();
        assert_eq!(
            diff(&a, &c),
            ["ns/data: no PV on the right", "ns/other: no PV on the left"]
        );
    }

    #[test]
    fn the_pvs_own_name_inside_other_values_is_masked() {
        let with_ref = |name: &str, secret: &str| {
            let mut v: Value = serde_json::from_str(&pv(name, "data", "h", "ext4")).unwrap();
            v["spec"]["csi"]["nodePublishSecretRef"] =
                serde_json::json!({"name": secret, "namespace": name});
            v.to_string()
        };
        let a = by_claim(&with_ref("pvc-1", "pub-pvc-1")).unwrap();
        let b = by_claim(&with_ref("pvc-2", "pub-pvc-2")).unwrap();
        assert_eq!(diff(&a, &b), Vec::<String>::new());
        let c = by_claim(&with_ref("pvc-3", "pub-other")).unwrap();
        assert_eq!(
            diff(&a, &c),
            ["ns/data: /spec/csi/nodePublishSecretRef/name: \"pub-<pv-name>\" | \"pub-other\""]
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert!(by_claim("{").unwrap_err().starts_with("not JSON"));
        assert!(by_claim("{\"kind\": \"Pod\"}").is_err());
    }
}
