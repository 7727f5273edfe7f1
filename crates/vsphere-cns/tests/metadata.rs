//! `CnsMetadataBackend` against the in-process CNS simulator.
#![cfg(feature = "simulator")]

use std::collections::BTreeMap;

use cnsmetadata::{
    BackendError, ClusterFlavor as CrdFlavor, ClusterType, ContainerCluster as CrdCluster,
    EntityMetadata as CrdEntity, EntityReference as CrdReference, EntityType as CrdType,
    VolumeMetadataBackend, VolumeMetadataUpdate,
};
use vsphere_cns::simulator::{CnsSimulator, DEFAULT_DATASTORE, SimFault};
use vsphere_cns::{
    ClusterFlavor, CnsClient, CnsMetadataBackend, CnsVolumeId, MoRef,
    wire::{ContainerCluster, EntityType, KeyValue, VolumeCreateSpec, VolumeMetadata},
};

async fn volume(client: &CnsClient) -> CnsVolumeId {
    let cluster = ContainerCluster::kubernetes("supervisor-1", "cnsuser", ClusterFlavor::Workload);
    let spec = VolumeCreateSpec {
        name: "pvc-1".into(),
        datastores: vec![MoRef::datastore(DEFAULT_DATASTORE)],
        capacity_in_mb: 1024,
        metadata: VolumeMetadata::for_cluster(cluster, Vec::new()),
        ..VolumeCreateSpec::default()
    };
    client.create_volume(&spec).await.unwrap()
}

fn update(volume_id: &str, delete: bool) -> VolumeMetadataUpdate {
    VolumeMetadataUpdate {
        volume_id: volume_id.to_owned(),
        entity_metadata: CrdEntity {
            entity_type: CrdType::PersistentVolumeClaim,
            entity_name: "data".into(),
            namespace: "shop".into(),
            labels: BTreeMap::from([("app".into(), "db".into())]),
            delete,
            cluster_id: "gc-1".into(),
            referred_entities: vec![CrdReference::new(
                CrdType::PersistentVolume,
                "pvc-guest-a",
                "",
                "gc-1",
            )],
        },
        container_cluster: CrdCluster {
            cluster_type: ClusterType::Kubernetes,
            cluster_id: "gc-1".into(),
            vsphere_user: "cnsuser".into(),
            cluster_flavor: CrdFlavor::GuestCluster,
            cluster_distribution: "TKGService".into(),
        },
    }
}

#[tokio::test]
async fn an_update_reaches_the_stored_metadata_and_delete_removes_it() {
    let sim = CnsSimulator::start().await.unwrap();
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    let id = volume(&client).await;
    let backend = CnsMetadataBackend::new(client);

    backend
        .update_volume_metadata(&update(id.as_str(), false))
        .await
        .unwrap();
    let stored = sim.volumes().remove(0).metadata;
    assert_eq!(stored.entity_metadata.len(), 1);
    let entity = &stored.entity_metadata[0];
    assert_eq!(entity.entity_type, EntityType::PersistentVolumeClaim);
    assert_eq!(entity.entity_name, "data");
    assert_eq!(entity.namespace.as_deref(), Some("shop"));
    assert_eq!(entity.cluster_id.as_deref(), Some("gc-1"));
    assert_eq!(entity.labels, vec![KeyValue::new("app", "db")]);
    assert_eq!(entity.referred_entity[0].entity_name, "pvc-guest-a");
    assert_eq!(stored.container_cluster.cluster_id, "gc-1");
    assert_eq!(
        stored.container_cluster.cluster_flavor,
        Some(ClusterFlavor::GuestCluster)
    );
    assert!(
        stored
            .container_cluster_array
            .iter()
            .any(|c| c.cluster_id == "gc-1")
    );

    backend
        .update_volume_metadata(&update(id.as_str(), true))
        .await
        .unwrap();
    assert!(sim.volumes()[0].metadata.entity_metadata.is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn an_unknown_volume_is_not_found() {
    let sim = CnsSimulator::start().await.unwrap();
    let backend = CnsMetadataBackend::new(CnsClient::connect(&sim.vc_config()).await.unwrap());
    let err = backend
        .update_volume_metadata(&update("4f82a6e1-0000-0000-0000-000000000000", false))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(matches!(err, BackendError::NotFound { volume_id } if volume_id.starts_with("4f82")));
    sim.shutdown().await;
}

#[tokio::test]
async fn other_faults_are_other_errors() {
    let sim = CnsSimulator::start().await.unwrap();
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    let id = volume(&client).await;
    let backend = CnsMetadataBackend::new(client);
    sim.fail_next(
        "CnsUpdateVolumeMetadata",
        SimFault::task("CnsFault").message("busy"),
    );
    let err = backend
        .update_volume_metadata(&update(id.as_str(), false))
        .await
        .unwrap_err();
    assert!(!err.is_not_found());
    assert!(matches!(err, BackendError::Other(_)));
    sim.fail_next(
        "CnsUpdateVolumeMetadata",
        SimFault::volume_result("NotFound"),
    );
    let err = backend
        .update_volume_metadata(&update(id.as_str(), false))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn an_update_that_times_out_is_unanswered_and_may_still_land() {
    let sim = CnsSimulator::start().await.unwrap();
    let config = sim
        .vc_config()
        .timeout(std::time::Duration::from_millis(200));
    let client = CnsClient::connect(&config).await.unwrap();
    let id = volume(&client).await;
    let backend = CnsMetadataBackend::new(client);
    sim.delay(
        "CnsUpdateVolumeMetadata",
        std::time::Duration::from_millis(600),
    );
    let err = backend
        .update_volume_metadata(&update(id.as_str(), false))
        .await
        .unwrap_err();
    assert!(err.may_land_later(), "{err:?}");
    assert!(matches!(err, BackendError::Unanswered(_)), "{err:?}");
    // vCenter carries the update out after the client gave up.
    let landed = async {
        while sim.volumes()[0].metadata.entity_metadata.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), landed)
        .await
        .expect("the update lands");
    sim.shutdown().await;
}

#[tokio::test]
async fn cleared_faults_no_longer_fail_updates() {
    let sim = CnsSimulator::start().await.unwrap();
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    let id = volume(&client).await;
    let backend = CnsMetadataBackend::new(client);
    for _ in 0..3 {
        sim.fail_next("CnsUpdateVolumeMetadata", SimFault::call("CnsFault"));
    }
    let update = update(id.as_str(), false);
    let push = || backend.update_volume_metadata(&update);
    assert!(push().await.is_err(), "the first queued fault");
    sim.clear_faults();
    push().await.expect("no queued fault left");
    sim.shutdown().await;
}
