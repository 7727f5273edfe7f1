//! The sidecar's start: wait for the driver's socket, probe the driver until it is ready,
//! learn its name and capabilities, and refuse a driver that cannot create volumes.
//!
//! The sequence is upstream's (kubernetes-csi/external-provisioner's `main`, on
//! csi-lib-utils' `connection.Connect`, `rpc.ProbeForever`, `rpc.GetDriverName` and
//! `GetDriverCapabilities`), with two differences: waiting for the socket and probing are
//! each bounded by a timeout of the caller's (upstream waits 30 s for the connection and
//! probes forever), and the controller capabilities are checked here, once, instead of at
//! every provisioning. The library never exits: [`start`] returns a [`StartError`] and the
//! binary decides.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::csi::controller_service_capability::{self, RpcType};
use crate::csi::plugin_capability::{self, ServiceType};
use crate::csi::{Code, CsiDriver, Status};

/// How long [`start`] waits and how often it retries.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartConfig {
    /// How long to wait for the socket to exist and accept a connection (upstream: 30 s).
    pub socket_timeout: Duration,
    /// How long to probe before giving up on a driver that stays not ready.
    pub probe_timeout: Duration,
    /// The pause between two probes (upstream: 1 s) and the first pause between two socket
    /// attempts (growing to 1 s).
    pub retry_interval: Duration,
    /// The first interval between two "still waiting" log lines; each next one is twice as
    /// long, up to [`StartConfig::max_log_interval`].
    pub first_log_interval: Duration,
    /// The longest interval between two "still waiting" log lines.
    pub max_log_interval: Duration,
}

impl Default for StartConfig {
    fn default() -> Self {
        Self {
            socket_timeout: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(60),
            retry_interval: Duration::from_secs(1),
            first_log_interval: Duration::from_secs(1),
            max_log_interval: Duration::from_secs(30),
        }
    }
}

impl StartConfig {
    /// Sets [`StartConfig::socket_timeout`].
    #[must_use]
    pub fn socket_timeout(mut self, timeout: Duration) -> Self {
        self.socket_timeout = timeout;
        self
    }

    /// Sets [`StartConfig::probe_timeout`].
    #[must_use]
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// Sets [`StartConfig::retry_interval`].
    #[must_use]
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Sets the first and the longest interval between two "still waiting" log lines.
    #[must_use]
    pub fn log_intervals(mut self, first: Duration, max: Duration) -> Self {
        self.first_log_interval = first;
        self.max_log_interval = max;
        self
    }
}

/// What the driver told [`start`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// The driver's name (`GetPluginInfo`): the provisioner name StorageClasses name.
    pub name: String,
    /// The driver's version, for logs.
    pub vendor_version: String,
    /// What `GetPluginCapabilities` and `ControllerGetCapabilities` reported.
    pub capabilities: Capabilities,
}

/// The driver capabilities the sidecar acts on (upstream's `PluginCapabilitySet` and
/// `ControllerCapabilitySet`, reduced to what matters here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `CONTROLLER_SERVICE`: the driver serves the Controller service.
    pub controller_service: bool,
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`: volumes are not reachable from every node alike;
    /// CreateVolume gets accessibility requirements and the PV node affinity (with the
    /// `Topology` feature gate, as upstream).
    pub accessibility_constraints: bool,
    /// `CREATE_DELETE_VOLUME`: required by this sidecar.
    pub create_delete_volume: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`: volumes are attached (ControllerPublish) before use.
    pub publish_unpublish_volume: bool,
    /// `CLONE_VOLUME`: the driver can copy a volume.
    pub clone_volume: bool,
    /// `CREATE_DELETE_SNAPSHOT`: the driver makes snapshots.
    pub create_delete_snapshot: bool,
    /// `SINGLE_NODE_MULTI_WRITER`: the driver tells ReadWriteOnce (`SINGLE_NODE_MULTI_WRITER`)
    /// from ReadWriteOncePod (`SINGLE_NODE_SINGLE_WRITER`).
    pub single_node_multi_writer: bool,
}

/// Why [`start`] gave up on the driver. Each reads as one sentence naming the socket.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The socket did not exist or did not accept a connection in time.
    #[error(
        "the CSI driver socket {} did not accept a connection within {waited:?}: {source}",
        socket.display()
    )]
    Socket {
        /// The socket.
        socket: PathBuf,
        /// How long [`start`] waited.
        waited: Duration,
        /// The last connection error.
        source: std::io::Error,
    },
    /// The driver stayed not ready (or its probe kept timing out) for the probe timeout.
    #[error(
        "the CSI driver at {} was still not ready after {waited:?} of probing{}",
        socket.display(), last_error_suffix(last_error)
    )]
    NotReady {
        /// The socket.
        socket: PathBuf,
        /// How long [`start`] probed.
        waited: Duration,
        /// The last probe error, when the last probe failed rather than answered not ready.
        last_error: Option<Status>,
    },
    /// A call failed with an error that retrying would not fix.
    #[error(
        "the CSI driver at {} failed {call}: {} ({:?})",
        socket.display(), call_detail(socket, call, status), status.code()
    )]
    Call {
        /// The socket.
        socket: PathBuf,
        /// The call (`Probe`, `GetPluginInfo`, ...).
        call: &'static str,
        /// The driver's answer.
        status: Status,
    },
    /// `GetPluginInfo` gave no name.
    #[error(
        "the CSI driver at {} reported an empty name: the name is the provisioner name \
         StorageClasses ask for, so this sidecar cannot serve it",
        socket.display()
    )]
    EmptyName {
        /// The socket.
        socket: PathBuf,
    },
    /// The driver lacks a capability this sidecar requires.
    #[error(
        "the CSI driver at {} ({driver}) does not offer {capability}: this sidecar cannot \
         provision for it",
        socket.display()
    )]
    Missing {
        /// The socket.
        socket: PathBuf,
        /// The driver's name.
        driver: String,
        /// `CONTROLLER_SERVICE` or `CREATE_DELETE_VOLUME`.
        capability: &'static str,
    },
}

/// The status message without the "`call` on the CSI driver at `socket`: " that
/// [`GrpcCsi`](crate::csi::GrpcCsi) puts first (the error names them already).
fn call_detail<'a>(socket: &Path, call: &str, status: &'a Status) -> &'a str {
    let prefix = format!("{call} on the CSI driver at {}: ", socket.display());
    let message = status.message();
    message.strip_prefix(prefix.as_str()).unwrap_or(message)
}

fn last_error_suffix(last_error: &Option<Status>) -> String {
    match last_error {
        Some(status) => format!(" (last probe: {} ({:?}))", status.message(), status.code()),
        None => String::new(),
    }
}

/// Waits for the driver at `socket` and learns what it is: upstream's start sequence.
///
/// 1. Waits until `socket` exists and accepts a connection, retrying with a growing pause
///    (up to 1 s) and logging one line per growing interval ([`StartConfig`]).
/// 2. Calls `Probe` until the driver is ready (`ready` absent counts as ready), every
///    [`StartConfig::retry_interval`]; a not-ready answer, `DeadlineExceeded` and
///    `Unavailable` are retried until [`StartConfig::probe_timeout`], any other error ends
///    the start.
/// 3. `GetPluginInfo`: the name is the provisioner name and must not be empty.
/// 4. `GetPluginCapabilities` and `ControllerGetCapabilities`: `CONTROLLER_SERVICE` and
///    `CREATE_DELETE_VOLUME` are required.
///
/// `driver` is usually a [`GrpcCsi`](crate::csi::GrpcCsi) on `socket` (whose call timeout,
/// upstream's `--timeout`, bounds each call); tests may pass any [`CsiDriver`].
///
/// # Errors
/// A [`StartError`] that names the socket and what is missing. The library never exits: the
/// binary logs the error and exits.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use csi_provisioner::csi::GrpcCsi;
/// use csi_provisioner::start::{StartConfig, start};
/// use std::time::Duration;
///
/// let driver = GrpcCsi::new("unix:///csi/csi.sock", Duration::from_secs(10))?;
/// let info = start(&driver, driver.socket(), &StartConfig::default()).await?;
/// println!("provisioning for {}", info.name);
/// # Ok(()) }
/// ```
#[doc(alias = "Connect")]
#[doc(alias = "ProbeForever")]
#[doc(alias = "GetDriverName")]
#[doc(alias = "GetDriverCapabilities")]
pub async fn start(
    driver: &dyn CsiDriver,
    socket: &Path,
    config: &StartConfig,
) -> Result<DriverInfo, StartError> {
    wait_for_socket(socket, config).await?;
    probe_until_ready(driver, socket, config).await?;

    let call_error = |call: &'static str| {
        move |status: Status| StartError::Call {
            socket: socket.to_owned(),
            call,
            status,
        }
    };
    let info = driver
        .get_plugin_info()
        .await
        .map_err(call_error("GetPluginInfo"))?;
    if info.name.is_empty() {
        return Err(StartError::EmptyName {
            socket: socket.to_owned(),
        });
    }
    let plugin = driver
        .get_plugin_capabilities()
        .await
        .map_err(call_error("GetPluginCapabilities"))?;
    let controller = driver
        .controller_get_capabilities()
        .await
        .map_err(call_error("ControllerGetCapabilities"))?;

    let mut capabilities = Capabilities::default();
    for capability in &plugin.capabilities {
        if let Some(plugin_capability::Type::Service(service)) = &capability.r#type {
            match ServiceType::try_from(service.r#type) {
                Ok(ServiceType::ControllerService) => capabilities.controller_service = true,
                Ok(ServiceType::VolumeAccessibilityConstraints) => {
                    capabilities.accessibility_constraints = true;
                }
                _ => {}
            }
        }
    }
    for capability in &controller.capabilities {
        if let Some(controller_service_capability::Type::Rpc(rpc)) = &capability.r#type {
            match RpcType::try_from(rpc.r#type) {
                Ok(RpcType::CreateDeleteVolume) => capabilities.create_delete_volume = true,
                Ok(RpcType::PublishUnpublishVolume) => {
                    capabilities.publish_unpublish_volume = true;
                }
                Ok(RpcType::CloneVolume) => capabilities.clone_volume = true,
                Ok(RpcType::CreateDeleteSnapshot) => capabilities.create_delete_snapshot = true,
                Ok(RpcType::SingleNodeMultiWriter) => capabilities.single_node_multi_writer = true,
                _ => {}
            }
        }
    }
    let missing = |capability| StartError::Missing {
        socket: socket.to_owned(),
        driver: info.name.clone(),
        capability,
    };
    if !capabilities.controller_service {
        return Err(missing("the CONTROLLER_SERVICE plugin capability"));
    }
    if !capabilities.create_delete_volume {
        return Err(missing("CREATE_DELETE_VOLUME"));
    }
    tracing::info!(
        driver = %info.name,
        version = %info.vendor_version,
        socket = %socket.display(),
        ?capabilities,
        "CSI driver ready"
    );
    Ok(DriverInfo {
        name: info.name,
        vendor_version: info.vendor_version,
        capabilities,
    })
}

/// When to write the next "still waiting" line: after 1 s, then 2 s, 4 s ... capped.
#[derive(Debug)]
struct LogSchedule {
    next: Duration,
    interval: Duration,
    max: Duration,
}

impl LogSchedule {
    fn new(config: &StartConfig) -> Self {
        Self {
            next: config.first_log_interval,
            interval: config.first_log_interval,
            max: config.max_log_interval.max(config.first_log_interval),
        }
    }

    /// Whether a line is due after `elapsed`; if so the next one is set a doubled interval
    /// later.
    fn due(&mut self, elapsed: Duration) -> bool {
        if elapsed < self.next {
            return false;
        }
        self.interval = (self.interval * 2).min(self.max);
        self.next = elapsed + self.interval;
        true
    }
}

/// Step 1: the socket exists and accepts.
async fn wait_for_socket(socket: &Path, config: &StartConfig) -> Result<(), StartError> {
    let started = Instant::now();
    let mut schedule = LogSchedule::new(config);
    let mut pause = Duration::from_millis(10).min(config.retry_interval);
    loop {
        let error = match tokio::net::UnixStream::connect(socket).await {
            Ok(_) => {
                tracing::debug!(socket = %socket.display(), "CSI driver socket accepts");
                return Ok(());
            }
            Err(error) => error,
        };
        let elapsed = started.elapsed();
        if elapsed >= config.socket_timeout {
            return Err(StartError::Socket {
                socket: socket.to_owned(),
                waited: elapsed,
                source: error,
            });
        }
        if schedule.due(elapsed) {
            tracing::info!(
                socket = %socket.display(),
                waited = ?elapsed,
                %error,
                "still waiting for the CSI driver's socket"
            );
        }
        let left = config.socket_timeout - elapsed;
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(config.retry_interval.max(Duration::from_millis(10)));
    }
}

/// Step 2: `Probe` until ready.
async fn probe_until_ready(
    driver: &dyn CsiDriver,
    socket: &Path,
    config: &StartConfig,
) -> Result<(), StartError> {
    let started = Instant::now();
    let mut schedule = LogSchedule::new(config);
    loop {
        let last_error = match driver.probe().await {
            Ok(response) => match response.ready {
                None => return Ok(()),
                Some(ready) if ready.value => return Ok(()),
                Some(_) => None,
            },
            Err(status) if retry_probe(status.code()) => Some(status),
            Err(status) => {
                return Err(StartError::Call {
                    socket: socket.to_owned(),
                    call: "Probe",
                    status,
                });
            }
        };
        let elapsed = started.elapsed();
        if elapsed >= config.probe_timeout {
            return Err(StartError::NotReady {
                socket: socket.to_owned(),
                waited: elapsed,
                last_error,
            });
        }
        if schedule.due(elapsed) {
            tracing::info!(
                socket = %socket.display(),
                waited = ?elapsed,
                last_error = last_error.as_ref().map(|status| status.message()),
                "the CSI driver is not ready yet"
            );
        }
        let left = config.probe_timeout - elapsed;
        tokio::time::sleep(config.retry_interval.min(left)).await;
    }
}

/// Probe errors worth another probe: the driver is starting (upstream retries
/// `DeadlineExceeded`; `Unavailable` is a driver that is restarting on its socket).
fn retry_probe(code: Code) -> bool {
    matches!(code, Code::DeadlineExceeded | Code::Unavailable)
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (self.controller_service, "CONTROLLER_SERVICE"),
            (
                self.accessibility_constraints,
                "VOLUME_ACCESSIBILITY_CONSTRAINTS",
            ),
            (self.create_delete_volume, "CREATE_DELETE_VOLUME"),
            (self.publish_unpublish_volume, "PUBLISH_UNPUBLISH_VOLUME"),
            (self.clone_volume, "CLONE_VOLUME"),
            (self.create_delete_snapshot, "CREATE_DELETE_SNAPSHOT"),
            (self.single_node_multi_writer, "SINGLE_NODE_MULTI_WRITER"),
        ];
        let mut first = true;
        for (_, name) in names.iter().filter(|(on, _)| *on) {
            if !first {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
            first = false;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_come_at_growing_intervals() {
        let config =
            StartConfig::default().log_intervals(Duration::from_secs(1), Duration::from_secs(8));
        let mut schedule = LogSchedule::new(&config);
        let lines: Vec<u64> = (0..=40)
            .filter(|second| schedule.due(Duration::from_secs(*second)))
            .collect();
        // 1 s, then 2, 4, 8 and 8 s later.
        assert_eq!(lines, vec![1, 3, 7, 15, 23, 31, 39]);
    }

    #[test]
    fn capabilities_display_their_spec_names() {
        let capabilities = Capabilities {
            controller_service: true,
            create_delete_volume: true,
            ..Capabilities::default()
        };
        assert_eq!(
            capabilities.to_string(),
            "CONTROLLER_SERVICE, CREATE_DELETE_VOLUME"
        );
        assert_eq!(Capabilities::default().to_string(), "none");
    }

    #[test]
    fn missing_capability_reads_as_a_sentence() {
        let error = StartError::Missing {
            socket: PathBuf::from("/csi/csi.sock"),
            driver: "hostpath.csi.k8s.io".into(),
            capability: "CREATE_DELETE_VOLUME",
        };
        assert_eq!(
            error.to_string(),
            "the CSI driver at /csi/csi.sock (hostpath.csi.k8s.io) does not offer \
             CREATE_DELETE_VOLUME: this sidecar cannot provision for it"
        );
    }
}
