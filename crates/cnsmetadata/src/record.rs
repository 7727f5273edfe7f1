//! What the reconciler has pushed to CNS for one object, kept in an annotation of the object.
//!
//! Go only ever removes what the *current* spec describes, so an entity pushed under an older
//! spec (another entity name, a volume no longer listed, a claim bound to another volume)
//! stays on CNS forever, and an object whose spec became invalid cannot be cleaned up at all.
//! The record lists every entity that may be on CNS because of the object, with the CNS
//! volume ID it was sent to. It is written *before* the push (intent), so a crash between
//! the push and the status write cannot lose an entry; entries leave the record only once
//! CNS confirmed their removal.

use std::collections::BTreeMap;

use kube_client::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::{
    backend::{ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata, VolumeMetadataUpdate},
    config::Config,
    resource::{CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference, EntityType},
};

/// Annotation in which the reconciler records, as a JSON list, every entity it may have
/// pushed to CNS for the object (with the CNS volume ID), so that deleting the object or
/// changing its spec removes exactly those entries. Written and read only by the
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
    /// update [`plan_update`](crate::plan_update) builds from the spec.
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
                vsphere_user: config.get_vsphere_user().to_owned(),
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

/// `base` with every entry of `added` put in (replacing the entry with the same key).
pub(crate) fn union(base: &[PushedEntry], added: &[PushedEntry]) -> Vec<PushedEntry> {
    let mut merged: Vec<PushedEntry> = base
        .iter()
        .filter(|e| !added.iter().any(|a| a.key() == e.key()))
        .cloned()
        .collect();
    merged.extend(added.iter().cloned());
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
}
