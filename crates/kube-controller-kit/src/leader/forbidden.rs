//! Lease requests the API server refuses (403): reported once in a short line, then
//! retried at a slow pace, because a missing RBAC rule does not fix itself in seconds.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// A Lease request that failed: the verb it used and the API error.
#[derive(Debug)]
pub(super) struct RequestFailed {
    /// `get`, `create` or `update`.
    pub(super) verb: &'static str,
    pub(super) source: kube_client::Error,
}

impl RequestFailed {
    /// Tags the error of a `verb` request.
    pub(super) fn of(verb: &'static str) -> impl FnOnce(kube_client::Error) -> Self {
        move |source| Self { verb, source }
    }

    /// Whether the API server answered 403 Forbidden.
    pub(super) fn is_forbidden(&self) -> bool {
        matches!(&self.source, kube_client::Error::Api(status) if status.is_forbidden())
    }
}

/// The one-line report of a refused request: verb, resource, name and namespace.
pub(super) struct Forbidden<'a> {
    pub(super) verb: &'static str,
    pub(super) name: &'a str,
    pub(super) namespace: &'a str,
}

impl fmt::Display for Forbidden<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "leader election: forbidden to {} leases", self.verb)?;
        // RBAC cannot restrict `create` by name, so naming the lease would mislead.
        if self.verb != "create" {
            write!(f, " {:?}", self.name)?;
        }
        write!(
            f,
            " in namespace {:?}; check the RBAC of the service account",
            self.namespace
        )
    }
}

/// The longest pause between two attempts while they are forbidden (jitter included).
pub(super) const SLOW_RETRY_MAX: Duration = Duration::from_secs(60);
/// The pause before jitter stops doubling at this.
const SLOW_RETRY_BASE: Duration = Duration::from_secs(30);
/// How often a run of forbidden attempts is reported again.
pub(super) const REPORT_AGAIN_AFTER: Duration = Duration::from_secs(10 * 60);

/// A run of consecutive forbidden attempts.
#[derive(Debug, Default)]
pub(super) struct ForbiddenRun {
    run: Option<Run>,
}

#[derive(Debug)]
struct Run {
    verb: &'static str,
    attempts: u32,
    reported_at: Instant,
}

impl ForbiddenRun {
    /// Counts a forbidden `verb` attempt; `true` when it is to be reported: the first of
    /// a run, the first with another verb, or [`REPORT_AGAIN_AFTER`] since the last report.
    pub(super) fn record(&mut self, verb: &'static str, now: Instant) -> bool {
        match &mut self.run {
            Some(run) if run.verb == verb => {
                run.attempts = run.attempts.saturating_add(1);
                if now.saturating_duration_since(run.reported_at) >= REPORT_AGAIN_AFTER {
                    run.reported_at = now;
                    return true;
                }
                false
            }
            _ => {
                self.run = Some(Run {
                    verb,
                    attempts: 1,
                    reported_at: now,
                });
                true
            }
        }
    }

    /// Ends the run (an attempt was not forbidden); the number of forbidden attempts it
    /// had, if there was one.
    pub(super) fn end(&mut self) -> Option<u32> {
        self.run.take().map(|run| run.attempts)
    }

    /// [`end`](Self::end)s the run unless the latest attempt was `forbidden` too.
    pub(super) fn end_unless(&mut self, forbidden: bool) -> Option<u32> {
        if forbidden { None } else { self.end() }
    }

    /// Forbidden attempts so far in this run.
    pub(super) fn attempts(&self) -> u32 {
        self.run.as_ref().map_or(0, |run| run.attempts)
    }

    /// The pause before the next attempt, before jitter: `retry_period` doubled per
    /// forbidden attempt after the first, up to 30 s; `None` outside a run.
    pub(super) fn pause(&self, retry_period: Duration) -> Option<Duration> {
        let run = self.run.as_ref()?;
        let doublings = run.attempts.saturating_sub(1).min(16);
        let pause = retry_period.saturating_mul(1 << doublings);
        Some(pause.min(SLOW_RETRY_BASE.max(retry_period)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_verb_resource_name_and_namespace() {
        let get = Forbidden {
            verb: "get",
            name: "example.com-nfs",
            namespace: "storage",
        };
        assert_eq!(
            get.to_string(),
            "leader election: forbidden to get leases \"example.com-nfs\" in namespace \
             \"storage\"; check the RBAC of the service account"
        );
        let create = Forbidden {
            verb: "create",
            ..get
        };
        assert_eq!(
            create.to_string(),
            "leader election: forbidden to create leases in namespace \"storage\"; \
             check the RBAC of the service account"
        );
    }

    #[test]
    fn a_run_is_reported_at_its_start_on_a_new_verb_and_every_ten_minutes() {
        let start = Instant::now();
        let mut run = ForbiddenRun::default();
        assert!(run.record("get", start));
        assert!(!run.record("get", start + Duration::from_secs(60)));
        assert!(!run.record("get", start + Duration::from_secs(599)));
        assert!(run.record("get", start + Duration::from_secs(600)));
        assert!(!run.record("get", start + Duration::from_secs(700)));
        assert!(run.record("create", start + Duration::from_secs(701)));
        assert_eq!(run.attempts(), 1);
        assert_eq!(run.end(), Some(1));
        assert_eq!(run.end(), None);
        assert!(run.record("create", start + Duration::from_secs(702)));
    }

    #[test]
    fn the_pause_doubles_from_the_retry_period_up_to_thirty_seconds() {
        let retry = Duration::from_secs(2);
        let mut run = ForbiddenRun::default();
        assert_eq!(run.pause(retry), None);
        let now = Instant::now();
        let mut pauses = Vec::new();
        for _ in 0..7 {
            run.record("get", now);
            pauses.push(run.pause(retry).unwrap().as_secs());
        }
        assert_eq!(pauses, [2, 4, 8, 16, 30, 30, 30]);
        for _ in 0..100 {
            run.record("get", now);
        }
        assert_eq!(run.pause(retry), Some(Duration::from_secs(30)));
        run.end();
        assert_eq!(run.pause(retry), None);
    }
}
