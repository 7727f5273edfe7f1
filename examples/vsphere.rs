//! `cargo run --example vsphere`: flags for [`vsphere_controllers::run`], both controllers
//! against the cluster and vCenter it finds, or else a demo on simulators (`docs/vcenter.md`).
//!
//! `cargo run --example vsphere -- uninstall [--remove-pv-finalizers]` runs
//! [`vsphere_controllers::uninstall`] instead: once every replica is stopped, it removes
//! the provision controller's journal (and, when asked, the PV finalizer from its PVs) and
//! reports the provisionings that were in flight, whose volumes to check in vCenter.
//!
//! SIGTERM (the kubelet's) and SIGINT (Ctrl-C) both stop it gracefully: the drain, the lease
//! release, the vCenter logout, within the controllers' stop deadline; a second signal
//! exits at once (143 or 130).

use std::{io, io::IsTerminal, net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{CommandFactory, Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use vsphere_controllers as app;

/// vSphere CNS provisioner and CnsVolumeMetadata reconciler (a demo without configuration).
#[derive(Debug, Parser)]
#[command(name = "vsphere", version, args_conflicts_with_subcommands = true)]
struct Args {
    /// Kubeconfig file; default `KUBECONFIG`, or the in-cluster service account.
    #[arg(long, value_name = "FILE", global = true)]
    kubeconfig: Option<PathBuf>,
    /// csi-vsphere.conf; default /etc/cloud/csi-vsphere.conf when it exists.
    #[arg(long, value_name = "FILE")]
    vsphere_config: Option<PathBuf>,
    /// Provisioner name that StorageClasses name.
    #[arg(long, default_value = vsphere_cns::CSI_DRIVER, global = true)]
    provisioner_name: String,
    /// Elect a leader through a Lease (the provisioner and the CnsVolumeMetadata reconciler
    /// run on the leader only); `--leader-election=false` runs them on every replica. A bare
    /// `--leader-election` (as upstream's Go manifests pass it) means true.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    leader_election: bool,
    /// Serve provision-controller metrics on this address, e.g. 0.0.0.0:8080.
    #[arg(long, value_name = "ADDR")]
    metrics_address: Option<SocketAddr>,
    /// Map a `datastoreurl` class parameter to a datastore MoRef: URL=MOREF (repeatable).
    #[arg(long = "datastore", value_name = "URL=MOREF", value_parser = app::parse_datastore)]
    datastores: Vec<(String, String)>,
    /// Datastore MoRef used when a class names none (repeatable).
    #[arg(long = "default-datastore", value_name = "MOREF")]
    default_datastores: Vec<String>,
    /// Demo: number of claims to create.
    #[arg(long, default_value_t = 3)]
    claims: usize,
    /// Demo: keep running after provisioning (until SIGTERM or Ctrl-C) and print the
    /// kubeconfig for kubectl.
    #[arg(long)]
    serve: bool,
    /// Demo: limit of each wait, in seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Run the demo even when a kubeconfig or vSphere config is found.
    #[arg(long)]
    demo: bool,
    /// Name of upstream's feature-state ConfigMap (its `tkgs-ha` key is watched on a
    /// supervisor).
    #[arg(long, default_value = app::DEFAULT_FSS_NAME, value_name = "NAME")]
    fss_name: String,
    /// Namespace of upstream's feature-state ConfigMap.
    #[arg(long, default_value = app::DEFAULT_FSS_NAMESPACE, value_name = "NAMESPACE")]
    fss_namespace: String,
    /// Without a subcommand: run the controllers (or the demo).
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Once every replica is stopped (scale the Deployment to 0): delete the provision
    /// controller's journal and report the provisionings that were in flight (volumes to
    /// check in vCenter); with --remove-pv-finalizers, also remove the PV finalizer from
    /// this provisioner's PVs.
    Uninstall(UninstallArgs),
}

#[derive(Debug, clap::Args)]
struct UninstallArgs {
    /// Also remove external-provisioner.volume.kubernetes.io/finalizer from this
    /// provisioner's PVs: only when no provisioner of this name (this one, upstream's
    /// csi-provisioner) will run again; a PV deleted then keeps its CNS volume.
    #[arg(long)]
    remove_pv_finalizers: bool,
    /// The controller's namespace (its Lease's); default `POD_NAMESPACE`, else the
    /// kubeconfig context's namespace.
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// The controller's Lease name; default the provisioner name with '/' replaced by '-'.
    #[arg(long, value_name = "NAME")]
    lease_name: Option<String>,
}

/// The one-line error for a flag of the upstream Go binaries that this one does not take.
fn upstream_flag_error(args: &[String]) -> Option<String> {
    let command = Args::command();
    let subcommands = command.get_subcommands().flat_map(|c| c.get_arguments());
    let mut supported: Vec<&str> = command
        .get_arguments()
        .chain(subcommands)
        .filter_map(|a| a.get_long())
        .collect();
    supported.extend(["help", "version"]);
    let given = args.iter().skip(1).map(String::as_str);
    app::flags::unsupported_upstream_flag(given, &supported)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(error) = upstream_flag_error(&args) {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let a = Args::parse_from(args);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // Colours only on a terminal: redirected logs get plain text.
    let subscriber = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal());
    subscriber.with_env_filter(filter).init();
    #[allow(clippy::disallowed_methods)] // reason: a binary reads its environment
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(Command::Uninstall(u)) = &a.command {
        let options = app::UninstallOptions {
            kubeconfig: a.kubeconfig.clone(),
            provisioner_name: a.provisioner_name.clone(),
            namespace: u.namespace.clone(),
            lease_name: u.lease_name.clone(),
            remove_pv_finalizers: u.remove_pv_finalizers,
        };
        return uninstall(&options, env, &mut io::stdout()).await;
    }
    let options = app::Options {
        kubeconfig: a.kubeconfig,
        vsphere_config: a.vsphere_config,
        provisioner_name: a.provisioner_name,
        leader_election: a.leader_election,
        metrics_address: a.metrics_address,
        datastores: a.datastores,
        default_datastores: a.default_datastores,
        claims: a.claims,
        serve: a.serve,
        timeout: Duration::from_secs(a.timeout),
        demo: a.demo,
        feature_states: app::FeatureStates {
            namespace: a.fss_namespace,
            name: a.fss_name,
        },
    };
    let signal = match app::shutdown_signal() {
        Ok(signal) => signal,
        Err(error) => {
            eprintln!("error: cannot handle SIGTERM and SIGINT: {error}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = async move {
        let signal = signal.await;
        eprintln!("{signal}: stopping (send it again to exit at once)");
        // From now on a second SIGTERM or SIGINT ends the process without the graceful stop.
        if let Ok(again) = app::shutdown_signal() {
            tokio::spawn(async move {
                let signal = again.await;
                eprintln!("{signal} again: exiting at once");
                #[allow(clippy::disallowed_methods)] // reason: the binary decides to exit
                std::process::exit(signal.exit_code().into());
            });
        }
    };
    match app::run(&options, env, shutdown, &mut io::stdout()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// `vsphere uninstall`: the report on `out`, the error on stderr; the exit code.
async fn uninstall(
    options: &app::UninstallOptions,
    env: impl Fn(&str) -> Option<String>,
    out: &mut (dyn io::Write + Send),
) -> ExitCode {
    match app::uninstall(options, env, out).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("vsphere").chain(args.iter().copied()))
    }

    #[test]
    fn leader_election_takes_go_style_bare_and_valued_forms() {
        assert!(parse(&[]).unwrap().leader_election);
        assert!(parse(&["--leader-election"]).unwrap().leader_election);
        assert!(
            parse(&["--leader-election", "--demo"])
                .unwrap()
                .leader_election
        );
        assert!(parse(&["--leader-election=true"]).unwrap().leader_election);
        assert!(!parse(&["--leader-election=false"]).unwrap().leader_election);
    }

    #[test]
    fn an_upstream_flag_it_does_not_take_is_one_line_naming_it() {
        let args = [
            "vsphere",
            "--leader-election",
            "--csi-address=/csi/csi.sock",
        ];
        let args: Vec<String> = args.iter().map(ToString::to_string).collect();
        assert_eq!(
            upstream_flag_error(&args).as_deref(),
            Some(
                "--csi-address is a flag of the upstream vsphere-syncer or csi-provisioner that this binary does not support (this binary provisions through CNS itself, without a CSI socket)"
            )
        );
        let ours: Vec<String> = [
            "vsphere",
            "--kubeconfig=/k",
            "--leader-election",
            "--metrics-address=0.0.0.0:8080",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(upstream_flag_error(&ours), None);
    }

    #[test]
    fn without_a_subcommand_it_runs_as_before() {
        let a = parse(&["--kubeconfig=/k", "--demo", "--claims", "5"]).unwrap();
        assert!(a.command.is_none());
        assert_eq!(a.kubeconfig, Some(PathBuf::from("/k")));
        assert!(a.demo);
        assert_eq!(a.claims, 5);
    }

    #[test]
    fn uninstall_takes_its_flags_and_the_shared_ones_after_it() {
        let a = parse(&["uninstall"]).unwrap();
        let Some(Command::Uninstall(u)) = &a.command else {
            panic!("{a:?}");
        };
        assert!(!u.remove_pv_finalizers);
        assert_eq!(
            (u.namespace.as_deref(), u.lease_name.as_deref()),
            (None, None)
        );
        assert_eq!(a.provisioner_name, vsphere_cns::CSI_DRIVER);
        assert_eq!(a.kubeconfig, None);

        for args in [
            &[
                "uninstall",
                "--remove-pv-finalizers",
                "--kubeconfig",
                "/k",
                "--provisioner-name=example.com/cns",
                "--namespace",
                "storage",
                "--lease-name=cns-lease",
            ][..],
            &[
                "uninstall",
                "--namespace=storage",
                "--lease-name",
                "cns-lease",
                "--remove-pv-finalizers",
                "--kubeconfig=/k",
                "--provisioner-name",
                "example.com/cns",
            ][..],
        ] {
            let a = parse(args).unwrap();
            let Some(Command::Uninstall(u)) = &a.command else {
                panic!("{args:?}: {a:?}");
            };
            assert!(u.remove_pv_finalizers, "{args:?}");
            assert_eq!(u.namespace.as_deref(), Some("storage"), "{args:?}");
            assert_eq!(u.lease_name.as_deref(), Some("cns-lease"), "{args:?}");
            assert_eq!(a.provisioner_name, "example.com/cns", "{args:?}");
            assert_eq!(a.kubeconfig, Some(PathBuf::from("/k")), "{args:?}");
        }
    }

    #[test]
    fn uninstall_refuses_the_flags_of_a_run() {
        for args in [
            &["uninstall", "--demo"][..],
            &["--demo", "uninstall"][..],
            &["uninstall", "--leader-election=false"][..],
            &["--serve", "uninstall", "--remove-pv-finalizers"][..],
            // The shared flags go after the subcommand (before it, they are the run's).
            &["--kubeconfig=/k", "uninstall"][..],
        ] {
            assert!(parse(args).is_err(), "{args:?} parses");
        }
        assert!(parse(&["uninstal"]).is_err());
    }

    #[test]
    fn uninstall_flags_are_no_upstream_flag_errors() {
        let args: Vec<String> = ["vsphere", "uninstall", "--namespace=x", "--lease-name=y"]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(upstream_flag_error(&args), None);
    }

    mod against_kube_sim {
        use std::time::Duration;

        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim};
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
        use std::process::ExitCode;

        use vsphere_controllers as app;

        const DRIVER: &str = vsphere_cns::CSI_DRIVER;

        /// kube-sim with a provision controller of [`DRIVER`] killed while its driver call
        /// for the claim `default/data` was in flight (its intent in the journal), and a PV
        /// `pvc-static` of [`DRIVER`] with the PV finalizer. Returns the sim and the
        /// in-flight PV name.
        async fn stopped_mid_provision() -> (KubeSim, String) {
            let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
            let client = sim.client();
            Api::<StorageClass>::all(client.clone())
                .create(
                    &PostParams::default(),
                    &class("thin").provisioner(DRIVER).build(),
                )
                .await
                .unwrap();
            let fake = FakeProvisioner::new().script_provision([ProvisionStep::Block]);
            let controller = ProvisionController::new(client.clone(), DRIVER, fake.clone())
                .config(Config::default().leader_election(None));
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
            let maps: Api<ConfigMap> = Api::all(sim.client());
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

            let mut out = Vec::new();
            let code = super::super::uninstall(&options(&sim), |_| None, &mut out).await;
            let out = String::from_utf8(out).unwrap();
            assert_eq!(
                format!("{code:?}"),
                format!("{:?}", ExitCode::SUCCESS),
                "{out}"
            );
            let lease = format!("default/{DRIVER}");
            assert!(
                out.contains(&format!("the journal of its Lease {lease}\n")),
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
    }
}
