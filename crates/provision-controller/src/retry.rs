//! How failures are retried, as options that replace Go options excluding each other:
//! [`FailureBackoff`] (a failed claim or volume sync) and [`PvSaveStrategy`] (a PV that
//! could not be saved). Read by [`Config`](crate::Config); below it, so the defaults live
//! here and `Config` names them.

use std::{fmt, sync::Arc, time::Duration};

use crate::ratelimit::RateLimiter;

/// Go `CreateProvisionedPVRetryCount`'s default ([`crate::Config::DEFAULT_CREATE_PV_RETRIES`]).
pub(crate) const DEFAULT_CREATE_PV_RETRIES: u32 = 5;

/// Go `CreateProvisionedPVInterval`'s default ([`crate::Config::DEFAULT_CREATE_PV_INTERVAL`]).
pub(crate) const DEFAULT_CREATE_PV_INTERVAL: Duration = Duration::from_secs(10);

/// How a failed claim or volume is delayed before its next attempt.
///
/// One enum because Go's `RateLimiter` option silently overrides `ExponentialBackOffOnError`.
#[derive(Clone, Default)]
#[non_exhaustive]
#[doc(alias = "ExponentialBackOffOnError")]
#[doc(alias = "RateLimiter")]
pub enum FailureBackoff {
    /// 15 s per key, doubling to 1000 s, combined with a token bucket of 10/s, burst 100
    /// (Go `ExponentialBackOffOnError(true)`, the default).
    #[default]
    Exponential,
    /// 15 s per key, flat, combined with the same token bucket
    /// (Go `ExponentialBackOffOnError(false)`).
    Flat,
    /// Per key only: the first retry after `initial`, each next one after twice as long,
    /// up to `max`, with no shared token bucket (the `RateLimiter` kubernetes-csi's
    /// external-provisioner builds from its `--retry-interval-start` and
    /// `--retry-interval-max`: client-go's `ItemExponentialFailureRateLimiter`).
    PerKey {
        /// The first delay.
        initial: Duration,
        /// The longest delay.
        max: Duration,
    },
    /// A caller's limiter (Go `RateLimiter`), shared by the claim and volume queues.
    Custom(Arc<dyn RateLimiter>),
}

impl fmt::Debug for FailureBackoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exponential => f.write_str("Exponential"),
            Self::Flat => f.write_str("Flat"),
            Self::PerKey { initial, max } => f
                .debug_struct("PerKey")
                .field("initial", initial)
                .field("max", max)
                .finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl FailureBackoff {
    pub(crate) fn limiter(&self) -> Arc<dyn RateLimiter> {
        match self {
            Self::Exponential => crate::ratelimit::default_controller_limiter(true),
            Self::Flat => crate::ratelimit::default_controller_limiter(false),
            Self::PerKey { initial, max } => Arc::new(
                crate::ratelimit::ItemExponentialLimiter::new(*initial, *max),
            ),
            Self::Custom(limiter) => Arc::clone(limiter),
        }
    }
}

/// How a provisioned PV object is saved to the API server.
///
/// One enum because Go's `CreateProvisionedPVRetryCount`/`Interval`, `CreateProvisionedPVBackoff`
/// and `CreateProvisionedPVLimiter` exclude each other.
#[derive(Clone)]
#[non_exhaustive]
pub enum PvSaveStrategy {
    /// Try `retries` times, `interval` apart, inside the claim's operation; when every try
    /// fails, delete the asset (same schedule) and retry the claim. If the cleanup fails too,
    /// a `ProvisioningCleanupFailed` event asks for manual cleanup.
    /// Default: 5 tries, 10 s apart (Go `CreateProvisionedPVRetryCount`/`Interval`).
    #[doc(alias = "CreateProvisionedPVRetryCount")]
    #[doc(alias = "CreateProvisionedPVInterval")]
    Blocking {
        /// Number of create attempts (at least 1).
        retries: u32,
        /// Pause between attempts.
        interval: Duration,
    },
    /// Like [`Self::Blocking`] with growing pauses: `steps` attempts, the first pause
    /// `initial`, each next one multiplied by `factor`, capped at `cap`
    /// (Go `CreateProvisionedPVBackoff`, without jitter).
    #[doc(alias = "CreateProvisionedPVBackoff")]
    Backoff {
        /// First pause.
        initial: Duration,
        /// Multiplier for each next pause (at least 1.0).
        factor: f64,
        /// Number of create attempts (at least 1).
        steps: u32,
        /// Largest pause, if any.
        cap: Option<Duration>,
    },
    /// Try once; on failure hand the PV to a background queue that retries forever with
    /// `limiter`; the asset is never deleted and the claim counts as provisioned
    /// (Go `CreateProvisionedPVLimiter`). Unsaved PVs are counted in the metrics.
    #[doc(alias = "CreateProvisionedPVLimiter")]
    Background {
        /// Delay between attempts per PV.
        limiter: Arc<dyn RateLimiter>,
    },
}

impl Default for PvSaveStrategy {
    fn default() -> Self {
        Self::Blocking {
            retries: DEFAULT_CREATE_PV_RETRIES,
            interval: DEFAULT_CREATE_PV_INTERVAL,
        }
    }
}

impl PvSaveStrategy {
    /// [`PvSaveStrategy::Background`] with the default limiter.
    #[must_use]
    pub fn background() -> Self {
        Self::Background {
            limiter: crate::ratelimit::default_pv_save_limiter(),
        }
    }

    /// The pauses between attempts of a blocking strategy (one fewer than attempts);
    /// `None` for [`Self::Background`].
    pub(crate) fn pauses(&self) -> Option<Vec<Duration>> {
        match *self {
            Self::Blocking { retries, interval } => {
                Some(vec![interval; retries.saturating_sub(1) as usize])
            }
            Self::Backoff {
                initial,
                factor,
                steps,
                cap,
            } => {
                let mut pauses = Vec::new();
                let mut next = initial;
                for _ in 1..steps {
                    let pause = cap.map_or(next, |c| next.min(c));
                    pauses.push(pause);
                    next = Duration::try_from_secs_f64(next.as_secs_f64() * factor)
                        .unwrap_or(Duration::MAX);
                }
                Some(pauses)
            }
            Self::Background { .. } => None,
        }
    }
}

impl fmt::Debug for PvSaveStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Blocking { retries, interval } => f
                .debug_struct("Blocking")
                .field("retries", retries)
                .field("interval", interval)
                .finish(),
            Self::Backoff {
                initial,
                factor,
                steps,
                cap,
            } => f
                .debug_struct("Backoff")
                .field("initial", initial)
                .field("factor", factor)
                .field("steps", steps)
                .field("cap", cap)
                .finish(),
            Self::Background { .. } => f.write_str("Background { .. }"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_strategy_pauses_grow_by_factor_up_to_the_cap() {
        let s = PvSaveStrategy::Backoff {
            initial: Duration::from_secs(1),
            factor: 2.0,
            steps: 5,
            cap: Some(Duration::from_secs(5)),
        };
        let secs: Vec<u64> = s.pauses().unwrap().iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 5]);
        assert_eq!(PvSaveStrategy::background().pauses(), None);
    }

    #[test]
    fn per_key_backoff_doubles_from_initial_to_max_with_no_bucket() {
        let limiter = FailureBackoff::PerKey {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(5),
        }
        .limiter();
        let delays: Vec<u64> = (0..5).map(|_| limiter.when("ns/claim").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        // Another key starts again at `initial`: nothing shared between keys.
        assert_eq!(limiter.when("ns/other"), Duration::from_secs(1));
    }
}
