//! The volume flow: `finalizer_change` and `should_delete` (pure), then `sync_volume` and
//! `delete_volume` (I/O). Go: `syncVolume`, `handleProtectionFinalizer`, `shouldDelete`,
//! `deleteVolumeOperation`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use tokio::time::Instant;

use super::{
    Context,
    calls::{CallError, OpError, api, call, chain, get_volume, is_api, is_other_uid},
    names::{Names, is_ours},
};
use crate::{
    DeleteError,
    annotations::{self, FINALIZER_PV},
    events,
};

fn reclaim_policy(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("")
}

/// How our protection finalizer on a PV must change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FinalizerChange {
    Add,
    Remove,
}

/// How our finalizer on the PV must change, if at all (Go v13 `handleProtectionFinalizer`,
/// plus the release of PVs we will never reclaim). Only our own PVs are touched:
/// - added when `add_finalizer` is on, the reclaim policy is Delete, the PV is Bound and
///   not being deleted (Go v13 adds it to Bound PVs only; provisioned PVs are saved
///   with it);
/// - removed when `add_finalizer` is off, the policy is Retain or Recycle, or the PV is
///   being deleted and we will never reclaim it: it would stay Terminating forever
///   otherwise. A PV with policy Delete is reclaimed when it is Bound or Released, and
///   also when it is still Pending or Available with a claimRef that names a claim by
///   uid (a PV saved for a claim that is gone or going: the PV controller releases it);
///   a Failed PV, or one that names no claim, never is.
pub(crate) fn finalizer_change(
    volume: &PersistentVolume,
    names: Names<'_>,
    add_finalizer: bool,
) -> Option<FinalizerChange> {
    if !is_ours(volume, names) {
        return None;
    }
    let has = annotations::has_finalizer(volume, FINALIZER_PV);
    let policy = reclaim_policy(volume);
    let phase = volume.status.as_ref().and_then(|s| s.phase.as_deref());
    let deleting = volume.metadata.deletion_timestamp.is_some();
    if has {
        let names_a_claim = volume
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.as_deref())
            .is_some_and(|uid| !uid.is_empty());
        let reclaimable = policy == "Delete"
            && match phase {
                Some("Bound" | "Released") => true,
                Some("Failed") => false,
                // Pending (no phase yet) or Available: released once the claim is gone.
                _ => names_a_claim,
            };
        let remove = !add_finalizer
            || policy == "Retain"
            || policy == "Recycle"
            || (deleting && !reclaimable);
        return remove.then_some(FinalizerChange::Remove);
    }
    let add = add_finalizer && policy == "Delete" && !deleting && phase == Some("Bound");
    add.then_some(FinalizerChange::Add)
}

/// Whether the volume's asset should be deleted (Go `shouldDelete`, after the deletion guard).
pub(crate) fn should_delete(
    volume: &PersistentVolume,
    names: Names<'_>,
    add_finalizer: bool,
) -> bool {
    let deleting = volume.metadata.deletion_timestamp.is_some();
    if deleting && !(add_finalizer && annotations::has_finalizer(volume, FINALIZER_PV)) {
        // Without our finalizer a PV under deletion is already handled.
        return false;
    }
    let phase = volume.status.as_ref().and_then(|s| s.phase.as_deref());
    phase == Some("Released") && reclaim_policy(volume) == "Delete" && is_ours(volume, names)
}

/// Whether `fresh`, the PV as the API server has it right before the driver deletes
/// its asset, is still the PV `cached` that was judged, and still to be reclaimed.
pub(crate) fn still_reclaimable(
    cached: &PersistentVolume,
    fresh: &PersistentVolume,
    names: Names<'_>,
    add_finalizer: bool,
) -> bool {
    cached.metadata.uid == fresh.metadata.uid && should_delete(fresh, names, add_finalizer)
}

/// Processes the volume with this name; an error requeues it.
pub(crate) async fn sync_volume(ctx: &Context, name: &str) -> Result<(), OpError> {
    let Some(volume) = ctx.caches.volume(name) else {
        tracing::debug!(pv = name, "volume no longer exists");
        return Ok(());
    };
    let Some(volume) = handle_protection_finalizer(ctx, volume).await? else {
        tracing::debug!(pv = name, "volume no longer exists");
        return Ok(());
    };
    if !should_delete(&volume, ctx.names(), ctx.config.add_finalizer) {
        tracing::trace!(pv = name, "volume should not be deleted");
        return Ok(());
    }
    if let Some(guard) = &ctx.driver.guard {
        match call(ctx.config.deletion_timeout, guard.should_delete(&volume)).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(pv = name, "deletion guard vetoed deleting the volume");
                return Ok(());
            }
            Err(err) => return Err(err.into_op("deletion guard")),
        }
    }
    // The driver's delete cannot be undone: decide again on the PV as it is now (the
    // cache may lag a switch to Retain, a new binding, or a PV deleted and re-created).
    let fresh = match get_volume(&ctx.client, ctx.config.deletion_timeout, name).await? {
        Some(fresh)
            if still_reclaimable(&volume, &fresh, ctx.names(), ctx.config.add_finalizer) =>
        {
            fresh
        }
        Some(_) => {
            tracing::info!(
                pv = name,
                "the volume as it is now is no longer to be deleted; keeping its asset"
            );
            return Ok(());
        }
        None => {
            tracing::debug!(pv = name, "volume no longer exists");
            return Ok(());
        }
    };
    let class = fresh
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    let start = Instant::now();
    let result = delete_volume(ctx, &fresh).await;
    match (&result, &ctx.metrics) {
        (Ok(Deletion::Deleted), Some(m)) => {
            m.delete_succeeded(&class, start.elapsed());
        }
        (Ok(Deletion::Ignored), Some(m)) => m.delete_stopped(&class),
        (Err(_), Some(m)) => m.delete_failed(&class, start.elapsed()),
        _ => {}
    }
    result.map(|_| ())
}

/// Adds or removes our finalizer as [`finalizer_change`] says; `None` when the PV is gone.
async fn handle_protection_finalizer(
    ctx: &Context,
    volume: Arc<PersistentVolume>,
) -> Result<Option<Arc<PersistentVolume>>, OpError> {
    let Some(change) = finalizer_change(&volume, ctx.names(), ctx.config.add_finalizer) else {
        return Ok(Some(volume));
    };
    let name = volume.metadata.name.clone().unwrap_or_default();
    match patch_finalizer(ctx, &volume, change).await {
        Ok(patched) => {
            tracing::debug!(pv = %name, ?change, "updated protection finalizer");
            Ok(Some(Arc::new(patched)))
        }
        // Gone, or another PV under the name (a real server answers the uid of a patch
        // with a 422: the uid is immutable).
        Err(OpError::Api { source, .. })
            if is_api(&source, |s| s.is_not_found() || is_other_uid(s)) =>
        {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// The strategic-merge patch that adds or removes our finalizer (pure).
///
/// `metadata.finalizers` merges as a set on the API server, so the patch touches our
/// finalizer only and needs no resourceVersion (Go v13): a concurrent change of other
/// finalizers never makes it conflict. The PV's uid, when known, is a precondition: a PV
/// re-created under the same name is never touched.
fn finalizer_patch(uid: Option<&str>, change: FinalizerChange) -> serde_json::Value {
    let mut meta = serde_json::Map::new();
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        meta.insert("uid".into(), uid.into());
    }
    let key = match change {
        FinalizerChange::Add => "finalizers",
        FinalizerChange::Remove => "$deleteFromPrimitiveList/finalizers",
    };
    meta.insert(key.into(), serde_json::json!([FINALIZER_PV]));
    serde_json::json!({ "metadata": meta })
}

async fn patch_finalizer(
    ctx: &Context,
    volume: &PersistentVolume,
    change: FinalizerChange,
) -> Result<PersistentVolume, OpError> {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let patch = finalizer_patch(volume.metadata.uid.as_deref(), change);
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    api(
        ctx.config.deletion_timeout,
        || format!("modify finalizers of persistentvolume {name}"),
        volumes.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch)),
    )
    .await
}

/// What [`delete_volume`] did.
#[derive(Debug, PartialEq, Eq)]
enum Deletion {
    /// The asset, then the PV.
    Deleted,
    /// Nothing: the driver ignored the volume.
    Ignored,
}

/// Deletes the asset, then the PV, then our finalizer (Go `deleteVolumeOperation`).
#[tracing::instrument(skip_all, fields(pv = volume.metadata.name.as_deref().unwrap_or_default()))]
async fn delete_volume(ctx: &Context, volume: &PersistentVolume) -> Result<Deletion, OpError> {
    let limit = ctx.config.deletion_timeout;
    let name = volume.metadata.name.clone().unwrap_or_default();
    let answer = ctx
        .driver_slots
        .deleting(limit, ctx.driver.provisioner.delete(volume))
        .await;
    let failure = match answer {
        Ok(Ok(())) => None,
        Ok(Err(DeleteError::Ignored { reason })) => {
            tracing::info!(%reason, "volume deletion ignored");
            return Ok(Deletion::Ignored);
        }
        Ok(Err(DeleteError::Failed(source))) => Some(OpError::Delete(source)),
        Err(err @ (CallError::Timeout(_) | CallError::Panicked(_))) => Some(err.into_op("delete")),
    };
    if let Some(err) = failure {
        tracing::warn!(error = %chain(&err), "volume deletion failed");
        ctx.events
            .warning(volume, events::VOLUME_FAILED_DELETE, chain(&err))
            .await;
        return Err(err);
    }
    tracing::info!("volume deleted");
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    // A PV re-created under the same name meanwhile is not ours to delete (409).
    let params = DeleteParams {
        preconditions: volume.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match call(limit, volumes.delete(&name, &params)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if is_api(&e, |s| s.is_not_found() || s.is_conflict()) => {
            return Ok(Deletion::Deleted);
        }
        Ok(Err(source)) => {
            return Err(OpError::Api {
                what: format!("delete persistentvolume {name}"),
                source,
            });
        }
        Err(e) => return Err(e.into_op(format!("delete persistentvolume {name}"))),
    }

    if annotations::has_finalizer(volume, FINALIZER_PV) {
        // The delete set a deletion timestamp; our finalizer is all that is left to do.
        match patch_finalizer(ctx, volume, FinalizerChange::Remove).await {
            Ok(_) => {}
            Err(OpError::Api { source, .. })
                if is_api(&source, |s| s.is_not_found() || is_other_uid(s)) => {}
            Err(err) => return Err(err),
        }
    }
    tracing::info!("persistentvolume deleted");
    Ok(Deletion::Deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pv;

    use crate::controller::names::tests::{ME, names};

    #[test]
    fn should_delete_decisions() {
        let released = || pv("v").phase("Released").provisioned_by(ME);
        let cases: Vec<(&str, PersistentVolume, bool, bool)> = vec![
            (
                "should delete a released volume we provisioned",
                released().build(),
                false,
                true,
            ),
            (
                "should not delete a bound volume",
                released().phase("Bound").build(),
                false,
                false,
            ),
            (
                "should not delete a failed volume",
                released().phase("Failed").build(),
                false,
                false,
            ),
            (
                "should not delete when reclaim policy is retain",
                released().reclaim_policy("Retain").build(),
                false,
                false,
            ),
            (
                "should not delete a volume of another provisioner",
                pv("v")
                    .phase("Released")
                    .provisioned_by("example.com/other")
                    .build(),
                false,
                false,
            ),
            (
                "should not delete a volume without provisioned-by",
                pv("v").phase("Released").build(),
                false,
                false,
            ),
            (
                "should delete a volume migrated to us",
                pv("v")
                    .phase("Released")
                    .provisioned_by("kubernetes.io/in-tree")
                    .migrated_to(ME)
                    .build(),
                false,
                true,
            ),
            (
                "should not delete a volume being deleted without the finalizer option",
                released().deleting().build(),
                false,
                false,
            ),
            (
                "should delete a volume being deleted that still has our finalizer",
                released().finalizer(FINALIZER_PV).deleting().build(),
                true,
                true,
            ),
            (
                "should not delete a volume being deleted whose finalizer is gone",
                released().deleting().build(),
                true,
                false,
            ),
            (
                "should delete a released volume with the finalizer option",
                released().finalizer(FINALIZER_PV).build(),
                true,
                true,
            ),
        ];
        for (name, volume, add_finalizer, want) in cases {
            assert_eq!(
                should_delete(&volume, names(&[]), add_finalizer),
                want,
                "case: {name}"
            );
        }
    }

    #[test]
    fn should_delete_a_volume_provisioned_under_an_additional_name() {
        let extra = vec!["example.com/old".to_owned()];
        let volume = pv("v")
            .phase("Released")
            .provisioned_by("example.com/old")
            .build();
        assert!(should_delete(&volume, names(&extra), false));
    }

    #[test]
    fn finalizer_decisions() {
        use FinalizerChange::{Add, Remove};
        let ours = || pv("v").provisioned_by(ME);
        let bound = || ours().phase("Bound");
        let cases: Vec<(&str, PersistentVolume, bool, Option<FinalizerChange>)> = vec![
            (
                "adds the finalizer to a bound delete volume when enabled",
                bound().build(),
                true,
                Some(Add),
            ),
            (
                "does not add the finalizer to an available volume",
                ours().phase("Available").build(),
                true,
                None,
            ),
            (
                "does not add the finalizer to a released volume",
                ours().phase("Released").build(),
                true,
                None,
            ),
            (
                "keeps an existing finalizer when enabled",
                bound().finalizer(FINALIZER_PV).build(),
                true,
                None,
            ),
            (
                "keeps the finalizer of a new volume that is not bound yet",
                ours().phase("Pending").finalizer(FINALIZER_PV).build(),
                true,
                None,
            ),
            (
                "removes the finalizer when disabled",
                bound().finalizer(FINALIZER_PV).build(),
                false,
                Some(Remove),
            ),
            (
                "leaves a volume without finalizer alone when disabled",
                bound().build(),
                false,
                None,
            ),
            (
                "removes the finalizer when reclaim policy becomes retain",
                bound()
                    .reclaim_policy("Retain")
                    .finalizer(FINALIZER_PV)
                    .build(),
                true,
                Some(Remove),
            ),
            (
                "removes the finalizer when reclaim policy is recycle",
                bound()
                    .reclaim_policy("Recycle")
                    .finalizer(FINALIZER_PV)
                    .build(),
                true,
                Some(Remove),
            ),
            (
                "does not add the finalizer to a retain volume",
                bound().reclaim_policy("Retain").build(),
                true,
                None,
            ),
            (
                "does not add the finalizer to a volume being deleted",
                bound().deleting().build(),
                true,
                None,
            ),
            (
                "keeps the finalizer of a bound volume being deleted: it is reclaimed once released",
                bound().finalizer(FINALIZER_PV).deleting().build(),
                true,
                None,
            ),
            (
                "keeps the finalizer of a released volume being deleted: it is reclaimed",
                ours()
                    .phase("Released")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                None,
            ),
            (
                "removes the finalizer of an available volume being deleted: it is never reclaimed",
                ours()
                    .phase("Available")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                Some(Remove),
            ),
            (
                "keeps the finalizer of an available volume being deleted whose claim is gone: it will be released",
                ours()
                    .phase("Available")
                    .claim_ref("default", "gone", "uid-of-a-deleted-claim")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                None,
            ),
            (
                "keeps the finalizer of a new volume being deleted that names its claim",
                ours()
                    .claim_ref("default", "data", "uid-of-the-claim")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                None,
            ),
            (
                "removes the finalizer of an available volume being deleted that is only pre-bound",
                ours()
                    .phase("Available")
                    .claim_ref("default", "data", "")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                Some(Remove),
            ),
            (
                "removes the finalizer of a retain volume being deleted whose claim is gone",
                ours()
                    .phase("Available")
                    .reclaim_policy("Retain")
                    .claim_ref("default", "gone", "uid-of-a-deleted-claim")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                Some(Remove),
            ),
            (
                "removes the finalizer of a failed volume being deleted",
                ours()
                    .phase("Failed")
                    .claim_ref("default", "gone", "uid-of-a-deleted-claim")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                Some(Remove),
            ),
            (
                "removes the finalizer of a volume being deleted without a known reclaim policy",
                ours()
                    .phase("Released")
                    .reclaim_policy("")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                Some(Remove),
            ),
            (
                "adds the finalizer to a bound static in-tree volume migrated to us",
                pv("v").phase("Bound").migrated_to(ME).build(),
                true,
                Some(Add),
            ),
            (
                "leaves volumes of other provisioners alone",
                pv("v")
                    .phase("Available")
                    .provisioned_by("x/y")
                    .finalizer(FINALIZER_PV)
                    .deleting()
                    .build(),
                true,
                None,
            ),
        ];
        for (name, volume, add, want) in cases {
            assert_eq!(
                finalizer_change(&volume, names(&[]), add),
                want,
                "case: {name}"
            );
        }
    }

    #[test]
    fn finalizer_patches_touch_only_our_finalizer_and_carry_no_resource_version() {
        assert_eq!(
            finalizer_patch(Some("u1"), FinalizerChange::Add),
            serde_json::json!({"metadata": {"uid": "u1", "finalizers": [FINALIZER_PV]}})
        );
        assert_eq!(
            finalizer_patch(None, FinalizerChange::Remove),
            serde_json::json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER_PV]}})
        );
    }

    #[test]
    fn the_reclaim_decision_holds_only_for_the_same_volume_still_released_with_delete() {
        let released = || pv("v").phase("Released").provisioned_by(ME);
        let with_uid = |b: crate::testing::PvBuilder, uid: &str| {
            let mut v = b.build();
            v.metadata.uid = Some(uid.to_owned());
            v
        };
        let cached = with_uid(released(), "a");
        let cases = [
            ("the same released volume", with_uid(released(), "a"), true),
            (
                "the policy is Retain now",
                with_uid(released().reclaim_policy("Retain"), "a"),
                false,
            ),
            (
                "it is bound again",
                with_uid(released().phase("Bound"), "a"),
                false,
            ),
            (
                "another volume under the same name",
                with_uid(released(), "b"),
                false,
            ),
            (
                "it is being deleted and our finalizer is gone",
                with_uid(released().deleting(), "a"),
                false,
            ),
        ];
        for (name, fresh, want) in cases {
            assert_eq!(
                still_reclaimable(&cached, &fresh, names(&[]), true),
                want,
                "case: {name}"
            );
        }
    }
}
