//! The CSI transport against `MockCsiDriver` over a real unix socket: every call, deadlines,
//! a missing socket, a driver crash and restart, and the start sequence.

use std::collections::HashMap;
use std::time::Duration;

use csi_provisioner::csi::controller_service_capability::RpcType;
use csi_provisioner::csi::plugin_capability::ServiceType;
use csi_provisioner::csi::*;
use csi_provisioner::start::{StartConfig, StartError, start};
use csi_provisioner::testing::{AccessibleTopology, Answer, CsiMethod, MockCsiDriver};

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn create_request(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: "ext4".into(),
                    ..Default::default()
                },
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::Mode::SingleNodeWriter as i32,
            }),
        }],
        parameters: HashMap::from([("type".into(), "fast".into())]),
        secrets: HashMap::from([("password".into(), "hunter2".into())]),
        ..Default::default()
    }
}

fn quick_start() -> StartConfig {
    StartConfig::default()
        .socket_timeout(Duration::from_secs(5))
        .probe_timeout(Duration::from_secs(5))
        .retry_interval(Duration::from_millis(20))
        .log_intervals(Duration::from_millis(50), Duration::from_millis(400))
}

#[tokio::test]
async fn every_call_round_trips_over_the_socket() {
    let (mock, socket) = MockCsiDriver::start("mock.csi.example.com").unwrap();
    mock.set_vendor_version("1.2.3");
    mock.set_plugin_capabilities([
        ServiceType::ControllerService,
        ServiceType::VolumeAccessibilityConstraints,
    ]);
    mock.set_controller_capabilities([RpcType::CreateDeleteVolume, RpcType::CloneVolume]);
    mock.set_accessible_topology(AccessibleTopology::FromRequest);
    let driver = mock.client(CALL_TIMEOUT);
    assert_eq!(driver.socket(), socket);

    let probe = driver.probe().await.unwrap();
    assert_eq!(probe.ready, Some(BoolValue { value: true }));
    let info = driver.get_plugin_info().await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.vendor_version.as_str()),
        ("mock.csi.example.com", "1.2.3")
    );
    let plugin = driver.get_plugin_capabilities().await.unwrap();
    assert_eq!(plugin.capabilities.len(), 2);
    let controller = driver.controller_get_capabilities().await.unwrap();
    let rpcs: Vec<i32> = controller
        .capabilities
        .iter()
        .map(|capability| match &capability.r#type {
            Some(controller_service_capability::Type::Rpc(rpc)) => rpc.r#type,
            None => -1,
        })
        .collect();
    assert_eq!(
        rpcs,
        vec![
            RpcType::CreateDeleteVolume as i32,
            RpcType::CloneVolume as i32
        ]
    );

    let zone = Topology {
        segments: [("topology.example.com/zone".to_owned(), "a".to_owned())].into(),
    };
    let mut request = create_request("pvc-1");
    request.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![zone.clone()],
        preferred: vec![zone.clone()],
    });
    let volume = driver
        .create_volume(request.clone())
        .await
        .unwrap()
        .volume
        .unwrap();
    assert_eq!(volume.capacity_bytes, 1 << 20);
    assert_eq!(volume.volume_context["type"], "fast");
    assert_eq!(volume.accessible_topology, vec![zone]);
    // Idempotent by name.
    let again = driver.create_volume(request).await.unwrap().volume.unwrap();
    assert_eq!(again.volume_id, volume.volume_id);
    assert_eq!(mock.volume_count(), 1);
    let last = mock.last_create_volume().unwrap();
    assert_eq!(last.secrets["password"], "hunter2");
    assert_eq!(last.parameters["type"], "fast");

    driver
        .delete_volume(DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            secrets: HashMap::from([("token".into(), "t".into())]),
        })
        .await
        .unwrap();
    assert_eq!(mock.volume_count(), 0);
    assert_eq!(mock.last_delete_volume().unwrap().secrets["token"], "t");
    // Deleting again (an unknown id) succeeds.
    driver
        .delete_volume(DeleteVolumeRequest {
            volume_id: volume.volume_id,
            secrets: HashMap::new(),
        })
        .await
        .unwrap();
    for (method, calls) in [
        (CsiMethod::Probe, 1),
        (CsiMethod::GetPluginInfo, 1),
        (CsiMethod::GetPluginCapabilities, 1),
        (CsiMethod::ControllerGetCapabilities, 1),
        (CsiMethod::CreateVolume, 2),
        (CsiMethod::DeleteVolume, 2),
    ] {
        assert_eq!(mock.calls(method), calls, "{method}");
    }
}

#[tokio::test]
async fn driver_errors_keep_their_code_and_name_the_call_and_socket() {
    let (mock, socket) = MockCsiDriver::start("mock").unwrap();
    let driver = mock.client(CALL_TIMEOUT);
    mock.script(
        CsiMethod::CreateVolume,
        [
            Answer::Error(Code::ResourceExhausted),
            Answer::ErrorAfterWork(Code::Aborted),
        ],
    );
    let error = driver
        .create_volume(create_request("pvc-1"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::ResourceExhausted);
    assert!(
        error.message().contains("CreateVolume")
            && error.message().contains(&socket.display().to_string()),
        "{error}"
    );
    assert_eq!(mock.volume_count(), 0);
    // The work is done, the answer is an error anyway.
    let error = driver
        .create_volume(create_request("pvc-1"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::Aborted);
    assert!(mock.volume("pvc-1").is_some());
    // The script is used up.
    assert!(driver.create_volume(create_request("pvc-1")).await.is_ok());
    // An `Unknown` the driver answers stays `Unknown` (only a broken connection becomes
    // `Unavailable`).
    mock.script(CsiMethod::DeleteVolume, [Answer::Error(Code::Unknown)]);
    let error = driver
        .delete_volume(DeleteVolumeRequest {
            volume_id: "vol-1".into(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::Unknown, "{error}");
}

#[tokio::test]
async fn a_call_slower_than_the_timeout_is_deadline_exceeded_and_lands_late() {
    let (mock, _socket) = MockCsiDriver::start("mock").unwrap();
    let timeout = Duration::from_millis(200);
    let driver = mock.client(timeout);
    mock.script(
        CsiMethod::CreateVolume,
        [Answer::LandsAfter(Duration::from_millis(1500))],
    );
    let started = tokio::time::Instant::now();
    let error = driver
        .create_volume(create_request("pvc-late"))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(error.code(), Code::DeadlineExceeded, "{error}");
    assert!(
        waited >= timeout && waited < Duration::from_millis(1000),
        "{waited:?}"
    );
    assert!(error.message().contains("CreateVolume"), "{error}");
    assert_eq!(mock.volume_count(), 0, "not landed yet");

    tokio::time::timeout(
        Duration::from_secs(5),
        mock.wait_until(|mock| mock.volume("pvc-late").is_some()),
    )
    .await
    .expect("the late create lands");
    // The replay (CreateVolume is idempotent by name) finds it.
    let volume = driver
        .create_volume(create_request("pvc-late"))
        .await
        .unwrap()
        .volume
        .unwrap();
    assert_eq!(volume.volume_id, mock.volume("pvc-late").unwrap().id);
    assert_eq!(mock.volume_count(), 1);
}

#[tokio::test]
async fn a_delayed_call_is_cut_by_the_client_timeout() {
    let (mock, _socket) = MockCsiDriver::start("mock").unwrap();
    mock.set_delay(CsiMethod::Probe, Duration::from_secs(30));
    let driver = mock.client(Duration::from_millis(100));
    let error = driver.probe().await.unwrap_err();
    assert_eq!(error.code(), Code::DeadlineExceeded);
    assert!(
        error.message().contains("Probe") && error.message().contains("100ms"),
        "{error}"
    );
}

#[tokio::test]
async fn no_socket_is_unavailable_naming_the_path() {
    let mock = MockCsiDriver::new("mock").unwrap();
    let driver = mock.client(CALL_TIMEOUT);
    let error = driver.probe().await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{error}");
    assert!(
        error
            .message()
            .contains(&mock.socket().display().to_string()),
        "{error}"
    );
}

#[tokio::test]
async fn the_same_client_works_again_after_a_crash_and_restart() {
    let (mock, socket) = MockCsiDriver::start("mock").unwrap();
    let driver = mock.client(CALL_TIMEOUT);
    let volume = driver
        .create_volume(create_request("pvc-1"))
        .await
        .unwrap()
        .volume
        .unwrap();

    // A call in flight when the driver dies fails, and nothing is made.
    mock.set_delay(CsiMethod::CreateVolume, Duration::from_secs(30));
    let in_flight = tokio::spawn({
        let driver = driver.clone();
        async move { driver.create_volume(create_request("pvc-2")).await }
    });
    tokio::time::timeout(
        Duration::from_secs(5),
        mock.wait_until(|mock| mock.calls(CsiMethod::CreateVolume) == 2),
    )
    .await
    .unwrap();
    mock.crash();
    assert!(!socket.exists());
    let error = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .expect("the call in flight fails at once")
        .unwrap()
        .unwrap_err();
    // As grpc-go says it: the create may have landed, so the code must not read as final.
    assert_eq!(error.code(), Code::Unavailable, "{error}");
    assert!(error.message().contains("connection was lost"), "{error}");
    let error = driver.probe().await.unwrap_err();
    assert_eq!(
        error.code(),
        Code::Unavailable,
        "nothing serves the socket: {error}"
    );

    mock.clear_faults();
    mock.restart().unwrap();
    driver.probe().await.expect("the same client reconnects");
    let again = driver
        .create_volume(create_request("pvc-1"))
        .await
        .unwrap()
        .volume
        .unwrap();
    assert_eq!(
        again.volume_id, volume.volume_id,
        "the volumes outlive a crash"
    );
    assert!(mock.volume("pvc-2").is_none());
}

#[tokio::test]
async fn start_returns_the_driver_info() {
    let (mock, socket) = MockCsiDriver::start("hostpath.csi.k8s.io").unwrap();
    mock.set_vendor_version("v1.17.0");
    mock.set_plugin_capabilities([
        ServiceType::ControllerService,
        ServiceType::VolumeAccessibilityConstraints,
    ]);
    mock.set_controller_capabilities([
        RpcType::CreateDeleteVolume,
        RpcType::PublishUnpublishVolume,
        RpcType::CreateDeleteSnapshot,
        RpcType::SingleNodeMultiWriter,
    ]);
    mock.set_ready(None);
    let driver = mock.client(CALL_TIMEOUT);
    let info = start(&driver, &socket, &quick_start()).await.unwrap();
    assert_eq!(info.name, "hostpath.csi.k8s.io");
    assert_eq!(info.vendor_version, "v1.17.0");
    let capabilities = info.capabilities;
    assert!(capabilities.controller_service && capabilities.accessibility_constraints);
    assert!(capabilities.create_delete_volume && capabilities.publish_unpublish_volume);
    assert!(capabilities.create_delete_snapshot && capabilities.single_node_multi_writer);
    assert!(!capabilities.clone_volume);
}

#[tokio::test]
async fn start_refuses_a_driver_without_create_delete_volume() {
    let (mock, socket) = MockCsiDriver::start("hostpath.csi.k8s.io").unwrap();
    mock.set_controller_capabilities([RpcType::PublishUnpublishVolume]);
    let driver = mock.client(CALL_TIMEOUT);
    let error = start(&driver, &socket, &quick_start()).await.unwrap_err();
    assert!(matches!(error, StartError::Missing { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "the CSI driver at {} (hostpath.csi.k8s.io) does not offer CREATE_DELETE_VOLUME: \
             this sidecar cannot provision for it",
            socket.display()
        )
    );

    mock.set_plugin_capabilities([]);
    let error = start(&driver, &socket, &quick_start()).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("does not offer the CONTROLLER_SERVICE"),
        "{error}"
    );
}

#[tokio::test]
async fn start_refuses_an_empty_name() {
    let (mock, socket) = MockCsiDriver::start("").unwrap();
    let driver = mock.client(CALL_TIMEOUT);
    let error = start(&driver, &socket, &quick_start()).await.unwrap_err();
    assert!(matches!(error, StartError::EmptyName { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&socket.display().to_string()),
        "{error}"
    );
}

#[tokio::test]
async fn start_probes_until_ready() {
    let (mock, socket) = MockCsiDriver::start("mock").unwrap();
    mock.not_ready_for(2);
    mock.script(CsiMethod::Probe, [Answer::Error(Code::Unavailable)]);
    let driver = mock.client(CALL_TIMEOUT);
    start(&driver, &socket, &quick_start()).await.unwrap();
    // One Unavailable, two not ready, then ready.
    assert_eq!(mock.calls(CsiMethod::Probe), 4);
}

#[tokio::test]
async fn start_gives_up_on_a_driver_never_ready_or_failing_its_probe() {
    let (mock, socket) = MockCsiDriver::start("mock").unwrap();
    mock.set_ready(Some(false));
    let driver = mock.client(CALL_TIMEOUT);
    let config = quick_start().probe_timeout(Duration::from_millis(200));
    let error = start(&driver, &socket, &config).await.unwrap_err();
    assert!(matches!(error, StartError::NotReady { .. }), "{error:?}");
    assert!(error.to_string().contains("still not ready"), "{error}");
    assert_eq!(mock.calls(CsiMethod::GetPluginInfo), 0);

    mock.set_ready(Some(true));
    mock.script(CsiMethod::Probe, [Answer::Error(Code::FailedPrecondition)]);
    let error = start(&driver, &socket, &config).await.unwrap_err();
    assert!(
        matches!(error, StartError::Call { call: "Probe", .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "the CSI driver at {} failed Probe: Probe: FailedPrecondition injected by \
             MockCsiDriver (FailedPrecondition)",
            socket.display()
        )
    );
}

#[tokio::test]
async fn start_waits_for_a_socket_that_appears_late() {
    let mock = MockCsiDriver::new("late.csi.example.com").unwrap();
    let driver = mock.client(CALL_TIMEOUT);
    let serve_later = tokio::spawn({
        let mock = mock.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            mock.restart().unwrap();
        }
    });
    let info = start(&driver, mock.socket(), &quick_start()).await.unwrap();
    assert_eq!(info.name, "late.csi.example.com");
    serve_later.await.unwrap();
}

#[tokio::test]
async fn start_gives_up_on_a_socket_that_never_appears() {
    let mock = MockCsiDriver::new("mock").unwrap();
    let driver = mock.client(CALL_TIMEOUT);
    let config = quick_start().socket_timeout(Duration::from_millis(150));
    let error = start(&driver, mock.socket(), &config).await.unwrap_err();
    assert!(matches!(error, StartError::Socket { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains(&mock.socket().display().to_string())
            && text.contains("did not accept a connection"),
        "{text}"
    );
}

#[tokio::test]
async fn a_delayed_create_the_client_gave_up_on_does_nothing() {
    let (mock, _socket) = MockCsiDriver::start("mock").unwrap();
    mock.set_delay(CsiMethod::CreateVolume, Duration::from_millis(300));
    let driver = mock.client(Duration::from_millis(100));
    let error = driver
        .create_volume(create_request("pvc-1"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::DeadlineExceeded);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(mock.calls(CsiMethod::CreateVolume), 1);
    assert!(
        mock.volume("pvc-1").is_none(),
        "a cancelled call does no work"
    );
}

#[tokio::test]
async fn many_concurrent_creates_share_one_client() {
    let (mock, _socket) = MockCsiDriver::start("mock").unwrap();
    mock.set_delay(CsiMethod::CreateVolume, Duration::from_millis(50));
    let driver = mock.client(CALL_TIMEOUT);
    let calls: Vec<_> = (0..150)
        .map(|n| {
            let driver = driver.clone();
            tokio::spawn(async move {
                driver
                    .create_volume(create_request(&format!("pvc-{n}")))
                    .await
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for call in calls {
        ids.insert(call.await.unwrap().unwrap().volume.unwrap().volume_id);
    }
    assert_eq!(ids.len(), 150);
    assert_eq!(mock.volume_count(), 150);
}
