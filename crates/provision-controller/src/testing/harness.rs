//! [`DriverTest`]: a driver's controller running against an in-process API server
//! (kube-sim with its PV binder), and the steps a test of a driver takes: provision a
//! claim and wait until it is bound, delete it and wait until its volume is gone.

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use futures::FutureExt;

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    events::v1::Event,
    storage::v1::StorageClass,
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use kube_sim::KubeSim;
use tokio::{sync::oneshot, task::JoinHandle, time::Instant};

use crate::{Config, ProvisionController, Provisioner, testing::class};

/// The StorageClass [`DriverTest::provision`] gives a claim that names none. It names the
/// driver's provisioner, binds `Immediate` and reclaims with `Delete`.
pub const TEST_CLASS: &str = "driver-test";

/// How long [`DriverTest`] waits for a claim to bind or a volume to go, unless
/// [`DriverTest::limit`] says otherwise.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(30);

/// Why a step of a [`DriverTest`] failed. The message says what was waited for and, for a
/// claim, the events the controller wrote about it (a driver's error is in them).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// kube-sim could not start.
    #[error("starting kube-sim failed")]
    Sim(#[source] kube_sim::Error),
    /// A call to the API server failed.
    #[error("{what} failed")]
    Api {
        /// The call, e.g. `create persistentvolumeclaim default/data`.
        what: String,
        /// The client's error.
        #[source]
        source: kube_client::Error,
    },
    /// The claim was not bound in time.
    #[error("claim {claim} was not bound within {limit:?}; its events: {events}")]
    NotBound {
        /// `namespace/name`.
        claim: String,
        /// The limit waited.
        limit: Duration,
        /// The claim's events (`type reason: note`, joined by `; `), or `none`.
        events: String,
    },
    /// The claim's volume was not deleted in time after the claim was.
    #[error(
        "volume {volume} of claim {claim} was not deleted within {limit:?}; the claim's events: {events}"
    )]
    NotDeleted {
        /// The PV's name.
        volume: String,
        /// `namespace/name`.
        claim: String,
        /// The limit waited.
        limit: Duration,
        /// The claim's events, or `none`.
        events: String,
    },
    /// The controller stopped with an error (or stopped before it was asked to).
    #[error("the controller failed")]
    Controller(#[source] crate::Error),
    /// The controller stopped by itself, without an error, before [`DriverTest::stop`].
    #[error("the controller stopped before it was asked to")]
    Stopped,
    /// The controller's task panicked.
    #[error("the controller's task panicked")]
    Panicked,
}

/// A driver under test: kube-sim (with its PV binder, so a claim whose PV is saved gets
/// bound as in a cluster) and a [`ProvisionController`] running the driver against it.
///
/// ```
/// use provision_controller::testing::{DriverTest, FakeProvisioner, pvc};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), provision_controller::testing::HarnessError> {
/// let test = DriverTest::start("example.com/fake", FakeProvisioner::new()).await?;
/// let volume = test.provision(pvc("data")).await?; // waits until the claim is bound
/// assert_eq!(volume.spec.unwrap().claim_ref.unwrap().name.as_deref(), Some("data"));
/// test.delete(&pvc("data").build()).await?; // waits until the volume is gone
/// test.stop().await?;
/// # Ok(()) }
/// ```
///
/// Dropping it without [`stop`](Self::stop) stops the controller (its shutdown future
/// completes) and kube-sim too, without waiting for them.
pub struct DriverTest {
    sim: KubeSim,
    name: String,
    limit: Duration,
    stop: Option<oneshot::Sender<()>>,
    controller: Mutex<Option<JoinHandle<crate::error::Result<()>>>>,
}

impl std::fmt::Debug for DriverTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverTest")
            .field("url", &self.sim.url())
            .field("provisioner", &self.name)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl DriverTest {
    /// Starts kube-sim and a controller for `provisioner_name` running `provisioner`, with
    /// the default [`Config`] except leader election (off: one replica).
    ///
    /// # Errors
    /// [`HarnessError::Sim`] when kube-sim cannot start.
    pub async fn start(
        provisioner_name: &str,
        provisioner: impl Provisioner,
    ) -> Result<Self, HarnessError> {
        let name = provisioner_name.to_owned();
        Self::start_controller(provisioner_name, move |client| {
            ProvisionController::new(client, name, provisioner)
                .config(Config::default().leader_election(None))
        })
        .await
    }

    /// Starts kube-sim and the controller `controller` builds on its client: for a test
    /// that sets a [`Config`], a qualifier or a deletion guard. `provisioner_name` is the
    /// name the controller was given (the [`TEST_CLASS`] names it).
    ///
    /// # Errors
    /// [`HarnessError::Sim`] when kube-sim cannot start.
    pub async fn start_controller(
        provisioner_name: &str,
        controller: impl FnOnce(Client) -> ProvisionController,
    ) -> Result<Self, HarnessError> {
        let sim = KubeSim::builder()
            .pv_binder(true)
            .start()
            .await
            .map_err(HarnessError::Sim)?;
        let controller = controller(sim.client());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(controller.run(async {
            let _ = stopped.await;
        }));
        Ok(Self {
            sim,
            name: provisioner_name.to_owned(),
            limit: DEFAULT_LIMIT,
            stop: Some(stop),
            controller: Mutex::new(Some(task)),
        })
    }

    /// Sets how long each wait lasts ([`DEFAULT_LIMIT`], 30 s).
    #[must_use]
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// A client of the API server the controller runs against.
    #[must_use]
    pub fn client(&self) -> Client {
        self.sim.client()
    }

    /// The API server itself: its request log, fault injection, kubeconfig.
    #[must_use]
    pub fn sim(&self) -> &KubeSim {
        &self.sim
    }

    /// Creates `class` (a test with classes of its own creates them before its claims).
    ///
    /// # Errors
    /// [`HarnessError::Api`] when the server refuses it.
    pub async fn create_class(&self, class: &StorageClass) -> Result<(), HarnessError> {
        let name = class.metadata.name.clone().unwrap_or_default();
        let classes: Api<StorageClass> = Api::all(self.client());
        classes
            .create(&PostParams::default(), class)
            .await
            .map_err(|source| HarnessError::Api {
                what: format!("create storageclass {name}"),
                source,
            })?;
        Ok(())
    }

    /// Creates `claim`, waits until it is bound and returns its PersistentVolume as the
    /// server has it. A claim that names no StorageClass is given [`TEST_CLASS`], which is
    /// created the first time.
    ///
    /// # Errors
    /// [`HarnessError::NotBound`] (with the claim's events) when it is not bound within
    /// the limit; [`HarnessError::Api`] when a call fails;
    /// [`HarnessError::Controller`] when the controller stopped.
    pub async fn provision(
        &self,
        claim: impl Into<PersistentVolumeClaim>,
    ) -> Result<PersistentVolume, HarnessError> {
        let mut claim: PersistentVolumeClaim = claim.into();
        let spec = claim.spec.get_or_insert_with(Default::default);
        if spec.storage_class_name.is_none() {
            spec.storage_class_name = Some(TEST_CLASS.to_owned());
            self.ensure_test_class().await?;
        }
        let (claims, key) = self.claims(&claim);
        let created = claims
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|source| HarnessError::Api {
                what: format!("create persistentvolumeclaim {key}"),
                source,
            })?;
        let name = created.metadata.name.clone().unwrap_or_default();
        let deadline = Instant::now() + self.limit;
        loop {
            self.controller_running()?;
            let current = claims.get_opt(&name).await.ok().flatten();
            let bound = current.as_ref().and_then(|c| {
                let phase = c.status.as_ref()?.phase.as_deref();
                (phase == Some("Bound")).then(|| c.spec.as_ref()?.volume_name.clone())?
            });
            if let Some(volume) = bound {
                let volumes: Api<PersistentVolume> = Api::all(self.client());
                return volumes
                    .get(&volume)
                    .await
                    .map_err(|source| HarnessError::Api {
                        what: format!("get persistentvolume {volume}"),
                        source,
                    });
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotBound {
                    claim: key,
                    limit: self.limit,
                    events: self.events_of(&claim).await,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes `claim` and waits until the volume it was bound to is gone (the controller
    /// deleted the asset, then the PV). Only the claim's namespace and name are used.
    ///
    /// # Errors
    /// [`HarnessError::NotDeleted`] when the volume is still there after the limit;
    /// [`HarnessError::Api`] when a call fails.
    pub async fn delete(&self, claim: &PersistentVolumeClaim) -> Result<(), HarnessError> {
        let (claims, key) = self.claims(claim);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let current = claims
            .get(&name)
            .await
            .map_err(|source| HarnessError::Api {
                what: format!("get persistentvolumeclaim {key}"),
                source,
            })?;
        let volume = current.spec.and_then(|s| s.volume_name);
        claims
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(|source| HarnessError::Api {
                what: format!("delete persistentvolumeclaim {key}"),
                source,
            })?;
        let Some(volume) = volume else {
            return Ok(());
        };
        let volumes: Api<PersistentVolume> = Api::all(self.client());
        let deadline = Instant::now() + self.limit;
        loop {
            self.controller_running()?;
            if matches!(volumes.get_opt(&volume).await, Ok(None)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotDeleted {
                    volume,
                    claim: key,
                    limit: self.limit,
                    events: self.events_of(claim).await,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The events written about `claim`, oldest first, as `type reason: note`.
    pub async fn events(&self, claim: &PersistentVolumeClaim) -> Vec<String> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let events: Api<Event> = Api::namespaced(self.client(), namespace);
        let Ok(list) = events.list(&ListParams::default()).await else {
            return Vec::new();
        };
        let mut about: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        about.sort_by(|a, b| {
            let time = |e: &Event| e.event_time.as_ref().map(|t| t.0);
            time(a).cmp(&time(b))
        });
        about
            .into_iter()
            .map(|e| {
                format!(
                    "{} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default()
                )
            })
            .collect()
    }

    /// Stops the controller (gracefully, as SIGTERM would) and kube-sim.
    ///
    /// # Errors
    /// [`HarnessError::Controller`] when the controller failed; [`HarnessError::Panicked`]
    /// when its task panicked.
    pub async fn stop(self) -> Result<(), HarnessError> {
        let Self {
            sim,
            stop,
            controller,
            ..
        } = self;
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
        let task = controller
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let result = match task {
            Some(task) => match task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(HarnessError::Controller(error)),
                Err(_) => Err(HarnessError::Panicked),
            },
            None => Ok(()),
        };
        sim.shutdown().await;
        result
    }

    fn claims(&self, claim: &PersistentVolumeClaim) -> (Api<PersistentVolumeClaim>, String) {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        (
            Api::namespaced(self.client(), namespace),
            format!("{namespace}/{name}"),
        )
    }

    async fn events_of(&self, claim: &PersistentVolumeClaim) -> String {
        let events = self.events(claim).await;
        if events.is_empty() {
            "none".to_owned()
        } else {
            events.join("; ")
        }
    }

    async fn ensure_test_class(&self) -> Result<(), HarnessError> {
        let classes: Api<StorageClass> = Api::all(self.client());
        if let Ok(Some(_)) = classes.get_opt(TEST_CLASS).await {
            return Ok(());
        }
        let test_class = class(TEST_CLASS)
            .provisioner(&self.name)
            .reclaim_policy("Delete")
            .build();
        match classes.create(&PostParams::default(), &test_class).await {
            Err(kube_client::Error::Api(status)) if status.is_already_exists() => Ok(()),
            Err(source) => Err(HarnessError::Api {
                what: format!("create storageclass {TEST_CLASS}"),
                source,
            }),
            Ok(_) => Ok(()),
        }
    }

    /// Fails when the controller's task has ended (an error at start, a panic), with
    /// its error.
    fn controller_running(&self) -> Result<(), HarnessError> {
        let mut controller = self
            .controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match controller
            .take_if(|task| task.is_finished())
            .map(FutureExt::now_or_never)
        {
            None => Ok(()),
            Some(Some(Ok(Err(error)))) => Err(HarnessError::Controller(error)),
            Some(Some(Err(_))) => Err(HarnessError::Panicked),
            Some(_) => Err(HarnessError::Stopped),
        }
    }
}
