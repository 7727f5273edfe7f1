//! [`VolumeRequest`]: what a claim asks for, checked, and the PV that exposes its volume;
//! [`adopted`]: the PV of an existing volume whose claim or class is refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provision_controller::ProvisionOptions;

use super::params::{self, ClassParams};
use super::{BLOCK_VOLUME_TYPE, CSI_DRIVER, FILE_VOLUME_TYPE, ProvisionerError, quantity};
use crate::wire::{CnsVolume, CnsVolumeId};

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
        Layout {
            claim: &self.claim,
            reclaim_policy: self.reclaim_policy.clone(),
            mount_options: self.mount_options.clone(),
            fs_type: self.params.fs_type(),
        }
        .pv(
            name,
            id,
            Quantity(quantity::format_mib(self.mib)),
            claim_spec.and_then(|s| s.access_modes.clone()),
            BLOCK_VOLUME_TYPE,
        )
    }
}

/// The PV for `volume`, a CNS volume named like the claim of `options` that exists while
/// the claim or its class is refused (made by an earlier attempt, before the class or
/// the request changed, or by another replica): it describes the volume as CNS reports
/// it, and needs nothing of what was refused.
///
/// - The capacity is the volume's own (`0` when CNS reports none, so that no claim binds
///   it by size), whatever the claim requests.
/// - The `type` attribute follows the volume's type (block unless CNS says `FILE`).
/// - The access modes and volume mode are the claim's, except that a block volume never
///   offers `ReadWriteMany` to a file system (only `ReadWriteOnce` is left when nothing
///   else is).
/// - The reclaim policy and mount options are the class's; the file system is the one
///   the class names (read leniently: a class refused for another parameter still says
///   it), else `ext4`.
pub(super) fn adopted(options: &ProvisionOptions, volume: &CnsVolume) -> PersistentVolume {
    let class = &options.storage_class;
    let claim_spec = options.claim.spec.as_ref();
    let block_mode = claim_spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let file = volume
        .volume_type
        .as_deref()
        .is_some_and(|t| t.eq_ignore_ascii_case("FILE"));
    let capacity = volume
        .capacity_in_mb
        .and_then(|mib| u64::try_from(mib).ok())
        .filter(|&mib| mib > 0)
        .map_or_else(|| "0".to_owned(), quantity::format_mib);
    let access_modes = claim_spec
        .and_then(|s| s.access_modes.clone())
        .map(|modes| {
            if file || block_mode {
                return modes;
            }
            let single: Vec<String> = modes.into_iter().filter(|m| m != "ReadWriteMany").collect();
            if single.is_empty() {
                vec!["ReadWriteOnce".to_owned()]
            } else {
                single
            }
        });
    Layout {
        claim: &options.claim,
        reclaim_policy: class
            .reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".into()),
        mount_options: class.mount_options.clone().filter(|m| !m.is_empty()),
        fs_type: params::fs_type_lenient(class.parameters.as_ref()),
    }
    .pv(
        &options.pv_name,
        &volume.volume_id,
        Quantity(capacity),
        access_modes,
        if file {
            FILE_VOLUME_TYPE
        } else {
            BLOCK_VOLUME_TYPE
        },
    )
}

/// What a PV takes from its claim and class, whatever the volume.
struct Layout<'a> {
    claim: &'a PersistentVolumeClaim,
    reclaim_policy: String,
    mount_options: Option<Vec<String>>,
    fs_type: &'a str,
}

impl Layout<'_> {
    /// The CSI PV `name` for CNS volume `id` of `capacity`, whose `type` attribute is
    /// `volume_type`.
    fn pv(
        self,
        name: &str,
        id: &CnsVolumeId,
        capacity: Quantity,
        access_modes: Option<Vec<String>>,
        volume_type: &str,
    ) -> PersistentVolume {
        let volume_mode = self.claim.spec.as_ref().and_then(|s| s.volume_mode.clone());
        let block = volume_mode.as_deref() == Some("Block");
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([("storage".to_owned(), capacity)])),
                access_modes,
                persistent_volume_reclaim_policy: Some(self.reclaim_policy),
                mount_options: self.mount_options,
                volume_mode,
                csi: Some(CSIPersistentVolumeSource {
                    driver: CSI_DRIVER.to_owned(),
                    volume_handle: id.to_string(),
                    fs_type: (!block).then(|| self.fs_type.to_owned()),
                    volume_attributes: Some(BTreeMap::from([(
                        "type".to_owned(),
                        volume_type.to_owned(),
                    )])),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        }
    }
}
