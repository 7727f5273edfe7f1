//! The `csi-provisioner` binary as a process: against kube-sim (through a kubeconfig file)
//! and a [`MockCsiDriver`] on a unix socket, as it runs beside a driver. A claim binds;
//! upstream's #486 on the real process (SIGKILL while CreateVolume runs, the claim deleted,
//! the binary started again: the volume is deleted); and its exits: a refused flag (2) and
//! a driver without CREATE_DELETE_VOLUME (1), each with one line.

#![cfg(feature = "binary")]

mod sidecar;

use std::{
    path::Path,
    process::{Output, Stdio},
    time::Duration,
};

use csi_provisioner::{
    csi::controller_service_capability::RpcType,
    testing::{Answer, CsiMethod, MockCsiDriver},
};
use kube_client::Api;
use kube_sim::KubeSim;
use sidecar::{
    DRIVER, claim_bound, claim_gone, create_claim, delete_claim, eventually, leaks, pv_count,
    until_clean, world,
};
use tokio::process::{Child, Command};

const BINARY: &str = env!("CARGO_BIN_EXE_csi-provisioner");
const STEP: Duration = Duration::from_secs(20);

/// The binary with `args`, its environment cleared of what would override them (logs off
/// unless `logs`).
fn command(args: &[&str], logs: bool) -> Command {
    let mut command = Command::new(BINARY);
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("POD_NAMESPACE")
        .env("RUST_LOG", if logs { "info" } else { "off" })
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The sidecar for `mock` against the sim whose kubeconfig is `kubeconfig`, logging to
/// `log`.
fn spawn(mock: &MockCsiDriver, kubeconfig: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("the log file opens");
    command(
        &[
            "--csi-address",
            &mock.address(),
            "--kubeconfig",
            kubeconfig.to_str().expect("a UTF-8 path"),
            "--timeout",
            "5s",
            "--retry-interval-start",
            "100ms",
            "--retry-interval-max",
            "1s",
        ],
        true,
    )
    .stdout(Stdio::null())
    .stderr(log)
    .spawn()
    .expect("the binary starts")
}

/// Runs the binary to its end (bounded) and returns what it printed.
async fn run_to_exit(mut command: Command) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("the binary exits")
        .expect("its output is read")
}

/// The lines of stderr, asserting there is exactly one.
fn one_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr:?}");
    lines[0].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_binds_a_claim_and_survives_sigkill_during_create_volume_upstream_486() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    let log = dir.path().join("sidecar.log");
    let (sim, mock) = world(KubeSim::builder().kubeconfig_path(&kubeconfig)).await;
    let client = sim.client();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    let mut first = spawn(&mock, &kubeconfig, &log);
    create_claim(&client, "data").await;
    let bound = tokio::time::timeout(STEP, async {
        while !claim_bound(&client, "data").await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        bound.is_ok(),
        "the claim did not bind; the sidecar's log:\n{}",
        logs()
    );
    assert!(leaks(&client, &mock).await.is_consistent());
    assert_eq!(mock.volume_count(), 1);

    // #486: the volume is made 1 s after the call, whatever becomes of the caller.
    mock.script(
        CsiMethod::CreateVolume,
        [Answer::LandsAfter(Duration::from_secs(1))],
    );
    let creates = mock.calls(CsiMethod::CreateVolume);
    let name = create_claim(&client, "doomed").await;
    tokio::time::timeout(
        STEP,
        mock.wait_until(|m| m.calls(CsiMethod::CreateVolume) > creates),
    )
    .await
    .expect("CreateVolume of the second claim arrives");
    first.start_kill().expect("SIGKILL");
    let status = first.wait().await.expect("the killed process is reaped");
    assert!(!status.success(), "killed: {status}");
    tokio::time::timeout(STEP, mock.wait_until(|m| m.volume(&name).is_some()))
        .await
        .expect("the volume lands on the driver");
    let made = mock.volume(&name).expect("landed");
    assert_eq!(pv_count(&client).await, 1, "only the first claim's PV");
    delete_claim(&client, "doomed").await;
    eventually("the claim is gone", STEP, async || {
        claim_gone(&client, "doomed").await
    })
    .await;

    let mut second = spawn(&mock, &kubeconfig, &log);
    let deleted = tokio::time::timeout(STEP, mock.wait_until(|m| m.volume(&name).is_none())).await;
    assert!(
        deleted.is_ok(),
        "the volume of the claim deleted while the sidecar was dead is still on the driver; \
         the sidecar's log:\n{}",
        logs()
    );
    assert_eq!(
        mock.last_delete_volume().map(|d| d.volume_id),
        Some(made.id),
        "DeleteVolume of the landed volume"
    );
    // Its PV (saved by the replay, released at once) goes too; the first claim stays.
    eventually("the PV of the deleted claim is gone", STEP, async || {
        pv_count(&client).await == 1
    })
    .await;
    let found = leaks(&client, &mock).await;
    assert!(found.is_consistent(), "{found:?}");
    assert_eq!(found.claims, ["default/data"]);

    delete_claim(&client, "data").await;
    let found = until_clean(&client, &mock, STEP).await;
    assert!(
        found.is_clean(),
        "{found:?}; the sidecar's log:\n{}",
        logs()
    );
    second.start_kill().expect("SIGKILL");
    let _ = second.wait().await;
    assert_eq!(mock.volume_count(), 0);
    assert!(logs().contains(DRIVER), "the log names the driver");
}

#[tokio::test]
async fn a_refused_flag_exits_2_with_one_line_naming_it() {
    let output = run_to_exit(command(
        &[
            "--csi-address",
            "unix:///nonexistent/csi.sock",
            "--enable-capacity",
        ],
        true,
    ))
    .await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let line = one_line(&output);
    assert!(
        line.starts_with("csi-provisioner: --enable-capacity"),
        "{line}"
    );
}

#[tokio::test]
async fn a_driver_without_create_delete_volume_exits_1_with_one_line() {
    let (mock, _socket) = MockCsiDriver::start(DRIVER).expect("the mock driver starts");
    mock.set_controller_capabilities([RpcType::PublishUnpublishVolume]);
    let output = run_to_exit(command(
        &[
            "--csi-address",
            &mock.address(),
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ],
        false,
    ))
    .await;
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let line = one_line(&output);
    assert!(
        line.starts_with("csi-provisioner: ") && line.contains("CREATE_DELETE_VOLUME"),
        "{line}"
    );
    assert_eq!(
        mock.calls(CsiMethod::ControllerGetCapabilities),
        1,
        "it asked the driver"
    );
    assert_eq!(mock.calls(CsiMethod::CreateVolume), 0);
}

/// A free loopback port (bound and let go).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.local_addr().expect("its address").port()
}

/// `GET path` on the sidecar's HTTP endpoint: status and body.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The holder of the driver's Lease in `namespace`, once there is one.
async fn lease_holder(client: &kube_client::Client, namespace: &str) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), namespace);
    let lease = leases
        .get_opt(&csi_provisioner::rbac::lease_name(DRIVER))
        .await
        .ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

// Upstream: `--http-endpoint` serves metrics and `/healthz/leader-election`; the Lease is in
// `--leader-election-namespace`, else the pod's namespace. Here the same address serves
// metrics, `/healthz` and `/readyz`; the Lease is in the flag's namespace, else
// POD_NAMESPACE; `--kube-api-qps` and `--kube-api-burst` are accepted, logged as unused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leader_election_it_serves_its_probes_and_leads_from_the_namespace_it_is_given() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    let log = dir.path().join("sidecar.log");
    let (sim, mock) = world(KubeSim::builder().kubeconfig_path(&kubeconfig)).await;
    let client = sim.client();
    for name in ["team-a", "elsewhere"] {
        let namespace = k8s_openapi::api::core::v1::Namespace {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&Default::default(), &namespace)
            .await
            .expect("namespace created");
    }
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let start = |extra: &[&str]| {
        let port = free_port();
        let endpoint = format!("--http-endpoint=127.0.0.1:{port}");
        let mut args = vec![
            "--csi-address",
            &*mock.address(),
            "--kubeconfig",
            kubeconfig.to_str().expect("a UTF-8 path"),
            "--leader-election",
            &endpoint,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("the log file opens");
        let child = command(&args, true)
            .env("POD_NAMESPACE", "team-a")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the binary starts");
        (child, port)
    };

    let (mut first, port) = start(&["--kube-api-qps=50", "--kube-api-burst=100"]);
    eventually("the sidecar leads from POD_NAMESPACE", STEP, async || {
        lease_holder(&client, "team-a").await.is_some()
    })
    .await;
    eventually("/readyz answers 200", STEP, async || {
        http_get(port, "/readyz")
            .await
            .is_some_and(|(s, _)| s == 200)
    })
    .await;
    assert_eq!(http_get(port, "/healthz").await.map(|(s, _)| s), Some(200));
    let (status, metrics) = http_get(port, "/metrics").await.expect("metrics served");
    assert_eq!(status, 200);
    assert!(
        metrics.lines().any(|l| l == "controller_leader 1"),
        "{metrics}"
    );
    create_claim(&client, "data").await;
    eventually("the claim binds", STEP, async || {
        claim_bound(&client, "data").await
    })
    .await;
    assert!(
        logs().contains("--kube-api-qps and --kube-api-burst are accepted and not used"),
        "{}",
        logs()
    );
    first.start_kill().expect("SIGKILL");
    let _ = first.wait().await;

    // The flag wins over POD_NAMESPACE.
    let (mut second, _) = start(&["--leader-election-namespace=elsewhere"]);
    eventually(
        "the sidecar leads from the flag's namespace",
        STEP,
        async || lease_holder(&client, "elsewhere").await.is_some(),
    )
    .await;
    second.start_kill().expect("SIGKILL");
    let _ = second.wait().await;
    assert_eq!(mock.volume_count(), 1);
}
