//! core/v1 and `events.k8s.io/v1` Events are one storage on the real server: an Event
//! written through either API is read through both. The store keeps one copy per API and
//! writes the other copy, converted, with the same resourceVersion.

use serde_json::{Map, Value};

use crate::resources::{ResKey, res_key};

/// Store key of core/v1 events.
pub(crate) const CORE: &str = "/events";
/// Store key of `events.k8s.io/v1` events.
pub(crate) const V1: &str = "events.k8s.io/events";

/// Field names that differ: (core/v1, events.k8s.io/v1). Every other field is the same.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// The other Event API's store key, when `res` is an Event resource.
pub(crate) fn other_api(res: &str) -> Option<ResKey> {
    match res {
        CORE => Some(res_key_of(V1)),
        V1 => Some(res_key_of(CORE)),
        _ => None,
    }
}

/// The other API's store key and the object as that API shows it, when `res` is an
/// Event resource.
pub(crate) fn counterpart(res: &str, obj: &Value) -> Option<(ResKey, Value)> {
    let (api_version, to_v1) = match res {
        CORE => ("events.k8s.io/v1", true),
        V1 => ("v1", false),
        _ => return None,
    };
    let other = other_api(res)?;
    let Some(map) = obj.as_object() else {
        return Some((other, obj.clone()));
    };
    let mut out = Map::with_capacity(map.len());
    for (key, value) in map {
        let renamed = RENAMED.iter().find_map(|(core, v1)| match (to_v1, key) {
            (true, k) if k == core => Some(*v1),
            (false, k) if k == v1 => Some(*core),
            _ => None,
        });
        let key = match (key.as_str(), renamed) {
            ("apiVersion", _) => {
                out.insert(key.clone(), Value::from(api_version));
                continue;
            }
            (_, Some(new)) => new.to_string(),
            (k, None) => k.to_string(),
        };
        out.insert(key, value.clone());
    }
    Some((other, Value::Object(out)))
}

fn res_key_of(key: &str) -> ResKey {
    let (group, plural) = key.split_once('/').unwrap_or(("", key));
    res_key(group, plural)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_v1_event_reads_as_a_core_event_and_back() {
        let v1 = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "PersistentVolumeClaim", "name": "claim-1"},
            "reason": "ProvisioningFailed", "note": "no space", "type": "Warning",
            "reportingController": "csi", "reportingInstance": "csi-0", "action": "Provision",
            "eventTime": "2020-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2020-01-01T00:01:00.000000Z"},
        });
        let (key, core) = counterpart(V1, &v1).unwrap();
        assert_eq!(&*key, CORE);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "claim-1");
        assert_eq!(core["message"], "no space");
        assert_eq!(core["reportingComponent"], "csi");
        assert_eq!(core["series"]["count"], 3);
        assert!(core.get("regarding").is_none() && core.get("note").is_none());
        let (key, back) = counterpart(CORE, &core).unwrap();
        assert_eq!(&*key, V1);
        assert_eq!(back, v1);
        assert!(counterpart("/pods", &v1).is_none());
    }
}
