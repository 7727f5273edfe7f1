//! [`LeaderElector`]: acquire, renew in an owned task, report loss, release.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_client::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::error::chain;
use crate::http::Health;

use super::forbidden::{Forbidden, ForbiddenRun, RequestFailed, SLOW_RETRY_MAX};
use super::lease::{Outcome, Shared};
use super::missing::{MISSING_RETRY_MAX, MissingRun, NamespaceMissing, Report};
use super::record::{Mode, Observation};
use super::{LeaderElection, LeaderError, LeaderState, LeadershipLost, LossReason};

/// Elects this replica leader on a Lease and keeps it leader until the lease is lost or
/// released (client-go's `LeaderElector`, driven by the caller instead of callbacks).
///
/// # Guarantees
/// - At most one renewal task runs per elector; it is owned by the elector, stopped and
///   awaited by [`release`](Self::release), and aborted when the elector is dropped.
/// - Once a renewal has not succeeded for [`renew_deadline`](LeaderElection::renew_deadline),
///   or the Lease names another holder, the state becomes [`LeaderState::Lost`] and
///   [`lost`](Self::lost) resolves. Because other candidates wait a full lease duration
///   after the last change they saw, and the renew deadline is shorter, the old leader
///   steps down before anyone else can take over (as long as clocks run at similar rates).
/// - Nothing here exits the process or panics on API errors: loss is a value.
///
/// # Caveats
/// Dropping the elector stops renewing but does not release the lease: standbys then take
/// over only after the lease duration. Call [`release`](Self::release) on a graceful
/// shutdown, after the work has stopped.
#[doc(alias = "RunOrDie")]
pub struct LeaderElector {
    shared: Arc<Shared>,
    renewer: Option<Renewer>,
    health: Option<Health>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("lease", &self.shared.lease)
            .field("identity", &self.shared.cfg.identity.as_str())
            .field("state", &*self.shared.state.borrow())
            .finish_non_exhaustive()
    }
}

struct Renewer {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl LeaderElector {
    /// An elector for `cfg` that talks to the API server through `client`.
    ///
    /// Pass a client used for nothing else (see [`for_leader_election`](crate::client::for_leader_election)), so that
    /// renewals do not queue behind other requests. Nothing is sent until
    /// [`acquire`](Self::acquire).
    ///
    /// An empty [`namespace`](LeaderElection::namespace) becomes the client's
    /// (`Client::default_namespace`: the service account's namespace in a pod, the
    /// kubeconfig context's outside one); [`config`](Self::config) shows the one used.
    ///
    /// # Errors
    /// [`LeaderError::Config`] when [`LeaderElection::validate`] fails.
    pub fn new(client: Client, mut cfg: LeaderElection) -> Result<Self, LeaderError> {
        cfg.validate()?;
        if cfg.namespace.is_empty() {
            cfg.namespace = client.default_namespace().to_owned();
        }
        let api = Api::namespaced(client, cfg.namespace.as_str());
        let lease = format!("{}/{}", cfg.namespace.as_str(), cfg.lease_name.as_str());
        let (state, _) = watch::channel(LeaderState::Standby { holder: None });
        Ok(Self {
            shared: Arc::new(Shared {
                api,
                cfg,
                lease,
                observation: Mutex::new(Observation::default()),
                state,
            }),
            renewer: None,
            health: None,
        })
    }

    /// Reports to `health` what stops the election until a person acts, so that `/readyz`
    /// says it: while the Lease's namespace does not exist,
    /// [`Health::readiness`] answers [`NotReady::ElectionBlocked`](crate::http::NotReady::ElectionBlocked)
    /// naming the namespace. The role stays the caller's to set.
    pub fn report_to(&mut self, health: Health) {
        self.health = Some(health);
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &LeaderElection {
        &self.shared.cfg
    }

    /// This replica's identity, as written to `holderIdentity`.
    #[must_use]
    pub fn identity(&self) -> &str {
        self.shared.cfg.identity.as_str()
    }

    /// The current state.
    #[must_use]
    pub fn state(&self) -> LeaderState {
        self.shared.state.borrow().clone()
    }

    /// Whether this replica leads right now.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.shared.state.borrow().is_leading()
    }

    /// A receiver of every state change (e.g. to drive a readiness probe or a metric).
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<LeaderState> {
        self.shared.state.subscribe()
    }

    /// Whether this replica leads, for the other controllers that follow this election
    /// (see [`Leading`](super::Leading)); once the elector is dropped, never again.
    #[must_use]
    pub fn leading(&self) -> super::Leading {
        super::Leading::from_watch(self.subscribe(), LeaderState::is_leading)
    }

    /// Waits until this replica holds the lease, trying every
    /// [`retry_period`](LeaderElection::retry_period) (plus jitter), then starts renewing it
    /// in a task owned by the elector. Creates the Lease when it does not exist. Returns at
    /// once when already leading.
    ///
    /// Failed attempts (API errors, conflicts, timeouts) are logged at warn and retried;
    /// each attempt is bounded by the renew deadline.
    ///
    /// A request the API server refuses (403 Forbidden: the service account may not `get`,
    /// `create` or `update` the Lease) is logged once at warn, in one line naming the verb,
    /// the lease and the namespace, and again only every 10 minutes while it lasts (each
    /// attempt at debug). Meanwhile the pause between attempts doubles from the retry
    /// period up to 30 s (60 s at most with jitter): RBAC is fixed by an operator, not by
    /// retrying. The first attempt that is allowed again is logged at info.
    ///
    /// A namespace that does not exist (the Lease's `create` answers 404 for the namespace)
    /// is logged once at error, in one line naming the namespace and what to do, and shown
    /// by `/readyz` when the elector [reports to](Self::report_to) a [`Health`]. The pause
    /// between attempts then doubles from the retry period up to 4 minutes (5 at most with
    /// jitter); reaching 4 minutes is logged once more at warn, every other attempt at
    /// debug. Once the namespace exists the lease is acquired as usual, and that is
    /// logged at info.
    ///
    /// # Errors
    /// [`LeaderError::Cancelled`] when `shutdown` completes first; nothing was written then
    /// (or a write raced and will simply expire).
    pub async fn acquire(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), LeaderError> {
        if self.is_leader() {
            return Ok(());
        }
        self.stop_renewer().await;
        self.shared.state.send_if_modified(|s| {
            let standby = matches!(s, LeaderState::Standby { .. });
            if !standby {
                *s = LeaderState::Standby { holder: None };
            }
            !standby
        });
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.cfg;
        info!(lease = %shared.lease, identity = cfg.identity.as_str(), "waiting to acquire lease");
        tokio::pin!(shutdown);
        let mut forbidden = ForbiddenRun::default();
        let mut missing = MissingRun::default();
        let namespace = cfg.namespace.as_str();
        loop {
            let attempt = tokio::select! {
                biased;
                () = &mut shutdown => return Err(shared.cancelled()),
                attempt = timeout(cfg.renew_deadline, shared.attempt(Mode::Acquire)) => attempt,
            };
            let still_forbidden = matches!(&attempt, Ok(Err(failed)) if failed.is_forbidden());
            if let Some(attempts) = forbidden.end_unless(still_forbidden) {
                info!(lease = %shared.lease, attempts, "lease requests are no longer forbidden");
            }
            let still_missing =
                matches!(&attempt, Ok(Err(failed)) if failed.is_namespace_missing(namespace));
            if !still_missing && let Some(attempts) = missing.end() {
                info!(lease = %shared.lease, namespace, attempts, "leader election: namespace exists now");
                if let Some(health) = &self.health {
                    health.set_election_blocked(None);
                }
            }
            match attempt {
                Ok(Ok(Outcome::Holding {
                    spec,
                    takes_over,
                    previous,
                })) => {
                    info!(
                        lease = %shared.lease,
                        identity = cfg.identity.as_str(),
                        transitions = spec.lease_transitions.unwrap_or(0),
                        previous_holder = previous.as_deref().unwrap_or(""),
                        took_over = takes_over,
                        "acquired lease; now leading"
                    );
                    shared.state.send_replace(LeaderState::Leading);
                    self.start_renewer(Instant::now());
                    return Ok(());
                }
                Ok(Ok(Outcome::HeldByOther { holder })) => shared.note_holder(Some(holder)),
                Ok(Ok(Outcome::NotOurs { holder })) => shared.note_holder(holder),
                Ok(Ok(Outcome::Missing)) => {}
                Ok(Err(failed)) if failed.is_forbidden() => {
                    shared.report_forbidden(&failed, &mut forbidden, Instant::now());
                }
                Ok(Err(_)) if still_missing => {
                    shared.report_missing(&mut missing, self.health.as_ref());
                }
                Ok(Err(RequestFailed { verb, source })) => {
                    let error = chain(&source);
                    warn!(lease = %shared.lease, verb, %error, "failed to acquire lease; retrying");
                }
                Err(_) => warn!(
                    lease = %shared.lease,
                    timeout = ?cfg.renew_deadline,
                    "attempt to acquire lease timed out; retrying"
                ),
            }
            let pause = match (
                forbidden.pause(cfg.retry_period),
                missing.pause(cfg.retry_period),
            ) {
                (Some(slow), _) => jittered(slow).min(SLOW_RETRY_MAX.max(slow)),
                (None, Some(slow)) => jittered(slow).min(MISSING_RETRY_MAX.max(slow)),
                (None, None) => jittered(cfg.retry_period),
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return Err(shared.cancelled()),
                () = sleep(pause) => {}
            }
        }
    }

    /// Resolves when leadership ends: at once when this replica is not leading, otherwise
    /// when the renewal task reports a loss (or the lease is released). Cancel-safe; use it
    /// in a `select!` next to the work.
    pub async fn lost(&self) -> LeadershipLost {
        let mut rx = self.shared.state.subscribe();
        loop {
            let reason = match &*rx.borrow_and_update() {
                LeaderState::Leading => None,
                LeaderState::Lost(reason) => Some(reason.clone()),
                LeaderState::Released => Some(LossReason::Released),
                LeaderState::Standby { .. } => Some(LossReason::NotLeading),
            };
            if let Some(reason) = reason {
                return LeadershipLost {
                    lease: self.shared.lease.clone(),
                    reason,
                };
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self.shared`, which outlives this borrow.
                return LeadershipLost {
                    lease: self.shared.lease.clone(),
                    reason: LossReason::NotLeading,
                };
            }
        }
    }

    /// Stops renewing (awaiting the renewal task) and, when this replica still holds the
    /// lease, writes a released record: no holder and `leaseDurationSeconds: 1`, like
    /// client-go's `ReleaseOnCancel`, so a standby takes over at its next attempt.
    /// Does nothing when not leading. Call it after the work has stopped.
    ///
    /// # Errors
    /// [`LeaderError::Release`] when the write fails and [`LeaderError::ReleaseTimeout`]
    /// when it takes longer than the renew deadline; the state is
    /// [`LeaderState::Released`] either way (this replica no longer renews, so the lease
    /// expires after its duration).
    pub async fn release(&mut self) -> Result<(), LeaderError> {
        self.stop_renewer().await;
        if !self.is_leader() {
            debug!(lease = %self.shared.lease, "not leading; nothing to release");
            return Ok(());
        }
        let shared = &self.shared;
        let result = timeout(shared.cfg.renew_deadline, shared.write_released()).await;
        shared.state.send_replace(LeaderState::Released);
        match result {
            Ok(Ok(true)) => {
                info!(lease = %shared.lease, identity = shared.cfg.identity.as_str(), "released lease");
                Ok(())
            }
            Ok(Ok(false)) => {
                info!(lease = %shared.lease, "lease held by another replica; nothing to release");
                Ok(())
            }
            Ok(Err(source)) => Err(LeaderError::Release {
                lease: shared.lease.clone(),
                source,
            }),
            Err(_) => Err(LeaderError::ReleaseTimeout {
                lease: shared.lease.clone(),
                timeout: shared.cfg.renew_deadline,
            }),
        }
    }

    fn start_renewer(&mut self, renewed_at: Instant) {
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_loop(
            Arc::clone(&self.shared),
            stop.clone(),
            renewed_at,
        ));
        self.renewer = Some(Renewer { stop, task });
    }

    async fn stop_renewer(&mut self) {
        if let Some(Renewer { stop, task }) = self.renewer.take() {
            stop.cancel();
            if let Err(error) = task.await {
                warn!(lease = %self.shared.lease, %error, "lease renewal task failed");
            }
        }
    }
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        if let Some(Renewer { stop, task }) = self.renewer.take() {
            stop.cancel();
            task.abort();
            if self.is_leader() {
                info!(
                    lease = %self.shared.lease,
                    "elector dropped while leading; the lease expires without a release"
                );
            }
        }
    }
}

/// Renews every retry period until stopped or lost. A renewal round keeps retrying until
/// `renew_deadline` after the last successful renewal (stricter than client-go, which
/// counts from the start of the round).
async fn renew_loop(shared: Arc<Shared>, stop: CancellationToken, mut renewed_at: Instant) {
    let cfg = &shared.cfg;
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = sleep(cfg.retry_period) => {}
        }
        let deadline = renewed_at + cfg.renew_deadline;
        let mut forbidden = ForbiddenRun::default();
        loop {
            let started = Instant::now();
            let attempt = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                attempt = timeout_at(deadline, shared.attempt(Mode::Renew)) => attempt,
            };
            let reason = match attempt {
                Ok(Ok(Outcome::Holding { .. })) => {
                    debug!(lease = %shared.lease, "renewed lease");
                    renewed_at = started;
                    break;
                }
                Ok(Ok(Outcome::NotOurs { holder })) => LossReason::TakenOver { holder },
                Ok(Ok(Outcome::HeldByOther { holder })) => LossReason::TakenOver {
                    holder: Some(holder),
                },
                Ok(Ok(Outcome::Missing)) => LossReason::Deleted,
                Ok(Err(failed)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if failed.is_forbidden() {
                        shared.report_forbidden(&failed, &mut forbidden, Instant::now());
                    } else {
                        let error = chain(&failed.source);
                        let verb = failed.verb;
                        warn!(lease = %shared.lease, verb, %error, ?left, "failed to renew lease; retrying");
                    }
                    let pause_until = deadline.min(Instant::now() + cfg.retry_period);
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep_until(pause_until) => {}
                    }
                    if Instant::now() < deadline {
                        continue;
                    }
                    LossReason::RenewDeadlineExceeded
                }
                Err(_) => LossReason::RenewDeadlineExceeded,
            };
            warn!(
                lease = %shared.lease,
                identity = cfg.identity.as_str(),
                reason = %reason,
                "lost lease; stop working"
            );
            shared.state.send_replace(LeaderState::Lost(reason));
            return;
        }
    }
}

impl Shared {
    /// Logs a forbidden attempt: at warn in one line when `run` says it is news, else at
    /// debug; never the whole `Status`.
    fn report_forbidden(&self, failed: &RequestFailed, run: &mut ForbiddenRun, now: Instant) {
        let report = Forbidden {
            verb: failed.verb,
            name: self.cfg.lease_name.as_str(),
            namespace: self.cfg.namespace.as_str(),
        };
        if run.record(failed.verb, now) {
            let attempts = run.attempts();
            warn!(lease = %self.lease, attempts, "{report}");
        } else {
            debug!(lease = %self.lease, attempts = run.attempts(), "{report}");
        }
    }
}

impl Shared {
    /// Logs an attempt that found the namespace missing, as `run` says, and tells
    /// `health` the first time.
    fn report_missing(&self, run: &mut MissingRun, health: Option<&Health>) {
        let report = NamespaceMissing {
            namespace: self.cfg.namespace.as_str(),
            lease_name: self.cfg.lease_name.as_str(),
        };
        match run.record(self.cfg.retry_period) {
            Report::Start => {
                error!(lease = %self.lease, "{report}");
                if let Some(health) = health {
                    health.set_election_blocked(Some(report.readiness()));
                }
            }
            Report::Slowest => warn!(
                lease = %self.lease,
                attempts = run.attempts(),
                "leader election: namespace {:?} still does not exist; retrying every {} minutes",
                report.namespace,
                run.pause(self.cfg.retry_period).unwrap_or_default().as_secs() / 60,
            ),
            Report::Quiet => {
                debug!(lease = %self.lease, attempts = run.attempts(), "{report}");
            }
        }
    }
}

/// `period` stretched by a random factor in `[1, 1 + JITTER_FACTOR)`.
fn jittered(period: Duration) -> Duration {
    let factor = 1.0 + rand::random_range(0.0..LeaderElection::JITTER_FACTOR);
    period.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_client_go_bounds() {
        let period = Duration::from_millis(200);
        for _ in 0..1000 {
            let d = jittered(period);
            assert!(d >= period && d < period.mul_f64(2.2), "{d:?}");
        }
    }

    /// Compile-only: the futures the controller awaits are `Send`.
    fn _futures_are_send(elector: &mut LeaderElector) {
        fn is_send<T: Send>(_: T) {}
        is_send(elector.lost());
        is_send(elector.acquire(std::future::ready(())));
        is_send(elector.release());
    }
}
