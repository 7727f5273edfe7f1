//! Black-box test of the `cnsmetadata` public API: the CRD installed through the API,
//! `MetadataController` with the in-memory backend, a guest PVC entity from creation to deletion.

use std::{collections::BTreeMap, time::Duration};

use cnsmetadata::{
    ClusterFlavor, ClusterType, CnsVolumeMetadata, Config, ContainerCluster, EntityMetadata,
    EntityReference, EntityType, FINALIZER, MetadataController, VSPHERE_CSI_DRIVER,
    VolumeMetadataUpdate, VolumeStatus, crd,
    testing::{InMemoryBackend, bound_claim, csi_volume, pvc_spec},
};
use k8s_openapi::{
    api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use kube_sim::{KubeSim, wait::eventually};

#[tokio::test]
async fn guest_pvc_metadata_reaches_cns_and_is_removed_on_delete() {
    let sim = KubeSim::builder().start().await.unwrap();
    let client = sim.client();
    let post = PostParams::default();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&post, &crd())
        .await
        .unwrap();
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some("tenant".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&post, &namespace)
        .await
        .unwrap();
    let pv = csi_volume("pv-a", VSPHERE_CSI_DRIVER, "fcd-a");
    Api::<PersistentVolume>::all(client.clone())
        .create(&post, &pv)
        .await
        .unwrap();
    let claim = bound_claim("tenant", "gc-1-vol-a", "pv-a");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "tenant");
    claims.create(&post, &claim).await.unwrap();

    let backend = InMemoryBackend::new();
    // As a supervisor's manifest sets them (unset, CLUSTER_FLAVOR means VANILLA).
    let config = Config::from_lookup(|name| match name {
        "WORKER_THREADS_VOLUME_METADATA" => Some("2".to_owned()),
        "CLUSTER_FLAVOR" => Some("WORKLOAD".to_owned()),
        _ => None,
    })
    .unwrap()
    .cluster_id("cluster-7")
    .vsphere_user("cns-user@vsphere.local");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reconciler = tokio::spawn(
        MetadataController::new(client.clone(), backend.clone())
            .config(config)
            .run(async {
                let _ = stopped.await;
            }),
    );

    let objects: Api<CnsVolumeMetadata> = Api::namespaced(client.clone(), "tenant");
    objects
        .create(&post, &CnsVolumeMetadata::new("gc-1-data", pvc_spec()))
        .await
        .unwrap();
    let synced = eventually("per-volume status", || async {
        let object = objects.get("gc-1-data").await.ok()?;
        (!object.status.volume_status.is_empty()).then_some(object)
    })
    .await;
    assert_eq!(
        synced.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-a")]
    );
    assert_eq!(synced.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));

    let added = VolumeMetadataUpdate {
        volume_id: "fcd-a".into(),
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
                "gc-1",
            )],
        },
        container_cluster: ContainerCluster {
            cluster_type: ClusterType::Kubernetes,
            cluster_id: "gc-1".into(),
            vsphere_user: "cns-user@vsphere.local".into(),
            cluster_flavor: ClusterFlavor::GuestCluster,
            cluster_distribution: "TKGService".into(),
        },
    };
    assert_eq!(backend.updates(), vec![added.clone()]);

    objects
        .delete("gc-1-data", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the object to be gone", || async {
        objects
            .get_opt("gc-1-data")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let removed = VolumeMetadataUpdate {
        entity_metadata: EntityMetadata {
            delete: true,
            ..added.entity_metadata.clone()
        },
        ..added.clone()
    };
    assert_eq!(backend.updates(), vec![added, removed]);

    stop.send(()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), reconciler).await;
    result.expect("run drains after shutdown").unwrap().unwrap();
}
