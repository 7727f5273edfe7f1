//! The README driver (`examples/my_driver.rs`), run as a user runs it, fails with one line
//! naming the problem: a missing kubeconfig (its path, quoted once), an API server that is
//! not listening, a metrics port in use (the port and `METRICS_PORT`). Loopback only.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The example binary, built as `cargo test --workspace --all-features` builds it.
fn driver() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--workspace", "--all-features", "--locked"])
            .args(["--example", "my_driver", "--message-format=json"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stderr(Stdio::inherit());
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let output = build.output().expect("cargo runs");
        assert!(
            output.status.success(),
            "cargo build --example my_driver failed"
        );
        let stdout = String::from_utf8(output.stdout).expect("cargo writes UTF-8");
        let line = stdout
            .lines()
            .find(|l| l.contains(r#""kind":["example"]"#) && l.contains(r#""name":"my_driver""#))
            .expect("cargo reports the my_driver example");
        let start = line.find(r#""executable":""#).expect("an executable") + 14;
        let end = start + line[start..].find('"').expect("a closing quote");
        PathBuf::from(&line[start..end])
    })
}

/// Runs the driver with `env` and returns its exit success and its last line on stderr.
async fn run(env: &[(&str, String)]) -> (bool, String) {
    let mut command = tokio::process::Command::new(driver());
    command
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent-home")
        .env("RUST_LOG", "off")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the driver stopped")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    assert!(!last.contains("Some(") && !last.contains(" { "), "{stderr}");
    (output.status.success(), last)
}

#[tokio::test]
async fn a_missing_kubeconfig_is_named_once() {
    let (ok, line) = run(&[("KUBECONFIG", "/nonexistent/kubeconfig".into())]).await;
    assert!(!ok);
    assert_eq!(
        line,
        "error: cannot find a usable Kubernetes configuration (kubeconfig or in-cluster \
         service account): cannot read the kubeconfig /nonexistent/kubeconfig: No such file \
         or directory (os error 2); not in a cluster either"
    );
}

#[tokio::test]
async fn an_api_server_that_is_not_listening_is_connection_refused() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let kubeconfig = std::env::temp_dir().join(format!("closed-{}.yaml", std::process::id()));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \
             \"http://127.0.0.1:{port}\"}}}}]\nusers: [{{name: u, user: {{token: t0k3n-s3cr3t}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let (ok, line) = run(&[("KUBECONFIG", kubeconfig.display().to_string())]).await;
    let _ = std::fs::remove_file(&kubeconfig);
    assert!(!ok);
    assert!(!line.contains("t0k3n"), "{line}");
    assert_eq!(
        line,
        format!(
            "error: cannot reach the API server at http://127.0.0.1:{port}/: connection refused \
             (nothing listens there: is the API server running, and is the kubeconfig's server \
             address right?)"
        )
    );
}

#[tokio::test]
async fn a_metrics_port_in_use_names_the_port_and_metrics_port() {
    let sim = kube_sim::KubeSim::start().await.unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (ok, line) = run(&[
        ("KUBECONFIG", sim.kubeconfig_path().display().to_string()),
        ("POD_NAMESPACE", "default".into()),
        ("METRICS_PORT", port.to_string()),
        (
            "MY_DRIVER_ROOT",
            std::env::temp_dir()
                .join("my-driver-port")
                .display()
                .to_string(),
        ),
    ])
    .await;
    drop(taken);
    assert!(!ok);
    assert!(
        line.starts_with("error: metrics and probe server failed: "),
        "{line}"
    );
    assert!(line.contains(&format!(":{port}")), "{line}");
    assert!(
        line.ends_with("(METRICS_PORT chooses another port)"),
        "{line}"
    );
    println!("{line}");
}
