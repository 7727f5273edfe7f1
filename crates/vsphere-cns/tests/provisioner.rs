//! `CnsProvisioner` against the in-process CNS simulator.
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
    AssetLookup, DeleteError, ProvisionError, ProvisionOptions, Provisioner,
};
use vsphere_cns::simulator::{CnsSimulator, SimFault};
use vsphere_cns::{ClusterFlavor, CnsClient, CnsProvisioner, MoRef, ProvisionerError};

const DS_URL: &str = "ds:///vmfs/volumes/test-ds/";
const DS_ID: &str = "datastore-7";

async fn sim() -> CnsSimulator {
    CnsSimulator::builder()
        .datastore(DS_ID, "TestDS", DS_URL)
        .start()
        .await
        .unwrap()
}

async fn provisioner(sim: &CnsSimulator) -> CnsProvisioner {
    provisioner_with(sim, sim.vc_config()).await
}

async fn provisioner_with(
    sim: &CnsSimulator,
    config: vsphere_cns::VirtualCenterConfig,
) -> CnsProvisioner {
    let _ = sim;
    let client = CnsClient::connect(&config).await.unwrap();
    CnsProvisioner::new(client, "cluster-1", ClusterFlavor::Vanilla)
        .unwrap()
        .datastore_url(DS_URL, MoRef::datastore(DS_ID))
}

fn class(params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("vsphere".into()),
            ..ObjectMeta::default()
        },
        provisioner: "csi.vsphere.vmware.com".into(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..StorageClass::default()
    }
}

fn claim(request: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(request.to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

fn options(class: StorageClass, claim: PersistentVolumeClaim) -> ProvisionOptions {
    ProvisionOptions::new(Arc::new(class), "pvc-uid-1", Arc::new(claim), None)
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

/// `volume` as the controller saves it: with `pv.kubernetes.io/provisioned-by`.
fn provisioned(mut volume: PersistentVolume) -> PersistentVolume {
    volume
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANN_PROVISIONED_BY.into(), "csi.vsphere.vmware.com".into());
    volume
}

fn default_options() -> ProvisionOptions {
    options(class(&[("datastoreurl", DS_URL)]), claim("1500Mi"))
}

#[tokio::test]
async fn provision_creates_one_named_block_volume_on_the_class_datastore() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let pv = provisioner.provision(&default_options()).await.unwrap();

    let volumes = sim.volumes();
    assert_eq!(volumes.len(), 1);
    let volume = &volumes[0];
    assert_eq!(volume.name, "pvc-uid-1");
    assert_eq!(volume.capacity_in_mb, 1500);
    assert_eq!(volume.datastore, MoRef::datastore(DS_ID));
    assert_eq!(volume.metadata.container_cluster.cluster_id, "cluster-1");
    assert_eq!(volume.metadata.container_cluster.vsphere_user, "cnsuser");
    assert_eq!(volume.metadata.container_cluster_array.len(), 1);
    assert_eq!(handle(&pv), volume.id.as_str());
    assert_eq!(pv.metadata.name.as_deref(), Some("pvc-uid-1"));
    let spec = pv.spec.unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"], Quantity("1500Mi".into()));
    assert_eq!(spec.csi.unwrap().fs_type.as_deref(), Some("ext4"));
    sim.shutdown().await;
}

#[tokio::test]
async fn storage_policy_and_datastore_moref_come_from_the_class() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let class = class(&[
        ("datastoremoref", DS_ID),
        ("storagepolicyid", "policy-gold"),
    ]);
    provisioner
        .provision(&options(class, claim("1G")))
        .await
        .unwrap();
    let volume = &sim.volumes()[0];
    assert_eq!(volume.profile_id.as_deref(), Some("policy-gold"));
    assert_eq!(volume.datastore, MoRef::datastore(DS_ID));
    assert_eq!(volume.capacity_in_mb, 954);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_repeated_provision_after_a_restart_reuses_the_volume() {
    let sim = sim().await;
    let first = provisioner(&sim)
        .await
        .provision(&default_options())
        .await
        .unwrap();
    // A fresh provisioner with a fresh session, as after a process restart.
    let second = provisioner(&sim)
        .await
        .provision(&default_options())
        .await
        .unwrap();
    assert_eq!(handle(&first), handle(&second));
    assert_eq!(sim.volumes().len(), 1);
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn delete_removes_the_volume_and_a_second_delete_is_ok() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let pv = provisioner.provision(&default_options()).await.unwrap();
    provisioner.delete(&pv).await.unwrap();
    assert!(sim.volumes().is_empty());
    provisioner.delete(&pv).await.unwrap();
    assert!(sim.volumes().is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn delete_failures_are_reported_and_other_drivers_ignored() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let pv = provisioner.provision(&default_options()).await.unwrap();
    sim.fail_next(
        "CnsDeleteVolume",
        SimFault::volume_result("ResourceInUse").message("attached to vm-1"),
    );
    let err = provisioner.delete(&pv).await.unwrap_err();
    assert!(matches!(err, DeleteError::Failed(_)), "{err:?}");
    assert_eq!(sim.volumes().len(), 1);

    let nfs = PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "nfs.csi.k8s.io".into(),
                volume_handle: "x".into(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    };
    assert!(matches!(
        provisioner.delete(&nfs).await,
        Err(DeleteError::Ignored { .. })
    ));
    sim.shutdown().await;
}

fn final_source(err: ProvisionError) -> String {
    match err {
        ProvisionError::Failed(source) => {
            assert!(source.downcast_ref::<ProvisionerError>().is_some());
            source.to_string()
        }
        other => panic!("expected a final error, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_quantities_and_unknown_parameters_are_final_and_create_nothing() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let bad_size = options(class(&[("datastoreurl", DS_URL)]), claim("10Gb"));
    let text = final_source(provisioner.provision(&bad_size).await.unwrap_err());
    assert!(
        text.contains("default/data") && text.contains("10Gb"),
        "{text}"
    );

    let unknown = options(
        class(&[("datastoreurl", DS_URL), ("diskformat", "thin")]),
        claim("1Gi"),
    );
    let text = final_source(provisioner.provision(&unknown).await.unwrap_err());
    assert_eq!(
        text,
        r#"storageclass "vsphere": unknown parameter "diskformat""#
    );

    let unknown_url = options(class(&[("datastoreurl", "ds:///nope/")]), claim("1Gi"));
    let text = final_source(provisioner.provision(&unknown_url).await.unwrap_err());
    assert!(text.contains("ds:///nope/"), "{text}");

    let no_datastore = options(class(&[]), claim("1Gi"));
    let text = final_source(provisioner.provision(&no_datastore).await.unwrap_err());
    assert!(text.contains("names no datastore"), "{text}");
    assert!(sim.volumes().is_empty());
    assert!(!sim.requests().iter().any(|r| r.method == "CnsCreateVolume"));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_rejected_create_is_final() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    sim.fail_next("CnsCreateVolume", SimFault::task("InvalidArgument"));
    let err = provisioner.provision(&default_options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::Failed(_)), "{err:?}");
    assert!(sim.volumes().is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn a_failed_lookup_changes_nothing() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    sim.fail_next("CnsQueryVolume", SimFault::call("CnsFault"));
    let err = provisioner.provision(&default_options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::NoChange(_)), "{err:?}");
    assert!(!sim.requests().iter().any(|r| r.method == "CnsCreateVolume"));
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_create_is_in_background_and_its_late_volume_is_adopted_not_duplicated() {
    let sim = sim().await;
    let slow = sim.vc_config().task_timeout(Duration::from_millis(500));
    let provisioner = provisioner_with(&sim, slow).await;
    sim.delay("CnsCreateVolume", Duration::from_secs(5));
    let err = provisioner.provision(&default_options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    sim.delay("CnsCreateVolume", Duration::ZERO);
    // The first create still runs in the simulator, as a vCenter task would; the retry's
    // lookup does not see it yet, and waits for it rather than create a second volume.
    let err = provisioner.provision(&default_options()).await.unwrap_err();
    assert!(
        matches!(&err, ProvisionError::InBackground(e) if e.to_string().contains("may still land")),
        "{err:?}"
    );
    assert!(sim.volumes().is_empty());
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);
    tokio::time::sleep(Duration::from_secs(10)).await;
    // The late create landed: the retry returns its volume, the only one.
    let pv = provisioner.provision(&default_options()).await.unwrap();
    let volumes = sim.volumes();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(handle(&pv), volumes[0].id.as_str());
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);
    // The settle window (task timeout + request timeout) has passed: nothing may land.
    tokio::time::sleep(Duration::from_secs(60)).await;
    provisioner.delete(&provisioned(pv)).await.unwrap();
    assert!(sim.volumes().is_empty(), "{:?}", sim.volumes());
    sim.shutdown().await;
}

/// Chaos seed 1031, claim-164: a create timed out; the claim was deleted, and the
/// cleanup's lookup found another volume of that name (a racing replica's), which was
/// saved in a PV and reclaimed at once. The create landed after that delete: no PV named
/// it, and nothing ever looked again.
#[tokio::test(start_paused = true)]
async fn a_pv_deleted_while_a_create_of_its_name_may_still_land_is_deleted_again_until_it_cannot() {
    let sim = sim().await;
    let config = sim
        .vc_config()
        .task_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(5));
    let provisioner = provisioner_with(&sim, config).await;
    sim.delay("CnsCreateVolume", Duration::from_secs(3));
    let err = provisioner.provision(&default_options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    sim.delay("CnsCreateVolume", Duration::ZERO);
    // Another volume of that name appears before the create lands: it is the one found.
    let other = sim.insert_volume("pvc-uid-1", "cluster-1");
    let pv = provisioned(provisioner.provision(&default_options()).await.unwrap());
    assert_eq!(handle(&pv), other.as_str());

    // Deleted right away, while the create may still land (settle: 5.5 s after sending).
    let err = provisioner.delete(&pv).await.unwrap_err();
    let DeleteError::Failed(source) = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(
            source.downcast_ref::<ProvisionerError>(),
            Some(ProvisionerError::DeletePending { volume, .. }) if volume == "pvc-uid-1"
        ),
        "{err:?}"
    );
    assert!(
        sim.volumes().is_empty(),
        "the PV's volume is deleted at once"
    );
    // The create lands (3 s after it was sent); the controller deletes the PV again.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(sim.volumes().len(), 1, "the late volume landed");
    assert!(
        provisioner.delete(&pv).await.is_err(),
        "still within the window"
    );
    assert!(
        sim.volumes().is_empty(),
        "the late volume is deleted with the PV"
    );
    // Once the window has passed, the delete succeeds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    provisioner.delete(&pv).await.unwrap();
    assert!(sim.volumes().is_empty(), "{:?}", sim.volumes());
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_create_that_landed_before_the_timeout_is_found_by_the_retry() {
    let sim = sim().await;
    let slow = sim.vc_config().task_timeout(Duration::from_millis(500));
    let provisioner = provisioner_with(&sim, slow).await;
    // The create goes through, but waiting for its task times out.
    sim.delay("RetrievePropertiesEx", Duration::from_secs(5));
    let err = provisioner.provision(&default_options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    assert_eq!(sim.volumes().len(), 1);
    sim.delay("RetrievePropertiesEx", Duration::ZERO);
    let pv = provisioner.provision(&default_options()).await.unwrap();
    let volumes = sim.volumes();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(handle(&pv), volumes[0].id.as_str());
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn duplicates_left_by_a_late_create_are_removed_with_the_pv() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let pv = provisioner.provision(&default_options()).await.unwrap();
    // A second volume of the same name, as when a timed-out create lands after the
    // retry's lookup.
    sim.insert_volume("pvc-uid-1", "cluster-1");
    assert_eq!(sim.volumes().len(), 2);
    provisioner.delete(&provisioned(pv)).await.unwrap();
    assert!(sim.volumes().is_empty(), "{:?}", sim.volumes());
    sim.shutdown().await;
}

fn count(sim: &CnsSimulator, method: &str) -> usize {
    sim.requests().iter().filter(|r| r.method == method).count()
}

fn capacity(pv: &PersistentVolume) -> &str {
    &pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0
}

#[tokio::test]
async fn a_class_refused_after_its_volume_was_made_hands_that_volume_over_as_it_is() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let made = provisioner.provision(&default_options()).await.unwrap();
    // The class gained a parameter this provisioner refuses (say, after a restart), and
    // the claim as seen now asks for more than was made.
    let mut changed_class = class(&[
        ("datastoreurl", DS_URL),
        ("diskformat", "thin"),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ]);
    changed_class.reclaim_policy = Some("Retain".into());
    changed_class.mount_options = Some(vec!["noatime".into()]);
    let changed = options(changed_class, claim("3Gi"));
    let pv = provisioner.provision(&changed).await.unwrap();
    assert_eq!(handle(&pv), handle(&made));
    assert_eq!(
        capacity(&pv),
        "1500Mi",
        "the volume's own size, not the request"
    );
    let spec = pv.spec.as_ref().unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_owned()]));
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    let csi = spec.csi.as_ref().unwrap();
    assert_eq!(csi.driver, "csi.vsphere.vmware.com");
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(
        csi.volume_attributes.as_ref().unwrap()["type"],
        "vSphere CNS Block Volume"
    );
    assert_eq!(sim.volumes().len(), 1);
    assert_eq!(count(&sim, "CnsCreateVolume"), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn an_invalid_request_hands_over_the_volume_of_its_name_with_its_own_capacity() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    // A volume of the claim's name exists (an earlier attempt's, or a late create's):
    // 1024 MiB.
    let id = sim.insert_volume("pvc-uid-1", "cluster-1");
    let mut no_request = claim("1Gi");
    no_request.spec.as_mut().unwrap().resources = None;
    for claim in [claim("4Ei"), claim("lots"), no_request] {
        let refused = options(class(&[("datastoreurl", DS_URL)]), claim);
        let pv = provisioner.provision(&refused).await.unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-uid-1"));
        assert_eq!(handle(&pv), id.as_str());
        assert_eq!(capacity(&pv), "1Gi");
        assert_eq!(
            pv.spec.unwrap().persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
    }
    assert_eq!(count(&sim, "CnsCreateVolume"), 0);
    // Its PV is released like any other: the volume goes with it.
    let pv = provisioner
        .provision(&options(class(&[("datastoreurl", DS_URL)]), claim("4Ei")))
        .await
        .unwrap();
    provisioner.delete(&provisioned(pv)).await.unwrap();
    assert!(sim.volumes().is_empty(), "{:?}", sim.volumes());
    sim.shutdown().await;
}

#[tokio::test]
async fn a_refused_claim_is_final_without_a_volume_and_no_change_when_the_lookup_fails() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let refused = options(class(&[("datastoreurl", DS_URL)]), claim("4Ei"));
    let err = provisioner.provision(&refused).await.unwrap_err();
    assert!(matches!(err, ProvisionError::Failed(_)), "{err:?}");
    sim.insert_volume("pvc-uid-1", "cluster-1");
    sim.fail_next("CnsQueryVolume", SimFault::call("CnsFault"));
    let err = provisioner.provision(&refused).await.unwrap_err();
    assert!(
        matches!(&err, ProvisionError::NoChange(e)
            if matches!(e.downcast_ref::<ProvisionerError>(), Some(ProvisionerError::InvalidCapacity { .. }))),
        "{err:?}"
    );
    assert_eq!(count(&sim, "CnsCreateVolume"), 0);
    assert_eq!(sim.volumes().len(), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn already_registered_without_a_findable_volume_is_in_background() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    sim.fail_next(
        "CnsCreateVolume",
        SimFault::volume_result("CnsAlreadyRegisteredFault"),
    );
    let err = provisioner.provision(&default_options()).await.unwrap_err();
    assert!(matches!(err, ProvisionError::InBackground(_)), "{err:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_volume_of_the_same_name_in_another_cluster_is_neither_reused_nor_removed() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let neighbour = CnsProvisioner::new(
        CnsClient::connect(&sim.vc_config()).await.unwrap(),
        "cluster-2",
        ClusterFlavor::Vanilla,
    )
    .unwrap()
    .datastore_url(DS_URL, MoRef::datastore(DS_ID));
    let theirs = neighbour.provision(&default_options()).await.unwrap();
    let ours = provisioner.provision(&default_options()).await.unwrap();
    assert_ne!(handle(&ours), handle(&theirs), "a volume of its own");
    assert_eq!(sim.volumes().len(), 2);
    provisioner.delete(&provisioned(ours)).await.unwrap();
    let left = sim.volumes();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id.as_str(), handle(&theirs));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_cleanup_hands_over_the_volume_that_exists_and_never_creates_one() {
    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let cleanup = default_options();
    let answer = provisioner.find(&cleanup).await;
    assert!(
        matches!(answer, Err(ProvisionError::Ignored { .. })),
        "no volume: nothing to record, got {answer:?}"
    );
    assert!(sim.volumes().is_empty(), "a cleanup created a volume");

    let made = provisioner.provision(&default_options()).await.unwrap();
    let found = provisioner.find(&cleanup).await.unwrap().unwrap();
    assert_eq!(handle(&found), handle(&made));
    assert_eq!(sim.volumes().len(), 1);
}

/// The driver conformance suite of provision-controller against `CnsProvisioner` on the
/// simulator: every clause of the provisioner contract holds, including what a refused
/// class (an unknown parameter) answers.
#[tokio::test]
async fn the_cns_provisioner_keeps_the_provisioner_contract() {
    use provision_controller::testing::conformance::{Clause, Conformance, Outcome};

    let sim = sim().await;
    let provisioner = provisioner(&sim).await;
    let mut vsphere = class(&[("datastoreurl", DS_URL)]);
    vsphere.reclaim_policy = Some("Delete".into());
    let mut refused = class(&[("nosuchparameter", "x")]);
    refused.metadata.name = Some("refused".into());
    let report = Conformance::new(vsphere_cns::CSI_DRIVER)
        .class(vsphere)
        .refused_class(refused)
        .retries(20, Duration::from_millis(100))
        .check_with_lookup(&provisioner, &provisioner)
        .await;
    report.assert_conforms();
    assert_eq!(
        report.outcome(Clause::ErrorsTellTheTruth),
        Some(&Outcome::Passed),
        "{report}"
    );
    assert!(sim.volumes().is_empty(), "the suite deletes what it made");
}
