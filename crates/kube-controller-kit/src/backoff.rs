//! Retry delays per key: client-go's `workqueue.RateLimiter` family.
//!
//! A controller that retries failed keys (claims, volumes, any object) asks a
//! [`RateLimiter`] how long a key waits before its next attempt, and tells it when the key
//! succeeded or was given up on. The limiters here are the ones client-go's work queues
//! use:
//!
//! | Go (client-go `workqueue`)               | Rust                          |
//! |------------------------------------------|-------------------------------|
//! | `RateLimiter` (`When`, `Forget`, `NumRequeues`) | [`RateLimiter`] (`when`, `forget`, `retries`) |
//! | `NewItemExponentialFailureRateLimiter`   | [`ItemExponentialLimiter`]    |
//! | `BucketRateLimiter{rate.NewLimiter(..)}` | [`TokenBucketLimiter`]        |
//! | `NewMaxOfRateLimiter`                    | [`MaxOfLimiter`]              |
//!
//! Keys are strings (an object's UID, or `namespace/name`). For kube-runtime's
//! `Controller`, whose `error_policy` never sees successes, a reconciler forgets the key
//! of an object on success itself.
//!
//! All timing uses [`tokio::time::Instant`], so tests with a paused clock
//! (`#[tokio::test(start_paused = true)]`) see exact delays.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Decides how long a key waits before it is processed again after a failure.
///
/// Implementations are shared between queues and workers, so every method takes `&self`
/// and must be cheap: it is called with no lock of the queue held, once per failure.
///
/// # Example
///
/// A limiter that always waits one second, for a driver whose backend prefers a
/// steady retry pace:
///
/// ```
/// use std::time::Duration;
/// use kube_controller_kit::backoff::RateLimiter;
///
/// struct Fixed(Duration);
///
/// impl RateLimiter for Fixed {
///     fn when(&self, _key: &str) -> Duration { self.0 }
///     fn forget(&self, _key: &str) {}
///     fn retries(&self, _key: &str) -> u32 { 0 }
/// }
///
/// let limiter = Fixed(Duration::from_secs(1));
/// assert_eq!(limiter.when("claim-uid"), Duration::from_secs(1));
/// ```
#[doc(alias = "workqueue.RateLimiter")]
pub trait RateLimiter: Send + Sync + 'static {
    /// How long to wait before the key may be processed again after a failure;
    /// records the failure.
    #[doc(alias = "When")]
    fn when(&self, key: &str) -> Duration;
    /// Forgets the key's failures (after a success, or when the caller stops retrying).
    #[doc(alias = "Forget")]
    fn forget(&self, key: &str);
    /// Failures recorded for the key since it was last forgotten.
    #[doc(alias = "NumRequeues")]
    fn retries(&self, key: &str) -> u32;
}

/// Locks a mutex, recovering the data if another thread panicked while holding it.
///
/// Every critical section here leaves the data consistent, so a poisoned lock carries no
/// broken invariant; refusing service would turn one panic into a dead controller.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Per-key exponential backoff: the n-th failure of a key waits `base * 2^(n-1)`,
/// capped at `max`.
///
/// `max` is a hard cap: no delay is ever longer, so a `max` below `base` makes every delay
/// `max` (as client-go does). A configured cap is never silently raised.
///
/// The failure count of a key grows with every [`when`](RateLimiter::when) and is reset
/// by [`forget`](RateLimiter::forget). Keys are tracked until forgotten, so callers must
/// forget keys that succeed or are given up on for good, or the map keeps them.
#[doc(alias = "NewItemExponentialFailureRateLimiter")]
#[doc(alias = "ItemExponentialFailureRateLimiter")]
pub struct ItemExponentialLimiter {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ItemExponentialLimiter {
    /// A limiter whose first delay is `base`, doubling per failure up to `max`.
    ///
    /// `max` below `base` caps every delay at `max`, as in Go.
    #[must_use]
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The first delay.
    #[must_use]
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap of every delay.
    #[must_use]
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay the next failure of `key` would get, without recording anything.
    #[must_use]
    pub fn peek(&self, key: &str) -> Duration {
        self.delay_after(self.retries(key))
    }

    /// The delay after `previous` earlier failures: `base * 2^previous`, capped at `max`.
    fn delay_after(&self, previous: u32) -> Duration {
        2u32.checked_pow(previous)
            .and_then(|factor| self.base.checked_mul(factor))
            .map_or(self.max, |delay| delay.min(self.max))
    }
}

impl fmt::Debug for ItemExponentialLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemExponentialLimiter")
            .field("base", &self.base)
            .field("max", &self.max)
            .field("tracked_keys", &lock(&self.failures).len())
            .finish()
    }
}

impl RateLimiter for ItemExponentialLimiter {
    fn when(&self, key: &str) -> Duration {
        let previous = {
            let mut failures = lock(&self.failures);
            let count = failures.entry(key.to_owned()).or_insert(0);
            let previous = *count;
            *count = count.saturating_add(1);
            previous
        };
        self.delay_after(previous)
    }

    fn forget(&self, key: &str) {
        lock(&self.failures).remove(key);
    }

    fn retries(&self, key: &str) -> u32 {
        lock(&self.failures).get(key).copied().unwrap_or(0)
    }
}

/// A token bucket shared by all keys: `burst` calls pass at once, then calls are spaced
/// `1/qps` apart.
///
/// Each [`when`](RateLimiter::when) *reserves* a token, possibly one that is only
/// refilled in the future, and returns the delay until that token exists, exactly as
/// client-go's `BucketRateLimiter` does with `rate.Limiter.Reserve().Delay()`. A burst of
/// 200 failures therefore spreads its retries over time instead of retrying together.
/// The bucket keeps no per-key state: [`retries`](RateLimiter::retries) is always 0 and
/// [`forget`](RateLimiter::forget) does nothing.
///
/// # Why not `governor`
///
/// This bucket is hand-written on purpose. `governor` (GCRA) only answers "allowed now"
/// or "not before T" and consumes nothing when it refuses, so it cannot express a
/// reservation of a future token: concurrent failures would all get the same short delay
/// and retry together, which is what the bucket exists to prevent. The reservation
/// arithmetic is a dozen lines and uses [`tokio::time::Instant`], so a paused test clock
/// drives it.
///
/// # Caveats
///
/// A `qps` that is zero, negative or NaN refills nothing: after the burst every call
/// returns [`Duration::MAX`] ("never", Go's `InfDuration`). An infinite `qps` never
/// delays. A `burst` of 0 is treated as 1, since a bucket that can never hold a token
/// would block every key forever.
#[doc(alias = "BucketRateLimiter")]
pub struct TokenBucketLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

/// Tokens available at `last` (negative when future tokens are reserved).
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucketLimiter {
    /// A full bucket of `burst` tokens, refilled at `qps` tokens per second.
    #[must_use]
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            state: Mutex::new(Bucket {
                tokens: burst,
                last: None,
            }),
        }
    }

    /// Reserves one token at `now` and returns how long until it is available.
    fn reserve(&self, now: Instant) -> Duration {
        if self.qps == f64::INFINITY {
            return Duration::ZERO;
        }
        let refills = self.qps > 0.0;
        let mut bucket = lock(&self.state);
        let elapsed = bucket
            .last
            .map_or(Duration::ZERO, |last| now.saturating_duration_since(last));
        if refills {
            bucket.tokens = (bucket.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst);
        }
        // `last` never moves backwards: a caller with an older `now` does not refill twice.
        if bucket.last.is_none_or(|last| now > last) {
            bucket.last = Some(now);
        }
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Duration::ZERO;
        }
        if !refills {
            return Duration::MAX;
        }
        bucket.tokens -= 1.0;
        // The token reserved now is the `-tokens`-th one still to be refilled.
        Duration::try_from_secs_f64(-bucket.tokens / self.qps).unwrap_or(Duration::MAX)
    }
}

impl fmt::Debug for TokenBucketLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucketLimiter")
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl RateLimiter for TokenBucketLimiter {
    fn when(&self, _key: &str) -> Duration {
        self.reserve(Instant::now())
    }

    fn forget(&self, _key: &str) {}

    fn retries(&self, _key: &str) -> u32 {
        0
    }
}

/// Combines limiters: the delay is the longest any of them asks for.
///
/// [`when`](RateLimiter::when) asks every limiter (so each records the failure),
/// [`forget`](RateLimiter::forget) forgets in all of them, and
/// [`retries`](RateLimiter::retries) is the largest count any of them reports.
#[doc(alias = "NewMaxOfRateLimiter")]
#[doc(alias = "MaxOfRateLimiter")]
pub struct MaxOfLimiter {
    limiters: Vec<Arc<dyn RateLimiter>>,
}

impl MaxOfLimiter {
    /// Combines `limiters`; with none, every delay is zero.
    #[must_use]
    pub fn new(limiters: Vec<Arc<dyn RateLimiter>>) -> Self {
        Self { limiters }
    }
}

impl fmt::Debug for MaxOfLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOfLimiter")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

impl RateLimiter for MaxOfLimiter {
    fn when(&self, key: &str) -> Duration {
        self.limiters
            .iter()
            .map(|limiter| limiter.when(key))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, key: &str) {
        for limiter in &self.limiters {
            limiter.forget(key);
        }
    }

    fn retries(&self, key: &str) -> u32 {
        self.limiters
            .iter()
            .map(|limiter| limiter.retries(key))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn _dyn_compatible(_: &dyn RateLimiter) {}

    #[test]
    fn exponential_delay_doubles_per_failure_and_is_capped() {
        let limiter = ItemExponentialLimiter::new(secs(15), secs(1000));
        let delays: Vec<_> = (0..9).map(|_| limiter.when("a")).collect();
        assert_eq!(
            delays,
            [15, 30, 60, 120, 240, 480, 960, 1000, 1000].map(secs)
        );
        assert_eq!(limiter.retries("a"), 9);
    }

    #[test]
    fn exponential_keys_are_independent_and_forget_resets() {
        let limiter = ItemExponentialLimiter::new(secs(1), secs(100));
        assert_eq!(limiter.when("a"), secs(1));
        assert_eq!(limiter.when("a"), secs(2));
        assert_eq!(limiter.when("b"), secs(1));
        assert_eq!(limiter.retries("b"), 1);
        limiter.forget("a");
        assert_eq!(limiter.retries("a"), 0);
        assert_eq!(limiter.when("a"), secs(1));
        assert_eq!(limiter.retries("unknown"), 0);
    }

    #[test]
    fn exponential_survives_huge_failure_counts() {
        let limiter = ItemExponentialLimiter::new(Duration::from_millis(5), secs(1000));
        for _ in 0..200 {
            limiter.when("a");
        }
        assert_eq!(limiter.when("a"), secs(1000));
        assert_eq!(limiter.retries("a"), 201);
        // A base larger than the cap is capped from the first failure.
        let capped = ItemExponentialLimiter::new(secs(15), secs(10));
        assert_eq!(capped.when("a"), secs(10));
    }

    #[test]
    fn a_max_below_base_caps_every_delay_at_max() {
        let limiter = ItemExponentialLimiter::new(secs(10), secs(1));
        let delays: Vec<_> = (0..3).map(|_| limiter.when("a")).collect();
        assert_eq!(
            delays,
            [1, 1, 1].map(secs),
            "the cap is never raised to the base"
        );
        assert_eq!(limiter.peek("a"), secs(1));
    }

    #[test]
    fn peek_tells_the_next_delay_without_recording_it() {
        let limiter = ItemExponentialLimiter::new(secs(1), secs(100));
        assert_eq!(limiter.peek("a"), secs(1));
        limiter.when("a");
        limiter.when("a");
        assert_eq!(limiter.peek("a"), secs(4));
        assert_eq!(limiter.peek("a"), secs(4));
        assert_eq!(limiter.retries("a"), 2);
        assert_eq!((limiter.base(), limiter.max()), (secs(1), secs(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_passes_the_burst_then_spaces_calls_by_the_rate() {
        let limiter = TokenBucketLimiter::new(10.0, 3);
        let delays: Vec<_> = (0..6).map(|_| limiter.when("k")).collect();
        let ms = Duration::from_millis;
        assert_eq!(delays, [ms(0), ms(0), ms(0), ms(100), ms(200), ms(300)]);
        // Time passes: the three reserved future tokens are paid back first.
        tokio::time::advance(ms(300)).await;
        assert_eq!(limiter.when("k"), ms(100));
        // After a long pause the bucket is full again, never fuller than the burst.
        tokio::time::advance(secs(60)).await;
        let delays: Vec<_> = (0..4).map(|_| limiter.when("k")).collect();
        assert_eq!(delays, [ms(0), ms(0), ms(0), ms(100)]);
        assert_eq!(limiter.retries("k"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_edge_values_never_panic() {
        let unlimited = TokenBucketLimiter::new(f64::INFINITY, 0);
        assert!((0..1000).all(|_| unlimited.when("k") == Duration::ZERO));
        let never = TokenBucketLimiter::new(0.0, 2);
        assert_eq!(never.when("k"), Duration::ZERO);
        assert_eq!(never.when("k"), Duration::ZERO);
        assert_eq!(never.when("k"), Duration::MAX);
        let nan = TokenBucketLimiter::new(f64::NAN, 0);
        assert_eq!(nan.when("k"), Duration::ZERO);
        assert_eq!(nan.when("k"), Duration::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn max_of_takes_the_longest_delay_and_forgets_everywhere() {
        let limiter = MaxOfLimiter::new(vec![
            Arc::new(ItemExponentialLimiter::new(
                Duration::from_millis(50),
                secs(1),
            )),
            Arc::new(TokenBucketLimiter::new(10.0, 1)),
        ]);
        // Bucket: 0, 100 ms, 200 ms; exponential: 50, 100, 200 ms.
        assert_eq!(limiter.when("a"), Duration::from_millis(50));
        assert_eq!(limiter.when("a"), Duration::from_millis(100));
        assert_eq!(limiter.when("b"), Duration::from_millis(200));
        assert_eq!(limiter.retries("a"), 2);
        limiter.forget("a");
        assert_eq!(limiter.retries("a"), 0);
        assert_eq!(MaxOfLimiter::new(Vec::new()).when("a"), Duration::ZERO);
    }
}
