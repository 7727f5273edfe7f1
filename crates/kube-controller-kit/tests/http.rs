//! The metrics and probe server over real loopback HTTP/1.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_controller_kit::http::{
    Health, HttpError, HttpLimits, HttpServer, HttpServerHandle, METRICS_CONTENT_TYPE, Role,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

/// A minimal HTTP/1.1 GET: enough to check status, headers and body.
async fn get(addr: SocketAddr, path: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    Reply {
        status,
        headers: headers.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}

#[tokio::test]
async fn scrape_returns_prometheus_text_with_the_incremented_counter() {
    let mut registry = Registry::default();
    let ops = Counter::<u64>::default();
    let depth = Gauge::<i64>::default();
    registry.register("demo_operations", "Operations done", ops.clone());
    registry.register("demo_depth", "Queue depth", depth.clone());
    let shutdown = CancellationToken::new();
    let server = HttpServer::bind(loopback(), "/metrics", Arc::new(registry), Health::new())
        .await
        .unwrap()
        .spawn(shutdown.clone().cancelled_owned());
    for _ in 0..3 {
        ops.inc();
    }
    depth.set(7);

    let reply = get(server.local_addr(), "/metrics").await;
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .headers
            .contains(&format!("content-type: {METRICS_CONTENT_TYPE}")),
        "{}",
        reply.headers
    );
    let text = reply.body;
    assert!(text.contains("# TYPE demo_operations counter\n"), "{text}");
    assert!(text.contains("# TYPE demo_depth gauge\n"), "{text}");
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix("demo_operations_total "))
        .unwrap_or_else(|| panic!("no counter sample in {text}"));
    assert_eq!(value.parse::<u64>().unwrap(), 3);
    assert!(text.lines().any(|l| l == "demo_depth 7"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    // Every line is a comment or `name[{labels}] value`.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
    }

    ops.inc();
    let again = get(server.local_addr(), "/metrics").await.body;
    assert!(
        again.lines().any(|l| l == "demo_operations_total 4"),
        "{again}"
    );

    shutdown.cancel();
    server.join().await.unwrap();
}

#[tokio::test]
async fn custom_metrics_path_and_a_mutex_registry_are_served() {
    let registry = Arc::new(Mutex::new(Registry::default()));
    let server = HttpServer::bind(loopback(), "/custom/path", registry.clone(), Health::new())
        .await
        .unwrap();
    let addr = server.local_addr();
    let shutdown = CancellationToken::new();
    let handle = server.spawn(shutdown.clone().cancelled_owned());
    // Registered after the server started: a shared mutex registry may still grow.
    let late = Counter::<u64>::default();
    registry
        .lock()
        .unwrap()
        .register("late", "Registered late", late.clone());
    late.inc();

    let reply = get(addr, "/custom/path").await;
    assert_eq!(reply.status, 200);
    assert!(reply.body.contains("late_total 1"), "{}", reply.body);
    assert_eq!(get(addr, "/metrics").await.status, 404);
    shutdown.cancel();
    handle.join().await.unwrap();
}

#[tokio::test]
async fn readyz_is_503_until_caches_sync_and_503_again_when_stopping() {
    let health = Health::new();
    let shutdown = CancellationToken::new();
    let server = HttpServer::bind(loopback(), "/metrics", Registry::default(), health.clone())
        .await
        .unwrap()
        .spawn(shutdown.clone().cancelled_owned());
    let addr = server.local_addr();

    let starting = get(addr, "/readyz").await;
    assert_eq!(starting.status, 503);
    assert_eq!(starting.body, "controller starting");

    health.set_role(Role::Standby);
    let unsynced = get(addr, "/readyz").await;
    assert_eq!(unsynced.status, 503);
    assert_eq!(unsynced.body, "caches not synced");

    health.set_caches_synced(true);
    let ready = get(addr, "/readyz").await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ok"));

    health.set_role(Role::Leading);
    assert_eq!(get(addr, "/readyz").await.status, 200);

    health.set_role(Role::Stopping);
    let stopping = get(addr, "/readyz").await;
    assert_eq!(
        (stopping.status, stopping.body.as_str()),
        (503, "controller stopping")
    );

    shutdown.cancel();
    server.join().await.unwrap();
}

#[tokio::test]
async fn healthz_is_200_whatever_the_readiness() {
    let health = Health::new();
    let shutdown = CancellationToken::new();
    let server = HttpServer::bind(loopback(), "/metrics", Registry::default(), health.clone())
        .await
        .unwrap()
        .spawn(shutdown.clone().cancelled_owned());
    for role in [Role::Starting, Role::Standby, Role::Stopping] {
        health.set_role(role);
        let reply = get(server.local_addr(), "/healthz").await;
        assert_eq!((reply.status, reply.body.as_str()), (200, "ok"), "{role:?}");
    }
    shutdown.cancel();
    server.join().await.unwrap();
}

#[tokio::test]
async fn port_zero_in_config_means_no_server() {
    let server = HttpServer::bind_configured(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        0,
        "/metrics",
        Registry::default(),
        Health::new(),
    )
    .await
    .unwrap();
    assert!(server.is_none());
}

#[tokio::test]
async fn a_configured_port_is_bound_and_a_taken_port_is_an_error() {
    // Find a free port, then configure it explicitly.
    let probe = std::net::TcpListener::bind(loopback()).unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let server = HttpServer::bind_configured(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        port,
        "/metrics",
        Registry::default(),
        Health::new(),
    )
    .await
    .unwrap()
    .expect("a non-zero port starts the server");
    assert_eq!(server.local_addr().port(), port);

    let taken = HttpServer::bind(
        server.local_addr(),
        "/metrics",
        Registry::default(),
        Health::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(taken, HttpError::Bind { .. }), "{taken}");
    assert!(taken.to_string().contains(&port.to_string()), "{taken}");
}

#[tokio::test]
async fn invalid_metrics_path_is_rejected_before_binding() {
    let err = HttpServer::bind(loopback(), "/readyz", Registry::default(), Health::new())
        .await
        .unwrap_err();
    assert!(matches!(err, HttpError::InvalidPath { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "invalid metrics path \"/readyz\": is a probe path"
    );
}

#[tokio::test]
async fn shutdown_stops_the_server_and_join_returns() {
    let shutdown = CancellationToken::new();
    let server = HttpServer::bind(loopback(), "/metrics", Registry::default(), Health::new())
        .await
        .unwrap()
        .spawn(shutdown.clone().cancelled_owned());
    let addr = server.local_addr();
    assert_eq!(get(addr, "/healthz").await.status, 200);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), server.join())
        .await
        .expect("server stops after shutdown")
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
}

/// Serves with `limits` on loopback until the returned token is cancelled.
async fn serve_with(limits: HttpLimits) -> (HttpServerHandle, CancellationToken) {
    let shutdown = CancellationToken::new();
    let server = HttpServer::bind(loopback(), "/metrics", Registry::default(), Health::new())
        .await
        .unwrap()
        .limits(limits)
        .spawn(shutdown.clone().cancelled_owned());
    (server, shutdown)
}

/// Reads until the server closes the connection; what it sent, if anything.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    // A reset also means closed.
    let _ = stream.read_to_end(&mut raw).await;
    raw
}

#[tokio::test]
async fn a_client_that_sends_half_a_request_line_is_disconnected_after_the_header_read_timeout() {
    let timeout = Duration::from_millis(300);
    let (server, shutdown) = serve_with(HttpLimits::default().header_read_timeout(timeout)).await;
    let mut slow = TcpStream::connect(server.local_addr()).await.unwrap();
    let started = tokio::time::Instant::now();
    slow.write_all(b"GET /heal").await.unwrap();

    let sent = tokio::time::timeout(Duration::from_secs(10), read_until_closed(&mut slow))
        .await
        .expect("the server closes a connection that does not finish its headers");
    let waited = started.elapsed();
    assert!(
        waited >= timeout - Duration::from_millis(50),
        "closed after {waited:?}"
    );
    // Closed without an answer, or with hyper's 408; never a 200 to half a request.
    let sent = String::from_utf8_lossy(&sent);
    assert!(
        sent.is_empty() || sent.starts_with("HTTP/1.1 408"),
        "{sent}"
    );
    // Other clients are still served.
    assert_eq!(get(server.local_addr(), "/healthz").await.status, 200);
    shutdown.cancel();
    server.join().await.unwrap();
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_header_read_timeout() {
    let timeout = Duration::from_millis(300);
    let (server, shutdown) = serve_with(HttpLimits::default().header_read_timeout(timeout)).await;
    let mut idle = TcpStream::connect(server.local_addr()).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let sent = tokio::time::timeout(Duration::from_secs(10), read_until_closed(&mut idle))
        .await
        .expect("the server closes a kept-alive connection that sends no further request");
    let sent = String::from_utf8_lossy(&sent);
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent}");
    shutdown.cancel();
    server.join().await.unwrap();
}

#[tokio::test]
async fn connections_past_the_bound_wait_and_are_served_once_another_closes() {
    let limits = HttpLimits::default()
        .max_connections(NonZeroUsize::new(2).unwrap())
        .header_read_timeout(Duration::from_secs(60));
    let (server, shutdown) = serve_with(limits).await;
    let addr = server.local_addr();
    // Two slow clients take both slots.
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /hea").await.unwrap();
        holders.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let probe = tokio::spawn(async move { get(addr, "/healthz").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !probe.is_finished(),
        "a third connection is not served while two are open"
    );

    drop(holders.pop());
    let reply = tokio::time::timeout(Duration::from_secs(10), probe)
        .await
        .expect("the waiting probe is served once a slot frees up")
        .unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "ok"));

    drop(holders);
    shutdown.cancel();
    server.join().await.unwrap();
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_client_that_never_finishes_its_request() {
    let limits = HttpLimits::default().header_read_timeout(Duration::from_millis(500));
    let (server, shutdown) = serve_with(limits).await;
    let mut slow = TcpStream::connect(server.local_addr()).await.unwrap();
    slow.write_all(b"GET /hea").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), server.join())
        .await
        .expect("the server stops within the header-read timeout")
        .unwrap();
}

/// The elector reports a missing Lease namespace to the handle; `/readyz` says so until
/// the namespace exists (real time, short timings: about a second).
#[tokio::test]
async fn readyz_names_a_missing_lease_namespace_until_it_exists() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube_client::Api;
    use kube_client::api::PostParams;
    use kube_controller_kit::leader::{LeaderElection, LeaderElector};

    let sim = kube_sim::KubeSim::builder().start().await.unwrap();
    let health = Health::new();
    let shutdown = CancellationToken::new();
    let server = HttpServer::bind(loopback(), "/metrics", Registry::default(), health.clone())
        .await
        .unwrap()
        .spawn(shutdown.clone().cancelled_owned());
    let addr = server.local_addr();
    health.set_role(Role::Standby);
    health.set_caches_synced(true);

    let cfg = LeaderElection::new("example.com-test", "storage")
        .unwrap()
        .identity("a")
        .timings(
            Duration::from_secs(2),
            Duration::from_secs(1),
            Duration::from_millis(100),
        )
        .unwrap();
    let mut elector = LeaderElector::new(sim.client(), cfg).unwrap();
    elector.report_to(health.clone());
    let candidate = tokio::spawn(async move {
        elector.acquire(std::future::pending()).await.unwrap();
        elector
    });

    let blocked = async {
        loop {
            let reply = get(addr, "/readyz").await;
            if reply.status == 503 {
                return reply.body;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let body = tokio::time::timeout(Duration::from_secs(5), blocked)
        .await
        .expect("/readyz never reported the missing namespace");
    assert_eq!(
        body,
        "leader election: namespace \"storage\" does not exist; create it, or set the \
         leader-election namespace (POD_NAMESPACE) to one that exists"
    );

    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "storage" }
    }))
    .unwrap();
    Api::<Namespace>::all(sim.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let elector = tokio::time::timeout(Duration::from_secs(10), candidate)
        .await
        .expect("no lease within 10 s of the namespace")
        .unwrap();
    assert!(elector.is_leader());
    let ready = get(addr, "/readyz").await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ok"));

    shutdown.cancel();
    server.join().await.unwrap();
}
