//! The PV object a claim gets: built from the driver's volume ([`decorate`],
//! [`ensure_name`], [`claim_reference`]; Go: the part of `provisionClaimOperation` after
//! the driver returned) and created on the API server ([`create`]: a PV saved first under
//! its name counts as saved, [`reuse_existing`]; then the driver hears of the saved PV).
//!
//! In a claim's way: after the driver answered, before and under the saving strategy
//! (`save`); the crash-safety cleanup builds and creates its PV here too.

use k8s_openapi::api::{
    core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};

use kube_client::{Api, api::PostParams};

use super::{
    Context,
    calls::{OpError, api, chain, get_volume, is_api},
    late,
};
use crate::{
    DeleteError,
    annotations::{
        ANN_CREATES_MAY_LAND, ANN_LATE_ASSET_SWEEP, ANN_PROVISIONED_BY, ClaimView, FINALIZER_PV,
        claim_key,
    },
    events,
};

/// What the controller adds to the driver's PV: claimRef, storageClassName, the
/// protection finalizer (when configured), `pv.kubernetes.io/provisioned-by` and, for a
/// driver with late assets, [`ANN_LATE_ASSET_SWEEP`] (when its late-asset window ends)
/// and, when `creates_may_land` (see [`ANN_CREATES_MAY_LAND`]), that annotation.
pub(crate) fn decorate(
    ctx: &Context,
    claim: &ClaimView,
    class: &StorageClass,
    volume: &mut PersistentVolume,
    creates_may_land: bool,
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
    // The last late-asset sweep is owed from the end of the window on, to be made by
    // whichever controller leads then (see `late`).
    if let Some(due) = late::sweep_due_annotation(
        ctx.provisioner.late_asset_window(),
        k8s_openapi::jiff::Timestamp::now(),
    ) {
        annotations.insert(ANN_LATE_ASSET_SWEEP.to_owned(), due);
        if creates_may_land {
            annotations.insert(ANN_CREATES_MAY_LAND.to_owned(), "true".to_owned());
        }
    }
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

/// Creates the PV and returns the PV saved under its name; an existing one counts as
/// saved (Go), after [`reuse_existing`]. Either way the driver hears of the saved PV
/// ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)). `claim` is the
/// claim events go to, if any.
pub(crate) async fn create(
    ctx: &Context,
    volume: &PersistentVolume,
    claim: Option<&PersistentVolumeClaim>,
) -> Result<PersistentVolume, OpError> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    match api(
        ctx.config.provision_timeout,
        || format!("create persistentvolume {name}"),
        volumes.create(&PostParams::default(), volume),
    )
    .await
    {
        Ok(created) => {
            volume_saved(ctx, &created).await;
            Ok(created)
        }
        Err(OpError::Api { source, .. }) if is_api(&source, |s| s.is_already_exists()) => {
            match get_volume(&ctx.client, ctx.config.provision_timeout, name).await? {
                Some(saved) => {
                    reuse_existing(ctx, claim, volume, &saved).await;
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
fn volume_source(volume: &PersistentVolume) -> k8s_openapi::api::core::v1::PersistentVolumeSpec {
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

/// Tells the driver that `saved` is stored
/// ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)); a failure is logged,
/// fails nothing, and is retried by the volume worker until the driver answers without
/// failing (see [`late`]).
async fn volume_saved(ctx: &Context, saved: &PersistentVolume) {
    // The first sync of the PV here then only waits for the end of its late-asset window.
    late::saved(ctx, saved);
    late::volume_saved(ctx, saved).await;
}

/// Another PV was saved under the name of `ours` first (another replica provisioned the
/// same claim): when it names another asset, the driver releases ours
/// ([`Provisioner::delete_duplicate`](crate::Provisioner::delete_duplicate)); then the
/// driver hears of the saved PV ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)).
/// Never fails: a failure is logged and reported on the claim, and the save counts as done.
pub(crate) async fn reuse_existing(
    ctx: &Context,
    claim: Option<&PersistentVolumeClaim>,
    ours: &PersistentVolume,
    saved: &PersistentVolume,
) {
    release_duplicate(ctx, claim, ours, saved).await;
    volume_saved(ctx, saved).await;
}

async fn release_duplicate(
    ctx: &Context,
    claim: Option<&PersistentVolumeClaim>,
    ours: &PersistentVolume,
    saved: &PersistentVolume,
) {
    let name = ours.metadata.name.as_deref().unwrap_or_default();
    if same_source(ours, saved) {
        tracing::info!(pv = name, "persistentvolume already exists, reusing");
        return;
    }
    tracing::warn!(
        pv = name,
        "another PV with another volume source was saved under this name first; releasing the duplicate"
    );
    let outcome = ctx
        .driver_slots
        .deleting(
            ctx.config.provision_timeout,
            ctx.provisioner.delete_duplicate(ours, saved),
        )
        .await;
    let error = match outcome {
        Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => {
            tracing::info!(pv = name, "released the duplicate of the saved PV");
            return;
        }
        Ok(Err(DeleteError::Failed(e))) => chain(&*e),
        Err(e) => chain(&e.into_op("delete_duplicate")),
    };
    tracing::error!(pv = name, %error, "releasing the duplicate of the saved PV failed; delete it manually");
    if let Some(claim) = claim {
        let note = format!(
            "Error deleting the duplicate of provisioned volume {name} for claim {}: {error}. Please delete manually.",
            claim_key(claim)
        );
        ctx.events
            .warning(claim, events::PROVISIONING_CLEANUP_FAILED, note)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    /// The claim as its sync reads it.
    fn view(claim: PersistentVolumeClaim) -> ClaimView {
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
