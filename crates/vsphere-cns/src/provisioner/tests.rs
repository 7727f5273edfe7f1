use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn class(params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("fast".into()),
            ..ObjectMeta::default()
        },
        provisioner: CSI_DRIVER.into(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..StorageClass::default()
    }
}

fn claim(request: Option<&str>, modes: &[&str], mode: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("shop".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(modes.iter().map(|m| (*m).to_owned()).collect()),
            volume_mode: mode.map(str::to_owned),
            resources: Some(VolumeResourceRequirements {
                requests: request
                    .map(|q| BTreeMap::from([("storage".to_owned(), Quantity(q.to_owned()))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

fn options(class: StorageClass, claim: PersistentVolumeClaim) -> ProvisionOptions {
    ProvisionOptions::new(Arc::new(class), "pvc-1", Arc::new(claim), None)
}

#[test]
fn a_claim_becomes_a_csi_volume_with_the_rounded_size() {
    let mut sc = class(&[("csi.storage.k8s.io/fstype", "xfs")]);
    sc.reclaim_policy = Some("Retain".into());
    sc.mount_options = Some(vec!["noatime".into()]);
    let request =
        VolumeRequest::new(&options(sc, claim(Some("1.5G"), &["ReadWriteOnce"], None))).unwrap();
    assert_eq!(request.mib, 1431); // 1.5e9 / 2^20 = 1430.5
    let pv = request.volume("pvc-1", &CnsVolumeId::from("fcd-1"));
    assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1"));
    let spec = pv.spec.unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"], Quantity("1431Mi".into()));
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_owned()]));
    let csi = spec.csi.unwrap();
    assert_eq!(csi.driver, "csi.vsphere.vmware.com");
    assert_eq!(csi.volume_handle, "fcd-1");
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
}

#[test]
fn defaults_are_ext4_and_delete_and_block_volumes_have_no_fs_type() {
    let request = VolumeRequest::new(&options(
        class(&[]),
        claim(Some("1Gi"), &["ReadWriteOnce"], None),
    ))
    .unwrap();
    let spec = request.volume("pvc-1", &"x".into()).spec.unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.csi.unwrap().fs_type.as_deref(), Some("ext4"));
    assert_eq!(spec.capacity.unwrap()["storage"], Quantity("1Gi".into()));

    let request = VolumeRequest::new(&options(
        class(&[]),
        claim(Some("1Gi"), &["ReadWriteMany"], Some("Block")),
    ))
    .unwrap();
    let spec = request.volume("pvc-1", &"x".into()).spec.unwrap();
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(spec.csi.unwrap().fs_type, None);
}

#[test]
fn bad_claims_are_refused_naming_the_claim() {
    for (claim, fragment) in [
        (
            claim(None, &["ReadWriteOnce"], None),
            "has no storage request",
        ),
        (
            claim(Some("lots"), &["ReadWriteOnce"], None),
            "\"lots\" is invalid",
        ),
        (
            claim(Some("-1Gi"), &["ReadWriteOnce"], None),
            "greater than zero",
        ),
        (
            claim(Some("1Gi"), &["ReadWriteMany"], None),
            "ReadWriteMany",
        ),
    ] {
        let err = VolumeRequest::new(&options(class(&[]), claim)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("shop/data") && text.contains(fragment),
            "{text}"
        );
    }
}

fn fault(operation: &'static str) -> Error {
    Error::Fault {
        operation,
        fault_type: "InvalidArgument".into(),
        message: String::new(),
    }
}

#[test]
fn create_errors_say_whether_the_create_may_still_run() {
    assert!(matches!(
        create_error("pvc-1", fault("CnsCreateVolume")),
        ProvisionError::Failed(_)
    ));
    assert!(matches!(
        create_error("pvc-1", fault("RetrievePropertiesEx")),
        ProvisionError::InBackground(_)
    ));
    let timeout = Error::Timeout {
        operation: "CnsCreateVolume",
        after: Duration::from_secs(1),
    };
    assert!(matches!(
        create_error("pvc-1", timeout),
        ProvisionError::InBackground(_)
    ));
    let odd = Error::Protocol {
        operation: "CnsCreateVolume",
        detail: "no returnval".into(),
    };
    assert!(matches!(
        create_error("pvc-1", odd),
        ProvisionError::InBackground(_)
    ));
    assert!(matches!(
        create_error("pvc-1", Error::Settings("bad".into())),
        ProvisionError::Failed(_)
    ));
}

fn cns_volume(capacity_in_mb: Option<i64>, volume_type: Option<&str>) -> CnsVolume {
    CnsVolume {
        volume_id: "fcd-9".into(),
        datastore_url: None,
        name: Some("pvc-1".into()),
        volume_type: volume_type.map(str::to_owned),
        storage_policy_id: None,
        metadata: None,
        capacity_in_mb,
        backing_disk_id: None,
        compliance_status: None,
        health_status: None,
    }
}

#[test]
fn an_adopted_volume_is_described_as_cns_reports_it() {
    let mut sc = class(&[("diskformat", "thin"), ("fstype", "xfs")]);
    sc.reclaim_policy = Some("Retain".into());
    let refused = options(sc, claim(Some("4Ei"), &["ReadWriteOnce"], None));
    assert!(VolumeRequest::new(&refused).is_err());
    let pv = volume::adopted(&refused, &cns_volume(Some(2048), Some("BLOCK")));
    assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1"));
    let spec = pv.spec.unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"], Quantity("2Gi".into()));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    let csi = spec.csi.unwrap();
    assert_eq!(csi.volume_handle, "fcd-9");
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(
        csi.volume_attributes.unwrap()["type"],
        "vSphere CNS Block Volume"
    );

    // No capacity reported: 0, which no claim's request is satisfied by.
    for reported in [None, Some(0), Some(-5)] {
        let pv = volume::adopted(&refused, &cns_volume(reported, None));
        assert_eq!(
            pv.spec.unwrap().capacity.unwrap()["storage"],
            Quantity("0".into()),
            "{reported:?}"
        );
    }
    let pv = volume::adopted(&refused, &cns_volume(Some(1), Some("FILE")));
    let attributes = pv.spec.unwrap().csi.unwrap().volume_attributes.unwrap();
    assert_eq!(attributes["type"], "vSphere CNS File Volume");
}

#[test]
fn an_adopted_block_volume_offers_read_write_many_only_to_block_mode() {
    let modes = |claim: PersistentVolumeClaim, volume_type: &str| {
        let refused = options(class(&[]), claim);
        volume::adopted(&refused, &cns_volume(Some(1024), Some(volume_type)))
            .spec
            .unwrap()
            .access_modes
            .unwrap()
    };
    // A file system on a block volume is never shared between nodes.
    assert_eq!(
        modes(claim(Some("1Gi"), &["ReadWriteMany"], None), "BLOCK"),
        ["ReadWriteOnce"]
    );
    assert_eq!(
        modes(
            claim(Some("1Gi"), &["ReadOnlyMany", "ReadWriteMany"], None),
            "BLOCK"
        ),
        ["ReadOnlyMany"]
    );
    assert_eq!(
        modes(
            claim(Some("1Gi"), &["ReadWriteMany"], Some("Block")),
            "BLOCK"
        ),
        ["ReadWriteMany"]
    );
    assert_eq!(
        modes(claim(Some("1Gi"), &["ReadWriteMany"], None), "FILE"),
        ["ReadWriteMany"]
    );
}
