//! The vSphere binary's command line (feature `cli`): [`Cli::parse`] reads the flags,
//! [`Cli::run`] runs the controllers, the demo, or the `uninstall` subcommand.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand};

use crate::{FeatureStates, Options, RunError, UninstallOptions, parse_datastore};

/// vSphere CNS provisioner and CnsVolumeMetadata reconciler (a demo without configuration).
#[derive(Debug, Parser)]
#[command(name = "vsphere", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
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
    #[arg(long = "datastore", value_name = "URL=MOREF", value_parser = parse_datastore)]
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
    /// Name of the supervisor's feature-state ConfigMap, read on a supervisor
    /// (CLUSTER_FLAVOR=WORKLOAD) before the CnsVolumeMetadata reconciler starts, then
    /// followed (its `tkgs-ha` key).
    #[arg(long, default_value = crate::DEFAULT_SUPERVISOR_FSS_NAME, value_name = "NAME")]
    supervisor_fss_name: String,
    /// Namespace of the supervisor's feature-state ConfigMap.
    #[arg(long, default_value = crate::DEFAULT_FSS_NAMESPACE, value_name = "NAMESPACE")]
    supervisor_fss_namespace: String,
    /// Name of upstream's internal feature-state ConfigMap, upstream's on the other
    /// flavors (nothing here reads it: the reconciler runs only on a supervisor).
    #[arg(long, default_value = crate::DEFAULT_FSS_NAME, value_name = "NAME")]
    fss_name: String,
    /// Namespace of upstream's internal feature-state ConfigMap.
    #[arg(long, default_value = crate::DEFAULT_FSS_NAMESPACE, value_name = "NAMESPACE")]
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
    /// The namespace of the controller's journal; default `JOURNAL_NAMESPACE`, else the
    /// controller's namespace.
    #[arg(long, value_name = "NAMESPACE")]
    journal_namespace: Option<String>,
}

impl Cli {
    /// Parses `args` (the program name first). A flag of the upstream Go binaries that
    /// this one does not take is an error of one line naming it
    /// ([`crate::flags::unsupported_upstream_flag`]); `--help` and `--version` are
    /// "errors" too, as clap has them: the binary calls [`clap::Error::exit`].
    ///
    /// # Errors
    /// Bad or unknown flags, `--help`, `--version`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, clap::Error> {
        let args: Vec<String> = args.into_iter().collect();
        if let Some(error) = upstream_flag_error(&args) {
            let message = format!("{error}\n");
            return Err(clap::Error::raw(
                clap::error::ErrorKind::UnknownArgument,
                message,
            ));
        }
        Self::try_parse_from(args)
    }

    /// Runs what the flags ask for, writing the report on `out`: without a subcommand,
    /// [`crate::run`] until the future `shutdown()` makes completes (`shutdown` is called
    /// once the run starts: it installs the binary's signal handlers); with `uninstall`,
    /// [`crate::uninstall`] (which does not call `shutdown`). `env` reads one environment
    /// variable (`None` when unset or empty).
    ///
    /// # Errors
    /// [`RunError`]: its [`exit_code`](RunError::exit_code) and its one-line message are
    /// the binary's; `shutdown` failing is a [`RunError::Failed`].
    pub async fn run<S: Future>(
        self,
        env: impl Fn(&str) -> Option<String>,
        shutdown: impl FnOnce() -> io::Result<S>,
        out: &mut (dyn Write + Send),
    ) -> Result<(), RunError> {
        if let Some(Command::Uninstall(u)) = self.command {
            let options = UninstallOptions {
                kubeconfig: self.kubeconfig,
                provisioner_name: self.provisioner_name,
                namespace: u.namespace,
                lease_name: u.lease_name,
                journal_namespace: u.journal_namespace,
                remove_pv_finalizers: u.remove_pv_finalizers,
            };
            return crate::uninstall(&options, env, out).await.map(drop);
        }
        let options = Options {
            kubeconfig: self.kubeconfig,
            vsphere_config: self.vsphere_config,
            provisioner_name: self.provisioner_name,
            leader_election: self.leader_election,
            metrics_address: self.metrics_address,
            datastores: self.datastores,
            default_datastores: self.default_datastores,
            claims: self.claims,
            serve: self.serve,
            timeout: Duration::from_secs(self.timeout),
            demo: self.demo,
            supervisor_feature_states: FeatureStates {
                namespace: self.supervisor_fss_namespace,
                name: self.supervisor_fss_name,
            },
            internal_feature_states: FeatureStates {
                namespace: self.fss_namespace,
                name: self.fss_name,
            },
        };
        let shutdown = shutdown().context("cannot handle SIGTERM and SIGINT")?;
        crate::run(&options, env, shutdown, out).await
    }
}

/// The one-line error for a flag of the upstream Go binaries that this one does not take.
fn upstream_flag_error(args: &[String]) -> Option<String> {
    let command = Cli::command();
    let subcommands = command.get_subcommands().flat_map(|c| c.get_arguments());
    let mut supported: Vec<&str> = command
        .get_arguments()
        .chain(subcommands)
        .filter_map(|a| a.get_long())
        .collect();
    supported.extend(["help", "version"]);
    let given = args.iter().skip(1).map(String::as_str);
    crate::flags::unsupported_upstream_flag(given, &supported)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let args = std::iter::once("vsphere").chain(args.iter().copied());
        Cli::parse(args.map(ToOwned::to_owned))
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(ToString::to_string).collect()
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
        let args = strings(&[
            "vsphere",
            "--leader-election",
            "--csi-address=/csi/csi.sock",
        ]);
        let message = "--csi-address is a flag of the upstream vsphere-syncer or csi-provisioner that this binary does not support (this binary provisions through CNS itself, without a CSI socket)";
        assert_eq!(upstream_flag_error(&args).as_deref(), Some(message));
        // What the binary prints (then exits 2, as for any unknown flag).
        let error = Cli::parse(args).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::UnknownArgument);
        assert_eq!(error.exit_code(), 2);
        assert_eq!(error.to_string(), format!("error: {message}\n"));
        let ours = strings(&[
            "vsphere",
            "--kubeconfig=/k",
            "--leader-election",
            "--metrics-address=0.0.0.0:8080",
        ]);
        assert_eq!(upstream_flag_error(&ours), None);
    }

    /// The `vsphere-syncer` container's args in upstream's stock manifests at HEAD
    /// (`$(CSI_NAMESPACE)` as the kubelet expands it): `manifests/vanilla/vsphere-csi-driver.yaml`,
    /// `manifests/guestcluster/1.37/pvcsi.yaml`, `manifests/supervisorcluster/1.35/cns-csi.yaml`.
    const STOCK_SYNCER_ARGS: &[&str] = &[
        "--leader-election",
        "--leader-election-lease-duration=30s",
        "--leader-election-renew-deadline=20s",
        "--leader-election-retry-period=10s",
        "--fss-name=internal-feature-states.csi.vsphere.vmware.com",
        "--fss-namespace=vmware-system-csi",
        "--enable-profile-server=false",
        "--leader-election-lease-duration=120s",
        "--leader-election-renew-deadline=60s",
        "--leader-election-retry-period=30s",
        "--supervisor-fss-name=csi-feature-states",
        "--supervisor-fss-namespace=vmware-system-csi",
        "--storagequota-sync-interval=10m",
        "--webhook-client-cert-verification",
        "--enable-profile-server=true",
    ];

    #[test]
    fn each_upstream_syncer_flag_in_the_stock_manifests_starts_or_is_refused_in_one_line() {
        let accepted = [
            "--leader-election",
            "--fss-name=internal-feature-states.csi.vsphere.vmware.com",
            "--fss-namespace=vmware-system-csi",
            "--supervisor-fss-name=csi-feature-states",
            "--supervisor-fss-namespace=vmware-system-csi",
        ];
        for arg in STOCK_SYNCER_ARGS {
            let name = arg.trim_start_matches('-').split('=').next().unwrap();
            match parse(&[arg]) {
                Ok(_) => assert!(accepted.contains(arg), "{arg} is accepted"),
                Err(error) => {
                    assert!(!accepted.contains(arg), "{arg}: {error}");
                    let text = error.to_string();
                    assert_eq!(text.trim_end().lines().count(), 1, "{arg}: {text}");
                    assert!(
                        text.starts_with(&format!(
                            "error: --{name} is a flag of the upstream vsphere-syncer or \
                             csi-provisioner that this binary does not support"
                        )),
                        "{arg}: {text}"
                    );
                    assert_eq!(error.exit_code(), 2, "{arg}");
                }
            }
        }
        let a = parse(&[
            "--supervisor-fss-name=fss",
            "--supervisor-fss-namespace=ns",
            "--fss-name=internal",
            "--fss-namespace=ns2",
        ])
        .unwrap();
        assert_eq!(
            (
                a.supervisor_fss_namespace.as_str(),
                a.supervisor_fss_name.as_str()
            ),
            ("ns", "fss")
        );
        assert_eq!(
            (a.fss_namespace.as_str(), a.fss_name.as_str()),
            ("ns2", "internal")
        );
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.supervisor_fss_name, "csi-feature-states");
        assert_eq!(defaults.supervisor_fss_namespace, "vmware-system-csi");
        let webhook = parse(&["--webhook-client-cert-verification"]).unwrap_err();
        assert_eq!(
            webhook.to_string(),
            "error: --webhook-client-cert-verification is a flag of the upstream vsphere-syncer \
             or csi-provisioner that this binary does not support (this binary is the \
             METADATA_SYNC mode; there is no webhook server)\n"
        );
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
        let args = strings(&["vsphere", "uninstall", "--namespace=x", "--lease-name=y"]);
        assert_eq!(upstream_flag_error(&args), None);
    }

    #[tokio::test]
    async fn a_shutdown_that_cannot_be_set_up_fails_the_run_and_uninstall_never_asks() {
        let failing =
            || -> io::Result<std::future::Pending<()>> { Err(io::Error::other("no signals here")) };
        let mut out = Vec::new();
        let error = parse(&["--demo"])
            .unwrap()
            .run(|_| None, failing, &mut out)
            .await;
        let error = error.unwrap_err();
        assert_eq!(
            (error.exit_code(), error.to_string()),
            (
                1,
                "cannot handle SIGTERM and SIGINT: no signals here".to_owned()
            )
        );
        assert!(out.is_empty(), "nothing ran");

        let uninstall = parse(&["uninstall", "--kubeconfig=/nonexistent/kubeconfig"]).unwrap();
        let never = || -> io::Result<std::future::Pending<()>> { panic!("not for uninstall") };
        let error = uninstall.run(|_| None, never, &mut out).await.unwrap_err();
        assert_eq!(
            (error.exit_code(), error.to_string()),
            (
                2,
                "--kubeconfig /nonexistent/kubeconfig: no such file".to_owned()
            )
        );
    }
}
