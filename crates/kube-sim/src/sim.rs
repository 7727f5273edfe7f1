//! [`Builder`] and the running [`KubeSim`] handle.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tempfile::TempDir;
use tokio::task::JoinHandle;

use crate::conn::CountingListener;
use crate::error::{Error, Result};
use crate::fault::FaultRule;
use crate::load::{Gate, LoadModel, RequestCount};
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
    protection_finalizers: Option<bool>,
    history_window: usize,
    port: u16,
    kubeconfig_path: Option<PathBuf>,
    request_log_limit: usize,
    bookmark_interval: Duration,
    load: LoadModel,
    rbac: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            pv_binder: false,
            protection_finalizers: None,
            history_window: Self::DEFAULT_HISTORY_WINDOW,
            port: 0,
            kubeconfig_path: None,
            request_log_limit: Self::DEFAULT_REQUEST_LOG_LIMIT,
            bookmark_interval: Self::DEFAULT_BOOKMARK_INTERVAL,
            load: LoadModel::none(),
            rbac: false,
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

    /// Runs the PV binder, which plays kube-controller-manager: claims get
    /// storage-provisioner annotations, PVs with a claimRef bind, PVs of deleted claims
    /// become Released, and the protection finalizers go once nothing needs them (see
    /// [`Builder::protection_finalizers`]). Default off.
    pub fn pv_binder(mut self, on: bool) -> Self {
        self.pv_binder = on;
        self
    }

    /// Protection finalizers, as a real cluster has them: each claim gets
    /// `kubernetes.io/pvc-protection` and each PV `kubernetes.io/pv-protection` at its
    /// creation (the `StorageObjectInUseProtection` admission plugin), and
    /// kube-controller-manager's pvc-protection and pv-protection controllers are played:
    /// they remove them, a claim's once it is being deleted (the sim has no pods, so no pod
    /// uses it), a PV's once it is being deleted and not `Bound`, and put one back when
    /// someone removes it from an object that is not being deleted. So a deleted claim or PV
    /// is Terminating first, as on a real cluster.
    ///
    /// Default: on with the [PV binder](Self::pv_binder), off without it (tests that
    /// delete claims and volumes see them gone at once). The `kube-sim` server binary
    /// switches it on whatever `--pv-binder` says, as a real server has them. Switch it off
    /// to keep a PV binder whose deletes take effect at once; switched on without the
    /// binder, the protection controllers run alone.
    pub fn protection_finalizers(mut self, on: bool) -> Self {
        self.protection_finalizers = Some(on);
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

    /// What requests cost: latency per verb class growing with the requests in flight,
    /// watch delivery delay, bounds on requests in flight answered with `429`. Default
    /// [`LoadModel::none`] (answers at once, no bounds); [`LoadModel::realistic`] costs what
    /// a real kube-apiserver does. The PV binder's requests go through the same model.
    pub fn load(mut self, model: LoadModel) -> Self {
        self.load = model;
        self
    }

    /// Enforces RBAC on the requests of ServiceAccounts: a request carrying a token from
    /// [`KubeSim::service_account_config`] (or [`KubeSim::service_account_client`]) is
    /// allowed only when a stored Role or ClusterRole, bound to that ServiceAccount (by a
    /// RoleBinding in the request's namespace or a ClusterRoleBinding), has a rule for its
    /// verb, API group, resource (`res/sub` for a subresource) and, where the rule names
    /// them, the object's name; otherwise it is answered `403 Forbidden` with
    /// kube-apiserver's message (`... is forbidden: User "system:serviceaccount:ns:sa"
    /// cannot update resource "configmaps" in API group "" in the namespace "ns"`). A
    /// token the sim did not mint gets `401`. Requests without a token (the sim's
    /// [`client`](KubeSim::client), the PV binder, `kubectl` with the sim's kubeconfig) stay
    /// unrestricted, as an administrator's. Aggregated ClusterRoles are not expanded;
    /// discovery and the self reviews are open to everyone. Default off: nothing is checked.
    pub fn rbac(mut self, on: bool) -> Self {
        self.rbac = on;
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
        let mut shared = Shared::new(
            self.history_window,
            self.request_log_limit,
            self.bookmark_interval,
            addr.to_string(),
        );
        shared.rbac = self.rbac;
        let shared = Arc::new(shared);
        let protection = self.protection_finalizers.unwrap_or(self.pv_binder);
        shared.write(|state| {
            state.protection_finalizers = protection;
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

        let gate = Arc::new(Gate::new(self.load));
        let listener = CountingListener::new(listener, gate.clone());
        let router = http::router(http::Front {
            shared: shared.clone(),
            gate: gate.clone(),
            client: "client",
        });
        // The binder stands in for kube-controller-manager: its requests take the same
        // handlers (validation, faults, the cost model, the request log) without a
        // loopback TCP round trip.
        let in_process = kube_client::Client::new(
            http::router(http::Front {
                shared: shared.clone(),
                gate: gate.clone(),
                client: "pv-binder",
            }),
            "default",
        );
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
        let modes = binder::Modes {
            bind: self.pv_binder,
            protect: protection,
        };
        let binder =
            (self.pv_binder || protection).then(|| tokio::spawn(binder::run(in_process, modes)));
        tracing::debug!(%url, kubeconfig = %path.display(), "kube-sim started");
        Ok(KubeSim {
            shared,
            gate,
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
    gate: Arc<Gate>,
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

    /// A client configuration that authenticates as the ServiceAccount `namespace/name`
    /// (user `system:serviceaccount:<namespace>:<name>`) with a bearer token the sim mints,
    /// with `namespace` as its default namespace. With [`Builder::rbac`] on, its requests
    /// are checked against the RBAC objects stored in the sim; with it off the token is
    /// accepted and nothing is checked. The ServiceAccount object need not exist.
    #[must_use]
    pub fn service_account_config(&self, namespace: &str, name: &str) -> kube_client::Config {
        let user = crate::rbac::service_account_user(namespace, name);
        let token = self.shared.tokens().mint(&user);
        let uri: ::http::Uri = self
            .url
            .parse()
            .expect("a socket address makes a valid URL");
        let mut config = kube_client::Config::new(uri);
        config.default_namespace = namespace.to_owned();
        config.auth_info.token = Some(secrecy::SecretString::from(token));
        config
    }

    /// A client for [`service_account_config`](Self::service_account_config).
    ///
    /// # Errors
    /// [`Error::Client`] when the client cannot be built.
    pub fn service_account_client(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<kube_client::Client> {
        kube_client::Client::try_from(self.service_account_config(namespace, name))
            .map_err(Error::Client)
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

    /// How many requests of each verb, resource, code and client the sim answered since it
    /// started (the PV binder's under client `pv-binder`). Unlike [`KubeSim::requests`] it
    /// is never trimmed; `GET /metrics` serves the same counters.
    #[must_use]
    pub fn request_counts(&self) -> Vec<RequestCount> {
        self.gate.request_counts()
    }

    /// Client connections open now (on the socket: the PV binder has none). Each costs
    /// the server [`LoadModel::per_connection`]; `GET /metrics` serves it as
    /// `kube_sim_open_connections`.
    #[must_use]
    pub fn open_connections(&self) -> usize {
        self.gate.connections()
    }

    /// The most client connections open at once since the sim started
    /// (`kube_sim_open_connections_peak` at `/metrics`).
    #[must_use]
    pub fn peak_connections(&self) -> usize {
        self.gate.peak_connections()
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

#[cfg(test)]
mod load_tests {
    //! The cost model through the HTTP front, with an in-process client (as the PV binder
    //! uses) so paused time cannot race a socket.

    use std::time::Duration;

    use http_body_util::BodyExt as _;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube_client::api::{Api, PostParams};
    use serde_json::{Value, json};
    use tokio::time::Instant;

    use super::*;
    use crate::load::Cost;

    fn in_process(sim: &KubeSim) -> kube_client::Client {
        let router = http::router(http::Front {
            shared: sim.shared.clone(),
            gate: sim.gate.clone(),
            client: "client",
        });
        kube_client::Client::new(router, "default")
    }

    fn volume(name: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/tmp"},
            },
        }))
        .unwrap()
    }

    async fn post(client: &kube_client::Client, name: &str) -> (u16, Option<String>, Value) {
        let body = serde_json::to_vec(&volume(name)).unwrap();
        let request = ::http::Request::post("/api/v1/persistentvolumes")
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        let resp = client.send(request.map(Into::into)).await.unwrap();
        let retry_after = resp
            .headers()
            .get(::http::header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (code, retry_after, serde_json::from_slice(&body).unwrap())
    }

    /// Yields (without letting paused time move) until `n` requests are in flight.
    async fn until_in_flight(sim: &KubeSim, n: usize) {
        for _ in 0..100_000 {
            if sim.gate.in_flight() >= n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{} requests in flight, wanted {n}", sim.gate.in_flight());
    }

    #[tokio::test(start_paused = true)]
    async fn writes_past_the_in_flight_bound_get_429_with_retry_after() {
        let load = LoadModel::none()
            .writes(Cost::fixed(Duration::from_secs(10)))
            .max_mutating_requests_inflight(2);
        let sim = KubeSim::builder().load(load).start().await.unwrap();
        let client = in_process(&sim);
        let held: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let client = client.clone();
                tokio::spawn(async move { post(&client, name).await })
            })
            .collect();
        until_in_flight(&sim, 2).await;
        let (code, retry_after, status) = post(&client, "c").await;
        assert_eq!((code, retry_after.as_deref()), (429, Some("1")), "{status}");
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(status["details"]["retryAfterSeconds"], 1);
        // Reads have their own bound (unbounded here) and are served meanwhile.
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        assert!(volumes.get_opt("c").await.unwrap().is_none());
        for task in held {
            assert_eq!(task.await.unwrap().0, 201);
        }
        // The slots are free again.
        assert_eq!(post(&client, "c").await.0, 201);
        let refused: u64 = sim
            .request_counts()
            .iter()
            .filter(|c| c.code == 429)
            .map(|c| c.count)
            .sum();
        assert_eq!(refused, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_takes_at_least_its_fixed_latency() {
        let latency = Duration::from_millis(250);
        let load = LoadModel::none().writes(Cost::fixed(latency));
        let sim = KubeSim::builder().load(load).start().await.unwrap();
        let volumes: Api<PersistentVolume> = Api::all(in_process(&sim));
        let started = Instant::now();
        volumes
            .create(&PostParams::default(), &volume("a"))
            .await
            .unwrap();
        assert!(started.elapsed() >= latency, "{:?}", started.elapsed());
        // Reads cost nothing in this model.
        let started = Instant::now();
        volumes.get("a").await.unwrap();
        assert!(started.elapsed() < latency, "{:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_event_arrives_after_the_delivery_delay() {
        use futures::StreamExt as _;
        use kube_client::api::WatchParams;

        let delay = Duration::from_millis(400);
        let load = LoadModel::none().watch_delivery(Cost::fixed(delay));
        let sim = KubeSim::builder().load(load).start().await.unwrap();
        let volumes: Api<PersistentVolume> = Api::all(in_process(&sim));
        let rv = sim.resource_version().to_string();
        let mut events = volumes
            .watch(&WatchParams::default(), &rv)
            .await
            .unwrap()
            .boxed();
        let written = Instant::now();
        volumes
            .create(&PostParams::default(), &volume("a"))
            .await
            .unwrap();
        let event = events.next().await.unwrap().unwrap();
        assert!(matches!(event, kube_client::api::WatchEvent::Added(_)));
        assert!(written.elapsed() >= delay, "{:?}", written.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_patch_takes_the_patch_cost_and_a_create_the_write_cost() {
        use kube_client::api::{Patch, PatchParams};

        let (write, patch) = (Duration::from_millis(100), Duration::from_millis(300));
        let load = LoadModel::none()
            .writes(Cost::fixed(write))
            .patches(Cost::fixed(patch));
        let sim = KubeSim::builder().load(load).start().await.unwrap();
        let volumes: Api<PersistentVolume> = Api::all(in_process(&sim));
        let started = Instant::now();
        volumes
            .create(&PostParams::default(), &volume("a"))
            .await
            .unwrap();
        let created_in = started.elapsed();
        assert!((write..patch).contains(&created_in), "{created_in:?}");
        let body = json!({"metadata": {"labels": {"a": "b"}}});
        for kind in [Patch::Merge(&body), Patch::Strategic(&body)] {
            let started = Instant::now();
            volumes
                .patch("a", &PatchParams::default(), &kind)
                .await
                .unwrap();
            assert!(started.elapsed() >= patch, "{:?}", started.elapsed());
        }
    }

    #[tokio::test]
    async fn open_connections_are_counted_until_closed() {
        let sim = KubeSim::start().await.unwrap();
        let addr = sim.url().trim_start_matches("http://").to_owned();
        let until = |want: usize| {
            let sim = &sim;
            async move {
                for _ in 0..500 {
                    if sim.open_connections() == want {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("{} connections open, wanted {want}", sim.open_connections());
            }
        };
        until(0).await;
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
        }
        until(3).await;
        conns.truncate(1);
        until(1).await;
        assert_eq!(sim.peak_connections(), 3);
        // Served at /metrics too (the request's own connection counts).
        let request = ::http::Request::get("/metrics").body(Vec::new()).unwrap();
        let resp = sim.client().send(request.map(Into::into)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains("kube_sim_open_connections 2\n"), "{text}");
        assert!(
            text.contains("kube_sim_open_connections_peak 3\n"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn requests_are_counted_by_verb_and_served_as_metrics() {
        let sim = KubeSim::start().await.unwrap();
        let volumes: Api<PersistentVolume> = Api::all(sim.client());
        for name in ["a", "b"] {
            volumes
                .create(&PostParams::default(), &volume(name))
                .await
                .unwrap();
        }
        volumes.get("a").await.unwrap();
        assert!(volumes.get("x").await.is_err());
        let count = |verb: &str, code: u16| {
            sim.request_counts()
                .iter()
                .filter(|c| c.verb == verb && c.resource == "persistentvolumes" && c.code == code)
                .map(|c| c.count)
                .sum::<u64>()
        };
        assert_eq!(count("create", 201), 2);
        assert_eq!(count("get", 200), 1);
        assert_eq!(count("get", 404), 1);
        let request = ::http::Request::get("/metrics").body(Vec::new()).unwrap();
        let resp = sim.client().send(request.map(Into::into)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains(
                "kube_sim_requests_total{verb=\"create\",resource=\"persistentvolumes\",subresource=\"\",code=\"201\",client=\"client\"} 2"
            ),
            "{text}"
        );
    }
}
