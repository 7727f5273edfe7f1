//! [`GrpcCsi`]: the [`CsiDriver`] of a real driver on a unix socket.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use super::CsiDriver;
use super::messages::*;

/// The prefix of a unix socket address (`unix:///csi/csi.sock`).
const UNIX_PREFIX: &str = "unix://";

/// An address [`GrpcCsi::new`] cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// The address is empty.
    #[error("the CSI address is empty: give the driver's unix socket, e.g. unix:///csi/csi.sock")]
    Empty,
    /// The address is not a unix socket (a TCP address, another scheme).
    #[error(
        "the CSI address {0:?} is not a unix socket: give unix:///path/to/csi.sock or an absolute path"
    )]
    NotUnix(String),
}

/// The socket path of a `--csi-address` as upstream accepts it: `unix:///csi/csi.sock` and
/// `/csi/csi.sock` name `/csi/csi.sock`; `unix://csi.sock` names `csi.sock` relative to the
/// working directory.
///
/// # Errors
/// [`AddressError`] for an empty address and for anything that is not a unix socket (upstream
/// also dials TCP addresses; this sidecar talks to the driver in its pod only).
///
/// ```
/// use csi_provisioner::csi::socket_path;
/// assert_eq!(socket_path("unix:///csi/csi.sock").unwrap(), std::path::Path::new("/csi/csi.sock"));
/// assert_eq!(socket_path("/csi/csi.sock").unwrap(), std::path::Path::new("/csi/csi.sock"));
/// assert!(socket_path("localhost:10000").is_err());
/// ```
pub fn socket_path(address: &str) -> Result<PathBuf, AddressError> {
    let address = address.trim();
    if address.is_empty() {
        return Err(AddressError::Empty);
    }
    if address.starts_with('/') {
        return Ok(PathBuf::from(address));
    }
    match address.strip_prefix(UNIX_PREFIX) {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        Some(_) => Err(AddressError::Empty),
        None => Err(AddressError::NotUnix(address.to_owned())),
    }
}

/// A CSI driver reached over gRPC on a unix socket (`--csi-address`).
///
/// The connection is made lazily, on the first call, and remade after it is lost: a driver
/// that restarts on the same socket is reachable again by the same `GrpcCsi` (the calls made
/// while it is away fail with [`Code::Unavailable`]). Upstream's sidecar exits when it loses
/// the connection and relies on the kubelet to restart it; this one keeps running, since
/// provision-controller's journal already carries every volume that may be in flight.
///
/// Every call is bounded by the call timeout (upstream's `--timeout`): the deadline is sent
/// to the driver (`grpc-timeout`) and enforced here too, so a driver that never answers gives
/// [`Code::DeadlineExceeded`] after the timeout, never a hung worker. Errors keep the
/// driver's code and name the call and the socket. Requests are never logged with their
/// secrets (their `Debug` forms redact them).
///
/// Cloning is cheap and clones share the connection.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use csi_provisioner::csi::{CsiDriver, GrpcCsi};
/// use std::time::Duration;
///
/// let driver = GrpcCsi::new("unix:///csi/csi.sock", Duration::from_secs(10))?;
/// let info = driver.get_plugin_info().await?;
/// println!("driver {} {}", info.name, info.vendor_version);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct GrpcCsi {
    channel: Channel,
    socket: Arc<PathBuf>,
    call_timeout: Duration,
}

impl fmt::Debug for GrpcCsi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcCsi")
            .field("socket", &self.socket)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// The gRPC methods, by the name the errors give them.
#[derive(Clone, Copy)]
struct Method {
    name: &'static str,
    path: &'static str,
}

const PROBE: Method = Method {
    name: "Probe",
    path: "/csi.v1.Identity/Probe",
};
const GET_PLUGIN_INFO: Method = Method {
    name: "GetPluginInfo",
    path: "/csi.v1.Identity/GetPluginInfo",
};
const GET_PLUGIN_CAPABILITIES: Method = Method {
    name: "GetPluginCapabilities",
    path: "/csi.v1.Identity/GetPluginCapabilities",
};
const CONTROLLER_GET_CAPABILITIES: Method = Method {
    name: "ControllerGetCapabilities",
    path: "/csi.v1.Controller/ControllerGetCapabilities",
};
const CREATE_VOLUME: Method = Method {
    name: "CreateVolume",
    path: "/csi.v1.Controller/CreateVolume",
};
const DELETE_VOLUME: Method = Method {
    name: "DeleteVolume",
    path: "/csi.v1.Controller/DeleteVolume",
};

impl GrpcCsi {
    /// A client of the driver at `address` (`unix:///csi/csi.sock` or `/csi/csi.sock`), each
    /// call bounded by `call_timeout`. Nothing is dialled yet: the first call connects (see
    /// [`crate::start`] to wait for the driver before using it).
    ///
    /// Must be called inside a tokio runtime (the channel runs a task of its own).
    ///
    /// # Errors
    /// [`AddressError`] when `address` is not a unix socket address.
    pub fn new(address: &str, call_timeout: Duration) -> Result<Self, AddressError> {
        let socket = Arc::new(socket_path(address)?);
        // The authority is not used to route anything on a unix socket; gRPC needs one.
        let endpoint = Endpoint::from_static("http://localhost");
        let path = Arc::clone(&socket);
        let connector = tower::service_fn(move |_: Uri| {
            let path = Arc::clone(&path);
            async move {
                match tokio::net::UnixStream::connect(path.as_path()).await {
                    Ok(stream) => Ok(TokioIo::new(stream)),
                    Err(error) => Err(std::io::Error::new(
                        error.kind(),
                        format!("cannot connect to {}: {error}", path.display()),
                    )),
                }
            }
        });
        let channel = endpoint.connect_with_connector_lazy(connector);
        Ok(Self {
            channel,
            socket,
            call_timeout,
        })
    }

    /// The driver's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The bound of each call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    async fn unary<Req, Resp>(&self, method: Method, message: Req) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.call_timeout);
        let call = async {
            grpc.ready().await.map_err(|error| {
                Status::unavailable(format!("the connection is not ready: {error}"))
            })?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(request, PathAndQuery::from_static(method.path), codec)
                .await
        };
        let outcome = match tokio::time::timeout(self.call_timeout, call).await {
            Ok(outcome) => outcome,
            Err(_) => return Err(self.timed_out(method)),
        };
        match outcome {
            Ok(response) => Ok(response.into_inner()),
            // tonic's channel enforces the deadline it sends and reports it as `Cancelled`:
            // for the caller it is the same timeout.
            Err(status) if is_client_timeout(&status) => Err(self.timed_out(method)),
            // The connection broke under the call (the driver died or closed it): the
            // driver may have done the work. grpc-go, which upstream's sidecar uses, calls
            // this `Unavailable`, a code that says "may still be in progress"; tonic says
            // `Unknown`, which would read as final.
            Err(status) if is_transport_error(&status) => Err(Status::unavailable(format!(
                "{} on the CSI driver at {}: the connection was lost during the call ({})",
                method.name,
                self.socket.display(),
                error_chain(&status)
            ))),
            Err(status) => {
                tracing::debug!(
                    call = method.name,
                    socket = %self.socket.display(),
                    code = ?status.code(),
                    message = status.message(),
                    "CSI call failed"
                );
                Err(self.with_context(method, status))
            }
        }
    }

    fn timed_out(&self, method: Method) -> Status {
        Status::deadline_exceeded(format!(
            "{} to the CSI driver at {} got no answer within {:?} (the call timeout)",
            method.name,
            self.socket.display(),
            self.call_timeout
        ))
    }

    /// The driver's status, its code kept, its message naming the call and the socket.
    fn with_context(&self, method: Method, status: Status) -> Status {
        let message = match status.code() {
            // A status made on this side of the socket: say so.
            Code::Unavailable if status.message().is_empty() => {
                format!("the CSI driver at {} is unavailable", self.socket.display())
            }
            _ => status.message().to_owned(),
        };
        Status::with_details_and_metadata(
            status.code(),
            format!(
                "{} on the CSI driver at {}: {message}",
                method.name,
                self.socket.display()
            ),
            status.details().to_vec().into(),
            status.metadata().clone(),
        )
    }
}

/// Whether `status` was made on this side from a transport error rather than answered by
/// the driver (a driver's answer carries no source error).
fn is_transport_error(status: &Status) -> bool {
    status.code() == Code::Unknown && std::error::Error::source(status).is_some()
}

/// `status`'s message and the causes under it, for a one-line error.
fn error_chain(status: &Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        let cause = error.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = error.source();
    }
    text
}

/// Whether `status` is tonic's own "the deadline passed" (`Cancelled` from its timeout layer),
/// not an answer of the driver.
fn is_client_timeout(status: &Status) -> bool {
    status.code() == Code::Cancelled
        && std::error::Error::source(status).is_some_and(|source| {
            let mut source = Some(source);
            while let Some(error) = source {
                if error.is::<tonic::TimeoutExpired>() {
                    return true;
                }
                source = error.source();
            }
            false
        })
}

#[async_trait]
impl CsiDriver for GrpcCsi {
    async fn probe(&self) -> Result<ProbeResponse, Status> {
        self.unary(PROBE, ProbeRequest {}).await
    }

    async fn get_plugin_info(&self) -> Result<GetPluginInfoResponse, Status> {
        self.unary(GET_PLUGIN_INFO, GetPluginInfoRequest {}).await
    }

    async fn get_plugin_capabilities(&self) -> Result<GetPluginCapabilitiesResponse, Status> {
        self.unary(GET_PLUGIN_CAPABILITIES, GetPluginCapabilitiesRequest {})
            .await
    }

    async fn controller_get_capabilities(
        &self,
    ) -> Result<ControllerGetCapabilitiesResponse, Status> {
        self.unary(
            CONTROLLER_GET_CAPABILITIES,
            ControllerGetCapabilitiesRequest {},
        )
        .await
    }

    async fn create_volume(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, Status> {
        self.unary(CREATE_VOLUME, request).await
    }

    async fn delete_volume(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, Status> {
        self.unary(DELETE_VOLUME, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_as_upstream_reads_them() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("/csi/csi.sock").unwrap(),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix://csi.sock").unwrap(),
            Path::new("csi.sock")
        );
        assert_eq!(socket_path(" ").unwrap_err(), AddressError::Empty);
        assert_eq!(socket_path("unix://").unwrap_err(), AddressError::Empty);
        let error = socket_path("dns:///driver:10000").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("\"dns:///driver:10000\" is not a unix socket"),
            "{error}"
        );
    }
}
