//! Calls whose client gave up still complete; bad requests get SOAP faults, never panics.

use std::time::Duration;

use super::*;
use crate::CnsClient;
use crate::error::Error;
use crate::soap::decode;
use crate::wire::*;

fn spec(sim: &CnsSimulator, name: &str) -> VolumeCreateSpec {
    let cluster =
        ContainerCluster::kubernetes("demo-cluster", DEFAULT_USER, ClusterFlavor::Vanilla);
    VolumeCreateSpec {
        name: name.into(),
        datastores: sim.datastores(),
        metadata: VolumeMetadata::for_cluster(cluster, vec![]),
        capacity_in_mb: 1024,
        ..VolumeCreateSpec::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_delayed_create_whose_client_timed_out_still_completes() {
    let sim = CnsSimulator::start().await.unwrap();
    let config = sim.vc_config().timeout(Duration::from_secs(1));
    let client = CnsClient::connect(&config).await.unwrap();
    sim.delay("CnsCreateVolume", Duration::from_secs(10));
    let err = client
        .create_volume(&spec(&sim, "pvc-late"))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(sim.volumes().is_empty(), "the task has not run yet");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let volumes = sim.volumes();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0].name, "pvc-late");
}

#[tokio::test(start_paused = true)]
async fn a_delayed_delete_whose_client_timed_out_still_completes() {
    let sim = CnsSimulator::start().await.unwrap();
    let config = sim.vc_config().timeout(Duration::from_secs(1));
    let client = CnsClient::connect(&config).await.unwrap();
    let id = client.create_volume(&spec(&sim, "pvc-gone")).await.unwrap();
    sim.delay("CnsDeleteVolume", Duration::from_secs(10));
    let err = client.delete_volume(&id, true).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(sim.volumes().len(), 1);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(sim.volumes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_calls_still_running() {
    let sim = CnsSimulator::start().await.unwrap();
    let shared = Arc::clone(&sim.shared);
    let config = sim.vc_config().timeout(Duration::from_secs(1));
    let client = CnsClient::connect(&config).await.unwrap();
    sim.delay("CnsCreateVolume", Duration::from_secs(10));
    assert!(client.create_volume(&spec(&sim, "pvc-x")).await.is_err());
    sim.shutdown().await;
    assert_eq!(shared.data().volumes.len(), 1, "the create finished first");
}

/// Posts `body` to `path` and returns the status and the decoded answer.
async fn post(sim: &CnsSimulator, path: &str, body: Vec<u8>) -> (u16, Result<String, Error>) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", sim.url()))
        .header("Content-Type", "text/xml; charset=\"utf-8\"")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, decode::body(&text, "test").map(|e| e.name))
}

#[tokio::test]
async fn bad_requests_get_soap_faults_and_the_simulator_keeps_serving() {
    let sim = CnsSimulator::start().await.unwrap();
    let envelope = |inner: &str| {
        format!(
            "<Envelope xmlns=\"http://schemas.xmlsoap.org/soap/envelope/\"><Body>{inner}</Body></Envelope>"
        )
    };
    let deep = format!("{}{}", "<a>".repeat(100_000), "</a>".repeat(100_000));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("/sdk", vec![0xff, 0xfe, b'<', 0x80], "InvalidRequest"),
        ("/sdk", b"not xml at all".to_vec(), "InvalidRequest"),
        (
            "/vsanHealth",
            b"<Envelope><Body>".to_vec(),
            "InvalidRequest",
        ),
        ("/sdk", envelope("").into_bytes(), "InvalidRequest"),
        ("/sdk", deep.into_bytes(), "InvalidRequest"),
        (
            "/sdk",
            envelope("<Frobnicate xmlns=\"urn:vim25\"/>").into_bytes(),
            "NotAuthenticated",
        ),
        (
            "/sdk",
            envelope("<CnsCreateVolume xmlns=\"urn:vsan\"/>").into_bytes(),
            "MethodNotFound",
        ),
    ];
    for (path, body, expected) in cases {
        let (status, answer) = post(&sim, path, body).await;
        assert_eq!(status, 500, "{path} {expected}");
        match answer {
            Err(Error::Fault { fault_type, .. }) => assert_eq!(fault_type, expected),
            other => panic!("{path} {expected}: {other:?}"),
        }
    }
    // It still serves ordinary calls.
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    assert!(
        client
            .find_by_inventory_path("DC0/datastore/LocalDS_0")
            .await
            .unwrap()
            .is_some()
    );
    let (status, answer) = post(
        &sim,
        "/sdk",
        envelope("<RetrieveServiceContent xmlns=\"urn:vim25\"><_this type=\"ServiceInstance\">ServiceInstance</_this></RetrieveServiceContent>").into_bytes(),
    )
    .await;
    assert_eq!(
        (status, answer.unwrap()),
        (200, "RetrieveServiceContentResponse".to_owned())
    );
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_login_and_a_slow_service_content_time_out() {
    let sim = CnsSimulator::start().await.unwrap();
    let config = sim.vc_config().timeout(Duration::from_secs(2));
    for method in ["RetrieveServiceContent", "Login"] {
        sim.delay(method, Duration::from_secs(60));
        let err = CnsClient::connect(&config).await.unwrap_err();
        assert!(
            matches!(&err, Error::Timeout { operation, after } if *operation == method && *after == Duration::from_secs(2)),
            "{method}: {err}"
        );
        sim.delay(method, Duration::ZERO);
    }
    CnsClient::connect(&config).await.unwrap();
}
