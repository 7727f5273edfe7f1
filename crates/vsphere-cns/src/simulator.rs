//! An in-process CNS endpoint on loopback (feature `simulator`).
//!
//! [`CnsSimulator`] serves `/sdk`, `/vsanHealth`, `/sdk/vimServiceVersions.xml` and
//! `/sdk/vsanServiceVersions.xml` on `127.0.0.1` over plain HTTP, answering with the response
//! shapes recorded from VMware's vCenter simulator (`tests/samples`). It keeps volumes and
//! their metadata in memory, issues quoted `vmware_soap_session` cookies as a real vCenter
//! does, rejects calls without a valid session (`NotAuthenticated`) and a wrong password
//! (`InvalidLogin`), and can be told to fail or delay calls. Like a vCenter, it finishes a
//! call it has received even when the client gives up waiting (a client-side timeout): a
//! delayed create, delete or update still changes the volumes. Malformed requests and
//! unknown methods get SOAP faults.
//!
//! Where vcsim and a real vCenter differ, the simulator follows the real vCenter: updating
//! an unknown volume reports `NotFound` (vcsim returns an empty result), metadata updates
//! merge per entity and honour `delete` (vcsim replaces the list), and a query filter
//! without `xsi:type` is an `InvalidArgument` fault (vcsim hangs).
//!
//! ```no_run
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! use vsphere_cns::simulator::{CnsSimulator, SimFault};
//! use vsphere_cns::CnsClient;
//! use vsphere_cns::wire::QueryFilter;
//!
//! let sim = CnsSimulator::start().await?;
//! let client = CnsClient::connect(&sim.vc_config()).await?;
//! sim.fail_next("CnsQueryVolume", SimFault::call("CnsFault").message("injected"));
//! assert!(client.query_volume(&QueryFilter::default()).await.is_err());
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod handlers;
mod tls;
mod volumes;
mod wire;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::connection::VirtualCenterConfig;
use crate::tls::{Thumbprint, TlsMode};
use crate::wire::{ClusterFlavor, CnsVolumeId, ContainerCluster, MoRef, VolumeMetadata};

/// The user name the simulator accepts by default.
pub const DEFAULT_USER: &str = "cnsuser";
/// The password the simulator accepts by default.
pub const DEFAULT_PASSWORD: &str = "cnspass";
/// The datastore the simulator has by default.
pub const DEFAULT_DATASTORE: &str = "datastore-59";
/// The name of the default datastore (`DC0/datastore/LocalDS_0`).
pub const DEFAULT_DATASTORE_NAME: &str = "LocalDS_0";

/// A volume held by the simulator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimVolume {
    /// The volume ID: a random UUID (seeded with [`Builder::seed`]), so IDs do not follow
    /// creation order.
    pub id: CnsVolumeId,
    /// The name given at create.
    pub name: String,
    /// Size in MiB.
    pub capacity_in_mb: i64,
    /// The datastore it was placed on.
    pub datastore: MoRef,
    /// The storage policy given at create.
    pub profile_id: Option<String>,
    /// Current metadata (cluster and entities).
    pub metadata: VolumeMetadata,
}

/// Where an injected fault shows up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultSite {
    /// A SOAP fault (HTTP 500) on the call itself.
    Call,
    /// The call returns a task that ends in state `error` with the fault.
    Task,
    /// The task succeeds but its per-volume result carries the fault (nothing is changed).
    VolumeResult,
    /// A partial failure: the operation is carried out (a create leaves its volume), then
    /// the task ends in state `error` with the fault.
    TaskAfterChange,
}

/// A fault to inject with [`CnsSimulator::fail_next`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimFault {
    /// Where it shows up. `Task` and `VolumeResult` apply to the mutating CNS calls only;
    /// other methods answer them as `Call`.
    pub site: FaultSite,
    /// The fault class, for example `NotFound`, `CnsFault` or `NotAuthenticated`.
    pub fault_type: String,
    /// The message (`faultstring` or `localizedMessage`).
    pub message: String,
}

impl SimFault {
    /// A SOAP fault on the call.
    pub fn call(fault_type: impl Into<String>) -> Self {
        Self {
            site: FaultSite::Call,
            fault_type: fault_type.into(),
            message: String::new(),
        }
    }

    /// A task that ends in `error`.
    pub fn task(fault_type: impl Into<String>) -> Self {
        Self {
            site: FaultSite::Task,
            ..Self::call(fault_type)
        }
    }

    /// A task that changes what it was asked to, then ends in `error` with the fault.
    pub fn task_after_change(fault_type: impl Into<String>) -> Self {
        Self {
            site: FaultSite::TaskAfterChange,
            ..Self::call(fault_type)
        }
    }

    /// A successful task whose volume result carries the fault.
    pub fn volume_result(fault_type: impl Into<String>) -> Self {
        Self {
            site: FaultSite::VolumeResult,
            ..Self::call(fault_type)
        }
    }

    /// Sets the message.
    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }
}

/// One request the simulator received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRequest {
    /// `/sdk` or `/vsanHealth`.
    pub path: String,
    /// The SOAP method, for example `CnsCreateVolume`.
    pub method: String,
    /// The `SOAPAction` header.
    pub soap_action: Option<String>,
    /// Whether the request carried a valid session cookie.
    pub authenticated: bool,
}

/// A finished task.
#[derive(Clone, Debug)]
pub(crate) struct TaskRecord {
    pub(crate) method: String,
    /// `Ok(inner XML of <result>)` for state `success`, `Err(inner XML of <error>)` for
    /// state `error`.
    pub(crate) outcome: Result<String, String>,
}

/// Where volume IDs come from: random UUIDs, or a seeded sequence of UUIDs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) enum VolumeIds {
    /// `Uuid::new_v4`.
    #[default]
    Random,
    /// A SplitMix64 sequence from [`Builder::seed`]: the same seed and the same order of
    /// creates give the same IDs.
    Seeded(u64),
}

impl VolumeIds {
    /// The next volume ID: a version-4 UUID, in no relation to creation order.
    pub(crate) fn next(&mut self) -> CnsVolumeId {
        let uuid = match self {
            VolumeIds::Random => uuid::Uuid::new_v4(),
            VolumeIds::Seeded(state) => {
                let mut bytes = [0_u8; 16];
                bytes[..8].copy_from_slice(&splitmix64(state).to_le_bytes());
                bytes[8..].copy_from_slice(&splitmix64(state).to_le_bytes());
                uuid::Builder::from_random_bytes(bytes).into_uuid()
            }
        };
        CnsVolumeId::new(uuid.to_string())
    }
}

/// One step of SplitMix64.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Default)]
pub(crate) struct Data {
    pub(crate) sessions: HashSet<String>,
    pub(crate) volume_ids: VolumeIds,
    pub(crate) volumes: BTreeMap<String, SimVolume>,
    pub(crate) tasks: HashMap<String, TaskRecord>,
    pub(crate) next_task: u64,
    pub(crate) faults: HashMap<String, VecDeque<SimFault>>,
    pub(crate) delays: HashMap<String, Duration>,
    pub(crate) requests: Vec<SimRequest>,
}

pub(crate) struct Shared {
    pub(crate) user: String,
    pub(crate) password: String,
    /// Datastore MoRef value → (name, URL).
    pub(crate) datastores: BTreeMap<String, (String, String)>,
    pub(crate) data: Mutex<Data>,
    /// Every request runs in a task of this set, so that a call whose client has gone away
    /// (a timeout) still completes, as a vCenter task does. Joined on shutdown.
    pub(crate) work: Mutex<JoinSet<()>>,
}

impl Shared {
    pub(crate) fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        crate::lock(&self.data)
    }

    fn work(&self) -> std::sync::MutexGuard<'_, JoinSet<()>> {
        crate::lock(&self.work)
    }

    /// Runs `job` in a task owned by the simulator (reaping the finished ones first).
    pub(crate) fn spawn(&self, job: impl Future<Output = ()> + Send + 'static) {
        let mut work = self.work();
        while work.try_join_next().is_some() {}
        work.spawn(job);
    }
}

/// Builds a [`CnsSimulator`] with other credentials or datastores.
#[derive(Clone, Debug)]
pub struct Builder {
    user: String,
    password: String,
    datastores: BTreeMap<String, (String, String)>,
    https: bool,
    seed: Option<u64>,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            user: DEFAULT_USER.into(),
            password: DEFAULT_PASSWORD.into(),
            datastores: BTreeMap::from([(
                DEFAULT_DATASTORE.to_owned(),
                (
                    DEFAULT_DATASTORE_NAME.to_owned(),
                    "ds:///vmfs/volumes/sim-datastore-0/".to_owned(),
                ),
            )]),
            https: false,
            seed: None,
        }
    }
}

impl Builder {
    /// The only user name and password `Login` accepts.
    #[must_use]
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = user.into();
        self.password = password.into();
        self
    }

    /// Adds a datastore: MoRef value (`datastore-60`), name (found by
    /// `FindByInventoryPath` as `<any datacenter>/datastore/<name>`) and URL.
    #[must_use]
    pub fn datastore(
        mut self,
        id: impl Into<String>,
        name: impl Into<String>,
        url: impl Into<String>,
    ) -> Self {
        self.datastores.insert(id.into(), (name.into(), url.into()));
        self
    }

    /// Serves HTTPS with a bundled test certificate for `localhost` and `127.0.0.1`, signed
    /// by the test CA of [`CnsSimulator::test_ca_pem`]. [`CnsSimulator::vc_config`] then pins
    /// the certificate's thumbprint.
    #[must_use]
    pub fn https(mut self) -> Self {
        self.https = true;
        self
    }

    /// Draws volume IDs from a sequence seeded with `seed` instead of at random: the same
    /// seed and the same order of creates give the same IDs. Either way IDs are UUIDs in
    /// no relation to creation order (the lowest ID is not the first volume made).
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Binds `127.0.0.1:0` and starts serving.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start(self) -> std::io::Result<CnsSimulator> {
        let shared = Arc::new(Shared {
            user: self.user,
            password: self.password,
            datastores: self.datastores,
            data: Mutex::new(Data {
                volume_ids: self.seed.map_or(VolumeIds::Random, VolumeIds::Seeded),
                ..Data::default()
            }),
            work: Mutex::new(JoinSet::new()),
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let router = handlers::router(shared.clone());
        let stopped = async move {
            let _ = stopped.await;
        };
        let server = if self.https {
            let listener = tls::TlsListener::new(listener)?;
            tokio::spawn(async move {
                let serve = axum::serve(listener, router).with_graceful_shutdown(stopped);
                if let Err(e) = serve.await {
                    tracing::warn!(error = %e, "CNS simulator stopped with an error");
                }
            })
        } else {
            tokio::spawn(async move {
                let serve = axum::serve(listener, router).with_graceful_shutdown(stopped);
                if let Err(e) = serve.await {
                    tracing::warn!(error = %e, "CNS simulator stopped with an error");
                }
            })
        };
        tracing::debug!(%addr, https = self.https, "CNS simulator listening");
        Ok(CnsSimulator {
            addr,
            https: self.https,
            shared,
            stop: Some(stop),
            server: Some(server),
        })
    }
}

/// An in-process CNS endpoint; stops when dropped or on [`CnsSimulator::shutdown`].
pub struct CnsSimulator {
    addr: SocketAddr,
    https: bool,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for CnsSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CnsSimulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl CnsSimulator {
    /// Starts a simulator with the default user, password and datastore.
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn start() -> std::io::Result<CnsSimulator> {
        Builder::default().start().await
    }

    /// A [`Builder`] for other credentials or datastores.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` when built with [`Builder::https`]).
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Connection settings for this simulator: its address, its user and password, short
    /// task polls, and [`TlsMode::PlainHttp`], or with [`Builder::https`] the pinned
    /// [`CnsSimulator::thumbprint`].
    pub fn vc_config(&self) -> VirtualCenterConfig {
        let tls = if self.https {
            TlsMode::Thumbprint(self.thumbprint())
        } else {
            TlsMode::PlainHttp
        };
        VirtualCenterConfig::new(
            self.addr.ip().to_string(),
            self.shared.user.clone(),
            self.shared.password.clone(),
        )
        .port(self.addr.port())
        .tls(tls)
        .task_poll_interval(Duration::from_millis(10))
    }

    /// The SHA-256 thumbprint of the certificate served in HTTPS mode.
    pub fn thumbprint(&self) -> Thumbprint {
        Thumbprint::of_certificate(tls::server_certificate().as_ref())
    }

    /// The PEM of the test CA that signed the HTTPS certificate (for `ca-file` tests).
    pub fn test_ca_pem() -> &'static str {
        tls::TEST_CA_PEM
    }

    /// The datastore MoRefs it knows.
    pub fn datastores(&self) -> Vec<MoRef> {
        self.shared
            .datastores
            .keys()
            .map(MoRef::datastore)
            .collect()
    }

    /// Makes the next call of `method` (a SOAP method name) fail with `fault`. Calls queue:
    /// two `fail_next` calls fail the next two calls.
    pub fn fail_next(&self, method: &str, fault: SimFault) {
        self.shared
            .data()
            .faults
            .entry(method.to_owned())
            .or_default()
            .push_back(fault);
    }

    /// Forgets every fault queued with [`fail_next`](Self::fail_next) and not yet used.
    pub fn clear_faults(&self) {
        self.shared.data().faults.clear();
    }

    /// Delays every call of `method` by `delay` before it is carried out and answered;
    /// `Duration::ZERO` removes the delay. A delayed call whose client stops waiting
    /// still runs to completion (its effect shows up after `delay`).
    pub fn delay(&self, method: &str, delay: Duration) {
        let mut data = self.shared.data();
        if delay.is_zero() {
            data.delays.remove(method);
        } else {
            data.delays.insert(method.to_owned(), delay);
        }
    }

    /// Forgets every session, as an idle timeout on a vCenter would.
    pub fn expire_sessions(&self) {
        self.shared.data().sessions.clear();
    }

    /// Adds a block volume named `name` owned by container cluster `cluster_id`, as if an
    /// earlier create had made it (for example a create that timed out on the client and
    /// landed later, or one made by another replica): 1024 MiB on the first datastore,
    /// no entities. It is found by a query on its name and cluster ID. Returns its ID.
    pub fn insert_volume(&self, name: &str, cluster_id: &str) -> CnsVolumeId {
        let cluster = ContainerCluster::kubernetes(
            cluster_id,
            self.shared.user.clone(),
            ClusterFlavor::Vanilla,
        );
        let datastore = self
            .shared
            .datastores
            .keys()
            .next()
            .map_or_else(|| MoRef::datastore(DEFAULT_DATASTORE), MoRef::datastore);
        let mut data = self.shared.data();
        let id = data.volume_ids.next();
        let volume = SimVolume {
            id: id.clone(),
            name: name.to_owned(),
            capacity_in_mb: 1024,
            datastore,
            profile_id: None,
            metadata: VolumeMetadata::for_cluster(cluster, Vec::new()),
        };
        data.volumes.insert(id.to_string(), volume);
        id
    }

    /// The volumes it holds, ordered by ID.
    pub fn volumes(&self) -> Vec<SimVolume> {
        self.shared.data().volumes.values().cloned().collect()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<SimRequest> {
        self.shared.data().requests.clone()
    }

    /// Stops serving, then waits for the server task and for every call still running
    /// (a delayed create, delete or update whose client gave up completes first).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        let mut work = std::mem::take(&mut *self.shared.work());
        while work.join_next().await.is_some() {}
    }
}

impl Drop for CnsSimulator {
    /// Stops at once: the server and every call still running are aborted.
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        self.shared.work().abort_all();
    }
}

#[cfg(test)]
mod background_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod volume_id_tests;
