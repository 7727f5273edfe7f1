//! Failure backoff per object, keyed by namespace and name: kube-controller-kit's
//! [`ItemExponentialLimiter`] plus the state each object failed in.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use kube_controller_kit::backoff::{ItemExponentialLimiter, RateLimiter};
use kube_runtime::reflector::ObjectRef;

use crate::resource::CnsVolumeMetadata;

/// Retry delay per `CnsVolumeMetadata` object (Go: the package-level `backOffDuration` map).
///
/// The first failure of an object waits [`initial`](Self::initial), each further failure
/// twice as long as the one before, up to [`max`](Self::max); a success
/// ([`reset`](Self::reset)) starts over. kube's `error_policy` never sees successes, so the
/// reconciler resets the delay itself. The delays are kube-controller-kit's
/// [`ItemExponentialLimiter`]: `max` is a hard cap, so a `max` below `initial` makes every
/// delay `max`.
///
/// The reconciler also starts over when the failing object is no longer the same problem:
/// its spec or finalizers changed, or its deletion started. So a deletion that CNS refuses
/// for a moment is retried after the initial delay, not after the minutes the object may
/// have waited while it was failing for another reason (an unbound claim, an invalid
/// spec).
///
/// Unlike Go, the key is namespace **and** name (objects of the same name in two
/// namespaces do not share a delay) and the delay is capped.
#[derive(Debug)]
pub(crate) struct PerObjectBackoff {
    delays: ItemExponentialLimiter,
    /// Every object with recorded failures, and the state it failed in (what triggers its
    /// reconciles; 0 when the failure was recorded without one).
    states: Mutex<HashMap<ObjectRef<CnsVolumeMetadata>, u64>>,
}

/// The limiter's key of an object: `namespace/name`.
fn limiter_key(key: &ObjectRef<CnsVolumeMetadata>) -> String {
    format!(
        "{}/{}",
        key.namespace.as_deref().unwrap_or_default(),
        key.name
    )
}

impl PerObjectBackoff {
    /// Default first delay: 1 s.
    pub(crate) const DEFAULT_INITIAL: Duration = Duration::from_secs(1);
    /// Default cap: 5 min.
    pub(crate) const DEFAULT_MAX: Duration = Duration::from_secs(5 * 60);

    /// A backoff starting at `initial`, doubling, capped at `max` (a `max` below `initial`
    /// makes every delay `max`).
    #[must_use]
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            delays: ItemExponentialLimiter::new(initial, max),
            states: Mutex::new(HashMap::new()),
        }
    }

    #[cfg(test)]
    /// The first delay.
    #[must_use]
    pub(crate) fn initial(&self) -> Duration {
        self.delays.base()
    }

    #[cfg(test)]
    /// The cap.
    #[must_use]
    pub(crate) fn max(&self) -> Duration {
        self.delays.max()
    }

    fn states(&self) -> MutexGuard<'_, HashMap<ObjectRef<CnsVolumeMetadata>, u64>> {
        crate::lock(&self.states)
    }

    #[cfg(test)]
    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub(crate) fn next_delay(&self, key: &ObjectRef<CnsVolumeMetadata>) -> Duration {
        let mut states = self.states();
        states.entry(key.clone()).or_insert(0);
        self.delays.when(&limiter_key(key))
    }

    /// Records a failure of `key` in `state` (what triggers its reconciles: spec,
    /// finalizers, deletion) and returns how long to wait before retrying it; failures in
    /// another state are forgotten first.
    pub(crate) fn next_delay_in(&self, key: &ObjectRef<CnsVolumeMetadata>, state: u64) -> Duration {
        let mut states = self.states();
        let limiter_key = limiter_key(key);
        if states
            .insert(key.clone(), state)
            .is_some_and(|s| s != state)
        {
            self.delays.forget(&limiter_key);
        }
        self.delays.when(&limiter_key)
    }

    #[cfg(test)]
    /// The delay the next failure of `key` would get, without recording anything.
    #[must_use]
    pub(crate) fn peek(&self, key: &ObjectRef<CnsVolumeMetadata>) -> Duration {
        self.delays.peek(&limiter_key(key))
    }

    /// Forgets the failures of `key` (after a success, or once the object is gone).
    pub(crate) fn reset(&self, key: &ObjectRef<CnsVolumeMetadata>) {
        let mut states = self.states();
        states.remove(key);
        self.delays.forget(&limiter_key(key));
    }

    /// Keeps only the objects for which `keep` holds (the others are gone).
    pub(crate) fn retain(&self, mut keep: impl FnMut(&ObjectRef<CnsVolumeMetadata>) -> bool) {
        self.states().retain(|key, _| {
            let kept = keep(key);
            if !kept {
                self.delays.forget(&limiter_key(key));
            }
            kept
        });
    }

    /// Forgets every object (this replica stopped leading).
    pub(crate) fn clear(&self) {
        self.retain(|_| false);
    }

    #[cfg(test)]
    /// Number of objects with a recorded failure.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.states().len()
    }

    #[cfg(test)]
    /// Whether no object has a recorded failure.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.states().is_empty()
    }
}

impl Default for PerObjectBackoff {
    /// 1 s doubling to 5 min, as the issue asks (Go starts at 1 s, doubles, never caps).
    fn default() -> Self {
        Self::new(Self::DEFAULT_INITIAL, Self::DEFAULT_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> ObjectRef<CnsVolumeMetadata> {
        ObjectRef::new(name).within(namespace)
    }

    #[tokio::test(start_paused = true)]
    async fn delay_doubles_from_one_second_and_caps_at_five_minutes() {
        let backoff = PerObjectBackoff::default();
        let object = key("tenant", "gc-1-a");
        let delays: Vec<u64> = (0..12)
            .map(|_| backoff.next_delay(&object).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        // Time passing does not shrink the delay; only a success does.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(backoff.peek(&object), Duration::from_secs(300));
    }

    #[tokio::test(start_paused = true)]
    async fn reset_starts_over_at_the_initial_delay() {
        let backoff = PerObjectBackoff::default();
        let object = key("tenant", "gc-1-a");
        for _ in 0..4 {
            backoff.next_delay(&object);
        }
        assert_eq!(backoff.peek(&object), Duration::from_secs(16));
        backoff.reset(&object);
        assert!(backoff.is_empty());
        assert_eq!(backoff.next_delay(&object), Duration::from_secs(1));
    }

    #[test]
    fn same_name_in_two_namespaces_has_separate_delays() {
        let backoff = PerObjectBackoff::default();
        let a = key("team-a", "gc-1-x");
        let b = key("team-b", "gc-1-x");
        for _ in 0..3 {
            backoff.next_delay(&a);
        }
        assert_eq!(backoff.next_delay(&b), Duration::from_secs(1));
        assert_eq!(backoff.next_delay(&a), Duration::from_secs(8));
        assert_eq!(backoff.len(), 2);
        backoff.reset(&a);
        assert_eq!(backoff.peek(&b), Duration::from_secs(2));
    }

    #[test]
    fn failures_in_another_state_start_over() {
        let backoff = PerObjectBackoff::default();
        let object = key("tenant", "gc-1-a");
        let delays: Vec<u64> = (0..4)
            .map(|_| backoff.next_delay_in(&object, 1).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8]);
        assert_eq!(backoff.next_delay_in(&object, 2), Duration::from_secs(1));
        assert_eq!(backoff.next_delay_in(&object, 2), Duration::from_secs(2));
        assert_eq!(
            backoff.next_delay(&object),
            Duration::from_secs(4),
            "same state"
        );
        assert_eq!(backoff.next_delay_in(&object, 2), Duration::from_secs(8));
    }

    #[test]
    fn a_cap_below_initial_caps_every_delay() {
        let backoff = PerObjectBackoff::new(Duration::from_secs(10), Duration::from_secs(1));
        let object = key("ns", "x");
        assert_eq!(backoff.next_delay(&object), Duration::from_secs(1));
        assert_eq!(backoff.next_delay_in(&object, 3), Duration::from_secs(1));
        assert_eq!(backoff.peek(&object), Duration::from_secs(1));
        assert_eq!(
            backoff.max(),
            Duration::from_secs(1),
            "the cap is kept as given"
        );
        assert_eq!(backoff.initial(), Duration::from_secs(10));
    }

    #[test]
    fn retain_and_clear_forget_the_delays_too() {
        let backoff = PerObjectBackoff::default();
        let (a, b) = (key("ns", "a"), key("ns", "b"));
        for _ in 0..3 {
            backoff.next_delay(&a);
            backoff.next_delay_in(&b, 7);
        }
        backoff.retain(|k| k == &b);
        assert_eq!(backoff.len(), 1);
        assert_eq!(backoff.peek(&a), Duration::from_secs(1), "a starts over");
        assert_eq!(backoff.peek(&b), Duration::from_secs(8));
        backoff.clear();
        assert!(backoff.is_empty());
        assert_eq!(backoff.peek(&b), Duration::from_secs(1));
    }
}
