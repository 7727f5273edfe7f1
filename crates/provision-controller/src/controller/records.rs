//! What this process remembers of each claim between its syncs, in one map of
//! [`Record`]s keyed by [`ClaimUid`]: the provisioning that may run in the background, the
//! driver's infeasible answer, the `ProvisioningHeld` warning sent, the first look of a
//! cleanup. A record goes as soon as all its parts are empty, so the map holds only
//! claims with something to remember.

use std::{
    borrow::Borrow,
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
use tokio::time::Instant;

use crate::metrics::ControllerMetrics;

/// A claim's `metadata.uid`: the key of its record (and of the claim queue).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ClaimUid(String);

impl From<&str> for ClaimUid {
    fn from(uid: &str) -> Self {
        Self(uid.to_owned())
    }
}

impl Borrow<str> for ClaimUid {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A claim whose provisioning may run in the background, and the class it was started
/// with (the driver is polled with that class even when the class is deleted or changed).
#[derive(Clone)]
pub(crate) struct InProgress {
    pub(crate) claim: Arc<PersistentVolumeClaim>,
    pub(crate) class: Option<Arc<StorageClass>>,
}

impl InProgress {
    pub(crate) fn new(claim: Arc<PersistentVolumeClaim>, class: Option<Arc<StorageClass>>) -> Self {
        Self { claim, class }
    }
}

/// Whether a claim's provisioning may run in the background when its sync starts: such a
/// claim is driven until the driver answers, whatever the claim, its class or the
/// qualifier say now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing is known to run in the backend.
    Idle,
    /// The driver may be creating the asset in the background.
    InBackground,
}

impl Progress {
    /// The progress of a claim whose record holds `entry`.
    pub(crate) fn of(entry: Option<&InProgress>) -> Self {
        if entry.is_some() {
            Self::InBackground
        } else {
            Self::Idle
        }
    }
}

/// Go's `ProvisioningState` after an attempt: what the claim's record must keep of its
/// provisioning ([`Records::remember`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Work may continue in the backend: keep driving the claim even once it is deleted.
    InBackground,
    /// Nothing runs in the backend.
    Finished,
    /// Keep whatever was remembered.
    NoChange,
}

/// When the driver called a claim infeasible, and the UID of the claim's class then.
struct Infeasible {
    since: Instant,
    class_uid: Option<String>,
}

/// Whether a claim got the `ProvisioningHeld` event in this process.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Held {
    #[default]
    NotWarned,
    Warned,
}

/// What this process remembers of one claim.
#[derive(Default)]
struct Record {
    /// Its provisioning may run in the background (Go `claimsInProgress`).
    in_progress: Option<InProgress>,
    /// The driver called it infeasible (Go `slowSet`): not provisioned again before
    /// [`Config::infeasible_retry_delay`](crate::Config::infeasible_retry_delay) unless
    /// its class was re-created.
    infeasible: Option<Infeasible>,
    /// It got the `ProvisioningHeld` event.
    held: Held,
    /// When this process first looked for the asset of the claim, which will not get our
    /// PV the normal way (the cleanup of `crash_safety`): "no asset" is believed only
    /// once the driver's late-asset window has passed since (a create sent before, by any
    /// replica, lands within it). Gone when the cleanup ends.
    cleanup_since: Option<Instant>,
}

impl Record {
    fn is_empty(&self) -> bool {
        self.in_progress.is_none()
            && self.infeasible.is_none()
            && self.held == Held::NotWarned
            && self.cleanup_since.is_none()
    }
}

#[derive(Default)]
struct Map {
    records: HashMap<ClaimUid, Record>,
    /// How many records have an `in_progress` part (the `claims_in_progress` gauge).
    in_progress: usize,
}

impl Map {
    /// Changes the record of `uid` with `change` (creating it when missing), and removes
    /// it when it is left empty.
    fn update<T>(&mut self, uid: &str, change: impl FnOnce(&mut Record) -> T) -> T {
        let record = match self.records.get_mut(uid) {
            Some(record) => record,
            None => self.records.entry(ClaimUid::from(uid)).or_default(),
        };
        let was_in_progress = record.in_progress.is_some();
        let answer = change(record);
        let is_in_progress = record.in_progress.is_some();
        if record.is_empty() {
            self.records.remove(uid);
        }
        match (was_in_progress, is_in_progress) {
            (false, true) => self.in_progress += 1,
            (true, false) => self.in_progress -= 1,
            _ => {}
        }
        answer
    }

    /// [`update`](Self::update) of a record that exists: nothing otherwise.
    fn update_known(&mut self, uid: &str, change: impl FnOnce(&mut Record)) {
        if self.records.contains_key(uid) {
            self.update(uid, change);
        }
    }
}

/// The records of the claims (see the module docs).
pub(crate) struct Records {
    map: Mutex<Map>,
    /// [`Config::infeasible_retry_delay`](crate::Config::infeasible_retry_delay).
    infeasible_delay: Duration,
    metrics: Option<ControllerMetrics>,
}

impl Records {
    pub(crate) fn new(infeasible_delay: Duration, metrics: Option<ControllerMetrics>) -> Self {
        Self {
            map: Mutex::default(),
            infeasible_delay,
            metrics,
        }
    }

    fn map(&self) -> MutexGuard<'_, Map> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`Map::update`] under the lock.
    fn update<T>(&self, uid: &str, change: impl FnOnce(&mut Record) -> T) -> T {
        self.map().update(uid, change)
    }

    /// The claim's provisioning that may run in the background, if any.
    pub(crate) fn in_progress(&self, uid: &str) -> Option<InProgress> {
        self.map()
            .records
            .get(uid)
            .and_then(|r| r.in_progress.clone())
    }

    pub(crate) fn is_in_progress(&self, uid: &str) -> bool {
        self.map()
            .records
            .get(uid)
            .is_some_and(|r| r.in_progress.is_some())
    }

    /// Remembers (`Some`) or forgets (`None`) that the claim's provisioning may run in the
    /// background. An entry without a class keeps the class remembered before, if any.
    pub(crate) fn set_in_progress(&self, uid: &str, entry: Option<InProgress>) {
        let n = {
            let mut map = self.map();
            match entry {
                Some(mut entry) => map.update(uid, |record| {
                    if entry.class.is_none() {
                        entry.class = record.in_progress.as_ref().and_then(|e| e.class.clone());
                    }
                    record.in_progress = Some(entry);
                }),
                None => map.update_known(uid, |record| record.in_progress = None),
            }
            map.in_progress
        };
        if let Some(m) = &self.metrics {
            m.set_claims_in_progress(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Records what a claim's sync left behind (`state`): the claim and `class`, the class
    /// its provisioning runs with, while it may run in the background; nothing once it
    /// finished. The one place a sync changes what is in progress.
    pub(crate) fn remember(
        &self,
        uid: &str,
        state: State,
        claim: &Arc<PersistentVolumeClaim>,
        class: Option<Arc<StorageClass>>,
    ) {
        match state {
            State::InBackground => {
                self.set_in_progress(uid, Some(InProgress::new(Arc::clone(claim), class)));
            }
            State::Finished => self.set_in_progress(uid, None),
            State::NoChange => {}
        }
    }

    /// Records that the driver called the claim infeasible with `class`; an earlier record
    /// that has not expired keeps its time (Go: a slow set keeps the first time).
    pub(crate) fn mark_infeasible(&self, uid: &str, class: Option<&StorageClass>) {
        let delay = self.infeasible_delay;
        self.update(uid, |record| {
            if record
                .infeasible
                .as_ref()
                .is_some_and(|e| e.since.elapsed() < delay)
            {
                return;
            }
            record.infeasible = Some(Infeasible {
                since: Instant::now(),
                class_uid: class.and_then(|c| c.metadata.uid.clone()),
            });
        });
    }

    /// How long the claim must still wait after the driver called it infeasible; `None`
    /// when it may be provisioned now. A class with another UID than the one the driver
    /// judged ends the wait; a missing class does not count (Go skips the check then).
    pub(crate) fn infeasible_wait(
        &self,
        uid: &str,
        class: Option<&StorageClass>,
    ) -> Option<Duration> {
        let class = class?;
        let delay = self.infeasible_delay;
        let mut map = self.map();
        let entry = map.records.get(uid)?.infeasible.as_ref()?;
        let remaining = delay.saturating_sub(entry.since.elapsed());
        if entry.class_uid != class.metadata.uid || remaining.is_zero() {
            map.update_known(uid, |record| record.infeasible = None);
            return None;
        }
        Some(remaining)
    }

    /// Forgets the infeasible answers whose wait is over (at every resync).
    pub(crate) fn prune_infeasible(&self) {
        let delay = self.infeasible_delay;
        // Only the infeasible parts change: no record in progress is removed.
        self.map().records.retain(|_, record| {
            if record
                .infeasible
                .as_ref()
                .is_some_and(|e| e.since.elapsed() >= delay)
            {
                record.infeasible = None;
            }
            !record.is_empty()
        });
    }

    /// Records that the claim got the `ProvisioningHeld` event; whether this is the first
    /// time in this process.
    pub(crate) fn warn_held_once(&self, uid: &str) -> bool {
        self.update(uid, |record| {
            let first = record.held == Held::NotWarned;
            record.held = Held::Warned;
            first
        })
    }

    /// Forgets the `ProvisioningHeld` events of the claims for which `keep` says no.
    pub(crate) fn retain_held(&self, keep: impl Fn(&str) -> bool) {
        let mut map = self.map();
        let uids: Vec<ClaimUid> = map
            .records
            .iter()
            .filter(|(uid, record)| record.held == Held::Warned && !keep(&uid.0))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in uids {
            map.update_known(&uid.0, |record| record.held = Held::NotWarned);
        }
    }

    /// How much longer a cleanup of claim `uid` that found no asset must wait before it
    /// believes that none exists: `window` (the driver's late-asset window) counted from
    /// this process's first look (recorded now if this is it); `None` once it has passed.
    pub(crate) fn cleanup_wait(&self, uid: &str, window: Duration) -> Option<Duration> {
        let now = Instant::now();
        let first = self.update(uid, |record| *record.cleanup_since.get_or_insert(now));
        window
            .checked_sub(now.saturating_duration_since(first))
            .filter(|left| !left.is_zero())
    }

    /// Forgets the first look of claim `uid`'s cleanup (it ended).
    pub(crate) fn forget_cleanup(&self, uid: &str) {
        self.map()
            .update_known(uid, |record| record.cleanup_since = None);
    }

    /// How many claims have a record (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map().records.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{class, pvc};

    fn records() -> Records {
        Records::new(Duration::from_secs(300), None)
    }

    fn entry() -> InProgress {
        InProgress::new(Arc::new(pvc("c").uid("u1").build()), None)
    }

    fn in_progress_count(records: &Records) -> usize {
        records.map().in_progress
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_goes_once_all_its_parts_are_empty() {
        let r = records();
        let mut fast = class("fast").build();
        fast.metadata.uid = Some("class-1".into());
        r.set_in_progress("u1", Some(entry()));
        r.mark_infeasible("u1", Some(&fast));
        assert!(r.warn_held_once("u1"));
        assert!(!r.warn_held_once("u1"), "warned once per process");
        assert_eq!(
            r.cleanup_wait("u1", Duration::from_secs(10)),
            Some(Duration::from_secs(10))
        );
        assert_eq!((r.len(), in_progress_count(&r)), (1, 1));

        r.set_in_progress("u1", None);
        assert_eq!((r.len(), in_progress_count(&r)), (1, 0));
        r.forget_cleanup("u1");
        r.retain_held(|_| false);
        assert_eq!(r.len(), 1, "the infeasible answer is still remembered");
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(r.infeasible_wait("u1", Some(&fast)), None);
        assert_eq!(r.len(), 0, "nothing left: the record is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn forgetting_what_was_never_remembered_adds_no_record() {
        let r = records();
        r.set_in_progress("u1", None);
        r.forget_cleanup("u1");
        r.retain_held(|_| false);
        r.prune_infeasible();
        assert_eq!(r.infeasible_wait("u1", Some(&class("fast").build())), None);
        assert!(!r.is_in_progress("u1"));
        assert_eq!(r.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_infeasible_answers_are_pruned_and_in_progress_records_kept() {
        let r = records();
        r.mark_infeasible("u1", None);
        r.mark_infeasible("u2", None);
        r.set_in_progress("u2", Some(entry()));
        tokio::time::advance(Duration::from_secs(300)).await;
        r.prune_infeasible();
        assert_eq!(r.len(), 1);
        assert!(r.is_in_progress("u2"));
        assert_eq!(in_progress_count(&r), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_without_class_keeps_the_class_remembered_before() {
        let r = records();
        let claim = Arc::new(pvc("c").uid("u1").build());
        let fast = Arc::new(class("fast").build());
        r.set_in_progress("u1", Some(InProgress::new(Arc::clone(&claim), Some(fast))));
        r.remember("u1", State::InBackground, &claim, None);
        let kept = r.in_progress("u1").and_then(|e| e.class);
        assert_eq!(
            kept.and_then(|c| c.metadata.name.clone()).as_deref(),
            Some("fast")
        );
        r.remember("u1", State::NoChange, &claim, None);
        assert!(r.is_in_progress("u1"));
        r.remember("u1", State::Finished, &claim, None);
        assert_eq!((r.len(), in_progress_count(&r)), (0, 0));
    }
}
