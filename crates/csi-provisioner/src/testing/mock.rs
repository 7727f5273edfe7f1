//! [`MockCsiDriver`]: a CSI driver on a unix socket, for tests.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::{Notify, oneshot, watch};
use tonic::body::Body;
use tonic::{Code, Status};

use crate::csi::controller_service_capability::{self, RpcType};
use crate::csi::plugin_capability::{self, ServiceType};
use crate::csi::*;

/// The CSI calls [`MockCsiDriver`] serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CsiMethod {
    /// `Identity.Probe`.
    Probe,
    /// `Identity.GetPluginInfo`.
    GetPluginInfo,
    /// `Identity.GetPluginCapabilities`.
    GetPluginCapabilities,
    /// `Controller.ControllerGetCapabilities`.
    ControllerGetCapabilities,
    /// `Controller.CreateVolume`.
    CreateVolume,
    /// `Controller.DeleteVolume`.
    DeleteVolume,
}

impl CsiMethod {
    /// Every method.
    pub const ALL: [CsiMethod; 6] = [
        CsiMethod::Probe,
        CsiMethod::GetPluginInfo,
        CsiMethod::GetPluginCapabilities,
        CsiMethod::ControllerGetCapabilities,
        CsiMethod::CreateVolume,
        CsiMethod::DeleteVolume,
    ];

    /// The gRPC path (`/csi.v1.Controller/CreateVolume`).
    pub fn path(self) -> &'static str {
        match self {
            CsiMethod::Probe => "/csi.v1.Identity/Probe",
            CsiMethod::GetPluginInfo => "/csi.v1.Identity/GetPluginInfo",
            CsiMethod::GetPluginCapabilities => "/csi.v1.Identity/GetPluginCapabilities",
            CsiMethod::ControllerGetCapabilities => "/csi.v1.Controller/ControllerGetCapabilities",
            CsiMethod::CreateVolume => "/csi.v1.Controller/CreateVolume",
            CsiMethod::DeleteVolume => "/csi.v1.Controller/DeleteVolume",
        }
    }

    fn from_path(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|method| method.path() == path)
    }
}

impl fmt::Display for CsiMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path();
        f.write_str(&path[path.rfind('/').map_or(0, |slash| slash + 1)..])
    }
}

/// How the mock answers one call: see [`MockCsiDriver::script`].
///
/// The codes upstream's sidecar treats as "the operation may still be running"
/// (`DeadlineExceeded`, `Unavailable`, `Canceled`, `Aborted`, `ResourceExhausted`) and the
/// final ones (`InvalidArgument`, `NotFound`, ...) are all plain [`Code`]s here: what the
/// sidecar makes of them is what the tests check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Do the work and answer it (after the method's delay, [`MockCsiDriver::set_delay`]).
    Ok,
    /// Answer this error without doing anything.
    Error(Code),
    /// Do the work, then answer this error anyway: a driver whose backend made the volume
    /// but whose answer was lost or failed late (`DeadlineExceeded`, `Aborted`, ...). The
    /// sidecar sees an error and a volume exists.
    ErrorAfterWork(Code),
    /// Do the work this long after the call arrives, in a task of its own, then answer:
    /// "the create lands after its deadline". A client that gives up first (its timeout
    /// shorter than this) gets `DeadlineExceeded`, and the volume is recorded anyway when
    /// the time comes, as a backend that had already accepted the operation. Such work also
    /// survives [`MockCsiDriver::crash`]. Until it lands, further CreateVolume calls for the
    /// same name are refused with `Aborted` ("an operation is pending for the volume", the
    /// CSI spec's answer to secondary calls): a replay never makes a second volume beside
    /// the pending one, nor one that the pending work would make again after a delete.
    LandsAfter(Duration),
}

/// The `accessible_topology` of the volumes the mock makes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AccessibleTopology {
    /// None (a driver without `VOLUME_ACCESSIBILITY_CONSTRAINTS`).
    #[default]
    None,
    /// The first preferred topology of the request, else its first requisite one, else none
    /// (what the hostpath driver does).
    FromRequest,
    /// Always these.
    Fixed(Vec<Topology>),
}

/// The `volume_context` of the volumes the mock makes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VolumeContext {
    /// The request's parameters.
    #[default]
    EchoParameters,
    /// Always this map.
    Fixed(HashMap<String, String>),
}

/// A volume the mock holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockVolume {
    /// The CreateVolume name (the idempotency key).
    pub name: String,
    /// The volume id (`vol-1`, `vol-2`, ...; never reused).
    pub id: String,
    /// The size made.
    pub capacity_bytes: i64,
    /// The request's parameters.
    pub parameters: HashMap<String, String>,
    /// The volume context answered.
    pub volume_context: HashMap<String, String>,
    /// The accessible topology answered.
    pub accessible_topology: Vec<Topology>,
}

impl MockVolume {
    fn to_volume(&self) -> Volume {
        Volume {
            capacity_bytes: self.capacity_bytes,
            volume_id: self.id.clone(),
            volume_context: self.volume_context.clone(),
            content_source: None,
            accessible_topology: self.accessible_topology.clone(),
        }
    }
}

/// The size of a volume whose request names none (1 GiB).
const DEFAULT_CAPACITY: i64 = 1 << 30;

/// The mock's state: it outlives crashes (the driver's backend).
#[derive(Debug)]
struct State {
    name: String,
    vendor_version: String,
    plugin_capabilities: Vec<ServiceType>,
    controller_capabilities: Vec<RpcType>,
    ready: Option<bool>,
    not_ready_probes: u32,
    delays: HashMap<CsiMethod, Duration>,
    scripts: HashMap<CsiMethod, VecDeque<Answer>>,
    calls: HashMap<CsiMethod, u64>,
    accessible_topology: AccessibleTopology,
    volume_context: VolumeContext,
    volumes: BTreeMap<String, MockVolume>,
    next_id: u64,
    last_create: Option<CreateVolumeRequest>,
    last_delete: Option<DeleteVolumeRequest>,
    /// The CreateVolume names with [`Answer::LandsAfter`] work not landed yet.
    pending: HashMap<String, usize>,
}

impl State {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            vendor_version: "0.0.0-mock".to_owned(),
            plugin_capabilities: vec![ServiceType::ControllerService],
            controller_capabilities: vec![RpcType::CreateDeleteVolume],
            ready: Some(true),
            not_ready_probes: 0,
            delays: HashMap::new(),
            scripts: HashMap::new(),
            calls: HashMap::new(),
            accessible_topology: AccessibleTopology::None,
            volume_context: VolumeContext::EchoParameters,
            volumes: BTreeMap::new(),
            next_id: 1,
            last_create: None,
            last_delete: None,
            pending: HashMap::new(),
        }
    }

    fn probe(&mut self) -> ProbeResponse {
        let ready = if self.not_ready_probes > 0 {
            self.not_ready_probes -= 1;
            Some(false)
        } else {
            self.ready
        };
        ProbeResponse {
            ready: ready.map(|value| BoolValue { value }),
        }
    }

    fn create_volume(&mut self, request: &CreateVolumeRequest) -> Result<Volume, Status> {
        if request.name.is_empty() {
            return Err(Status::invalid_argument(
                "CreateVolume: the name is missing",
            ));
        }
        if request.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument(format!(
                "CreateVolume {}: no volume capabilities",
                request.name
            )));
        }
        let range = request.capacity_range.unwrap_or_default();
        if range.required_bytes < 0
            || range.limit_bytes < 0
            || (range.limit_bytes > 0 && range.required_bytes > range.limit_bytes)
        {
            return Err(Status::out_of_range(format!(
                "CreateVolume {}: capacity range {range:?} is not satisfiable",
                request.name
            )));
        }
        if let Some(existing) = self.volumes.get(&request.name) {
            // The spec: the same name with a compatible request is the same volume.
            let too_small = existing.capacity_bytes < range.required_bytes;
            let too_large = range.limit_bytes > 0 && existing.capacity_bytes > range.limit_bytes;
            if too_small || too_large {
                return Err(Status::already_exists(format!(
                    "CreateVolume {}: volume {} exists with {} bytes, incompatible with {range:?}",
                    request.name, existing.id, existing.capacity_bytes
                )));
            }
            return Ok(existing.to_volume());
        }
        let capacity_bytes = match (range.required_bytes, range.limit_bytes) {
            (0, 0) => DEFAULT_CAPACITY,
            (0, limit) => limit.min(DEFAULT_CAPACITY),
            (required, _) => required,
        };
        let accessible_topology = match &self.accessible_topology {
            AccessibleTopology::None => Vec::new(),
            AccessibleTopology::Fixed(topology) => topology.clone(),
            AccessibleTopology::FromRequest => request
                .accessibility_requirements
                .as_ref()
                .and_then(|requirements| {
                    requirements
                        .preferred
                        .first()
                        .or(requirements.requisite.first())
                })
                .cloned()
                .into_iter()
                .collect(),
        };
        let volume_context = match &self.volume_context {
            VolumeContext::EchoParameters => request.parameters.clone(),
            VolumeContext::Fixed(context) => context.clone(),
        };
        let volume = MockVolume {
            name: request.name.clone(),
            id: format!("vol-{}", self.next_id),
            capacity_bytes,
            parameters: request.parameters.clone(),
            volume_context,
            accessible_topology,
        };
        self.next_id += 1;
        let answer = volume.to_volume();
        self.volumes.insert(volume.name.clone(), volume);
        Ok(answer)
    }

    fn delete_volume(&mut self, request: &DeleteVolumeRequest) -> Result<(), Status> {
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument(
                "DeleteVolume: the volume id is missing",
            ));
        }
        // The spec: deleting a volume that does not exist succeeds.
        self.volumes
            .retain(|_, volume| volume.id != request.volume_id);
        Ok(())
    }
}

/// What lives as long as anything uses it: the state, the socket's directory.
struct Shared {
    socket: PathBuf,
    state: Mutex<State>,
    changed: Notify,
    _dir: tempfile::TempDir,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; keep the state.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `work` on the state and wakes [`MockCsiDriver::wait_until`].
    fn apply<R>(&self, work: impl FnOnce(&mut State) -> R) -> R {
        let outcome = work(&mut self.state());
        self.changed.notify_waiters();
        outcome
    }

    /// One call: counted, its scripted answer taken, its delay slept, its work done.
    async fn answer<R, W>(self: Arc<Self>, method: CsiMethod, work: W) -> Result<R, Status>
    where
        R: Send + 'static,
        W: FnOnce(&mut State) -> Result<R, Status> + Send + 'static,
    {
        self.answer_for(method, None, work).await
    }

    /// [`answer`](Self::answer) for the volume `name` (CreateVolume's): while work of an
    /// earlier call for that name has not landed ([`Answer::LandsAfter`]), the call is
    /// refused with `Aborted`, "an operation is pending for the volume", as the CSI spec
    /// has a plugin answer secondary calls (and no scripted answer is taken).
    async fn answer_for<R, W>(
        self: Arc<Self>,
        method: CsiMethod,
        name: Option<String>,
        work: W,
    ) -> Result<R, Status>
    where
        R: Send + 'static,
        W: FnOnce(&mut State) -> Result<R, Status> + Send + 'static,
    {
        let taken = self.apply(|state| {
            *state.calls.entry(method).or_default() += 1;
            if let Some(name) = &name
                && state.pending.contains_key(name)
            {
                return None;
            }
            let delay = state.delays.get(&method).copied().unwrap_or_default();
            let answer = state
                .scripts
                .get_mut(&method)
                .and_then(VecDeque::pop_front)
                .unwrap_or(Answer::Ok);
            if let (Answer::LandsAfter(_), Some(name)) = (answer, &name) {
                *state.pending.entry(name.clone()).or_default() += 1;
            }
            Some((delay, answer))
        });
        let Some((delay, answer)) = taken else {
            return Err(Status::aborted(format!(
                "{method}: an operation is pending for volume {:?}",
                name.unwrap_or_default()
            )));
        };
        let injected = |code: Code| {
            Status::new(
                code,
                format!("{method}: {code:?} injected by MockCsiDriver"),
            )
        };
        if let Answer::LandsAfter(after) = answer {
            // Detached: neither the client giving up nor a crash stops it.
            let (done, outcome) = oneshot::channel();
            let shared = Arc::clone(&self);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let landed = shared.apply(|state| {
                    if let Some(name) = &name
                        && let Some(count) = state.pending.get_mut(name)
                    {
                        *count -= 1;
                        if *count == 0 {
                            state.pending.remove(name);
                        }
                    }
                    work(state)
                });
                let _ = done.send(landed);
            });
            return outcome
                .await
                .unwrap_or_else(|_| Err(Status::internal("MockCsiDriver: the work was lost")));
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match answer {
            Answer::Ok | Answer::LandsAfter(_) => self.apply(work),
            Answer::Error(code) => Err(injected(code)),
            Answer::ErrorAfterWork(code) => {
                let _ = self.apply(work);
                Err(injected(code))
            }
        }
    }

    fn record_call<R>(&self, record: impl FnOnce(&mut State) -> R) -> R {
        self.apply(record)
    }
}

/// Runs the tasks of one life of the server (the accept loop, the connections, the calls)
/// until that life ends: a crash drops every one of them at once.
#[derive(Clone)]
struct LifeExecutor {
    ended: watch::Receiver<bool>,
}

impl<F> hyper::rt::Executor<F> for LifeExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        let mut ended = self.ended.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = future => {}
                // Ends on `true` and when the mock is dropped (the sender with it).
                _ = ended.wait_for(|ended| *ended) => {}
            }
        });
    }
}

/// The server's current life; dropped with the last clone of the mock.
struct Control {
    shared: Arc<Shared>,
    life: Mutex<Option<watch::Sender<bool>>>,
}

impl Control {
    fn life(&self) -> MutexGuard<'_, Option<watch::Sender<bool>>> {
        self.life
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if let Some(life) = self.life().take() {
            let _ = life.send(true);
        }
    }
}

/// A CSI driver served over gRPC on a unix socket in a temporary directory, for tests: the
/// same wire path as a real driver ([`GrpcCsi`] talks to it), with its behaviour scripted by
/// the test.
///
/// # Behaviour
/// - **Identity**: `Probe` answers `ready` ([`set_ready`](Self::set_ready), or not ready for
///   the next probes with [`not_ready_for`](Self::not_ready_for)); `GetPluginInfo` the name
///   given at creation; `GetPluginCapabilities` `CONTROLLER_SERVICE` unless
///   [`set_plugin_capabilities`](Self::set_plugin_capabilities) says otherwise.
/// - **Controller**: `ControllerGetCapabilities` answers `CREATE_DELETE_VOLUME` unless
///   [`set_controller_capabilities`](Self::set_controller_capabilities) says otherwise.
///   `CreateVolume` keeps volumes by name and is idempotent by name as the spec asks (the
///   same name gives the same `volume_id`; a capacity the existing volume does not fit is
///   `AlreadyExists`); the capacity is `required_bytes` (1 GiB when none is asked);
///   `volume_context` echoes the parameters ([`VolumeContext`]); `accessible_topology` is
///   configurable ([`AccessibleTopology`]). `DeleteVolume` of an unknown id succeeds (the
///   spec: idempotent). A missing name, id or capability is `InvalidArgument`.
///
/// # Fault injection
/// - [`set_delay`](Self::set_delay): each call of a method waits this long before it does
///   anything. A client that gives up first cancels the call, and nothing is done (a driver
///   that honours its context).
/// - [`script`](Self::script): the answers of the next calls of a method, one [`Answer`]
///   each (an error code, an error after the work, or work that lands after its deadline);
///   once the script is used up, calls answer normally.
/// - [`crash`](Self::crash): the server stops at once, calls in flight fail, the socket
///   file is gone; [`restart`](Self::restart) serves again on the same path with the same
///   volumes, as a driver whose backend kept them.
///
/// # Inspection
/// [`volumes`](Self::volumes), [`volume`](Self::volume), [`calls`](Self::calls) per method,
/// [`last_create_volume`](Self::last_create_volume) and
/// [`last_delete_volume`](Self::last_delete_volume) (secrets included, for tests to assert
/// on), and [`wait_until`](Self::wait_until) to wait for a state without sleeping.
///
/// Clones share the driver; the server stops and the directory goes when the last clone
/// (and the last call in flight) is dropped. Needs a tokio runtime (any flavour, paused
/// clocks included: the delays are tokio timers).
///
/// ```
/// use csi_provisioner::csi::{CsiDriver, Code};
/// use csi_provisioner::testing::{Answer, CsiMethod, MockCsiDriver};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (mock, _socket) = MockCsiDriver::start("mock.csi.example.com").unwrap();
/// let driver = mock.client(Duration::from_secs(5));
/// mock.script(CsiMethod::Probe, [Answer::Error(Code::Unavailable)]);
/// assert_eq!(driver.probe().await.unwrap_err().code(), Code::Unavailable);
/// assert!(driver.probe().await.is_ok());
/// assert_eq!(mock.calls(CsiMethod::Probe), 2);
/// # }
/// ```
///
/// [`GrpcCsi`]: crate::csi::GrpcCsi
#[derive(Clone)]
pub struct MockCsiDriver {
    control: Arc<Control>,
}

impl fmt::Debug for MockCsiDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockCsiDriver")
            .field("socket", &self.control.shared.socket)
            .field("serving", &self.is_serving())
            .finish_non_exhaustive()
    }
}

impl MockCsiDriver {
    /// A mock driver named `name` with its socket path reserved in a new temporary
    /// directory, not serving yet: nothing is at [`socket`](Self::socket) until
    /// [`restart`](Self::restart) (a driver that comes up late).
    ///
    /// # Errors
    /// The temporary directory could not be made.
    pub fn new(name: &str) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("csi-mock-").tempdir()?;
        let socket = dir.path().join("csi.sock");
        let shared = Arc::new(Shared {
            socket,
            state: Mutex::new(State::new(name)),
            changed: Notify::new(),
            _dir: dir,
        });
        Ok(Self {
            control: Arc::new(Control {
                shared,
                life: Mutex::new(None),
            }),
        })
    }

    /// A mock driver named `name`, serving, and its socket path.
    ///
    /// # Errors
    /// The temporary directory or the socket could not be made.
    pub fn start(name: &str) -> io::Result<(Self, PathBuf)> {
        let mock = Self::new(name)?;
        mock.restart()?;
        let socket = mock.socket().to_owned();
        Ok((mock, socket))
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.control.shared.socket
    }

    /// The socket as a `--csi-address` (`unix:///tmp/.../csi.sock`).
    pub fn address(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// A [`GrpcCsi`](crate::csi::GrpcCsi) to this mock, each call bounded by `call_timeout`.
    pub fn client(&self, call_timeout: Duration) -> crate::csi::GrpcCsi {
        crate::csi::GrpcCsi::new(&self.address(), call_timeout)
            .expect("the mock's socket path is an absolute unix socket address")
    }

    /// Whether the server is up.
    pub fn is_serving(&self) -> bool {
        self.control.life().is_some()
    }

    /// Starts serving on [`socket`](Self::socket) (again, after [`crash`](Self::crash)), with
    /// the volumes and settings of before. Does nothing if already serving.
    ///
    /// # Errors
    /// The socket could not be bound.
    pub fn restart(&self) -> io::Result<()> {
        let mut life = self.control.life();
        if life.is_some() {
            return Ok(());
        }
        let socket = self.socket();
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        let listener = UnixListener::bind(socket)?;
        let (end, ended) = watch::channel(false);
        let executor = LifeExecutor { ended };
        hyper::rt::Executor::execute(
            &executor,
            accept(listener, Arc::clone(&self.control.shared), executor.clone()),
        );
        *life = Some(end);
        Ok(())
    }

    /// Stops serving at once, as a driver process that died: connections are dropped, calls
    /// in flight fail on the client's side and do nothing on the driver's (but work already
    /// handed to the backend, [`Answer::LandsAfter`], still lands), and the socket file is
    /// removed. The volumes stay, for [`restart`](Self::restart). Does nothing if not
    /// serving.
    pub fn crash(&self) {
        let Some(life) = self.control.life().take() else {
            return;
        };
        let _ = life.send(true);
        drop(life);
        let _ = std::fs::remove_file(self.socket());
        self.control.shared.changed.notify_waiters();
    }

    fn shared(&self) -> &Shared {
        &self.control.shared
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.shared().apply(f)
    }

    /// Sets the name `GetPluginInfo` answers.
    pub fn set_name(&self, name: &str) {
        self.with_state(|state| state.name = name.to_owned());
    }

    /// Sets the vendor version `GetPluginInfo` answers (default `0.0.0-mock`).
    pub fn set_vendor_version(&self, version: &str) {
        self.with_state(|state| state.vendor_version = version.to_owned());
    }

    /// Sets the plugin capabilities (default: `CONTROLLER_SERVICE`).
    pub fn set_plugin_capabilities(&self, capabilities: impl IntoIterator<Item = ServiceType>) {
        let capabilities = capabilities.into_iter().collect();
        self.with_state(|state| state.plugin_capabilities = capabilities);
    }

    /// Sets the controller capabilities (default: `CREATE_DELETE_VOLUME`).
    pub fn set_controller_capabilities(&self, capabilities: impl IntoIterator<Item = RpcType>) {
        let capabilities = capabilities.into_iter().collect();
        self.with_state(|state| state.controller_capabilities = capabilities);
    }

    /// Sets what `Probe` answers in `ready`: `Some(true)` (the default), `Some(false)` (not
    /// ready until set again), or `None` (absent, which the spec reads as ready).
    pub fn set_ready(&self, ready: Option<bool>) {
        self.with_state(|state| state.ready = ready);
    }

    /// The next `probes` probes answer not ready; later ones answer as
    /// [`set_ready`](Self::set_ready) says.
    pub fn not_ready_for(&self, probes: u32) {
        self.with_state(|state| state.not_ready_probes = probes);
    }

    /// Each call of `method` waits `delay` before doing anything (zero: no delay). A client
    /// that gives up during the delay cancels the call.
    pub fn set_delay(&self, method: CsiMethod, delay: Duration) {
        self.with_state(|state| {
            state.delays.insert(method, delay);
        });
    }

    /// Appends `answers` to the script of `method`: the next calls of `method` answer them
    /// in order, one each, after which calls answer normally.
    ///
    /// ```
    /// # use csi_provisioner::csi::Code;
    /// # use csi_provisioner::testing::{Answer, CsiMethod, MockCsiDriver};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let mock = MockCsiDriver::new("x").unwrap();
    /// // Two transient failures, then a volume that lands 2 s after the call.
    /// mock.script(
    ///     CsiMethod::CreateVolume,
    ///     [
    ///         Answer::Error(Code::Unavailable),
    ///         Answer::Error(Code::ResourceExhausted),
    ///         Answer::LandsAfter(Duration::from_secs(2)),
    ///     ],
    /// );
    /// # }
    /// ```
    pub fn script(&self, method: CsiMethod, answers: impl IntoIterator<Item = Answer>) {
        let answers: Vec<Answer> = answers.into_iter().collect();
        self.with_state(|state| state.scripts.entry(method).or_default().extend(answers));
    }

    /// Forgets the scripts and delays of every method.
    pub fn clear_faults(&self) {
        self.with_state(|state| {
            state.scripts.clear();
            state.delays.clear();
        });
    }

    /// Sets the `accessible_topology` of the volumes made from now on.
    pub fn set_accessible_topology(&self, topology: AccessibleTopology) {
        self.with_state(|state| state.accessible_topology = topology);
    }

    /// Sets the `volume_context` of the volumes made from now on.
    pub fn set_volume_context(&self, context: VolumeContext) {
        self.with_state(|state| state.volume_context = context);
    }

    /// The volumes held, by name.
    pub fn volumes(&self) -> Vec<MockVolume> {
        self.shared().state().volumes.values().cloned().collect()
    }

    /// The volume made for the CreateVolume name `name`.
    pub fn volume(&self, name: &str) -> Option<MockVolume> {
        self.shared().state().volumes.get(name).cloned()
    }

    /// How many volumes are held.
    pub fn volume_count(&self) -> usize {
        self.shared().state().volumes.len()
    }

    /// How many calls of `method` arrived (answered or not, injected errors included).
    pub fn calls(&self, method: CsiMethod) -> u64 {
        self.shared()
            .state()
            .calls
            .get(&method)
            .copied()
            .unwrap_or_default()
    }

    /// The last CreateVolume request that arrived, secrets included.
    pub fn last_create_volume(&self) -> Option<CreateVolumeRequest> {
        self.shared().state().last_create.clone()
    }

    /// The last DeleteVolume request that arrived, secrets included.
    pub fn last_delete_volume(&self) -> Option<DeleteVolumeRequest> {
        self.shared().state().last_delete.clone()
    }

    /// Waits until `condition` holds, re-checking it after every call that arrives, every
    /// change of the volumes or settings, and every crash. Bound it with a timeout in tests.
    ///
    /// ```
    /// # use csi_provisioner::testing::{CsiMethod, MockCsiDriver};
    /// # async fn f(mock: MockCsiDriver) {
    /// mock.wait_until(|mock| mock.calls(CsiMethod::CreateVolume) >= 1).await;
    /// # }
    /// ```
    pub async fn wait_until(&self, mut condition: impl FnMut(&Self) -> bool) {
        loop {
            let changed = self.shared().changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if condition(self) {
                return;
            }
            changed.await;
        }
    }
}

/// The accept loop of one life.
async fn accept(listener: UnixListener, shared: Arc<Shared>, executor: LifeExecutor) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "MockCsiDriver: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        let service =
            hyper::service::service_fn(move |request| route(Arc::clone(&shared), request));
        let connection = hyper::server::conn::http2::Builder::new(executor.clone())
            .serve_connection(TokioIo::new(stream), service);
        hyper::rt::Executor::execute(&executor, async move {
            let _ = connection.await;
        });
    }
}

/// One gRPC request, by path.
async fn route(
    shared: Arc<Shared>,
    request: http::Request<Incoming>,
) -> Result<http::Response<Body>, Infallible> {
    let Some(method) = CsiMethod::from_path(request.uri().path()) else {
        let status = Status::unimplemented(format!(
            "MockCsiDriver does not serve {}",
            request.uri().path()
        ));
        return Ok(status.into_http());
    };
    let response = match method {
        CsiMethod::Probe => {
            unary(request, move |_: ProbeRequest| {
                Arc::clone(&shared).answer(method, |state| Ok(state.probe()))
            })
            .await
        }
        CsiMethod::GetPluginInfo => {
            unary(request, move |_: GetPluginInfoRequest| {
                Arc::clone(&shared).answer(method, |state| {
                    Ok(GetPluginInfoResponse {
                        name: state.name.clone(),
                        vendor_version: state.vendor_version.clone(),
                        manifest: HashMap::new(),
                    })
                })
            })
            .await
        }
        CsiMethod::GetPluginCapabilities => {
            unary(request, move |_: GetPluginCapabilitiesRequest| {
                Arc::clone(&shared).answer(method, |state| {
                    let capabilities = state
                        .plugin_capabilities
                        .iter()
                        .map(|service| PluginCapability {
                            r#type: Some(plugin_capability::Type::Service(
                                plugin_capability::Service {
                                    r#type: *service as i32,
                                },
                            )),
                        })
                        .collect();
                    Ok(GetPluginCapabilitiesResponse { capabilities })
                })
            })
            .await
        }
        CsiMethod::ControllerGetCapabilities => {
            unary(request, move |_: ControllerGetCapabilitiesRequest| {
                Arc::clone(&shared).answer(method, |state| {
                    let capabilities = state
                        .controller_capabilities
                        .iter()
                        .map(|rpc| ControllerServiceCapability {
                            r#type: Some(controller_service_capability::Type::Rpc(
                                controller_service_capability::Rpc {
                                    r#type: *rpc as i32,
                                },
                            )),
                        })
                        .collect();
                    Ok(ControllerGetCapabilitiesResponse { capabilities })
                })
            })
            .await
        }
        CsiMethod::CreateVolume => {
            unary(request, move |request: CreateVolumeRequest| {
                let shared = Arc::clone(&shared);
                shared.record_call(|state| state.last_create = Some(request.clone()));
                let name = Some(request.name.clone());
                shared.answer_for(method, name, move |state| {
                    state
                        .create_volume(&request)
                        .map(|volume| CreateVolumeResponse {
                            volume: Some(volume),
                        })
                })
            })
            .await
        }
        CsiMethod::DeleteVolume => {
            unary(request, move |request: DeleteVolumeRequest| {
                let shared = Arc::clone(&shared);
                shared.record_call(|state| state.last_delete = Some(request.clone()));
                shared.answer(method, move |state| {
                    state
                        .delete_volume(&request)
                        .map(|()| DeleteVolumeResponse {})
                })
            })
            .await
        }
    };
    Ok(response)
}

/// Decodes one request, runs `handler`, encodes its answer (tonic's server half, no codegen).
async fn unary<Req, Resp, F, Fut>(
    request: http::Request<Incoming>,
    handler: F,
) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: Fn(Req) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    let service = tower::service_fn(move |request: tonic::Request<Req>| {
        let answer = handler(request.into_inner());
        async move { answer.await.map(tonic::Response::new) }
    });
    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
    grpc.unary(service, request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(name: &str, required_bytes: i64) -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability::default()],
            ..CreateVolumeRequest::default()
        }
    }

    #[test]
    fn create_is_idempotent_by_name_and_checks_capacity() {
        let mut state = State::new("x");
        let first = state.create_volume(&create("a", 10)).unwrap();
        let again = state.create_volume(&create("a", 5)).unwrap();
        assert_eq!(first.volume_id, again.volume_id);
        assert_eq!(again.capacity_bytes, 10);
        let error = state.create_volume(&create("a", 20)).unwrap_err();
        assert_eq!(error.code(), Code::AlreadyExists);
        let other = state.create_volume(&create("b", 0)).unwrap();
        assert_ne!(other.volume_id, first.volume_id);
        assert_eq!(other.capacity_bytes, DEFAULT_CAPACITY);
    }

    #[test]
    fn bad_requests_are_invalid_arguments() {
        let mut state = State::new("x");
        let mut no_capability = create("a", 1);
        no_capability.volume_capabilities.clear();
        for request in [create("", 1), no_capability] {
            let error = state.create_volume(&request).unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{error}");
        }
        let error = state
            .delete_volume(&DeleteVolumeRequest::default())
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument);
        assert!(state.volumes.is_empty());
    }

    #[test]
    fn topology_from_the_request_prefers_preferred() {
        let mut state = State::new("x");
        state.accessible_topology = AccessibleTopology::FromRequest;
        let zone = |zone: &str| Topology {
            segments: [("zone".to_owned(), zone.to_owned())].into(),
        };
        let mut request = create("a", 1);
        request.accessibility_requirements = Some(TopologyRequirement {
            requisite: vec![zone("a"), zone("b")],
            preferred: vec![zone("b")],
        });
        let volume = state.create_volume(&request).unwrap();
        assert_eq!(volume.accessible_topology, vec![zone("b")]);
    }

    #[tokio::test]
    async fn a_create_for_a_name_with_pending_work_is_aborted_until_it_lands() {
        use crate::csi::CsiDriver;
        let (mock, _socket) = MockCsiDriver::start("x").unwrap();
        let driver = mock.client(Duration::from_millis(100));
        let landing = Duration::from_millis(400);
        mock.script(CsiMethod::CreateVolume, [Answer::LandsAfter(landing)]);
        let timed_out = driver.create_volume(create("a", 1)).await.unwrap_err();
        assert_eq!(timed_out.code(), Code::DeadlineExceeded, "{timed_out}");
        // A replay while the work is pending makes nothing; another name is not held.
        let replay = driver.create_volume(create("a", 1)).await.unwrap_err();
        assert_eq!(replay.code(), Code::Aborted, "{replay}");
        assert!(replay.message().contains("pending"), "{replay}");
        assert_eq!(mock.volume_count(), 0);
        driver.create_volume(create("b", 1)).await.unwrap();
        mock.wait_until(|mock| mock.volume("a").is_some()).await;
        // Landed: the replay answers the same volume, and one volume of that name exists.
        let landed = mock.volume("a").unwrap();
        let again = driver.create_volume(create("a", 1)).await.unwrap();
        assert_eq!(again.volume.unwrap().volume_id, landed.id);
        assert_eq!(mock.volume_count(), 2);
        assert_eq!(mock.calls(CsiMethod::CreateVolume), 4);
    }

    #[test]
    fn methods_display_their_rpc_names() {
        assert_eq!(CsiMethod::CreateVolume.to_string(), "CreateVolume");
        assert_eq!(
            CsiMethod::from_path("/csi.v1.Identity/Probe"),
            Some(CsiMethod::Probe)
        );
    }
}
