//! The record of what the reconciler may have pushed to CNS for one object, kept in the
//! annotation [`PUSHED_ANNOTATION`]: live entries, tombstones (`removed`) and marks of
//! pushes without answer (`unanswered`). Why it exists and how entries come and go:
//! docs/architecture.md, "The CnsVolumeMetadata reconciler".

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use k8s_openapi::jiff::Timestamp;
use kube_client::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::{
    backend::{ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata, VolumeMetadataUpdate},
    config::Config,
    resource::{CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference, EntityType},
};

/// Annotation in which the reconciler records, as a JSON list, every entity it may have
/// pushed to CNS for the object (with the CNS volume ID), so that deleting the object or
/// changing its spec removes exactly those entries. Entries removed because the spec
/// changed stay for a while as tombstones (with a `removed` time), to be removed once more
/// after the settle period ([`Config::settle_period`]). Written and read only by the
/// reconciler; objects without it (written by an older version) are cleaned up from their
/// current spec.
pub const PUSHED_ANNOTATION: &str = "cns.vmware.com/pushed-entities";

/// One entity on one CNS volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PushedEntry {
    /// The supervisor claim named in `spec.volumenames`.
    #[serde(rename = "volumename")]
    pub(crate) volume_name: String,
    /// The CNS volume ID (CSI volume handle) the entity was sent to.
    #[serde(rename = "volumeid")]
    pub(crate) volume_id: String,
    #[serde(rename = "entitytype")]
    pub(crate) entity_type: EntityType,
    #[serde(rename = "entityname")]
    pub(crate) entity_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) namespace: String,
    #[serde(rename = "guestclusterid")]
    pub(crate) guest_cluster_id: String,
    #[serde(
        rename = "clusterdistribution",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub(crate) cluster_distribution: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) labels: BTreeMap<String, String>,
    /// The referred entity sent with it; `None` when none could be paired with the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reference: Option<EntityReference>,
    /// For a tombstone, when CNS confirmed the removal (RFC 3339); `None` for an entry that
    /// may be on CNS. Kept as text so that a malformed time spoils only its own entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) removed: Option<String>,
    /// When the latest push of this entry that got no answer was sent (RFC 3339): CNS may
    /// still carry it out until the settle period has passed since. `None` when no such
    /// push is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unanswered: Option<String>,
}

/// What to do with a tombstone now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Send the removal again now: the settle period has passed.
    Due,
    /// Not yet: the settle period ends in this long.
    Wait(Duration),
    /// Its removal time is unreadable, or further in the future than a settle period (a
    /// hand edit or a clock far off): sent again now; the text says why.
    Odd(String),
}

/// Whether the period that started at `text` (an RFC 3339 time, `what` it is the time of)
/// has ended at `now`.
fn settle_since(what: &str, text: &str, now: SystemTime, period: Duration) -> Settle {
    let start = match text.parse::<Timestamp>() {
        Ok(time) => SystemTime::from(time),
        Err(error) => {
            return Settle::Odd(format!("its {what} time {text:?} is invalid: {error}"));
        }
    };
    match start.duration_since(now) {
        Ok(ahead) if ahead > period => {
            return Settle::Odd(format!(
                "its {what} time {text} is {ahead:?} ahead of this replica's clock"
            ));
        }
        Ok(ahead) => return Settle::Wait(ahead.saturating_add(period)),
        Err(_) => {}
    }
    match start.checked_add(period).map(|end| end.duration_since(now)) {
        // A period too long for the clock never ends.
        None => Settle::Wait(period),
        Some(Ok(left)) if !left.is_zero() => Settle::Wait(left),
        Some(_) => Settle::Due,
    }
}

/// The later of two times of the record; an unreadable one loses to a readable one.
pub(crate) fn later(a: Option<&String>, b: Option<&String>) -> Option<String> {
    let parse = |t: Option<&String>| t.and_then(|t| t.parse::<Timestamp>().ok());
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) if y > x => b.cloned(),
        (Some(_), _) => a.cloned(),
        (None, Some(_)) => b.cloned(),
        (None, None) => a.or(b).cloned(),
    }
}

/// What identifies an entry: the CNS volume and the entity on it.
pub(crate) type Key<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str);

impl PushedEntry {
    /// The entity `spec` describes, on volume `volume_id` behind claim `volume_name`.
    pub(crate) fn new(
        spec: &CnsVolumeMetadataSpec,
        volume_name: &str,
        volume_id: &str,
        reference: Option<EntityReference>,
    ) -> Self {
        Self {
            volume_name: volume_name.to_owned(),
            volume_id: volume_id.to_owned(),
            entity_type: spec.entity_type.clone(),
            entity_name: spec.entity_name.clone(),
            namespace: spec.namespace.clone(),
            guest_cluster_id: spec.guest_cluster_id.clone(),
            cluster_distribution: spec.cluster_distribution.clone(),
            labels: spec.labels.clone(),
            reference,
            removed: None,
            unanswered: None,
        }
    }

    /// This entry, marked with a push sent at `sent` that got no answer.
    pub(crate) fn unanswered_since(&self, sent: SystemTime) -> Self {
        Self {
            unanswered: Some(timestamp(sent)),
            ..self.clone()
        }
    }

    /// Whether the entry is a tombstone (removed from CNS, waiting to be removed again).
    pub(crate) fn is_tombstone(&self) -> bool {
        self.removed.is_some()
    }

    /// When the removal of a tombstone removed at `self.removed` is due, at `now`, for a
    /// settle period of `period`. A live entry is never due.
    pub(crate) fn settle(&self, now: SystemTime, period: Duration) -> Settle {
        match &self.removed {
            None => Settle::Wait(Duration::MAX),
            Some(text) => settle_since("removal", text, now, period),
        }
    }

    /// Whether a push of this entry that got no answer may still land, at `now`, for a
    /// settle period of `period`: [`Settle::Due`] when none may (or none is known),
    /// [`Settle::Wait`] with the time left otherwise.
    pub(crate) fn landing(&self, now: SystemTime, period: Duration) -> Settle {
        match &self.unanswered {
            None => Settle::Due,
            Some(text) => settle_since("unanswered push", text, now, period),
        }
    }

    pub(crate) fn key(&self) -> Key<'_> {
        (
            &self.volume_id,
            self.entity_type.as_str(),
            &self.entity_name,
            &self.namespace,
            &self.guest_cluster_id,
        )
    }

    /// Whether this is the entity `spec` describes (whatever the volume).
    pub(crate) fn is_entity_of(&self, spec: &CnsVolumeMetadataSpec) -> bool {
        self.entity_type == spec.entity_type
            && self.entity_name == spec.entity_name
            && self.namespace == spec.namespace
            && self.guest_cluster_id == spec.guest_cluster_id
    }

    /// The update that adds (or, with `delete`, removes) this entry on CNS; the same
    /// update `plan::plan_update` (the tests' reference) builds from the spec.
    pub(crate) fn update(&self, delete: bool, config: &Config) -> VolumeMetadataUpdate {
        VolumeMetadataUpdate {
            volume_id: self.volume_id.clone(),
            entity_metadata: EntityMetadata {
                entity_type: self.entity_type.clone(),
                entity_name: self.entity_name.clone(),
                namespace: self.namespace.clone(),
                labels: self.labels.clone(),
                delete,
                cluster_id: self.guest_cluster_id.clone(),
                referred_entities: self.reference.iter().cloned().collect(),
            },
            container_cluster: ContainerCluster {
                cluster_type: ClusterType::Kubernetes,
                cluster_id: self.guest_cluster_id.clone(),
                vsphere_user: config.vsphere_user.clone(),
                cluster_flavor: ClusterFlavor::GuestCluster,
                cluster_distribution: self.cluster_distribution.clone(),
            },
        }
    }
}

/// The record of `object`: `Ok(None)` when it has none, `Err` (with the parse error) when
/// the annotation cannot be read.
pub(crate) fn read(object: &CnsVolumeMetadata) -> Result<Option<Vec<PushedEntry>>, String> {
    match object.annotations().get(PUSHED_ANNOTATION) {
        None => Ok(None),
        Some(text) => serde_json::from_str(text)
            .map(Some)
            .map_err(|e| e.to_string()),
    }
}

/// Stores `entries` in `object` (sorted, without duplicates); an empty list removes the
/// annotation.
pub(crate) fn store(object: &mut CnsVolumeMetadata, mut entries: Vec<PushedEntry>) {
    entries.sort_by(|a, b| a.key().cmp(&b.key()));
    entries.dedup_by(|a, b| a.key() == b.key());
    let annotations = object.annotations_mut();
    if entries.is_empty() {
        annotations.remove(PUSHED_ANNOTATION);
    } else {
        // A list of plain strings and maps always serializes.
        let text = serde_json::to_string(&entries).unwrap_or_default();
        annotations.insert(PUSHED_ANNOTATION.to_owned(), text);
    }
}

/// `time` as the record writes it (RFC 3339, UTC); a time outside what RFC 3339 can say
/// (a clock gone mad) is written as the epoch, which reads as long past.
pub(crate) fn timestamp(time: SystemTime) -> String {
    Timestamp::try_from(time)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

/// A change of the record once CNS confirmed removals.
#[derive(Debug, Default)]
pub(crate) struct Edit {
    /// Live entries removed as stale: they become tombstones removed at `at`.
    pub(crate) entomb: Vec<PushedEntry>,
    /// Tombstones whose removal was sent again: dropped (a live entry with the same key,
    /// recorded meanwhile, stays).
    pub(crate) forget: Vec<PushedEntry>,
    /// Entries removed for good (the object is being deleted): dropped, live or not,
    /// unless the record's entry got another mark of a push without answer meanwhile (a
    /// push another replica sent since may still land).
    pub(crate) drop: Vec<PushedEntry>,
    /// Entries with the time of a push that got no answer (`unanswered`): the record's
    /// entry keeps the later of its mark and this one; an entry the record lacks is added.
    pub(crate) mark: Vec<PushedEntry>,
    /// Entries whose mark is over (the push cannot land anymore, and a push since was
    /// answered): the mark goes, unless the record holds another one meanwhile.
    pub(crate) answered: Vec<PushedEntry>,
    /// The removal time given to new tombstones ([`timestamp`]).
    pub(crate) at: String,
}

impl Edit {
    /// Whether the edit changes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.entomb.is_empty()
            && self.forget.is_empty()
            && self.drop.is_empty()
            && self.mark.is_empty()
            && self.answered.is_empty()
    }

    /// `base` with the edit applied.
    pub(crate) fn apply(&self, base: &[PushedEntry]) -> Vec<PushedEntry> {
        let has =
            |list: &[PushedEntry], entry: &PushedEntry| list.iter().any(|e| e.key() == entry.key());
        let mut entries: Vec<PushedEntry> = base
            .iter()
            .filter(|e| {
                !self
                    .drop
                    .iter()
                    .any(|d| d.key() == e.key() && d.unanswered == e.unanswered)
            })
            .filter(|e| !(e.is_tombstone() && has(&self.forget, e)))
            .map(|e| {
                let mut entry = e.clone();
                if !entry.is_tombstone() && has(&self.entomb, e) {
                    entry.removed = Some(self.at.clone());
                }
                if self
                    .answered
                    .iter()
                    .any(|a| a.key() == e.key() && a.unanswered == e.unanswered)
                {
                    entry.unanswered = None;
                }
                entry
            })
            .collect();
        for marked in &self.mark {
            match entries.iter_mut().find(|e| e.key() == marked.key()) {
                Some(entry) => {
                    entry.unanswered = later(entry.unanswered.as_ref(), marked.unanswered.as_ref());
                }
                None => entries.push(marked.clone()),
            }
        }
        entries
    }
}

/// `base` with every entry of `added` put in (replacing the entry with the same key, but
/// keeping the later mark of a push without answer of the two).
pub(crate) fn union(base: &[PushedEntry], added: &[PushedEntry]) -> Vec<PushedEntry> {
    let mut merged: Vec<PushedEntry> = base
        .iter()
        .filter(|e| !added.iter().any(|a| a.key() == e.key()))
        .cloned()
        .collect();
    merged.extend(added.iter().map(|a| {
        let mut entry = a.clone();
        if let Some(old) = base.iter().find(|b| b.key() == a.key()) {
            entry.unanswered = later(old.unanswered.as_ref(), a.unanswered.as_ref());
        }
        entry
    }));
    merged
}

/// `base` without the entries whose key is one of `removed`.
pub(crate) fn without(base: &[PushedEntry], removed: &[PushedEntry]) -> Vec<PushedEntry> {
    base.iter()
        .filter(|e| !removed.iter().any(|r| r.key() == e.key()))
        .cloned()
        .collect()
}

/// Whether `a` and `b` hold the same entries, whatever the order.
pub(crate) fn same(a: &[PushedEntry], b: &[PushedEntry]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        plan::{plan_update, referred_entities},
        testing::{pod_spec, pv_spec, pvc_spec},
    };

    fn config() -> Config {
        Config::default()
            .cluster_id("cluster-7")
            .vsphere_user("cns-user@vsphere.local")
    }

    #[test]
    fn entry_updates_equal_the_updates_planned_from_the_spec() {
        for spec in [pv_spec(), pvc_spec(), pod_spec()] {
            for (index, reference) in referred_entities(&spec, &config()).into_iter().enumerate() {
                let entry = PushedEntry::new(
                    &spec,
                    &spec.volume_names[index],
                    "fcd-1",
                    Some(reference.clone()),
                );
                for delete in [false, true] {
                    assert_eq!(
                        entry.update(delete, &config()),
                        plan_update(&spec, "fcd-1", reference.clone(), delete, &config())
                    );
                }
            }
        }
    }

    #[test]
    fn the_record_round_trips_through_the_annotation_sorted_and_deduplicated() {
        let spec = pod_spec();
        let a = PushedEntry::new(&spec, "gc-1-vol-a", "fcd-b", None);
        let b = PushedEntry::new(&spec, "gc-1-vol-b", "fcd-a", None);
        let mut object = CnsVolumeMetadata::new("gc-1-web-0", spec);
        assert_eq!(read(&object), Ok(None));
        store(&mut object, vec![a.clone(), b.clone(), a.clone()]);
        assert_eq!(read(&object), Ok(Some(vec![b.clone(), a])));
        store(&mut object, Vec::new());
        assert!(object.annotations().is_empty());
        object
            .annotations_mut()
            .insert(PUSHED_ANNOTATION.into(), "[{".into());
        assert!(read(&object).is_err());
    }

    #[test]
    fn union_replaces_same_key_and_without_removes_by_key() {
        let spec = pvc_spec();
        let old = PushedEntry::new(&spec, "gc-1-vol-a", "fcd-1", None);
        let mut relabelled = old.clone();
        relabelled.labels.insert("new".into(), "label".into());
        let mut renamed = old.clone();
        renamed.entity_name = "other".into();
        let merged = union(&[old.clone(), renamed.clone()], &[relabelled.clone()]);
        assert!(same(&merged, &[renamed.clone(), relabelled]));
        assert_eq!(without(&merged, &[old]), vec![renamed]);
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn tombstones_settle_after_the_period_and_odd_times_are_due_at_once() {
        let period = Duration::from_secs(180);
        let mut entry = PushedEntry::new(&pvc_spec(), "gc-1-vol-a", "fcd-1", None);
        assert!(!entry.is_tombstone());
        entry.removed = Some(timestamp(at(1_000_000)));
        assert_eq!(entry.removed.as_deref(), Some("1970-01-12T13:46:40Z"));
        assert!(entry.is_tombstone());
        let settle = |now| entry.settle(at(now), period);
        assert_eq!(settle(1_000_000), Settle::Wait(period));
        assert_eq!(settle(1_000_100), Settle::Wait(Duration::from_secs(80)));
        assert_eq!(settle(1_000_180), Settle::Due);
        assert_eq!(settle(2_000_000), Settle::Due);
        // A replica whose clock is a little behind waits a little longer.
        assert_eq!(settle(999_990), Settle::Wait(Duration::from_secs(190)));
        // Further ahead than a period: a clock far off or a hand edit; not waited for.
        assert!(matches!(settle(999_000), Settle::Odd(why) if why.contains("ahead")));
        entry.removed = Some("yesterday".into());
        let unreadable = entry.settle(at(1_000_000), period);
        assert!(matches!(unreadable, Settle::Odd(why) if why.contains("\"yesterday\"")));
    }

    #[test]
    fn edits_entomb_live_entries_forget_tombstones_and_drop_anything() {
        let spec = pod_spec();
        let a = PushedEntry::new(&spec, "gc-1-vol-a", "fcd-a", None);
        let b = PushedEntry::new(&spec, "gc-1-vol-b", "fcd-b", None);
        let entomb = Edit {
            entomb: vec![a.clone()],
            at: timestamp(at(10)),
            ..Edit::default()
        };
        let after = entomb.apply(&[a.clone(), b.clone()]);
        assert_eq!(after[0].removed.as_deref(), Some("1970-01-01T00:00:10Z"));
        assert_eq!(after[1], b);
        // Entombing again keeps the first removal time.
        let later = Edit {
            at: timestamp(at(99)),
            ..entomb
        };
        assert_eq!(later.apply(&after), after);
        // Forgetting drops only tombstones: a live entry recorded meanwhile stays.
        let forget = Edit {
            forget: vec![a.clone(), b.clone()],
            ..Edit::default()
        };
        assert_eq!(forget.apply(&after), vec![b.clone()]);
        let drop = Edit {
            drop: vec![a.clone(), b.clone()],
            ..Edit::default()
        };
        assert!(drop.apply(&after).is_empty());
        // An entry marked with a push sent since the deletion read it stays.
        let pushed_since = b.unanswered_since(at(50));
        assert_eq!(
            drop.apply(&[after[0].clone(), pushed_since.clone()]),
            vec![pushed_since]
        );
        assert!(Edit::default().is_empty());
        assert!(!forget.is_empty());
    }

    #[test]
    fn marks_of_pushes_without_answer_land_within_the_period_and_survive_merges() {
        let period = Duration::from_secs(180);
        let entry = PushedEntry::new(&pvc_spec(), "gc-1-vol-a", "fcd-1", None);
        assert_eq!(entry.landing(at(5), period), Settle::Due, "no mark");
        let marked = entry.unanswered_since(at(1_000_000));
        assert_eq!(marked.unanswered.as_deref(), Some("1970-01-12T13:46:40Z"));
        assert_eq!(
            marked.landing(at(1_000_100), period),
            Settle::Wait(Duration::from_secs(80))
        );
        assert_eq!(marked.landing(at(1_000_180), period), Settle::Due);
        let mut junk = entry.clone();
        junk.unanswered = Some("soon".into());
        assert!(
            matches!(junk.landing(at(5), period), Settle::Odd(why) if why.contains("\"soon\""))
        );

        // A new intent (another label) keeps the mark of the recorded entry.
        let mut relabelled = entry.clone();
        relabelled.labels.insert("new".into(), "label".into());
        let merged = union(
            std::slice::from_ref(&marked),
            std::slice::from_ref(&relabelled),
        );
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].labels, relabelled.labels);
        assert_eq!(merged[0].unanswered, marked.unanswered);
        // Of two marks, the later one stays.
        let newer = entry.unanswered_since(at(2_000_000));
        assert_eq!(
            union(std::slice::from_ref(&newer), std::slice::from_ref(&marked))[0].unanswered,
            newer.unanswered
        );
        assert_eq!(
            union(std::slice::from_ref(&marked), std::slice::from_ref(&newer))[0].unanswered,
            newer.unanswered
        );
        assert_eq!(
            later(junk.unanswered.as_ref(), marked.unanswered.as_ref()),
            marked.unanswered
        );
        assert_eq!(later(None, None), None);

        // Marking adds the later time, or the entry the record lacks.
        let other = PushedEntry::new(&pvc_spec(), "gc-1-vol-b", "fcd-2", None);
        let mark = Edit {
            mark: vec![newer.clone(), other.unanswered_since(at(7))],
            ..Edit::default()
        };
        assert!(!mark.is_empty());
        let after = mark.apply(std::slice::from_ref(&marked));
        assert_eq!(after.len(), 2);
        assert_eq!(after[0].unanswered, newer.unanswered);
        assert_eq!(after[1].volume_id, "fcd-2");
        // An answered mark goes, unless another one was recorded meanwhile.
        let answered = Edit {
            answered: vec![marked.clone()],
            ..Edit::default()
        };
        assert_eq!(
            answered.apply(std::slice::from_ref(&marked)),
            vec![entry.clone()]
        );
        assert_eq!(
            answered.apply(std::slice::from_ref(&newer)),
            vec![newer.clone()]
        );
        // The mark round-trips through the annotation.
        let mut object = CnsVolumeMetadata::new("gc-1-data", pvc_spec());
        store(&mut object, vec![marked.clone()]);
        assert!(
            object.annotations()[PUSHED_ANNOTATION]
                .contains(r#""unanswered":"1970-01-12T13:46:40Z""#)
        );
        assert_eq!(read(&object), Ok(Some(vec![marked])));
    }

    #[test]
    fn records_without_tombstones_still_read_and_unknown_fields_are_ignored() {
        // As written before tombstones existed.
        let old = r#"[{"volumename":"gc-1-vol-a","volumeid":"fcd-1","entitytype":"PERSISTENT_VOLUME_CLAIM","entityname":"data","namespace":"shop","guestclusterid":"gc-1"}]"#;
        let mut object = CnsVolumeMetadata::new("gc-1-data", pvc_spec());
        object
            .annotations_mut()
            .insert(PUSHED_ANNOTATION.into(), old.into());
        let entries = read(&object).unwrap().unwrap();
        assert_eq!(entries.len(), 1);
        assert!(!entries[0].is_tombstone());
        assert_eq!(entries[0].volume_id, "fcd-1");
        // A later version's fields do not spoil the record.
        let newer = old.replace(
            r#""guestclusterid":"gc-1""#,
            r#""guestclusterid":"gc-1","future":{"x":1}"#,
        );
        object
            .annotations_mut()
            .insert(PUSHED_ANNOTATION.into(), newer);
        assert_eq!(read(&object).unwrap().unwrap(), entries);
        // A tombstone round-trips.
        let mut tombstone = entries[0].clone();
        tombstone.removed = Some(timestamp(at(5)));
        store(&mut object, vec![tombstone.clone()]);
        assert!(
            object.annotations()[PUSHED_ANNOTATION].contains(r#""removed":"1970-01-01T00:00:05Z""#)
        );
        assert_eq!(read(&object), Ok(Some(vec![tombstone])));
        for junk in ["{}", "[1]", r#"[{"volumeid":"fcd-1"}]"#, "null"] {
            object
                .annotations_mut()
                .insert(PUSHED_ANNOTATION.into(), junk.into());
            assert!(read(&object).is_err(), "{junk}");
        }
    }
}
