//! The Lease I/O of an elector: one try-acquire-or-renew, and the release write.

use std::sync::Mutex;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::Api;
use kube_client::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info};

use super::forbidden::RequestFailed;
use super::record::{self, Decision, Local, Mode, Observation};
use super::{LeaderElection, LeaderError, LeaderState};

/// What the elector and its renewal task share.
pub(super) struct Shared {
    pub(super) api: Api<Lease>,
    pub(super) cfg: LeaderElection,
    /// `namespace/name`, for logs and errors.
    pub(super) lease: String,
    pub(super) observation: Mutex<Observation>,
    pub(super) state: watch::Sender<LeaderState>,
}

/// The result of one attempt to acquire or renew.
pub(super) enum Outcome {
    /// We hold the lease now.
    Holding {
        spec: LeaseSpec,
        takes_over: bool,
        previous: Option<String>,
    },
    /// Somebody else holds a valid lease.
    HeldByOther { holder: String },
    /// (renewing) The record names somebody else or nobody.
    NotOurs { holder: Option<String> },
    /// (renewing) The Lease is gone.
    Missing,
}

impl Shared {
    /// The error for a shutdown that came before the lease.
    pub(super) fn cancelled(&self) -> LeaderError {
        LeaderError::Cancelled {
            lease: self.lease.clone(),
        }
    }

    /// Logs and publishes a holder seen while standing by.
    pub(super) fn note_holder(&self, holder: Option<String>) {
        self.state.send_if_modified(|state| match state {
            LeaderState::Standby { holder: seen } if *seen != holder => {
                info!(
                    lease = %self.lease,
                    holder = holder.as_deref().unwrap_or(""),
                    "observed new leader"
                );
                *seen = holder;
                true
            }
            _ => false,
        });
    }

    fn observe(&self, spec: &LeaseSpec, now: Instant) -> Instant {
        self.observation
            .lock()
            .expect("observation lock is never held across a panic")
            .observe(spec, now)
    }

    fn forget(&self) {
        self.observation
            .lock()
            .expect("observation lock is never held across a panic")
            .clear();
    }

    /// One try-acquire-or-renew: read, decide, write with the read resourceVersion. A
    /// conflict (409) or a create race (AlreadyExists) is re-read once at once.
    pub(super) async fn attempt(&self, mode: Mode) -> Result<Outcome, RequestFailed> {
        let name = self.cfg.lease_name.as_str();
        let mut races = 0;
        loop {
            let now = Instant::now();
            let now_wall = jiff::Timestamp::now();
            let read = self.api.get_opt(name).await;
            let Some(mut lease) = read.map_err(RequestFailed::of("get"))? else {
                self.forget();
                if mode == Mode::Renew {
                    return Ok(Outcome::Missing);
                }
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        namespace: Some(self.cfg.namespace.as_str().to_owned()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(record::initial(
                        self.cfg.identity.as_str(),
                        self.cfg.lease_duration_seconds(),
                        now_wall,
                    )),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        let spec = created.spec.unwrap_or_default();
                        self.observe(&spec, now);
                        return Ok(Outcome::Holding {
                            spec,
                            takes_over: true,
                            previous: None,
                        });
                    }
                    Err(kube_client::Error::Api(status))
                        if status.is_already_exists() && races == 0 =>
                    {
                        races += 1;
                        continue;
                    }
                    Err(error) => return Err(RequestFailed::of("create")(error)),
                }
            };
            let current = lease.spec.take().unwrap_or_default();
            let observed_at = self.observe(&current, now);
            let local = Local {
                identity: self.cfg.identity.as_str(),
                mode,
                observed_at,
                now,
                now_wall,
                lease_duration_seconds: self.cfg.lease_duration_seconds(),
                fallback_duration: self.cfg.lease_duration,
            };
            match record::decide(&current, local) {
                Decision::HeldByOther { holder, remaining } => {
                    debug!(lease = %self.lease, %holder, ?remaining, "lease held by another");
                    return Ok(Outcome::HeldByOther { holder });
                }
                Decision::NotOurs { holder } => return Ok(Outcome::NotOurs { holder }),
                Decision::Write { spec, takes_over } => {
                    lease.spec = Some(spec);
                    match self.api.replace(name, &PostParams::default(), &lease).await {
                        Ok(written) => {
                            let spec = written.spec.unwrap_or_default();
                            self.observe(&spec, now);
                            return Ok(Outcome::Holding {
                                spec,
                                takes_over,
                                previous: record::holder_of(&current).map(str::to_owned),
                            });
                        }
                        Err(kube_client::Error::Api(status))
                            if status.is_conflict() && races == 0 =>
                        {
                            races += 1;
                        }
                        Err(error) => return Err(RequestFailed::of("update")(error)),
                    }
                }
            }
        }
    }

    /// Writes the released record if the lease is still ours; `Ok(false)` when it is not.
    pub(super) async fn write_released(&self) -> Result<bool, kube_client::Error> {
        let name = self.cfg.lease_name.as_str();
        let mut races = 0;
        loop {
            let Some(mut lease) = self.api.get_opt(name).await? else {
                return Ok(false);
            };
            let current = lease.spec.take().unwrap_or_default();
            if record::holder_of(&current) != Some(self.cfg.identity.as_str()) {
                return Ok(false);
            }
            lease.spec = Some(record::released(&current, jiff::Timestamp::now()));
            match self.api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => return Ok(true),
                Err(kube_client::Error::Api(status)) if status.is_conflict() && races == 0 => {
                    races += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }
}
