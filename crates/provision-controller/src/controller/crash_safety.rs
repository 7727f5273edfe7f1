//! Crash-safe provisioning: the claim finalizer that records "an asset may exist without
//! a PV", and the cleanup of claims that will not get our PV while it was set.
//!
//! The finalizer [`FINALIZER_PROVISIONING`] is on a claim exactly while the driver may
//! have created (or be creating) an asset that no saved PV describes yet:
//!
//! - added right before [`Provisioner::provision`](crate::Provisioner::provision) is
//!   called (and only when [`Config::crash_safe_provisioning`](crate::Config) is on), in
//!   one patch with [`ANN_PROVISIONING_OWNER`] naming this controller and
//!   [`ANN_PROVISIONING_CLASS`], a snapshot of the class the provisioning starts with;
//! - removed (with both annotations) once a saved PV records the asset, or once the driver
//!   answered that nothing exists (`Failed`, `Reschedule`, `Ignored`, `Infeasible`).
//!
//! Because the API server keeps a claim with a finalizer, a controller that starts (or
//! restarts) finds every claim with unfinished provisioning in its cache. The claim is
//! the owner's, whatever its storage-provisioner annotation or class say now, and it is
//! driven with the class its provisioning started with (the one remembered in memory,
//! else the snapshot, else the class as it is now). A live claim that still asks for our
//! volume is simply provisioned again.
//!
//! Any other claim (being deleted, bound to another PV, now asking another provisioner)
//! is cleaned up **by saving, not by deleting**: `provision` is called again (idempotent
//! by `pv_name`, so it finds the asset or tells that none exists), and the volume it
//! returns is saved as a PV, decorated as usual (claimRef to the claim and its uid,
//! provisioned-by, class, and the class's reclaim policy). The PV name is the one arbiter
//! every replica agrees on: if a PV of that name exists already, the save counts as done
//! (and the driver releases ours when it names another asset,
//! [`Provisioner::delete_duplicate`](crate::Provisioner::delete_duplicate)). Then the
//! finalizer is removed. Deleting the asset instead would race with another replica
//! saving a PV that names that very asset.
//!
//! The saved PV is then reclaimed by the normal volume flow once the PV controller
//! releases it: a deleted (or vanished) claim makes it `Released`, and so does a claim
//! bound to another PV (kube-controller-manager releases a dynamically provisioned PV
//! with reclaim policy `Delete` whose claim is bound elsewhere; with `Retain` it is
//! unbound and kept, as the class asks). A live, unbound claim that now asks another
//! provisioner simply gets our PV bound: a real volume, not a leak. A claim that vanished
//! while its provisioning ran in the background (its finalizers stripped by hand) is
//! cleaned up the same way from the copy the controller kept; and, since that controller
//! may stop before it has, from the last state every controller's claim watch saw when the
//! claim was deleted while it showed [`ANN_PROVISIONING_OWNER`] without the finalizer
//! (standbys record it too, and clean up once they lead:
//! [`Context::record_vanished`](super::Context::record_vanished)).
//!
//! A live claim whose finalizers were stripped by hand keeps [`ANN_PROVISIONING_OWNER`]
//! (written and removed with the finalizer, so alone it means "stripped"): it is handled
//! as if the finalizer were still there ([`stripped_intent`]), so that a claim bound to
//! another PV meanwhile still gets its asset recorded and reclaimed after the process
//! that ran the provisioning is gone.
//!
//! In a claim's way: one step, [`before_provisioning`], before the normal flow of
//! `claim` (which then adds and drops the finalizer around the driver call with
//! [`set_claim_intent`] and [`drop_intent`]).

use std::sync::Arc;

use k8s_openapi::{
    api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};

use super::{
    Context, InProgress, State,
    calls::{OpError, api, chain, is_api, is_other_uid},
    names::Names,
    volume_object,
};
use crate::{
    ProvisionError, ProvisionOptions,
    annotations::{
        ANN_CLEANUP_RECORD, ANN_PROVISIONING_CLASS, ANN_PROVISIONING_OWNER, ClaimView,
        FINALIZER_PROVISIONING,
    },
    events,
};

/// The largest class snapshot written to a claim, in bytes of JSON.
const MAX_CLASS_SNAPSHOT: usize = 16 * 1024;

/// Whether the claim carries the crash-safety finalizer put there by one of `names`
/// (its [`ANN_PROVISIONING_OWNER`]; a finalizer written without an owner counts as the
/// provisioner's the claim names), or what is left of it once the finalizer was stripped
/// by hand ([`stripped_intent`]).
pub(crate) fn owns_intent(claim: &ClaimView, names: Names<'_>) -> bool {
    if !claim.has_intent {
        return stripped_intent(claim, names);
    }
    match &claim.owner {
        Some(owner) => names.knows(owner),
        None => claim
            .storage_provisioner
            .as_deref()
            .is_some_and(|p| names.knows(p)),
    }
}

/// Whether the claim carries one of `names` in [`ANN_PROVISIONING_OWNER`] without the
/// crash-safety finalizer. Both are written and removed in one patch, so the finalizer was
/// stripped by hand (or by a tool that clears finalizers) while the provisioning may have
/// run: the driver may hold an asset for the claim that no PV records. Such a claim is
/// handled as if it still had the finalizer (the cleanup and the removal remove the
/// annotations; a live claim provisioned again gets the finalizer back), so that a claim
/// bound to another PV meanwhile still gets its asset recorded and reclaimed even when
/// the process that ran the provisioning is gone.
pub(crate) fn stripped_intent(claim: &ClaimView, names: Names<'_>) -> bool {
    !claim.has_intent && claim.owner.as_deref().is_some_and(|o| names.knows(o))
}

fn is_deleting(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some()
}

/// The JSON of [`ANN_PROVISIONING_CLASS`]: the fields of `class` a driver reads. `None`
/// (logged) when it exceeds [`MAX_CLASS_SNAPSHOT`]: the claim then depends on the class
/// as it is at each sync, as claims written by older versions do.
pub(crate) fn class_snapshot(class: &StorageClass) -> Option<String> {
    let snapshot = StorageClass {
        metadata: ObjectMeta {
            name: class.metadata.name.clone(),
            uid: class.metadata.uid.clone(),
            ..ObjectMeta::default()
        },
        provisioner: class.provisioner.clone(),
        parameters: class.parameters.clone(),
        reclaim_policy: class.reclaim_policy.clone(),
        mount_options: class.mount_options.clone(),
        volume_binding_mode: class.volume_binding_mode.clone(),
        allowed_topologies: class.allowed_topologies.clone(),
        ..StorageClass::default()
    };
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    match serde_json::to_string(&snapshot) {
        Ok(json) if json.len() <= MAX_CLASS_SNAPSHOT => Some(json),
        Ok(json) => {
            tracing::warn!(
                storageclass = class_name,
                bytes = json.len(),
                limit = MAX_CLASS_SNAPSHOT,
                "the class is too large to be recorded on the claim; its provisioning will need the class to exist until it is done"
            );
            None
        }
        Err(err) => {
            tracing::warn!(storageclass = class_name, error = %err, "the class cannot be recorded on the claim");
            None
        }
    }
}

/// The class snapshot [`ANN_PROVISIONING_CLASS`] the claim carries; `None` when it has
/// none or it is no StorageClass (logged: an annotation edited by hand is ignored).
pub(crate) fn recorded_class(claim: &ClaimView) -> Option<Arc<StorageClass>> {
    let json = claim.recorded_class.as_deref()?;
    match serde_json::from_str::<StorageClass>(json) {
        Ok(class) => Some(Arc::new(class)),
        Err(err) => {
            tracing::warn!(pvc = %claim.key, error = %err, annotation = ANN_PROVISIONING_CLASS,
                "the class recorded on the claim is not a StorageClass; ignoring it");
            None
        }
    }
}

/// Whether the driver's answer says that it holds no asset for the claim (`Failed`,
/// `Reschedule`, `Ignored`, `Infeasible`): then the finalizer has nothing to record.
pub(crate) fn holds_no_asset(answer: &ProvisionError) -> bool {
    match answer {
        ProvisionError::Failed(_)
        | ProvisionError::Reschedule(_)
        | ProvisionError::Ignored { .. }
        | ProvisionError::Infeasible(_) => true,
        ProvisionError::InBackground(_) | ProvisionError::NoChange(_) => false,
    }
}

/// The class to provision (or clean up) the claim with: the class its provisioning
/// started with, as remembered in memory (`entry`) or recorded on the claim with our
/// finalizer ([`recorded_class`]), else its class as cached now. A claim in progress must
/// not depend on a class that may have been deleted or changed since its asset was asked
/// for.
pub(crate) fn provisioning_class(
    ctx: &Context,
    claim: &ClaimView,
    entry: Option<&InProgress>,
) -> Option<Arc<StorageClass>> {
    entry
        .and_then(|e| e.class.clone())
        .or_else(|| {
            owns_intent(claim, ctx.names())
                .then(|| recorded_class(claim))
                .flatten()
        })
        .or_else(|| ctx.caches.class(&claim.class_name))
}

/// What the claim's crash-safety finalizer asks for (see [`plan`]).
pub(crate) fn intent_plan(ctx: &Context, claim: &ClaimView) -> Plan {
    let owned = owns_intent(claim, ctx.names());
    if !owned {
        return Plan::Continue;
    }
    let pv_name = ctx.config.volume_namer.name(&claim.claim);
    let facts = Facts {
        owned,
        pv_name: &pv_name,
        volume_exists: ctx.caches.volume_exists(&pv_name),
        wanted: wanted(ctx, claim),
    };
    plan(&claim.claim, facts)
}

/// Whether the claim still asks us for a volume: its storage-provisioner annotation names
/// us, and so does its class when it is cached.
fn wanted(ctx: &Context, claim: &ClaimView) -> bool {
    let names = ctx.names();
    claim
        .storage_provisioner
        .as_deref()
        .is_some_and(|p| names.knows(p))
        && ctx
            .caches
            .class(&claim.class_name)
            .is_none_or(|c| names.knows(&c.provisioner))
}

/// How [`before_provisioning`] left the claim's sync.
pub(crate) enum Step {
    /// Crash safety finished the sync (a cleanup ran, or the finalizer was removed):
    /// `state` is what the claim must remember, `class` the class the cleanup ran with.
    Done {
        state: State,
        class: Option<Arc<StorageClass>>,
        result: Result<(), OpError>,
    },
    /// The normal flow runs, with the class its provisioning started with
    /// ([`provisioning_class`]).
    Provision { class: Option<Arc<StorageClass>> },
}

/// The crash-safety step of a claim's sync, before the normal flow: a claim that vanished
/// while its provisioning runs in the background (`gone`: `claim` is the copy kept in
/// `entry`) is cleaned up; a claim with our finalizer gets what [`intent_plan`] asks for
/// (the finalizer removed, or a cleanup); any other goes on to the normal flow.
pub(crate) async fn before_provisioning(
    ctx: &Context,
    claim: &ClaimView,
    entry: Option<&InProgress>,
    gone: bool,
) -> Step {
    let done = |result| Step::Done {
        state: State::NoChange,
        class: None,
        result,
    };
    let clean_up_now = if gone {
        // With crash-safe provisioning nothing would record its asset: cleaned up now.
        tracing::info!(pvc = %claim.key, "claim vanished while its provisioning runs in the background; cleaning up");
        true
    } else {
        match intent_plan(ctx, claim) {
            Plan::Continue => false,
            // The cache has not caught up with our removal yet.
            Plan::Remove | Plan::CleanUp if ctx.wrote_intent_removed(&claim.uid) => {
                return done(Ok(()));
            }
            Plan::Remove => {
                return done(set_claim_intent(ctx, &claim.claim, Intent::Remove).await);
            }
            Plan::CleanUp => true,
        }
    };
    let class = provisioning_class(ctx, claim, entry);
    if !clean_up_now {
        return Step::Provision { class };
    }
    // Boxed: the cleanup is a large future (see `claim::provision`).
    let (state, result) = Box::pin(clean_up(ctx, claim, class.clone(), gone)).await;
    Step::Done {
        state,
        class,
        result,
    }
}

/// What to do with a claim that carries our finalizer, before the normal claim flow.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not ours to handle here: run the normal flow.
    Continue,
    /// Our PV exists (or the claim is bound to it): the finalizer has served its purpose.
    Remove,
    /// The claim will not get our PV the normal way (it is being deleted, bound to another
    /// PV, or asks another provisioner now) and our PV does not exist: save a PV for the
    /// asset, if any, then remove the finalizer ([`clean_up`]).
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

/// What [`set_intent`] writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Intent<'a> {
    /// The finalizer, the owner, and a snapshot of the class the provisioning starts with.
    Add(&'a StorageClass),
    /// Removes the finalizer, the owner and the class snapshot.
    Remove,
}

/// Adds or removes our finalizer on the claim `namespace/name` with one strategic-merge
/// patch and no read.
///
/// `metadata.finalizers` has the patch strategy `merge` on the API server (a set of
/// strings): `{"metadata":{"finalizers":[ours]}}` adds ours and keeps every other one,
/// `$deleteFromPrimitiveList/finalizers` removes only ours. Neither needs a
/// resourceVersion, so the binder's writes to the claim never make them conflict. The
/// claim's `uid`, when given, is a precondition: a claim re-created under the same name
/// is never touched (a real server answers 422, the uid being immutable; a 409 is taken
/// the same way), and counts as gone.
///
/// Removing from a claim that is gone succeeds; a 409 counts as gone only when a read
/// shows another claim under the name (or none), else it is an error and retried. Adding
/// fails with [`OpError::ClaimGone`] when the claim is gone or being deleted (the API
/// server refuses new finalizers then), and with [`OpError::AddedToDeletedClaim`] when a
/// server added it to a claim being deleted all the same.
pub(crate) async fn set_intent(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    intent: Intent<'_>,
) -> Result<(), OpError> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let limit = ctx.config.provision_timeout;
    let what = || format!("update finalizers of claim {namespace}/{name}");
    let gone = || OpError::ClaimGone {
        claim: format!("{namespace}/{name}"),
    };
    let (present, snapshot) = match intent {
        Intent::Add(class) => (true, class_snapshot(class)),
        Intent::Remove => (false, None),
    };
    let patch = intent_patch(uid, &ctx.name, present, snapshot.as_deref());
    // The watch event of this write may come before its answer.
    let own = uid
        .filter(|u| !u.is_empty())
        .map(|u| ctx.begin_own_write(u));
    let written = api(
        limit,
        what,
        claims.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)),
    )
    .await;
    match written {
        Ok(claim) => {
            match own {
                Some(own) if claim.metadata.uid.as_deref() == uid => own.done(&claim),
                _ => ctx.note_own_write(&claim),
            }
            if present && is_deleting(&claim) {
                // A server that accepts it anyway: the next sync of the deleted claim
                // cleans up and removes the finalizer.
                return Err(OpError::AddedToDeletedClaim {
                    claim: format!("{namespace}/{name}"),
                });
            }
            tracing::debug!(pvc = %format!("{namespace}/{name}"), present, "crash-safety finalizer updated");
            Ok(())
        }
        Err(OpError::Api { source, .. }) if present && is_api(&source, |s| s.is_not_found()) => {
            Err(gone())
        }
        Err(OpError::Api { source, .. }) if is_api(&source, |s| s.is_not_found()) => Ok(()),
        // Another claim under the name: a real server answers the uid of a patch with a 422
        // (the uid is immutable), not a 409. The claim we wrote for is gone.
        Err(OpError::Api { source, .. }) if is_api(&source, is_other_uid) => {
            if present {
                Err(gone())
            } else {
                Ok(())
            }
        }
        // Another claim under the name (the uid precondition), or a conflict of another
        // kind; adding is retried by the caller either way.
        Err(OpError::Api { source, .. }) if present && is_api(&source, |s| s.is_conflict()) => {
            Err(gone())
        }
        Err(OpError::Api { source, what }) if is_api(&source, |s| s.is_conflict()) => {
            // Our finalizer must not stay behind on the claim after a conflict of another
            // kind: only a read tells that the claim is gone.
            let read = api(
                limit,
                || format!("get claim {namespace}/{name}"),
                claims.get_opt(name),
            )
            .await?;
            match read {
                Some(found) if uid.is_none_or(|u| found.metadata.uid.as_deref() == Some(u)) => {
                    Err(OpError::Api { what, source })
                }
                _ => Ok(()),
            }
        }
        // The API server refuses new finalizers on a claim being deleted.
        Err(OpError::Api { source, .. }) if present && is_api(&source, |s| s.code == 422) => {
            Err(gone())
        }
        Err(err) => Err(err),
    }
}

/// The strategic-merge patch that adds (with the class snapshot `class`, when given) or
/// removes our finalizer and its annotations (pure).
fn intent_patch(
    uid: Option<&str>,
    owner: &str,
    present: bool,
    class: Option<&str>,
) -> serde_json::Value {
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
    let annotations = if present {
        let mut added = serde_json::json!({ ANN_PROVISIONING_OWNER: owner });
        if let Some(class) = class {
            added[ANN_PROVISIONING_CLASS] = class.into();
        }
        added
    } else {
        serde_json::json!({ ANN_PROVISIONING_OWNER: null, ANN_PROVISIONING_CLASS: null })
    };
    meta.insert("annotations".into(), annotations);
    serde_json::json!({ "metadata": meta })
}

/// [`set_intent`] on the claim `claim` (its namespace, name and uid).
pub(crate) async fn set_claim_intent(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    intent: Intent<'_>,
) -> Result<(), OpError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    set_intent(ctx, namespace, name, claim.metadata.uid.as_deref(), intent).await
}

/// Removes our finalizer from `claim`; a failure is logged (the next sync of the claim
/// retries: it then has a PV or a final answer, and the finalizer is removed).
pub(crate) async fn drop_intent(ctx: &Context, claim: &ClaimView) {
    if let Err(err) = set_claim_intent(ctx, &claim.claim, Intent::Remove).await {
        tracing::warn!(pvc = %claim.key, error = %chain(&err), "failed to remove the crash-safety finalizer; retried at the next sync");
    }
}

/// Finishes a claim that will not get our PV the normal way while its asset may exist
/// (see [`Plan::CleanUp`]), or one that vanished while its provisioning ran in the
/// background (`claim_gone`: the copy the controller kept): asks the driver for the asset
/// again (with `class`, the class the provisioning started with when known), saves a PV
/// for it (see the module docs: the PV controller releases it and the volume flow
/// reclaims it), and removes the finalizer so the claim is released. Returns, with the
/// result, what the claim must remember: [`State::InBackground`] while the driver may
/// still work on it, [`State::Finished`] once a PV records the asset or none exists.
///
/// A claim not in progress here is cleaned up only when the qualifier accepts it (with
/// distributed provisioning, another controller may own it); a refusal is asked again
/// after [`Config::resync_period`](crate::Config).
///
/// # Errors
/// An error requeues the claim (the driver still works, the PV could not be saved, the
/// class is missing): the finalizer stays until a PV records the asset or the driver
/// answers that none exists.
#[tracing::instrument(skip_all, fields(pvc = %claim.key))]
async fn clean_up(
    ctx: &Context,
    claim: &ClaimView,
    class: Option<Arc<StorageClass>>,
    claim_gone: bool,
) -> (State, Result<(), OpError>) {
    let uid = &claim.uid;
    if !ctx.is_in_progress(uid) && !ctx.qualified(&claim.claim).await {
        tracing::debug!("the qualifier refuses the claim: not ours to clean up now");
        let refused = OpError::Refused {
            claim: claim.key.clone(),
            wait: ctx.config.resync_period,
        };
        return (State::NoChange, Err(refused));
    }
    let class_name = claim.class_name.clone();
    let Some(class) = class else {
        let err = OpError::ClassNotFound { name: class_name };
        tracing::warn!(error = %chain(&err), "cannot look for the asset of a claim without its class; retried until the class exists again");
        if !claim_gone {
            let note = format!(
                "Cannot look for the volume provisioned for claim {}: {}, and the claim records no class. \
                 The claim keeps finalizer {FINALIZER_PROVISIONING} until the class exists again; \
                 remove the finalizer by hand only once no volume exists for it.",
                claim.key,
                chain(&err)
            );
            ctx.events
                .warning(&*claim.claim, events::PROVISIONING_CLEANUP_FAILED, note)
                .await;
        }
        return (State::NoChange, Err(err));
    };
    let pv_name = ctx.config.volume_namer.name(&claim.claim);
    let options = ProvisionOptions::new(
        Arc::clone(&class),
        pv_name.clone(),
        Arc::clone(&claim.claim),
        claim.selected_node.clone(),
    )
    .for_cleanup();
    tracing::info!(pv = %pv_name, claim_gone, "the claim will not get our PV the normal way; looking for its asset");
    let limit = ctx.config.provision_timeout;
    let answer = ctx
        .driver_slots
        .provisioning(limit, ctx.provisioner.provision(&options))
        .await;
    let volume = match answer {
        Ok(Ok(volume)) => Some(volume),
        Ok(Err(source)) if holds_no_asset(&source) => None,
        Ok(Err(source)) => {
            let state = match source {
                ProvisionError::InBackground(_) => State::InBackground,
                _ => State::NoChange,
            };
            let err = OpError::Provision {
                class: class_name,
                source,
            };
            return (state, Err(err));
        }
        Err(err) => {
            let state = match err {
                super::calls::CallError::Timeout(_) => State::InBackground,
                super::calls::CallError::Panicked(_) => State::NoChange,
            };
            return (state, Err(err.into_op("provision (cleanup)")));
        }
    };
    if let Some(mut volume) = volume {
        // Only a claimRef with the claim's uid gets the PV released once the claim is gone.
        if let Err(err) = volume_object::claim_reference(claim) {
            return (State::NoChange, Err(err));
        }
        volume_object::ensure_name(&mut volume, &pv_name, claim);
        // The class decides what happens to the asset once the PV is released.
        let policy = class.reclaim_policy.as_deref().unwrap_or("Delete");
        volume
            .spec
            .get_or_insert_with(Default::default)
            .persistent_volume_reclaim_policy = Some(policy.to_owned());
        volume_object::decorate(ctx, claim, &class, &mut volume, false);
        volume
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANN_CLEANUP_RECORD.to_owned(), "true".to_owned());
        let name = volume.metadata.name.clone().unwrap_or_default();
        tracing::info!(pv = %name, "saving a PV that records the asset; it is reclaimed once released");
        let events_claim = (!claim_gone).then_some(&*claim.claim);
        if let Err(err) = volume_object::create(ctx, &volume, events_claim).await {
            if let Some(events_claim) = events_claim {
                let note = format!(
                    "Error saving a PV for the volume of claim {}, which will not get it: {}. Retrying.",
                    claim.key,
                    chain(&err)
                );
                ctx.events
                    .warning(events_claim, events::PROVISIONING_CLEANUP_FAILED, note)
                    .await;
            }
            return (State::NoChange, Err(err));
        }
        ctx.caches.mark_saved(&name);
    } else {
        // A create sent before (by this or another replica, which may have stopped since
        // and forgotten it) may still land: "none" is believed once it can no longer.
        if let Some(wait) = ctx
            .provisioner
            .late_asset_window()
            .and_then(|window| ctx.cleanup_wait(uid, window))
        {
            let settling = OpError::Settling {
                claim: claim.key.clone(),
                wait,
            };
            return (State::NoChange, Err(settling));
        }
        tracing::info!(pv = %pv_name, "the driver holds no asset for the claim");
    }
    ctx.forget_cleanup(uid);
    // Saved now, or nothing exists: a PV waiting in the background saver is not needed.
    ctx.saver.forget_pending(ctx, &pv_name);
    if claim_gone {
        return (State::Finished, Ok(()));
    }
    (
        State::Finished,
        set_claim_intent(ctx, &claim.claim, Intent::Remove).await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    const ME: &str = "example.com/me";

    /// The claim as its sync reads it.
    fn view(claim: &PersistentVolumeClaim) -> ClaimView {
        ClaimView::new(Arc::new(claim.clone()))
    }

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

    /// A claim of ours whose finalizer was stripped by hand: only the owner annotation
    /// is left.
    fn stripped() -> crate::testing::PvcBuilder {
        pvc("c")
            .uid("u1")
            .provisioner(ME)
            .annotation(ANN_PROVISIONING_OWNER, ME)
    }

    #[test]
    fn plan_decisions() {
        let facts = |claim: &PersistentVolumeClaim, exists: bool, wanted: bool| Facts {
            owned: owns_intent(&view(claim), names()),
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
                "a claim whose finalizer was stripped by hand, bound to another PV, is \
                 cleaned up (its owner annotation is left)",
                stripped().volume_name("static-pv").build(),
                false,
                true,
                Plan::CleanUp,
            ),
            (
                "a deleted claim whose finalizer was stripped by hand is cleaned up",
                stripped().deleting().build(),
                false,
                true,
                Plan::CleanUp,
            ),
            (
                "a live claim whose finalizer was stripped by hand is provisioned again",
                stripped().build(),
                false,
                true,
                Plan::Continue,
            ),
            (
                "a claim whose finalizer was stripped by hand, bound to our PV, loses the \
                 annotations",
                stripped().volume_name("pvc-u1").build(),
                false,
                true,
                Plan::Remove,
            ),
            (
                "a claim stripped of another provisioner's finalizer is left alone",
                stripped()
                    .annotation(ANN_PROVISIONING_OWNER, "example.com/other")
                    .volume_name("static-pv")
                    .build(),
                false,
                true,
                Plan::Continue,
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
        assert!(owns_intent(&view(&renamed), names()));
        let unnamed = {
            let mut c = with_intent().build();
            c.metadata
                .annotations
                .as_mut()
                .unwrap()
                .remove(crate::annotations::ANN_STORAGE_PROVISIONER);
            c
        };
        assert!(owns_intent(&view(&unnamed), names()));
        assert!(!owns_intent(
            &view(&pvc("c").provisioner(ME).build()),
            names()
        ));
    }

    #[test]
    fn an_owner_annotation_left_without_its_finalizer_is_a_stripped_intent() {
        assert!(stripped_intent(&view(&stripped().build()), names()));
        assert!(owns_intent(&view(&stripped().build()), names()));
        assert!(
            !stripped_intent(&view(&with_intent().build()), names()),
            "the finalizer is there: not stripped"
        );
        let theirs = stripped()
            .annotation(ANN_PROVISIONING_OWNER, "example.com/other")
            .build();
        assert!(!stripped_intent(&view(&theirs), names()));
        assert!(!owns_intent(&view(&theirs), names()));
        assert!(
            !owns_intent(&view(&pvc("c").uid("u1").provisioner(ME).build()), names()),
            "no owner annotation, no finalizer: nothing to clean up"
        );
    }

    #[test]
    fn intent_patches_touch_only_our_finalizer_and_annotations_and_carry_the_uid() {
        assert_eq!(
            intent_patch(Some("u1"), ME, true, Some("{}")),
            serde_json::json!({"metadata": {
                "uid": "u1",
                "finalizers": [FINALIZER_PROVISIONING],
                "annotations": {ANN_PROVISIONING_OWNER: ME, ANN_PROVISIONING_CLASS: "{}"}
            }})
        );
        assert_eq!(
            intent_patch(Some("u1"), ME, true, None),
            serde_json::json!({"metadata": {
                "uid": "u1",
                "finalizers": [FINALIZER_PROVISIONING],
                "annotations": {ANN_PROVISIONING_OWNER: ME}
            }}),
            "no snapshot: none written"
        );
        assert_eq!(
            intent_patch(None, ME, false, None),
            serde_json::json!({"metadata": {
                "$deleteFromPrimitiveList/finalizers": [FINALIZER_PROVISIONING],
                "annotations": {ANN_PROVISIONING_OWNER: null, ANN_PROVISIONING_CLASS: null}
            }})
        );
        assert!(
            intent_patch(Some(""), ME, true, None)["metadata"]
                .get("uid")
                .is_none(),
            "an empty uid is no precondition"
        );
    }

    #[test]
    fn the_class_snapshot_keeps_what_a_driver_reads_and_reads_back() {
        let mut full = crate::testing::class("fast")
            .provisioner(ME)
            .reclaim_policy("Retain")
            .wait_for_first_consumer()
            .build();
        full.metadata.uid = Some("class-uid".into());
        full.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
        full.metadata.resource_version = Some("42".into());
        full.parameters = Some([("pool".to_owned(), "gold".to_owned())].into());
        full.mount_options = Some(vec!["noatime".into()]);
        full.allow_volume_expansion = Some(true);
        let json = class_snapshot(&full).expect("a small class is recorded");
        let claim = with_intent()
            .annotation(ANN_PROVISIONING_CLASS, &json)
            .build();
        let read = recorded_class(&view(&claim)).expect("it reads back");
        assert_eq!(read.metadata.name.as_deref(), Some("fast"));
        assert_eq!(read.metadata.uid.as_deref(), Some("class-uid"));
        assert_eq!(read.provisioner, ME);
        assert_eq!(read.parameters, full.parameters);
        assert_eq!(read.reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(read.mount_options, full.mount_options);
        assert_eq!(read.volume_binding_mode, full.volume_binding_mode);
        assert_eq!(read.metadata.labels, None, "only what a driver reads");
        assert_eq!(read.metadata.resource_version, None);
        assert_eq!(read.allow_volume_expansion, None);
    }

    #[test]
    fn a_huge_class_is_not_recorded_and_a_bad_snapshot_is_ignored() {
        let mut huge = crate::testing::class("fast").provisioner(ME).build();
        huge.parameters = Some([("blob".to_owned(), "x".repeat(MAX_CLASS_SNAPSHOT))].into());
        assert_eq!(class_snapshot(&huge), None);
        for bad in ["not json", "[1, 2]", r#"{"provisioner": 7}"#] {
            let claim = with_intent()
                .annotation(ANN_PROVISIONING_CLASS, bad)
                .build();
            assert!(recorded_class(&view(&claim)).is_none(), "{bad}");
        }
        assert!(recorded_class(&view(&with_intent().build())).is_none());
    }
}
