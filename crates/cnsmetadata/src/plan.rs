//! Pure construction of the backend updates for one object.

use crate::{
    backend::{ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata, VolumeMetadataUpdate},
    config::Config,
    resource::{CnsVolumeMetadataSpec, EntityReference, EntityType},
};

/// The entity references of `spec` as sent to CNS, one per volume name, in order.
///
/// References of a PV entity get [`Config::pv_reference_cluster_id`] (the supervisor ID or
/// the cluster ID), as they point at a supervisor PVC; other references keep their own.
#[must_use]
pub fn referred_entities(spec: &CnsVolumeMetadataSpec, config: &Config) -> Vec<EntityReference> {
    spec.entity_references
        .iter()
        .map(|reference| {
            let mut reference = reference.clone();
            if spec.entity_type == EntityType::PersistentVolume {
                config
                    .pv_reference_cluster_id()
                    .clone_into(&mut reference.cluster_id);
            }
            reference
        })
        .collect()
}

/// The update for volume `volume_id` that pairs the entity with `reference` (Go builds it
/// inline in `updateCnsMetadata`).
#[must_use]
pub fn plan_update(
    spec: &CnsVolumeMetadataSpec,
    volume_id: &str,
    reference: EntityReference,
    delete: bool,
    config: &Config,
) -> VolumeMetadataUpdate {
    VolumeMetadataUpdate {
        volume_id: volume_id.to_owned(),
        entity_metadata: EntityMetadata {
            entity_type: spec.entity_type.clone(),
            entity_name: spec.entity_name.clone(),
            namespace: spec.namespace.clone(),
            labels: spec.labels.clone(),
            delete,
            cluster_id: spec.guest_cluster_id.clone(),
            referred_entities: vec![reference],
        },
        container_cluster: ContainerCluster {
            cluster_type: ClusterType::Kubernetes,
            cluster_id: spec.guest_cluster_id.clone(),
            vsphere_user: config.vsphere_user.clone(),
            cluster_flavor: ClusterFlavor::GuestCluster,
            cluster_distribution: spec.cluster_distribution.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::testing::{pod_spec, pv_spec, pvc_spec};

    fn config() -> Config {
        Config::default()
            .cluster_id("cluster-7")
            .supervisor_id("supervisor-9")
            .vsphere_user("cns-user@vsphere.local")
    }

    #[test]
    fn pv_references_get_the_cluster_id_or_the_supervisor_id() {
        let by_cluster = referred_entities(&pv_spec(), &config());
        assert_eq!(
            by_cluster,
            vec![EntityReference::new(
                EntityType::PersistentVolumeClaim,
                "gc-1-vol-a",
                "tenant",
                "cluster-7"
            )]
        );
        let by_supervisor = referred_entities(&pv_spec(), &config().use_supervisor_id_for_pv(true));
        assert_eq!(by_supervisor[0].cluster_id, "supervisor-9");
    }

    #[test]
    fn pvc_and_pod_references_keep_their_cluster_id() {
        let config = config().use_supervisor_id_for_pv(true);
        assert_eq!(
            referred_entities(&pvc_spec(), &config),
            pvc_spec().entity_references
        );
        assert_eq!(
            referred_entities(&pod_spec(), &config),
            pod_spec().entity_references
        );
    }

    #[test]
    fn pvc_update_carries_the_whole_entity() {
        let spec = pvc_spec();
        let reference = referred_entities(&spec, &config()).remove(0);
        let update = plan_update(&spec, "fcd-1", reference, false, &config());
        assert_eq!(
            update,
            VolumeMetadataUpdate {
                volume_id: "fcd-1".into(),
                entity_metadata: EntityMetadata {
                    entity_type: EntityType::PersistentVolumeClaim,
                    entity_name: "data".into(),
                    namespace: "shop".into(),
                    labels: BTreeMap::from([("app".into(), "db".into())]),
                    delete: false,
                    cluster_id: "gc-1".into(),
                    referred_entities: vec![EntityReference::new(
                        EntityType::PersistentVolume,
                        "pvc-guest-a",
                        "",
                        "gc-1"
                    )],
                },
                container_cluster: ContainerCluster {
                    cluster_type: ClusterType::Kubernetes,
                    cluster_id: "gc-1".into(),
                    vsphere_user: "cns-user@vsphere.local".into(),
                    cluster_flavor: ClusterFlavor::GuestCluster,
                    cluster_distribution: "TKGService".into(),
                },
            }
        );
    }

    #[test]
    fn delete_flag_is_passed_through() {
        let spec = pod_spec();
        let reference = referred_entities(&spec, &config()).remove(1);
        let update = plan_update(&spec, "fcd-2", reference.clone(), true, &config());
        assert!(update.entity_metadata.delete);
        assert_eq!(update.entity_metadata.referred_entities, vec![reference]);
        assert!(update.entity_metadata.labels.is_empty());
    }
}
