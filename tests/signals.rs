//! The real binary (`cargo run --example vsphere`) stops gracefully on SIGTERM, as the
//! kubelet sends it, and on SIGINT: it drains, releases the Lease, logs out of vCenter and
//! exits 0. Each test runs the demo in `--serve` mode (kube-sim and the CNS simulator in
//! the process, on loopback), reads the Lease through the kubeconfig it prints, signals it
//! with `kill` and waits for it to exit.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::{Api, Client};
use tokio::time::Instant;

const LEASE_NAMESPACE: &str = "default";
const SERVING: &str = "serving; kubeconfig: ";
/// Nothing is in flight when the signal comes: the stop takes well under the grace.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// The example binary, built with the workspace-wide feature set (the one `cargo test
/// --workspace --all-features` uses, so nothing is rebuilt when it is fresh). A test target
/// only gets `CARGO_BIN_EXE_*` for the binaries of its own package, and the example is in
/// package `examples`: cargo builds it and says where it put it.
fn example_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--workspace", "--all-features", "--locked"])
            .args(["--example", "vsphere", "--message-format=json"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stderr(Stdio::inherit());
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let output = build.output().expect("cargo runs");
        assert!(
            output.status.success(),
            "cargo build --example vsphere failed"
        );
        let stdout = String::from_utf8(output.stdout).expect("cargo writes UTF-8");
        let line = stdout
            .lines()
            .find(|l| l.contains(r#""kind":["example"]"#) && l.contains(r#""name":"vsphere""#))
            .expect("cargo reports the vsphere example");
        let start = line.find(r#""executable":""#).expect("an executable") + 14;
        let end = start + line[start..].find('"').expect("a closing quote");
        PathBuf::from(&line[start..end])
    })
}

/// The demo binary, serving, with its output read line by line.
struct Served {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    lines: Vec<String>,
}

impl Served {
    fn start() -> Self {
        let mut child = Command::new(example_binary())
            .args(["--demo", "--serve", "--claims", "1", "--timeout", "60"])
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("POD_NAMESPACE")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example binary starts");
        let (sender, stdout) = mpsc::channel();
        let out = BufReader::new(child.stdout.take().expect("piped"));
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let err = BufReader::new(child.stderr.take().expect("piped"));
        let stderr = std::thread::spawn(move || {
            err.lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
                .join("\n")
        });
        Self {
            child,
            stdout,
            stderr: Some(stderr),
            lines: Vec::new(),
        }
    }

    /// The next line of stdout, within `limit`.
    fn next_line(&mut self, limit: Duration) -> Option<String> {
        let line = self.stdout.recv_timeout(limit).ok()?;
        self.lines.push(line.clone());
        Some(line)
    }

    /// Waits for the line that prints the kubeconfig path.
    fn kubeconfig(&mut self) -> PathBuf {
        let deadline = Duration::from_secs(90);
        let started = Instant::now();
        while started.elapsed() < deadline {
            match self.next_line(Duration::from_secs(1)) {
                Some(line) => {
                    if let Some(path) = line.strip_prefix(SERVING) {
                        return PathBuf::from(path.trim());
                    }
                }
                None => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!(
                            "the demo exited ({status}) before serving:\n{}",
                            self.lines.join("\n")
                        );
                    }
                }
            }
        }
        panic!(
            "the demo did not serve within {deadline:?}:\n{}",
            self.lines.join("\n")
        );
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits up to `limit` for the process to exit; kills it past that.
    async fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("wait works") {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// The rest of stdout (the process has exited) and all of stderr.
    fn output(mut self) -> (String, String) {
        while self.next_line(Duration::from_secs(5)).is_some() {}
        let stderr = self.stderr.take().map(|t| t.join().unwrap_or_default());
        let stderr = stderr.unwrap_or_default();
        (self.lines.join("\n"), stderr)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn client(kubeconfig: &PathBuf) -> Client {
    let file = Kubeconfig::read_from(kubeconfig).expect("the printed kubeconfig reads");
    let config = kube_client::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("the printed kubeconfig is valid");
    Client::try_from(config).expect("a client")
}

/// The holder of the demo's Lease, waiting up to 20 s for one.
async fn holder(client: &Client, name: &str) -> String {
    let leases = Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE);
    let started = Instant::now();
    loop {
        let lease = leases.get_opt(name).await.expect("the lease reads");
        let holder = lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty());
        if let Some(holder) = holder {
            return holder;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "nobody took lease {LEASE_NAMESPACE}/{name}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stops_gracefully_on(signal: &str) {
    let lease_name = vsphere_cns::CSI_DRIVER;
    let mut served = Served::start();
    let kubeconfig = served.kubeconfig();
    let client = client(&kubeconfig).await;
    let holder = holder(&client, lease_name).await;

    served.signal(signal);
    let status = served.exit_within(EXIT_WITHIN).await;
    let (stdout, stderr) = served.output();
    let context =
        format!("lease held by {holder} before the signal\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let status = status
        .unwrap_or_else(|| panic!("still running {EXIT_WITHIN:?} after SIG{signal}; {context}"));
    assert!(
        status.success(),
        "exit status {status} after SIG{signal}; {context}"
    );
    assert!(
        stderr.contains(&format!("SIG{signal}: stopping")),
        "the signal is acknowledged; {context}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "stopped: lease {LEASE_NAMESPACE}/{lease_name} released, vCenter session logged out"
        ),
        "{context}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_releases_the_lease_logs_out_and_exits_0() {
    stops_gracefully_on("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_the_binary_as_gracefully_as_sigterm() {
    stops_gracefully_on("INT").await;
}
