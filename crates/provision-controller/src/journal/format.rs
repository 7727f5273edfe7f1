//! The journal's format: an [`Entry`] per claim (short JSON keys), the objects it is
//! kept in ([`Shard`]: entries `e.<claim uid>`, class snapshots `k.<hash>`, within
//! [`BUDGET`]), and their names and label.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::{
    api::core::v1::{ConfigMap, PersistentVolumeClaim},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use serde::{Deserialize, Serialize};

// The label every journal object carries, with the lease name (or, when that is no valid
// label value, a hash of it) as value: defined with the other names on objects, in
// `annotations.rs`, which the journal reads and which reads nothing of the journal.
pub(crate) use crate::annotations::JOURNAL_LABEL_KEY as JOURNAL_LABEL;

/// The most bytes of data (keys and values) one journal object holds: well under the API
/// server's 1 MiB limit of a ConfigMap, so an object stays below 512 KiB.
pub(crate) const BUDGET: usize = 384 * 1024;

/// New entries go to an object while it holds at most this many bytes of data; then the
/// next object opens. Every group write sends its whole object, so a small open object
/// keeps what the API server and etcd decode and store per write small (an object of
/// [`BUDGET`] bytes rewritten for every group would cost the server more than the
/// volumes themselves); objects the entries left are deleted.
pub(crate) const OPEN_BUDGET: usize = 16 * 1024;

/// The prefix of an entry's key; the claim's uid follows.
const ENTRY_PREFIX: &str = "e.";
/// The prefix of a class snapshot's key; a hash of the snapshot follows.
const CLASS_PREFIX: &str = "k.";

/// One claim's record (see the module docs); the JSON keys are short, as there may be
/// hundreds of thousands of entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The claim's `namespace/name`.
    #[serde(rename = "n")]
    pub(crate) claim: String,
    /// The PV name.
    #[serde(rename = "v")]
    pub(crate) pv: String,
    /// When the intent was written (Unix seconds).
    #[serde(rename = "t")]
    pub(crate) since: i64,
    /// The process that wrote it.
    #[serde(rename = "w", default)]
    pub(crate) writer: String,
    /// The key of the class snapshot the provisioning started with.
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub(crate) class: Option<String>,
    /// The node the scheduler chose (while provisioning).
    #[serde(rename = "o", default, skip_serializing_if = "Option::is_none")]
    pub(crate) node: Option<String>,
    /// The claim's spec (while provisioning).
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub(crate) spec: Option<serde_json::Value>,
    /// Settled: when the last sweep is due (Unix seconds).
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    pub(crate) due: Option<i64>,
    /// When the latest provisioning attempt began (Unix seconds), when later than
    /// `since`: every attempt that may make the driver create writes it first, so a
    /// replica that finds no asset waits the late-asset window from it (a create sent
    /// since then may still land).
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempt: Option<i64>,
}

impl Entry {
    /// Whether the driver may be creating an asset no PV records (not settled).
    pub(crate) fn is_intent(&self) -> bool {
        self.due.is_none()
    }

    /// When the latest attempt that may have sent a create began (Unix seconds).
    pub(crate) fn last_attempt(&self) -> i64 {
        self.attempt.map_or(self.since, |a| a.max(self.since))
    }

    /// The claim as far as the entry knows it (namespace, name, uid, spec and selected
    /// node): what a cleanup passes to the driver when the claim is gone.
    pub(crate) fn claim(&self, uid: &str) -> PersistentVolumeClaim {
        let (namespace, name) = self.claim.split_once('/').unwrap_or(("", &self.claim));
        let annotations = self.node.as_ref().map(|node| {
            [(
                crate::annotations::ANN_SELECTED_NODE.to_owned(),
                node.clone(),
            )]
            .into()
        });
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
                annotations,
                ..ObjectMeta::default()
            },
            spec: self
                .spec
                .clone()
                .and_then(|s| serde_json::from_value(s).ok()),
            status: None,
        }
    }
}

/// The current time in Unix seconds.
pub(crate) fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

/// A stable 64-bit hash (FNV-1a), for class snapshot keys.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The key of a class snapshot's JSON.
pub(crate) fn class_key(json: &str) -> String {
    format!("{:016x}", fnv(json.as_bytes()))
}

/// One journal object as this process last read or wrote it.
#[derive(Clone, Debug, Default)]
pub(super) struct Shard {
    /// Its resourceVersion; `None` while it does not exist.
    pub(super) version: Option<String>,
    pub(super) entries: BTreeMap<String, Entry>,
    pub(super) classes: BTreeMap<String, String>,
}

impl Shard {
    pub(super) fn parse(cm: &ConfigMap) -> Self {
        let mut shard = Self {
            version: cm.metadata.resource_version.clone(),
            ..Self::default()
        };
        for (key, value) in cm.data.iter().flatten() {
            if let Some(uid) = key.strip_prefix(ENTRY_PREFIX) {
                match serde_json::from_str::<Entry>(value) {
                    Ok(entry) => {
                        shard.entries.insert(uid.to_owned(), entry);
                    }
                    Err(err) => {
                        tracing::warn!(journal = cm.metadata.name.as_deref().unwrap_or_default(), key, error = %err,
                            "a journal entry that is no entry (edited by hand?); ignoring it");
                    }
                }
            } else if let Some(hash) = key.strip_prefix(CLASS_PREFIX) {
                shard.classes.insert(hash.to_owned(), value.clone());
            }
        }
        shard
    }

    /// The object's data: every entry, and the class snapshots they refer to.
    pub(super) fn data(&self) -> BTreeMap<String, String> {
        let used: HashSet<&str> = self
            .entries
            .values()
            .filter_map(|e| e.class.as_deref())
            .collect();
        let mut data = BTreeMap::new();
        for (uid, entry) in &self.entries {
            let json = serde_json::to_string(entry).expect("an entry serializes");
            data.insert(format!("{ENTRY_PREFIX}{uid}"), json);
        }
        for (key, json) in &self.classes {
            if used.contains(key.as_str()) {
                data.insert(format!("{CLASS_PREFIX}{key}"), json.clone());
            }
        }
        data
    }
}

/// The bytes of an object's data as the budget counts them (keys and values).
pub(super) fn data_bytes(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The label value for a lease name: the name itself when it is a valid label value,
/// else a hash of it.
pub(super) fn label_value(lease_name: &str) -> String {
    let valid = !lease_name.is_empty()
        && lease_name.len() <= 63
        && lease_name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && lease_name.as_bytes()[0].is_ascii_alphanumeric()
        && lease_name.as_bytes()[lease_name.len() - 1].is_ascii_alphanumeric();
    if valid {
        lease_name.to_owned()
    } else {
        format!("h-{:016x}", fnv(lease_name.as_bytes()))
    }
}

/// The name of journal object `seq` for `lease_name`.
pub(super) fn object_name(lease_name: &str, seq: u64) -> String {
    let base: String = lease_name.chars().take(200).collect();
    format!("{base}-journal-{seq:08}")
}

/// The `seq` of a journal object's name, when it is one of `lease_name`'s.
pub(super) fn object_seq(lease_name: &str, name: &str) -> Option<u64> {
    let base: String = lease_name.chars().take(200).collect();
    let seq = name.strip_prefix(&base)?.strip_prefix("-journal-")?;
    (seq.len() == 8 && seq.bytes().all(|b| b.is_ascii_digit()))
        .then(|| seq.parse().ok())
        .flatten()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::journal) fn entry(claim: &str) -> Entry {
        Entry {
            claim: claim.to_owned(),
            pv: "pvc-0d5bcfb2-5d25-4e4a-9b8e-2a4f3b1c7e10".to_owned(),
            since: 1_712_345_678,
            writer: "a1b2c3d4".to_owned(),
            class: Some("0123456789abcdef".to_owned()),
            node: None,
            spec: None,
            due: Some(1_712_346_038),
            attempt: None,
        }
    }

    #[test]
    fn a_settled_entry_is_small_enough_for_the_target_rate() {
        // What settling keeps of a typical claim's spec.
        let settled = Entry {
            spec: Some(serde_json::json!({
                "storageClassName": "fast-ssd",
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": "10Gi"}},
            })),
            ..entry("namespace-of-a-claim/claim-name-12345")
        };
        let json = serde_json::to_string(&settled).unwrap();
        let bytes = ENTRY_PREFIX.len() + 36 + json.len();
        println!("a settled entry: {bytes} bytes");
        assert!(bytes <= 360, "{bytes} bytes: {json}");
        // 1,000 claims/s with a 6-minute window: the objects it takes. An object is filled
        // with intents up to the open budget; settling makes them smaller, never larger.
        let intent = Entry {
            spec: Some(serde_json::json!({
                "storageClassName": "fast-ssd",
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": "10Gi"}},
                "volumeName": "pvc-0b4f2a57-6c1e-4d8e-9a43-5b1f3e0c9d21",
            })),
            due: None,
            ..settled.clone()
        };
        let intent_bytes = ENTRY_PREFIX.len() + 36 + serde_json::to_string(&intent).unwrap().len();
        let per_object = OPEN_BUDGET / intent_bytes + 1;
        let objects = 360_000_usize.div_ceil(per_object);
        println!(
            "an intent: {intent_bytes} bytes; {per_object} entries per object; 360,000 settled entries: {objects} objects of at most {} KiB",
            (per_object * bytes.max(intent_bytes)) / 1024 + 1
        );
        assert!(
            per_object * bytes <= BUDGET,
            "a settled object outgrows the budget"
        );
        const { assert!(OPEN_BUDGET < BUDGET && BUDGET < 512 * 1024) };
    }

    #[test]
    fn data_round_trips_and_drops_unused_classes() {
        let mut shard = Shard::default();
        shard.entries.insert("u1".into(), entry("ns/a"));
        shard
            .classes
            .insert("0123456789abcdef".into(), "{\"provisioner\":\"x\"}".into());
        shard.classes.insert("ffffffffffffffff".into(), "{}".into());
        let data = shard.data();
        assert_eq!(data.len(), 2, "{data:?}");
        let cm = ConfigMap {
            data: Some(data),
            ..ConfigMap::default()
        };
        let back = Shard::parse(&cm);
        assert_eq!(back.entries, shard.entries);
        assert_eq!(back.classes.len(), 1);
    }

    #[test]
    fn object_names_and_labels() {
        assert_eq!(
            object_name("example.com-nfs", 7),
            "example.com-nfs-journal-00000007"
        );
        assert_eq!(
            object_seq("example.com-nfs", "example.com-nfs-journal-00000007"),
            Some(7)
        );
        assert_eq!(
            object_seq("example.com-nfs", "example.com-nfs-journal-7"),
            None
        );
        assert_eq!(
            object_seq("example.com-nfs", "other-journal-00000007"),
            None
        );
        assert_eq!(label_value("example.com-nfs"), "example.com-nfs");
        let long = "a".repeat(80);
        assert!(label_value(&long).starts_with("h-"));
        assert_eq!(label_value(&long).len(), 18);
    }

    #[test]
    fn the_entry_rebuilds_the_claim_a_cleanup_needs() {
        let mut e = entry("ns/data");
        e.node = Some("node-1".into());
        e.spec = Some(
            serde_json::json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}),
        );
        let claim = e.claim("u1");
        assert_eq!(claim.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(claim.metadata.name.as_deref(), Some("data"));
        assert_eq!(claim.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(crate::annotations::selected_node(&claim), Some("node-1"));
        assert_eq!(
            claim.spec.unwrap().access_modes,
            Some(vec!["ReadWriteOnce".to_owned()])
        );
    }
}
