//! The metrics and probe endpoint: `GET <metrics path>` (Prometheus text), `/healthz` and
//! `/readyz`, served on every replica (leader and standbys alike).
//!
//! [`Health`] is the small shared handle the controller drives: it reports whether the
//! caches have synced and which [`Role`] the replica plays. `/readyz` answers 200 only when
//! the caches are synced *and* the replica leads or stands by; otherwise 503 with the reason.
//! `/healthz` answers 200 while the process runs.
//!
//! # Exposure
//! The server is plain HTTP without authentication; bind it where only the kubelet and
//! the scraper reach it (a NetworkPolicy, or a loopback address when nothing outside the
//! pod needs it). It bounds what a client can hold ([`HttpLimits`]): a connection that
//! does not send its request headers within 10 s is closed, and at most 64 connections
//! are served at once (more wait to be accepted).
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use prometheus_client::registry::Registry;
//! use kube_controller_kit::http::{Health, HttpServer, Role};
//! use tokio_util::sync::CancellationToken;
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Arc::new(Registry::default()); // metrics registered before it is shared
//! let health = Health::new();
//! let shutdown = CancellationToken::new();
//! let server = HttpServer::bind("0.0.0.0:8080".parse()?, "/metrics", registry, health.clone())
//!     .await?
//!     .spawn(shutdown.clone().cancelled_owned());
//! health.set_role(Role::Standby);
//! health.set_caches_synced(true); // now /readyz answers 200
//! shutdown.cancel();
//! server.join().await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::info;

use crate::leader::LeaderState;

mod serve;

pub use serve::HttpLimits;

/// The content type of the metrics response (what `prometheus_client` encodes).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The liveness probe path.
pub const HEALTHZ_PATH: &str = "/healthz";
/// The readiness probe path.
pub const READYZ_PATH: &str = "/readyz";

/// Errors of the metrics and probe server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The metrics path is not a plain absolute path or collides with a probe path.
    #[error("invalid metrics path {path:?}: {problem}")]
    InvalidPath {
        /// The path given.
        path: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The listening socket could not be opened.
    #[error("failed to bind the metrics server to {address}")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed. (Not returned today: accept errors, such as running out of file
    /// descriptors, are logged and retried.)
    #[error("metrics server on {address} failed")]
    Serve {
        /// The bound address.
        address: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The server task panicked or was cancelled.
    #[error("metrics server task on {address} did not finish")]
    Task {
        /// The bound address.
        address: SocketAddr,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// The part the replica plays, as far as readiness is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
#[non_exhaustive]
pub enum Role {
    /// Starting up: not ready.
    #[default]
    Starting = 0,
    /// Leading: ready (once caches are synced).
    Leading = 1,
    /// Standing by for the lease: ready (once caches are synced).
    Standby = 2,
    /// Shutting down or lost the lease: not ready.
    Stopping = 3,
}

impl From<&LeaderState> for Role {
    /// Leading → `Leading`, standby → `Standby`, lost or released → `Stopping`.
    fn from(state: &LeaderState) -> Self {
        match state {
            LeaderState::Leading => Self::Leading,
            LeaderState::Standby { .. } => Self::Standby,
            _ => Self::Stopping,
        }
    }
}

/// Why `/readyz` answers 503.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotReady {
    /// The caches have not synced yet.
    #[error("caches not synced")]
    CachesNotSynced,
    /// The controller is still starting.
    #[error("controller starting")]
    Starting,
    /// The controller is stopping (shutdown or lost lease).
    #[error("controller stopping")]
    Stopping,
    /// A condition another part of the process set with [`Health::set_unmet`] is unmet;
    /// the text says which and what to do.
    #[error("{0}")]
    Unmet(&'static str),
    /// Leader election cannot go on until a person acts (the Lease's namespace does not
    /// exist); set by a [`LeaderElector`](crate::leader::LeaderElector) given this handle
    /// with [`report_to`](crate::leader::LeaderElector::report_to). The text names the
    /// problem and what to do.
    #[error("{0}")]
    ElectionBlocked(String),
}

/// Shared, cheap-to-clone readiness state that the controller updates and the probes read.
#[derive(Debug, Clone, Default)]
pub struct Health {
    inner: Arc<HealthInner>,
}

#[derive(Debug)]
struct HealthInner {
    caches_synced: AtomicBool,
    role: tokio::sync::watch::Sender<Role>,
    /// Unmet conditions by name, with the text `/readyz` reports.
    unmet: Mutex<std::collections::BTreeMap<&'static str, &'static str>>,
    /// Why leader election cannot go on, if it cannot.
    election_blocked: Mutex<Option<String>>,
}

impl Default for HealthInner {
    fn default() -> Self {
        Self {
            caches_synced: AtomicBool::new(false),
            role: tokio::sync::watch::Sender::new(Role::Starting),
            unmet: Mutex::default(),
            election_blocked: Mutex::default(),
        }
    }
}

impl Health {
    /// Not synced, [`Role::Starting`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records whether the caches the controller reads (its reflector stores) have synced.
    pub fn set_caches_synced(&self, synced: bool) {
        self.inner.caches_synced.store(synced, Ordering::Release);
    }

    /// Whether the caches have synced.
    #[must_use]
    pub fn caches_synced(&self) -> bool {
        self.inner.caches_synced.load(Ordering::Acquire)
    }

    /// Records the replica's role.
    pub fn set_role(&self, role: Role) {
        self.inner.role.send_replace(role);
    }

    /// The replica's role.
    #[must_use]
    pub fn role(&self) -> Role {
        *self.inner.role.borrow()
    }

    /// Follows the replica's role: work that only the leader may do (another controller
    /// under the same election) runs while it is [`Role::Leading`].
    ///
    /// ```
    /// use kube_controller_kit::http::{Health, Role};
    ///
    /// let health = Health::new();
    /// let role = health.watch_role();
    /// health.set_role(Role::Leading);
    /// assert_eq!(*role.borrow(), Role::Leading);
    /// ```
    #[must_use]
    pub fn watch_role(&self) -> tokio::sync::watch::Receiver<Role> {
        self.inner.role.subscribe()
    }

    /// Whether the replica leads ([`Role::Leading`]), for another controller under the
    /// election of the controller that drives this handle; once every clone of this
    /// handle is dropped, never again.
    ///
    /// ```
    /// use kube_controller_kit::http::{Health, Role};
    ///
    /// let health = Health::new();
    /// let leading = health.leading();
    /// health.set_role(Role::Leading);
    /// assert!(leading.is_leading());
    /// health.set_role(Role::Stopping);
    /// assert!(!leading.is_leading());
    /// ```
    #[must_use]
    pub fn leading(&self) -> crate::leader::Leading {
        crate::leader::Leading::from_watch(self.watch_role(), |role| *role == Role::Leading)
    }

    /// Records that the condition `name` of another part of the process (a CRD it needs,
    /// say) is unmet, with the text `/readyz` reports (`Some`), or met again (`None`).
    ///
    /// ```
    /// use kube_controller_kit::http::{Health, NotReady, Role};
    ///
    /// let health = Health::new();
    /// health.set_role(Role::Leading);
    /// health.set_caches_synced(true);
    /// health.set_unmet("crd", Some("the CRD is not installed"));
    /// assert_eq!(health.readiness(), Err(NotReady::Unmet("the CRD is not installed")));
    /// health.set_unmet("crd", None);
    /// assert_eq!(health.readiness(), Ok(()));
    /// ```
    pub fn set_unmet(&self, name: &'static str, unmet: Option<&'static str>) {
        let mut conditions = self
            .inner
            .unmet
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match unmet {
            Some(text) => conditions.insert(name, text),
            None => conditions.remove(name),
        };
    }

    /// Records that leader election cannot go on until a person acts, with the text
    /// `/readyz` reports (`Some`), or that it can again (`None`). A
    /// [`LeaderElector`](crate::leader::LeaderElector) calls this when given the handle
    /// with [`report_to`](crate::leader::LeaderElector::report_to).
    ///
    /// ```
    /// use kube_controller_kit::http::{Health, NotReady, Role};
    ///
    /// let health = Health::new();
    /// health.set_role(Role::Standby);
    /// health.set_caches_synced(true);
    /// health.set_election_blocked(Some("namespace \"storage\" does not exist".into()));
    /// assert_eq!(
    ///     health.readiness(),
    ///     Err(NotReady::ElectionBlocked("namespace \"storage\" does not exist".into()))
    /// );
    /// health.set_election_blocked(None);
    /// assert_eq!(health.readiness(), Ok(()));
    /// ```
    pub fn set_election_blocked(&self, blocked: Option<String>) {
        *self
            .inner
            .election_blocked
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = blocked;
    }

    /// What `/readyz` reports.
    ///
    /// # Errors
    /// [`NotReady`] naming the first unmet condition: the role, then the caches, then a
    /// blocked election ([`set_election_blocked`](Self::set_election_blocked)), then the
    /// conditions set with [`set_unmet`](Self::set_unmet) (by name).
    pub fn readiness(&self) -> Result<(), NotReady> {
        match self.role() {
            Role::Starting => Err(NotReady::Starting),
            Role::Stopping => Err(NotReady::Stopping),
            Role::Leading | Role::Standby if !self.caches_synced() => {
                Err(NotReady::CachesNotSynced)
            }
            Role::Leading | Role::Standby => {
                let blocked = self
                    .inner
                    .election_blocked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                if let Some(text) = blocked {
                    return Err(NotReady::ElectionBlocked(text));
                }
                let conditions = self
                    .inner
                    .unmet
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match conditions.values().next() {
                    Some(text) => Err(NotReady::Unmet(text)),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Where the metrics text comes from: a `prometheus_client` [`Registry`] (shared as
/// `Arc<Registry>` or `Arc<Mutex<Registry>>`) or any encoding closure.
#[derive(Clone)]
pub struct MetricsSource(Arc<dyn Fn(&mut String) -> std::fmt::Result + Send + Sync>);

impl MetricsSource {
    /// Metrics written by `encode` (e.g. several registries one after another).
    pub fn from_fn(
        encode: impl Fn(&mut String) -> std::fmt::Result + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(encode))
    }

    /// Encodes the metrics into a new string.
    ///
    /// # Errors
    /// [`std::fmt::Error`] when an encoder fails.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        (self.0)(&mut out)?;
        Ok(out)
    }
}

impl std::fmt::Debug for MetricsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsSource").finish_non_exhaustive()
    }
}

impl From<Arc<Registry>> for MetricsSource {
    fn from(registry: Arc<Registry>) -> Self {
        Self::from_fn(move |out| prometheus_client::encoding::text::encode(out, &registry))
    }
}

impl From<Registry> for MetricsSource {
    fn from(registry: Registry) -> Self {
        Arc::new(registry).into()
    }
}

impl From<Arc<Mutex<Registry>>> for MetricsSource {
    fn from(registry: Arc<Mutex<Registry>>) -> Self {
        Self::from_fn(move |out| {
            let registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
            prometheus_client::encoding::text::encode(out, &registry)
        })
    }
}

#[derive(Clone)]
struct AppState {
    metrics: MetricsSource,
    health: Health,
}

/// A bound, not yet serving, metrics and probe server.
#[derive(Debug)]
pub struct HttpServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    router: Router,
    limits: HttpLimits,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port: see [`local_addr`](Self::local_addr)) and
    /// routes `GET metrics_path`, [`HEALTHZ_PATH`] and [`READYZ_PATH`].
    ///
    /// # Errors
    /// [`HttpError::InvalidPath`] when `metrics_path` is not `/` followed by segments of
    /// `[A-Za-z0-9._~-]`, or is a probe path; [`HttpError::Bind`] when the socket cannot
    /// be opened.
    pub async fn bind(
        addr: SocketAddr,
        metrics_path: &str,
        metrics: impl Into<MetricsSource>,
        health: Health,
    ) -> Result<Self, HttpError> {
        validate_path(metrics_path)?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| HttpError::Bind {
                address: addr,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| HttpError::Bind {
            address: addr,
            source,
        })?;
        let state = AppState {
            metrics: metrics.into(),
            health,
        };
        let router = Router::new()
            .route(metrics_path, get(metrics_handler))
            .route(HEALTHZ_PATH, get(healthz_handler))
            .route(READYZ_PATH, get(readyz_handler))
            .with_state(state);
        Ok(Self {
            listener,
            local_addr,
            router,
            limits: HttpLimits::default(),
        })
    }

    /// [`bind`](Self::bind) as a controller configuration usually asks for it (an address, a
    /// port, a path): `None` (server off) when `port` is 0, the Go provisioner library's
    /// default.
    ///
    /// # Errors
    /// As [`bind`](Self::bind).
    pub async fn bind_configured(
        address: IpAddr,
        port: u16,
        metrics_path: &str,
        metrics: impl Into<MetricsSource>,
        health: Health,
    ) -> Result<Option<Self>, HttpError> {
        if port == 0 {
            return Ok(None);
        }
        Self::bind(
            SocketAddr::new(address, port),
            metrics_path,
            metrics,
            health,
        )
        .await
        .map(Some)
    }

    /// The address the socket is bound to.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The connection limits to serve with. Default [`HttpLimits::default`]: 10 s to send
    /// the request headers, 64 connections at once.
    #[must_use]
    pub fn limits(mut self, limits: HttpLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Serves until `shutdown` completes, then stops accepting (the listener closes) and
    /// lets the open connections finish their requests, for at most the
    /// [header-read timeout](HttpLimits::header_read_timeout).
    ///
    /// # Errors
    /// None today (accept errors are logged and retried); the `Result` is kept for
    /// [`HttpError::Serve`].
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HttpError> {
        let address = self.local_addr;
        let limits = self.limits;
        info!(
            %address,
            header_read_timeout = ?limits.header_read_timeout,
            max_connections = limits.max_connections.get(),
            "serving metrics and probes"
        );
        serve::serve(self.listener, self.router, limits, shutdown).await;
        info!(%address, "metrics and probe server stopped");
        Ok(())
    }

    /// [`serve`](Self::serve) in a task owned by the returned handle.
    ///
    /// # Guarantees
    /// The task is joined by [`HttpServerHandle::join`] and aborted when the handle is
    /// dropped; it never outlives its handle.
    #[must_use = "dropping the handle stops the server"]
    pub fn spawn(self, shutdown: impl Future<Output = ()> + Send + 'static) -> HttpServerHandle {
        let local_addr = self.local_addr;
        HttpServerHandle {
            local_addr,
            task: Some(tokio::spawn(self.serve(shutdown))),
        }
    }
}

/// Owns a running server task (from [`HttpServer::spawn`]).
#[derive(Debug)]
pub struct HttpServerHandle {
    local_addr: SocketAddr,
    task: Option<JoinHandle<Result<(), HttpError>>>,
}

impl HttpServerHandle {
    /// The address the server listens on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits for the server to stop (after its shutdown future completed).
    ///
    /// # Errors
    /// The server's own error, or [`HttpError::Task`] when the task panicked.
    pub async fn join(mut self) -> Result<(), HttpError> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        task.await.map_err(|source| HttpError::Task {
            address: self.local_addr,
            source,
        })?
    }
}

impl Drop for HttpServerHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn validate_path(path: &str) -> Result<(), HttpError> {
    let invalid = |problem| {
        Err(HttpError::InvalidPath {
            path: path.to_owned(),
            problem,
        })
    };
    let Some(rest) = path.strip_prefix('/') else {
        return invalid("must start with '/'");
    };
    if path == HEALTHZ_PATH || path == READYZ_PATH {
        return invalid("is a probe path");
    }
    if rest.is_empty() {
        return Ok(());
    }
    for segment in rest.split('/') {
        if segment.is_empty() {
            return invalid("has an empty segment");
        }
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~');
        if !segment.chars().all(plain) {
            return invalid("may contain only letters, digits, '-', '.', '_', '~' and '/'");
        }
    }
    Ok(())
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed to encode metrics\n",
        )
            .into_response(),
    }
}

async fn healthz_handler() -> &'static str {
    "ok"
}

async fn readyz_handler(State(state): State<AppState>) -> Response {
    match state.health.readiness() {
        Ok(()) => "ok".into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_synced_caches_and_a_leading_or_standby_role() {
        let cases = [
            (Role::Starting, false, Err(NotReady::Starting)),
            (Role::Starting, true, Err(NotReady::Starting)),
            (Role::Leading, false, Err(NotReady::CachesNotSynced)),
            (Role::Standby, false, Err(NotReady::CachesNotSynced)),
            (Role::Leading, true, Ok(())),
            (Role::Standby, true, Ok(())),
            (Role::Stopping, true, Err(NotReady::Stopping)),
        ];
        for (role, synced, want) in cases {
            let health = Health::new();
            health.set_role(role);
            health.set_caches_synced(synced);
            assert_eq!(health.role(), role);
            assert_eq!(health.readiness(), want, "{role:?} synced={synced}");
        }
    }

    #[test]
    fn role_follows_leader_state() {
        assert_eq!(Role::from(&LeaderState::Leading), Role::Leading);
        assert_eq!(
            Role::from(&LeaderState::Standby { holder: None }),
            Role::Standby
        );
        assert_eq!(Role::from(&LeaderState::Released), Role::Stopping);
    }

    #[test]
    fn metrics_path_must_be_plain_and_not_a_probe() {
        for ok in ["/metrics", "/", "/a/b-c_d.e~f"] {
            assert!(validate_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "metrics", "", "/healthz", "/readyz", "/{id}", "/*rest", "/a//b", "/a/", "/:x",
        ] {
            let err = validate_path(bad).unwrap_err();
            assert!(matches!(err, HttpError::InvalidPath { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn shared_mutex_registry_encodes_with_eof_marker() {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let text = MetricsSource::from(registry).encode().unwrap();
        assert_eq!(text, "# EOF\n");
    }
}
