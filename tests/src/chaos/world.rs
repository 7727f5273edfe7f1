//! The world of one run: kube-sim with its PV binder, the CNS simulator, two replicas,
//! the user's client, and the record of what the user actually did.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU16;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use cnsmetadata::CnsVolumeMetadata;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::api::{ListParams, PostParams};
use kube_client::{Api, Client};
use kube_controller_kit::backoff::ItemExponentialLimiter;
use kube_sim::KubeSim;
use provision_controller::{FailureBackoff, LeaderElection, PvSaveStrategy};
use tokio::time::Instant;
use vsphere_cns::simulator::{CnsSimulator, DEFAULT_USER};
use vsphere_controllers::Settings;

use super::names;
use super::objects;
use super::replica::{Replica, ReplicaSpec};
use super::schedule::{Entity, Schedule};

/// How often every claim and volume is processed again.
pub const RESYNC: Duration = Duration::from_secs(5);
/// Limit of each API and CNS call while provisioning or deleting (injected latency goes
/// beyond it).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// The CNS client's HTTP timeout (slow CNS windows go beyond it).
pub const CNS_TIMEOUT: Duration = Duration::from_millis(1_500);
/// The CNS client's task timeout, compressed like the rest (default 300 s): a create
/// whose outcome is unknown may land within it, so a cleanup waits that long.
pub const CNS_TASK_TIMEOUT: Duration = Duration::from_secs(4);
/// The provisioner's settle window (its default: the task timeout plus the request
/// timeout), its late-asset window too: a create sent lands within it.
pub const CREATE_SETTLE: Duration = CNS_TASK_TIMEOUT.saturating_add(CNS_TIMEOUT);
/// The metadata reconciler's settle margin, compressed like the rest (default 60 s; at
/// least the lease duration): a deleted object whose push got no answer keeps its
/// finalizer for the backend timeout plus this margin after that push.
pub const SETTLE_MARGIN: Duration = Duration::from_secs(5);
/// Lease timings: short, so that a partition outlives the lease.
pub const LEASE: (Duration, Duration, Duration) = (
    Duration::from_secs(2),
    Duration::from_millis(1_500),
    Duration::from_millis(300),
);

/// What the user did to one claim (only what succeeded).
#[derive(Clone, Debug, Default)]
pub struct ClaimRecord {
    /// Its name.
    pub name: String,
    /// Its class.
    pub class: String,
    /// Its UID, once created.
    pub uid: Option<String>,
    /// When it was created (from the start of the run).
    pub created_at: Option<Duration>,
    /// Its deletion was accepted.
    pub deleted: bool,
    /// Its finalizers (`kubernetes.io/pvc-protection`: the controller puts none on a
    /// claim) were stripped by hand, and when.
    pub stripped_at: Option<Duration>,
    /// Its PV was switched to Retain before the claim was deleted.
    pub retained_pv: Option<String>,
    /// The static PV made for it.
    pub static_pv: Option<String>,
}

/// What the user did to one `CnsVolumeMetadata` object.
#[derive(Clone, Debug)]
pub struct MetadataRecord {
    /// The claim whose volume it describes.
    pub claim: usize,
    /// The entity it describes.
    pub entity: Entity,
    /// Whether the last spec written is valid.
    pub valid: bool,
    /// Its deletion was accepted.
    pub deleted: bool,
}

/// Everything the checks need to know about what happened.
#[derive(Debug, Default)]
pub struct Records {
    /// Per claim number.
    pub claims: BTreeMap<usize, ClaimRecord>,
    /// Per object name.
    pub metadata: BTreeMap<String, MetadataRecord>,
    /// CNS volumes the harness inserted (ID → why).
    pub inserted: BTreeMap<String, String>,
    /// The log, with times from the start.
    pub log: Vec<(Duration, String)>,
}

/// The shared parts the claim chains and the global loop use.
pub struct Shared {
    /// The user's client (no partition; API faults hit it too, so it retries).
    pub client: Client,
    /// The CNS simulator.
    pub cns: CnsSimulator,
    /// When the run started.
    pub started: Instant,
    records: Mutex<Records>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    /// The records.
    pub fn records(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time since the start.
    #[must_use]
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Adds a line to the log.
    pub fn log(&self, line: impl Into<String>) {
        let now = self.now();
        self.records().log.push((now, line.into()));
    }

    /// Claims' API.
    #[must_use]
    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), names::NAMESPACE)
    }

    /// PVs' API.
    #[must_use]
    pub fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Classes' API.
    #[must_use]
    pub fn classes(&self) -> Api<StorageClass> {
        Api::all(self.client.clone())
    }

    /// Nodes' API.
    #[must_use]
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// `CnsVolumeMetadata` API.
    #[must_use]
    pub fn metadata(&self) -> Api<CnsVolumeMetadata> {
        Api::namespaced(self.client.clone(), names::NAMESPACE)
    }

    /// ConfigMaps of the controllers' namespace (the Lease's), where the provisioning
    /// journal lives.
    #[must_use]
    pub fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), names::NAMESPACE)
    }
}

/// One run's world.
pub struct World {
    /// The API server.
    pub kube: KubeSim,
    /// What chains and the loop share.
    pub shared: Arc<Shared>,
    /// The two replicas.
    pub replicas: Vec<Replica>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("kube", &self.kube)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

/// The controllers' settings: the deployed shape (leader election on, a supervisor
/// cluster so the metadata reconciler runs), with compressed timings.
///
/// # Errors
/// When the lease timings do not validate.
pub fn settings(schedule: &Schedule) -> anyhow::Result<Settings> {
    let (lease, renew, retry) = LEASE;
    let election = LeaderElection::default()
        .namespace(names::NAMESPACE)
        .lease_duration(lease)
        .renew_deadline(renew)
        .retry_period(retry);
    let provision_config = provision_controller::Config::default()
        .leader_election(Some(election))
        .resync_period(RESYNC)
        .failure_backoff(FailureBackoff::Custom(Arc::new(
            ItemExponentialLimiter::new(Duration::from_millis(20), Duration::from_secs(1)),
        )))
        .pv_save(PvSaveStrategy::Blocking {
            retries: 3,
            interval: Duration::from_millis(100),
        })
        .provision_timeout(Some(CALL_TIMEOUT))
        .deletion_timeout(Some(CALL_TIMEOUT))
        .shutdown_grace(Duration::from_secs(1))
        .add_finalizer(schedule.pv_finalizer);
    provision_config
        .validate()
        .context("the chaos provision settings are invalid")?;
    let metadata_config = cnsmetadata::Config::default()
        .backend_timeout(CALL_TIMEOUT)
        .settle_margin(SETTLE_MARGIN)
        .worker_threads(NonZeroU16::new(2).expect("2 is not zero"));
    Ok(Settings {
        provisioner_name: names::PROVISIONER.to_owned(),
        leader_election: schedule.leader_election,
        metrics_address: None,
        flavor: cnsmetadata::ClusterFlavor::Workload,
        cluster_id: names::CLUSTER_ID.to_owned(),
        supervisor_id: None,
        vsphere_user: DEFAULT_USER.to_owned(),
        provision_config,
        metadata_config: Ok(metadata_config),
        feature_states: vsphere_controllers::FeatureStates::default(),
    })
}

impl World {
    /// Starts the simulators, installs the CRD, classes and nodes, and starts both
    /// replicas.
    ///
    /// # Errors
    /// When a simulator cannot start or the setup writes fail.
    pub async fn start(schedule: &Schedule) -> anyhow::Result<Self> {
        let kube = KubeSim::builder()
            .pv_binder(true)
            .start()
            .await
            .context("cannot start kube-sim")?;
        let cns = CnsSimulator::builder()
            .datastore(
                names::DATASTORE_ID,
                names::DATASTORE_NAME,
                names::DATASTORE_URL,
            )
            .seed(schedule.seed)
            .start()
            .await
            .context("cannot start the CNS simulator")?;
        install(&kube.client()).await?;
        let shared = Arc::new(Shared {
            client: kube.client(),
            started: Instant::now(),
            records: Mutex::new(Records::default()),
            cns,
        });
        let uri: http::Uri = kube.url().parse().context("kube-sim's URL")?;
        let spec = Arc::new(ReplicaSpec {
            kube: kube_client::Config::new(uri),
            vc: shared
                .cns
                .vc_config()
                .timeout(CNS_TIMEOUT)
                .task_timeout(CNS_TASK_TIMEOUT),
            settings: settings(schedule)?,
            seed: schedule.seed,
        });
        let mut replicas = vec![Replica::new(0, spec.clone()), Replica::new(1, spec)];
        for replica in &mut replicas {
            replica.start()?;
        }
        shared.log("both replicas started");
        Ok(Self {
            kube,
            shared,
            replicas,
        })
    }

    /// Stops everything (replicas first, without waiting for them).
    pub async fn shutdown(mut self) {
        for replica in &mut self.replicas {
            replica.kill();
        }
        self.kube.shutdown().await;
    }
}

async fn install(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &cnsmetadata::crd())
        .await
        .context("cannot install the CnsVolumeMetadata CRD")?;
    // The supervisor's feature states, as its install ships them: the reconciler starts
    // once it has read them (TKGsHA off: the chaos cluster has no supervisor ID).
    vsphere_controllers::FeatureStates::supervisor()
        .create(client, &[(vsphere_controllers::TKGS_HA, "false")])
        .await
        .context("cannot create the feature-state ConfigMap")?;
    let metadata: Api<CnsVolumeMetadata> = Api::namespaced(client.clone(), names::NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metadata
        .list(&ListParams::default().limit(1))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("the CnsVolumeMetadata CRD is not served");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let classes: Api<StorageClass> = Api::all(client.clone());
    for class in names::CLASSES {
        classes
            .create(&PostParams::default(), &objects::class(class, true))
            .await
            .with_context(|| format!("cannot create storageclass {class}"))?;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for node in names::NODES {
        nodes
            .create(&PostParams::default(), &objects::node(node))
            .await
            .with_context(|| format!("cannot create node {node}"))?;
    }
    Ok(())
}

/// How long the user keeps retrying a request (longer than any fault window, shorter
/// than a claim's life).
const USER_PATIENCE: Duration = Duration::from_secs(6);

/// Retries a user request that failed for a reason other than the answer itself: an
/// injected 5xx, 429 or 409, or a broken connection, for up to 6 s. Returns the last
/// result.
pub async fn retry<T, F, Fut>(mut attempt: F) -> kube_client::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube_client::Result<T>>,
{
    let deadline = Instant::now() + USER_PATIENCE;
    loop {
        let result = attempt().await;
        let again = match &result {
            Ok(_) => false,
            Err(kube_client::Error::Api(status)) => {
                status.code >= 500 || status.code == 429 || status.reason == "Conflict"
            }
            Err(_) => true,
        };
        if !again || Instant::now() >= deadline {
            return result;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a result is a 404.
#[must_use]
pub fn is_not_found<T>(result: &kube_client::Result<T>) -> bool {
    matches!(result, Err(kube_client::Error::Api(s)) if s.code == 404)
}

/// The names of the methods a run may have slowed down.
#[must_use]
pub fn cns_methods() -> BTreeSet<&'static str> {
    BTreeSet::from([
        "CnsCreateVolume",
        "CnsDeleteVolume",
        "CnsUpdateVolumeMetadata",
        "CnsQueryVolume",
    ])
}
