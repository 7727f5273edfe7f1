//! Volume identity in `CnsProvisioner`: replicas racing on one claim converge on the lowest
//! volume ID, provisioning never deletes a volume, and deletion releases only what a PV owns.
#![cfg(feature = "simulator")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provision_controller::annotations::ANN_PROVISIONED_BY;
use provision_controller::{
    DeleteError, LateAssets, ProvisionError, ProvisionOptions, Provisioner,
};
use vsphere_cns::simulator::{CnsSimulator, SimFault};
use vsphere_cns::{
    CSI_DRIVER, ClusterFlavor, CnsClient, CnsProvisioner, CnsVolumeId, MoRef, ProvisionerError,
    VirtualCenterConfig,
};

const DS_URL: &str = "ds:///vmfs/volumes/test-ds/";
const DS_ID: &str = "datastore-7";
const CLUSTER: &str = "cluster-1";
const PV: &str = "pvc-uid-1";

async fn sim() -> CnsSimulator {
    CnsSimulator::builder()
        .datastore(DS_ID, "TestDS", DS_URL)
        .start()
        .await
        .unwrap()
}

async fn provisioner_with(config: &VirtualCenterConfig) -> CnsProvisioner {
    let client = CnsClient::connect(config).await.unwrap();
    CnsProvisioner::new(client, CLUSTER, ClusterFlavor::Vanilla)
        .unwrap()
        .datastore_url(DS_URL, MoRef::datastore(DS_ID))
}

async fn provisioner(sim: &CnsSimulator) -> CnsProvisioner {
    provisioner_with(&sim.vc_config()).await
}

fn options() -> ProvisionOptions {
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some("vsphere".into()),
            ..ObjectMeta::default()
        },
        provisioner: "csi.vsphere.vmware.com".into(),
        parameters: Some(BTreeMap::from([("datastoreurl".into(), DS_URL.into())])),
        ..StorageClass::default()
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    ProvisionOptions::new(Arc::new(class), PV, Arc::new(claim), None)
}

fn handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone()
}

/// A CSI PV named `name` with `handle` of `driver`.
fn csi_pv(name: &str, driver: &str, handle: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: handle.into(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    }
}

/// `volume` as the controller saves it: with `pv.kubernetes.io/provisioned-by`.
fn provisioned(mut volume: PersistentVolume) -> PersistentVolume {
    volume
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANN_PROVISIONED_BY.into(), "csi.vsphere.vmware.com".into());
    volume
}

fn ids(sim: &CnsSimulator) -> Vec<String> {
    sim.volumes().iter().map(|v| v.id.to_string()).collect()
}

fn count(sim: &CnsSimulator, method: &str) -> usize {
    sim.requests().iter().filter(|r| r.method == method).count()
}

#[tokio::test(start_paused = true)]
async fn racing_replicas_converge_on_the_lowest_id_and_delete_nothing() {
    let sim = sim().await;
    let a = provisioner(&sim).await;
    let b = provisioner(&sim).await;
    // Both lookups find nothing and both creates are sent; each create lands after 1 s and
    // its task is answered 2 s later, so both volumes exist before either replica looks
    // again.
    sim.delay("CnsCreateVolume", Duration::from_secs(1));
    sim.delay("RetrievePropertiesEx", Duration::from_secs(2));
    let options = options();
    let (from_a, from_b) = tokio::join!(a.provision(&options), b.provision(&options));
    let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
    assert_eq!(count(&sim, "CnsCreateVolume"), 2, "both creates ran");
    let volumes = ids(&sim);
    assert_eq!(volumes.len(), 2, "no volume was deleted: {volumes:?}");
    assert_eq!(count(&sim, "CnsDeleteVolume"), 0);
    let lowest = volumes.iter().min().unwrap();
    assert_eq!(&handle(&from_a), lowest);
    assert_eq!(&handle(&from_b), lowest);
    // A later lookup (a restart, a third replica) settles on the same volume.
    sim.delay("CnsCreateVolume", Duration::ZERO);
    sim.delay("RetrievePropertiesEx", Duration::ZERO);
    let again = provisioner(&sim).await.provision(&options).await.unwrap();
    assert_eq!(&handle(&again), lowest);
    assert_eq!(count(&sim, "CnsCreateVolume"), 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_lookup_that_finds_two_volumes_returns_the_lowest_and_deletes_neither() {
    let sim = sim().await;
    let first = sim.insert_volume(PV, CLUSTER);
    let second = sim.insert_volume(PV, CLUSTER);
    sim.insert_volume(PV, "cluster-2");
    sim.insert_volume("pvc-other", CLUSTER);
    let pv = provisioner(&sim).await.provision(&options()).await.unwrap();
    assert_eq!(handle(&pv), first.clone().min(second).as_str());
    assert_eq!(sim.volumes().len(), 4, "{:?}", ids(&sim));
    assert_eq!(count(&sim, "CnsDeleteVolume"), 0);
    assert_eq!(count(&sim, "CnsCreateVolume"), 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_create_that_failed_after_making_its_volume_is_in_background_and_deletes_nothing() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    sim.fail_next("CnsCreateVolume", SimFault::task_after_change("CnsFault"));
    let err = provisioner.provision(&options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    assert_eq!(sim.volumes().len(), 1);
    assert_eq!(count(&sim, "CnsDeleteVolume"), 0);
    // The retry adopts the volume.
    let pv = provisioner.provision(&options()).await.unwrap();
    assert_eq!(ids(&sim), vec![handle(&pv)]);
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);

    // A create that failed without leaving anything is final.
    provisioner.delete(&provisioned(pv)).await.unwrap();
    sim.fail_next("CnsCreateVolume", SimFault::task("CnsFault"));
    let err = provisioner.provision(&options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::Failed(_)), "{err:?}");
    assert!(sim.volumes().is_empty());
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_create_keeps_a_volume_another_replica_made_meanwhile() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    sim.delay("CnsCreateVolume", Duration::from_secs(5));
    sim.fail_next("CnsCreateVolume", SimFault::task("CnsFault"));
    let options = options();
    let provision = provisioner.provision(&options);
    tokio::pin!(provision);
    // While the create is on its way, another replica's create of the same name lands.
    let theirs = tokio::select! {
        result = &mut provision => panic!("the create is delayed: {result:?}"),
        () = tokio::time::sleep(Duration::from_secs(1)) => sim.insert_volume(PV, CLUSTER),
    };
    let err = provision.await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    assert_eq!(ids(&sim), vec![theirs.to_string()], "their volume is kept");
    assert_eq!(count(&sim, "CnsDeleteVolume"), 0);

    // When the lookup after the failed create fails, the answer stays in background.
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    client.delete_volume(&theirs, true).await.unwrap();
    sim.fail_next("CnsCreateVolume", SimFault::task("CnsFault"));
    let provision = provisioner.provision(&options);
    tokio::pin!(provision);
    tokio::select! {
        result = &mut provision => panic!("the create is delayed: {result:?}"),
        () = tokio::time::sleep(Duration::from_secs(1)) => {
            sim.fail_next("CnsQueryVolume", SimFault::call("CnsFault"));
        }
    };
    let err = provision.await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn delete_releases_same_named_leftovers_only_for_provisioned_pvs() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    // A provisioned PV: its volume and the leftovers of its name in this cluster go.
    let pv = provisioner.provision(&options()).await.unwrap();
    let leftover = sim.insert_volume(PV, CLUSTER);
    let neighbours = sim.insert_volume(PV, "cluster-2");
    let unrelated = sim.insert_volume("pvc-other", CLUSTER);
    provisioner.delete(&provisioned(pv.clone())).await.unwrap();
    let mut left = ids(&sim);
    left.sort();
    let mut expected = vec![neighbours.to_string(), unrelated.to_string()];
    expected.sort();
    assert_eq!(
        left,
        expected,
        "the handle {} and leftover {leftover} go",
        handle(&pv)
    );

    // A static PV (no provisioned-by) only loses its handle's volume, even when CNS
    // volumes carry the PV's name.
    let target = sim.insert_volume("disk-1", CLUSTER);
    let named_like_the_pv = sim.insert_volume("pv-static", CLUSTER);
    let static_pv = csi_pv("pv-static", "csi.vsphere.vmware.com", target.as_str());
    provisioner.delete(&static_pv).await.unwrap();
    let left = ids(&sim);
    assert!(!left.contains(&target.to_string()), "{left:?}");
    assert!(left.contains(&named_like_the_pv.to_string()), "{left:?}");
    assert_eq!(left.len(), 3, "{left:?}");

    // An empty handle deletes nothing, provisioned or not.
    let empty = provisioned(csi_pv("pv-static", "csi.vsphere.vmware.com", ""));
    let err = provisioner.delete(&empty).await.unwrap_err();
    assert!(
        matches!(&err, DeleteError::Failed(e) if e.to_string().contains("empty volume handle")),
        "{err:?}"
    );
    assert_eq!(ids(&sim).len(), 3);
    sim.shutdown().await;
}

#[tokio::test]
async fn delete_duplicate_deletes_the_duplicates_volume_never_the_saved_one() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let saved_id = sim.insert_volume(PV, CLUSTER);
    let duplicate_id = sim.insert_volume(PV, CLUSTER);
    let third = sim.insert_volume(PV, CLUSTER);
    let saved = provisioned(csi_pv(PV, "csi.vsphere.vmware.com", saved_id.as_str()));
    let duplicate = csi_pv(PV, "csi.vsphere.vmware.com", duplicate_id.as_str());

    // Nothing to release: the same handle, an empty one, another driver's.
    for nothing in [
        saved.clone(),
        csi_pv(PV, "csi.vsphere.vmware.com", ""),
        csi_pv(PV, "nfs.csi.k8s.io", duplicate_id.as_str()),
    ] {
        provisioner
            .delete_duplicate(&nothing, &saved)
            .await
            .unwrap();
        assert_eq!(ids(&sim).len(), 3, "{nothing:?}");
    }
    assert_eq!(count(&sim, "CnsDeleteVolume"), 0);

    provisioner
        .delete_duplicate(&duplicate, &saved)
        .await
        .unwrap();
    let left = ids(&sim);
    assert!(!left.contains(&duplicate_id.to_string()), "{left:?}");
    assert!(
        left.contains(&saved_id.to_string()),
        "the saved PV's volume stays"
    );
    assert!(
        left.contains(&third.to_string()),
        "nothing is deleted by name"
    );
    assert_eq!(left.len(), 2);
    // Already gone counts as released.
    provisioner
        .delete_duplicate(&duplicate, &saved)
        .await
        .unwrap();
    // A failed delete is reported.
    sim.fail_next("CnsDeleteVolume", SimFault::call("CnsFault"));
    let other = csi_pv(PV, "csi.vsphere.vmware.com", third.as_str());
    let err = provisioner
        .delete_duplicate(&other, &saved)
        .await
        .unwrap_err();
    assert!(matches!(err, DeleteError::Failed(_)), "{err:?}");
    assert_eq!(ids(&sim).len(), 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn an_empty_cluster_id_is_refused_by_the_constructor() {
    let sim = sim().await;
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    for id in ["", "  "] {
        let err = CnsProvisioner::new(client.clone(), id, ClusterFlavor::Vanilla).unwrap_err();
        assert!(matches!(err, ProvisionerError::EmptyClusterId), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("cluster id is empty") && text.contains("[Global] cluster-id"),
            "{text}"
        );
    }
    let provisioner = CnsProvisioner::new(client, CLUSTER, ClusterFlavor::Vanilla).unwrap();
    assert_eq!(provisioner.container_cluster().cluster_id, CLUSTER);
    sim.shutdown().await;
}

/// `ids` sorted.
fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// The PV of name [`PV`] the controller saved for volume `id`.
fn saved_pv(id: &CnsVolumeId) -> PersistentVolume {
    provisioned(csi_pv(PV, CSI_DRIVER, id.as_str()))
}

#[tokio::test]
async fn volume_saved_deletes_the_leftovers_of_its_name_and_keeps_its_own_volume() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    // The saved PV names neither the lowest nor the highest volume of its name.
    let lower = sim.insert_volume(PV, CLUSTER);
    let kept = sim.insert_volume(PV, CLUSTER);
    let higher = sim.insert_volume(PV, CLUSTER);
    let neighbours = sim.insert_volume(PV, "cluster-2");
    let unrelated = sim.insert_volume("pvc-other", CLUSTER);
    let saved = saved_pv(&kept);
    provisioner.volume_saved(&saved).await.unwrap();
    assert_eq!(
        ids(&sim),
        sorted(vec![
            kept.to_string(),
            neighbours.to_string(),
            unrelated.to_string()
        ]),
        "the leftovers {lower} and {higher} go, the saved volume {kept} stays"
    );
    assert_eq!(count(&sim, "CnsDeleteVolume"), 2);
    // Called again (another replica, a retried save): nothing left to delete.
    provisioner.volume_saved(&saved).await.unwrap();
    assert_eq!(count(&sim, "CnsDeleteVolume"), 2);
    assert_eq!(ids(&sim).len(), 3);
    sim.shutdown().await;
}

#[tokio::test]
async fn volume_saved_deletes_nothing_for_a_static_pv_another_driver_or_an_empty_handle() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let kept = sim.insert_volume(PV, CLUSTER);
    let leftover = sim.insert_volume(PV, CLUSTER);
    let mut no_csi = saved_pv(&kept);
    no_csi.spec.as_mut().unwrap().csi = None;
    for nothing in [
        // A static PV: its name says nothing about CNS names.
        csi_pv(PV, "csi.vsphere.vmware.com", kept.as_str()),
        provisioned(csi_pv(PV, "nfs.csi.k8s.io", kept.as_str())),
        provisioned(csi_pv(PV, "csi.vsphere.vmware.com", "")),
        no_csi,
    ] {
        provisioner.volume_saved(&nothing).await.unwrap();
        assert_eq!(ids(&sim).len(), 2, "{nothing:?}");
    }
    assert_eq!(count(&sim, "CnsDeleteVolume"), 0);
    // The same PV, provisioned by us, does release the leftover.
    let saved = saved_pv(&kept);
    provisioner.volume_saved(&saved).await.unwrap();
    assert_eq!(ids(&sim), vec![kept.to_string()], "{leftover} goes");
    sim.shutdown().await;
}

#[tokio::test]
async fn volume_saved_reports_a_failed_leftover_delete_and_keeps_the_saved_volume() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let kept = sim.insert_volume(PV, CLUSTER);
    let leftovers = sorted(vec![
        sim.insert_volume(PV, CLUSTER).to_string(),
        sim.insert_volume(PV, CLUSTER).to_string(),
    ]);
    let saved = saved_pv(&kept);
    // Leftovers are deleted in ID order: the first delete faults.
    sim.fail_next("CnsDeleteVolume", SimFault::call("CnsFault"));
    let err = provisioner.volume_saved(&saved).await.unwrap_err();
    assert!(
        matches!(&err, DeleteError::Failed(e) if e.to_string().contains(&leftovers[0])),
        "{err:?}"
    );
    assert_eq!(
        ids(&sim),
        sorted(vec![kept.to_string(), leftovers[0].clone()]),
        "the saved volume stays, the other leftover is still deleted"
    );
    // Tried again, the leftover goes.
    provisioner.volume_saved(&saved).await.unwrap();
    assert_eq!(ids(&sim), vec![kept.to_string()]);
    sim.shutdown().await;
}

/// `err` is `InBackground` because a create of [`PV`] may still land.
fn assert_create_pending(err: &ProvisionError) {
    let ProvisionError::InBackground(source) = err else {
        panic!("expected InBackground, got {err:?}");
    };
    assert!(
        matches!(
            source.downcast_ref::<ProvisionerError>(),
            Some(ProvisionerError::CreatePending { volume, .. }) if volume == PV
        ),
        "{err:?}"
    );
    assert!(source.to_string().contains("may still land"), "{source}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_a_timed_out_create_and_adopts_its_late_volume() {
    let sim = sim().await;
    let provisioner =
        provisioner_with(&sim.vc_config().task_timeout(Duration::from_millis(500))).await;
    // The create reaches CNS but lands only after 5 s; the client gives up after 0.5 s.
    sim.delay("CnsCreateVolume", Duration::from_secs(5));
    let options = options();
    let err = provisioner.provision(&options).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    sim.delay("CnsCreateVolume", Duration::ZERO);

    // Retries before it lands (the controller's retry, or its crash-safe cleanup of a claim
    // deleted meanwhile, which looks for the asset through `provision`) wait for it; so
    // does a clone of the provisioner.
    let err = provisioner.provision(&options).await.unwrap_err();
    assert_create_pending(&err);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let err = provisioner.clone().provision(&options).await.unwrap_err();
    assert_create_pending(&err);
    assert_eq!(
        count(&sim, "CnsCreateVolume"),
        1,
        "nothing else was created"
    );
    assert!(sim.volumes().is_empty());

    // Once it landed, the retry returns its volume: the only one of that name.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pv = provisioner.provision(&options).await.unwrap();
    assert_eq!(ids(&sim), vec![handle(&pv)]);
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);

    // Finding a volume does not end the wait (it could be another replica's): deleted
    // well within the window, the PV's delete fails after deleting the volume, so the
    // controller keeps the PV and deletes again; a provision that finds nothing waits.
    let pv = provisioned(pv);
    let err = provisioner.delete(&pv).await.unwrap_err();
    assert!(
        err.to_string().contains("deleting the volume failed"),
        "{err}"
    );
    assert!(sim.volumes().is_empty());
    assert_create_pending(&provisioner.provision(&options).await.unwrap_err());
    // The window (0.5 s task timeout + 60 s request timeout) has passed: the delete
    // succeeds, and the next provision creates again.
    tokio::time::sleep(Duration::from_secs(60)).await;
    provisioner.delete(&pv).await.unwrap();
    let pv = provisioner.provision(&options).await.unwrap();
    assert_eq!(ids(&sim), vec![handle(&pv)]);
    assert_eq!(count(&sim, "CnsCreateVolume"), 2);
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_claim_is_not_final_while_its_create_may_still_land() {
    let sim = sim().await;
    let provisioner =
        provisioner_with(&sim.vc_config().task_timeout(Duration::from_millis(500))).await;
    sim.delay("CnsCreateVolume", Duration::from_secs(5));
    let err = provisioner.provision(&options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    // The class changed meanwhile to one this provisioner refuses: `Failed` would tell the
    // controller that no volume exists, and the late one would leak.
    let mut refused = options();
    let mut class = (*refused.storage_class).clone();
    class
        .parameters
        .get_or_insert_with(BTreeMap::new)
        .insert("diskformat".into(), "thin".into());
    refused.storage_class = Arc::new(class);
    let err = provisioner.provision(&refused).await.unwrap_err();
    assert!(
        matches!(&err, ProvisionError::InBackground(e)
            if matches!(e.downcast_ref::<ProvisionerError>(), Some(ProvisionerError::UnknownParameter { .. }))),
        "{err:?}"
    );
    // Once the volume landed, the refusal hands it over, as for any existing volume; its
    // PV's delete still waits for the create to be settled.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(sim.volumes().len(), 1);
    let pv = provisioner.provision(&refused).await.unwrap();
    assert_eq!(ids(&sim), vec![handle(&pv)]);
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);
    let err = provisioner.delete(&provisioned(pv)).await.unwrap_err();
    assert!(
        err.to_string().contains("deleting the volume failed"),
        "{err}"
    );
    assert!(sim.volumes().is_empty());
    sim.shutdown().await;
}

/// [`options`] with the claim's request replaced by `request` and the class parameters
/// `extra` added.
fn refused_options(request: &str, extra: &[(&str, &str)]) -> ProvisionOptions {
    let base = options();
    let mut class = (*base.storage_class).clone();
    let params = class.parameters.get_or_insert_with(BTreeMap::new);
    for (key, value) in extra {
        params.insert((*key).into(), (*value).into());
    }
    let mut claim = (*base.claim).clone();
    claim
        .spec
        .as_mut()
        .unwrap()
        .resources
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()
        .insert("storage".into(), Quantity(request.into()));
    ProvisionOptions::new(Arc::new(class), PV, Arc::new(claim), None)
}

#[tokio::test]
async fn a_refused_claim_hands_over_the_lowest_id_of_its_name_and_deletes_nothing() {
    let sim = sim().await;
    let first = sim.insert_volume(PV, CLUSTER);
    let second = sim.insert_volume(PV, CLUSTER);
    let theirs = sim.insert_volume(PV, "cluster-2");
    let lowest = first.clone().min(second.clone());
    let provisioner = provisioner(&sim).await;
    for refused in [
        refused_options("4Ei", &[]),
        refused_options("1Gi", &[("diskformat", "thin")]),
    ] {
        let pv = provisioner.provision(&refused).await.unwrap();
        assert_eq!(handle(&pv), lowest.as_str());
        assert_eq!(pv.metadata.name.as_deref(), Some(PV));
    }
    assert_eq!(sim.volumes().len(), 3, "{:?}", ids(&sim));
    assert_eq!(count(&sim, "CnsDeleteVolume"), 0);
    assert_eq!(count(&sim, "CnsCreateVolume"), 0);
    // Once its PV is saved, the other volume of our cluster is a leftover; the other
    // cluster's stays.
    let pv = saved_pv(&lowest);
    provisioner.volume_saved(&pv).await.unwrap();
    assert_eq!(
        sorted(ids(&sim)),
        sorted(vec![lowest.to_string(), theirs.to_string()])
    );
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_create_that_never_lands_blocks_a_claim_for_one_settle_window_only() {
    let sim = sim().await;
    let provisioner = provisioner_with(&sim.vc_config().task_timeout(Duration::from_millis(500)))
        .await
        .create_settle(Duration::from_secs(3));
    // The create is received but does not land within the test.
    sim.delay("CnsCreateVolume", Duration::from_secs(3600));
    let options = options();
    let err = provisioner.provision(&options).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    sim.delay("CnsCreateVolume", Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let err = provisioner.provision(&options).await.unwrap_err();
    assert_create_pending(&err);
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);
    // 3 s after the create was sent, the retry creates.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pv = provisioner.provision(&options).await.unwrap();
    assert_eq!(ids(&sim), vec![handle(&pv)]);
    assert_eq!(count(&sim, "CnsCreateVolume"), 2);
    drop(sim);
}

#[tokio::test(start_paused = true)]
async fn the_default_settle_window_is_the_task_timeout_plus_the_request_timeout() {
    let sim = sim().await;
    let config = sim
        .vc_config()
        .timeout(Duration::from_secs(2))
        .task_timeout(Duration::from_secs(1));
    let provisioner = provisioner_with(&config).await;
    sim.delay("CnsCreateVolume", Duration::from_secs(3600));
    let options = options();
    let err = provisioner.provision(&options).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    sim.delay("CnsCreateVolume", Duration::ZERO);
    // Sent at 0, timed out at 1 s; the window is 1 s + 2 s.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let err = provisioner.provision(&options).await.unwrap_err();
    assert_create_pending(&err);
    let ProvisionError::InBackground(source) = &err else {
        unreachable!("checked above")
    };
    assert!(
        matches!(
            source.downcast_ref::<ProvisionerError>(),
            Some(ProvisionerError::CreatePending { settle, .. }) if *settle == Duration::from_secs(3)
        ),
        "{source}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    provisioner.provision(&options).await.unwrap();
    assert_eq!(count(&sim, "CnsCreateVolume"), 2);
    drop(sim);
}
