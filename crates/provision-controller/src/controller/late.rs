//! Late assets: with [`Provisioner::late_asset_window`](crate::Provisioner::late_asset_window),
//! the driver hears of a young PV we provisioned again
//! ([`Provisioner::volume_saved`](crate::Provisioner::volume_saved)) at its first sync in
//! this process and once more when the window has passed since the PV was created, so an
//! asset made for its claim that landed late (a create that timed out, sent by a replica
//! that may have died since) is released too.
//!
//! The state is one entry per young PV already swept once and waiting for its last sweep:
//! an entry is dropped at that sweep, or when the PV is gone, being deleted, no longer
//! ours or re-created under its name, so it never outgrows the PVs younger than the
//! window.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::{api::core::v1::PersistentVolume, jiff::Timestamp};

use super::{
    Context,
    op::{Names, call, chain},
};
use crate::{DeleteError, annotations};

/// Young PVs swept once in this process, by name, with their UID: each waits for its
/// last sweep when its window ends.
#[derive(Default)]
pub(crate) struct LateAssets {
    pending: Mutex<HashMap<String, String>>,
}

impl LateAssets {
    fn pending(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops the entries of PVs that `exists` no longer knows (at resync: a deletion whose
    /// sync never came, e.g. across a relist).
    pub(crate) fn retain(&self, exists: impl Fn(&str) -> bool) {
        self.pending().retain(|name, _| exists(name));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pending().len()
    }
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

/// The late-asset part of a volume sync; never fails the sync. `volume` is `None` when
/// the PV named `name` is gone.
pub(crate) async fn sweep(ctx: &Context, name: &str, volume: Option<&PersistentVolume>) {
    let Some(window) = ctx.provisioner.late_asset_window() else {
        return;
    };
    let Some(volume) = volume else {
        ctx.late.pending().remove(name);
        return;
    };
    let step = {
        let mut pending = ctx.late.pending();
        let step = plan(
            volume,
            ctx.names(),
            window,
            Timestamp::now(),
            pending.get(name).map(String::as_str),
        );
        match step {
            Sweep::First(_) => {
                let uid = volume.metadata.uid.clone().unwrap_or_default();
                pending.insert(name.to_owned(), uid);
            }
            Sweep::Wait(_) => {}
            Sweep::Last | Sweep::Nothing => {
                pending.remove(name);
            }
        }
        step
    };
    match step {
        Sweep::Nothing => {}
        // Queued again on every sync until then: of several delayed adds of a key the
        // queue keeps the earliest, which may be a retry that comes first.
        Sweep::Wait(remaining) => ctx.volume_queue.add_after(name.to_owned(), remaining),
        Sweep::First(remaining) => {
            tracing::debug!(
                pv = name,
                ?remaining,
                "young volume: asking the driver to release late assets now and when its window ends"
            );
            volume_saved(ctx, name, volume).await;
            ctx.volume_queue.add_after(name.to_owned(), remaining);
        }
        Sweep::Last => {
            tracing::debug!(
                pv = name,
                "late-asset window ended: asking the driver to release late assets"
            );
            volume_saved(ctx, name, volume).await;
        }
    }
}

/// Records that the driver just heard of the saved PV `saved` (after a save or reuse in
/// this process), so that its first sync here only waits for the last sweep.
pub(crate) fn saved(ctx: &Context, saved: &PersistentVolume) {
    let Some(window) = ctx.provisioner.late_asset_window() else {
        return;
    };
    let (Some(name), Some(uid)) = (&saved.metadata.name, &saved.metadata.uid) else {
        return;
    };
    let mut pending = ctx.late.pending();
    let swept = pending.get(name).map(String::as_str);
    if let Sweep::First(_) = plan(saved, ctx.names(), window, Timestamp::now(), swept) {
        pending.insert(name.clone(), uid.clone());
    }
}

async fn volume_saved(ctx: &Context, name: &str, volume: &PersistentVolume) {
    let error = match call(
        ctx.config.provision_timeout,
        ctx.provisioner.volume_saved(volume),
    )
    .await
    {
        Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => return,
        Ok(Err(DeleteError::Failed(e))) => chain(&*e),
        Err(e) => chain(&e.into_op("volume_saved")),
    };
    tracing::warn!(pv = name, %error, "the driver failed to release late assets made for the claim of the volume; the volume is kept and synced as usual");
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
