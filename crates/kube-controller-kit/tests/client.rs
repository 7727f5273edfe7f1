//! The client builder against small servers on loopback: HTTP/2 over TLS multiplexes every
//! request on one connection, a server without h2 gets HTTP/1.1, and `InFlightLimit` bounds
//! the requests in flight but not watches.

use std::convert::Infallible;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::{Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use kube_client::Config;
use kube_controller_kit::client::{InFlightLimit, from_config};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

const CA: &[u8] = include_bytes!("certs/test-ca.pem");
const SERVER_CERT: &[u8] = include_bytes!("certs/test-server.pem");
const SERVER_KEY: &[u8] = include_bytes!("certs/test-server.key");

/// What a test server saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    versions: Mutex<Vec<Version>>,
}

type Body = http_body_util::Either<
    Full<Bytes>,
    StreamBody<futures::stream::Pending<Result<Frame<Bytes>, Infallible>>>,
>;

/// Answers `{}` after `delay`; a `watch=true` request gets headers and a body that never ends.
async fn answer(seen: Arc<Seen>, delay: Duration, request: Request<Incoming>) -> Response<Body> {
    seen.versions.lock().unwrap().push(request.version());
    if request
        .uri()
        .query()
        .is_some_and(|q| q.contains("watch=true"))
    {
        return Response::new(http_body_util::Either::Right(StreamBody::new(
            futures::stream::pending(),
        )));
    }
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(delay).await;
    seen.in_flight.fetch_sub(1, Ordering::SeqCst);
    Response::new(http_body_util::Either::Left(Full::new(Bytes::from_static(
        b"{}",
    ))))
}

/// Serves on loopback, over TLS offering `alpn` when given, plain HTTP otherwise.
async fn serve(alpn: Option<Vec<Vec<u8>>>, delay: Duration) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let acceptor = alpn.as_ref().map(|alpn| {
        let certs = CertificateDer::pem_slice_iter(SERVER_CERT)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(SERVER_KEY).unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        config.alpn_protocols = alpn.clone();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    let scheme = if alpn.is_some() { "https" } else { "http" };
    let state = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            state.connections.fetch_add(1, Ordering::SeqCst);
            let (state, acceptor) = (state.clone(), acceptor.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(answer(state, delay, request).await) }
                });
                let server = auto::Builder::new(TokioExecutor::new());
                let _ = match acceptor {
                    Some(acceptor) => {
                        let Ok(tls) = acceptor.accept(stream).await else {
                            return;
                        };
                        server.serve_connection(TokioIo::new(tls), service).await
                    }
                    None => server.serve_connection(TokioIo::new(stream), service).await,
                };
            });
        }
    });
    (format!("{scheme}://127.0.0.1:{port}"), seen)
}

fn config(url: &str) -> Config {
    let mut config = Config::new(url.parse().unwrap());
    config.root_cert = Some(
        CertificateDer::pem_slice_iter(CA)
            .map(|cert| cert.unwrap().to_vec())
            .collect(),
    );
    config
}

async fn get(client: &kube_client::Client, path: &str) -> kube_client::Result<String> {
    client
        .request_text(Request::get(path).body(Vec::new()).unwrap())
        .await
}

#[tokio::test]
async fn every_request_shares_one_http2_connection() {
    let (url, seen) = serve(
        Some(vec![b"h2".to_vec(), b"http/1.1".to_vec()]),
        Duration::from_millis(20),
    )
    .await;
    let client = from_config(config(&url)).unwrap();
    get(&client, "/version").await.unwrap();

    let requests = (0..40).map(|_| {
        let client = client.clone();
        async move { get(&client, "/version").await }
    });
    for answer in futures::future::join_all(requests).await {
        assert_eq!(answer.unwrap(), "{}");
    }

    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
    assert!(
        seen.max_in_flight.load(Ordering::SeqCst) > 1,
        "the requests were multiplexed, not sent one after another"
    );
    let versions = seen.versions.lock().unwrap();
    assert_eq!(versions.len(), 41);
    assert!(
        versions.iter().all(|v| *v == Version::HTTP_2),
        "{versions:?}"
    );
}

#[tokio::test]
async fn a_server_that_offers_no_h2_is_spoken_to_in_http1() {
    let (url, seen) = serve(Some(vec![b"http/1.1".to_vec()]), Duration::ZERO).await;
    let client = from_config(config(&url)).unwrap();
    assert_eq!(get(&client, "/version").await.unwrap(), "{}");
    assert_eq!(*seen.versions.lock().unwrap(), [Version::HTTP_11]);
}

#[tokio::test]
async fn a_certificate_from_another_authority_is_refused() {
    let (url, _seen) = serve(Some(vec![b"h2".to_vec()]), Duration::ZERO).await;
    let mut config = config(&url);
    config.root_cert = None; // the platform's roots: they do not know the test CA
    let client = from_config(config).unwrap();
    assert!(get(&client, "/version").await.is_err());
}

#[tokio::test]
async fn the_limit_bounds_requests_in_flight() {
    let (url, seen) = serve(None, Duration::from_millis(30)).await;
    let limit = InFlightLimit::new(NonZeroUsize::new(3).unwrap());
    let client = limit.wrap(from_config(config(&url)).unwrap());

    let requests = (0..20).map(|_| {
        let client = client.clone();
        async move { get(&client, "/api/v1/namespaces").await }
    });
    for answer in futures::future::join_all(requests).await {
        assert_eq!(answer.unwrap(), "{}");
    }

    assert_eq!(seen.max_in_flight.load(Ordering::SeqCst), 3);
    assert_eq!(limit.in_flight(), 0, "every slot is given back");
}

#[tokio::test]
async fn a_watch_does_not_hold_a_slot() {
    let (url, _seen) = serve(None, Duration::ZERO).await;
    let limit = InFlightLimit::new(NonZeroUsize::MIN);
    let client = limit.wrap(from_config(config(&url)).unwrap());

    // Headers come back, the body never ends: the watch stays open.
    let watch = client
        .send(
            Request::get("/api/v1/persistentvolumeclaims?watch=true")
                .body(kube_client::client::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), get(&client, "/api/v1/namespaces"))
        .await
        .expect("the request was not held behind the open watch");
    assert_eq!(answer.unwrap(), "{}");
    drop(watch);
}
