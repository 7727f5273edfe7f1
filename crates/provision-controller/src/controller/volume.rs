//! The volume flow: `finalizer_change` and `should_delete` (pure), then `sync_volume` and
//! `delete_volume` (I/O). Go: `syncVolume`, `handleProtectionFinalizer`, `shouldDelete`,
//! `deleteVolumeOperation`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use tokio::time::Instant;

use super::{
    Context,
    op::{CallError, Names, OpError, api, call, chain, is_api},
};
use crate::{
    DeleteError,
    annotations::{self, FINALIZER_PV},
    events,
};

/// Whether the PV belongs to us (newer Go `isProvisionerForVolume`):
/// - a dynamically provisioned PV (with `pv.kubernetes.io/provisioned-by`) is ours when
///   that annotation or `pv.kubernetes.io/migrated-to` names one of our names; its CSI
///   driver does not count (another provisioner may use the same driver);
/// - a statically provisioned CSI PV is ours when its driver is one of our names;
/// - a statically provisioned in-tree PV is ours only when migrated to us.
pub(crate) fn is_ours(volume: &PersistentVolume, names: Names<'_>) -> bool {
    let migrated_to_us = annotations::migrated_to(volume).is_some_and(|m| names.knows(m));
    if let Some(provisioned_by) = annotations::provisioned_by(volume) {
        return names.knows(provisioned_by) || migrated_to_us;
    }
    match volume.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        Some(csi) => names.knows(&csi.driver),
        None => migrated_to_us,
    }
}

fn reclaim_policy(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("")
}

/// The finalizer list the PV should have, if it differs (Go `handleProtectionFinalizer`):
/// our finalizer is removed when `add_finalizer` is off or the reclaim policy is Retain or
/// Recycle, and added when `add_finalizer` is on, the policy is Delete and the PV is not
/// being deleted. Only our own PVs are touched.
pub(crate) fn finalizer_change(
    volume: &PersistentVolume,
    names: Names<'_>,
    add_finalizer: bool,
) -> Option<Vec<String>> {
    if !is_ours(volume, names) {
        return None;
    }
    let current = volume.metadata.finalizers.clone().unwrap_or_default();
    let has = current.iter().any(|f| f == FINALIZER_PV);
    let policy = reclaim_policy(volume);
    if has && (!add_finalizer || policy == "Retain" || policy == "Recycle") {
        return Some(current.into_iter().filter(|f| f != FINALIZER_PV).collect());
    }
    if !has && add_finalizer && policy == "Delete" && volume.metadata.deletion_timestamp.is_none() {
        let mut next = current;
        next.push(FINALIZER_PV.to_owned());
        return Some(next);
    }
    None
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

/// Processes the volume with this name; an error requeues it.
pub(crate) async fn sync_volume(ctx: &Context, name: &str) -> Result<(), OpError> {
    let Some(volume) = ctx.caches.volume(name) else {
        tracing::debug!(pv = name, "volume no longer exists");
        return Ok(());
    };
    let volume = handle_protection_finalizer(ctx, volume).await?;
    if !should_delete(&volume, ctx.names(), ctx.config.add_finalizer) {
        tracing::trace!(pv = name, "volume should not be deleted");
        return Ok(());
    }
    if let Some(guard) = &ctx.guard {
        match call(ctx.config.deletion_timeout, guard.should_delete(&volume)).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(pv = name, "deletion guard vetoed deleting the volume");
                return Ok(());
            }
            Err(err) => return Err(err.into_op("deletion guard")),
        }
    }
    let class = volume
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    let start = Instant::now();
    let result = delete_volume(ctx, &volume).await;
    match (&result, &ctx.metrics) {
        (Ok(true), Some(m)) => m.delete_succeeded(&class, start.elapsed()),
        (Ok(false), Some(m)) => m.delete_stopped(&class),
        (Err(_), Some(m)) => m.delete_failed(&class, start.elapsed()),
        (_, None) => {}
    }
    result.map(|_| ())
}

async fn handle_protection_finalizer(
    ctx: &Context,
    volume: Arc<PersistentVolume>,
) -> Result<Arc<PersistentVolume>, OpError> {
    let Some(finalizers) = finalizer_change(&volume, ctx.names(), ctx.config.add_finalizer) else {
        return Ok(volume);
    };
    let name = volume.metadata.name.clone().unwrap_or_default();
    let patched = patch_finalizers(ctx, &volume, finalizers).await?;
    tracing::debug!(pv = %name, "updated protection finalizer");
    Ok(Arc::new(patched))
}

/// A merge patch of the finalizers, guarded by the resourceVersion (a conflict when stale).
async fn patch_finalizers(
    ctx: &Context,
    volume: &PersistentVolume,
    finalizers: Vec<String>,
) -> Result<PersistentVolume, OpError> {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": volume.metadata.resource_version,
        }
    });
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    api(
        ctx.config.deletion_timeout,
        || format!("modify finalizers of persistentvolume {name}"),
        volumes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
}

/// Deletes the asset, then the PV, then our finalizer (Go `deleteVolumeOperation`).
/// `Ok(false)` when the driver ignored the volume.
#[tracing::instrument(skip_all, fields(pv = volume.metadata.name.as_deref().unwrap_or_default()))]
async fn delete_volume(ctx: &Context, volume: &PersistentVolume) -> Result<bool, OpError> {
    let limit = ctx.config.deletion_timeout;
    let name = volume.metadata.name.clone().unwrap_or_default();
    let failure = match call(limit, ctx.provisioner.delete(volume)).await {
        Ok(Ok(())) => None,
        Ok(Err(DeleteError::Ignored { reason })) => {
            tracing::info!(%reason, "volume deletion ignored");
            return Ok(false);
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
    match call(limit, volumes.delete(&name, &DeleteParams::default())).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if is_api(&e, |s| s.is_not_found()) => return Ok(true),
        Ok(Err(source)) => {
            return Err(OpError::Api {
                what: format!("delete persistentvolume {name}"),
                source,
            });
        }
        Err(e) => return Err(e.into_op(format!("delete persistentvolume {name}"))),
    }

    if ctx.config.add_finalizer
        && volume
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
    {
        // The delete set a deletion timestamp: read the PV again to patch its latest version.
        let current = match call(limit, volumes.get_opt(&name)).await {
            Ok(Ok(Some(current))) => current,
            Ok(Ok(None)) => return Ok(true),
            Ok(Err(source)) => {
                return Err(OpError::Api {
                    what: format!("get persistentvolume {name}"),
                    source,
                });
            }
            Err(e) => return Err(e.into_op(format!("get persistentvolume {name}"))),
        };
        if annotations::has_finalizer(&current, FINALIZER_PV) {
            let rest = current
                .metadata
                .finalizers
                .iter()
                .flatten()
                .filter(|f| *f != FINALIZER_PV)
                .cloned()
                .collect();
            match patch_finalizers(ctx, &current, rest).await {
                Ok(_) => {}
                Err(OpError::Api { source, .. }) if is_api(&source, |s| s.is_not_found()) => {}
                Err(err) => return Err(err),
            }
        }
    }
    tracing::info!("persistentvolume deleted");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pv;

    const ME: &str = "example.com/me";
    fn names(extra: &[String]) -> Names<'_> {
        Names {
            primary: ME,
            additional: extra,
        }
    }

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
    fn volume_ownership_decisions() {
        let csi = |driver: &str| {
            let mut v = pv("v").build();
            let spec = v.spec.as_mut().unwrap();
            spec.host_path = None;
            spec.csi = Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: "handle-1".into(),
                ..Default::default()
            });
            v
        };
        let with_ann = |mut v: PersistentVolume, key: &str, value: &str| {
            v.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.into(), value.into());
            v
        };
        let cases: Vec<(&str, PersistentVolume, bool)> = vec![
            (
                "a volume provisioned by us is ours",
                pv("v").provisioned_by(ME).build(),
                true,
            ),
            (
                "a volume migrated to us is ours",
                pv("v").provisioned_by("in/tree").migrated_to(ME).build(),
                true,
            ),
            (
                "a volume of another provisioner is not ours",
                pv("v").provisioned_by("x/y").build(),
                false,
            ),
            (
                "a volume migrated to another driver is not ours",
                pv("v").provisioned_by("x/y").migrated_to("x/y").build(),
                false,
            ),
            (
                "a statically provisioned CSI volume of our driver is ours",
                csi(ME),
                true,
            ),
            (
                "a statically provisioned CSI volume of another driver is not ours",
                csi("x/y"),
                false,
            ),
            (
                "a dynamically provisioned CSI volume of another provisioner is not ours",
                with_ann(csi("x/y"), crate::annotations::ANN_PROVISIONED_BY, "x/y"),
                false,
            ),
            (
                "a dynamically provisioned volume of another provisioner is not ours, even with our CSI driver",
                with_ann(csi(ME), crate::annotations::ANN_PROVISIONED_BY, "x/y"),
                false,
            ),
            (
                "a dynamically provisioned CSI volume of another driver migrated to us is ours",
                with_ann(
                    with_ann(csi("x/y"), crate::annotations::ANN_PROVISIONED_BY, "x/y"),
                    crate::annotations::ANN_MIGRATED_TO,
                    ME,
                ),
                true,
            ),
            (
                "a statically provisioned CSI volume of another driver is not ours, even migrated to us",
                with_ann(csi("x/y"), crate::annotations::ANN_MIGRATED_TO, ME),
                false,
            ),
            (
                "a statically provisioned in-tree volume is never ours",
                pv("v").build(),
                false,
            ),
            (
                "a static in-tree volume migrated to us is ours",
                pv("v").migrated_to(ME).build(),
                true,
            ),
        ];
        for (name, volume, want) in cases {
            assert_eq!(is_ours(&volume, names(&[])), want, "case: {name}");
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
        let fin = || vec![FINALIZER_PV.to_owned()];
        let ours = || pv("v").provisioned_by(ME);
        let cases: Vec<(&str, PersistentVolume, bool, Option<Vec<String>>)> = vec![
            (
                "adds the finalizer to a delete volume when enabled",
                ours().build(),
                true,
                Some(fin()),
            ),
            (
                "keeps an existing finalizer when enabled",
                ours().finalizer(FINALIZER_PV).build(),
                true,
                None,
            ),
            (
                "removes the finalizer when disabled",
                ours().finalizer(FINALIZER_PV).build(),
                false,
                Some(vec![]),
            ),
            (
                "leaves a volume without finalizer alone when disabled",
                ours().build(),
                false,
                None,
            ),
            (
                "removes the finalizer when reclaim policy becomes retain",
                ours()
                    .reclaim_policy("Retain")
                    .finalizer(FINALIZER_PV)
                    .build(),
                true,
                Some(vec![]),
            ),
            (
                "removes the finalizer when reclaim policy is recycle",
                ours()
                    .reclaim_policy("Recycle")
                    .finalizer(FINALIZER_PV)
                    .build(),
                true,
                Some(vec![]),
            ),
            (
                "does not add the finalizer to a retain volume",
                ours().reclaim_policy("Retain").build(),
                true,
                None,
            ),
            (
                "does not add the finalizer to a volume being deleted",
                ours().deleting().build(),
                true,
                None,
            ),
            (
                "keeps other finalizers when removing ours",
                ours().finalizer("other/x").finalizer(FINALIZER_PV).build(),
                false,
                Some(vec!["other/x".to_owned()]),
            ),
            (
                "adds the finalizer to a static in-tree volume migrated to us",
                pv("v").migrated_to(ME).build(),
                true,
                Some(fin()),
            ),
            (
                "leaves volumes of other provisioners alone",
                pv("v").provisioned_by("x/y").build(),
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
}
