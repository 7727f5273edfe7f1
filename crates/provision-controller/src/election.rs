//! [`LeaderElection`]: the Lease the controller holds, its identity and timings.

use std::time::Duration;

use kube_controller_kit::leader as kit;

use crate::error::{ConfigError, ConfigOption};

/// Where and how the replicas elect their leader: the `coordination.k8s.io/v1` Lease, this
/// replica's identity and the three timings of client-go's `LeaderElectionConfig` (Go
/// options `LeaderElectionNamespace`, `LeaseDuration`, `RenewDeadline`, `RetryPeriod`).
///
/// Timings (Go defaults): a holder keeps the lease for the
/// [lease duration](Self::lease_duration()) (15 s) after its last renewal as observed by
/// the others; the holder gives up when it could not renew for the
/// [renew deadline](Self::renew_deadline()) (10 s); attempts to acquire or renew are one
/// [retry period](Self::retry_period()) (2 s) apart.
///
/// Each option is a public field and a builder method of the same name. Setting never
/// fails; [`validate`](Self::validate) checks the combination, and
/// [`Config::validate`](crate::Config::validate) calls it. [`Default`] leaves the lease
/// name and the identity empty: the controller names the Lease after its provisioner
/// ([`lease_name_for`](Self::lease_name_for)) and picks a
/// [`default_identity`](Self::default_identity); the namespace left empty is the client's
/// (the service account's in a pod).
///
/// ```
/// use std::time::Duration;
/// use provision_controller::{Config, LeaderElection};
///
/// let election = LeaderElection::for_provisioner("example.com/nfs", "storage")?
///     .timings(Duration::from_secs(30), Duration::from_secs(20), Duration::from_secs(4))?;
/// assert_eq!(election.lease_name, "example.com-nfs");
/// let config = Config::default().leader_election(Some(election));
/// # Ok::<(), provision_controller::ConfigError>(())
/// ```
#[doc(alias = "LeaderElectionConfig")]
#[doc(alias = "LeaderElectionNamespace")]
#[doc(alias = "LeaseDuration")]
#[doc(alias = "RenewDeadline")]
#[doc(alias = "RetryPeriod")]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderElection {
    /// The Lease name. Empty (in [`Default`]) means: named after the provisioner
    /// ([`lease_name_for`](Self::lease_name_for)).
    pub lease_name: String,
    /// The Lease namespace (Go `LeaderElectionNamespace`). Empty (in [`Default`]) means:
    /// the client's (`kube_client::Client::default_namespace`: the service account's in a
    /// pod, the kubeconfig context's outside one).
    pub namespace: String,
    /// The identity written to `holderIdentity`. Empty (in [`Default`]) means: a
    /// [`default_identity`](Self::default_identity).
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
    /// The Go timings, and an empty namespace (the client's), lease name (the
    /// provisioner's) and identity (a [`default_identity`](Self::default_identity)).
    fn default() -> Self {
        Self::from_kit(kit::LeaderElection::default())
    }
}

impl LeaderElection {
    /// Default for [`lease_duration`](Self::lease_duration()) (Go: `DefaultLeaseDuration`).
    pub const DEFAULT_LEASE_DURATION: Duration = kit::LeaderElection::DEFAULT_LEASE_DURATION;
    /// Default for [`renew_deadline`](Self::renew_deadline()) (Go: `DefaultRenewDeadline`).
    pub const DEFAULT_RENEW_DEADLINE: Duration = kit::LeaderElection::DEFAULT_RENEW_DEADLINE;
    /// Default for [`retry_period`](Self::retry_period()) (Go: `DefaultRetryPeriod`).
    pub const DEFAULT_RETRY_PERIOD: Duration = kit::LeaderElection::DEFAULT_RETRY_PERIOD;

    /// Elects on the Lease `namespace/lease_name` with the default timings and a
    /// [`default_identity`](Self::default_identity). An empty `namespace` is the client's.
    ///
    /// # Errors
    /// [`ConfigError`] naming [`ConfigOption::LeaseName`] when the name is empty.
    pub fn new(
        lease_name: impl Into<String>,
        namespace: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        kit::LeaderElection::new(lease_name, namespace)
            .map(Self::from_kit)
            .map_err(ConfigError::from_election)
    }

    /// Elects on the Lease named after the provisioner, with every `/` replaced by `-`
    /// (as the Go library names its lock), e.g. `example.com/nfs` → `example.com-nfs`.
    ///
    /// # Errors
    /// [`ConfigError`] naming [`ConfigOption::LeaseName`] when the name is empty.
    pub fn for_provisioner(
        provisioner_name: &str,
        namespace: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        Self::new(Self::lease_name_for(provisioner_name), namespace)
    }

    /// With explicit timings, validated at once.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first option that does not fit (see
    /// [`validate`](Self::validate)).
    pub fn timings(
        self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, ConfigError> {
        let election = self
            .lease_duration(lease_duration)
            .renew_deadline(renew_deadline)
            .retry_period(retry_period);
        election.validate()?;
        Ok(election)
    }

    /// The Lease name the Go provisioner library uses for a provisioner: `/` replaced by `-`.
    #[must_use]
    pub fn lease_name_for(provisioner_name: &str) -> String {
        kit::LeaderElection::lease_name_for(provisioner_name)
    }

    /// `<hostname>_<16 random hex digits>`: unique per process, so a restarted pod never
    /// mistakes its predecessor's lease for its own (Go uses hostname + `_` + a UUID).
    #[must_use]
    pub fn default_identity() -> String {
        kit::LeaderElection::default_identity()
    }

    /// The Lease name.
    #[must_use]
    pub fn lease_name(mut self, name: impl Into<String>) -> Self {
        self.lease_name = name.into();
        self
    }

    /// The Lease namespace (Go `LeaderElectionNamespace`). A binary passes `POD_NAMESPACE`
    /// here when it is set ([`Config::from_lookup`](crate::Config::from_lookup) does).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The identity written to `holderIdentity`.
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// How long a lease stays valid after its last renewal (Go `LeaseDuration`), written
    /// to `leaseDurationSeconds` rounded up to whole seconds.
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// How long the leader keeps trying to renew before it gives up (Go `RenewDeadline`).
    #[must_use]
    pub fn renew_deadline(mut self, duration: Duration) -> Self {
        self.renew_deadline = duration;
        self
    }

    /// The pause between attempts to acquire or renew (Go `RetryPeriod`).
    #[must_use]
    pub fn retry_period(mut self, duration: Duration) -> Self {
        self.retry_period = duration;
        self
    }

    /// Fills what is left empty: the lease name from `provisioner_name` and the identity
    /// with a [`default_identity`](Self::default_identity).
    #[must_use]
    pub fn resolved_for(self, provisioner_name: &str) -> Self {
        Self::from_kit(self.to_kit().resolved_for(provisioner_name))
    }

    /// Checks the settings the way client-go does.
    ///
    /// # Errors
    /// [`ConfigError`] naming the option when `lease_name` or `identity` is empty, when
    /// `namespace` has surrounding whitespace, when `lease_duration` is under one second,
    /// when `renew_deadline` is not below `lease_duration`, when `retry_period` is zero, or
    /// when `renew_deadline` is not above 1.2 retry periods (client-go's jitter).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.to_kit().validate().map_err(ConfigError::from_election)
    }

    /// The elector's form of the same settings.
    pub(crate) fn to_kit(&self) -> kit::LeaderElection {
        kit::LeaderElection::default()
            .lease_name(self.lease_name.clone())
            .namespace(self.namespace.clone())
            .identity(self.identity.clone())
            .lease_duration(self.lease_duration)
            .renew_deadline(self.renew_deadline)
            .retry_period(self.retry_period)
    }

    fn from_kit(election: kit::LeaderElection) -> Self {
        Self {
            lease_name: election.lease_name,
            namespace: election.namespace,
            identity: election.identity,
            lease_duration: election.lease_duration,
            renew_deadline: election.renew_deadline,
            retry_period: election.retry_period,
        }
    }
}

impl ConfigError {
    /// The kit's complaint about a leader-election setting, as this crate names the option.
    pub(crate) fn from_election(error: kit::InvalidLeaderElection) -> Self {
        let option = match error.option {
            kit::LeaderElectionOption::LeaseName => ConfigOption::LeaseName,
            kit::LeaderElectionOption::Namespace => ConfigOption::LeaseNamespace,
            kit::LeaderElectionOption::Identity => ConfigOption::LeaseIdentity,
            kit::LeaderElectionOption::LeaseDuration => ConfigOption::LeaseDuration,
            kit::LeaderElectionOption::RenewDeadline => ConfigOption::RenewDeadline,
            kit::LeaderElectionOption::RetryPeriod => ConfigOption::RetryPeriod,
            _ => ConfigOption::LeaderElection,
        };
        Self::invalid(option, error.reason)
    }
}
