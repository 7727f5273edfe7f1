//! The metrics and probe server over real loopback HTTP/1.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use kube_controller_kit::http::{Health, HttpError, HttpServer, METRICS_CONTENT_TYPE, Role};
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
    tokio::time::timeout(std::time::Duration::from_secs(5), server.join())
        .await
        .expect("server stops after shutdown")
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
}
