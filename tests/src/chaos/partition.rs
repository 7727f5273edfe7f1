//! A tower layer on one replica's kube client that can cut it off from the API server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use http::Request;
use tower::{BoxError, Layer, Service};

const CONNECTED: u8 = 0;
const REFUSED: u8 = 1;
const HANGING: u8 = 2;

/// How long a request hangs during a "hang" partition before it fails, as a client's
/// read timeout would end it.
pub const HANG: Duration = Duration::from_secs(3);

/// The partition state of one replica, shared by every client built with its layer (it
/// outlives restarts: a replica restarted during a partition is still cut off).
#[derive(Clone, Debug, Default)]
pub struct Partition(Arc<AtomicU8>);

impl Partition {
    /// Cuts the replica off: new requests fail at once (`hang: false`, a refused
    /// connection) or hang for [`HANG`] and then fail (lost packets).
    pub fn cut(&self, hang: bool) {
        self.0
            .store(if hang { HANGING } else { REFUSED }, Ordering::SeqCst);
    }

    /// Reconnects the replica.
    pub fn heal(&self) {
        self.0.store(CONNECTED, Ordering::SeqCst);
    }

    /// Whether the replica is cut off.
    #[must_use]
    pub fn is_cut(&self) -> bool {
        self.0.load(Ordering::SeqCst) != CONNECTED
    }

    /// The layer to put on the replica's client.
    #[must_use]
    pub fn layer(&self) -> PartitionLayer {
        PartitionLayer(self.clone())
    }
}

/// The layer of a [`Partition`].
#[derive(Clone, Debug)]
pub struct PartitionLayer(Partition);

impl<S> Layer<S> for PartitionLayer {
    type Service = Partitioned<S>;
    fn layer(&self, inner: S) -> Partitioned<S> {
        Partitioned {
            inner,
            partition: self.0.clone(),
        }
    }
}

/// A service whose requests fail while its partition is cut.
#[derive(Clone, Debug)]
pub struct Partitioned<S> {
    inner: S,
    partition: Partition,
}

impl<S, B> Service<Request<B>> for Partitioned<S>
where
    S: Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.partition.0.load(Ordering::SeqCst) {
            CONNECTED => self
                .inner
                .call(request)
                .map(|r| r.map_err(Into::into))
                .boxed(),
            REFUSED => {
                futures::future::ready(Err("partitioned: connection refused".into())).boxed()
            }
            _ => async {
                tokio::time::sleep(HANG).await;
                Err("partitioned: the request timed out".into())
            }
            .boxed(),
        }
    }
}
