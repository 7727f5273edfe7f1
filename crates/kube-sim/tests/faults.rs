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

/// A client that does not retry, so the test sees the raw 429.
fn raw_client(sim: &KubeSim) -> kube_client::Client {
    let uri: http::Uri = sim.url().parse().unwrap();
    let mut config = kube_client::Config::new(uri);
    config.default_retry = false;
    kube_client::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn a_429_fault_carries_retry_after_as_header_and_detail() {
    let sim = KubeSim::start().await.unwrap();
    sim.add_fault(
        FaultRule::new(Verb::List, "persistentvolumeclaims")
            .times(2)
            .status(429, "TooManyRequests")
            .message("slow down"),
    );
    sim.add_fault(
        FaultRule::new(Verb::Get, "persistentvolumeclaims")
            .status(429, "TooManyRequests")
            .retry_after(Duration::from_millis(2500)),
    );
    sim.add_fault(FaultRule::new(Verb::Get, "persistentvolumes").status(500, "InternalError"));
    let client = raw_client(&sim);
    let send = |path: &str| {
        let client = client.clone();
        let request = http::Request::get(path)
            .body(Vec::new())
            .expect("a valid request");
        async move { client.send(request.map(Into::into)).await.unwrap() }
    };
    let read = |resp: http::Response<kube_client::client::Body>| async move {
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let code = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (code, retry_after, status)
    };
    let (code, retry_after, status) =
        read(send("/api/v1/namespaces/default/persistentvolumeclaims").await).await;
    assert_eq!((code, retry_after.as_deref()), (429, Some("1")));
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["message"], "slow down");
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    let (code, retry_after, status) =
        read(send("/api/v1/namespaces/default/persistentvolumeclaims/a").await).await;
    assert_eq!(
        (code, retry_after.as_deref()),
        (429, Some("3")),
        "rounded up"
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 3);
    let (code, retry_after, status) = read(send("/api/v1/persistentvolumes/x").await).await;
    assert_eq!(
        (code, retry_after),
        (500, None),
        "only 429 answers carry it"
    );
    assert!(status.get("details").is_none(), "{status}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_honours_retry_after_waits_and_then_succeeds() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    sim.add_fault(
        FaultRule::new(Verb::Create, "persistentvolumeclaims")
            .status(429, "TooManyRequests")
            .retry_after(Duration::from_secs(4)),
    );
    let started = Instant::now();
    api.create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .expect("kube-client retries a 429 after Retry-After");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let creates: Vec<u16> = sim
        .requests()
        .iter()
        .filter(|r| r.verb == "create")
        .map(|r| r.status)
        .collect();
    assert_eq!(creates, [429, 201]);
}

#[tokio::test(start_paused = true)]
async fn a_lasting_rule_stops_firing_after_its_duration() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    sim.add_fault(
        FaultRule::new(Verb::List, "persistentvolumeclaims")
            .always()
            .lasting(Duration::from_secs(2))
            .status(500, "InternalError"),
    );
    for _ in 0..3 {
        let (code, _, _) = api_error(api.list(&ListParams::default()).await);
        assert_eq!(code, 500);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    api.list(&ListParams::default())
        .await
        .expect("the rule is over");
}

#[tokio::test]
async fn a_probability_rule_fails_a_share_of_the_requests() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    sim.add_fault(
        FaultRule::new(Verb::List, "persistentvolumeclaims")
            .always()
            .probability(0.5)
            .seed(3),
    );
    let mut failed = 0;
    for _ in 0..100 {
        if api.list(&ListParams::default()).await.is_err() {
            failed += 1;
        }
    }
    assert!((25..75).contains(&failed), "{failed} of 100 failed");
}
