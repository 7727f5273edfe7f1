//! The metrics and probe endpoint of a running controller.

use std::collections::BTreeMap;

use kube_sim::{FaultRule, Verb};
use provision_controller::testing::FakeProvisioner;

use super::*;

/// Parses Prometheus/OpenMetrics text strictly enough to catch malformed output:
/// `series -> value`, where `series` is `name{labels}` exactly as written.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut samples = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "missing EOF marker");
    for line in &lines[..lines.len() - 1] {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().unwrap_or_default();
            assert!(
                matches!(kind, "HELP" | "TYPE" | "UNIT"),
                "bad comment: {line}"
            );
            assert!(valid_name(name), "bad metric name in: {line}");
            if kind == "TYPE" {
                let ty = parts.next().unwrap_or_default();
                assert!(
                    matches!(
                        ty,
                        "counter"
                            | "gauge"
                            | "histogram"
                            | "summary"
                            | "unknown"
                            | "info"
                            | "stateset"
                            | "gaugehistogram"
                    ),
                    "bad type in: {line}"
                );
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(valid_name(name), "bad metric name in: {line}");
        if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .unwrap_or_else(|| panic!("bad labels in: {line}"));
            for pair in inner.split(',').filter(|p| !p.is_empty()) {
                let (key, quoted) = pair
                    .split_once('=')
                    .unwrap_or_else(|| panic!("bad label in: {line}"));
                assert!(valid_name(key), "bad label name in: {line}");
                assert!(
                    quoted.starts_with('"') && quoted.ends_with('"'),
                    "unquoted label in: {line}"
                );
            }
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in: {line}"));
        samples.insert(series.to_owned(), value);
    }
    samples
}

#[tokio::test]
async fn a_scrape_parses_as_prometheus_text_and_counts_the_operations_done() {
    let sim = sim().await;
    let replica = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("a"))),
        true,
    );
    let mut pvs = Vec::new();
    for i in 0..3 {
        let name = format!("claim-{i}");
        let pv = create_claim(&sim, &name).await;
        bound(&sim, &name, &pv).await;
        pvs.push(pv);
    }
    delete_claim(&sim, "claim-0").await;
    let volumes = volumes(&sim);
    eventually("released volume deleted", || async {
        volumes.get_opt(&pvs[0]).await.ok()?.is_none().then_some(())
    })
    .await;

    let metrics = eventually("queues drained in the scrape", || async {
        let (status, body) = replica.get("/metrics").await?;
        assert_eq!(status, 200);
        let m = parse_metrics(&body);
        let idle = m.get(r#"workqueue_depth{name="claims"}"#) == Some(&0.0)
            && m.get(r#"workqueue_depth{name="volumes"}"#) == Some(&0.0)
            && m.get(r#"controller_persistentvolume_delete_total{class="fast"}"#) == Some(&1.0);
        idle.then_some(m)
    })
    .await;
    let get = |series: &str| metrics.get(series).copied();
    assert_eq!(
        get(r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""}"#),
        Some(3.0)
    );
    assert_eq!(
        get(
            r#"controller_persistentvolumeclaim_provision_duration_seconds_count{class="fast",source=""}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        get(r#"controller_persistentvolume_delete_total{class="fast"}"#),
        Some(1.0)
    );
    assert_eq!(
        get(r#"controller_persistentvolume_delete_duration_seconds_count{class="fast"}"#),
        Some(1.0)
    );
    assert!(
        !metrics.keys().any(|k| k.contains("_failed_total")),
        "no failure happened: {metrics:#?}"
    );
    assert_eq!(get("controller_leader"), Some(1.0));
    assert_eq!(get("controller_claims_in_progress"), Some(0.0));
    assert_eq!(get("controller_unsaved_persistentvolumes"), Some(0.0));
    assert!(get(r#"workqueue_adds_total{name="claims"}"#).unwrap() >= 3.0);
    assert!(get(r#"workqueue_adds_total{name="volumes"}"#).unwrap() >= 3.0);
    assert!(get(r#"workqueue_work_duration_seconds_count{name="claims"}"#).unwrap() >= 3.0);
    assert!(get(r#"workqueue_longest_running_processor_seconds{name="claims"}"#).is_some());
    assert_eq!(replica.get("/healthz").await, Some((200, "ok".into())));
    replica.stop().await.unwrap();
}

#[tokio::test]
async fn readyz_is_not_ready_before_the_caches_sync_and_ready_after() {
    let sim = sim().await;
    // Listing claims fails until the fault is cleared: the claims cache cannot sync.
    sim.add_fault(
        FaultRule::new(Verb::List, "persistentvolumeclaims")
            .always()
            .status(500, "InternalError"),
    );
    let replica = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("a"))),
        true,
    );
    let first = eventually("server up", || replica.get("/readyz")).await;
    assert_eq!(first.0, 503, "{first:?}");
    for _ in 0..5 {
        let (status, body) = replica.get("/readyz").await.unwrap();
        assert_eq!(status, 503, "not ready before the caches sync: {body}");
        assert_eq!(replica.get("/healthz").await, Some((200, "ok".into())));
        tokio::time::sleep(RETRY).await;
    }
    assert!(
        lease_holder(&sim.client()).await.is_none(),
        "no lease before the caches sync"
    );

    sim.clear_faults();
    eventually("ready once synced", || async {
        (replica.get("/readyz").await? == (200, "ok".into())).then_some(())
    })
    .await;
    replica.stop().await.unwrap();
}

#[tokio::test]
async fn the_registry_passed_to_metrics_registry_is_the_one_served() {
    use std::sync::{Arc, Mutex};

    use prometheus_client::{metrics::counter::Counter, registry::Registry};

    let sim = sim().await;
    let registry = Arc::new(Mutex::new(Registry::default()));
    let before = Counter::<u64>::default();
    registry
        .lock()
        .unwrap()
        .register("driver_calls", "Calls to the backend", before.clone());
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let controller = ProvisionController::new(sim.client(), ME, FakeProvisioner::new())
        .config(
            config(None)
                .metrics_address(addr.ip())
                .metrics_port(addr.port()),
        )
        .metrics_registry(Arc::clone(&registry));
    // Registered after the controller's own metrics: served all the same.
    let after = Counter::<u64>::default();
    registry
        .lock()
        .unwrap()
        .register("driver_retries", "Retried backend calls", after.clone());
    before.inc_by(2);
    after.inc();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));

    let pv = create_claim(&sim, "data").await;
    bound(&sim, "data", &pv).await;
    let metrics = eventually("the provisioned volume in the scrape", || async {
        let (status, body) = http_get(addr, "/metrics").await?;
        assert_eq!(status, 200, "{body}");
        let m = parse_metrics(&body);
        m.contains_key(
            r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""}"#,
        )
        .then_some(m)
    })
    .await;
    assert_eq!(
        metrics.get("driver_calls_total"),
        Some(&2.0),
        "{metrics:#?}"
    );
    assert_eq!(
        metrics.get("driver_retries_total"),
        Some(&1.0),
        "{metrics:#?}"
    );
    assert_eq!(
        metrics.get(r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""}"#),
        Some(&1.0)
    );
    assert_eq!(metrics.get("controller_leader"), Some(&1.0));

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("run returns after shutdown")
        .expect("run does not panic")
        .unwrap();
    // The controller counted into the caller's registry, not a copy.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry.lock().unwrap()).unwrap();
    assert!(
        text.contains(
            r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""} 1"#
        ),
        "{text}"
    );
}
