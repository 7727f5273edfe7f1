//! A `kube::Client` that is a light guest on the API server: one multiplexed HTTP/2
//! connection over TLS (negotiated by ALPN, HTTP/1.1 where the server offers no h2), and
//! [`InFlightLimit`], a bound on the requests a controller keeps in flight.
//!
//! `kube_client::Client::try_from(config)` speaks HTTP/1.1 only, so every request that
//! runs while another is in flight opens a connection of its own: a controller with 64
//! claim syncs, 64 volume syncs, event writers and watches holds well over a hundred
//! connections, and the API server pays for each. [`from_config`] builds the same client
//! (the config's TLS, authentication, impersonation, timeouts and default retries) on a
//! connection pool that negotiates HTTP/2, where every request and watch shares one
//! connection. It brings its own TLS stack (rustls with ring), so a driver needs no TLS
//! feature of `kube-client`.
//!
//! ```no_run
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! let (client, config) = kube_controller_kit::client::infer().await?;
//! // or, from a config you built: kube_controller_kit::client::from_config(config)?
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube_client::client::retry::RetryPolicy;
use kube_client::client::{Body, ConfigExt};
use kube_client::{Client, Config};
use tower::{BoxError, ServiceBuilder};

mod limit;

pub use limit::InFlightLimit;

/// How often an idle HTTP/2 connection is pinged, so a dead peer is noticed and watches on
/// a quiet connection are not cut by the read timeout.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No kubeconfig and no in-cluster service account were found, or they were unusable.
    /// `reason` says why, and never quotes a kubeconfig's content (it may hold a token or
    /// a key).
    #[error(
        "cannot find a usable Kubernetes configuration (kubeconfig or in-cluster service account): {reason}"
    )]
    Infer {
        /// Why inference failed.
        reason: String,
    },
    /// The API server did not answer ([`check`]): its cause in words follows in
    /// [`error::chain`](crate::error::chain) (connection refused, host not found, TLS:
    /// unknown issuer, a timeout).
    #[error("cannot reach the API server at {cluster_url}")]
    Unreachable {
        /// The API server the configuration names.
        cluster_url: String,
        /// What kube reported.
        #[source]
        source: kube_client::Error,
    },
    /// The API server answered [`check`] with an error status (401: the credentials were
    /// refused; 403: they may not read the server's version).
    #[error("the API server at {cluster_url} refused the client")]
    Refused {
        /// The API server the configuration names.
        cluster_url: String,
        /// The status it answered.
        #[source]
        source: kube_client::Error,
    },
    /// The configuration's TLS or authentication settings are unusable.
    #[error("cannot build a Kubernetes client for {cluster_url}")]
    Build {
        /// The API server the configuration names.
        cluster_url: String,
        /// What kube reported.
        #[source]
        source: kube_client::Error,
    },
}

/// Finds the configuration as `kube_client::Config::infer` does (the kubeconfig of
/// `KUBECONFIG` or `~/.kube/config`, else the in-cluster service account) and builds a
/// client from it with [`from_config`]. Returns the config too, for
/// [`for_leader_election`] or a second client.
///
/// This reads the environment (through kube's inference): call it from a binary, not
/// from a library.
///
/// # Errors
/// [`ClientError::Infer`] when no configuration is found, [`ClientError::Build`] when it
/// is unusable.
///
/// # Panics
/// Outside a Tokio runtime: the client spawns its buffer task.
pub async fn infer() -> Result<(Client, Config), ClientError> {
    let config = Config::infer().await.map_err(|error| ClientError::Infer {
        reason: infer_reason(&error, kubeconfig_path().as_deref()),
    })?;
    let client = from_config(config.clone())?;
    Ok((client, config))
}

/// Asks the API server of `config` for its version, so that a binary stops at start with
/// one clear line when the server cannot be reached or refuses the credentials, instead of
/// retrying in the background.
///
/// # Errors
/// [`ClientError::Unreachable`] when no answer came (connection refused, host not found,
/// TLS), [`ClientError::Refused`] when the server answered with an error status (401: the
/// credentials were refused). [`error::chain`](crate::error::chain) writes either as one
/// line with its cause in words.
pub async fn check(client: &Client, config: &Config) -> Result<(), ClientError> {
    let cluster_url = config.cluster_url.to_string();
    match client.apiserver_version().await {
        Ok(_) => Ok(()),
        Err(source @ kube_client::Error::Api(_)) => Err(ClientError::Refused {
            cluster_url,
            source,
        }),
        Err(source) => Err(ClientError::Unreachable {
            cluster_url,
            source,
        }),
    }
}

/// Builds a client from `config` that negotiates HTTP/2 with the API server and shares
/// one connection among all its requests and watches (clones of the client included).
///
/// Over `https` the TLS handshake offers `h2` and `http/1.1` (ALPN): a server that picks
/// HTTP/2 gets one multiplexed connection; one that does not gets HTTP/1.1, pooled as
/// `kube_client::Client::try_from` would. Plain `http` URLs (such as kube-sim's) speak
/// HTTP/1.1. The config's root certificates, client identity, `tls_server_name`,
/// `accept_invalid_certs`, authentication (tokens, exec plugins, certificates),
/// impersonation headers, connect/read/write timeouts and `default_retry` (429, 503 and 504
/// retried as the server asks) are honoured. A config with a `proxy_url` is handed to
/// `kube_client::Client::try_from` unchanged (HTTP/1.1, kube's proxy support).
///
/// Every call builds a new connection pool: build one client and clone it.
///
/// # Errors
/// [`ClientError::Build`] when the TLS material or authentication settings are unusable.
///
/// # Panics
/// Outside a Tokio runtime: the client spawns its buffer task.
pub fn from_config(config: Config) -> Result<Client, ClientError> {
    let cluster_url = config.cluster_url.to_string();
    build(config).map_err(|source| ClientError::Build {
        cluster_url,
        source,
    })
}

/// Builds a client for leader election alone, from the same `config` the workers use.
///
/// The client ([`from_config`]: HTTP/2 where the server offers it) has its own request
/// buffer and connection, so lease renewals never wait behind worker requests, and it
/// does not retry on its own (the elector bounds and retries its attempts itself).
///
/// # Errors
/// [`ClientError::Build`] when the TLS material or authentication settings are unusable.
///
/// # Panics
/// Outside a Tokio runtime: the client spawns its buffer task.
pub fn for_leader_election(config: &Config) -> Result<Client, ClientError> {
    let mut config = config.clone();
    config.default_retry = false;
    from_config(config)
}

pub(crate) fn build(config: Config) -> Result<Client, kube_client::Error> {
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name.clone().try_into().map_err(|err| {
            kube_client::Error::RustlsTls(kube_client::client::RustlsTlsError::InvalidServerName(
                err,
            ))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().enable_http2().wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);

    let pool = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build::<_, Body>(connector);

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(FirstConnection::new(pool));
    Ok(Client::new(service, config.default_namespace))
}

/// An error that may say the connection could not be made.
trait ConnectFailure {
    /// Whether no connection could be made (or the one in use broke before an answer).
    fn is_connect(&self) -> bool;
}

impl ConnectFailure for hyper_util::client::legacy::Error {
    fn is_connect(&self) -> bool {
        hyper_util::client::legacy::Error::is_connect(self)
    }
}

/// Sends requests through the connection pool one at a time until one has been answered,
/// then all at once.
///
/// The pool learns that a connection speaks HTTP/2 (and can carry every request) only once
/// it is made: requests that start together on a fresh client, as a controller's caches
/// and first syncs do, would each open a connection of their own. Letting the first one
/// through alone makes the others find the connection it opened. After a connection
/// failure the next request goes alone again (the API server restarted, say).
#[derive(Clone)]
struct FirstConnection<S> {
    inner: S,
    gate: Arc<Gate>,
}

struct Gate {
    /// A request was answered since the last connection failure.
    open: std::sync::atomic::AtomicBool,
    /// Held by the request that goes alone.
    alone: tokio::sync::Mutex<()>,
}

impl<S> FirstConnection<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            gate: Arc::new(Gate {
                open: std::sync::atomic::AtomicBool::new(false),
                alone: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

impl Gate {
    fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Opens the gate after an answer (or an error that is no connection failure), and
    /// closes it after a connection failure.
    fn learn<T, E: ConnectFailure>(&self, result: &Result<T, E>) {
        let open = !matches!(result, Err(error) if error.is_connect());
        self.open.store(open, std::sync::atomic::Ordering::Release);
    }
}

impl<S, B> tower::Service<Request<Body>> for FirstConnection<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: ConnectFailure + Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The service that was polled ready takes the call; a clone stays for the next.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let gate = self.gate.clone();
        if gate.is_open() {
            let call = inner.call(request);
            return Box::pin(async move {
                let result = call.await;
                if matches!(&result, Err(error) if error.is_connect()) {
                    gate.learn(&result);
                }
                result
            });
        }
        Box::pin(async move {
            let alone = gate.alone.lock().await;
            if gate.is_open() {
                // Another request was answered while this one waited.
                drop(alone);
                let result = inner.call(request).await;
                if matches!(&result, Err(error) if error.is_connect()) {
                    gate.learn(&result);
                }
                return result;
            }
            let result = inner.call(request).await;
            gate.learn(&result);
            result
        })
    }
}

/// The kubeconfig `Config::infer` reads: the first of `KUBECONFIG`'s files, else
/// `~/.kube/config` (only to name it in an error).
fn kubeconfig_path() -> Option<std::path::PathBuf> {
    match std::env::var_os("KUBECONFIG") {
        Some(paths) if !paths.is_empty() => std::env::split_paths(&paths).next(),
        _ => std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".kube/config")),
    }
}

/// Why `Config::infer` failed, without the text of a kubeconfig that does not parse (the
/// YAML parser's message quotes the offending line, which may hold a credential).
fn infer_reason(
    error: &kube_client::config::InferConfigError,
    path: Option<&std::path::Path>,
) -> String {
    use kube_client::config::KubeconfigError;
    let kubeconfig = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<KubeconfigError>());
    match kubeconfig {
        Some(kubeconfig) => format!(
            "{}; not in a cluster either",
            kubeconfig_reason(kubeconfig, path)
        ),
        None => error.to_string(),
    }
}

fn kubeconfig_reason(
    error: &kube_client::config::KubeconfigError,
    path: Option<&std::path::Path>,
) -> String {
    use kube_client::config::KubeconfigError;
    match error {
        KubeconfigError::ReadConfig(io, path) => {
            format!("cannot read the kubeconfig {}: {io}", path.display())
        }
        KubeconfigError::Parse(_) => {
            let file = path
                .map(|p| format!(" {}", p.display()))
                .unwrap_or_default();
            format!(
                "the kubeconfig{file} is not valid YAML (its content is not shown: it may hold \
                 credentials)"
            )
        }
        other => format!("kubeconfig: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_that_does_not_parse_is_named_without_its_content() {
        let error = kube_client::config::Kubeconfig::from_yaml(
            "clusters: [\n  token: s3cr3t-token-value\n  {{{",
        )
        .expect_err("not YAML");
        assert!(
            error.to_string().contains("s3cr3t"),
            "kube's own message quotes the line, which this test guards against: {error}"
        );
        let reason = kubeconfig_reason(&error, Some(std::path::Path::new("/home/me/kubeconfig")));
        assert!(!reason.contains("s3cr3t"), "{reason}");
        assert_eq!(
            reason,
            "the kubeconfig /home/me/kubeconfig is not valid YAML (its content is not shown: it \
             may hold credentials)"
        );
    }

    #[test]
    fn a_missing_kubeconfig_is_named_once_without_doubled_quotes() {
        let missing = std::path::PathBuf::from("/nowhere/kubeconfig");
        let error = kube_client::config::KubeconfigError::ReadConfig(
            std::io::Error::from(std::io::ErrorKind::NotFound),
            missing,
        );
        assert_eq!(
            kubeconfig_reason(&error, None),
            "cannot read the kubeconfig /nowhere/kubeconfig: entity not found"
        );
    }

    /// A host name that does not resolve, through hyper-util's connector as the client
    /// uses it, with a resolver that answers at once (no DNS query leaves the machine).
    #[tokio::test]
    async fn a_host_that_does_not_resolve_is_host_not_found() {
        use tower::Service;
        let resolver = tower::service_fn(|_name| async {
            Err::<std::vec::IntoIter<std::net::SocketAddr>, _>(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such host",
            ))
        });
        let mut connector = HttpConnector::new_with_resolver(resolver);
        let uri: http::Uri = "http://nonexistent.invalid:6443/".parse().unwrap();
        let Err(error) = connector.call(uri).await else {
            panic!("resolved")
        };
        let error = kube_client::Error::Service(Box::new(error));
        assert_eq!(
            crate::error::chain(&error),
            "host not found (the server's name does not resolve: no such host)"
        );
    }

    /// A pool stand-in: counts calls in progress and answers when told.
    #[derive(Clone, Default)]
    struct Pool {
        calls: Arc<std::sync::atomic::AtomicUsize>,
        busiest: Arc<std::sync::atomic::AtomicUsize>,
        answer: Arc<tokio::sync::Notify>,
        fail_connect: Arc<std::sync::atomic::AtomicBool>,
    }

    #[derive(Debug)]
    struct PoolError;

    impl ConnectFailure for PoolError {
        fn is_connect(&self) -> bool {
            true
        }
    }

    impl tower::Service<Request<Body>> for Pool {
        type Response = Response<()>;
        type Error = PoolError;
        type Future = BoxFuture<'static, Result<Response<()>, PoolError>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), PoolError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: Request<Body>) -> Self::Future {
            use std::sync::atomic::Ordering::SeqCst;
            let pool = self.clone();
            Box::pin(async move {
                let now = pool.calls.fetch_add(1, SeqCst) + 1;
                pool.busiest.fetch_max(now, SeqCst);
                pool.answer.notified().await;
                pool.calls.fetch_sub(1, SeqCst);
                if pool.fail_connect.load(SeqCst) {
                    Err(PoolError)
                } else {
                    Ok(Response::new(()))
                }
            })
        }
    }

    #[tokio::test]
    async fn requests_wait_for_the_first_answer_then_go_together() {
        use std::sync::atomic::Ordering::SeqCst;
        use tower::ServiceExt;
        let pool = Pool::default();
        let gated = FirstConnection::new(pool.clone());
        let send = || {
            let gated = gated.clone();
            tokio::spawn(async move { gated.oneshot(request("/api/v1/pods")).await })
        };
        let wait_calls = |n: usize| {
            let pool = pool.clone();
            async move {
                while pool.calls.load(SeqCst) != n {
                    tokio::task::yield_now().await;
                }
            }
        };

        // A connection failure: the next request goes alone again.
        pool.fail_connect.store(true, SeqCst);
        let failed = send();
        wait_calls(1).await;
        pool.answer.notify_one();
        assert!(failed.await.unwrap().is_err());
        pool.fail_connect.store(false, SeqCst);

        let first: Vec<_> = (0..5).map(|_| send()).collect();
        wait_calls(1).await;
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            pool.calls.load(SeqCst),
            1,
            "one request at a time before an answer"
        );
        pool.answer.notify_one();
        // The four others now go together.
        wait_calls(4).await;
        for _ in 0..4 {
            pool.answer.notify_one();
        }
        for call in first {
            assert!(call.await.unwrap().is_ok());
        }
        assert_eq!(pool.busiest.load(SeqCst), 4);
    }

    fn request(uri: &str) -> Request<Body> {
        Request::get(uri).body(Body::empty()).unwrap()
    }
}
