//! Fault rules (times, always, latency, name and subresource matching) and the request log.

mod common;

use std::time::Duration;

use common::{api_error, claim};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_sim::{FaultRule, KubeSim, Verb};
use serde_json::json;
use tokio::time::Instant;

#[tokio::test]
async fn a_fault_fires_its_number_of_times_for_its_name() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    sim.add_fault(
        FaultRule::new(Verb::Create, "persistentvolumeclaims")
            .name("a")
            .times(2)
            .status(500, "InternalError"),
    );
    api.create(&PostParams::default(), &claim("b", "1Gi"))
        .await
        .unwrap();
    for _ in 0..2 {
        let (code, reason, message) =
            api_error(api.create(&PostParams::default(), &claim("a", "1Gi")).await);
        assert_eq!(
            (code, reason.as_str(), message.as_str()),
            (500, "InternalError", "injected fault")
        );
    }
    api.create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
}

#[tokio::test]
async fn always_faults_match_the_status_subresource_until_cleared() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    api.create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    sim.add_fault(
        FaultRule::new(Verb::Patch, "persistentvolumeclaims")
            .subresource("status")
            .always()
            .status(409, "Conflict")
            .message("busy"),
    );
    let patch = Patch::Merge(json!({"status": {"phase": "Bound"}}));
    for _ in 0..3 {
        let (code, reason, message) =
            api_error(api.patch_status("a", &PatchParams::default(), &patch).await);
        assert_eq!(
            (code, reason.as_str(), message.as_str()),
            (409, "Conflict", "busy")
        );
    }
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .expect("the main resource is not matched");
    sim.clear_faults();
    api.patch_status("a", &PatchParams::default(), &patch)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn latency_only_faults_delay_and_then_serve() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    sim.add_fault(
        FaultRule::new(Verb::List, "persistentvolumeclaims")
            .latency(Duration::from_secs(3))
            .no_status(),
    );
    let started = Instant::now();
    let list = api.list(&ListParams::default()).await.unwrap();
    assert!(list.items.is_empty());
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the rule fired once"
    );
}

#[tokio::test]
async fn the_request_log_records_verb_path_query_and_status() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    sim.clear_requests();
    api.create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    let _ = api.create(&PostParams::default(), &claim("a", "1Gi")).await;
    api.get("a").await.unwrap();
    api.list(&ListParams::default().labels("x=y"))
        .await
        .unwrap();
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {}})),
    )
    .await
    .unwrap();
    let log = sim.requests();
    let summary: Vec<(&str, u16)> = log.iter().map(|r| (r.verb.as_str(), r.status)).collect();
    assert_eq!(
        summary,
        [
            ("create", 201),
            ("create", 409),
            ("get", 200),
            ("list", 200),
            ("patch", 200)
        ]
    );
    assert_eq!(
        log[2].path,
        "/api/v1/namespaces/default/persistentvolumeclaims/a"
    );
    assert_eq!(log[2].name.as_deref(), Some("a"));
    assert_eq!(log[2].namespace.as_deref(), Some("default"));
    assert!(
        log[3].query.contains("labelSelector=x%3Dy"),
        "{}",
        log[3].query
    );
    assert_eq!(log[4].subresource.as_deref(), Some("status"));
    assert_eq!(log[4].resource, "persistentvolumeclaims");
    sim.clear_requests();
    assert!(sim.requests().is_empty());
}
