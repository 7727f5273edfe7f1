//! Leader election on a `coordination.k8s.io/v1` Lease, with the semantics of client-go's
//! `tools/leaderelection`, minus its habit of exiting the process.
//!
//! A replica builds a [`LeaderElector`], waits in [`acquire`](LeaderElector::acquire) until
//! it holds the lease, does its work while a task owned by the elector renews the lease,
//! stops working when [`lost`](LeaderElector::lost) resolves, and on a graceful shutdown
//! calls [`release`](LeaderElector::release) so a standby takes over at its next attempt
//! instead of waiting out the lease.
//!
//! # Several controllers, one election
//! An application that runs several controllers (a provisioner and a reconciler, say)
//! elects once, on one Lease, and every controller follows that election through a
//! [`Leading`]:
//! - the controller that runs the elector hands out [`LeaderElector::leading`] (or, when
//!   it reports its role to a [`Health`](crate::http::Health) handle, as
//!   `provision-controller` does, [`Health::leading`](crate::http::Health::leading));
//! - every other controller takes the `Leading` and works only while it leads
//!   (`cnsmetadata::MetadataController::leading` does: its caches stay warm on a standby, and each
//!   term starts from a fresh list);
//! - losing the lease ends the elector's controller with an error; the application stops
//!   the others then, and the process restarts as a standby.
//!
//! ```no_run
//! use kube_controller_kit::{http::Health, leader::Leading};
//! # async fn follower(leading: Leading) {}
//! # async fn doc() {
//! let health = Health::new();
//! // `health` goes to the controller that elects (it sets the role from its elector) ...
//! let leading: Leading = health.leading();
//! // ... and `leading` to each controller that follows.
//! tokio::spawn(follower(leading));
//! # }
//! ```
//!
//! # Renewals do not queue behind worker traffic
//! Every clone of a `kube_client::Client` shares one tower `Buffer` (its worker polls the
//! inner service one request at a time) and one hyper connection pool; over HTTP/2 that
//! is a single connection whose stream limit and flow control all requests share, and the
//! client's built-in retries back off inside the call. A burst of provisioning requests,
//! slow LISTs or a throttling API server can therefore hold a renewal back past the renew
//! deadline. Give the elector a client of its own, built from the same
//! `kube_client::Config` with [`for_leader_election`](crate::client::for_leader_election): its own buffer, pool and connection,
//! and no built-in retries (the elector retries on its own schedule and bounds every
//! attempt by the renew deadline). [`LeaderElector::new`] accepts any client so tests can
//! share one, but production callers should pass a dedicated one.
//!
//! # Clocks
//! Expiry is judged on this process's monotonic clock ([`tokio::time::Instant`]): a
//! candidate takes a lease over only when the record has not changed for the
//! `leaseDurationSeconds` the record itself declares, counted from when the candidate
//! first saw that record. The wall-clock `acquireTime`/`renewTime` fields are written for
//! humans and never compared.
//!
//! # Example
//! ```no_run
//! use kube_controller_kit::client::for_leader_election;
//! use kube_controller_kit::leader::{LeaderElection, LeaderElector};
//! use tokio_util::sync::CancellationToken;
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! # let config: kube_client::Config = todo!();
//! let shutdown = CancellationToken::new();
//! let cfg = LeaderElection::for_provisioner("example.com/nfs", "kube-system")?;
//! let mut elector = LeaderElector::new(for_leader_election(&config)?, cfg)?;
//!
//! elector.acquire(shutdown.clone().cancelled_owned()).await?; // Err(Cancelled) on shutdown
//! tokio::select! {
//!     lost = elector.lost() => return Err(lost.into()),        // stop the workers, then fail
//!     () = shutdown.cancelled() => {}                          // drain the workers, then:
//! }
//! elector.release().await?;
//! # Ok(())
//! # }
//! ```

mod config;
mod elector;
mod forbidden;
mod leading;
mod lease;
mod missing;
mod record;

pub use config::{InvalidLeaderElection, LeaderElection, LeaderElectionOption};
pub use elector::LeaderElector;
pub use leading::Leading;

/// Where an elector stands. Published through [`LeaderElector::subscribe`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderState {
    /// Not leading (yet): waiting in [`LeaderElector::acquire`] or not started.
    Standby {
        /// The holder this replica last saw in the Lease, if any.
        holder: Option<String>,
    },
    /// This replica holds the lease and renews it.
    Leading,
    /// This replica held the lease and does not any more; it must stop working.
    Lost(LossReason),
    /// This replica gave the lease up with [`LeaderElector::release`].
    Released,
}

impl LeaderState {
    /// Whether this is [`LeaderState::Leading`].
    #[must_use]
    pub fn is_leading(&self) -> bool {
        matches!(self, Self::Leading)
    }
}

/// Why leadership ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// No renewal succeeded within the renew deadline.
    RenewDeadlineExceeded,
    /// The Lease now names another holder (or none).
    TakenOver {
        /// The holder named by the Lease, if any.
        holder: Option<String>,
    },
    /// The Lease object was deleted.
    Deleted,
    /// This replica released the lease itself.
    Released,
    /// This replica was not leading when asked.
    NotLeading,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RenewDeadlineExceeded => {
                f.write_str("no renewal succeeded within the renew deadline")
            }
            Self::TakenOver { holder: Some(h) } => write!(f, "the lease is now held by {h}"),
            Self::TakenOver { holder: None } => f.write_str("the lease no longer names a holder"),
            Self::Deleted => f.write_str("the lease was deleted"),
            Self::Released => f.write_str("the lease was released"),
            Self::NotLeading => f.write_str("this replica was not leading"),
        }
    }
}

/// Leadership has ended; returned by [`LeaderElector::lost`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lost leadership of lease {lease}: {reason}")]
#[non_exhaustive]
pub struct LeadershipLost {
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// Why.
    pub reason: LossReason,
}

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderError {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] InvalidLeaderElection),
    /// The shutdown future completed before the lease was acquired.
    #[error("stopped waiting for lease {lease}: shutdown requested")]
    Cancelled {
        /// `namespace/name` of the Lease.
        lease: String,
    },
    /// The API server refused or failed the release write.
    #[error("failed to release lease {lease}")]
    Release {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The API error.
        #[source]
        source: kube_client::Error,
    },
    /// The release write did not finish within the renew deadline.
    #[error("timed out releasing lease {lease} after {timeout:?}")]
    ReleaseTimeout {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The renew deadline that bounded the release.
        timeout: std::time::Duration,
    },
}
