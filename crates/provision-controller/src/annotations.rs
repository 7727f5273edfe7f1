//! The names on objects a driver, a test or an operator may need: the Kubernetes
//! annotations the controller reads and writes (Go's: it writes no key of its own on
//! users' objects), the PV finalizer, and the label of the controller's journal objects.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

/// On the controller's journal ConfigMaps: the name of its Lease; public with the feature
/// `testing` (an operator selects them by its text, which docs/production.md gives, and
/// removes them with [`Uninstall`](crate::Uninstall)).
#[cfg(any(test, feature = "testing"))]
pub const JOURNAL_LABEL: &str = JOURNAL_LABEL_KEY;

/// The journal's label key (`JOURNAL_LABEL` with the feature `testing`); the domain
/// is the project's own.
pub(crate) const JOURNAL_LABEL_KEY: &str =
    "provisioning-journal.rust-storage-controllers.github.io/lease";

/// On a PV: the provisioner that created it (Go: `annDynamicallyProvisioned`).
#[doc(alias = "annDynamicallyProvisioned")]
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// On a PV: the CSI driver a migrated in-tree volume now belongs to (Go: `annMigratedTo`).
#[doc(alias = "annMigratedTo")]
pub(crate) const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// On a claim: the provisioner asked to provision it (Go: `annStorageProvisioner`); public
/// with the feature `testing` (Kubernetes sets it, a driver has no use for it).
#[doc(alias = "annStorageProvisioner")]
#[cfg(any(test, feature = "testing"))]
pub const ANN_STORAGE_PROVISIONER: &str = STORAGE_PROVISIONER;
#[cfg(not(any(test, feature = "testing")))]
pub(crate) const ANN_STORAGE_PROVISIONER: &str = STORAGE_PROVISIONER;
const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// On a claim: the beta form of [`ANN_STORAGE_PROVISIONER`], read when that one is absent.
#[doc(alias = "annBetaStorageProvisioner")]
pub(crate) const ANN_BETA_STORAGE_PROVISIONER: &str =
    "volume.beta.kubernetes.io/storage-provisioner";
/// On a claim: the node the scheduler chose (Go: `annSelectedNode`); public with the
/// feature `testing` (a driver reads it as
/// [`ProvisionOptions::selected_node_name`](crate::ProvisionOptions::selected_node_name)).
#[doc(alias = "annSelectedNode")]
#[cfg(any(test, feature = "testing"))]
pub const ANN_SELECTED_NODE: &str = SELECTED_NODE;
#[cfg(not(any(test, feature = "testing")))]
pub(crate) const ANN_SELECTED_NODE: &str = SELECTED_NODE;
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a claim: the Kubernetes 1.11 form of [`ANN_SELECTED_NODE`] (Go: `annAlphaSelectedNode`).
#[doc(alias = "annAlphaSelectedNode")]
pub(crate) const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";
/// PV finalizer marking the provisioner as owner of its cleanup (Go: `finalizerPV`).
#[doc(alias = "finalizerPV")]
pub const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";

fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The provisioner a claim asks for: [`ANN_STORAGE_PROVISIONER`], else its beta form.
#[must_use]
pub(crate) fn storage_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(&claim.metadata, ANN_BETA_STORAGE_PROVISIONER))
}

/// The node the scheduler chose: [`ANN_SELECTED_NODE`], else its alpha form.
#[must_use]
pub(crate) fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_SELECTED_NODE)
        .or_else(|| annotation(&claim.metadata, ANN_ALPHA_SELECTED_NODE))
}

/// Whether the claim carries [`ANN_SELECTED_NODE`] (any value); the alpha form does not count.
#[must_use]
pub(crate) fn has_selected_node(claim: &PersistentVolumeClaim) -> bool {
    annotation(&claim.metadata, ANN_SELECTED_NODE).is_some()
}

/// The claim's storage class name: `spec.storageClassName`, or `""` (Go: `GetPersistentVolumeClaimClass`).
///
/// The deprecated `volume.beta.kubernetes.io/storage-class` annotation wins when present,
/// as in Kubernetes.
#[must_use]
#[doc(alias = "GetPersistentVolumeClaimClass")]
pub(crate) fn claim_class(claim: &PersistentVolumeClaim) -> &str {
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
pub(crate) fn is_block(claim: &PersistentVolumeClaim) -> bool {
    claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

/// The PV's `pv.kubernetes.io/provisioned-by` value.
#[must_use]
pub(crate) fn provisioned_by(volume: &PersistentVolume) -> Option<&str> {
    annotation(&volume.metadata, ANN_PROVISIONED_BY)
}

/// The PV's `pv.kubernetes.io/migrated-to` value.
#[must_use]
pub(crate) fn migrated_to(volume: &PersistentVolume) -> Option<&str> {
    annotation(&volume.metadata, ANN_MIGRATED_TO)
}

/// Whether the PV carries `finalizer`.
#[must_use]
#[doc(alias = "checkFinalizer")]
pub(crate) fn has_finalizer(volume: &PersistentVolume, finalizer: &str) -> bool {
    volume
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
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
/// off it once, when the claim's sync starts (the getters above). Every step of a claim's way takes what it needs from
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
