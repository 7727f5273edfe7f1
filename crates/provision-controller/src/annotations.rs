//! Annotation and finalizer names the controller reads and writes, with typed getters
//! (and, for the crate, the `namespace/name` a claim is named by in logs and events, and
//! `ClaimView`: all of this read off a claim once, when its sync starts).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

/// On a PV: the provisioner that created it (Go: `annDynamicallyProvisioned`).
#[doc(alias = "annDynamicallyProvisioned")]
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// On a PV: the CSI driver a migrated in-tree volume now belongs to (Go: `annMigratedTo`).
#[doc(alias = "annMigratedTo")]
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// On a claim: the provisioner asked to provision it (Go: `annStorageProvisioner`).
#[doc(alias = "annStorageProvisioner")]
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// On a claim: the beta form of [`ANN_STORAGE_PROVISIONER`], read when that one is absent.
#[doc(alias = "annBetaStorageProvisioner")]
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// On a claim: the node the scheduler chose (Go: `annSelectedNode`).
#[doc(alias = "annSelectedNode")]
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a claim: the Kubernetes 1.11 form of [`ANN_SELECTED_NODE`] (Go: `annAlphaSelectedNode`).
#[doc(alias = "annAlphaSelectedNode")]
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";
/// PV finalizer marking the provisioner as owner of its cleanup (Go: `finalizerPV`).
#[doc(alias = "finalizerPV")]
pub const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// Claim finalizer of crash-safe provisioning
/// ([`Config::crash_safe_provisioning`](crate::Config::crash_safe_provisioning)): put on a
/// claim before the driver is asked for its asset, removed once a PV records the asset (or
/// the driver answered that none exists). No Go counterpart
/// (kubernetes-csi/external-provisioner#486).
pub const FINALIZER_PROVISIONING: &str = "external-provisioner.volume.kubernetes.io/provisioning";

/// On a claim, next to [`FINALIZER_PROVISIONING`]: the provisioner that put the finalizer
/// there, so that it alone finishes or cleans up the claim, even after the claim's
/// storage-provisioner annotation or class changed. Written and removed together with the
/// finalizer. No Go counterpart.
pub const ANN_PROVISIONING_OWNER: &str =
    "external-provisioner.volume.kubernetes.io/provisioning-owner";

/// On a claim, next to [`FINALIZER_PROVISIONING`]: the StorageClass the provisioning started
/// with, as JSON (its name, uid, provisioner, parameters, reclaim policy, mount options,
/// binding mode and allowed topologies), so that the claim is finished or cleaned up with
/// that class even after the class was deleted or changed. Written and removed together
/// with the finalizer; left out for a class whose JSON exceeds 16 KiB. No Go counterpart.
pub const ANN_PROVISIONING_CLASS: &str =
    "external-provisioner.volume.kubernetes.io/provisioning-class";

/// On a PV we provisioned for a driver with late assets
/// ([`Provisioner::late_asset_window`](crate::Provisioner::late_asset_window)): the time
/// (RFC 3339) at which its late-asset window ends, written with the PV when it is saved.
/// From then on the driver owes the PV its last sweep
/// ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)); whichever controller
/// leads then makes it (the one that saved the PV may be gone) and removes the annotation
/// once the driver answered without failing. No Go counterpart.
pub const ANN_LATE_ASSET_SWEEP: &str = "external-provisioner.volume.kubernetes.io/late-asset-sweep";

/// On a PV that crash-safe provisioning saved only to record an asset its claim will not
/// use (the claim was deleted, bound to another PV, or asks another provisioner now):
/// `"true"`. Such a PV is released at once; when it is reclaimed inside its late-asset
/// window it stays (Released, with our finalizer when it has one) until the window ends,
/// and its name is deleted again then, so a create of its name that another replica (or
/// an earlier life of this one) sent and that lands late goes too, whichever controller
/// leads by then. No Go counterpart.
pub const ANN_CLEANUP_RECORD: &str = "external-provisioner.volume.kubernetes.io/cleanup-record";

/// On a PV we provisioned for a driver with late assets: `"true"` when a create of its
/// name may have been sent by another process than the one that saved it, or with an
/// outcome that process does not know: the claim showed the crash-safety finalizer (or
/// what is left of it once stripped) when that process's successful attempt began (put
/// there by another replica, an earlier life of this one, or an earlier attempt of this
/// one that the driver answered `NoChange`), or the driver answered `InBackground` (or
/// timed out) for it first. Such a PV, reclaimed inside its late-asset
/// window, stays (Released) until the window ends, as a cleanup record does
/// ([`ANN_CLEANUP_RECORD`]), and its name is deleted again then, whichever controller
/// leads by then: a create that lands late goes too even when every replica restarted
/// meanwhile. A PV provisioned in one go by one process goes at once. No Go counterpart.
pub const ANN_CREATES_MAY_LAND: &str = "external-provisioner.volume.kubernetes.io/creates-may-land";

/// Whether `volume` is kept until its late-asset window ends when reclaimed inside it: a
/// cleanup record ([`ANN_CLEANUP_RECORD`]) or a PV of a create that may land late
/// ([`ANN_CREATES_MAY_LAND`]).
pub(crate) fn kept_for_window(volume: &PersistentVolume) -> bool {
    is_cleanup_record(volume) || annotation(&volume.metadata, ANN_CREATES_MAY_LAND) == Some("true")
}

/// Whether `volume` is a cleanup record ([`ANN_CLEANUP_RECORD`] is `"true"`).
pub(crate) fn is_cleanup_record(volume: &PersistentVolume) -> bool {
    annotation(&volume.metadata, ANN_CLEANUP_RECORD) == Some("true")
}

fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The provisioner a claim asks for: [`ANN_STORAGE_PROVISIONER`], else its beta form.
#[must_use]
pub fn storage_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(&claim.metadata, ANN_BETA_STORAGE_PROVISIONER))
}

/// The provisioner that put [`FINALIZER_PROVISIONING`] on the claim ([`ANN_PROVISIONING_OWNER`]).
#[must_use]
pub fn provisioning_owner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_PROVISIONING_OWNER)
}

/// The class snapshot [`ANN_PROVISIONING_CLASS`] on the claim, as written (JSON).
#[must_use]
pub fn provisioning_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_PROVISIONING_CLASS)
}

/// The node the scheduler chose: [`ANN_SELECTED_NODE`], else its alpha form.
#[must_use]
pub fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_SELECTED_NODE)
        .or_else(|| annotation(&claim.metadata, ANN_ALPHA_SELECTED_NODE))
}

/// Whether the claim carries [`ANN_SELECTED_NODE`] (any value); the alpha form does not count.
#[must_use]
pub fn has_selected_node(claim: &PersistentVolumeClaim) -> bool {
    annotation(&claim.metadata, ANN_SELECTED_NODE).is_some()
}

/// The claim's storage class name: `spec.storageClassName`, or `""` (Go: `GetPersistentVolumeClaimClass`).
///
/// The deprecated `volume.beta.kubernetes.io/storage-class` annotation wins when present,
/// as in Kubernetes.
#[must_use]
#[doc(alias = "GetPersistentVolumeClaimClass")]
pub fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    if let Some(class) = annotation(&claim.metadata, "volume.beta.kubernetes.io/storage-class") {
        return class;
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

/// Whether the claim asks for `volumeMode: Block`.
#[must_use]
#[doc(alias = "CheckPersistentVolumeClaimModeBlock")]
pub fn is_block(claim: &PersistentVolumeClaim) -> bool {
    claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

/// The PV's `pv.kubernetes.io/provisioned-by` value.
#[must_use]
pub fn provisioned_by(volume: &PersistentVolume) -> Option<&str> {
    annotation(&volume.metadata, ANN_PROVISIONED_BY)
}

/// The PV's `pv.kubernetes.io/migrated-to` value.
#[must_use]
pub fn migrated_to(volume: &PersistentVolume) -> Option<&str> {
    annotation(&volume.metadata, ANN_MIGRATED_TO)
}

/// Whether the PV carries `finalizer`.
#[must_use]
#[doc(alias = "checkFinalizer")]
pub fn has_finalizer(volume: &PersistentVolume, finalizer: &str) -> bool {
    volume
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Whether the claim carries [`FINALIZER_PROVISIONING`].
pub(crate) fn has_provisioning_finalizer(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER_PROVISIONING))
}

/// The claim as `namespace/name`, for logs, events and errors.
pub(crate) fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A claim as the claim flow reads it: the object, with what the flow decides by read
/// off it once, when the claim's sync starts (the getters above, the crash-safety
/// finalizer and its annotations). Every step of a claim's way takes what it needs from
/// here instead of reading the claim again.
#[derive(Clone, Debug)]
pub(crate) struct ClaimView {
    /// The claim itself: for the driver's options, events and writes.
    pub(crate) claim: Arc<PersistentVolumeClaim>,
    /// `namespace/name`, for logs, events and errors ([`claim_key`]).
    pub(crate) key: String,
    /// `metadata.uid`, or `""`.
    pub(crate) uid: String,
    /// The storage class name ([`claim_class`]).
    pub(crate) class_name: String,
    /// The provisioner the claim asks for ([`storage_provisioner`]).
    pub(crate) storage_provisioner: Option<String>,
    /// The node the scheduler chose ([`selected_node`]).
    pub(crate) selected_node: Option<String>,
    /// Whether [`ANN_SELECTED_NODE`] itself is there ([`has_selected_node`]).
    pub(crate) has_selected_node: bool,
    /// Whether it asks for `volumeMode: Block` ([`is_block`]).
    pub(crate) is_block: bool,
    /// Whether the claim carries [`FINALIZER_PROVISIONING`].
    pub(crate) has_intent: bool,
    /// Who put that finalizer there ([`provisioning_owner`]).
    pub(crate) owner: Option<String>,
    /// The class snapshot written with it, as JSON ([`provisioning_class`]).
    pub(crate) recorded_class: Option<String>,
}

impl ClaimView {
    /// Reads the claim once.
    pub(crate) fn new(claim: Arc<PersistentVolumeClaim>) -> Self {
        Self {
            key: claim_key(&claim),
            uid: claim.metadata.uid.clone().unwrap_or_default(),
            class_name: claim_class(&claim).to_owned(),
            storage_provisioner: storage_provisioner(&claim).map(str::to_owned),
            selected_node: selected_node(&claim).map(str::to_owned),
            has_selected_node: has_selected_node(&claim),
            is_block: is_block(&claim),
            has_intent: has_provisioning_finalizer(&claim),
            owner: provisioning_owner(&claim).map(str::to_owned),
            recorded_class: provisioning_class(&claim).map(str::to_owned),
            claim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{pv, pvc};

    #[test]
    fn storage_provisioner_prefers_the_ga_annotation_over_the_beta_one() {
        let claim = pvc("c")
            .annotation(ANN_BETA_STORAGE_PROVISIONER, "beta")
            .annotation(ANN_STORAGE_PROVISIONER, "ga")
            .build();
        assert_eq!(storage_provisioner(&claim), Some("ga"));
        let beta_only = pvc("c")
            .annotation(ANN_BETA_STORAGE_PROVISIONER, "beta")
            .build();
        assert_eq!(storage_provisioner(&beta_only), Some("beta"));
        assert_eq!(storage_provisioner(&pvc("c").build()), None);
    }

    #[test]
    fn selected_node_falls_back_to_the_alpha_annotation() {
        let alpha = pvc("c").annotation(ANN_ALPHA_SELECTED_NODE, "n1").build();
        assert_eq!(selected_node(&alpha), Some("n1"));
        assert!(!has_selected_node(&alpha));
        let ga = pvc("c").selected_node("n2").build();
        assert_eq!(selected_node(&ga), Some("n2"));
        assert!(has_selected_node(&ga));
    }

    #[test]
    fn claim_class_reads_the_spec_or_the_legacy_annotation() {
        assert_eq!(claim_class(&pvc("c").storage_class("fast").build()), "fast");
        assert_eq!(claim_class(&pvc("c").build()), "");
        let legacy = pvc("c")
            .storage_class("fast")
            .annotation("volume.beta.kubernetes.io/storage-class", "old")
            .build();
        assert_eq!(claim_class(&legacy), "old");
    }

    #[test]
    fn finalizer_presence_is_detected() {
        assert!(has_finalizer(
            &pv("v").finalizer(FINALIZER_PV).build(),
            FINALIZER_PV
        ));
        assert!(!has_finalizer(&pv("v").build(), FINALIZER_PV));
    }
}
