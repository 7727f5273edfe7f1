//! [`VolumeRequest`]: what a claim asks for, checked, and the PV that exposes its volume.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provision_controller::ProvisionOptions;

use super::params::ClassParams;
use super::{BLOCK_VOLUME_TYPE, CSI_DRIVER, ProvisionerError, quantity};
use crate::types::CnsVolumeId;

/// What a claim asks for, checked, and how its PV looks.
#[derive(Debug)]
pub(super) struct VolumeRequest {
    pub(super) class: String,
    pub(super) params: ClassParams,
    pub(super) mib: u64,
    claim: Arc<PersistentVolumeClaim>,
    reclaim_policy: String,
    mount_options: Option<Vec<String>>,
}

impl VolumeRequest {
    pub(super) fn new(options: &ProvisionOptions) -> Result<Self, ProvisionerError> {
        let class_obj = &options.storage_class;
        let class = class_obj.metadata.name.clone().unwrap_or_default();
        let params = ClassParams::parse(&class, class_obj.parameters.as_ref())?;
        let claim = &options.claim;
        let claim_name = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        let spec = claim.spec.as_ref();
        let quantity = spec
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .ok_or_else(|| ProvisionerError::MissingCapacity {
                claim: claim_name.clone(),
            })?;
        let mib = quantity::mib_rounded_up(&quantity.0).map_err(|problem| {
            ProvisionerError::InvalidCapacity {
                claim: claim_name.clone(),
                quantity: quantity.0.clone(),
                reason: problem.to_string(),
            }
        })?;
        let block = spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        let rwx = spec
            .and_then(|s| s.access_modes.as_ref())
            .is_some_and(|m| m.iter().any(|m| m == "ReadWriteMany"));
        if rwx && !block {
            return Err(ProvisionerError::UnsupportedClaim {
                claim: claim_name,
                reason: "ReadWriteMany file systems need a CNS file volume; this provisioner \
                         creates block volumes only"
                    .into(),
            });
        }
        Ok(Self {
            class,
            params,
            mib,
            claim: claim.clone(),
            reclaim_policy: class_obj
                .reclaim_policy
                .clone()
                .unwrap_or_else(|| "Delete".into()),
            mount_options: class_obj.mount_options.clone().filter(|m| !m.is_empty()),
        })
    }

    pub(super) fn volume(&self, name: &str, id: &CnsVolumeId) -> PersistentVolume {
        let claim_spec = self.claim.spec.as_ref();
        let volume_mode = claim_spec.and_then(|s| s.volume_mode.clone());
        let block = volume_mode.as_deref() == Some("Block");
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(quantity::format_mib(self.mib)),
                )])),
                access_modes: claim_spec.and_then(|s| s.access_modes.clone()),
                persistent_volume_reclaim_policy: Some(self.reclaim_policy.clone()),
                mount_options: self.mount_options.clone(),
                volume_mode,
                csi: Some(CSIPersistentVolumeSource {
                    driver: CSI_DRIVER.to_owned(),
                    volume_handle: id.to_string(),
                    fs_type: (!block).then(|| self.params.fs_type().to_owned()),
                    volume_attributes: Some(BTreeMap::from([(
                        "type".to_owned(),
                        BLOCK_VOLUME_TYPE.to_owned(),
                    )])),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        }
    }
}
