//! `vsphere uninstall` ([`Cli::run`] and [`vsphere_controllers::uninstall`]) against
//! kube-sim, after a provision controller was stopped in the middle of a provisioning.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_client::Api;
use kube_client::api::{ListParams, PostParams};
use kube_sim::KubeSim;
use provision_controller::annotations::FINALIZER_PV;
use provision_controller::annotations::JOURNAL_LABEL;
use provision_controller::testing::{FakeProvisioner, ProvisionStep, class, pv, pvc};
use provision_controller::{Config, ProvisionController};
use vsphere_controllers as app;
use vsphere_controllers::cli::Cli;

const DRIVER: &str = vsphere_cns::CSI_DRIVER;

/// kube-sim with a provision controller of [`DRIVER`] killed while its driver call
/// for the claim `default/data` was in flight (its intent in the journal), and a PV
/// `pvc-static` of [`DRIVER`] with the PV finalizer. Returns the sim and the
/// in-flight PV name.
async fn stopped_mid_provision() -> (KubeSim, String) {
    stopped_mid_provision_with(None).await
}

/// [`stopped_mid_provision`] with the journal in namespace `journal` (created first).
async fn stopped_mid_provision_with(journal: Option<&str>) -> (KubeSim, String) {
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let client = sim.client();
    if let Some(name) = journal {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    let config = Config::default().journal_namespace(journal.map(str::to_owned));
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &class("thin").provisioner(DRIVER).build(),
        )
        .await
        .unwrap();
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Block]);
    let controller = ProvisionController::new(client.clone(), DRIVER, fake.clone())
        .config(config.leader_election(None));
    let run = tokio::spawn(controller.run(std::future::pending::<()>()));
    let claim = Api::<PersistentVolumeClaim>::namespaced(client, "default")
        .create(
            &PostParams::default(),
            &pvc("data").storage_class("thin").build(),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), fake.wait_blocked(1))
        .await
        .expect("the driver is called");
    run.abort();
    let _ = run.await;
    // Created once the controller is gone: it would take the finalizer off (its
    // add_finalizer is off).
    Api::<PersistentVolume>::all(sim.client())
        .create(
            &PostParams::default(),
            &pv("pvc-static")
                .provisioned_by(DRIVER)
                .finalizer(FINALIZER_PV)
                .build(),
        )
        .await
        .unwrap();
    (sim, format!("pvc-{}", claim.metadata.uid.unwrap()))
}

fn options(sim: &KubeSim) -> app::UninstallOptions {
    app::UninstallOptions {
        kubeconfig: Some(sim.kubeconfig_path().to_owned()),
        provisioner_name: DRIVER.to_owned(),
        ..app::UninstallOptions::default()
    }
}

async fn journal_objects(sim: &KubeSim) -> usize {
    let params = ListParams::default().labels(JOURNAL_LABEL);
    Api::<ConfigMap>::all(sim.client())
        .list(&params)
        .await
        .unwrap()
        .items
        .len()
}

async fn journal_objects_in(sim: &KubeSim, namespace: &str) -> usize {
    let params = ListParams::default().labels(JOURNAL_LABEL);
    let maps: Api<ConfigMap> = Api::namespaced(sim.client(), namespace);
    maps.list(&params).await.unwrap().items.len()
}

async fn has_finalizer(sim: &KubeSim, name: &str) -> bool {
    let v = Api::<PersistentVolume>::all(sim.client())
        .get(name)
        .await
        .unwrap();
    v.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER_PV)
}

#[tokio::test]
async fn uninstall_reports_the_volume_to_check_and_removes_the_journal() {
    let (sim, in_flight) = stopped_mid_provision().await;
    assert_eq!(
        journal_objects(&sim).await,
        1,
        "the controller wrote its journal"
    );

    // As the binary runs it: `vsphere uninstall --kubeconfig FILE`.
    let kubeconfig = sim.kubeconfig_path().display().to_string();
    let args = ["vsphere", "uninstall", "--kubeconfig", &kubeconfig];
    let cli = Cli::parse(args.map(ToOwned::to_owned)).unwrap();
    let never = || -> std::io::Result<std::future::Pending<()>> { panic!("not for uninstall") };
    let mut out = Vec::new();
    let result = cli.run(|_| None, never, &mut out).await;
    let out = String::from_utf8(out).unwrap();
    assert!(result.is_ok(), "{result:?}: {out}");
    let lease = format!("default/{DRIVER}");
    assert!(
        out.contains(&format!(
            "the journal of its Lease {lease} (ConfigMaps in namespace default)\n"
        )),
        "{out}"
    );
    assert!(out.contains("journal objects deleted: 1\n"), "{out}");
    assert!(
        out.contains(&format!(
            "check the backend for volume {in_flight} (claim default/data)"
        )),
        "{out}"
    );
    assert!(out.contains("PV finalizers kept"), "{out}");
    assert_eq!(journal_objects(&sim).await, 0);
    assert!(
        has_finalizer(&sim, "pvc-static").await,
        "kept without the flag"
    );

    let remove = app::UninstallOptions {
        remove_pv_finalizers: true,
        ..options(&sim)
    };
    let mut out = Vec::new();
    let report = app::uninstall(&remove, |_| None, &mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(report.records.is_empty(), "{report:?}");
    assert_eq!(report.finalizers_removed, ["pvc-static"]);
    assert!(out.contains("journal objects deleted: 0\n"), "{out}");
    assert!(out.contains("provisionings in flight: none\n"), "{out}");
    assert!(out.contains("PV finalizers removed: 1\n"), "{out}");
    assert!(
        out.contains(&format!("persistentvolume pvc-static: {FINALIZER_PV}")),
        "{out}"
    );
    assert!(!has_finalizer(&sim, "pvc-static").await);
}

#[tokio::test]
async fn uninstall_refuses_while_the_lease_is_held_and_touches_nothing() {
    let (sim, _) = stopped_mid_provision().await;
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(DRIVER.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("replica-1".to_owned()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    Api::<Lease>::namespaced(sim.client(), "default")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let remove = app::UninstallOptions {
        remove_pv_finalizers: true,
        ..options(&sim)
    };
    let mut out = Vec::new();
    let error = app::uninstall(&remove, |_| None, &mut out)
        .await
        .unwrap_err();
    let message = error.to_string();
    assert_eq!(error.exit_code(), 1);
    assert!(
        message.starts_with(&format!(
            "the controller still runs: the Lease default/{DRIVER} is held by replica-1"
        )),
        "{message}"
    );
    assert!(message.contains("scale its Deployment to 0"), "{message}");
    assert_eq!(journal_objects(&sim).await, 1, "the journal stays");
    assert!(has_finalizer(&sim, "pvc-static").await);
}

#[tokio::test]
async fn a_missing_kubeconfig_is_a_usage_error_naming_it() {
    let options = app::UninstallOptions {
        kubeconfig: Some("/nonexistent/kubeconfig".into()),
        provisioner_name: DRIVER.to_owned(),
        ..app::UninstallOptions::default()
    };
    let mut out = Vec::new();
    let error = app::uninstall(&options, |_| None, &mut out)
        .await
        .unwrap_err();
    assert_eq!(error.exit_code(), 2);
    assert_eq!(
        error.to_string(),
        "--kubeconfig /nonexistent/kubeconfig: no such file"
    );
}

#[tokio::test]
async fn uninstall_finds_a_journal_in_a_namespace_of_its_own() {
    const JOURNAL: &str = "vmware-system-csi-journal";
    let (sim, in_flight) = stopped_mid_provision_with(Some(JOURNAL)).await;
    assert_eq!(journal_objects_in(&sim, JOURNAL).await, 1);
    assert_eq!(journal_objects_in(&sim, "default").await, 0);

    // The controller's namespace alone finds no journal to remove.
    let mut out = Vec::new();
    app::uninstall(&options(&sim), |_| None, &mut out)
        .await
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("journal objects deleted: 0\n"), "{out}");
    assert_eq!(journal_objects_in(&sim, JOURNAL).await, 1);

    // As the Deployment runs it: JOURNAL_NAMESPACE in the container's environment.
    let env = |name: &str| (name == "JOURNAL_NAMESPACE").then(|| JOURNAL.to_owned());
    let mut out = Vec::new();
    app::uninstall(&options(&sim), env, &mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains(&format!("(ConfigMaps in namespace {JOURNAL})")),
        "{out}"
    );
    assert!(out.contains("journal objects deleted: 1\n"), "{out}");
    assert!(
        out.contains(&format!("check the backend for volume {in_flight}")),
        "{out}"
    );
    assert_eq!(journal_objects_in(&sim, JOURNAL).await, 0);

    // And the flag, which wins over the environment.
    let (sim, _) = stopped_mid_provision_with(Some(JOURNAL)).await;
    let kubeconfig = sim.kubeconfig_path().display().to_string();
    let args = [
        "vsphere",
        "uninstall",
        "--kubeconfig",
        &kubeconfig,
        "--journal-namespace",
        JOURNAL,
    ];
    let cli = Cli::parse(args.map(ToOwned::to_owned)).unwrap();
    let never = || -> std::io::Result<std::future::Pending<()>> { panic!("not for uninstall") };
    let mut out = Vec::new();
    let wrong = |name: &str| (name == "JOURNAL_NAMESPACE").then(|| "elsewhere".to_owned());
    cli.run(wrong, never, &mut out).await.unwrap();
    assert_eq!(journal_objects_in(&sim, JOURNAL).await, 0);
}
