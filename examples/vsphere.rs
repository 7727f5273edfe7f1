//! `cargo run --example vsphere`: flags for [`vsphere_controllers::run`], both controllers
//! against the cluster and vCenter it finds, or else a demo on simulators (`docs/vcenter.md`).
//!
//! SIGTERM (the kubelet's) and SIGINT (Ctrl-C) both stop it gracefully: the drain, the lease
//! release, the vCenter logout, within the controllers' stop deadline; a second signal
//! exits at once (143 or 130).

use std::{io, io::IsTerminal, net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{CommandFactory, Parser};
use tracing_subscriber::EnvFilter;
use vsphere_controllers as app;

/// vSphere CNS provisioner and CnsVolumeMetadata reconciler (a demo without configuration).
#[derive(Debug, Parser)]
#[command(name = "vsphere", version)]
struct Args {
    /// Kubeconfig file; default `KUBECONFIG`, or the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// csi-vsphere.conf; default /etc/cloud/csi-vsphere.conf when it exists.
    #[arg(long, value_name = "FILE")]
    vsphere_config: Option<PathBuf>,
    /// Provisioner name that StorageClasses name.
    #[arg(long, default_value = vsphere_cns::CSI_DRIVER)]
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
}

/// The one-line error for a flag of the upstream Go binaries that this one does not take.
fn upstream_flag_error(args: &[String]) -> Option<String> {
    let command = Args::command();
    let mut supported: Vec<&str> = command
        .get_arguments()
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
    #[allow(clippy::disallowed_methods)] // reason: a binary reads its environment
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
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
}
