//! Late assets and owed sweeps: the driver hears of a saved PV
//! ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)) after every save, and
//! until it has heard of it without failing.
//!
//! - With [`Provisioner::late_asset_window`](crate::Provisioner::late_asset_window), a
//!   young PV we provisioned is swept again at its first sync in this process and once
//!   more when the window has passed since the PV was created, so an asset made for its
//!   claim that landed late (a create that timed out, sent by a replica that may have
//!   died since) is released too.
//! - The last sweep lives in the memory of the process that made the first one. When
//!   that process stops leading before the window ends (it dies, is stopped, or is cut
//!   off and loses the lease), the process that leads next has no record of the PV and
//!   finds it older than the window: without more, nobody would make the last sweep, and
//!   a late asset of a Retain PV would leak for good. So a PV first synced here (no
//!   record) is also swept, once, while it is younger than the window plus a **takeover
//!   grace** ([`grace`]): the lease time a standby may need to take over a leader that
//!   stopped renewing (lease duration, renew deadline for one attempt, and two jittered
//!   retry periods: noticing the last renewal, then taking the lease), zero without leader
//!   election (every replica works at once and sweeps each PV at its own first sync),
//!   plus the window itself again, for what the age of the PV cannot tell apart: a
//!   replica that restarts (its pod coming back, its caches listing), a new leader's queue
//!   still busy with everything it queued when it started, a new leader whose watch of
//!   PVs lags behind. The bound is on the PV's age, not on when this process started
//!   leading: that keeps the record bounded by the young PVs, whatever the length of a
//!   leadership term.
//! - The last sweep is also recorded on the PV itself: a PV saved for a driver with a
//!   window carries [`ANN_LATE_ASSET_SWEEP`], the time its window ends, from its save on.
//!   Any process that syncs a PV carrying it once that time has passed (a new leader,
//!   whatever the PV's age: both replicas may have been down or cut off for longer than
//!   the grace) makes the last sweep, and removes the annotation (a patch with the PV's
//!   UID as precondition) once the driver answered without failing a sweep that started
//!   after that time. The time in effect is the later of the one recorded and the end of
//!   the window counted from the PV's creation (a PV the background saver saved late);
//!   an annotation that is no time counts as the latter. A PV carrying it whose time lies
//!   ahead is queued for that time. Drivers without a window get no annotation, and a
//!   PV's annotation is left alone by a controller whose driver has none. A PV being
//!   deleted is not swept (the driver's delete releases what its claim holds).
//! - Out of reach: a PV saved by an older version (no annotation) whose window ended
//!   while no process led (or synced it) for longer than the grace, e.g. the only replica
//!   down, or both replicas down or cut off at once, for that long. Its late asset, if one
//!   landed after the last sweep that was made, is released only by the driver's delete
//!   of the PV (a Delete PV); a Retain PV keeps it.
//! - A PV of ours deleted before its window ended gets its last sweep too (the driver's
//!   `volume_saved` with the deleted PV, once the window is over): every process whose
//!   watch sees it go records it, not only the one that deleted it, and a standby makes
//!   the sweep once it leads, so the deleting process may stop before the window ends.
//!   A PV that only records an asset its claim will not use
//!   ([`ANN_CLEANUP_RECORD`](crate::annotations::ANN_CLEANUP_RECORD)), or whose create may
//!   land late because another process (or an earlier life of this one) may have sent one
//!   ([`ANN_CREATES_MAY_LAND`](crate::annotations::ANN_CREATES_MAY_LAND)), is not deleted
//!   inside its window at all: its asset is, and the PV stays until the window ends
//!   ([`window_left`]), so the cluster keeps the record. Out of reach, for a PV without
//!   either: every process that saw the deletion gone before the window ends, or a
//!   deletion no watch event told of (it fell inside a relist), while a create of its name
//!   sent unseen (another replica adding the claim's finalizer at the same moment,
//!   without leader election) lands late.
//! - A record this process removed is not owed again while its cache still shows the PV
//!   as it was when removed (same UID and resourceVersion): a watch waiting out its
//!   backoff after an outage shows old PVs for up to half a minute, and each resync would
//!   otherwise repeat a sweep and a no-op patch per such PV.
//! - A sweep that fails (after a save, at a first sync, or when the window ends) is owed:
//!   the PV is queued again after a backoff (1 s doubling, capped at the resync period)
//!   and swept again at that sync, until the driver answers without failing. It runs in
//!   the volume worker, so only while leading. A failed removal of the annotation is
//!   retried the same way (with another sweep: sweeps are idempotent); the annotation
//!   stays meanwhile, so another leader still owes the sweep.
//!
//! The state is one entry per PV with a sweep still due (the last sweep of its window, or
//! an owed one), or swept for good while younger than the window plus the grace (so that
//! it is not swept again at every sync): an entry is dropped once nothing is due and the
//! PV is older than the window plus the grace (its sync is queued for that moment, and a
//! resync drops what is left), or when the PV is gone, being deleted, no longer ours or
//! re-created under its name, so it never outgrows the PVs that are young or whose driver
//! keeps failing.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::{api::core::v1::PersistentVolume, jiff::Timestamp};
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use tokio::time::Instant;

use super::{
    Context,
    calls::{OpError, api, chain, is_api, is_other_uid},
    names::{Names, is_ours},
};
use crate::{
    Config, DeleteError, LeaderElection,
    annotations::{self, ANN_LATE_ASSET_SWEEP},
};

/// The precision of the creation times the API server keeps: whole seconds.
const CREATION_PRECISION: Duration = Duration::from_secs(1);

/// The delay before the first retry of a failed sweep; each further failure doubles it,
/// up to the resync period.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The sweeps still due for one PV.
#[derive(Clone, Debug)]
struct Entry {
    /// The PV's UID: a PV re-created under the name is another PV.
    uid: String,
    /// Where its late-asset sweeps stand.
    stage: Stage,
    /// A sweep that failed, to be made again.
    owed: Option<Owed>,
}

impl Entry {
    fn new(uid: &str) -> Self {
        Self {
            uid: uid.to_owned(),
            stage: Stage::Owing,
            owed: None,
        }
    }
}

/// Where the late-asset sweeps of a PV stand in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// No sweep of the window is due: the entry is there for an owed sweep only.
    Owing,
    /// Swept once while young: the last sweep is due when its window ends.
    LastDue,
    /// Swept for good (the last sweep, or the one sweep of a PV first synced here after
    /// its window): not swept again, and the entry goes once the PV is older than the
    /// window plus the grace, at `expires`.
    Done {
        /// When the PV becomes older than the window plus the grace.
        expires: Timestamp,
    },
}

impl Stage {
    /// What [`plan`] needs to know of it.
    fn swept(self) -> Option<Swept> {
        match self {
            Self::Owing => None,
            Self::LastDue => Some(Swept::Young),
            Self::Done { .. } => Some(Swept::Done),
        }
    }
}

/// A failed sweep, to be made again.
#[derive(Clone, Copy, Debug)]
struct Owed {
    /// Failed calls in a row.
    attempts: u32,
    /// When the next call is due.
    due: Instant,
}

/// PVs with a sweep still due, or swept for good while young, by name.
#[derive(Default)]
pub(crate) struct LateAssets {
    pending: Mutex<HashMap<String, Entry>>,
    /// PVs this process deleted before their late-asset window ended, by name: a create of
    /// their name sent before (by another replica, whose memory of it this one lacks) may
    /// still land, so the driver is asked once more, when the window ends, to release what
    /// it holds for the name besides the PV's own (deleted) asset.
    afterlife: Mutex<HashMap<String, Afterlife>>,
    /// Name and UID of PVs whose asset this process deleted while it keeps the PV until
    /// its late-asset window ends (their deletion is counted once).
    kept: Mutex<std::collections::HashSet<(String, String)>>,
    /// PVs whose [`ANN_LATE_ASSET_SWEEP`] this process removed, by name: their UID and the
    /// resourceVersion the cache showed then. While the cache still shows that version (a
    /// watch waiting out its backoff after an outage shows old PVs for up to half a
    /// minute), the annotation it shows is not owed again: sweeping and removing it at
    /// every resync would only repeat a no-op patch and a backend call per PV.
    cleared: Mutex<HashMap<String, (String, Option<String>)>>,
}

/// A PV deleted before its window ended ([`LateAssets::afterlife`]).
#[derive(Clone)]
struct Afterlife {
    volume: PersistentVolume,
    due: Timestamp,
    failures: u32,
}

impl LateAssets {
    fn pending(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn kept_set(&self) -> MutexGuard<'_, std::collections::HashSet<(String, String)>> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `volume`'s asset is deleted and the PV kept until its window ends.
    pub(crate) fn keep(&self, volume: &PersistentVolume) {
        self.kept_set().insert(kept_key(volume));
    }

    /// Whether this process deleted `volume`'s asset already and kept the PV.
    pub(crate) fn was_kept(&self, volume: &PersistentVolume) -> bool {
        self.kept_set().contains(&kept_key(volume))
    }

    /// `volume` is deleted.
    pub(crate) fn forget_kept(&self, volume: &PersistentVolume) {
        self.kept_set().remove(&kept_key(volume));
    }

    fn cleared(&self) -> MutexGuard<'_, HashMap<String, (String, Option<String>)>> {
        self.cleared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this process removed the annotation of `volume` as the cache still shows
    /// it; a record the cache has moved past is dropped.
    fn cleared_already(&self, volume: &PersistentVolume) -> bool {
        let name = volume.metadata.name.as_deref().unwrap_or_default();
        let mut cleared = self.cleared();
        let Some((uid, version)) = cleared.get(name) else {
            return false;
        };
        let same = volume.metadata.uid.as_deref() == Some(uid.as_str())
            && volume.metadata.resource_version == *version;
        if !same {
            cleared.remove(name);
        }
        same
    }

    fn afterlife(&self) -> MutexGuard<'_, HashMap<String, Afterlife>> {
        self.afterlife
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops the entries of PVs that `exists` no longer knows (at resync: a deletion whose
    /// sync never came, e.g. across a relist), and those of PVs swept for good that are now
    /// older than the window plus the grace (their pruning sync did not come).
    pub(crate) fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.kept_set().retain(|(name, _)| exists(name));
        self.cleared().retain(|name, _| exists(name));
        let now = Timestamp::now();
        self.pending().retain(|name, entry| {
            let expired = matches!(entry.stage, Stage::Done { expires } if expires <= now);
            exists(name) && (entry.owed.is_some() || !expired)
        });
    }

    /// Records how a sweep of the PV `name` (UID `uid`) ended: a success pays what was
    /// owed, a failure makes the sweep owed. Returns the failures in a row and the delay
    /// before the next attempt after a failure (at most `cap`).
    fn settle(
        &self,
        name: &str,
        uid: &str,
        failed: bool,
        cap: Duration,
    ) -> Option<(u32, Duration)> {
        let mut pending = self.pending();
        if failed {
            let entry = pending
                .entry(name.to_owned())
                .or_insert_with(|| Entry::new(uid));
            if entry.uid != uid {
                *entry = Entry::new(uid);
            }
            let attempts = entry.owed.map_or(0, |o| o.attempts).saturating_add(1);
            let delay = retry_delay(attempts, cap);
            entry.owed = Some(Owed {
                attempts,
                due: Instant::now() + delay,
            });
            return Some((attempts, delay));
        }
        if let Some(entry) = pending.get_mut(name)
            && entry.uid == uid
        {
            entry.owed = None;
            if entry.stage == Stage::Owing {
                pending.remove(name);
            }
        }
        None
    }

    /// PVs with an entry: a sweep still due, or swept for good while young.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pending().len()
    }

    /// PVs with a failed sweep still owed.
    #[cfg(test)]
    pub(crate) fn owed(&self) -> usize {
        self.pending().values().filter(|e| e.owed.is_some()).count()
    }
}

/// The delay before attempt `failures + 1` after `failures` failed sweeps in a row:
/// [`FIRST_RETRY`], doubled for each further failure, at most `cap`.
pub(crate) fn retry_delay(failures: u32, cap: Duration) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX);
    FIRST_RETRY.saturating_mul(factor).min(cap)
}

/// How long a standby may need to take over the lease of a leader that stopped renewing
/// it (died, stopped, cut off): the lease duration after the last renewal it saw, two
/// jittered retry periods (one to see that last renewal, one to the attempt that takes
/// the lease) and that attempt (bounded by the renew deadline). Zero without leader
/// election: every replica works at once, none takes over.
pub(crate) fn takeover(config: &Config) -> Duration {
    let Some(election) = &config.leader_election else {
        return Duration::ZERO;
    };
    let retries = Duration::try_from_secs_f64(
        election.retry_period.as_secs_f64() * 2.0 * (1.0 + LeaderElection::JITTER_FACTOR),
    )
    .unwrap_or(Duration::MAX);
    election
        .lease_duration
        .saturating_add(election.renew_deadline)
        .saturating_add(retries)
}

/// The takeover grace for a late-asset `window`: how long past the window a PV without a
/// record here is still swept at its first sync. The [`takeover`] time, plus the window
/// again for a restart, a new leader's busy queue or lagging watch (see the module docs).
pub(crate) fn grace(config: &Config, window: Duration) -> Duration {
    window.saturating_add(takeover(config))
}

/// What this process did for a PV, as far as [`plan`] is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Swept {
    /// Swept once while young: the last sweep is due when its window ends.
    Young,
    /// Swept for good.
    Done,
}

/// What a sync of a PV does about late assets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// Nothing, and nothing to remember: not a PV of ours, no window, or older than the
    /// window plus the grace.
    Nothing,
    /// The first sweep in this process; the last one is due after the delay.
    First(Duration),
    /// Already swept; the last sweep is due after the delay.
    Wait(Duration),
    /// The window has passed: the last sweep. Swept for good afterwards, for the delay
    /// (until the PV is older than the window plus the grace; may be zero).
    Last(Duration),
    /// The window has passed and this process never swept the PV (another process saved
    /// it and may have stopped leading before its last sweep): one sweep, then swept for
    /// good for the delay (until the PV is older than the window plus the grace).
    Takeover(Duration),
    /// Swept for good already; still remembered for the delay.
    Done(Duration),
}

/// Whether `volume` was dynamically provisioned under one of our names (its
/// `pv.kubernetes.io/provisioned-by` names us): only such a PV's claim can have assets
/// of ours that landed late. Narrower than [`is_ours`], which
/// also counts static PVs of our driver and PVs migrated to us.
pub(crate) fn provisioned_by_us(volume: &PersistentVolume, names: Names<'_>) -> bool {
    is_ours(volume, names) && annotations::provisioned_by(volume).is_some_and(|p| names.knows(p))
}

/// The end of the second `created` shows: the API server keeps creation times in whole
/// seconds (truncated), so a PV may have been created up to a second after the time it
/// shows.
fn created_end(volume: &PersistentVolume) -> Option<Timestamp> {
    let created = volume.metadata.creation_timestamp.as_ref()?;
    Some(after(created.0, CREATION_PRECISION))
}

/// The value of [`ANN_LATE_ASSET_SWEEP`] for a PV about to be saved at `now` with the
/// late-asset `window`: the time its window ends; `None` for no window (or a zero one).
pub(crate) fn sweep_due_annotation(window: Option<Duration>, now: Timestamp) -> Option<String> {
    let window = window.filter(|w| !w.is_zero())?;
    Some(after(now, window).to_string())
}

/// When the last sweep recorded on `volume` ([`ANN_LATE_ASSET_SWEEP`]) is due (pure): the
/// later of the time it names and the end of the window counted from the PV's creation
/// (an annotation that is no time counts as the latter; with no creation time either, as
/// due now, `now`). `None`: no annotation, no window (or a zero one), a PV not provisioned
/// by us, or one being deleted.
pub(crate) fn recorded_due(
    volume: &PersistentVolume,
    names: Names<'_>,
    window: Option<Duration>,
    now: Timestamp,
) -> Option<Timestamp> {
    let window = window.filter(|w| !w.is_zero())?;
    let value = volume
        .metadata
        .annotations
        .as_ref()?
        .get(ANN_LATE_ASSET_SWEEP)?;
    if volume.metadata.deletion_timestamp.is_some() || !provisioned_by_us(volume, names) {
        return None;
    }
    if value.parse::<Timestamp>().is_err() {
        tracing::debug!(
            pv = volume.metadata.name.as_deref().unwrap_or_default(),
            annotation = ANN_LATE_ASSET_SWEEP,
            value = value.as_str(),
            "the recorded end of the late-asset window is no time; counting it from the volume's creation"
        );
    }
    Some(window_end(volume, window).unwrap_or(now))
}

/// The key of `volume` in [`LateAssets::kept`]: its name and UID.
fn kept_key(volume: &PersistentVolume) -> (String, String) {
    (
        volume.metadata.name.clone().unwrap_or_default(),
        volume.metadata.uid.clone().unwrap_or_default(),
    )
}

/// For a PV we provisioned for a driver with a late-asset window that has not ended yet:
/// when it ends, and the time left until then.
pub(crate) fn window_left(
    ctx: &Context,
    volume: &PersistentVolume,
) -> Option<(Timestamp, Duration)> {
    let window = ctx
        .provisioner
        .late_asset_window()
        .filter(|w| !w.is_zero())?;
    if !provisioned_by_us(volume, ctx.names()) {
        return None;
    }
    let due = window_end(volume, window)?;
    let wait = Duration::try_from(due.duration_since(Timestamp::now())).ok()?;
    (!wait.is_zero()).then_some((due, wait))
}

/// When the late-asset window of `volume` ends: the later of the end recorded in
/// [`ANN_LATE_ASSET_SWEEP`] (when it is a time) and the end counted from the volume's
/// creation; `None` when neither is known.
fn window_end(volume: &PersistentVolume, window: Duration) -> Option<Timestamp> {
    let recorded = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_LATE_ASSET_SWEEP))
        .and_then(|v| v.parse::<Timestamp>().ok());
    let computed = created_end(volume).map(|c| after(c, window));
    recorded.into_iter().chain(computed).max()
}

/// What to do for `volume` at `now` (pure), with the late-asset `window` and the takeover
/// `grace` ([`grace`]). `swept` is the UID recorded for its name and what was done, if it
/// was swept in this process. The age counts from the end of the second of the PV's
/// creation time (the API server truncates it to whole seconds). A PV whose creation time
/// lies ahead of `now` (clock skew) counts as just created. A zero window sweeps nothing.
pub(crate) fn plan(
    volume: &PersistentVolume,
    names: Names<'_>,
    window: Duration,
    grace: Duration,
    now: Timestamp,
    swept: Option<(&str, Swept)>,
) -> Sweep {
    let Some(created) = created_end(volume) else {
        return Sweep::Nothing;
    };
    if window.is_zero()
        || volume.metadata.deletion_timestamp.is_some()
        || !provisioned_by_us(volume, names)
    {
        return Sweep::Nothing;
    }
    // A record of another PV of this name does not count.
    let swept = swept
        .filter(|(uid, _)| volume.metadata.uid.as_deref() == Some(*uid))
        .map(|(_, s)| s);
    // The API server keeps creation times in whole seconds (truncated): the PV may have
    // been created up to a second after the time it shows, so its age counts from the end
    // of that second, and its window never ends early (a create sent right before the PV
    // was saved lands up to a window after it was sent).
    let age = Duration::try_from(now.duration_since(created)).unwrap_or(Duration::ZERO);
    let left = |bound: Duration| bound.checked_sub(age).filter(|d| !d.is_zero());
    let in_window = left(window);
    let in_grace = left(window.saturating_add(grace));
    match (swept, in_window, in_grace) {
        (None, Some(remaining), _) => Sweep::First(remaining),
        (Some(Swept::Young), Some(remaining), _) => Sweep::Wait(remaining),
        (Some(Swept::Young), None, keep) => Sweep::Last(keep.unwrap_or_default()),
        (None, None, Some(keep)) => Sweep::Takeover(keep),
        (Some(Swept::Done), _, Some(keep)) => Sweep::Done(keep),
        (None | Some(Swept::Done), None, None) | (Some(Swept::Done), Some(_), None) => {
            Sweep::Nothing
        }
    }
}

/// `now` plus `delay`, or the end of time.
fn after(now: Timestamp, delay: Duration) -> Timestamp {
    now.checked_add(delay).unwrap_or(Timestamp::MAX)
}

/// The stage of a PV after `step` at `now`.
fn stage_after(step: Sweep, now: Timestamp) -> Stage {
    match step {
        Sweep::First(_) | Sweep::Wait(_) => Stage::LastDue,
        Sweep::Last(keep) | Sweep::Takeover(keep) | Sweep::Done(keep) if !keep.is_zero() => {
            Stage::Done {
                expires: after(now, keep),
            }
        }
        Sweep::Last(_) | Sweep::Takeover(_) | Sweep::Done(_) | Sweep::Nothing => Stage::Owing,
    }
}

/// The sweep part of a volume sync: the late-asset sweeps, and a failed sweep when it is
/// due again. Never fails the sync; a call waits for the driver at most
/// [`Config::provision_timeout`](crate::Config::provision_timeout). `volume` is `None` when
/// the PV named `name` is not in the cache.
pub(crate) async fn sweep(ctx: &Context, name: &str, volume: Option<&PersistentVolume>) {
    let Some(volume) = volume else {
        // A PV we just saved that the cache does not show yet keeps its entry: its
        // arrival in the cache queues it again.
        if !ctx.caches.volume_exists(name) {
            ctx.late.pending().remove(name);
            sweep_deleted(ctx, name).await;
        }
        return;
    };
    let window = ctx.provisioner.late_asset_window();
    let now = Instant::now();
    let wall = Timestamp::now();
    let recorded = recorded_due(volume, ctx.names(), window, wall);
    let (step, owed) = {
        let mut pending = ctx.late.pending();
        let uid = volume.metadata.uid.as_deref().unwrap_or_default();
        // An entry of another PV of this name does not count.
        let entry = pending.get(name).filter(|e| e.uid == uid).cloned();
        let names = ctx.names();
        if (window.is_none() && entry.is_none())
            || volume.metadata.deletion_timestamp.is_some()
            || !is_ours(volume, names)
        {
            pending.remove(name);
            return;
        }
        let swept = entry
            .as_ref()
            .and_then(|e| Some((e.uid.as_str(), e.stage.swept()?)));
        let step = window.map_or(Sweep::Nothing, |window| {
            plan(
                volume,
                names,
                window,
                grace(&ctx.config, window),
                wall,
                swept,
            )
        });
        let owed = entry.and_then(|e| e.owed);
        let stage = stage_after(step, wall);
        if stage != Stage::Owing || owed.is_some() {
            let entry = pending
                .entry(name.to_owned())
                .or_insert_with(|| Entry::new(uid));
            if entry.uid != uid {
                *entry = Entry::new(uid);
            }
            entry.stage = stage;
        } else {
            pending.remove(name);
        }
        (step, owed)
    };
    match step {
        // Queued again on every sync until then: of several delayed adds of a key the
        // queue keeps the earliest, which may be a retry that comes first.
        Sweep::First(remaining) | Sweep::Wait(remaining) => {
            ctx.volume_queue.add_after(name.to_owned(), remaining);
        }
        // Once, when the PV is swept for good: that sync drops its entry.
        Sweep::Last(keep) | Sweep::Takeover(keep) if !keep.is_zero() => {
            ctx.volume_queue.add_after(name.to_owned(), keep);
        }
        Sweep::Last(_) | Sweep::Takeover(_) | Sweep::Done(_) | Sweep::Nothing => {}
    }
    // The last sweep recorded on the PV: due now, or queued for when it is.
    // Removed by this process already, and the cache has not caught up: not owed.
    let cleared = recorded.is_some() && ctx.late.cleared_already(volume);
    let recorded_owed = match recorded {
        Some(_) if cleared => false,
        Some(due) if due <= wall => true,
        Some(due) => {
            let wait = Duration::try_from(due.duration_since(wall)).unwrap_or(Duration::ZERO);
            ctx.volume_queue.add_after(name.to_owned(), wait);
            false
        }
        None => false,
    };
    match (step, owed) {
        (Sweep::First(remaining), _) => tracing::debug!(
            pv = name,
            ?remaining,
            "young volume: asking the driver to release late assets now and when its window ends"
        ),
        (Sweep::Last(_), _) => tracing::debug!(
            pv = name,
            "late-asset window ended: asking the driver to release late assets"
        ),
        (Sweep::Takeover(_), _) => tracing::debug!(
            pv = name,
            "late-asset window ended within the takeover grace and the volume was never swept in this process (the process that saved it may have stopped leading before its last sweep): asking the driver to release late assets"
        ),
        (Sweep::Wait(_) | Sweep::Done(_) | Sweep::Nothing, Some(owed)) if owed.due <= now => {
            tracing::debug!(
                pv = name,
                failures = owed.attempts,
                "asking the driver again to release what else it holds for the claim of the volume"
            );
        }
        (Sweep::Wait(_) | Sweep::Done(_) | Sweep::Nothing, Some(owed)) => {
            ctx.volume_queue
                .add_after(name.to_owned(), owed.due.saturating_duration_since(now));
            return;
        }
        (Sweep::Wait(_) | Sweep::Done(_) | Sweep::Nothing, None) if recorded_owed => {
            tracing::info!(
                pv = name,
                "the late-asset window recorded on the volume ended and its last sweep is still owed (the process that saved it may have stopped leading before its window ended): asking the driver to release late assets"
            );
        }
        (Sweep::Wait(_) | Sweep::Done(_) | Sweep::Nothing, None) => return,
    }
    let started = Timestamp::now();
    if volume_saved(ctx, volume).await && !cleared && recorded.is_some_and(|due| due <= started) {
        clear_recorded(ctx, volume).await;
    }
}

/// Records that `volume` (a PV we provisioned) was deleted before its late-asset window
/// ended: the volume queue brings its name back when the window ends, and
/// [`sweep_deleted`] asks the driver once more. Called by the process that deleted it
/// (after the driver deleted its asset) and by every process whose watch sees it go
/// (the volume feeder), leader or standby: the one that deleted it may stop before the
/// window ends, and its memory with it. The window's end is the later of the one recorded
/// on the PV ([`ANN_LATE_ASSET_SWEEP`]) and the one counted from its creation. Nothing for a
/// driver without a window, or a window over; a name recorded already keeps its record.
pub(crate) fn deleted(ctx: &Context, volume: &PersistentVolume) {
    let Some(name) = volume.metadata.name.clone() else {
        return;
    };
    let Some((due, wait)) = window_left(ctx, volume) else {
        return;
    };
    let now = Timestamp::now();
    let window = ctx.provisioner.late_asset_window().unwrap_or_default();
    {
        let mut afterlife = ctx.late.afterlife();
        // A standby never sweeps: what it recorded is dropped once the leader's sweep has
        // long been due, so its record stays bounded by the PVs deleted while young.
        afterlife.retain(|_, e| {
            Duration::try_from(now.duration_since(e.due)).map_or(true, |late| late <= window)
        });
        if afterlife.contains_key(&name) {
            return;
        }
        tracing::debug!(pv = %name, ?wait, "deleted before its late-asset window ended: the driver is asked once more when it ends");
        afterlife.insert(
            name.clone(),
            Afterlife {
                volume: volume.clone(),
                due,
                failures: 0,
            },
        );
    }
    // A standby queues it when it starts leading (`Context::queue_everything`).
    if ctx.accepting() {
        ctx.volume_queue.add_after(name, wait);
    }
}

/// The names of the deleted PVs whose last sweep is still to be made ([`deleted`]).
pub(crate) fn afterlife_names(ctx: &Context) -> Vec<String> {
    ctx.late.afterlife().keys().cloned().collect()
}

/// The last sweep of a PV this process deleted before its window ended ([`deleted`]):
/// once the window is over, the driver's [`Provisioner::volume_saved`] with the deleted PV
/// (every asset of its name but the PV's own, already deleted, is a leftover), retried
/// with backoff until it succeeds. Before, the name is queued again for the window's end.
async fn sweep_deleted(ctx: &Context, name: &str) {
    let Some(entry) = ctx.late.afterlife().get(name).cloned() else {
        return;
    };
    let now = Timestamp::now();
    if let Ok(wait) = Duration::try_from(entry.due.duration_since(now))
        && !wait.is_zero()
    {
        ctx.volume_queue.add_after(name.to_owned(), wait);
        return;
    }
    let result = ctx
        .driver_slots
        .deleting(
            ctx.config.provision_timeout,
            ctx.provisioner.volume_saved(&entry.volume),
        )
        .await;
    let error = match result {
        Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => {
            tracing::info!(
                pv = name,
                "late-asset window of a deleted volume ended: its leftovers were released"
            );
            ctx.late.afterlife().remove(name);
            return;
        }
        Ok(Err(DeleteError::Failed(e))) => chain(&*e),
        Err(e) => chain(&e.into_op("volume_saved")),
    };
    let failures = entry.failures.saturating_add(1);
    let retry_in = retry_delay(failures, ctx.config.resync_period);
    if let Some(e) = ctx.late.afterlife().get_mut(name) {
        e.failures = failures;
    }
    tracing::warn!(pv = name, failures, ?retry_in, %error, "the driver failed to release the leftovers of a deleted volume; asked again");
    ctx.volume_queue.add_after(name.to_owned(), retry_in);
}

/// Removes [`ANN_LATE_ASSET_SWEEP`] from `volume` once its last sweep was made: a merge
/// patch with the PV's UID as precondition and no resourceVersion (a concurrent change
/// of the PV is no conflict). A PV gone or re-created under its name needs nothing. A
/// failure is logged, and the sweep owed again (with the same backoff as a failed sweep),
/// so the removal is retried after another sweep; the annotation stays meanwhile.
async fn clear_recorded(ctx: &Context, volume: &PersistentVolume) {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let uid = volume.metadata.uid.as_deref().unwrap_or_default();
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let patch = removal_patch(uid);
    let removed = api(
        ctx.config.provision_timeout,
        || format!("remove annotation {ANN_LATE_ASSET_SWEEP} of persistentvolume {name}"),
        volumes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await;
    let error = match removed {
        Ok(_) => {
            tracing::debug!(pv = name, "late-asset sweep made: its record removed");
            ctx.late.cleared().insert(
                name.to_owned(),
                (uid.to_owned(), volume.metadata.resource_version.clone()),
            );
            return;
        }
        Err(OpError::Api { source, .. })
            if is_api(&source, |s| {
                s.is_not_found() || s.is_conflict() || is_other_uid(s)
            }) =>
        {
            // Gone, or another PV under the name (the uid of a patch: a 422 from a real
            // server, a 409 from older simulators).
            return;
        }
        Err(err) => chain(&err),
    };
    let cap = ctx.config.resync_period;
    let Some((attempts, retry_in)) = ctx.late.settle(name, uid, true, cap) else {
        return;
    };
    tracing::warn!(pv = name, attempts, ?retry_in, %error, "failed to remove the record of the late-asset sweep from the volume; swept again and retried");
    ctx.volume_queue.add_after(name.to_owned(), retry_in);
}

/// The merge patch that removes [`ANN_LATE_ASSET_SWEEP`] (pure), with `uid` as
/// precondition when known.
fn removal_patch(uid: &str) -> serde_json::Value {
    let mut meta = serde_json::Map::new();
    if !uid.is_empty() {
        meta.insert("uid".into(), uid.into());
    }
    meta.insert(
        "annotations".into(),
        serde_json::json!({ ANN_LATE_ASSET_SWEEP: null }),
    );
    serde_json::json!({ "metadata": meta })
}

/// Records that the driver is about to hear of the saved PV `saved` (after a save or
/// reuse in this process): when that call is its first sweep in this process, its first
/// sync here only waits for the last sweep; when it is its last sweep (or the one sweep
/// of a PV whose window ended), it is swept for good.
pub(crate) fn saved(ctx: &Context, saved: &PersistentVolume) {
    let Some(window) = ctx.provisioner.late_asset_window() else {
        return;
    };
    let (Some(name), Some(uid)) = (&saved.metadata.name, &saved.metadata.uid) else {
        return;
    };
    let wall = Timestamp::now();
    let mut pending = ctx.late.pending();
    let swept = pending
        .get(name)
        .and_then(|e| Some((e.uid.as_str(), e.stage.swept()?)));
    let step = plan(
        saved,
        ctx.names(),
        window,
        grace(&ctx.config, window),
        wall,
        swept,
    );
    let keep = match step {
        Sweep::First(_) => None,
        Sweep::Last(keep) | Sweep::Takeover(keep) => Some(keep),
        Sweep::Wait(_) | Sweep::Done(_) | Sweep::Nothing => return,
    };
    let stage = stage_after(step, wall);
    if stage == Stage::Owing {
        // Older than the window plus the grace: nothing left to remember but a debt.
        if let Some(entry) = pending.get_mut(name.as_str())
            && entry.uid == *uid
        {
            entry.stage = Stage::Owing;
            if entry.owed.is_none() {
                pending.remove(name.as_str());
            }
        }
        return;
    }
    let entry = pending
        .entry(name.clone())
        .or_insert_with(|| Entry::new(uid));
    if entry.uid != *uid {
        *entry = Entry::new(uid);
    }
    entry.stage = stage;
    drop(pending);
    // Swept for good: that sync drops its entry.
    if let Some(keep) = keep {
        ctx.volume_queue.add_after(name.clone(), keep);
    }
}

/// Tells the driver that `volume` is saved
/// ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)), bounded by the
/// provision timeout, and records how that ended; returns whether the driver answered
/// without failing. Never fails: a failure is logged with the failures in a row, the
/// sweep is owed, and the PV is queued in the volume queue for the next attempt (ignored
/// once the queue is shut down).
pub(crate) async fn volume_saved(ctx: &Context, volume: &PersistentVolume) -> bool {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let uid = volume.metadata.uid.as_deref().unwrap_or_default();
    let result = match ctx
        .driver_slots
        .deleting(
            ctx.config.provision_timeout,
            ctx.provisioner.volume_saved(volume),
        )
        .await
    {
        Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => Ok(()),
        Ok(Err(DeleteError::Failed(e))) => Err(chain(&*e)),
        Err(e) => Err(chain(&e.into_op("volume_saved"))),
    };
    let succeeded = result.is_ok();
    if name.is_empty() || uid.is_empty() {
        // Not a PV as the API server stores it: nothing to sweep again.
        if let Err(error) = result {
            tracing::warn!(pv = name, %error, "the driver failed to release what else it holds for the claim of the saved volume; the volume is kept");
        }
        return succeeded;
    }
    let cap = ctx.config.resync_period;
    let Some((attempts, retry_in)) = ctx.late.settle(name, uid, !succeeded, cap) else {
        return succeeded;
    };
    let error = result.err().unwrap_or_default();
    tracing::warn!(pv = name, attempts, ?retry_in, %error, "the driver failed to release what else it holds for the claim of the saved volume; the volume is kept and synced as usual, and the driver is asked again");
    ctx.volume_queue.add_after(name.to_owned(), retry_in);
    succeeded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pv;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const ME: &str = "example.com/me";
    const WINDOW: Duration = Duration::from_secs(60);
    const GRACE: Duration = Duration::from_secs(30);

    fn names() -> Names<'static> {
        Names {
            primary: ME,
            additional: &[],
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    /// A PV of `builder`, uid `u1`, created at second 1000 as the API server shows it
    /// (so at most a second later: its age counts from second 1001).
    fn created(builder: crate::testing::PvBuilder) -> PersistentVolume {
        let mut v = builder.build();
        v.metadata.uid = Some("u1".into());
        v.metadata.creation_timestamp = Some(Time(at(1000)));
        v
    }

    /// A case of [`plan`]: what, the PV, the time, the record, the plan wanted.
    type Case<'a> = (
        &'a str,
        PersistentVolume,
        i64,
        Option<(&'a str, Swept)>,
        Sweep,
    );

    #[test]
    fn sweep_decisions() {
        let ours = || created(pv("v").provisioned_by(ME));
        let secs = Duration::from_secs;
        let young = Some(("u1", Swept::Young));
        let done = Some(("u1", Swept::Done));
        let cases: Vec<Case<'_>> = vec![
            (
                "a young PV of ours is swept at its first sync",
                ours(),
                1011,
                None,
                Sweep::First(secs(50)),
            ),
            (
                "a young PV already swept waits for the end of its window",
                ours(),
                1021,
                young,
                Sweep::Wait(secs(40)),
            ),
            (
                "a swept PV whose window ended gets its last sweep, then is remembered \
                 until the grace ends",
                ours(),
                1061,
                young,
                Sweep::Last(secs(30)),
            ),
            (
                "a swept PV whose last sweep comes after the grace is not remembered",
                ours(),
                1101,
                young,
                Sweep::Last(Duration::ZERO),
            ),
            (
                "a PV never swept here whose window ended within the grace is swept once",
                ours(),
                1061,
                None,
                Sweep::Takeover(secs(30)),
            ),
            (
                "a PV never swept here, in the last second of the grace",
                ours(),
                1090,
                None,
                Sweep::Takeover(secs(1)),
            ),
            (
                "a PV never swept here, older than the window plus the grace, gets nothing",
                ours(),
                1091,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV swept for good within the grace is not swept again",
                ours(),
                1071,
                done,
                Sweep::Done(secs(20)),
            ),
            (
                "a PV swept for good is forgotten once the grace ended",
                ours(),
                1091,
                done,
                Sweep::Nothing,
            ),
            (
                "a PV swept for good whose creation time moved ahead stays swept",
                ours(),
                1011,
                done,
                Sweep::Done(secs(80)),
            ),
            (
                "a PV re-created under a swept name is swept as new",
                ours(),
                1011,
                Some(("u0", Swept::Young)),
                Sweep::First(secs(50)),
            ),
            (
                "a PV re-created under a name swept for good is swept as new",
                ours(),
                1071,
                Some(("u0", Swept::Done)),
                Sweep::Takeover(secs(20)),
            ),
            (
                "a PV created ahead of our clock counts as just created",
                ours(),
                990,
                None,
                Sweep::First(WINDOW),
            ),
            (
                "a PV of another provisioner gets nothing",
                created(pv("v").provisioned_by("example.com/other")),
                1011,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV of another provisioner gets nothing after its window either",
                created(pv("v").provisioned_by("example.com/other")),
                1071,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV migrated to us gets nothing: we did not provision it",
                created(pv("v").provisioned_by("in/tree").migrated_to(ME)),
                1011,
                None,
                Sweep::Nothing,
            ),
            (
                "a static PV gets nothing",
                created(pv("v")),
                1071,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV being deleted gets nothing",
                created(pv("v").provisioned_by(ME).deleting()),
                1011,
                young,
                Sweep::Nothing,
            ),
            (
                "a PV being deleted gets nothing within the grace either",
                created(pv("v").provisioned_by(ME).deleting()),
                1071,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV without a creation time gets nothing",
                pv("v").provisioned_by(ME).build(),
                1011,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV shown created at second 1000 may be up to a second younger: its \
                 window has not ended at 1060",
                ours(),
                1060,
                young,
                Sweep::Wait(secs(1)),
            ),
            (
                "a PV shown created at second 1000, never swept here, is still young at 1060",
                ours(),
                1060,
                None,
                Sweep::First(secs(1)),
            ),
        ];
        for (name, volume, now, swept, want) in cases {
            assert_eq!(
                plan(&volume, names(), WINDOW, GRACE, at(now), swept),
                want,
                "case: {name}"
            );
        }
    }

    #[test]
    fn a_zero_window_sweeps_nothing() {
        let volume = created(pv("v").provisioned_by(ME));
        for now in [1000, 1010, 1040] {
            assert_eq!(
                plan(&volume, names(), Duration::ZERO, GRACE, at(now), None),
                Sweep::Nothing,
                "at {now}"
            );
        }
    }

    #[test]
    fn the_grace_is_the_window_plus_the_time_to_take_over_the_lease() {
        let secs = Duration::from_secs;
        let millis = Duration::from_millis;
        let none = Config::default().leader_election(None);
        assert_eq!(takeover(&none), Duration::ZERO, "no election: no takeover");
        assert_eq!(
            grace(&none, secs(60)),
            secs(60),
            "the window covers a restart"
        );
        // Go's timings: 15 s lease, 10 s renew deadline, 2 s retry (jittered up to 4.4 s).
        let go = Config::default().leader_election(Some(LeaderElection::default()));
        assert_eq!(takeover(&go), millis(33_800));
        assert_eq!(grace(&go, secs(60)), millis(93_800));
        // The chaos suite's compressed timings.
        let short = Config::default().leader_election(Some(
            LeaderElection::default()
                .lease_duration(secs(2))
                .renew_deadline(millis(1_500))
                .retry_period(millis(300)),
        ));
        assert_eq!(takeover(&short), millis(4_820));
        assert_eq!(grace(&short, millis(5_500)), millis(10_320));
        // Absurd timings saturate instead of panicking.
        let huge = Config::default().leader_election(Some(
            LeaderElection::default()
                .lease_duration(Duration::MAX)
                .retry_period(Duration::MAX),
        ));
        assert_eq!(grace(&huge, secs(60)), Duration::MAX);
    }
}
