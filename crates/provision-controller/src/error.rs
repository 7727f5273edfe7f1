//! Error types: what a [`Provisioner`](crate::Provisioner) returns, and why `run` failed.

/// A boxed error: a driver's, or a cause from a crate below this one (as `tower::BoxError`).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why [`Provisioner::provision`](crate::Provisioner::provision) did not return a volume.
///
/// Each variant is one Go `ProvisioningState` (or Go's `IgnoredError`), so the driver
/// cannot return an error without saying what happened in the backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[doc(alias = "ProvisioningState")]
pub enum ProvisionError {
    /// Work may still be running in the backend; the controller calls `provision` again
    /// with the same options, even after the claim is deleted, until it gets a volume or
    /// a final answer (Go: `ProvisioningInBackground`).
    #[doc(alias = "ProvisioningInBackground")]
    #[error("provisioning continues in the background")]
    InBackground(#[source] BoxError),
    /// This attempt failed and nothing of it is running in the backend (no asset exists
    /// for it); the claim is provisioned again after the failure backoff (Go:
    /// `ProvisioningFinished` with an error: the operation finished, unsuccessfully).
    ///
    /// Not final: the controller keeps retrying until
    /// [`Config::failed_provision_threshold`](crate::Config::failed_provision_threshold)
    /// attempts have failed, then waits for the claim's next change or resync.
    #[doc(alias = "ProvisioningFinished")]
    #[error("provisioning failed")]
    Failed(#[source] BoxError),
    /// The call changed nothing: the claim keeps whatever state an earlier call left
    /// (in background or not) and is retried (Go: `ProvisioningNoChange`).
    #[doc(alias = "ProvisioningNoChange")]
    #[error("provisioning made no progress")]
    NoChange(#[source] BoxError),
    /// The selected node cannot host the volume: the controller removes the claim's
    /// `volume.kubernetes.io/selected-node` annotation so the scheduler picks again
    /// (Go: `ProvisioningReschedule`). Without a selected node it acts as [`Self::Failed`].
    #[doc(alias = "ProvisioningReschedule")]
    #[error("provisioning must be rescheduled to another node")]
    Reschedule(#[source] BoxError),
    /// This driver leaves the claim to another provisioner; no event, no retry
    /// (Go: `IgnoredError`).
    #[doc(alias = "IgnoredError")]
    #[error("provisioning ignored: {reason}")]
    Ignored {
        /// Why the claim was ignored (logged).
        reason: String,
    },
    /// The request cannot succeed as asked (bad parameters, a size the backend refuses):
    /// nothing is running in the backend, and asking again soon would fail the same way
    /// (Go: a CSI `InvalidArgument` answer, which Go calls infeasible).
    ///
    /// The claim gets the `ProvisioningFailed` event "Volume provisioning failed with
    /// infeasible error. Retries will be delayed. ..." and is not provisioned again for
    /// [`Config::infeasible_retry_delay`](crate::Config::infeasible_retry_delay)
    /// (5 minutes), unless its class is re-created meanwhile.
    #[error("provisioning request is infeasible")]
    Infeasible(#[source] BoxError),
}

impl ProvisionError {
    /// Wraps `err` as [`ProvisionError::Failed`].
    #[must_use]
    pub fn failed(err: impl Into<BoxError>) -> Self {
        Self::Failed(err.into())
    }
    /// Wraps `err` as [`ProvisionError::InBackground`].
    #[must_use]
    pub fn in_background(err: impl Into<BoxError>) -> Self {
        Self::InBackground(err.into())
    }
    /// Wraps `err` as [`ProvisionError::Infeasible`].
    #[must_use]
    pub fn infeasible(err: impl Into<BoxError>) -> Self {
        Self::Infeasible(err.into())
    }
}

/// Why [`Provisioner::delete`](crate::Provisioner::delete) did not delete the asset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeleteError {
    /// This driver leaves the volume to another provisioner; no event, no retry
    /// (Go: `IgnoredError`).
    #[doc(alias = "IgnoredError")]
    #[error("deletion ignored: {reason}")]
    Ignored {
        /// Why the volume was ignored (logged).
        reason: String,
    },
    /// Deleting failed; the controller emits `VolumeFailedDelete` and retries with backoff.
    #[error("deleting the volume failed")]
    Failed(#[source] BoxError),
}

/// An option of [`Config`](crate::Config), as a [`ConfigError`] names it.
///
/// Displays as the Rust name (the `Config` field and builder method), followed by the Go
/// option of `sig-storage-lib-external-provisioner` where there is one:
/// `resync_period (Go ResyncPeriod)`, `leader_election.renew_deadline (Go RenewDeadline)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigOption {
    /// [`Config::resync_period`](crate::Config::resync_period()).
    ResyncPeriod,
    /// [`Config::threads`](crate::Config::threads()).
    Threads,
    /// [`Config::sync_workers`](crate::Config::sync_workers()).
    SyncWorkers,
    /// [`Config::failure_backoff`](crate::Config::failure_backoff()).
    FailureBackoff,
    /// [`Config::failed_provision_threshold`](crate::Config::failed_provision_threshold()).
    FailedProvisionThreshold,
    /// [`Config::failed_delete_threshold`](crate::Config::failed_delete_threshold()).
    FailedDeleteThreshold,
    /// [`Config::pv_save`](crate::Config::pv_save()).
    PvSave,
    /// [`Config::leader_election`](crate::Config::leader_election()) as a whole.
    LeaderElection,
    /// [`LeaderElection::lease_name`](crate::LeaderElection::lease_name()).
    LeaseName,
    /// [`LeaderElection::namespace`](crate::LeaderElection::namespace()) (Go
    /// `LeaderElectionNamespace`).
    LeaseNamespace,
    /// [`LeaderElection::identity`](crate::LeaderElection::identity()).
    LeaseIdentity,
    /// [`LeaderElection::lease_duration`](crate::LeaderElection::lease_duration()).
    LeaseDuration,
    /// [`LeaderElection::renew_deadline`](crate::LeaderElection::renew_deadline()).
    RenewDeadline,
    /// [`LeaderElection::retry_period`](crate::LeaderElection::retry_period()).
    RetryPeriod,
    /// [`Config::additional_provisioner_names`](crate::Config::additional_provisioner_names()).
    AdditionalProvisionerNames,
    /// [`Config::add_finalizer`](crate::Config::add_finalizer()).
    AddFinalizer,
    /// [`Config::provision_timeout`](crate::Config::provision_timeout()).
    ProvisionTimeout,
    /// [`Config::deletion_timeout`](crate::Config::deletion_timeout()).
    DeletionTimeout,
    /// [`Config::volume_namer`](crate::Config::volume_namer()).
    VolumeNamer,
    /// [`Config::metrics_address`](crate::Config::metrics_address()).
    MetricsAddress,
    /// [`Config::metrics_port`](crate::Config::metrics_port()).
    MetricsPort,
    /// [`Config::metrics_path`](crate::Config::metrics_path()).
    MetricsPath,
    /// [`Config::shutdown_grace`](crate::Config::shutdown_grace()).
    ShutdownGrace,
    /// [`Config::crash_safe_provisioning`](crate::Config::crash_safe_provisioning()).
    CrashSafeProvisioning,
    /// [`Config::infeasible_retry_delay`](crate::Config::infeasible_retry_delay()).
    InfeasibleRetryDelay,
}

impl ConfigOption {
    /// The `Config` field and builder method, e.g. `"resync_period"`; an option of the
    /// leader election as `"leader_election.renew_deadline"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::ResyncPeriod => "resync_period",
            Self::Threads => "threads",
            Self::SyncWorkers => "sync_workers",
            Self::FailureBackoff => "failure_backoff",
            Self::FailedProvisionThreshold => "failed_provision_threshold",
            Self::FailedDeleteThreshold => "failed_delete_threshold",
            Self::PvSave => "pv_save",
            Self::LeaderElection => "leader_election",
            Self::LeaseName => "leader_election.lease_name",
            Self::LeaseNamespace => "leader_election.namespace",
            Self::LeaseIdentity => "leader_election.identity",
            Self::LeaseDuration => "leader_election.lease_duration",
            Self::RenewDeadline => "leader_election.renew_deadline",
            Self::RetryPeriod => "leader_election.retry_period",
            Self::AdditionalProvisionerNames => "additional_provisioner_names",
            Self::AddFinalizer => "add_finalizer",
            Self::ProvisionTimeout => "provision_timeout",
            Self::DeletionTimeout => "deletion_timeout",
            Self::VolumeNamer => "volume_namer",
            Self::MetricsAddress => "metrics_address",
            Self::MetricsPort => "metrics_port",
            Self::MetricsPath => "metrics_path",
            Self::ShutdownGrace => "shutdown_grace",
            Self::CrashSafeProvisioning => "crash_safe_provisioning",
            Self::InfeasibleRetryDelay => "infeasible_retry_delay",
        }
    }

    /// The Go option a user of the Go provisioner library knows, e.g. `"ResyncPeriod"`;
    /// `None` for an option Go does not have.
    #[must_use]
    pub fn go_name(self) -> Option<&'static str> {
        match self {
            Self::ResyncPeriod => Some("ResyncPeriod"),
            Self::Threads => Some("Threadiness"),
            Self::SyncWorkers => None,
            Self::FailureBackoff => Some("ExponentialBackOffOnError"),
            Self::FailedProvisionThreshold => Some("FailedProvisionThreshold"),
            Self::FailedDeleteThreshold => Some("FailedDeleteThreshold"),
            Self::PvSave => Some("CreateProvisionedPVBackoff"),
            Self::LeaderElection => Some("LeaderElection"),
            Self::LeaseName => None,
            Self::LeaseNamespace => Some("LeaderElectionNamespace"),
            Self::LeaseIdentity => Some("Identity"),
            Self::LeaseDuration => Some("LeaseDuration"),
            Self::RenewDeadline => Some("RenewDeadline"),
            Self::RetryPeriod => Some("RetryPeriod"),
            Self::AdditionalProvisionerNames => Some("AdditionalProvisionerNames"),
            Self::AddFinalizer => Some("AddFinalizer"),
            Self::ProvisionTimeout => Some("ProvisionTimeout"),
            Self::DeletionTimeout => Some("DeletionTimeout"),
            Self::VolumeNamer => None,
            Self::MetricsAddress => Some("MetricsAddress"),
            Self::MetricsPort => Some("MetricsPort"),
            Self::MetricsPath => Some("MetricsPath"),
            Self::ShutdownGrace | Self::CrashSafeProvisioning => None,
            Self::InfeasibleRetryDelay => Some("RetryIntervalMax"),
        }
    }
}

impl std::fmt::Display for ConfigOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        kube_controller_kit::write_option_name(f, self.name(), self.go_name())
    }
}

/// An invalid [`Config`](crate::Config) value, naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// One option has a value it cannot take.
    #[error("invalid value for option {option}: {reason}")]
    Invalid {
        /// The option.
        option: ConfigOption,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(option: ConfigOption, reason: impl Into<String>) -> Self {
        Self::Invalid {
            option,
            reason: reason.into(),
        }
    }

    /// The option the error is about.
    #[must_use]
    pub fn option(&self) -> ConfigOption {
        match self {
            Self::Invalid { option, .. } => *option,
        }
    }
}

/// Why the controller could not run: [`ProvisionController::run`](crate::ProvisionController::run)'s
/// errors, and those of the [`client`](crate::client) functions a binary calls before it.
///
/// The causes below the configuration are boxed: they come from the crates the controller
/// is built on, whose types are not part of this crate's API. Print the whole chain with
/// [`error_chain`](crate::error_chain).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid.
    #[error("invalid provision controller configuration")]
    Config(#[from] ConfigError),
    /// A worker task of the controller panicked or was cancelled.
    #[error("provision controller task {task} ended abnormally")]
    Task {
        /// Which task ("claim worker", "volume worker", ...).
        task: &'static str,
        /// Why it ended (a panic's message, or the cancellation).
        #[source]
        source: BoxError,
    },
    /// This replica lost the leader lease (another replica took it over, or renewing
    /// failed for the renew deadline); the error names the Lease and why. The workers were
    /// stopped; the caller may restart the controller to stand by again, or exit so the
    /// pod restarts.
    #[error(transparent)]
    LeadershipLost(BoxError),
    /// Leader election could not start (its client or configuration).
    #[error("leader election failed")]
    LeaderElection(#[source] BoxError),
    /// The metrics and probe server could not start.
    #[error("metrics and probe server failed")]
    Http(#[source] BoxError),
    /// The Kubernetes client could not be built, or the API server did not answer
    /// [`client::check`](crate::client::check): no configuration found, TLS material or
    /// credentials unusable, the server unreachable or refusing them (the text says which).
    #[error(transparent)]
    Client(BoxError),
}

impl Error {
    pub(crate) fn task(task: &'static str, source: tokio::task::JoinError) -> Self {
        Self::Task {
            task,
            source: source.into(),
        }
    }

    pub(crate) fn leadership_lost(lost: kube_controller_kit::leader::LeadershipLost) -> Self {
        Self::LeadershipLost(lost.into())
    }

    pub(crate) fn leader_election(error: kube_controller_kit::leader::LeaderError) -> Self {
        Self::LeaderElection(error.into())
    }

    pub(crate) fn http(error: kube_controller_kit::http::HttpError) -> Self {
        Self::Http(error.into())
    }
}

/// `Result` with this crate's [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
