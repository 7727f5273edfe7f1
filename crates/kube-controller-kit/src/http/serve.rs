//! The connection loop of [`HttpServer`](super::HttpServer): hyper's HTTP/1 server under
//! axum's router, with a header-read timeout and a bound on open connections.
//!
//! `axum::serve` has neither: a client that opens connections and sends a few bytes now
//! and then (slowloris) would hold file descriptors the API and backend clients need.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Limits on the connections of an [`HttpServer`](super::HttpServer); the defaults suit
/// kubelet probes and Prometheus scrapes, which send a short request at once.
///
/// Each option is a public field and a builder method of the same name.
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use kube_controller_kit::http::HttpLimits;
///
/// let limits = HttpLimits::default()
///     .header_read_timeout(Duration::from_secs(5))
///     .max_connections(NonZeroUsize::new(16).unwrap());
/// assert_eq!(limits.max_connections.get(), 16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpLimits {
    /// How long a client may take to send the headers of a request, counted from the
    /// accept (or, on a kept-alive connection, from the end of the previous response);
    /// past it the connection is closed. This bounds slow and idle clients. Default
    /// [`HttpLimits::DEFAULT_HEADER_READ_TIMEOUT`] (10 s).
    pub header_read_timeout: Duration,
    /// How many connections are served at once. Further connections wait in the
    /// listen backlog (they are not accepted) until one closes. Default
    /// [`HttpLimits::DEFAULT_MAX_CONNECTIONS`] (64).
    pub max_connections: NonZeroUsize,
}

impl HttpLimits {
    /// Default for [`header_read_timeout`](Self::header_read_timeout()): 10 s, far more
    /// than a probe or a scrape needs to send its request.
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default for [`max_connections`](Self::max_connections()): 64.
    pub const DEFAULT_MAX_CONNECTIONS: NonZeroUsize =
        NonZeroUsize::new(64).expect("64 is not zero");

    /// How long a client may take to send the headers of a request before the connection
    /// is closed. Default 10 s. Zero closes every connection before its first request.
    #[must_use]
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// How many connections are served at once; more wait to be accepted. Default 64.
    #[must_use]
    pub fn max_connections(mut self, max: NonZeroUsize) -> Self {
        self.max_connections = max;
        self
    }
}

impl Default for HttpLimits {
    /// 10 s to send the headers, 64 connections at once.
    fn default() -> Self {
        Self {
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, then closes the listener, lets each
/// connection finish its request in flight (for at most the header-read timeout) and
/// returns.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let permits = Arc::new(Semaphore::new(limits.max_connections.get()));
    let closing = CancellationToken::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        // A permit first: past the bound, connections wait in the backlog, unaccepted.
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => {
                permit.expect("the semaphore is never closed")
            }
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    accept_failed(&error).await;
                    continue;
                }
            },
        };
        let connection = builder.clone().serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let closing = closing.clone();
        connections.spawn(async move {
            let _permit = permit;
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = closing.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                debug!(%peer, %error, "metrics/probe connection closed with an error");
            }
        });
    }
    drop(listener);
    closing.cancel();
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.header_read_timeout, drain)
        .await
        .is_err()
    {
        debug!(
            open = connections.len(),
            "metrics/probe connections still open after the drain; closing them"
        );
        connections.shutdown().await;
    }
}

/// Like `axum::serve`: a connection that failed before it was accepted is skipped; any
/// other error (out of file descriptors, say) is logged and the loop pauses a second.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    warn!(%error, "metrics/probe server failed to accept a connection; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
