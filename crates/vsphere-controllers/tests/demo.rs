//! The embedded run of `cargo run --example vsphere`: the same code, against kube-sim and
//! the CNS simulator, must provision, sync and delete every claim.

use std::path::PathBuf;
use std::time::Duration;

use vsphere_controllers::{
    DEFAULT_VSPHERE_CONFIG, DEMO_BANNER, DemoOptions, Found, Mode, Options, RunError, run,
    run_demo, select_mode,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_provisions_syncs_and_deletes_every_claim() {
    let options = DemoOptions {
        claims: 3,
        provisioner_name: vsphere_cns::CSI_DRIVER.to_owned(),
        leader_election: false,
        metrics_address: None,
        serve: false,
        timeout: Duration::from_secs(60),
    };
    let mut out = Vec::new();
    let report = run_demo(&options, std::future::pending(), &mut out)
        .await
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    println!("{text}");

    assert_eq!(report.rows.len(), 3, "{text}");
    for (i, row) in report.rows.iter().enumerate() {
        assert_eq!(row.claim, format!("demo-claim-{}", i + 1));
        assert!(row.pv.starts_with("pvc-"), "{row:?}");
        assert_eq!(row.volume_id.len(), 36, "a UUID: {row:?}");
        assert!(row.synced, "{row:?}");
    }
    let sizes: Vec<&str> = report.rows.iter().map(|r| r.size.as_str()).collect();
    assert_eq!(sizes, ["1Gi", "1500Mi", "1908Mi"]);
    assert_eq!(report.volumes_left, 0);
    assert!(text.contains("METADATA SYNCED"), "{text}");
    assert_eq!(text.matches("metadata synced to CNS").count(), 3, "{text}");
    assert_eq!(text.matches("CNS volume deleted").count(), 3, "{text}");
    assert!(
        text.contains(
            "done: 3 claims provisioned, synced and deleted; the CNS simulator holds 0 volumes"
        ),
        "{text}"
    );
}

#[test]
fn the_mode_follows_what_is_configured() {
    assert_eq!(select_mode(&Found::default()), Ok(Mode::Demo));
    assert!(DEMO_BANNER.starts_with("no kubeconfig and no vSphere config"));

    let both = Found {
        kubeconfig_flag: Some(PathBuf::from("/k")),
        vsphere_flag: Some(PathBuf::from("/v.conf")),
        ..Found::default()
    };
    assert_eq!(
        select_mode(&both),
        Ok(Mode::Real {
            kubeconfig: Some(PathBuf::from("/k")),
            vsphere_config: PathBuf::from("/v.conf"),
        })
    );
    let in_pod = Found {
        in_pod: true,
        default_vsphere_exists: true,
        ..Found::default()
    };
    assert_eq!(
        select_mode(&in_pod),
        Ok(Mode::Real {
            kubeconfig: None,
            vsphere_config: PathBuf::from(DEFAULT_VSPHERE_CONFIG),
        })
    );
    let forced = Found {
        force_demo: true,
        ..both.clone()
    };
    assert_eq!(select_mode(&forced), Ok(Mode::Demo));
}

#[test]
fn a_half_configuration_is_an_error_saying_what_is_missing() {
    let kube_only = Found {
        kubeconfig_env: true,
        ..Found::default()
    };
    let err = select_mode(&kube_only).unwrap_err();
    assert!(
        err.contains("KUBECONFIG") && err.contains("no vSphere config"),
        "{err}"
    );
    let vsphere_only = Found {
        vsphere_flag: Some(PathBuf::from("/etc/x.conf")),
        ..Found::default()
    };
    let err = select_mode(&vsphere_only).unwrap_err();
    assert!(
        err.contains("/etc/x.conf") && err.contains("no kubeconfig"),
        "{err}"
    );
}

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

/// `KUBECONFIG` and `KUBERNETES_SERVICE_HOST` both set, as `env` tells.
fn in_a_pod_with_kubeconfig(name: &str) -> Option<String> {
    matches!(name, "KUBECONFIG" | "KUBERNETES_SERVICE_HOST").then(|| "set".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_demo_runs_the_demo_whatever_the_environment_says() {
    let options = Options {
        demo: true,
        ..options()
    };
    let mut out = Vec::new();
    let never = std::future::pending::<()>();
    run(&options, in_a_pod_with_kubeconfig, never, &mut out)
        .await
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with(DEMO_BANNER), "{text}");
    assert!(
        text.contains("done: 1 claim provisioned, synced and deleted"),
        "{text}"
    );
}

#[tokio::test]
async fn run_with_half_a_configuration_is_a_usage_error_exiting_2() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("x.conf");
    std::fs::write(&conf, "").unwrap();
    let options = Options {
        vsphere_config: Some(conf.clone()),
        ..options()
    };
    let mut out = Vec::new();
    let err = run(
        &options,
        |_: &str| None,
        std::future::pending::<()>(),
        &mut out,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RunError::Usage(_)), "{err:?}");
    assert_eq!(err.exit_code(), 2);
    let message = err.to_string();
    assert!(
        message.contains(&conf.display().to_string()) && message.contains("no kubeconfig"),
        "{message}"
    );
    assert!(out.is_empty(), "nothing runs");

    // The environment is read through `env`: a kubeconfig there, no vSphere config.
    let options = Options {
        vsphere_config: None,
        ..options
    };
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "").unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    let env = |name: &str| (name == "KUBECONFIG").then(|| kubeconfig.clone());
    if !vsphere_controllers::exists(DEFAULT_VSPHERE_CONFIG.as_ref()) {
        let err = run(&options, env, std::future::pending::<()>(), &mut out)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("found a kubeconfig (KUBECONFIG)"),
            "{err}"
        );
        assert_eq!(err.exit_code(), 2);
    }
}
