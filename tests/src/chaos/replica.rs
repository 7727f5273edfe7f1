//! One replica of the vSphere application: its own OS thread and Tokio runtime, its own
//! kube client (through a [`Partition`] layer) and CNS session, running
//! [`vsphere_controllers::start_controllers`].
//!
//! A death drops the runtime mid-call ([`Runtime::shutdown_background`]): no task gets to
//! clean up, a CNS call in flight may still land in the simulator. A graceful stop lets
//! `run_until` drain. A replica whose controllers fail (a lost lease) exits, and the
//! harness restarts it, as a kubelet would.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use kube_client::client::ClientBuilder;
use provision_controller::Health;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;
use vsphere_cns::{
    ClusterFlavor, CnsClient, CnsMetadataBackend, CnsProvisioner, MoRef, VirtualCenterConfig,
};
use vsphere_controllers::Settings;

use super::names;
use super::partition::Partition;

/// What every replica is built from.
#[derive(Clone, Debug)]
pub struct ReplicaSpec {
    /// The kube-sim connection.
    pub kube: kube_client::Config,
    /// The CNS simulator connection.
    pub vc: VirtualCenterConfig,
    /// The controllers' settings.
    pub settings: Settings,
    /// The seed of the run, in thread names (`replica-s<seed>-<index>.<start>`).
    pub seed: u64,
}

/// How long a graceful stop may take before the replica is killed (as a kubelet's
/// SIGKILL after the grace period).
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a replica that exited on its own stays down before it is restarted.
const RESTART_DELAY: Duration = Duration::from_millis(300);

enum State {
    /// Not running; with `restart_at`, the harness brings it back then.
    Down { restart_at: Option<Instant> },
    /// Running (or stopping, with `stopping` set; `then_start` when a start came
    /// meanwhile).
    Up {
        runtime: Runtime,
        stop: Option<oneshot::Sender<()>>,
        exit: oneshot::Receiver<anyhow::Result<()>>,
        stopping: Option<Instant>,
        then_start: bool,
        /// The controllers' health, once they started.
        health: Arc<OnceLock<Health>>,
        /// Whether it was seen leading since it last stopped leading.
        led: bool,
    },
}

/// One replica.
pub struct Replica {
    index: usize,
    spec: Arc<ReplicaSpec>,
    partition: Partition,
    state: State,
    starts: u32,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("index", &self.index)
            .field("up", &self.is_up())
            .field("partitioned", &self.partition.is_cut())
            .finish_non_exhaustive()
    }
}

impl Replica {
    /// A replica that is down.
    #[must_use]
    pub fn new(index: usize, spec: Arc<ReplicaSpec>) -> Self {
        Self {
            index,
            spec,
            partition: Partition::default(),
            state: State::Down { restart_at: None },
            starts: 0,
        }
    }

    /// Whether its runtime exists (running or stopping).
    #[must_use]
    pub fn is_up(&self) -> bool {
        matches!(self.state, State::Up { .. })
    }

    /// Its partition switch.
    #[must_use]
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Starts it on a new runtime; nothing if it is up; once stopped if it is stopping.
    ///
    /// # Errors
    /// When the runtime cannot be built.
    pub fn start(&mut self) -> anyhow::Result<()> {
        match &mut self.state {
            State::Up {
                stopping: Some(_),
                then_start,
                ..
            } => {
                *then_start = true;
                return Ok(());
            }
            State::Up { .. } => return Ok(()),
            State::Down { .. } => {}
        }
        self.starts += 1;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!(
                "replica-s{}-{}.{}",
                self.spec.seed, self.index, self.starts
            ))
            .enable_all()
            .build()
            .context("cannot build a replica runtime")?;
        let (stop, stopped) = oneshot::channel();
        let (exited, exit) = oneshot::channel();
        let spec = self.spec.clone();
        let partition = self.partition.clone();
        let health = Arc::new(OnceLock::new());
        let slot = Arc::clone(&health);
        let span = tracing::info_span!("replica", n = self.index, start = self.starts);
        runtime.spawn(
            async move {
                let result = run(spec, partition, stopped, slot).await;
                let _ = exited.send(result);
            }
            .instrument(span),
        );
        self.state = State::Up {
            runtime,
            stop: Some(stop),
            exit,
            stopping: None,
            then_start: false,
            health,
            led: false,
        };
        Ok(())
    }

    /// Kills it: the runtime is dropped with every task in the middle of what it was
    /// doing. Returns whether it was up.
    pub fn kill(&mut self) -> bool {
        let state = std::mem::replace(&mut self.state, State::Down { restart_at: None });
        match state {
            State::Up { runtime, .. } => {
                runtime.shutdown_background();
                true
            }
            down @ State::Down { .. } => {
                self.state = down;
                false
            }
        }
    }

    /// Asks it to stop gracefully; [`Replica::poll`] sees it exit.
    pub fn stop(&mut self) {
        if let State::Up { stop, stopping, .. } = &mut self.state {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
            stopping.get_or_insert_with(Instant::now);
        }
    }

    /// Notices an exit: a stop that finished (down, no restart), a stop that takes too
    /// long (killed), or controllers that failed (down, restarted after a pause). Starts
    /// a replica whose restart is due. Returns a line for the log when something happened.
    ///
    /// # Errors
    /// When a restart cannot build its runtime.
    pub fn poll(&mut self, now: Instant) -> anyhow::Result<Option<String>> {
        let index = self.index;
        // Losing the lease ends its workers at once (their memory goes with them), before
        // the process exits: that moment is the disruption.
        if let State::Up { health, led, .. } = &mut self.state
            && let Some(health) = health.get()
        {
            if health.is_leading() {
                *led = true;
            } else if *led {
                *led = false;
                return Ok(Some(format!(
                    "replica {index} stopped leading ({:?})",
                    health.readiness()
                )));
            }
        }
        match &mut self.state {
            State::Down {
                restart_at: Some(at),
            } if *at <= now => {
                self.start()?;
                Ok(Some(format!("replica {index} restarted after it exited")))
            }
            State::Down { .. } => Ok(None),
            State::Up {
                exit,
                stopping,
                then_start,
                ..
            } => match exit.try_recv() {
                Ok(result) => {
                    let graceful = stopping.is_some();
                    let restart = !graceful || *then_start;
                    let line = match (&result, graceful) {
                        (Ok(()), true) => format!("replica {index} stopped"),
                        (Err(e), true) => {
                            format!("replica {index} stopped with an error: {e:#}")
                        }
                        (Ok(()), false) => format!("replica {index} exited"),
                        (Err(e), false) => format!("replica {index} exited: {e:#}"),
                    };
                    self.kill();
                    if restart {
                        self.state = State::Down {
                            restart_at: Some(now + RESTART_DELAY),
                        };
                    }
                    Ok(Some(line))
                }
                Err(oneshot::error::TryRecvError::Empty) => match stopping {
                    Some(since) if now.duration_since(*since) > STOP_GRACE => {
                        let restart = *then_start;
                        self.kill();
                        if restart {
                            self.state = State::Down {
                                restart_at: Some(now + RESTART_DELAY),
                            };
                        }
                        Ok(Some(format!(
                            "replica {index} did not stop within {STOP_GRACE:?}: killed"
                        )))
                    }
                    _ => Ok(None),
                },
                Err(oneshot::error::TryRecvError::Closed) => {
                    self.kill();
                    self.state = State::Down {
                        restart_at: Some(now + RESTART_DELAY),
                    };
                    Ok(Some(format!("replica {index} vanished (task panicked?)")))
                }
            },
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The replica's process: connect, start the controllers, run until stopped or failed.
async fn run(
    spec: Arc<ReplicaSpec>,
    partition: Partition,
    stopped: oneshot::Receiver<()>,
    health: Arc<OnceLock<Health>>,
) -> anyhow::Result<()> {
    let kube = ClientBuilder::try_from(spec.kube.clone())
        .context("cannot build the kube client")?
        .with_layer(&partition.layer())
        .build();
    let cns = CnsClient::connect(&spec.vc)
        .await
        .context("cannot log in to the CNS simulator")?;
    let provisioner = CnsProvisioner::new(cns.clone(), names::CLUSTER_ID, ClusterFlavor::Workload)
        .context("cannot build the provisioner")?
        .datastore_url(names::DATASTORE_URL, MoRef::datastore(names::DATASTORE_ID));
    let backend = CnsMetadataBackend::new(cns);
    let running =
        vsphere_controllers::start_controllers(kube, provisioner, backend, &spec.settings);
    let _ = health.set(running.health().clone());
    running
        .run_until(async {
            let _ = stopped.await;
        })
        .await
}
