//! Polling a condition in tests until it holds: "eventually the claim is bound".
//!
//! A controller under test works in the background, so a test checks its effect again and again
//! until it shows, with a limit that guards against a hang (it is not a timing assertion: keep it
//! generous). A check is an async closure returning
//!
//! - `bool`: done when `true`, or
//! - `Option<T>`: done when `Some`, and the wait returns the `T` (the object that was awaited).
//!
//! [`eventually`] checks every [`DEFAULT_PERIOD`] for up to [`DEFAULT_LIMIT`] and panics with
//! "timed out waiting for {what}". [`Wait`] sets another limit or period, and [`Wait::poll`]
//! returns [`TimedOut`] instead of panicking, for a test that prints more state on a timeout or
//! asserts that something does *not* happen within the limit.
//!
//! The clock is tokio's, so under paused time (`#[tokio::test(start_paused = true)]`) a wait
//! advances the clock instead of sleeping.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::time::Duration;
//!
//! use kube_sim::wait::{Wait, eventually};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let calls = AtomicU32::new(0);
//! // An `Option` check: the wait returns what the check found.
//! let third = eventually("the third call", || async {
//!     let call = calls.fetch_add(1, Ordering::Relaxed) + 1;
//!     (call == 3).then_some(call)
//! })
//! .await;
//! assert_eq!(third, 3);
//!
//! // A `bool` check, a short limit, and the timeout handled by the caller.
//! let never = Wait::new()
//!     .limit(Duration::from_millis(100))
//!     .every(Duration::from_millis(10))
//!     .poll(|| async { calls.load(Ordering::Relaxed) > 10 })
//!     .await;
//! assert!(never.is_err(), "the check is not called that often");
//! # }
//! ```
//!
//! Against a [`KubeSim`](crate::KubeSim):
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::PersistentVolumeClaim;
//! use kube_client::Api;
//! use kube_sim::{KubeSim, wait::eventually};
//!
//! # async fn example(sim: KubeSim) {
//! let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
//! let volume = eventually("claim data bound", || async {
//!     let claim = claims.get("data").await.ok()?;
//!     claim.spec?.volume_name
//! })
//! .await;
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

/// How long [`eventually`] waits before it fails: 20 s.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(20);

/// How often [`eventually`] checks: every 20 ms.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(20);

/// Polls `check` every [`DEFAULT_PERIOD`] until it returns `true` or `Some(value)`, and returns
/// `()` or the `value`.
///
/// # Panics
///
/// After [`DEFAULT_LIMIT`], with "timed out waiting for {what}" (so name what is awaited: "claim
/// data bound", "the finalizer removed").
pub async fn eventually<F, Fut>(what: &str, check: F) -> <Fut::Output as Outcome>::Output
where
    F: FnMut() -> Fut,
    Fut: Future<Output: Outcome>,
{
    Wait::new().until(what, check).await
}

/// A wait with its own limit and period; [`Wait::new`] starts from [`DEFAULT_LIMIT`] and
/// [`DEFAULT_PERIOD`].
///
/// ```
/// # use std::time::Duration;
/// # use kube_sim::wait::Wait;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// const SLOW: Wait = Wait::new().limit(Duration::from_secs(60)).every(Duration::from_millis(50));
/// SLOW.until("a ready answer", || async { true }).await;
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    limit: Duration,
    period: Duration,
}

impl Default for Wait {
    fn default() -> Self {
        Self::new()
    }
}

impl Wait {
    /// A wait of [`DEFAULT_LIMIT`], checking every [`DEFAULT_PERIOD`].
    pub const fn new() -> Self {
        Self {
            limit: DEFAULT_LIMIT,
            period: DEFAULT_PERIOD,
        }
    }

    /// Gives up after `limit`.
    pub const fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Checks every `period` (the time between the end of one check and the start of the next).
    pub const fn every(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Polls `check` until it returns `true` or `Some(value)`, and returns `()` or the `value`.
    ///
    /// # Panics
    ///
    /// At the limit, with "timed out waiting for {what}".
    pub async fn until<F, Fut>(self, what: &str, check: F) -> <Fut::Output as Outcome>::Output
    where
        F: FnMut() -> Fut,
        Fut: Future<Output: Outcome>,
    {
        match self.poll(check).await {
            Ok(value) => value,
            Err(TimedOut { limit }) => panic!("timed out waiting for {what} (after {limit:?})"),
        }
    }

    /// Polls `check` until it returns `true` or `Some(value)`, and returns `()` or the `value`;
    /// [`TimedOut`] at the limit. A check still running at the limit is dropped.
    pub async fn poll<F, Fut>(
        self,
        mut check: F,
    ) -> Result<<Fut::Output as Outcome>::Output, TimedOut>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output: Outcome>,
    {
        let poll = async {
            loop {
                if let Some(value) = check().await.done() {
                    return value;
                }
                tokio::time::sleep(self.period).await;
            }
        };
        tokio::time::timeout(self.limit, poll)
            .await
            .map_err(|_| TimedOut { limit: self.limit })
    }
}

/// What a check returns: `bool` (done when `true`) or `Option<T>` (done with the `T`).
pub trait Outcome {
    /// What a finished wait returns: `()` for `bool`, `T` for `Option<T>`.
    type Output;

    /// `Some` when the wait is over.
    fn done(self) -> Option<Self::Output>;
}

impl Outcome for bool {
    type Output = ();

    fn done(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Output = T;

    fn done(self) -> Option<T> {
        self
    }
}

/// A [`Wait::poll`] that reached its limit before its check held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("timed out after {limit:?}")]
pub struct TimedOut {
    /// The wait's limit.
    pub limit: Duration,
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_what_the_check_found_after_checking_every_period() {
        let start = tokio::time::Instant::now();
        let calls = Cell::new(0);
        let found = eventually("the third call", || async {
            calls.set(calls.get() + 1);
            (calls.get() == 3).then_some("found")
        })
        .await;
        assert_eq!(found, "found");
        assert_eq!(start.elapsed(), 2 * DEFAULT_PERIOD);
    }

    #[tokio::test(start_paused = true)]
    async fn times_out_at_the_limit_even_in_a_check_that_hangs() {
        let start = tokio::time::Instant::now();
        let wait = Wait::new().limit(Duration::from_secs(3));
        assert_eq!(
            wait.poll(|| async { false }).await,
            Err(TimedOut {
                limit: Duration::from_secs(3)
            })
        );
        assert_eq!(
            wait.poll(std::future::pending::<bool>).await,
            Err(TimedOut {
                limit: Duration::from_secs(3)
            })
        );
        assert_eq!(start.elapsed(), Duration::from_secs(6));
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out waiting for claim data bound (after 20s)")]
    async fn panics_naming_what_was_awaited() {
        eventually("claim data bound", || async { None::<()> }).await;
    }
}
