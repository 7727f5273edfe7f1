//! The PV object a claim gets: built from the driver's volume ([`decorate`],
//! [`ensure_name`], [`claim_reference`]; Go: the part of `provisionClaimOperation` after
//! the driver returned) and created on the API server ([`create`]: a PV saved first under
//! its name counts as saved, [`reuse_existing`]; then the driver hears of the saved PV and
//! the claim's journal entry is settled).
//!
//! In a claim's way: after the driver answered, before and under the saving strategy
//! (`save`); the crash-safety cleanup builds and creates its PV here too.

use k8s_openapi::api::{
    core::v1::{ObjectReference, PersistentVolume},
    storage::v1::StorageClass,
};

use kube_client::{Api, api::PostParams};
use tracing::Instrument as _;

use super::{
    Context,
    calls::{OpError, api, get_volume, is_api},
};
use crate::annotations::{ANN_PROVISIONED_BY, ClaimView, FINALIZER_PV};

/// What the controller adds to the driver's PV, as Go does: claimRef, storageClassName,
/// the protection finalizer (when configured) and `pv.kubernetes.io/provisioned-by`.
pub(crate) fn decorate(
    ctx: &Context,
    claim: &ClaimView,
    class: &StorageClass,
    volume: &mut PersistentVolume,
) {
    let spec = volume.spec.get_or_insert_with(Default::default);
    if let Ok(claim_ref) = claim_reference(claim) {
        spec.claim_ref = Some(claim_ref);
    }
    spec.storage_class_name = Some(claim.class_name.clone());
    let reclaim_delete = spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete");
    if ctx.config.add_finalizer && reclaim_delete {
        let finalizers = volume.metadata.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.iter().any(|f| f == FINALIZER_PV) {
            finalizers.push(FINALIZER_PV.to_owned());
        }
    }
    // The class's provisioner (one of our names), as Go; ours when the class changed to
    // another provisioner while the claim was provisioned in the background, so that
    // this controller, which holds the asset, also deletes it.
    let provisioned_by = if ctx.names().knows(&class.provisioner) {
        class.provisioner.clone()
    } else {
        ctx.name.clone()
    };
    let annotations = volume
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(ANN_PROVISIONED_BY.to_owned(), provisioned_by);
}

/// Gives a nameless PV from the driver the name it must have (`pv_name`); a PV with
/// another name is kept as it is (Go does not check), with a warning.
pub(crate) fn ensure_name(volume: &mut PersistentVolume, pv_name: &str, claim: &ClaimView) {
    match volume.metadata.name.as_deref() {
        None | Some("") => {
            tracing::warn!(pvc = %claim.key, pv = pv_name, "the provisioner returned a PV without a name; naming it");
            volume.metadata.name = Some(pv_name.to_owned());
        }
        Some(name) if name != pv_name => {
            tracing::warn!(pvc = %claim.key, pv = name, expected = pv_name, "the provisioner returned a PV with another name than asked for");
        }
        Some(_) => {}
    }
}

/// The claimRef of the claim's PV.
///
/// # Errors
/// [`OpError::NoUid`]: only a claimRef with the claim's uid gets the PV released once the
/// claim is gone.
pub(crate) fn claim_reference(view: &ClaimView) -> Result<ObjectReference, OpError> {
    if view.uid.is_empty() {
        return Err(OpError::NoUid {
            claim: view.key.clone(),
        });
    }
    let claim = &view.claim;
    Ok(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..ObjectReference::default()
    })
}

/// The uid of the claim a PV's claimRef names.
pub(crate) fn claim_uid(volume: &PersistentVolume) -> Option<&str> {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
}

/// Creates the PV and returns the PV saved under its name; an existing one counts as
/// saved (Go), after [`reuse_existing`]. Either way the caller then tells crash safety
/// (`crash_safety::after_save`).
pub(crate) async fn create(
    ctx: &Context,
    volume: &PersistentVolume,
) -> Result<PersistentVolume, OpError> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    match api(
        ctx.config.provision_timeout,
        || format!("create persistentvolume {name}"),
        volumes.create(&PostParams::default(), volume),
    )
    .instrument(tracing::debug_span!("create_pv"))
    .await
    {
        Ok(created) => Ok(created),
        Err(OpError::Api { source, .. }) if is_api(&source, |s| s.is_already_exists()) => {
            match get_volume(&ctx.client, ctx.config.provision_timeout, name).await? {
                Some(saved) => {
                    reuse_existing(volume, &saved);
                    Ok(saved)
                }
                None => Err(OpError::VolumeGone {
                    name: name.to_owned(),
                }),
            }
        }
        Err(err) => Err(err),
    }
}

/// The part of a PV's spec that names its asset: the spec without the fields the
/// controller or the claim decide (claimRef, class, capacity, access, mount options,
/// node affinity, reclaim policy, volume mode).
pub(crate) fn volume_source(
    volume: &PersistentVolume,
) -> k8s_openapi::api::core::v1::PersistentVolumeSpec {
    let mut spec = volume.spec.clone().unwrap_or_default();
    spec.access_modes = None;
    spec.capacity = None;
    spec.claim_ref = None;
    spec.mount_options = None;
    spec.node_affinity = None;
    spec.persistent_volume_reclaim_policy = None;
    spec.storage_class_name = None;
    spec.volume_mode = None;
    spec
}

/// Whether two PVs name the same asset (their volume sources are equal).
pub(crate) fn same_source(a: &PersistentVolume, b: &PersistentVolume) -> bool {
    volume_source(a) == volume_source(b)
}

/// Another PV was saved under the name of `ours` first (another replica provisioned the
/// same claim, or an earlier attempt of this one saved it): it counts as saved. When it
/// names another asset, ours is released by the driver's
/// [`LateAssets::volume_saved`](crate::LateAssets::volume_saved) of the saved PV, which
/// the caller makes next (it releases every other asset of the name).
pub(crate) fn reuse_existing(ours: &PersistentVolume, saved: &PersistentVolume) {
    let name = ours.metadata.name.as_deref().unwrap_or_default();
    if same_source(ours, saved) {
        tracing::info!(pv = name, "persistentvolume already exists, reusing");
    } else {
        tracing::warn!(
            pv = name,
            "another PV with another volume source was saved under this name first; the driver releases ours"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    /// The claim as its sync reads it.
    fn view(claim: k8s_openapi::api::core::v1::PersistentVolumeClaim) -> ClaimView {
        ClaimView::new(std::sync::Arc::new(claim))
    }

    #[test]
    fn a_nameless_volume_gets_the_name_it_must_have() {
        let claim = view(pvc("c").uid("u1").build());
        let mut nameless = PersistentVolume::default();
        ensure_name(&mut nameless, "pvc-u1", &claim);
        assert_eq!(nameless.metadata.name.as_deref(), Some("pvc-u1"));
        let mut empty = PersistentVolume::default();
        empty.metadata.name = Some(String::new());
        ensure_name(&mut empty, "pvc-u1", &claim);
        assert_eq!(empty.metadata.name.as_deref(), Some("pvc-u1"));
        let mut other = PersistentVolume::default();
        other.metadata.name = Some("mine".into());
        ensure_name(&mut other, "pvc-u1", &claim);
        assert_eq!(other.metadata.name.as_deref(), Some("mine"));
    }

    #[test]
    fn claim_reference_names_the_claim_and_needs_a_uid() {
        let claim = view(pvc("c").namespace("ns").uid("u1").build());
        let r = claim_reference(&claim).unwrap();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (
                Some("PersistentVolumeClaim"),
                Some("ns"),
                Some("c"),
                Some("u1")
            )
        );
        assert!(claim_reference(&view(pvc("c").build())).is_err());
        assert!(
            claim_reference(&view(pvc("c").uid("").build())).is_err(),
            "an empty uid is no uid"
        );
    }
}
