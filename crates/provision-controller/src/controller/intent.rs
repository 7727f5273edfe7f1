//! Crash-safe provisioning: the claim finalizer that records "an asset may exist without
//! a PV", and the cleanup of claims that will not get our PV while it was set.
//!
//! The finalizer [`FINALIZER_PROVISIONING`] is on a claim exactly while the driver may
//! have created (or be creating) an asset that no saved PV describes yet:
//!
//! - added right before [`Provisioner::provision`](crate::Provisioner::provision) is
//!   called (and only when [`Config::crash_safe_provisioning`](crate::Config) is on),
//!   together with [`ANN_PROVISIONING_OWNER`] naming this controller;
//! - removed once the PV is saved, once the driver answered that nothing exists
//!   (`Final`, `Reschedule`, `Ignored`, `Infeasible`), or once the asset of a claim that
//!   will not get our PV is deleted.
//!
//! Because the API server keeps a claim with a finalizer, a controller that starts (or
//! restarts) finds every claim with unfinished provisioning in its cache. The claim is
//! the owner's, whatever its storage-provisioner annotation or class say now. A live
//! claim that still asks for our volume is simply provisioned again; any other claim
//! (being deleted, bound to another PV, now asking another provisioner) is cleaned up:
//! `provision` is called again (idempotent by `pv_name`, so it finds the asset or tells
//! that none exists), the volume it returns is passed to `delete` unless a PV of that
//! name exists, and the finalizer is removed. A claim that vanished while its
//! provisioning ran in the background (its finalizers stripped by hand) is cleaned up
//! the same way from the copy the controller kept.

use std::sync::Arc;

use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};

use super::{
    Context, InProgress,
    claim::claim_key,
    op::{Names, OpError, api, call, chain, get_volume, is_api},
};
use crate::{
    DeleteError, ProvisionError, ProvisionOptions,
    annotations::{self, ANN_PROVISIONING_OWNER, FINALIZER_PROVISIONING},
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

/// Whether the claim carries the crash-safety finalizer put there by one of `names`
/// (its [`ANN_PROVISIONING_OWNER`]; a finalizer written without an owner counts as the
/// provisioner's the claim names).
pub(crate) fn owns_intent(claim: &PersistentVolumeClaim, names: Names<'_>) -> bool {
    has_intent(claim)
        && match annotations::provisioning_owner(claim) {
            Some(owner) => names.knows(owner),
            None => annotations::storage_provisioner(claim).is_some_and(|p| names.knows(p)),
        }
}

fn is_deleting(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some()
}

/// What to do with a claim that carries our finalizer, before the normal claim flow.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not ours to handle here: run the normal flow.
    Continue,
    /// Our PV exists (or the claim is bound to it): the finalizer has served its purpose.
    Remove,
    /// The claim will not get our PV (it is being deleted, bound to another PV, or asks
    /// another provisioner now) and our PV does not exist: delete the asset, then the
    /// finalizer.
    CleanUp,
}

/// What [`plan`] needs to know besides the claim.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<'a> {
    /// The claim carries our finalizer ([`owns_intent`]).
    pub(crate) owned: bool,
    /// The name our PV for the claim has.
    pub(crate) pv_name: &'a str,
    /// That PV is cached, or was just saved by us.
    pub(crate) volume_exists: bool,
    /// The claim still asks us for a volume: its storage-provisioner annotation names us,
    /// and so does its class when it is cached.
    pub(crate) wanted: bool,
}

/// Decides what a claim with our finalizer needs (pure).
pub(crate) fn plan(claim: &PersistentVolumeClaim, facts: Facts<'_>) -> Plan {
    if !facts.owned {
        return Plan::Continue;
    }
    if facts.volume_exists {
        return Plan::Remove;
    }
    let bound_to = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    match bound_to {
        Some(volume) if volume == facts.pv_name => Plan::Remove,
        // Bound to another PV: ours, if its asset exists, would never be used.
        Some(_) => Plan::CleanUp,
        None if is_deleting(claim) || !facts.wanted => Plan::CleanUp,
        None => Plan::Continue,
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
    let patch = intent_patch(uid, &ctx.name, present);
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

/// The strategic-merge patch that adds or removes our finalizer and its owner
/// annotation (pure).
fn intent_patch(uid: Option<&str>, owner: &str, present: bool) -> serde_json::Value {
    let mut meta = serde_json::Map::new();
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        meta.insert("uid".into(), uid.into());
    }
    let (key, owner) = if present {
        ("finalizers", serde_json::Value::from(owner))
    } else {
        (
            "$deleteFromPrimitiveList/finalizers",
            serde_json::Value::Null,
        )
    };
    meta.insert(key.into(), serde_json::json!([FINALIZER_PROVISIONING]));
    meta.insert(
        "annotations".into(),
        serde_json::json!({ ANN_PROVISIONING_OWNER: owner }),
    );
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

/// Finishes a claim that will not get our PV while its asset may exist (see [`Plan::CleanUp`]),
/// or one that vanished while its provisioning ran in the background (`claim_gone`: the
/// copy the controller kept): asks the driver for the asset again (with `class`, the
/// class the provisioning started with when known), deletes it unless a PV of its name
/// exists, and removes the finalizer so the claim is released.
///
/// A claim not in progress here is cleaned up only when the qualifier accepts it (with
/// distributed provisioning, another controller may own it).
///
/// # Errors
/// An error requeues the claim (the driver still works, deleting failed, the class is
/// missing, the PV could not be read): the finalizer stays until the asset is known to
/// be gone or named by a PV.
#[tracing::instrument(skip_all, fields(pvc = %claim_key(claim)))]
pub(crate) async fn clean_up(
    ctx: &Context,
    claim: &Arc<PersistentVolumeClaim>,
    class: Option<Arc<StorageClass>>,
    claim_gone: bool,
) -> Result<(), OpError> {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if !ctx.is_in_progress(&uid) && !ctx.qualified(claim).await {
        tracing::debug!("the qualifier refuses the claim: not ours to clean up");
        return Ok(());
    }
    let class_name = annotations::claim_class(claim).to_owned();
    let Some(class) = class else {
        let err = OpError::ClassNotFound { name: class_name };
        tracing::warn!(error = %chain(&err), "cannot clean up a claim without its class; remove the finalizer by hand once the asset is deleted");
        return Err(err);
    };
    let pv_name = ctx.config.volume_namer.name(claim);
    let options = ProvisionOptions::new(
        Arc::clone(&class),
        pv_name.clone(),
        Arc::clone(claim),
        annotations::selected_node(claim).map(str::to_owned),
    );
    tracing::info!(pv = %pv_name, claim_gone, "the claim will not get our PV; looking for its asset");
    let limit = ctx.config.provision_timeout;
    let in_background = || {
        ctx.set_in_progress(
            &uid,
            Some(InProgress::new(Arc::clone(claim), Some(Arc::clone(&class)))),
        );
    };
    let volume = match call(limit, ctx.provisioner.provision(&options)).await {
        Ok(Ok(volume)) => Some(volume),
        Ok(Err(
            ProvisionError::Final(_)
            | ProvisionError::Reschedule(_)
            | ProvisionError::Ignored { .. }
            | ProvisionError::Infeasible(_),
        )) => None,
        Ok(Err(source)) => {
            if matches!(source, ProvisionError::InBackground(_)) {
                in_background();
            }
            return Err(OpError::Provision {
                class: class_name,
                source,
            });
        }
        Err(err) => {
            if matches!(err, super::op::CallError::Timeout(_)) {
                in_background();
            }
            return Err(err.into_op("provision (cleanup)"));
        }
    };
    if let Some(mut volume) = volume {
        super::decorate::ensure_name(&mut volume, &pv_name, claim);
        super::decorate::decorate(ctx, claim, &class, &mut volume);
        let name = volume.metadata.name.clone().unwrap_or_default();
        // Never delete an asset a PV may name: only a confirmed 404 allows it.
        match get_volume(&ctx.client, limit, &name).await? {
            Some(saved) => {
                tracing::info!(pv = %name, "a PV of this name exists: it holds the asset, which is left to it");
                super::save::reuse_existing(
                    ctx,
                    (!claim_gone).then_some(&**claim),
                    &volume,
                    &saved,
                )
                .await;
            }
            None => {
                match call(ctx.config.deletion_timeout, ctx.provisioner.delete(&volume)).await {
                    Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => {
                        tracing::info!(pv = %name, "deleted the asset of a claim that will not get our PV");
                    }
                    Ok(Err(DeleteError::Failed(source))) => {
                        let err = OpError::Delete(source);
                        if !claim_gone {
                            ctx.events
                                .warning(&**claim, events::PROVISIONING_CLEANUP_FAILED, chain(&err))
                                .await;
                        }
                        return Err(err);
                    }
                    Err(err) => return Err(err.into_op("delete (cleanup)")),
                }
            }
        }
    } else {
        tracing::info!(pv = %pv_name, "the driver holds no asset for the claim");
    }
    ctx.set_in_progress(&uid, None);
    // A PV still waiting in the background saver would describe a deleted asset.
    ctx.saver.forget_pending(ctx, &pv_name);
    if claim_gone {
        return Ok(());
    }
    set_claim_intent(ctx, claim, false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    const ME: &str = "example.com/me";

    fn names() -> Names<'static> {
        Names {
            primary: ME,
            additional: &[],
        }
    }

    fn with_intent() -> crate::testing::PvcBuilder {
        pvc("c")
            .uid("u1")
            .provisioner(ME)
            .finalizer(FINALIZER_PROVISIONING)
            .annotation(ANN_PROVISIONING_OWNER, ME)
    }

    #[test]
    fn plan_decisions() {
        let facts = |claim: &PersistentVolumeClaim, exists: bool, wanted: bool| Facts {
            owned: owns_intent(claim, names()),
            pv_name: "pvc-u1",
            volume_exists: exists,
            wanted,
        };
        // (case, claim, our PV exists, the claim still asks us, plan)
        let cases = [
            (
                "a claim without the finalizer runs the normal flow",
                pvc("c").provisioner(ME).build(),
                false,
                true,
                Plan::Continue,
            ),
            (
                "a live claim with the finalizer is provisioned again",
                with_intent().build(),
                false,
                true,
                Plan::Continue,
            ),
            (
                "a claim bound to our PV loses the finalizer",
                with_intent().volume_name("pvc-u1").build(),
                false,
                true,
                Plan::Remove,
            ),
            (
                "a claim bound to another PV is cleaned up",
                with_intent().volume_name("static-pv").build(),
                false,
                true,
                Plan::CleanUp,
            ),
            (
                "a claim bound to another PV while our PV exists loses the finalizer",
                with_intent().volume_name("static-pv").build(),
                true,
                true,
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
                false,
                true,
                Plan::CleanUp,
            ),
            (
                "a live claim that now asks another provisioner is cleaned up",
                with_intent().provisioner("example.com/other").build(),
                false,
                false,
                Plan::CleanUp,
            ),
            (
                "a claim whose finalizer another provisioner put there is left alone",
                with_intent()
                    .annotation(ANN_PROVISIONING_OWNER, "example.com/other")
                    .deleting()
                    .build(),
                false,
                true,
                Plan::Continue,
            ),
            (
                "a finalizer without owner belongs to the provisioner the claim names",
                pvc("c")
                    .uid("u1")
                    .provisioner("example.com/other")
                    .finalizer(FINALIZER_PROVISIONING)
                    .deleting()
                    .build(),
                false,
                false,
                Plan::Continue,
            ),
        ];
        for (name, claim, exists, wanted, want) in cases {
            assert_eq!(
                plan(&claim, facts(&claim, exists, wanted)),
                want,
                "case: {name}"
            );
        }
    }

    #[test]
    fn a_claim_with_our_finalizer_is_ours_whatever_provisioner_it_names_now() {
        let renamed = with_intent().provisioner("example.com/other").build();
        assert!(owns_intent(&renamed, names()));
        let unnamed = {
            let mut c = with_intent().build();
            c.metadata
                .annotations
                .as_mut()
                .unwrap()
                .remove(annotations::ANN_STORAGE_PROVISIONER);
            c
        };
        assert!(owns_intent(&unnamed, names()));
        assert!(!owns_intent(&pvc("c").provisioner(ME).build(), names()));
    }

    #[test]
    fn intent_patches_touch_only_our_finalizer_and_owner_and_carry_the_uid() {
        assert_eq!(
            intent_patch(Some("u1"), ME, true),
            serde_json::json!({"metadata": {
                "uid": "u1",
                "finalizers": [FINALIZER_PROVISIONING],
                "annotations": {ANN_PROVISIONING_OWNER: ME}
            }})
        );
        assert_eq!(
            intent_patch(None, ME, false),
            serde_json::json!({"metadata": {
                "$deleteFromPrimitiveList/finalizers": [FINALIZER_PROVISIONING],
                "annotations": {ANN_PROVISIONING_OWNER: null}
            }})
        );
        assert!(
            intent_patch(Some(""), ME, true)["metadata"]
                .get("uid")
                .is_none(),
            "an empty uid is no precondition"
        );
    }
}
