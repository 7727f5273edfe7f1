//! [`LeaderElection`]: which Lease to hold, under which identity, and how often to renew it.

use std::fmt;
use std::time::Duration;

/// One option of [`LeaderElection`], as an [`InvalidLeaderElection`] names it.
///
/// Displays as the Rust name, followed by the Go name where the Go provisioner library or
/// client-go has one: `renew_deadline (Go RenewDeadline)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaderElectionOption {
    /// [`LeaderElection::lease_name`](LeaderElection::lease_name()).
    LeaseName,
    /// [`LeaderElection::namespace`](LeaderElection::namespace()) (Go `LeaderElectionNamespace`).
    Namespace,
    /// [`LeaderElection::identity`](LeaderElection::identity()) (client-go `Identity`).
    Identity,
    /// [`LeaderElection::lease_duration`](LeaderElection::lease_duration()) (Go `LeaseDuration`).
    LeaseDuration,
    /// [`LeaderElection::renew_deadline`](LeaderElection::renew_deadline()) (Go `RenewDeadline`).
    RenewDeadline,
    /// [`LeaderElection::retry_period`](LeaderElection::retry_period()) (Go `RetryPeriod`).
    RetryPeriod,
}

impl LeaderElectionOption {
    /// The field and builder method of [`LeaderElection`], e.g. `"renew_deadline"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LeaseName => "lease_name",
            Self::Namespace => "namespace",
            Self::Identity => "identity",
            Self::LeaseDuration => "lease_duration",
            Self::RenewDeadline => "renew_deadline",
            Self::RetryPeriod => "retry_period",
        }
    }

    /// The Go option a user of the Go provisioner library or client-go knows, e.g.
    /// `"RenewDeadline"`; `None` for the lease name, which Go derives from the provisioner.
    #[must_use]
    pub fn go_name(self) -> Option<&'static str> {
        match self {
            Self::LeaseName => None,
            Self::Namespace => Some("LeaderElectionNamespace"),
            Self::Identity => Some("Identity"),
            Self::LeaseDuration => Some("LeaseDuration"),
            Self::RenewDeadline => Some("RenewDeadline"),
            Self::RetryPeriod => Some("RetryPeriod"),
        }
    }
}

impl fmt::Display for LeaderElectionOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        if let Some(go) = self.go_name() {
            write!(f, " (Go {go})")?;
        }
        Ok(())
    }
}

/// A leader-election setting that cannot work, naming the option and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid leader election setting {option}: {reason}")]
#[non_exhaustive]
pub struct InvalidLeaderElection {
    /// The offending option.
    pub option: LeaderElectionOption,
    /// What is wrong with it.
    pub reason: String,
}

impl InvalidLeaderElection {
    fn new(option: LeaderElectionOption, reason: impl Into<String>) -> Self {
        Self {
            option,
            reason: reason.into(),
        }
    }
}

/// Where and how to elect a leader: the `coordination.k8s.io/v1` Lease, this replica's
/// identity and the three timings of client-go's `LeaderElectionConfig`.
///
/// Timings (Go defaults): a holder keeps the lease for the
/// [lease duration](Self::lease_duration()) (15 s) after its last renewal as observed by
/// the others; the holder gives up when it could not renew for the
/// [renew deadline](Self::renew_deadline()) (10 s); attempts to acquire or renew are
/// one [retry period](Self::retry_period()) (2 s) apart.
///
/// Each option is a public field, read as `election.renew_deadline`, and a builder method
/// of the same name, `.renew_deadline(Duration::from_secs(10))`. Setting never fails;
/// [`validate`](Self::validate) checks the combination and
/// [`LeaderElector::new`](super::LeaderElector::new) calls it.
///
/// The namespace left empty (as in [`Default`]) is the client's:
/// [`LeaderElector::new`](super::LeaderElector::new) fills it with
/// `kube_client::Client::default_namespace`, which is the service account's namespace in a
/// pod and the kubeconfig context's namespace (else `default`) outside one. A binary that
/// sets `POD_NAMESPACE` (the downward API) passes it to [`namespace`](Self::namespace()).
///
/// A controller may take this as part of its own configuration and fill in the rest:
/// [`LeaderElection::default`] leaves the lease name and the identity empty, and
/// [`resolved_for`](Self::resolved_for) names the lease after the controller (see
/// [`lease_name_for`](Self::lease_name_for)) and picks a
/// [`default_identity`](Self::default_identity). provision-controller's
/// `Config::leader_election` works this way.
#[doc(alias = "LeaderElectionConfig")]
#[doc(alias = "LeaderElectionNamespace")]
#[doc(alias = "LeaseDuration")]
#[doc(alias = "RenewDeadline")]
#[doc(alias = "RetryPeriod")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderElection {
    /// The Lease name. Empty (in [`Default`]) means: named by
    /// [`resolved_for`](Self::resolved_for) after the controller.
    pub lease_name: String,
    /// The Lease namespace (Go `LeaderElectionNamespace`). Empty (in [`Default`]) means:
    /// the client's namespace, filled by [`LeaderElector::new`](super::LeaderElector::new).
    pub namespace: String,
    /// The identity written to `holderIdentity`. Empty (in [`Default`]) means: a
    /// [`default_identity`](Self::default_identity), filled by
    /// [`resolved_for`](Self::resolved_for).
    pub identity: String,
    /// How long a lease stays valid after its last renewal (Go `LeaseDuration`). Default 15 s.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up (Go `RenewDeadline`).
    /// Default 10 s.
    pub renew_deadline: Duration,
    /// The pause between attempts to acquire or renew (Go `RetryPeriod`). Default 2 s.
    pub retry_period: Duration,
}

impl Default for LeaderElection {
    /// The Go timings, an empty namespace (the client's, filled by
    /// [`LeaderElector::new`](super::LeaderElector::new)), and an empty lease name and
    /// identity, which [`resolved_for`](Self::resolved_for) derives from a controller name
    /// and the host.
    fn default() -> Self {
        Self {
            lease_name: String::new(),
            namespace: String::new(),
            identity: String::new(),
            lease_duration: Self::DEFAULT_LEASE_DURATION,
            renew_deadline: Self::DEFAULT_RENEW_DEADLINE,
            retry_period: Self::DEFAULT_RETRY_PERIOD,
        }
    }
}

impl LeaderElection {
    /// Default for [`lease_duration`](Self::lease_duration()) (Go: `DefaultLeaseDuration`).
    pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
    /// Default for [`renew_deadline`](Self::renew_deadline()) (Go: `DefaultRenewDeadline`).
    pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
    /// Default for [`retry_period`](Self::retry_period()) (Go: `DefaultRetryPeriod`).
    pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
    /// Acquire attempts wait between `retry_period` and `retry_period * (1 + JITTER_FACTOR)`,
    /// so standbys do not hit the API server in lockstep (client-go's `JitterFactor`).
    pub const JITTER_FACTOR: f64 = 1.2;

    /// Elects on the Lease `namespace/lease_name` with the default timings and a
    /// [`default_identity`](Self::default_identity). An empty `namespace` is the client's
    /// (see [`namespace`](Self::namespace())).
    ///
    /// # Errors
    /// [`InvalidLeaderElection`] when the name is empty.
    pub fn new(
        lease_name: impl Into<String>,
        namespace: impl Into<String>,
    ) -> Result<Self, InvalidLeaderElection> {
        let cfg = Self {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            identity: Self::default_identity(),
            lease_duration: Self::DEFAULT_LEASE_DURATION,
            renew_deadline: Self::DEFAULT_RENEW_DEADLINE,
            retry_period: Self::DEFAULT_RETRY_PERIOD,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Elects on the Lease named after the provisioner, with every `/` replaced by `-`
    /// (as the Go library names its lock), e.g. `example.com/nfs` → `example.com-nfs`.
    ///
    /// # Errors
    /// [`InvalidLeaderElection`] when the name is empty.
    pub fn for_provisioner(
        provisioner_name: &str,
        namespace: impl Into<String>,
    ) -> Result<Self, InvalidLeaderElection> {
        Self::new(Self::lease_name_for(provisioner_name), namespace)
    }

    /// Elects with explicit timings, validated at once.
    ///
    /// # Errors
    /// [`InvalidLeaderElection`] naming the first field that does not fit (see
    /// [`validate`](Self::validate)).
    pub fn timings(
        self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, InvalidLeaderElection> {
        let cfg = self
            .lease_duration(lease_duration)
            .renew_deadline(renew_deadline)
            .retry_period(retry_period);
        cfg.validate()?;
        Ok(cfg)
    }

    /// The Lease name the Go provisioner library uses for a provisioner (or any controller
    /// named like one): `/` replaced by `-`.
    #[must_use]
    pub fn lease_name_for(controller_name: &str) -> String {
        controller_name.replace('/', "-")
    }

    /// `<hostname>_<16 random hex digits>`: unique per process, so a restarted pod never
    /// mistakes its predecessor's lease for its own (Go uses hostname + `_` + a UUID).
    #[must_use]
    pub fn default_identity() -> String {
        let host = gethostname::gethostname();
        let suffix: u64 = rand::random();
        format!("{}_{suffix:016x}", host.to_string_lossy())
    }

    /// The Lease name. Empty (in [`Default`]) means: named by
    /// [`resolved_for`](Self::resolved_for) after the controller.
    #[must_use]
    pub fn lease_name(mut self, name: impl Into<String>) -> Self {
        self.lease_name = name.into();
        self
    }

    /// The Lease namespace (Go `LeaderElectionNamespace`). Default empty: the namespace of
    /// the client the elector is given (`kube_client::Client::default_namespace`: the
    /// service account's in a pod), filled by
    /// [`LeaderElector::new`](super::LeaderElector::new). A binary passes `POD_NAMESPACE`
    /// here when it is set.
    #[doc(alias = "LeaderElectionNamespace")]
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Fills what is left empty: the lease name from `controller_name` ('/' → '-') and
    /// the identity with a [`default_identity`](Self::default_identity).
    #[must_use]
    pub fn resolved_for(mut self, controller_name: &str) -> Self {
        if self.lease_name.is_empty() {
            self.lease_name = Self::lease_name_for(controller_name);
        }
        if self.identity.is_empty() {
            self.identity = Self::default_identity();
        }
        self
    }

    /// The identity written to `holderIdentity`.
    /// Default: [`default_identity`](Self::default_identity) (empty in [`Default`], filled
    /// by [`resolved_for`](Self::resolved_for)).
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// How long a lease stays valid after its last renewal as observed locally by a
    /// candidate (Go `LeaseDuration`). Written to `leaseDurationSeconds`, rounded up to
    /// whole seconds. Default 15 s.
    #[doc(alias = "LeaseDuration")]
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// How long the leader keeps trying to renew before it gives up leadership (Go
    /// `RenewDeadline`). Default 10 s.
    #[doc(alias = "RenewDeadline")]
    #[must_use]
    pub fn renew_deadline(mut self, duration: Duration) -> Self {
        self.renew_deadline = duration;
        self
    }

    /// The pause between attempts to acquire or renew (Go `RetryPeriod`). Default 2 s.
    #[doc(alias = "RetryPeriod")]
    #[must_use]
    pub fn retry_period(mut self, duration: Duration) -> Self {
        self.retry_period = duration;
        self
    }

    /// Checks the settings the way client-go does.
    ///
    /// # Errors
    /// [`InvalidLeaderElection`] when `lease_name` or `identity` is empty, when `namespace`
    /// has surrounding whitespace (an empty one is filled from the client),
    /// when `lease_duration` is under one second (the Lease counts whole seconds), when
    /// `renew_deadline` is not below `lease_duration`, when `retry_period` is zero, or when
    /// `renew_deadline` is not above `retry_period * JITTER_FACTOR`.
    pub fn validate(&self) -> Result<(), InvalidLeaderElection> {
        if self.lease_name.is_empty() {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::LeaseName,
                "must not be empty",
            ));
        }
        if self.namespace.trim() != self.namespace {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::Namespace,
                format!("{:?} has surrounding whitespace", self.namespace),
            ));
        }
        if self.identity.is_empty() {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::Identity,
                "must not be empty",
            ));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::LeaseDuration,
                format!("{:?} is under one second", self.lease_duration),
            ));
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::LeaseDuration,
                format!(
                    "{:?} does not fit leaseDurationSeconds",
                    self.lease_duration
                ),
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::RenewDeadline,
                format!(
                    "{:?} must be shorter than lease_duration {:?}",
                    self.renew_deadline, self.lease_duration
                ),
            ));
        }
        if self.retry_period.is_zero() {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::RetryPeriod,
                "must not be zero",
            ));
        }
        if self.renew_deadline.as_secs_f64()
            <= self.retry_period.as_secs_f64() * Self::JITTER_FACTOR
        {
            return Err(InvalidLeaderElection::new(
                LeaderElectionOption::RenewDeadline,
                format!(
                    "{:?} must be longer than retry_period {:?} times {}",
                    self.renew_deadline,
                    self.retry_period,
                    Self::JITTER_FACTOR
                ),
            ));
        }
        Ok(())
    }

    /// `leaseDurationSeconds` to write: the lease duration rounded up to whole seconds.
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LeaderElection {
        LeaderElection::new("lease", "ns").unwrap()
    }

    #[test]
    fn defaults_are_go_defaults() {
        let c = cfg();
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(c.lease_duration_seconds(), 15);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn lease_is_named_after_the_provisioner_with_slashes_replaced() {
        let c = LeaderElection::for_provisioner("example.com/nfs/v2", "kube-system").unwrap();
        assert_eq!(c.lease_name, "example.com-nfs-v2");
        assert_eq!(c.namespace, "kube-system");
    }

    #[test]
    fn an_empty_namespace_is_valid_and_left_for_the_client_to_fill() {
        assert_eq!(LeaderElection::default().namespace, "");
        let c = LeaderElection::new("l", "").unwrap();
        assert_eq!(c.namespace, "");
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn default_identity_is_hostname_underscore_random_suffix() {
        let a = LeaderElection::default_identity();
        let b = LeaderElection::default_identity();
        assert_ne!(a, b);
        let (host, suffix) = a.rsplit_once('_').unwrap();
        assert_eq!(host, gethostname::gethostname().to_string_lossy());
        assert_eq!(suffix.len(), 16);
        assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn invalid_settings_name_their_option() {
        use LeaderElectionOption::*;
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let cases = [
            (s(10), s(10), s(2), RenewDeadline),
            (s(5), s(10), s(2), RenewDeadline),
            (ms(500), ms(400), ms(100), LeaseDuration),
            (s(15), s(10), Duration::ZERO, RetryPeriod),
            (s(15), s(2), s(2), RenewDeadline),
            (s(u64::from(u32::MAX)), s(10), s(2), LeaseDuration),
        ];
        for (lease, renew, retry, option) in cases {
            let err = cfg().timings(lease, renew, retry).unwrap_err();
            assert_eq!(err.option, option, "{lease:?} {renew:?} {retry:?}: {err}");
        }
        assert_eq!(LeaderElection::new("", "ns").unwrap_err().option, LeaseName);
        assert_eq!(
            LeaderElection::new("l", " ns").unwrap_err().option,
            Namespace
        );
        assert_eq!(cfg().identity("").validate().unwrap_err().option, Identity);
        let err = cfg().timings(s(5), s(10), s(2)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid leader election setting renew_deadline (Go RenewDeadline): \
             10s must be shorter than lease_duration 5s"
        );
    }

    #[test]
    fn short_test_timings_are_accepted_and_rounded_up_to_whole_seconds() {
        let ms = Duration::from_millis;
        let c = cfg().timings(ms(2500), ms(1000), ms(200)).unwrap();
        assert_eq!(c.lease_duration_seconds(), 3);
    }
}
