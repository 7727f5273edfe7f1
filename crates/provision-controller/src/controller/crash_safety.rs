//! Crash-safe provisioning, one layer around a claim's provisioning step ([`guarded`]):
//! before it, [`plan`] decides what the claim needs (crash safety finishes it, or the
//! normal flow runs); around the step's driver call, [`Guard`] records the claim's
//! journal entry as an **intent** while an asset may exist without a saved PV and removes
//! it once the driver answered that nothing exists; after the PV's save the entry is
//! **settled** ([`after_save`], swept at the end of the late-asset window). A claim that
//! will not get our PV the normal way is cleaned up **by saving, not deleting**
//! ([`cleanup`]). By concept: `plan` (before), `intent` (the journal writes around the
//! call and after the save), `cleanup` (the cleanup and the last sweep).
//! docs/architecture.md ("Crash safety: the provisioning journal") tells why this gives
//! the guarantee.

mod cleanup;
mod intent;
mod plan;

use std::{future::Future, sync::Arc};

use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::StorageClass};

use super::{
    Context,
    calls::{CallError, OpError, Outcome},
    records::{InProgress, Progress, State},
};
use crate::{ProvisionError, ProvisionOptions, annotations::ClaimView, journal::Entry};
#[cfg(test)]
pub(crate) use cleanup::attempt_wait;
pub(crate) use intent::after_save;
use intent::{holds_no_asset, no_asset, record_intent};

/// The claim's journal entry, when crash safety keeps a journal.
pub(crate) fn entry(ctx: &Context, uid: &str) -> Option<Entry> {
    ctx.journal.as_ref()?.entry(uid)
}

/// Whether a claim is live, or gone and finished by crash safety from a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Presence {
    /// The claim is cached (or, without crash-safe provisioning, driven on from the copy
    /// kept while its provisioning runs in the background, as Go does).
    Live,
    /// The claim is not cached: `claim` is the copy kept while its provisioning ran in
    /// the background, or the one its journal entry describes.
    Gone,
}

/// The crash-safety layer around a claim's provisioning step, the one place the claim's
/// way enters it: [`before_provisioning`](plan::before_provisioning) decides what the claim needs (crash safety
/// finishes it, or the normal flow runs); the normal flow, `step`, gets the class its
/// provisioning started with and a [`Guard`] for its driver call (the intent recorded
/// before it, the entry removed after a final answer; the PV's save settles the entry,
/// [`after_save`]). Returns what the claim must remember, the class it ran with, and the
/// sync's result.
pub(crate) async fn guarded<'a, Step: Future<Output = (State, Result<Outcome, OpError>)>>(
    ctx: &'a Context,
    claim: &'a ClaimView,
    entry: Option<&InProgress>,
    presence: Presence,
    step: impl FnOnce(Option<Arc<StorageClass>>, Guard<'a>) -> Step,
) -> (State, Option<Arc<StorageClass>>, Result<Outcome, OpError>) {
    match plan::before_provisioning(ctx, claim, entry, presence).await {
        plan::Step::Done {
            state,
            class,
            result,
        } => (state, class, result),
        plan::Step::Provision { class } => {
            let (state, result) = step(class.clone(), Guard { ctx, claim }).await;
            (state, class, result)
        }
    }
}

/// The driver call of a claim's provisioning step, with crash safety around it
/// ([`Guard::provision`]).
pub(crate) struct Guard<'a> {
    ctx: &'a Context,
    claim: &'a ClaimView,
}

/// How a guarded driver call ended.
pub(crate) enum Guarded {
    /// Not called: nothing to do for now (not a failure).
    Stopped(&'static str),
    /// Not called: the intent could not be recorded.
    Failed(OpError),
    /// The driver's answer (or the call's timeout or panic); boxed, as it is large.
    Answer(Box<Result<Result<PersistentVolume, ProvisionError>, CallError>>),
}

impl Guard<'_> {
    /// With crash-safe provisioning: a claim being deleted that is not in progress is not
    /// provisioned, and the claim's intent is recorded (durable) before the driver may
    /// create an asset for `options`; then the driver call (only it holds a driver slot:
    /// the API writes around it do not); a final answer (the driver holds no asset for
    /// the claim) then removes or settles the intent ([`no_asset`]).
    pub(crate) async fn provision(
        &self,
        class: &StorageClass,
        options: &ProvisionOptions,
        progress: Progress,
    ) -> Guarded {
        let (ctx, claim) = (self.ctx, self.claim);
        let crash_safe = ctx.config.crash_safe_provisioning;
        if crash_safe {
            if claim.claim.metadata.deletion_timestamp.is_some() && progress == Progress::Idle {
                return Guarded::Stopped("claim is being deleted");
            }
            // The driver may create an asset from now on: the journal names it first.
            if let Err(err) = record_intent(ctx, claim, class, &options.pv_name).await {
                return Guarded::Failed(err);
            }
        }
        let limit = ctx.config.provision_timeout;
        let answer = ctx
            .driver_slots
            .provisioning(limit, ctx.driver.provisioner.provision(options))
            .await;
        // A final answer: the driver holds no asset for the claim, nothing to record.
        if crash_safe && matches!(&answer, Ok(Err(e)) if holds_no_asset(e)) {
            no_asset(ctx, &claim.uid);
        }
        Guarded::Answer(Box::new(answer))
    }
}
