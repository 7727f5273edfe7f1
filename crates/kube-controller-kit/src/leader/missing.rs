//! The Lease's namespace does not exist: the API server answers the Lease's `create` with
//! 404 `namespaces "x" not found`. Only an operator fixes that (creating the namespace, or
//! pointing the election at one that exists), so it is reported once as an error, shown by
//! `/readyz`, and retried at a pace that slows down to minutes.

use std::fmt;
use std::time::Duration;

use super::forbidden::RequestFailed;

/// The pause before jitter stops doubling at this.
pub(super) const MISSING_RETRY_BASE: Duration = Duration::from_secs(4 * 60);
/// The longest pause between two attempts while the namespace is missing (jitter included).
pub(super) const MISSING_RETRY_MAX: Duration = Duration::from_secs(5 * 60);

impl RequestFailed {
    /// Whether the API server answered 404 for the namespace `namespace` itself (not for
    /// the Lease): what creating an object in a namespace that does not exist returns.
    pub(super) fn is_namespace_missing(&self, namespace: &str) -> bool {
        let kube_client::Error::Api(status) = &self.source else {
            return false;
        };
        status.is_not_found()
            && status
                .details
                .as_ref()
                .is_some_and(|d| d.kind == "namespaces" && d.name == namespace)
    }
}

/// What to tell a person, in one line, and what `/readyz` answers meanwhile.
pub(super) struct NamespaceMissing<'a> {
    pub(super) namespace: &'a str,
    pub(super) lease_name: &'a str,
}

impl NamespaceMissing<'_> {
    /// The `/readyz` text: the problem and what to do, without retry details.
    pub(super) fn readiness(&self) -> String {
        format!(
            "leader election: namespace {:?} does not exist; create it, or set the \
             leader-election namespace (POD_NAMESPACE) to one that exists",
            self.namespace
        )
    }
}

impl fmt::Display for NamespaceMissing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "leader election: namespace {ns:?} does not exist, so the Lease {ns}/{name} cannot \
             be created; create the namespace, or set the leader-election namespace \
             (POD_NAMESPACE) to one that exists; retrying at a pace that slows to every {max} \
             minutes",
            ns = self.namespace,
            name = self.lease_name,
            max = MISSING_RETRY_BASE.as_secs() / 60,
        )
    }
}

/// What to log about one more attempt that found the namespace missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Report {
    /// The first of a run: the error line.
    Start,
    /// The pause has just reached its longest: one more line saying so.
    Slowest,
    /// Nothing new (logged at debug).
    Quiet,
}

/// A run of consecutive attempts that found the namespace missing.
#[derive(Debug, Default)]
pub(super) struct MissingRun {
    attempts: Option<u32>,
}

impl MissingRun {
    /// Counts an attempt that found the namespace missing and says what to log.
    pub(super) fn record(&mut self, retry_period: Duration) -> Report {
        let Some(attempts) = &mut self.attempts else {
            self.attempts = Some(1);
            return Report::Start;
        };
        let before = Self::pause_after(*attempts, retry_period);
        *attempts = attempts.saturating_add(1);
        let after = Self::pause_after(*attempts, retry_period);
        if after > before && after == Self::slowest(retry_period) {
            Report::Slowest
        } else {
            Report::Quiet
        }
    }

    /// Ends the run (the namespace exists, or another error came); the number of attempts
    /// it had, if there was one.
    pub(super) fn end(&mut self) -> Option<u32> {
        self.attempts.take()
    }

    /// Attempts so far in this run.
    pub(super) fn attempts(&self) -> u32 {
        self.attempts.unwrap_or(0)
    }

    /// The pause before the next attempt, before jitter: `retry_period` doubled per
    /// attempt after the first, up to [`MISSING_RETRY_BASE`]; `None` outside a run.
    pub(super) fn pause(&self, retry_period: Duration) -> Option<Duration> {
        self.attempts
            .map(|attempts| Self::pause_after(attempts, retry_period))
    }

    fn slowest(retry_period: Duration) -> Duration {
        MISSING_RETRY_BASE.max(retry_period)
    }

    fn pause_after(attempts: u32, retry_period: Duration) -> Duration {
        let doublings = attempts.saturating_sub(1).min(20);
        retry_period
            .saturating_mul(1 << doublings)
            .min(Self::slowest(retry_period))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_the_namespace_the_lease_and_what_to_do() {
        let missing = NamespaceMissing {
            namespace: "storage",
            lease_name: "example.com-nfs",
        };
        assert_eq!(
            missing.to_string(),
            "leader election: namespace \"storage\" does not exist, so the Lease \
             storage/example.com-nfs cannot be created; create the namespace, or set the \
             leader-election namespace (POD_NAMESPACE) to one that exists; retrying at a pace \
             that slows to every 4 minutes"
        );
        assert_eq!(
            missing.readiness(),
            "leader election: namespace \"storage\" does not exist; create it, or set the \
             leader-election namespace (POD_NAMESPACE) to one that exists"
        );
    }

    #[test]
    fn the_pause_doubles_to_four_minutes_and_the_run_is_reported_twice() {
        let retry = Duration::from_secs(2);
        let mut run = MissingRun::default();
        assert_eq!(run.pause(retry), None);
        let mut pauses = Vec::new();
        let mut reports = Vec::new();
        for _ in 0..10 {
            reports.push(run.record(retry));
            pauses.push(run.pause(retry).unwrap().as_secs());
        }
        assert_eq!(pauses, [2, 4, 8, 16, 32, 64, 128, 240, 240, 240]);
        let loud: Vec<_> = reports
            .iter()
            .enumerate()
            .filter(|(_, r)| **r != Report::Quiet)
            .collect();
        assert_eq!(loud, [(0, &Report::Start), (7, &Report::Slowest)]);
        assert_eq!(run.attempts(), 10);
        assert_eq!(run.end(), Some(10));
        assert_eq!(run.end(), None);
        assert_eq!(run.record(retry), Report::Start);
    }

    #[test]
    fn a_retry_period_longer_than_the_base_is_kept() {
        let retry = Duration::from_secs(600);
        let mut run = MissingRun::default();
        run.record(retry);
        run.record(retry);
        assert_eq!(run.pause(retry), Some(retry));
    }
}
