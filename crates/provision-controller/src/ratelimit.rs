//! The controller's default retry limiters, built from [`kube_controller_kit::backoff`].

use std::sync::Arc;
use std::time::Duration;

pub(crate) use kube_controller_kit::backoff::{
    ItemExponentialLimiter, MaxOfLimiter, RateLimiter, TokenBucketLimiter,
};

/// First retry delay of the controller's default limiter (Go: 15 s).
pub(crate) const DEFAULT_FAILURE_BASE_DELAY: Duration = Duration::from_secs(15);
/// Longest retry delay of the default limiter with exponential backoff (Go: 1000 s).
pub(crate) const DEFAULT_FAILURE_MAX_DELAY: Duration = Duration::from_secs(1000);
/// Refill rate of the token bucket shared by the default limiters (Go: 10 per second).
pub(crate) const DEFAULT_BUCKET_QPS: f64 = 10.0;
/// Capacity of the token bucket shared by the default limiters (Go: 100).
pub(crate) const DEFAULT_BUCKET_BURST: u32 = 100;
/// First retry delay of [`default_pv_save_limiter`] (client-go: 5 ms).
pub(crate) const DEFAULT_PV_SAVE_BASE_DELAY: Duration = Duration::from_millis(5);

/// The limiter the controller uses for its claim and volume queues unless the caller
/// passes one.
///
/// The larger of a per-key backoff and a token bucket of
/// [`DEFAULT_BUCKET_QPS`] per second with a burst of [`DEFAULT_BUCKET_BURST`]. The
/// per-key backoff starts at 15 s and doubles up to 1000 s when `exponential` is true
/// (Go's default, `ExponentialBackOffOnError(true)`); otherwise every retry waits 15 s.
///
/// # Guarantees
///
/// Build it once and share the returned `Arc` between the claim and the volume queue,
/// as Go does: the token bucket then bounds the retries of both queues together.
#[doc(alias = "ExponentialBackOffOnError")]
#[must_use]
pub(crate) fn default_controller_limiter(exponential: bool) -> Arc<dyn RateLimiter> {
    let max = if exponential {
        DEFAULT_FAILURE_MAX_DELAY
    } else {
        DEFAULT_FAILURE_BASE_DELAY
    };
    Arc::new(MaxOfLimiter::new(vec![
        Arc::new(ItemExponentialLimiter::new(DEFAULT_FAILURE_BASE_DELAY, max)),
        Arc::new(TokenBucketLimiter::new(
            DEFAULT_BUCKET_QPS,
            DEFAULT_BUCKET_BURST,
        )),
    ]))
}

/// The limiter for saving provisioned PVs in the background, when the caller passes none.
///
/// The Go library has no default of its own here: background saving is enabled by
/// passing a limiter to `CreateProvisionedPVLimiter`, and kubernetes-csi's
/// external-provisioner passes client-go's `workqueue.DefaultControllerRateLimiter()`.
/// This is that limiter: the larger of a per-key backoff from 5 ms doubling to 1000 s
/// and a token bucket of 10 per second with a burst of 100.
#[doc(alias = "DefaultControllerRateLimiter")]
#[doc(alias = "CreateProvisionedPVLimiter")]
#[must_use]
pub(crate) fn default_pv_save_limiter() -> Arc<dyn RateLimiter> {
    Arc::new(MaxOfLimiter::new(vec![
        Arc::new(ItemExponentialLimiter::new(
            DEFAULT_PV_SAVE_BASE_DELAY,
            DEFAULT_FAILURE_MAX_DELAY,
        )),
        Arc::new(TokenBucketLimiter::new(
            DEFAULT_BUCKET_QPS,
            DEFAULT_BUCKET_BURST,
        )),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn default_bucket_allows_100_then_10_per_second() {
        let limiter = TokenBucketLimiter::new(DEFAULT_BUCKET_QPS, DEFAULT_BUCKET_BURST);
        for i in 0..100 {
            assert_eq!(limiter.when(&format!("k{i}")), Duration::ZERO, "call {i}");
        }
        assert_eq!(limiter.when("x"), Duration::from_millis(100));
        assert_eq!(limiter.when("y"), Duration::from_millis(200));
        tokio::time::advance(secs(1)).await;
        // 10 tokens refilled, 2 of them were already reserved: the 9th call now waits 0.
        let delays: Vec<_> = (0..9).map(|_| limiter.when("z")).collect();
        assert_eq!(delays[..8], [Duration::ZERO; 8]);
        assert_eq!(delays[8], Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn default_controller_limiter_matches_go() {
        let exponential = default_controller_limiter(true);
        let delays: Vec<_> = (0..3).map(|_| exponential.when("claim")).collect();
        assert_eq!(delays, [secs(15), secs(30), secs(60)]);
        assert_eq!(exponential.retries("claim"), 3);
        exponential.forget("claim");
        assert_eq!(exponential.when("claim"), secs(15));

        let flat = default_controller_limiter(false);
        let delays: Vec<_> = (0..3).map(|_| flat.when("claim")).collect();
        assert_eq!(delays, [secs(15); 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn default_pv_save_limiter_starts_at_5ms() {
        let limiter = default_pv_save_limiter();
        let delays: Vec<_> = (0..3).map(|_| limiter.when("pv")).collect();
        let ms = Duration::from_millis;
        assert_eq!(delays, [ms(5), ms(10), ms(20)]);
        for _ in 0..30 {
            limiter.when("pv");
        }
        assert_eq!(limiter.when("pv"), DEFAULT_FAILURE_MAX_DELAY);
    }
}
