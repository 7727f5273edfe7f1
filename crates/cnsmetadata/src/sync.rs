//! Reads from the caches which CNS volume is behind a volume name, and sends one update.

use kube_client::ResourceExt;
use kube_controller_kit::error::chain;
use kube_runtime::reflector::ObjectRef;
use tracing::{debug, info, warn};

use crate::{
    context::Context,
    plan::{Failed, Resolved, Target, referred_entities},
    record::PushedEntry,
    resource::{CnsVolumeMetadata, EntityType},
};

/// Resolves the supervisor claim `volume` of `namespace` through the caches.
pub(crate) fn resolve(ctx: &Context, namespace: &str, volume: &str) -> Resolved {
    let claim_key = ObjectRef::new(volume).within(namespace);
    let Some(claim) = ctx.claims.get(&claim_key) else {
        return Resolved::Missing(format!("persistentvolumeclaims {volume:?} not found"));
    };
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if pv_name.is_empty() {
        return Resolved::Missing(format!(
            "persistentvolumeclaim {volume:?} is not bound to a volume"
        ));
    }
    let Some(pv) = ctx.volumes.get(&ObjectRef::new(&pv_name)) else {
        return Resolved::Missing(format!("persistentvolumes {pv_name:?} not found"));
    };
    let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
    match csi.filter(|c| c.driver == ctx.config.csi_driver.as_str()) {
        Some(csi) if !csi.volume_handle.is_empty() => Resolved::Volume(csi.volume_handle.clone()),
        Some(_) => Resolved::Missing(format!(
            "persistentvolume {pv_name:?} has an empty volume handle"
        )),
        None => {
            debug!(pv = %pv_name, "volume of another driver; skipped");
            Resolved::OtherDriver
        }
    }
}

/// Resolves every volume name of a valid spec, pairing it with its reference.
pub(crate) fn targets(object: &CnsVolumeMetadata, ctx: &Context) -> Vec<Target> {
    let spec = &object.spec;
    let namespace = object.namespace().unwrap_or_default();
    let mut references = referred_entities(spec, &ctx.config).into_iter();
    spec.volume_names
        .iter()
        .map(|volume| {
            // Validation guarantees one reference per volume name.
            let reference = references.next();
            let resolved = resolve(ctx, &namespace, volume);
            let entry = match &resolved {
                Resolved::Volume(id) => Some(PushedEntry::new(spec, volume, id, reference)),
                _ => None,
            };
            Target {
                volume_name: volume.clone(),
                resolved,
                entry,
            }
        })
        .collect()
}

/// The entries an *invalid* spec may stand for, when the object has no record (it was
/// last written by a version that kept none): every volume that resolves, when the entity
/// itself can be named on CNS. References that are missing or of an unknown type are left
/// out rather than guessed.
pub(crate) fn best_effort_entries(object: &CnsVolumeMetadata, ctx: &Context) -> Vec<PushedEntry> {
    let spec = &object.spec;
    let known = !matches!(spec.entity_type, EntityType::Other(_));
    if !known || spec.entity_name.is_empty() || spec.guest_cluster_id.is_empty() {
        return Vec::new();
    }
    let namespace = object.namespace().unwrap_or_default();
    let references = referred_entities(spec, &ctx.config);
    spec.volume_names
        .iter()
        .enumerate()
        .filter_map(|(index, volume)| match resolve(ctx, &namespace, volume) {
            Resolved::Volume(id) => {
                let reference = references
                    .get(index)
                    .filter(|r| !matches!(r.entity_type, EntityType::Other(_)))
                    .cloned();
                Some(PushedEntry::new(spec, volume, &id, reference))
            }
            _ => None,
        })
        .collect()
}

/// Adds (or, with `delete`, removes) `entry` on CNS within the backend timeout. While
/// removing, a volume CNS does not know counts as done.
///
/// # Errors
/// The message for the status, and whether the push may still land.
pub(crate) async fn push(ctx: &Context, entry: &PushedEntry, delete: bool) -> Result<(), Failed> {
    let update = entry.update(delete, &ctx.config);
    let timeout = ctx.config.backend_timeout;
    let sent = ctx.now();
    let outcome = tokio::time::timeout(timeout, ctx.backend.update_volume_metadata(&update)).await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) if delete && error.is_not_found() => {
            info!(volume_id = %update.volume_id, "volume not found in cns; already deleted");
            Ok(())
        }
        Ok(Err(error)) => {
            warn!(volume_id = %update.volume_id, delete, error = %chain(&error), "cns update failed");
            Err(Failed {
                message: chain(&error),
                unanswered: error.may_land_later().then_some(sent),
            })
        }
        Err(_) => {
            warn!(volume_id = %update.volume_id, delete, ?timeout, "cns update timed out");
            Err(Failed {
                message: format!("cns volume metadata update timed out after {timeout:?}"),
                unanswered: Some(sent),
            })
        }
    }
}
