//! The PersistentVolume made from a CreateVolume answer (the second half of upstream's
//! `Provision`).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{
    api::core::v1::{
        CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
        SecretReference, VolumeNodeAffinity,
    },
    api::storage::v1::StorageClass,
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};

use crate::provisioner::request::{bytes_to_quantity, is_block};

/// The key of the sidecar's identity in `spec.csi.volumeAttributes`.
pub(crate) const IDENTITY_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";
/// The PV annotation naming the provisioner secret for DeleteVolume.
pub(crate) const ANN_DELETION_SECRET_NAME: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-name";
/// The PV annotation naming the provisioner secret's namespace for DeleteVolume.
pub(crate) const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// The PV annotation naming the external-resizer's ControllerModifyVolume secret.
pub(crate) const ANN_MODIFY_SECRET_NAME: &str =
    "volume.kubernetes.io/controller-modify-secret-name";
/// The PV annotation naming that secret's namespace.
pub(crate) const ANN_MODIFY_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";

/// The secret references a PV carries, resolved from the class.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct VolumeSecrets {
    /// CreateVolume's and DeleteVolume's (written to the deletion annotations).
    pub(crate) provisioner: Option<SecretReference>,
    /// `spec.csi.controllerPublishSecretRef`.
    pub(crate) controller_publish: Option<SecretReference>,
    /// `spec.csi.nodeStageSecretRef`.
    pub(crate) node_stage: Option<SecretReference>,
    /// `spec.csi.nodePublishSecretRef`.
    pub(crate) node_publish: Option<SecretReference>,
    /// `spec.csi.controllerExpandSecretRef`.
    pub(crate) controller_expand: Option<SecretReference>,
    /// `spec.csi.nodeExpandSecretRef`.
    pub(crate) node_expand: Option<SecretReference>,
    /// The external-resizer's (annotations, when set).
    pub(crate) controller_modify: Option<SecretReference>,
}

/// Everything the PV is made of.
pub(crate) struct VolumeParts<'a> {
    pub(crate) pv_name: &'a str,
    pub(crate) driver: &'a str,
    pub(crate) identity: &'a str,
    pub(crate) claim: &'a PersistentVolumeClaim,
    pub(crate) class: &'a StorageClass,
    pub(crate) fs_type: &'a str,
    pub(crate) secrets: &'a VolumeSecrets,
    pub(crate) volume_id: &'a str,
    pub(crate) volume_context: &'a HashMap<String, String>,
    /// The size made (the request when the driver answered 0).
    pub(crate) capacity_bytes: i64,
    pub(crate) node_affinity: Option<VolumeNodeAffinity>,
}

/// The PV as upstream makes it.
pub(crate) fn build(parts: VolumeParts<'_>) -> PersistentVolume {
    let mut attributes = BTreeMap::from([(IDENTITY_KEY.to_owned(), parts.identity.to_owned())]);
    attributes.extend(
        parts
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let block = is_block(parts.claim);
    let secrets = parts.secrets;
    let csi = CSIPersistentVolumeSource {
        driver: parts.driver.to_owned(),
        volume_handle: parts.volume_id.to_owned(),
        volume_attributes: Some(attributes),
        fs_type: (!block && !parts.fs_type.is_empty()).then(|| parts.fs_type.to_owned()),
        controller_publish_secret_ref: secrets.controller_publish.clone(),
        node_stage_secret_ref: secrets.node_stage.clone(),
        node_publish_secret_ref: secrets.node_publish.clone(),
        controller_expand_secret_ref: secrets.controller_expand.clone(),
        node_expand_secret_ref: secrets.node_expand.clone(),
        read_only: None,
    };
    let name_of = |r: &Option<SecretReference>| {
        r.as_ref()
            .map(|r| {
                (
                    r.name.clone().unwrap_or_default(),
                    r.namespace.clone().unwrap_or_default(),
                )
            })
            .unwrap_or_default()
    };
    // Always written, empty without a secret: DeleteVolume then knows it needs none even
    // after the class is gone.
    let (deletion_name, deletion_namespace) = name_of(&secrets.provisioner);
    let mut annotations = BTreeMap::from([
        (ANN_DELETION_SECRET_NAME.to_owned(), deletion_name),
        (ANN_DELETION_SECRET_NAMESPACE.to_owned(), deletion_namespace),
    ]);
    if secrets.controller_modify.is_some() {
        let (name, namespace) = name_of(&secrets.controller_modify);
        annotations.insert(ANN_MODIFY_SECRET_NAME.to_owned(), name);
        annotations.insert(ANN_MODIFY_SECRET_NAMESPACE.to_owned(), namespace);
    }
    let claim_spec = parts.claim.spec.as_ref();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(parts.pv_name.to_owned()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: claim_spec.and_then(|s| s.access_modes.clone()),
            mount_options: parts.class.mount_options.clone(),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(bytes_to_quantity(parts.capacity_bytes)),
            )])),
            csi: Some(csi),
            // The API server defaults a class's policy to Delete.
            persistent_volume_reclaim_policy: Some(
                parts
                    .class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".to_owned()),
            ),
            node_affinity: parts.node_affinity,
            volume_mode: claim_spec.and_then(|s| s.volume_mode.clone()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}
