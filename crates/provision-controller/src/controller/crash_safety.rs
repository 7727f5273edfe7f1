//! Crash-safe provisioning: a claim's journal entry is an **intent** while an asset may
//! exist without a saved PV ([`record_intent`] before the driver call), **settled** once a
//! PV records the asset ([`after_save`], swept at the end of the late-asset window), and
//! removed once the driver answered that nothing exists ([`no_asset`]). A claim that will
//! not get our PV the normal way is cleaned up **by saving, not deleting** ([`clean_up`]).
//! In a claim's way: one step, [`before_provisioning`]. docs/architecture.md ("Crash
//! safety: the provisioning journal") tells why this gives the guarantee.

use std::sync::Arc;

use tracing::Instrument as _;

use k8s_openapi::{
    api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{
    Context,
    calls::{OpError, Outcome, Why, chain},
    records::{InProgress, Progress, State},
    volume_object,
};
use crate::{
    DeleteError, ProvisionError, ProvisionOptions,
    annotations::ClaimView,
    events,
    journal::{self, Entry},
};

/// The largest class snapshot written to the journal, in bytes of JSON.
const MAX_CLASS_SNAPSHOT: usize = 16 * 1024;

/// The JSON of the class snapshot the journal keeps: the fields of `class` a driver
/// reads. `None` (logged) when it exceeds [`MAX_CLASS_SNAPSHOT`]: the claim then depends
/// on the class as it is at each sync.
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
                "the class is too large to be recorded in the journal; its provisioning will need the class to exist until it is done"
            );
            None
        }
        Err(err) => {
            tracing::warn!(storageclass = class_name, error = %err, "the class cannot be recorded in the journal");
            None
        }
    }
}

/// Whether the driver's answer says that it holds no asset for the claim (`Failed`,
/// `Reschedule`, `Ignored`, `Infeasible`): then the intent has nothing to record.
pub(crate) fn holds_no_asset(answer: &ProvisionError) -> bool {
    match answer {
        ProvisionError::Failed(_)
        | ProvisionError::Reschedule(_)
        | ProvisionError::Ignored { .. }
        | ProvisionError::Infeasible(_) => true,
        ProvisionError::InBackground(_) | ProvisionError::NoChange(_) => false,
    }
}

/// The claim's journal entry, when crash safety keeps a journal.
pub(crate) fn entry(ctx: &Context, uid: &str) -> Option<Entry> {
    ctx.journal.as_ref()?.entry(uid)
}

/// The class to provision (or clean up) the claim with: the class its provisioning
/// started with, as remembered in memory (`entry`) or recorded in the journal, else its
/// class as cached now. A claim in progress must not depend on a class that may have been
/// deleted or changed since its asset was asked for.
pub(crate) fn provisioning_class(
    ctx: &Context,
    claim: &ClaimView,
    entry: Option<&InProgress>,
    recorded: Option<&Entry>,
) -> Option<Arc<StorageClass>> {
    entry
        .and_then(|e| e.class.clone())
        .or_else(|| {
            let key = recorded?.class.as_deref()?;
            ctx.journal.as_ref()?.class(&claim.uid, key)
        })
        .or_else(|| ctx.caches.class(&claim.class_name))
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

/// Whether a create sent for a claim before may still land (within the driver's
/// late-asset window), for a cleanup that finds no asset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LateWindow {
    /// It may: "no asset" is believed only once the window has passed since the first look.
    Open,
    /// The entry is settled and due: no create can land any more.
    Over,
}

/// How [`before_provisioning`] left the claim's sync.
pub(crate) enum Step {
    /// Crash safety finished the sync (a cleanup or sweep ran, or the entry was settled):
    /// `state` is what the claim must remember, `class` the class the cleanup ran with.
    Done {
        state: State,
        class: Option<Arc<StorageClass>>,
        result: Result<Outcome, OpError>,
    },
    /// The normal flow runs, with the class its provisioning started with
    /// ([`provisioning_class`]).
    Provision { class: Option<Arc<StorageClass>> },
}

/// The crash-safety step of a claim's sync, before the normal flow: a claim that is
/// [`Presence::Gone`] (`claim` is the copy kept in `entry`, or rebuilt from its journal entry) or
/// whose journal entry asks for it gets what [`plan`] says (the entry settled, a cleanup,
/// the last sweep); any other goes on to the normal flow.
pub(crate) async fn before_provisioning(
    ctx: &Context,
    claim: &ClaimView,
    entry: Option<&InProgress>,
    presence: Presence,
) -> Step {
    let gone = presence == Presence::Gone;
    let done = |result| Step::Done {
        state: State::NoChange,
        class: None,
        result,
    };
    let recorded = self::entry(ctx, &claim.uid);
    if recorded.is_none() && !gone {
        // Nothing recorded for a live claim: the normal flow (which calls the volume
        // namer only once the claim is found to be ours).
        return Step::Provision {
            class: provisioning_class(ctx, claim, entry, None),
        };
    }
    let pv_name = recorded.as_ref().map_or_else(
        || ctx.config.volume_namer.name(&claim.claim),
        |e| e.pv.clone(),
    );
    let now = journal::now_secs();
    let facts = Facts {
        gone,
        in_progress: entry.is_some(),
        recorded: recorded.as_ref(),
        pv_name: &pv_name,
        volume_exists: ctx.caches.volume_exists(&pv_name),
        wanted: !gone && wanted(ctx, claim),
        now,
    };
    let plan = plan(&claim.claim, facts);
    if let Some(recorded) = &recorded
        && recorded.is_intent()
        && !gone
    {
        warn_if_held(ctx, claim, recorded, now).await;
    }
    let class = provisioning_class(ctx, claim, entry, recorded.as_ref());
    match plan {
        Plan::Continue => Step::Provision { class },
        Plan::Wait => {
            if let Some(due) = recorded.as_ref().and_then(|e| e.due) {
                queue_at(ctx, &claim.uid, due);
            }
            done(Ok(Outcome::Done))
        }
        Plan::Settle => {
            // A PV of its name exists: it records the asset. Its saver settled the entry,
            // or stopped before it could: the last sweep is due a window from now.
            let uid = &claim.uid;
            if let Some(j) = &ctx.journal {
                let due = j.settle(uid, window_secs(ctx));
                queue_at(ctx, uid, due);
            }
            done(Ok(Outcome::Done))
        }
        Plan::Sweep => {
            let due = recorded.as_ref().and_then(|e| e.due).unwrap_or(now);
            done(
                last_sweep(ctx, &claim.uid, &pv_name, due)
                    .await
                    .map(|()| Outcome::Done),
            )
        }
        Plan::CleanUp(window) => {
            // Boxed: the cleanup is a large future (see `provision::provision`).
            let progress = Progress::of(entry);
            let seen = Seen {
                entry: recorded.as_ref(),
                window,
            };
            let cleanup = clean_up(
                ctx,
                claim,
                class.clone(),
                presence,
                progress,
                &pv_name,
                seen,
            );
            let (state, result) = Box::pin(cleanup).await;
            Step::Done {
                state,
                class,
                result,
            }
        }
    }
}

/// What the sync that runs a [`clean_up`] read of the claim's journal entry.
#[derive(Clone, Copy, Debug)]
struct Seen<'a> {
    /// The entry (a removal takes only this very entry).
    entry: Option<&'a Entry>,
    /// Whether a create sent before may still land.
    window: LateWindow,
}

/// What [`plan`] needs to know besides the claim.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<'a> {
    /// The claim is not cached: deleted (this is the copy the controller kept, or the
    /// one its journal entry describes).
    pub(crate) gone: bool,
    /// Its provisioning runs in the background in this process.
    pub(crate) in_progress: bool,
    /// Its journal entry.
    pub(crate) recorded: Option<&'a Entry>,
    /// The name our PV for the claim has.
    pub(crate) pv_name: &'a str,
    /// That PV is cached, or was just saved by us.
    pub(crate) volume_exists: bool,
    /// The claim still asks us for a volume: its storage-provisioner annotation names us,
    /// and so does its class when it is cached.
    pub(crate) wanted: bool,
    /// Now, in Unix seconds.
    pub(crate) now: i64,
}

/// What crash safety does with a claim, before the normal claim flow.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not crash safety's to handle: run the normal flow.
    Continue,
    /// Nothing to do now (a settled entry whose sweep is not due, for a claim that is
    /// gone or needs nothing).
    Wait,
    /// An intent whose PV exists (or whose claim is bound to it): settle it.
    Settle,
    /// A settled entry whose last sweep is due, and whose PV exists: sweep and remove it.
    Sweep,
    /// The claim will not get our PV the normal way (it is gone, being deleted, bound to
    /// another PV, or asks another provisioner now) and our PV does not exist: save a PV
    /// for the asset, if any ([`clean_up`]), a create sent before may still land or not.
    CleanUp(LateWindow),
}

/// Decides what crash safety does with a claim (pure).
pub(crate) fn plan(claim: &PersistentVolumeClaim, facts: Facts<'_>) -> Plan {
    let Some(recorded) = facts.recorded else {
        // No record: only a claim whose provisioning ran in the background in this
        // process and that vanished needs crash safety (nothing records its asset).
        return if facts.gone && facts.in_progress {
            Plan::CleanUp(LateWindow::Open)
        } else if facts.gone {
            Plan::Wait
        } else {
            Plan::Continue
        };
    };
    if let Some(due) = recorded.due {
        if due > facts.now {
            return if facts.gone {
                Plan::Wait
            } else {
                Plan::Continue
            };
        }
        return if facts.volume_exists {
            Plan::Sweep
        } else {
            Plan::CleanUp(LateWindow::Over)
        };
    }
    if facts.volume_exists {
        return Plan::Settle;
    }
    if facts.gone {
        return Plan::CleanUp(LateWindow::Open);
    }
    let bound_to = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    match bound_to {
        Some(volume) if volume == facts.pv_name => Plan::Settle,
        // Bound to another PV: ours, if its asset exists, would never be used.
        Some(_) => Plan::CleanUp(LateWindow::Open),
        None if claim.metadata.deletion_timestamp.is_some() || !facts.wanted => {
            Plan::CleanUp(LateWindow::Open)
        }
        None => Plan::Continue,
    }
}

/// The driver's late-asset window in whole seconds (rounded up), 0 without one.
pub(crate) fn window_secs(ctx: &Context) -> i64 {
    ctx.late_window().map_or(0, |w| {
        i64::try_from(w.as_secs() + u64::from(w.subsec_nanos() > 0)).unwrap_or(i64::MAX)
    })
}

/// Queues claim `uid` for the time `due` (Unix seconds), at once when it has passed.
fn queue_at(ctx: &Context, uid: &str, due: i64) {
    if !ctx.accepting() {
        return;
    }
    let wait = u64::try_from(due.saturating_sub(journal::now_secs())).unwrap_or(0);
    // A second more: the due time is whole seconds.
    ctx.claim_queue
        .add_after(uid.to_owned(), std::time::Duration::from_secs(wait + 1));
}

/// A `ProvisioningHeld` Warning event on a live claim whose intent is older than
/// [`Config::provisioning_held_warning`](crate::Config), once per process.
async fn warn_if_held(ctx: &Context, claim: &ClaimView, recorded: &Entry, now: i64) {
    let limit = i64::try_from(ctx.config.provisioning_held_warning.as_secs()).unwrap_or(i64::MAX);
    let age = now.saturating_sub(recorded.since);
    if age < limit {
        return;
    }
    if !ctx.records.warn_held_once(&claim.uid) {
        return;
    }
    let note = format!(
        "The provisioning of volume {} for claim {} started {age} s ago and has not finished: the driver has not \
         answered with a volume or a final error yet. The controller's journal keeps the claim until it does.",
        recorded.pv, claim.key
    );
    tracing::warn!(pvc = %claim.key, age_seconds = age, "provisioning held for long");
    ctx.events
        .warning(&*claim.claim, events::PROVISIONING_HELD, note)
        .await;
}

/// Records the claim's intent in the journal before the driver is asked for `pv_name`
/// with `class`, and returns once it is durable: a new intent, or the claim's intent with
/// this attempt's time ([`Entry::attempt`]), so that a replica that finds no asset waits
/// for a create this attempt may send (an attempt this process stamped this very second
/// needs no write). An intent another process wrote keeps no writer once this one
/// stamps it: a "no asset" answer then settles it rather than removing it. Returns the
/// entry as written (`None` without a journal).
///
/// # Errors
/// The journal could not be written: the driver must not be called.
pub(crate) async fn record_intent(
    ctx: &Context,
    claim: &ClaimView,
    class: &StorageClass,
    pv_name: &str,
) -> Result<Option<Entry>, OpError> {
    let Some(journal) = &ctx.journal else {
        return Ok(None);
    };
    let now = journal::now_secs();
    let existing = journal.entry(&claim.uid).filter(Entry::is_intent);
    if let Some(e) = &existing
        && e.writer == journal.writer()
        && e.last_attempt() >= now
    {
        return Ok(existing);
    }
    let spec = claim
        .claim
        .spec
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok());
    let (entry, snapshot) = match existing {
        Some(e) => {
            // The class the provisioning started with stays recorded.
            let snapshot = if e.class.is_some() {
                None
            } else {
                class_snapshot(class).map(|json| (journal::class_key(&json), json))
            };
            let writer = if e.writer == journal.writer() {
                e.writer.clone()
            } else {
                String::new()
            };
            let entry = Entry {
                writer,
                class: e
                    .class
                    .clone()
                    .or_else(|| snapshot.as_ref().map(|(k, _)| k.clone())),
                node: claim.selected_node.clone().or(e.node.clone()),
                spec: spec.or(e.spec.clone()),
                attempt: Some(now),
                ..e
            };
            (entry, snapshot)
        }
        None => {
            let snapshot = class_snapshot(class).map(|json| (journal::class_key(&json), json));
            let entry = Entry {
                claim: claim.key.clone(),
                pv: pv_name.to_owned(),
                since: now,
                writer: journal.writer().to_owned(),
                class: snapshot.as_ref().map(|(key, _)| key.clone()),
                node: claim.selected_node.clone(),
                spec,
                due: None,
                attempt: None,
            };
            (entry, snapshot)
        }
    };
    journal
        .put(&claim.uid, entry.clone(), snapshot)
        .instrument(tracing::debug_span!("journal_put"))
        .await
        .map_err(|message| OpError::Journal {
            claim: claim.key.clone(),
            message,
        })?;
    Ok(Some(entry))
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

/// The driver answered that it holds no asset for claim `uid`: the intent goes if this
/// process wrote it (the answer says nothing of another replica's create: its intent, or
/// the entry of a PV it saved meanwhile, stays). One another process (or an earlier life
/// of this one) wrote is settled instead when a create it sent may still land, for the
/// end of the late-asset window, whose sweep looks for that asset once more.
pub(crate) fn no_asset(ctx: &Context, uid: &str) {
    let Some(journal) = &ctx.journal else {
        return;
    };
    let Some(recorded) = journal.entry(uid).filter(Entry::is_intent) else {
        return;
    };
    let window = window_secs(ctx);
    if recorded.writer != journal.writer() && window > 0 {
        let due = journal.settle(uid, window);
        queue_at(ctx, uid, due);
    } else {
        journal.remove_own_intent(uid);
    }
}

/// After the PV `saved` of claim `claim_uid` was saved (by us, or by another replica
/// first): the driver hears of it ([`LateAssets::volume_saved`](crate::LateAssets::volume_saved):
/// it releases any other asset of the name), and the claim's entry is settled for its last
/// sweep when the late-asset window ends (removed without a window once the driver
/// answered without failing; a failure is swept again a second later, and so on).
pub(crate) async fn after_save(
    ctx: &Context,
    claim_uid: Option<&str>,
    saved: &k8s_openapi::api::core::v1::PersistentVolume,
) {
    let swept = volume_saved(ctx, saved).await;
    let (Some(journal), Some(uid)) = (&ctx.journal, claim_uid.filter(|u| !u.is_empty())) else {
        return;
    };
    let window = window_secs(ctx);
    if window == 0 && swept {
        // The entry as known now goes; one another replica stamps meanwhile stays (its
        // claim's next sync settles it: the PV exists).
        if let Some(known) = journal.entry(uid) {
            journal.remove_unchanged(uid, &known);
        }
        return;
    }
    let due = journal.settle(uid, window.max(1));
    queue_at(ctx, uid, due);
}

/// Tells the driver that `volume` is saved
/// ([`LateAssets::volume_saved`](crate::LateAssets::volume_saved), when it opted in),
/// bounded by the provision timeout; whether it answered without failing (a failure is
/// logged).
pub(crate) async fn volume_saved(
    ctx: &Context,
    volume: &k8s_openapi::api::core::v1::PersistentVolume,
) -> bool {
    let Some(late) = &ctx.driver.late_assets else {
        return true;
    };
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let result = match ctx
        .driver_slots
        .deleting(ctx.config.provision_timeout, late.volume_saved(volume))
        .await
    {
        Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => return true,
        Ok(Err(DeleteError::Failed(e))) => chain(&*e),
        Err(e) => chain(&e.into_op("volume_saved")),
    };
    tracing::warn!(pv = name, error = %result, "the driver failed to release what else it holds for the claim of the saved volume; asked again");
    false
}

/// The last sweep of a settled entry whose window ended while its PV `pv_name` exists:
/// the driver releases what else it holds for the name, then the entry goes.
///
/// # Errors
/// The driver failed: the claim is retried (the entry stays).
async fn last_sweep(ctx: &Context, uid: &str, pv_name: &str, due: i64) -> Result<(), OpError> {
    let volume = match ctx.caches.volume(pv_name) {
        Some(volume) => volume,
        // Only the saved mark says the PV exists: the cache never heard of it (saved, then
        // deleted while the watch relisted). A fresh read decides; a PV that is gone
        // loses its mark, and the claim's next sync cleans up as for a deleted PV.
        None => match super::calls::get_volume(&ctx.client, ctx.config.provision_timeout, pv_name)
            .await?
        {
            Some(volume) => Arc::new(volume),
            None => {
                ctx.caches.volume_seen(pv_name);
                ctx.claim_queue.add(uid.to_owned());
                return Ok(());
            }
        },
    };
    if !super::names::is_ours(&volume, ctx.names()) || volume.metadata.deletion_timestamp.is_some()
    {
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
/// (see [`Plan::CleanUp`]), or one that vanished while its provisioning ran in the
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
async fn clean_up(
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
    let volume = match answer {
        Ok(Ok(volume)) => volume,
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
        volume_object::decorate(ctx, claim, &class, &mut volume);
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
                return (State::NoChange, Err(err));
            }
        }
        ctx.caches.mark_saved(&name);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    const ME: &str = "example.com/me";

    fn intent() -> Entry {
        Entry {
            claim: "default/c".into(),
            pv: "pvc-u1".into(),
            since: 1000,
            writer: "w".into(),
            class: None,
            node: None,
            spec: None,
            due: None,
            attempt: None,
        }
    }

    fn settled(due: i64) -> Entry {
        Entry {
            due: Some(due),
            ..intent()
        }
    }

    #[test]
    fn plan_decisions() {
        let base = || pvc("c").uid("u1").provisioner(ME);
        let facts = |recorded: Option<&'static Entry>, gone, exists, wanted| Facts {
            gone,
            in_progress: false,
            recorded,
            pv_name: "pvc-u1",
            volume_exists: exists,
            wanted,
            now: 2000,
        };
        let intent: &'static Entry = Box::leak(Box::new(intent()));
        let due: &'static Entry = Box::leak(Box::new(settled(1500)));
        let later: &'static Entry = Box::leak(Box::new(settled(2500)));
        // (case, claim, facts, plan)
        let cases = [
            (
                "a claim without entry runs the normal flow",
                base().build(),
                facts(None, false, false, true),
                Plan::Continue,
            ),
            (
                "a live claim with an intent is provisioned again",
                base().build(),
                facts(Some(intent), false, false, true),
                Plan::Continue,
            ),
            (
                "an intent whose PV exists is settled",
                base().build(),
                facts(Some(intent), false, true, true),
                Plan::Settle,
            ),
            (
                "an intent whose claim is bound to our PV is settled",
                base().volume_name("pvc-u1").build(),
                facts(Some(intent), false, false, true),
                Plan::Settle,
            ),
            (
                "an intent whose claim is bound to another PV is cleaned up",
                base().volume_name("static").build(),
                facts(Some(intent), false, false, true),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "an intent whose claim is gone is cleaned up",
                base().build(),
                facts(Some(intent), true, false, false),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "an intent whose claim is being deleted is cleaned up",
                base().deleting().build(),
                facts(Some(intent), false, false, true),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "an intent whose claim asks another provisioner now is cleaned up",
                base().provisioner("example.com/other").build(),
                facts(Some(intent), false, false, false),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "a gone claim whose PV exists only settles",
                base().build(),
                facts(Some(intent), true, true, false),
                Plan::Settle,
            ),
            (
                "a settled entry not due yet: the normal flow for a live claim",
                base().volume_name("pvc-u1").build(),
                facts(Some(later), false, true, true),
                Plan::Continue,
            ),
            (
                "a settled entry not due yet: nothing for a gone claim",
                base().build(),
                facts(Some(later), true, false, false),
                Plan::Wait,
            ),
            (
                "a settled entry due, PV there: the last sweep",
                base().build(),
                facts(Some(due), true, true, false),
                Plan::Sweep,
            ),
            (
                "a settled entry due, PV gone: a last cleanup",
                base().build(),
                facts(Some(due), true, false, false),
                Plan::CleanUp(LateWindow::Over),
            ),
            (
                "a gone claim without entry that ran in the background is cleaned up",
                base().build(),
                Facts {
                    in_progress: true,
                    ..facts(None, true, false, false)
                },
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "a gone claim without entry and nothing in progress needs nothing",
                base().build(),
                facts(None, true, false, false),
                Plan::Wait,
            ),
        ];
        for (name, claim, facts, want) in cases {
            assert_eq!(plan(&claim, facts), want, "case: {name}");
        }
    }

    #[test]
    fn the_class_snapshot_keeps_what_a_driver_reads() {
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
        let read: StorageClass = serde_json::from_str(&json).unwrap();
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
        let mut huge = crate::testing::class("fast").provisioner(ME).build();
        huge.parameters = Some([("blob".to_owned(), "x".repeat(MAX_CLASS_SNAPSHOT))].into());
        assert_eq!(class_snapshot(&huge), None);
    }
}
