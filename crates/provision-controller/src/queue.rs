//! The work queue that feeds claim and volume keys to the workers, with client-go's
//! rate-limited work-queue semantics: a key waits at most once, is processed by one worker
//! at a time (re-added when [`WorkQueue::done`] finds it dirty), delayed adds keep the
//! earliest time, the limiter counts failures until [`WorkQueue::forget`]. Delayed keys
//! sit in a time-ordered map that waiting workers sleep on: no timer task, works under a
//! paused clock. Unlike client-go, only [`WorkQueue::add_rate_limited`] counts as a retry,
//! and `get` returns `None` at shutdown even with keys queued.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::QueueMetrics;
use crate::ratelimit::RateLimiter;

/// Where a delay too long to represent puts a key: about 30 years ahead, as tokio does.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// A deduplicating, rate-limited queue of string keys (claim UIDs, volume names).
#[doc(alias = "RateLimitingInterface")]
pub(crate) struct WorkQueue {
    name: &'static str,
    limiter: Arc<dyn RateLimiter>,
    metrics: Option<QueueMetrics>,
    state: Mutex<State>,
    /// Wakes one waiting `get` when it may make progress: a key queued, an earlier
    /// delayed key (the woken worker sleeps until it), or the worker that watched the
    /// delayed keys took a key; every waiting `get` at shutdown. One, not all: a queue has
    /// up to [`Config::sync_workers`](crate::Config::sync_workers) waiting workers, and
    /// waking them all for each key cost a quarter of the controller's CPU.
    changed: Notify,
    /// Woken when the last key being processed is done.
    idle: Notify,
    /// Passes through `get`'s wait loop, to show that a key wakes one worker.
    #[cfg(test)]
    rounds: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    /// Keys ready for a worker, in order. Each is in `dirty` and not in `processing`.
    queue: VecDeque<String>,
    /// Keys that need processing, with the time since they wait.
    dirty: HashMap<String, Instant>,
    /// Keys a worker holds.
    processing: HashSet<String>,
    /// Delayed keys by due time; `delayed_at` holds the same entries by key.
    delayed: BTreeSet<(Instant, String)>,
    delayed_at: HashMap<String, Instant>,
    shut_down: bool,
}

fn lock(mutex: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every critical section leaves `State` consistent, so a poisoned lock is safe to use.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl WorkQueue {
    /// An empty queue named `name` (the `name` label of its metrics).
    pub(crate) fn new(
        name: &'static str,
        limiter: Arc<dyn RateLimiter>,
        metrics: Option<QueueMetrics>,
    ) -> Self {
        Self {
            name,
            limiter,
            metrics,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            idle: Notify::new(),
            #[cfg(test)]
            rounds: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Queues `key` unless it already waits; a key being processed is queued again when
    /// its worker is done. Ignored after shutdown.
    pub(crate) fn add(&self, key: String) {
        let queued = {
            let mut state = lock(&self.state);
            self.add_locked(&mut state, key, Instant::now())
        };
        if queued {
            self.changed.notify_one();
        }
    }

    /// Queues `key` once `delay` has passed. Of several delayed adds of one key the
    /// earliest wins. A zero delay adds at once.
    pub(crate) fn add_after(&self, key: String, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        {
            let mut state = lock(&self.state);
            if state.shut_down {
                return;
            }
            let now = Instant::now();
            let Some(due) = now
                .checked_add(delay)
                .or_else(|| now.checked_add(FAR_FUTURE))
            else {
                tracing::warn!(queue = self.name, key, "delay too long, key not queued");
                return;
            };
            if let Some(&earlier) = state.delayed_at.get(&key) {
                if earlier <= due {
                    return;
                }
                state.delayed.remove(&(earlier, key.clone()));
            }
            state.delayed_at.insert(key.clone(), due);
            state.delayed.insert((due, key));
        }
        // A waiting worker recomputes how long to sleep.
        self.changed.notify_one();
    }

    /// Queues `key` after the delay the rate limiter gives, which records a failure.
    #[doc(alias = "AddRateLimited")]
    pub(crate) fn add_rate_limited(&self, key: String) {
        if let Some(metrics) = &self.metrics {
            metrics.retried();
        }
        let delay = self.limiter.when(&key);
        self.add_after(key, delay);
    }

    /// Waits for a key and hands it to the caller, who must call [`done`](Self::done)
    /// with it. `None` once the queue is shut down.
    ///
    /// Cancel safe: dropping the future takes no key.
    pub(crate) async fn get(&self) -> Option<String> {
        loop {
            #[cfg(test)]
            self.rounds
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            let next_due = {
                let mut state = lock(&self.state);
                if state.shut_down {
                    return None;
                }
                let now = Instant::now();
                self.promote_due(&mut state, now);
                if let Some(key) = state.queue.pop_front() {
                    let waiting_since = state.dirty.remove(&key).unwrap_or(now);
                    state.processing.insert(key.clone());
                    if let Some(metrics) = &self.metrics {
                        metrics.set_depth(state.dirty.len());
                        metrics.started(&key, waiting_since, now);
                    }
                    let waited = now.saturating_duration_since(waiting_since);
                    tracing::debug!(
                        queue = self.name,
                        waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
                        "queue wait"
                    );
                    // Another worker takes the next key, or, this one having perhaps
                    // been the one asleep until the next delayed key, watches for it.
                    let more = !state.queue.is_empty() || !state.delayed.is_empty();
                    drop(state);
                    if more {
                        self.changed.notify_one();
                    }
                    return Some(key);
                }
                state.delayed.first().map(|(due, _)| *due)
            };
            match next_due {
                Some(due) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Marks `key` as processed; if it was added meanwhile it is queued again.
    pub(crate) fn done(&self, key: &str) {
        let (requeued, idle) = {
            let mut state = lock(&self.state);
            if !state.processing.remove(key) {
                return;
            }
            if let Some(metrics) = &self.metrics {
                metrics.finished(key, Instant::now());
            }
            let requeued = !state.shut_down && state.dirty.contains_key(key);
            if requeued {
                state.queue.push_back(key.to_owned());
            }
            (requeued, state.processing.is_empty())
        };
        if requeued {
            self.changed.notify_one();
        }
        if idle {
            self.idle.notify_waiters();
        }
    }

    /// Forgets the key's failures in the rate limiter (after a success).
    pub(crate) fn forget(&self, key: &str) {
        self.limiter.forget(key);
    }

    /// Failures the rate limiter has recorded for `key`.
    #[doc(alias = "NumRequeues")]
    pub(crate) fn num_requeues(&self, key: &str) -> u32 {
        self.limiter.retries(key)
    }

    /// Keys being processed right now.
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.state).processing.len()
    }

    /// Keys ready for a worker now (not counting keys being processed or delayed).
    pub(crate) fn len(&self) -> usize {
        let (len, promoted) = {
            let mut state = lock(&self.state);
            let promoted = self.promote_due(&mut state, Instant::now());
            (state.queue.len(), promoted)
        };
        if promoted {
            self.changed.notify_one();
        }
        len
    }

    /// Stops the queue: every `get` returns `None` from now on, waiting and delayed keys
    /// are dropped and later adds are ignored. Keys being processed may still be marked
    /// [`done`](Self::done), which [`wait_idle`](Self::wait_idle) waits for.
    #[doc(alias = "ShutDown")]
    pub(crate) fn shut_down(&self) {
        {
            let mut state = lock(&self.state);
            state.shut_down = true;
            state.queue.clear();
            state.dirty.clear();
            state.delayed.clear();
            state.delayed_at.clear();
            if let Some(metrics) = &self.metrics {
                metrics.set_depth(0);
            }
        }
        self.changed.notify_waiters();
    }

    /// Resolves once no key is being processed (at once if none is).
    pub(crate) async fn wait_idle(&self) {
        loop {
            let mut idle = pin!(self.idle.notified());
            idle.as_mut().enable();
            if lock(&self.state).processing.is_empty() {
                return;
            }
            idle.await;
        }
    }

    /// Moves delayed keys that are due at `now` into the queue; whether any was queued.
    fn promote_due(&self, state: &mut State, now: Instant) -> bool {
        let mut queued = false;
        while let Some((due, _)) = state.delayed.first() {
            if *due > now {
                break;
            }
            let Some((due, key)) = state.delayed.pop_first() else {
                break;
            };
            state.delayed_at.remove(&key);
            // The key has waited since it became due, not since the worker noticed.
            queued |= self.add_locked(state, key, due);
        }
        queued
    }

    /// Marks `key` dirty and queues it unless it waits already or is being processed;
    /// whether it was queued.
    fn add_locked(&self, state: &mut State, key: String, since: Instant) -> bool {
        if state.shut_down || state.dirty.contains_key(&key) {
            return false;
        }
        let processing = state.processing.contains(&key);
        if !processing {
            state.queue.push_back(key.clone());
        }
        state.dirty.insert(key, since);
        if let Some(metrics) = &self.metrics {
            metrics.added();
            metrics.set_depth(state.dirty.len());
        }
        !processing
    }
}

impl fmt::Debug for WorkQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("WorkQueue")
            .field("name", &self.name)
            .field("queued", &state.queue.len())
            .field("processing", &state.processing.len())
            .field("delayed", &state.delayed.len())
            .field("shut_down", &state.shut_down)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ControllerMetrics;
    use crate::ratelimit::ItemExponentialLimiter;
    use prometheus_client::registry::Registry;
    use tokio::time::timeout;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn queue() -> Arc<WorkQueue> {
        let limiter = Arc::new(ItemExponentialLimiter::new(secs(1), secs(10)));
        Arc::new(WorkQueue::new("test", limiter, None))
    }

    /// `get` with a deadline; under a paused clock the deadline passes at once when
    /// nothing else can happen.
    async fn try_get(q: &WorkQueue, within: Duration) -> Option<String> {
        timeout(within, q.get()).await.ok().flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_waits_in_the_queue_once() {
        let q = queue();
        q.add("a".into());
        q.add("b".into());
        q.add("a".into());
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert_eq!(q.get().await.as_deref(), Some("b"));
        assert_eq!(q.len(), 0);
        assert_eq!(try_get(&q, secs(60)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn adds_while_processing_are_coalesced_and_requeued_on_done() {
        let q = queue();
        q.add("a".into());
        let key = q.get().await.unwrap();
        q.add("a".into());
        q.add("a".into());
        // Not handed to another worker while the first one holds it.
        assert_eq!(q.len(), 0);
        assert_eq!(try_get(&q, secs(60)).await, None);
        q.done(&key);
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.done("a");
        assert_eq!(try_get(&q, secs(60)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_gets_the_key_when_the_first_worker_is_done() {
        let q = queue();
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.get().await.as_deref(), Some("a"));
        let second = tokio::spawn({
            let q = Arc::clone(&q);
            async move {
                let b = q.get().await;
                let a = q.get().await;
                (b, a)
            }
        });
        q.add("a".into());
        tokio::time::sleep(secs(5)).await;
        assert!(!second.is_finished(), "a was handed out twice");
        q.done("a");
        let (b, a) = second.await.unwrap();
        assert_eq!((b.as_deref(), a.as_deref()), (Some("b"), Some("a")));
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_queues_the_key_when_due() {
        let q = queue();
        let start = Instant::now();
        q.add_after("a".into(), secs(5));
        assert_eq!(q.len(), 0);
        assert_eq!(try_get(&q, Duration::from_millis(4999)).await, None);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert_eq!(start.elapsed(), secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_delayed_add_wins_and_runs_once() {
        let q = queue();
        let start = Instant::now();
        q.add_after("a".into(), secs(10));
        q.add_after("a".into(), secs(3));
        q.add_after("a".into(), secs(7));
        q.add_after("b".into(), Duration::ZERO);
        assert_eq!(q.get().await.as_deref(), Some("b"));
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert_eq!(start.elapsed(), secs(3));
        q.done("a");
        assert_eq!(try_get(&q, secs(60)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleeping_worker_wakes_for_an_earlier_delayed_key() {
        let q = queue();
        let start = Instant::now();
        q.add_after("late".into(), secs(30));
        let worker = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.get().await }
        });
        tokio::time::sleep(secs(1)).await;
        q.add_after("early".into(), secs(2));
        assert_eq!(worker.await.unwrap().as_deref(), Some("early"));
        assert_eq!(start.elapsed(), secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_key_due_while_processing_runs_again_after_done() {
        let q = queue();
        q.add("a".into());
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.add_after("a".into(), secs(1));
        tokio::time::sleep(secs(2)).await;
        assert_eq!(q.len(), 0);
        q.done("a");
        assert_eq!(
            try_get(&q, Duration::from_millis(1)).await.as_deref(),
            Some("a")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_until_forgotten() {
        let q = queue();
        q.add("a".into());
        let mut waits = Vec::new();
        for _ in 0..3 {
            let key = q.get().await.unwrap();
            q.add_rate_limited(key.clone());
            q.done(&key);
            let start = Instant::now();
            assert_eq!(q.get().await.as_deref(), Some("a"));
            waits.push(start.elapsed());
            q.done("a");
            q.add("a".into());
        }
        assert_eq!(waits, [secs(1), secs(2), secs(4)]);
        assert_eq!(q.num_requeues("a"), 3);
        q.forget("a");
        assert_eq!(q.num_requeues("a"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_ends_waiting_and_later_gets_and_drops_keys() {
        let q = queue();
        let waiting = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.add("a".into());
        assert_eq!(waiting.await.unwrap().as_deref(), Some("a"));
        let waiting = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.add("b".into());
        q.add("c".into());
        q.add_after("d".into(), secs(1));
        // `waiting` took b; c and d are dropped by the shutdown.
        assert_eq!(waiting.await.unwrap().as_deref(), Some("b"));
        q.shut_down();
        assert_eq!(q.len(), 0);
        assert_eq!(q.get().await, None);
        q.add("e".into());
        q.add_rate_limited("e".into());
        assert_eq!(q.len(), 0);
        let start = Instant::now();
        assert_eq!(q.get().await, None);
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Keys in flight can still be marked done, and are not queued again.
        q.add("a".into());
        q.done("a");
        q.done("b");
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_blocked_in_get_returns_none_on_shut_down() {
        let q = queue();
        let waiting = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.get().await }
        });
        tokio::time::sleep(secs(1)).await;
        q.shut_down();
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_idle_resolves_when_the_last_key_is_done() {
        let q = queue();
        timeout(secs(1), q.wait_idle())
            .await
            .expect("idle at start");
        q.add("a".into());
        q.add("b".into());
        let a = q.get().await.unwrap();
        let b = q.get().await.unwrap();
        q.shut_down();
        let idle = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.wait_idle().await }
        });
        tokio::time::sleep(secs(1)).await;
        q.done(&a);
        tokio::time::sleep(secs(1)).await;
        assert!(!idle.is_finished(), "idle while b is processed");
        q.done(&b);
        timeout(secs(1), idle).await.expect("idle").unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn done_for_an_unknown_key_is_ignored() {
        let q = queue();
        q.done("nobody");
        q.add("a".into());
        q.done("a");
        assert_eq!(q.get().await.as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn never_due_delays_do_not_panic() {
        let q = queue();
        q.add_after("a".into(), Duration::MAX);
        assert_eq!(try_get(&q, secs(3600)).await, None);
        q.add("b".into());
        assert_eq!(q.get().await.as_deref(), Some("b"));
    }

    /// Passes through `get`'s wait loop so far.
    fn rounds(q: &WorkQueue) -> usize {
        q.rounds.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_wakes_one_waiting_worker_not_all() {
        let q = queue();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let q = Arc::clone(&q);
            workers.spawn(async move {
                while let Some(key) = q.get().await {
                    q.done(&key);
                }
            });
        }
        tokio::time::sleep(secs(1)).await;
        assert_eq!(rounds(&q), 32, "each worker waits once");
        for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
            q.add(key.into());
            tokio::time::sleep(secs(1)).await;
            // The worker that takes the key goes round once more to wait again.
            assert_eq!(rounds(&q), 32 + 2 * (i + 1), "after {key}");
        }
        // A burst: a few rounds per key (the add's wake, the hand-on to the next worker
        // while keys wait, the wait again), not one per waiting worker (32).
        let before = rounds(&q);
        for i in 0..10 {
            q.add(format!("burst-{i}"));
        }
        tokio::time::sleep(secs(1)).await;
        let burst = rounds(&q) - before;
        assert!(burst <= 3 * 10, "{burst} rounds for 10 keys");
        assert_eq!(q.len(), 0);
        q.shut_down();
        while workers.join_next().await.is_some() {}
    }

    /// Delayed keys are taken when due while the workers that woke for the earlier ones
    /// are busy. (Tokio wakes the longest-waiting worker first, which alone keeps one
    /// waiting worker asleep until the next due key; the hand-on in `get` keeps that true
    /// whatever the order.)
    #[tokio::test(start_paused = true)]
    async fn delayed_keys_are_all_taken_when_the_watching_worker_is_busy() {
        let q = queue();
        let start = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let (q, tx) = (Arc::clone(&q), tx.clone());
            workers.spawn(async move {
                while let Some(key) = q.get().await {
                    // Long work: the worker that took a key is not watching the rest.
                    tokio::time::sleep(secs(100)).await;
                    let _ = tx.send((key.clone(), start.elapsed()));
                    q.done(&key);
                }
            });
        }
        tokio::time::sleep(secs(1)).await;
        q.add_after("x".into(), secs(5));
        q.add_after("y".into(), secs(7));
        q.add_after("z".into(), secs(9));
        let mut taken = Vec::new();
        for _ in 0..3 {
            taken.push(rx.recv().await.unwrap());
        }
        // Each taken when due (1 s in + its delay), then 100 s of work.
        assert_eq!(
            taken,
            [
                ("x".to_owned(), secs(106)),
                ("y".to_owned(), secs(108)),
                ("z".to_owned(), secs(110))
            ]
        );
        q.shut_down();
        while workers.join_next().await.is_some() {}
    }

    #[tokio::test(start_paused = true)]
    async fn queue_reports_its_metrics() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        let limiter = Arc::new(ItemExponentialLimiter::new(secs(1), secs(10)));
        let q = WorkQueue::new("claims", limiter, Some(metrics.queue("claims")));
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        tokio::time::sleep(secs(2)).await;
        let a = q.get().await.unwrap();
        tokio::time::sleep(secs(3)).await;
        q.add_rate_limited(a.clone());
        q.done(&a);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"workqueue_adds_total{name="claims"} 2"#,
            r#"workqueue_retries_total{name="claims"} 1"#,
            r#"workqueue_depth{name="claims"} 1"#,
            r#"workqueue_queue_duration_seconds_sum{name="claims"} 2.0"#,
            r#"workqueue_work_duration_seconds_sum{name="claims"} 3.0"#,
            r#"workqueue_unfinished_work_seconds{name="claims"} 0.0"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }

        // The rate-limited a is due after 1 s; its queue time counts from then.
        let b = q.get().await.unwrap();
        tokio::time::sleep(secs(4)).await;
        let a = q.get().await.unwrap();
        assert_eq!((a.as_str(), b.as_str()), ("a", "b"));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"workqueue_adds_total{name="claims"} 3"#,
            r#"workqueue_depth{name="claims"} 0"#,
            // a: 2 s, b: 5 s, a again: 3 s (due at +6 s, taken at +9 s).
            r#"workqueue_queue_duration_seconds_sum{name="claims"} 10.0"#,
            r#"workqueue_unfinished_work_seconds{name="claims"} 4.0"#,
            r#"workqueue_longest_running_processor_seconds{name="claims"} 4.0"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
