//! The Kubernetes objects a run creates.

use std::collections::BTreeMap;

use cnsmetadata::{CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference, EntityType};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provision_controller::testing::pvc;

use super::names;
use super::schedule::Entity;

/// The namespace of guest entities.
const GUEST_NAMESPACE: &str = "guest-ns";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

/// StorageClass `name` as created at the start, or again, with `ours` false, naming
/// another provisioner with that provisioner's parameters (which ours does not know).
#[must_use]
pub fn class(name: &str, ours: bool) -> StorageClass {
    let mut parameters = if ours {
        BTreeMap::from([
            ("datastoreurl".to_owned(), names::DATASTORE_URL.to_owned()),
            ("csi.storage.k8s.io/fstype".to_owned(), "ext4".to_owned()),
        ])
    } else {
        BTreeMap::from([("type".to_owned(), "other-disk".to_owned())])
    };
    if name == names::CLASS_BAD_PARAMETER {
        parameters.insert("nosuchparameter".to_owned(), "x".to_owned());
    }
    let wffc = name == names::CLASS_WFFC;
    StorageClass {
        metadata: meta(name),
        provisioner: if ours {
            names::PROVISIONER
        } else {
            names::OTHER_PROVISIONER
        }
        .to_owned(),
        parameters: Some(parameters),
        reclaim_policy: Some(
            if name == names::CLASS_RETAIN {
                "Retain"
            } else {
                "Delete"
            }
            .to_owned(),
        ),
        volume_binding_mode: Some(
            if wffc {
                "WaitForFirstConsumer"
            } else {
                "Immediate"
            }
            .to_owned(),
        ),
        ..StorageClass::default()
    }
}

/// A node.
#[must_use]
pub fn node(name: &str) -> Node {
    Node {
        metadata: meta(name),
        ..Node::default()
    }
}

/// A claim of `class` asking for `size`, with the scheduler's selected node when given.
#[must_use]
pub fn claim(name: &str, class: &str, size: &str, node: Option<&str>) -> PersistentVolumeClaim {
    let claim = pvc(name)
        .namespace(names::NAMESPACE)
        .storage_class(class)
        .request(size);
    match node {
        Some(node) => claim.selected_node(node).build(),
        None => claim.build(),
    }
}

/// A static PV (reclaim Retain) pre-bound to the claim `claim`/`uid`, backed by the CNS
/// volume `volume_id`.
#[must_use]
pub fn static_pv(
    name: &str,
    class: &str,
    claim: &str,
    uid: &str,
    volume_id: &str,
) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(name),
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("5Gi".to_owned()),
            )])),
            storage_class_name: Some(class.to_owned()),
            persistent_volume_reclaim_policy: Some("Retain".to_owned()),
            claim_ref: Some(ObjectReference {
                namespace: Some(names::NAMESPACE.to_owned()),
                name: Some(claim.to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: names::PROVISIONER.to_owned(),
                volume_handle: volume_id.to_owned(),
                fs_type: Some("ext4".to_owned()),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    }
}

/// The spec of `CnsVolumeMetadata` `object` describing `entity`, which uses claim
/// `claim`'s volume. `revision` changes the labels and the reference; `valid: false`
/// breaks one rule while keeping the entity's identity (type, name, namespace).
#[must_use]
pub fn metadata_spec(
    object: &str,
    claim: &str,
    entity: Entity,
    revision: u32,
    valid: bool,
) -> CnsVolumeMetadataSpec {
    let entity_name = names::entity(object);
    let labels = BTreeMap::from([
        ("app".to_owned(), "chaos".to_owned()),
        ("revision".to_owned(), revision.to_string()),
    ]);
    let mut spec = match entity {
        Entity::Claim => CnsVolumeMetadataSpec {
            entity_type: EntityType::PersistentVolumeClaim,
            namespace: GUEST_NAMESPACE.to_owned(),
            entity_references: vec![EntityReference::new(
                EntityType::PersistentVolume,
                &format!("guest-pv-{object}-r{revision}"),
                "",
                names::GUEST_CLUSTER,
            )],
            labels,
            ..CnsVolumeMetadataSpec::default()
        },
        Entity::Volume => CnsVolumeMetadataSpec {
            entity_type: EntityType::PersistentVolume,
            entity_references: vec![EntityReference::new(
                EntityType::PersistentVolumeClaim,
                claim,
                names::NAMESPACE,
                "",
            )],
            labels,
            ..CnsVolumeMetadataSpec::default()
        },
        Entity::Pod => CnsVolumeMetadataSpec {
            entity_type: EntityType::Pod,
            namespace: GUEST_NAMESPACE.to_owned(),
            entity_references: vec![EntityReference::new(
                EntityType::PersistentVolumeClaim,
                &format!("guest-pvc-{object}-r{revision}"),
                GUEST_NAMESPACE,
                names::GUEST_CLUSTER,
            )],
            ..CnsVolumeMetadataSpec::default()
        },
    };
    spec.volume_names = vec![claim.to_owned()];
    spec.guest_cluster_id = names::GUEST_CLUSTER.to_owned();
    spec.entity_name = entity_name;
    if !valid {
        if revision == 0 {
            // Invalid from the start: no guest cluster.
            spec.guest_cluster_id = String::new();
        } else {
            match entity {
                Entity::Claim => spec.entity_references[0].cluster_id = String::new(),
                Entity::Volume => spec.entity_references[0].cluster_id = "x".to_owned(),
                Entity::Pod => {
                    spec.labels = BTreeMap::from([("not".to_owned(), "allowed".to_owned())]);
                }
            }
        }
    }
    spec
}

/// A `CnsVolumeMetadata` object.
#[must_use]
pub fn metadata(object: &str, spec: CnsVolumeMetadataSpec) -> CnsVolumeMetadata {
    CnsVolumeMetadata::new(object, spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(spec: CnsVolumeMetadataSpec) -> CnsVolumeMetadata {
        metadata("m", spec)
    }

    #[test]
    fn metadata_specs_are_valid_or_invalid_as_asked() {
        for entity in [Entity::Claim, Entity::Volume, Entity::Pod] {
            for revision in 0..3 {
                let valid = object(metadata_spec("m", "c", entity, revision, true));
                assert!(
                    cnsmetadata::testing::is_valid(&valid),
                    "{entity:?} {revision}"
                );
                let invalid = object(metadata_spec("m", "c", entity, revision, false));
                assert!(
                    !cnsmetadata::testing::is_valid(&invalid),
                    "{entity:?} {revision}"
                );
                // An invalid edit keeps the entity's identity.
                assert_eq!(valid.spec.entity_type, invalid.spec.entity_type);
                assert_eq!(valid.spec.entity_name, invalid.spec.entity_name);
                assert_eq!(valid.spec.namespace, invalid.spec.namespace);
            }
        }
    }
}
