//! Crash-safe provisioning: the claim finalizer that records "an asset may exist without
//! a PV", and the cleanup of claims deleted while it was set.
//!
//! The finalizer [`FINALIZER_PROVISIONING`] is on a claim exactly while the driver may
//! have created (or be creating) an asset that no saved PV describes yet:
//!
//! - added right before [`Provisioner::provision`](crate::Provisioner::provision) is
//!   called (and only when [`Config::crash_safe_provisioning`](crate::Config) is on);
//! - removed once the PV is saved, once the driver answered that nothing exists
//!   (`Final`, `Reschedule`, `Ignored`), or once the asset of a deleted claim is deleted.
//!
//! Because the API server keeps a claim with a finalizer, a controller that starts (or
//! restarts) finds every claim with unfinished provisioning in its cache. A live claim is
//! simply provisioned again; a claim being deleted is cleaned up: `provision` is called
//! again (idempotent by `pv_name`, so it finds the asset or tells that none exists), the
//! volume it returns is passed to `delete`, and the finalizer is removed.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};

use super::{
    Context,
    claim::claim_key,
    op::{OpError, api, call, chain, is_api},
};
use crate::{
    DeleteError, ProvisionError, ProvisionOptions,
    annotations::{self, FINALIZER_PROVISIONING},
    events,
};

/// Whether the claim carries the crash-safety finalizer.
pub(crate) fn has_intent(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER_PROVISIONING))
}

fn is_deleting(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some()
}

/// What to do with a claim that carries our finalizer, before the normal claim flow.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not ours to handle here: run the normal flow.
    Continue,
    /// The PV exists (or the claim is bound): the finalizer has served its purpose.
    Remove,
    /// The claim is being deleted and no PV exists: delete the asset, then remove it.
    CleanUp,
}

/// Decides what a claim with our finalizer needs (pure).
pub(crate) fn plan(claim: &PersistentVolumeClaim, ours: bool, volume_exists: bool) -> Plan {
    if !ours || !has_intent(claim) {
        return Plan::Continue;
    }
    let bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if bound || volume_exists {
        Plan::Remove
    } else if is_deleting(claim) {
        Plan::CleanUp
    } else {
        Plan::Continue
    }
}

/// Adds (`present`) or removes our finalizer on the claim `namespace/name` with one
/// strategic-merge patch and no read.
///
/// `metadata.finalizers` has the patch strategy `merge` on the API server (a set of
/// strings): `{"metadata":{"finalizers":[ours]}}` adds ours and keeps every other one,
/// `$deleteFromPrimitiveList/finalizers` removes only ours. Neither needs a
/// resourceVersion, so the binder's writes to the claim never make them conflict. The
/// claim's `uid`, when given, is a precondition: a claim re-created under the same name
/// is never touched (409), and counts as gone.
///
/// Removing from a claim that is gone succeeds. Adding fails when the claim is gone or
/// being deleted (the API server refuses new finalizers then).
pub(crate) async fn set_intent(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    present: bool,
) -> Result<(), OpError> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let limit = ctx.config.provision_timeout;
    let what = || format!("update finalizers of claim {namespace}/{name}");
    let gone = || OpError::ClaimGone {
        claim: format!("{namespace}/{name}"),
    };
    let patch = intent_patch(uid, present);
    let written = api(
        limit,
        what,
        claims.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)),
    )
    .await;
    match written {
        Ok(claim) => {
            ctx.note_own_write(&claim);
            if present && is_deleting(&claim) {
                // A server that accepts it anyway: the next sync of the deleted claim
                // cleans up and removes the finalizer.
                return Err(gone());
            }
            tracing::debug!(pvc = %format!("{namespace}/{name}"), present, "crash-safety finalizer updated");
            Ok(())
        }
        // Gone (404), or another claim under the name (409 on the uid precondition).
        Err(OpError::Api { source, .. })
            if is_api(&source, |s| s.is_not_found() || s.is_conflict()) =>
        {
            if present {
                Err(gone())
            } else {
                Ok(())
            }
        }
        // The API server refuses new finalizers on a claim being deleted.
        Err(OpError::Api { source, .. }) if present && is_api(&source, |s| s.code == 422) => {
            Err(gone())
        }
        Err(err) => Err(err),
    }
}

/// The strategic-merge patch that adds or removes our finalizer (pure).
fn intent_patch(uid: Option<&str>, present: bool) -> serde_json::Value {
    let mut meta = serde_json::Map::new();
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        meta.insert("uid".into(), uid.into());
    }
    let key = if present {
        "finalizers"
    } else {
        "$deleteFromPrimitiveList/finalizers"
    };
    meta.insert(key.into(), serde_json::json!([FINALIZER_PROVISIONING]));
    serde_json::json!({ "metadata": meta })
}

/// [`set_intent`] on the claim `claim` (its namespace, name and uid).
pub(crate) async fn set_claim_intent(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    present: bool,
) -> Result<(), OpError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    set_intent(ctx, namespace, name, claim.metadata.uid.as_deref(), present).await
}

/// Removes our finalizer from `claim`; a failure is logged (the next sync of the claim
/// retries: it then has a PV or a final answer, and the finalizer is removed).
pub(crate) async fn drop_intent(ctx: &Context, claim: &PersistentVolumeClaim) {
    if let Err(err) = set_claim_intent(ctx, claim, false).await {
        tracing::warn!(pvc = %claim_key(claim), error = %chain(&err), "failed to remove the crash-safety finalizer; retried at the next sync");
    }
}

/// Finishes a claim deleted while its provisioning was unfinished: asks the driver for
/// the asset again, deletes it, and removes the finalizer so the claim goes away.
///
/// # Errors
/// An error requeues the claim (the driver still works, deleting failed, the class is
/// missing): the finalizer stays until the asset is known to be gone.
#[tracing::instrument(skip_all, fields(pvc = %claim_key(claim)))]
pub(crate) async fn clean_up(
    ctx: &Context,
    claim: &Arc<PersistentVolumeClaim>,
) -> Result<(), OpError> {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let class_name = annotations::claim_class(claim).to_owned();
    let Some(class) = ctx.caches.class(&class_name) else {
        let err = OpError::ClassNotFound { name: class_name };
        tracing::warn!(error = %chain(&err), "cannot clean up a deleted claim without its class; remove the finalizer by hand once the asset is deleted");
        return Err(err);
    };
    let pv_name = ctx.config.volume_namer.name(claim);
    let options = ProvisionOptions::new(
        Arc::clone(&class),
        pv_name.clone(),
        Arc::clone(claim),
        annotations::selected_node(claim).map(str::to_owned),
    );
    tracing::info!(pv = %pv_name, "claim deleted during provisioning; looking for its asset");
    let limit = ctx.config.provision_timeout;
    let volume = match call(limit, ctx.provisioner.provision(&options)).await {
        Ok(Ok(volume)) => Some(volume),
        Ok(Err(
            ProvisionError::Final(_)
            | ProvisionError::Reschedule(_)
            | ProvisionError::Ignored { .. },
        )) => None,
        Ok(Err(source)) => {
            if matches!(source, ProvisionError::InBackground(_)) {
                ctx.set_in_progress(&uid, Some(Arc::clone(claim)));
            }
            return Err(OpError::Provision {
                class: class_name,
                source,
            });
        }
        Err(err) => {
            if matches!(err, super::op::CallError::Timeout(_)) {
                ctx.set_in_progress(&uid, Some(Arc::clone(claim)));
            }
            return Err(err.into_op("provision (cleanup of a deleted claim)"));
        }
    };
    if let Some(mut volume) = volume {
        super::decorate::ensure_name(&mut volume, &pv_name, claim);
        super::decorate::decorate(ctx, claim, &class, &mut volume);
        match call(ctx.config.deletion_timeout, ctx.provisioner.delete(&volume)).await {
            Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => {
                tracing::info!(pv = %pv_name, "deleted the asset of a claim deleted during provisioning");
            }
            Ok(Err(DeleteError::Failed(source))) => {
                let err = OpError::Delete(source);
                ctx.events
                    .warning(&**claim, events::PROVISIONING_CLEANUP_FAILED, chain(&err))
                    .await;
                return Err(err);
            }
            Err(err) => return Err(err.into_op("delete (cleanup of a deleted claim)")),
        }
    } else {
        tracing::info!(pv = %pv_name, "the driver holds no asset for the deleted claim");
    }
    ctx.set_in_progress(&uid, None);
    // A PV still waiting in the background saver would describe a deleted asset.
    ctx.saver.forget_pending(ctx, &pv_name);
    set_claim_intent(ctx, claim, false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    fn with_intent() -> crate::testing::PvcBuilder {
        pvc("c").uid("u1").finalizer(FINALIZER_PROVISIONING)
    }

    #[test]
    fn plan_decisions() {
        let cases = [
            (
                "a claim without the finalizer runs the normal flow",
                pvc("c").build(),
                true,
                false,
                Plan::Continue,
            ),
            (
                "a live claim with the finalizer is provisioned again",
                with_intent().build(),
                true,
                false,
                Plan::Continue,
            ),
            (
                "a bound claim loses the finalizer",
                with_intent().volume_name("pv").build(),
                true,
                false,
                Plan::Remove,
            ),
            (
                "a claim whose PV exists loses the finalizer",
                with_intent().build(),
                true,
                true,
                Plan::Remove,
            ),
            (
                "a deleted claim whose PV exists loses the finalizer",
                with_intent().deleting().build(),
                true,
                true,
                Plan::Remove,
            ),
            (
                "a deleted claim without PV is cleaned up",
                with_intent().deleting().build(),
                true,
                false,
                Plan::CleanUp,
            ),
            (
                "another provisioner's claim is left alone",
                with_intent().deleting().build(),
                false,
                false,
                Plan::Continue,
            ),
        ];
        for (name, claim, ours, exists, want) in cases {
            assert_eq!(plan(&claim, ours, exists), want, "case: {name}");
        }
    }

    #[test]
    fn intent_patches_touch_only_our_finalizer_and_carry_the_uid() {
        assert_eq!(
            intent_patch(Some("u1"), true),
            serde_json::json!({"metadata": {"uid": "u1", "finalizers": [FINALIZER_PROVISIONING]}})
        );
        assert_eq!(
            intent_patch(None, false),
            serde_json::json!({"metadata": {
                "$deleteFromPrimitiveList/finalizers": [FINALIZER_PROVISIONING]
            }})
        );
        assert!(
            intent_patch(Some(""), true)["metadata"]
                .get("uid")
                .is_none(),
            "an empty uid is no precondition"
        );
    }
}
