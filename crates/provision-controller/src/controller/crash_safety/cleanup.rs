//! The flows crash safety runs itself: the cleanup of a claim that will not get our PV
//! the normal way ([`clean_up`]: the asset looked for, and recorded in a PV that is
//! reclaimed once released), and the last sweep of a settled entry ([`last_sweep`]).

use std::sync::Arc;

use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::StorageClass};

use super::{
    Presence,
    intent::{after_save, holds_no_asset, record_intent, volume_saved, window_secs},
};
use crate::{
    ProvisionError, ProvisionOptions,
    annotations::ClaimView,
    controller::{
        Context,
        calls::{self, OpError, Outcome, Why, chain},
        names,
        records::{Progress, State},
        volume_object,
    },
    events,
    journal::{self, Entry},
};

/// Whether a create sent for a claim before may still land (within the driver's
/// late-asset window), for a cleanup that finds no asset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LateWindow {
    /// It may: "no asset" is believed only once the window has passed since the first look.
    Open,
    /// The entry is settled and due: no create can land any more.
    Over,
}

/// What the sync that runs a [`clean_up`] read of the claim's journal entry.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seen<'a> {
    /// The entry (a removal takes only this very entry).
    pub(super) entry: Option<&'a Entry>,
    /// Whether a create sent before may still land.
    pub(super) window: LateWindow,
}

/// The last sweep of a settled entry whose window ended while its PV `pv_name` exists:
/// the driver releases what else it holds for the name, then the entry goes.
///
/// # Errors
/// The driver failed: the claim is retried (the entry stays).
pub(super) async fn last_sweep(
    ctx: &Context,
    uid: &str,
    pv_name: &str,
    due: i64,
) -> Result<(), OpError> {
    let volume = match ctx.caches.volume(pv_name) {
        Some(volume) => volume,
        // Only the saved mark says the PV exists: the cache never heard of it (saved, then
        // deleted while the watch relisted). A fresh read decides; a PV that is gone
        // loses its mark, and the claim's next sync cleans up as for a deleted PV.
        None => {
            match calls::get_volume(&ctx.client, ctx.config.provision_timeout, pv_name).await? {
                Some(volume) => Arc::new(volume),
                None => {
                    ctx.caches.volume_seen(pv_name);
                    ctx.claim_queue.add(uid.to_owned());
                    return Ok(());
                }
            }
        }
    };
    if !names::is_ours(&volume, ctx.names()) || volume.metadata.deletion_timestamp.is_some() {
        // Not ours (a static PV under the name), or being deleted (the driver's delete
        // releases what the name holds): nothing to sweep.
        if let Some(j) = &ctx.journal {
            j.remove(uid, Some(due));
        }
        return Ok(());
    }
    if !volume_saved(ctx, &volume).await {
        return Err(OpError::Sweep {
            pv: pv_name.to_owned(),
        });
    }
    tracing::debug!(pv = pv_name, "late-asset window over: last sweep made");
    if let Some(j) = &ctx.journal {
        j.remove(uid, Some(due));
    }
    Ok(())
}

/// Finishes a claim that will not get our PV the normal way while its asset may exist
/// (see [`Plan::CleanUp`](super::plan::Plan::CleanUp)), or one that vanished while its provisioning ran in the
/// background ([`Presence::Gone`]: the copy the controller kept, or rebuilt from the journal):
/// asks the driver for the asset `pv_name` again (with `class`, the class the
/// provisioning started with when known), saves a PV for it (see the module docs: the PV
/// controller releases it and the volume flow reclaims it), then settles or removes the
/// entry. Returns, with the result, what the claim must remember:
/// [`State::InBackground`] while the driver may still work on it, [`State::Finished`]
/// once a PV records the asset or none exists.
///
/// A claim not in progress ([`Progress::Idle`]) is cleaned up only when the qualifier accepts it (with
/// distributed provisioning, another controller may own it); a refusal is asked again
/// after [`Config::resync_period`](crate::Config).
///
/// # Errors
/// An error requeues the claim (the driver still works, the PV could not be saved, the
/// class is missing): the entry stays until a PV records the asset or the driver answers
/// that none exists.
#[tracing::instrument(skip_all, fields(pvc = %claim.key))]
pub(super) async fn clean_up(
    ctx: &Context,
    claim: &ClaimView,
    class: Option<Arc<StorageClass>>,
    presence: Presence,
    progress: Progress,
    pv_name: &str,
    seen: Seen<'_>,
) -> (State, Result<Outcome, OpError>) {
    let uid = &claim.uid;
    let (claim_gone, settled) = (presence == Presence::Gone, seen.window == LateWindow::Over);
    if progress == Progress::Idle && !ctx.qualified(&claim.claim).await {
        tracing::debug!("the qualifier refuses the claim: not ours to clean up now");
        let refused = Outcome::RequeueAfter {
            wait: ctx.config.resync_period,
            why: Why::CleanupRefused {
                claim: claim.key.clone(),
            },
        };
        return (State::NoChange, Ok(refused));
    }
    let class_name = claim.class_name.clone();
    let Some(class) = class else {
        let err = OpError::ClassNotFound { name: class_name };
        tracing::warn!(error = %chain(&err), "cannot look for the asset of a claim without its class; retried until the class exists again");
        if !claim_gone {
            let note = format!(
                "Cannot look for the volume provisioned for claim {}: {}, and the journal records no class. \
                 Retried until the class exists again.",
                claim.key,
                chain(&err)
            );
            ctx.events
                .warning(&*claim.claim, events::PROVISIONING_CLEANUP_FAILED, note)
                .await;
        }
        return (State::NoChange, Err(err));
    };
    let options = ProvisionOptions::new(
        Arc::clone(&class),
        pv_name.to_owned(),
        Arc::clone(&claim.claim),
        claim.selected_node.clone(),
    );
    tracing::info!(pv = %pv_name, claim_gone, settled, "the claim will not get our PV the normal way; looking for its asset");
    // The entry a removal compares with: the one read, or the one this attempt writes.
    let mut compare = seen.entry.cloned();
    if ctx.driver.asset_lookup.is_none() {
        // Without a lookup, the driver's `provision` may create: recorded first.
        match record_intent(ctx, claim, &class, pv_name).await {
            Ok(written) => compare = written.or(compare),
            Err(err) => return (State::NoChange, Err(err)),
        }
    }
    let limit = ctx.config.provision_timeout;
    let answer = ctx
        .driver_slots
        .provisioning(limit, async {
            match &ctx.driver.asset_lookup {
                Some(lookup) => lookup.find(&options).await,
                None => ctx.driver.provisioner.provision(&options).await.map(Some),
            }
        })
        .await;
    let volume = match found_asset(answer, class_name) {
        Ok(volume) => volume,
        Err((state, err)) => return (state, Err(err)),
    };
    if let Some(volume) = volume {
        if let Err(err) = save_asset(ctx, claim, &class, pv_name, volume, claim_gone).await {
            return (State::NoChange, Err(err));
        }
    } else {
        // A create sent before (by this or another replica, which may have stopped since
        // and forgotten it) may still land: "none" is believed once it can no longer, a
        // window after this process first looked and after the entry's latest attempt.
        if !settled
            && let Some(wait) = ctx.late_window().and_then(|window| {
                let first = ctx.records.cleanup_wait(uid, window);
                let attempt = seen
                    .entry
                    .and_then(|e| attempt_wait(e, window_secs(ctx), journal::now_secs()));
                first.max(attempt)
            })
        {
            let settling = Outcome::RequeueAfter {
                wait,
                why: Why::CreatesMayLand {
                    claim: claim.key.clone(),
                },
            };
            return (State::NoChange, Ok(settling));
        }
        tracing::info!(pv = %pv_name, "the driver holds no asset for the claim");
        // Only the entry this cleanup read (or wrote) goes: one rewritten since by another
        // replica's attempt stays, for that attempt's create may land after the lookup.
        if let (Some(j), Some(entry)) = (&ctx.journal, &compare) {
            j.remove_unchanged(uid, entry);
        }
    }
    ctx.records.forget_cleanup(uid);
    // Saved now, or nothing exists: a PV waiting in the background saver is not needed.
    ctx.saver.forget_pending(ctx, pv_name);
    (State::Finished, Ok(Outcome::Done))
}

/// The asset the driver's answer names (`None`: it holds none for the claim); an error
/// with what the claim must remember: [`State::InBackground`] while the driver may still
/// work on it.
fn found_asset(
    answer: Result<Result<Option<PersistentVolume>, ProvisionError>, calls::CallError>,
    class_name: String,
) -> Result<Option<PersistentVolume>, (State, OpError)> {
    match answer {
        Ok(Ok(volume)) => Ok(volume),
        Ok(Err(source)) if holds_no_asset(&source) => Ok(None),
        Ok(Err(source)) => {
            let state = match source {
                ProvisionError::InBackground(_) => State::InBackground,
                _ => State::NoChange,
            };
            let err = OpError::Provision {
                class: class_name,
                source,
            };
            Err((state, err))
        }
        Err(err) => {
            let state = match err {
                calls::CallError::Timeout(_) => State::InBackground,
                calls::CallError::Panicked(_) => State::NoChange,
            };
            Err((state, err.into_op("provision (cleanup)")))
        }
    }
}

/// Saves a PV that records `volume`, the asset the driver found for a claim that will not
/// get our PV the normal way: named `pv_name`, reclaimed as `class` says, then the driver
/// hears of it and the entry is settled ([`after_save`]).
///
/// # Errors
/// The claim cannot be referenced, or the PV could not be saved (an event says so on a
/// live claim).
async fn save_asset(
    ctx: &Context,
    claim: &ClaimView,
    class: &StorageClass,
    pv_name: &str,
    mut volume: PersistentVolume,
    claim_gone: bool,
) -> Result<(), OpError> {
    // Only a claimRef with the claim's uid gets the PV released once the claim is gone.
    volume_object::claim_reference(claim)?;
    volume_object::ensure_name(&mut volume, pv_name, claim);
    // The class decides what happens to the asset once the PV is released.
    let policy = class.reclaim_policy.as_deref().unwrap_or("Delete");
    let spec = volume.spec.get_or_insert_with(Default::default);
    spec.persistent_volume_reclaim_policy = Some(policy.to_owned());
    // This PV exists only to be released and reclaimed: one the API server refuses
    // for want of an access mode (a driver that copies the claim's, from a claim the
    // journal describes without them) would keep the asset forever.
    if spec.access_modes.as_ref().is_none_or(Vec::is_empty) {
        spec.access_modes = Some(vec!["ReadWriteOnce".to_owned()]);
    }
    volume_object::decorate(ctx, claim, class, &mut volume);
    let name = volume.metadata.name.clone().unwrap_or_default();
    tracing::info!(pv = %name, "saving a PV that records the asset; it is reclaimed once released");
    let events_claim = (!claim_gone).then_some(&*claim.claim);
    match volume_object::create(ctx, &volume).await {
        Ok(saved) => after_save(ctx, volume_object::claim_uid(&volume), &saved).await,
        Err(err) => {
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
            return Err(err);
        }
    }
    ctx.caches.mark_saved(&name);
    Ok(())
}

/// How long a cleanup that found no asset still waits because of `recorded`'s latest
/// attempt: a create it sent lands within the late-asset window (`window` seconds) of
/// it. `None` once that has passed.
pub(crate) fn attempt_wait(recorded: &Entry, window: i64, now: i64) -> Option<std::time::Duration> {
    // A second more: the attempt's time is whole seconds, rounded down.
    let until = recorded
        .last_attempt()
        .saturating_add(window)
        .saturating_add(1);
    let left = until.saturating_sub(now);
    u64::try_from(left)
        .ok()
        .filter(|s| *s > 0)
        .map(std::time::Duration::from_secs)
}
