//! [`Builder`] and the running [`KubeSim`] handle.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tempfile::TempDir;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::fault::FaultRule;
use crate::ops::Scope;
use crate::requests::RequestRecord;
use crate::shared::Shared;
use crate::{binder, http, kubeconfig};

/// Namespaces that exist when the sim starts.
pub const INITIAL_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Options for a [`KubeSim`]; every option has a documented default.
#[derive(Clone, Debug)]
#[must_use]
pub struct Builder {
    pv_binder: bool,
    history_window: usize,
    port: u16,
    kubeconfig_path: Option<PathBuf>,
    request_log_limit: usize,
    bookmark_interval: Duration,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            pv_binder: false,
            history_window: Self::DEFAULT_HISTORY_WINDOW,
            port: 0,
            kubeconfig_path: None,
            request_log_limit: Self::DEFAULT_REQUEST_LOG_LIMIT,
            bookmark_interval: Self::DEFAULT_BOOKMARK_INTERVAL,
        }
    }
}

impl Builder {
    /// Default for [`Builder::history_window`].
    pub const DEFAULT_HISTORY_WINDOW: usize = 10_000;
    /// Default for [`Builder::request_log_limit`].
    pub const DEFAULT_REQUEST_LOG_LIMIT: usize = 100_000;
    /// Default for [`Builder::bookmark_interval`].
    pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

    /// Runs the PV binder (claims get storage-provisioner annotations, PVs with a claimRef
    /// bind, PVs of deleted claims become Released). Default off.
    pub fn pv_binder(mut self, on: bool) -> Self {
        self.pv_binder = on;
        self
    }

    /// How many watch events are kept for watches resuming from a resourceVersion; older
    /// versions get `410 Expired`. Default [`Self::DEFAULT_HISTORY_WINDOW`]; at least 1.
    pub fn history_window(mut self, events: usize) -> Self {
        self.history_window = events;
        self
    }

    /// The loopback port to listen on. Default 0: the OS picks a free port.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Writes the kubeconfig to `path` (kept after the sim stops) instead of a temporary
    /// directory that is removed when the sim is dropped.
    pub fn kubeconfig_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig_path = Some(path.into());
        self
    }

    /// How many requests [`KubeSim::requests`] keeps (the oldest are dropped); 0 keeps none.
    /// Default [`Self::DEFAULT_REQUEST_LOG_LIMIT`].
    pub fn request_log_limit(mut self, records: usize) -> Self {
        self.request_log_limit = records;
        self
    }

    /// How often an idle watch that allows bookmarks gets a BOOKMARK event.
    /// Default [`Self::DEFAULT_BOOKMARK_INTERVAL`].
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// Binds `127.0.0.1`, starts serving, writes the kubeconfig and builds the client.
    ///
    /// Must be called inside a Tokio runtime; the server runs on spawned tasks.
    ///
    /// # Errors
    /// [`Error::Bind`] when the port is taken, [`Error::Kubeconfig`] when the kubeconfig
    /// cannot be written, [`Error::Client`] when the client cannot be built.
    pub async fn start(self) -> Result<KubeSim> {
        let port = self.port;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|source| Error::Bind { port, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { port, source })?;
        let url = format!("http://{addr}");
        let shared = Arc::new(Shared::new(
            self.history_window,
            self.request_log_limit,
            self.bookmark_interval,
            addr.to_string(),
        ));
        shared.write(|state| {
            let def = state
                .registry
                .get("/namespaces")
                .expect("namespaces are built in");
            for ns in INITIAL_NAMESPACES {
                let scope = Scope {
                    def: &def,
                    version: "v1",
                    ns: "",
                    dry_run: false,
                    validation: crate::fields::FieldValidation::Strict,
                };
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                state
                    .create(&scope, obj)
                    .expect("the initial namespaces are valid");
            }
        });
        let (tempdir, path) = match self.kubeconfig_path {
            Some(path) => (None, path),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("kube-sim-")
                    .tempdir()
                    .map_err(|source| Error::Kubeconfig {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                let path = dir.path().join("kubeconfig");
                (Some(dir), path)
            }
        };
        std::fs::write(&path, kubeconfig::render(&url)).map_err(|source| Error::Kubeconfig {
            path: path.clone(),
            source,
        })?;
        let uri: ::http::Uri = url.parse().expect("a socket address makes a valid URL");
        let client =
            kube_client::Client::try_from(kube_client::Config::new(uri)).map_err(Error::Client)?;

        let router = http::router(shared.clone());
        // The binder stands in for kube-controller-manager: its requests take the same
        // handlers (validation, faults, the request log) without a loopback TCP round trip.
        let in_process = kube_client::Client::new(router.clone(), "default");
        let mut stop = shared.shutdown.subscribe();
        let server = tokio::spawn(async move {
            let graceful = async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            };
            if let Err(err) = axum::serve(listener, router)
                .with_graceful_shutdown(graceful)
                .await
            {
                tracing::warn!(error = %err, "kube-sim server stopped with an error");
            }
        });
        let binder = self
            .pv_binder
            .then(|| tokio::spawn(binder::run(in_process)));
        tracing::debug!(%url, kubeconfig = %path.display(), "kube-sim started");
        Ok(KubeSim {
            shared,
            url,
            client,
            kubeconfig: path,
            _tempdir: tempdir,
            server: Some(server),
            binder,
        })
    }
}

/// A running in-process Kubernetes API server.
///
/// Dropping it stops the server (without waiting); [`KubeSim::shutdown`] stops it and waits.
pub struct KubeSim {
    shared: Arc<Shared>,
    url: String,
    client: kube_client::Client,
    kubeconfig: PathBuf,
    _tempdir: Option<TempDir>,
    server: Option<JoinHandle<()>>,
    binder: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for KubeSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSim")
            .field("url", &self.url)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl KubeSim {
    /// A [`Builder`] with the defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Starts a sim with the defaults (no PV binder, OS-picked port).
    ///
    /// # Errors
    /// As [`Builder::start`].
    pub async fn start() -> Result<Self> {
        Builder::default().start().await
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client for the sim (cheap to clone; default namespace `default`).
    #[must_use]
    pub fn client(&self) -> kube_client::Client {
        self.client.clone()
    }

    /// The kubeconfig file pointing at the sim (context `kube-sim`).
    #[must_use]
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Adds a fault rule; rules are tried in the order they were added. The clock of a
    /// [`FaultRule::lasting`] rule starts now.
    pub fn add_fault(&self, mut rule: FaultRule) {
        rule.start(tokio::time::Instant::now());
        self.shared.faults().push(rule);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.shared.faults().clear();
    }

    /// Ends every open watch stream (clients see the stream close and re-watch).
    pub fn cut_watches(&self) {
        self.shared.cut.send_modify(|epoch| *epoch += 1);
    }

    /// Drops the kept watch history: a watch (or list continuation) from any earlier
    /// resourceVersion gets `410 Expired`, so clients relist. Open watches that are caught
    /// up keep streaming.
    pub fn compact(&self) {
        self.shared.write(|state| state.compact());
    }

    /// The logged requests, oldest first.
    #[must_use]
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log().snapshot()
    }

    /// Forgets the logged requests.
    pub fn clear_requests(&self) {
        self.shared.log().clear();
    }

    /// The number of stored objects of every type (including the initial namespaces).
    #[must_use]
    pub fn object_count(&self) -> usize {
        self.shared.state().object_count()
    }

    /// The newest resourceVersion handed out.
    #[must_use]
    pub fn resource_version(&self) -> u64 {
        self.shared.state().rv
    }

    /// Stops the server: ends open watches, lets in-flight requests finish (up to 5 s) and
    /// stops the PV binder.
    pub async fn shutdown(mut self) {
        if let Some(binder) = self.binder.take() {
            binder.abort();
        }
        self.shared.shutdown.send_replace(true);
        if let Some(mut server) = self.server.take()
            && tokio::time::timeout(Duration::from_secs(5), &mut server)
                .await
                .is_err()
        {
            server.abort();
        }
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        if let Some(binder) = self.binder.take() {
            binder.abort();
        }
        self.shared.shutdown.send_replace(true);
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}
