//! Error types: what a [`Provisioner`](crate::Provisioner) returns, and why `run` failed.

/// A boxed error from a driver, as `tower::BoxError`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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

/// An invalid [`Config`](crate::Config) value, naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// One option has a value it cannot take.
    #[error("invalid value for option {option}: {reason}")]
    Invalid {
        /// The option, as its `Config` setter is named.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(option: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            option,
            reason: reason.into(),
        }
    }
}

/// Why [`ProvisionController::run`](crate::ProvisionController::run) failed.
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
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
    /// This replica lost the leader lease (another replica took it over, or renewing
    /// failed for the renew deadline). The workers were stopped; the caller may restart
    /// the controller to stand by again, or exit so the pod restarts.
    #[error(transparent)]
    LeadershipLost(#[from] crate::leader::LeadershipLost),
    /// Leader election could not start (its client or configuration).
    #[error("leader election failed")]
    LeaderElection(#[source] crate::leader::LeaderError),
    /// The metrics and probe server could not start.
    #[error("metrics and probe server failed")]
    Http(#[from] crate::http::HttpError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
