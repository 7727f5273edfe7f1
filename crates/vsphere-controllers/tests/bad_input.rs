//! The one-line messages of bad input: configuration files that do not exist, a kubeconfig
//! that cannot be parsed (never quoted: it holds credentials), an API server that cannot be
//! reached (named by its address), causes that repeat their source.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use vsphere_controllers::{Options, RunError, run};

fn options() -> Options {
    Options {
        kubeconfig: None,
        vsphere_config: None,
        provisioner_name: vsphere_cns::CSI_DRIVER.to_owned(),
        leader_election: false,
        metrics_address: None,
        datastores: Vec::new(),
        default_datastores: Vec::new(),
        claims: 1,
        serve: false,
        timeout: Duration::from_secs(60),
        demo: false,
        supervisor_feature_states: vsphere_controllers::FeatureStates::supervisor(),
        internal_feature_states: vsphere_controllers::FeatureStates::internal(),
    }
}

/// Runs with `options` and `KUBECONFIG` as given; the error's one line.
async fn message(options: &Options, kubeconfig_env: Option<&str>) -> (RunError, String) {
    let env = |name: &str| match name {
        "KUBECONFIG" => kubeconfig_env.map(str::to_owned),
        _ => None,
    };
    let mut out = Vec::new();
    let error = run(options, env, std::future::pending::<()>(), &mut out)
        .await
        .unwrap_err();
    let line = error.to_string();
    assert!(!line.contains('\n'), "one line: {line}");
    (error, line)
}

#[tokio::test]
async fn a_vsphere_config_that_does_not_exist_is_not_found() {
    let options = Options {
        vsphere_config: Some(PathBuf::from("/tmp/nope-i25.conf")),
        ..options()
    };
    let (error, line) = message(&options, None).await;
    assert_eq!(line, "--vsphere-config /tmp/nope-i25.conf: no such file");
    assert_eq!(error.exit_code(), 2);
}

#[tokio::test]
async fn a_kubeconfig_that_does_not_exist_is_not_found() {
    let (_, line) = message(&options(), Some("/tmp/nonexistent-i25")).await;
    assert_eq!(line, "KUBECONFIG=/tmp/nonexistent-i25: no such file");
    let options = Options {
        kubeconfig: Some(PathBuf::from("/tmp/nonexistent-i25")),
        ..options()
    };
    let (_, line) = message(&options, None).await;
    assert_eq!(line, "--kubeconfig /tmp/nonexistent-i25: no such file");
}

#[tokio::test]
async fn both_missing_are_named_once_each() {
    let options = Options {
        vsphere_config: Some(PathBuf::from("/tmp/nope-i25.conf")),
        ..options()
    };
    let (_, line) = message(&options, Some("/tmp/nonexistent-i25")).await;
    assert_eq!(
        line,
        "no such files: --vsphere-config /tmp/nope-i25.conf, KUBECONFIG=/tmp/nonexistent-i25"
    );
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn an_unparsable_kubeconfig_is_named_and_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write(
        dir.path(),
        "kubeconfig",
        "apiVersion: v1\nusers:\n- name: admin\n  user:\n    token: SECRET-TOKEN-i25\n   : [unclosed\n",
    );
    let conf = write(dir.path(), "csi-vsphere.conf", "");
    let options = Options {
        kubeconfig: Some(kubeconfig.clone()),
        vsphere_config: Some(conf),
        ..options()
    };
    let (error, line) = message(&options, None).await;
    assert_eq!(error.exit_code(), 1);
    let expected = format!(
        "kubeconfig {} is not a valid kubeconfig (a YAML error at line ",
        kubeconfig.display()
    );
    assert!(line.starts_with(&expected), "{line}");
    assert!(
        line.ends_with("; its content is not shown: it may hold credentials)"),
        "{line}"
    );
    assert!(!line.contains("SECRET"), "{line}");
    assert!(!line.contains("unclosed"), "{line}");
}

#[tokio::test]
async fn an_unreachable_api_server_is_named_by_its_address() {
    let dir = tempfile::tempdir().unwrap();
    // Loopback port 1: nothing listens there.
    let kubeconfig = write(
        dir.path(),
        "kubeconfig",
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    );
    let conf = write(dir.path(), "csi-vsphere.conf", "");
    let options = Options {
        vsphere_config: Some(conf),
        ..options()
    };
    let (_, line) = message(&options, Some(&kubeconfig.display().to_string())).await;
    assert!(
        line.starts_with("cannot reach the Kubernetes API server at http://127.0.0.1:1/: "),
        "{line}"
    );
}

#[test]
fn a_cause_that_repeats_its_source_is_printed_once() {
    let io = std::io::Error::other("connection refused");
    let error = anyhow::Error::new(io)
        .context("tcp connect error: connection refused")
        .context("client error (Connect)");
    let failed = RunError::from(
        Err::<(), _>(error)
            .context("cannot list claims")
            .unwrap_err(),
    );
    assert_eq!(
        failed.to_string(),
        "cannot list claims: client error (Connect): tcp connect error: connection refused"
    );
}
