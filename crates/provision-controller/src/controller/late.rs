//! Late assets and owed sweeps: the driver hears of a saved PV
//! ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)) after every save, and
//! until it has heard of it without failing.
//!
//! - With [`Provisioner::late_asset_window`](crate::Provisioner::late_asset_window), a
//!   young PV we provisioned is swept again at its first sync in this process and once
//!   more when the window has passed since the PV was created, so an asset made for its
//!   claim that landed late (a create that timed out, sent by a replica that may have
//!   died since) is released too.
//! - A sweep that fails (after a save, at a first sync, or when the window ends) is owed:
//!   the PV is queued again after a backoff (1 s doubling, capped at the resync period)
//!   and swept again at that sync, until the driver answers without failing. It runs in
//!   the volume worker, so only while leading.
//!
//! The state is one entry per PV with a sweep still due (the last sweep of its window, or
//! an owed one): an entry is dropped once nothing is due any more, or when the PV is gone,
//! being deleted, no longer ours or re-created under its name, so it never outgrows the
//! PVs that are young or whose driver keeps failing.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::{api::core::v1::PersistentVolume, jiff::Timestamp};
use tokio::time::Instant;

use super::{
    Context,
    op::{Names, call, chain},
};
use crate::{DeleteError, annotations};

/// The delay before the first retry of a failed sweep; each further failure doubles it,
/// up to the resync period.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The sweeps still due for one PV.
#[derive(Clone, Debug)]
struct Entry {
    /// The PV's UID: a PV re-created under the name is another PV.
    uid: String,
    /// Swept once in this process while young: the last sweep is due when its late-asset
    /// window ends.
    last_due: bool,
    /// A sweep that failed, to be made again.
    owed: Option<Owed>,
}

impl Entry {
    fn new(uid: &str) -> Self {
        Self {
            uid: uid.to_owned(),
            last_due: false,
            owed: None,
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

/// PVs with a sweep still due, by name.
#[derive(Default)]
pub(crate) struct LateAssets {
    pending: Mutex<HashMap<String, Entry>>,
}

impl LateAssets {
    fn pending(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops the entries of PVs that `exists` no longer knows (at resync: a deletion whose
    /// sync never came, e.g. across a relist).
    pub(crate) fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.pending().retain(|name, _| exists(name));
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
            if !entry.last_due {
                pending.remove(name);
            }
        }
        None
    }

    /// PVs with a sweep still due.
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

/// What a sync of a PV does about late assets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// Nothing: not a young PV of ours, or its last sweep is done.
    Nothing,
    /// The first sweep in this process; the last one is due after the delay.
    First(Duration),
    /// Already swept; the last sweep is due after the delay.
    Wait(Duration),
    /// The window has passed: the last sweep.
    Last,
}

/// Whether `volume` was dynamically provisioned under one of our names (its
/// `pv.kubernetes.io/provisioned-by` names us): only such a PV's claim can have assets
/// of ours that landed late. Narrower than [`is_ours`](super::volume::is_ours), which
/// also counts static PVs of our driver and PVs migrated to us.
pub(crate) fn provisioned_by_us(volume: &PersistentVolume, names: Names<'_>) -> bool {
    super::volume::is_ours(volume, names)
        && annotations::provisioned_by(volume).is_some_and(|p| names.knows(p))
}

/// What to do for `volume` at `now` (pure). `swept` is the UID recorded for its name,
/// if it was swept once in this process. A PV whose creation time lies ahead of `now`
/// (clock skew) counts as just created.
pub(crate) fn plan(
    volume: &PersistentVolume,
    names: Names<'_>,
    window: Duration,
    now: Timestamp,
    swept: Option<&str>,
) -> Sweep {
    let Some(created) = &volume.metadata.creation_timestamp else {
        return Sweep::Nothing;
    };
    if volume.metadata.deletion_timestamp.is_some() || !provisioned_by_us(volume, names) {
        return Sweep::Nothing;
    }
    let same = swept.is_some_and(|uid| volume.metadata.uid.as_deref() == Some(uid));
    let age = Duration::try_from(now.duration_since(created.0)).unwrap_or(Duration::ZERO);
    match (window.checked_sub(age).filter(|d| !d.is_zero()), same) {
        (Some(remaining), true) => Sweep::Wait(remaining),
        (Some(remaining), false) => Sweep::First(remaining),
        (None, true) => Sweep::Last,
        (None, false) => Sweep::Nothing,
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
        }
        return;
    };
    let window = ctx.provisioner.late_asset_window();
    let now = Instant::now();
    let (step, owed) = {
        let mut pending = ctx.late.pending();
        let uid = volume.metadata.uid.as_deref().unwrap_or_default();
        // An entry of another PV of this name does not count.
        let entry = pending.get(name).filter(|e| e.uid == uid).cloned();
        let names = ctx.names();
        if (window.is_none() && entry.is_none())
            || volume.metadata.deletion_timestamp.is_some()
            || !super::volume::is_ours(volume, names)
        {
            pending.remove(name);
            return;
        }
        let swept = entry
            .as_ref()
            .filter(|e| e.last_due)
            .map(|e| e.uid.as_str());
        let step = window.map_or(Sweep::Nothing, |window| {
            plan(volume, names, window, Timestamp::now(), swept)
        });
        let owed = entry.and_then(|e| e.owed);
        let last_due = matches!(step, Sweep::First(_) | Sweep::Wait(_));
        if last_due || owed.is_some() {
            let entry = pending
                .entry(name.to_owned())
                .or_insert_with(|| Entry::new(uid));
            if entry.uid != uid {
                *entry = Entry::new(uid);
            }
            entry.last_due = last_due;
        } else {
            pending.remove(name);
        }
        (step, owed)
    };
    // Queued again on every sync until then: of several delayed adds of a key the
    // queue keeps the earliest, which may be a retry that comes first.
    if let Sweep::First(remaining) | Sweep::Wait(remaining) = step {
        ctx.volume_queue.add_after(name.to_owned(), remaining);
    }
    match (step, owed) {
        (Sweep::First(remaining), _) => tracing::debug!(
            pv = name,
            ?remaining,
            "young volume: asking the driver to release late assets now and when its window ends"
        ),
        (Sweep::Last, _) => tracing::debug!(
            pv = name,
            "late-asset window ended: asking the driver to release late assets"
        ),
        (Sweep::Wait(_) | Sweep::Nothing, Some(owed)) if owed.due <= now => tracing::debug!(
            pv = name,
            failures = owed.attempts,
            "asking the driver again to release what else it holds for the claim of the volume"
        ),
        (Sweep::Wait(_) | Sweep::Nothing, Some(owed)) => {
            ctx.volume_queue
                .add_after(name.to_owned(), owed.due.saturating_duration_since(now));
            return;
        }
        (Sweep::Wait(_) | Sweep::Nothing, None) => return,
    }
    volume_saved(ctx, volume).await;
}

/// Records that the driver is about to hear of the saved PV `saved` (after a save or
/// reuse in this process), so that its first sync here only waits for the last sweep.
pub(crate) fn saved(ctx: &Context, saved: &PersistentVolume) {
    let Some(window) = ctx.provisioner.late_asset_window() else {
        return;
    };
    let (Some(name), Some(uid)) = (&saved.metadata.name, &saved.metadata.uid) else {
        return;
    };
    let mut pending = ctx.late.pending();
    let swept = pending
        .get(name)
        .filter(|e| e.last_due)
        .map(|e| e.uid.as_str());
    if let Sweep::First(_) = plan(saved, ctx.names(), window, Timestamp::now(), swept) {
        let entry = pending
            .entry(name.clone())
            .or_insert_with(|| Entry::new(uid));
        if entry.uid != *uid {
            *entry = Entry::new(uid);
        }
        entry.last_due = true;
    }
}

/// Tells the driver that `volume` is saved
/// ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)), bounded by the
/// provision timeout, and records how that ended. Never fails: a failure is logged with
/// the failures in a row, the sweep is owed, and the PV is queued in the volume queue for
/// the next attempt (ignored once the queue is shut down).
pub(crate) async fn volume_saved(ctx: &Context, volume: &PersistentVolume) {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let uid = volume.metadata.uid.as_deref().unwrap_or_default();
    let result = match call(
        ctx.config.provision_timeout,
        ctx.provisioner.volume_saved(volume),
    )
    .await
    {
        Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => Ok(()),
        Ok(Err(DeleteError::Failed(e))) => Err(chain(&*e)),
        Err(e) => Err(chain(&e.into_op("volume_saved"))),
    };
    if name.is_empty() || uid.is_empty() {
        // Not a PV as the API server stores it: nothing to sweep again.
        if let Err(error) = result {
            tracing::warn!(pv = name, %error, "the driver failed to release what else it holds for the claim of the saved volume; the volume is kept");
        }
        return;
    }
    let cap = ctx.config.resync_period;
    let Some((attempts, retry_in)) = ctx.late.settle(name, uid, result.is_err(), cap) else {
        return;
    };
    let error = result.err().unwrap_or_default();
    tracing::warn!(pv = name, attempts, ?retry_in, %error, "the driver failed to release what else it holds for the claim of the saved volume; the volume is kept and synced as usual, and the driver is asked again");
    ctx.volume_queue.add_after(name.to_owned(), retry_in);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pv;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const ME: &str = "example.com/me";
    const WINDOW: Duration = Duration::from_secs(60);

    fn names() -> Names<'static> {
        Names {
            primary: ME,
            additional: &[],
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    /// A PV of `builder`, uid `u1`, created at second 1000.
    fn created(builder: crate::testing::PvBuilder) -> PersistentVolume {
        let mut v = builder.build();
        v.metadata.uid = Some("u1".into());
        v.metadata.creation_timestamp = Some(Time(at(1000)));
        v
    }

    #[test]
    fn sweep_decisions() {
        let ours = || created(pv("v").provisioned_by(ME));
        let secs = Duration::from_secs;
        let cases: Vec<(&str, PersistentVolume, i64, Option<&str>, Sweep)> = vec![
            (
                "a young PV of ours is swept at its first sync",
                ours(),
                1010,
                None,
                Sweep::First(secs(50)),
            ),
            (
                "a young PV already swept waits for the end of its window",
                ours(),
                1020,
                Some("u1"),
                Sweep::Wait(secs(40)),
            ),
            (
                "a swept PV whose window ended gets its last sweep",
                ours(),
                1060,
                Some("u1"),
                Sweep::Last,
            ),
            (
                "a PV older than the window never swept here gets nothing",
                ours(),
                1060,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV re-created under a swept name is swept as new",
                ours(),
                1010,
                Some("u0"),
                Sweep::First(secs(50)),
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
                1010,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV migrated to us gets nothing: we did not provision it",
                created(pv("v").provisioned_by("in/tree").migrated_to(ME)),
                1010,
                None,
                Sweep::Nothing,
            ),
            (
                "a static PV gets nothing",
                created(pv("v")),
                1010,
                None,
                Sweep::Nothing,
            ),
            (
                "a PV being deleted gets nothing",
                created(pv("v").provisioned_by(ME).deleting()),
                1010,
                Some("u1"),
                Sweep::Nothing,
            ),
            (
                "a PV without a creation time gets nothing",
                pv("v").provisioned_by(ME).build(),
                1010,
                None,
                Sweep::Nothing,
            ),
        ];
        for (name, volume, now, swept, want) in cases {
            assert_eq!(
                plan(&volume, names(), WINDOW, at(now), swept),
                want,
                "case: {name}"
            );
        }
    }

    #[test]
    fn a_zero_window_sweeps_nothing() {
        let volume = created(pv("v").provisioned_by(ME));
        assert_eq!(
            plan(&volume, names(), Duration::ZERO, at(1000), None),
            Sweep::Nothing
        );
    }
}
