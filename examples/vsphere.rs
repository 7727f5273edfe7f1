//! `cargo run --example vsphere`: the vSphere CNS provisioner and the `CnsVolumeMetadata`
//! reconciler.
//!
//! With a kubeconfig (`--kubeconfig`, `KUBECONFIG`, or running in a pod) and a
//! `csi-vsphere.conf` (`--vsphere-config`, or `/etc/cloud/csi-vsphere.conf`), it runs both
//! controllers against the real cluster and vCenter until Ctrl-C. With neither, it runs
//! the same code against kube-sim and the CNS simulator, shows what happens, and exits.
//! See `docs/vcenter.md`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use vsphere_cns::CnsMetadataBackend;

use vsphere_controllers::{self as app, DEMO_BANNER, DemoOptions, Found, Mode, RealOptions};

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
    /// run on the leader only); `--leader-election=false` runs them on every replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
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
    /// Demo: keep running after provisioning and print the kubeconfig for kubectl.
    #[arg(long)]
    serve: bool,
    /// Demo: limit of each wait, in seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Run the demo even when a kubeconfig or vSphere config is found.
    #[arg(long)]
    demo: bool,
}

fn parse_datastore(value: &str) -> Result<(String, String), String> {
    let (url, moref) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not URL=MOREF"))?;
    Ok((url.to_owned(), moref.to_owned()))
}

/// The environment, read in this one place.
#[allow(clippy::disallowed_methods)] // reason: a binary reads its environment; libraries take Config
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Environment variables, or file contents for names starting with `/` (for
/// `provision_controller::Config::from_lookup`).
fn lookup(name: &str) -> Option<String> {
    if name.starts_with('/') {
        std::fs::read_to_string(name).ok()
    } else {
        env(name)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let found = Found {
        kubeconfig_flag: args.kubeconfig.clone(),
        kubeconfig_env: env("KUBECONFIG").is_some(),
        in_pod: env("KUBERNETES_SERVICE_HOST").is_some(),
        vsphere_flag: args.vsphere_config.clone(),
        default_vsphere_exists: app::exists(app::DEFAULT_VSPHERE_CONFIG.as_ref()),
        force_demo: args.demo,
    };
    let mode = match app::select_mode(&found) {
        Ok(mode) => mode,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let result = match mode {
        Mode::Demo => run_demo(&args).await,
        Mode::Real {
            kubeconfig,
            vsphere_config,
        } => run_real(&args, kubeconfig, vsphere_config).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_demo(args: &Args) -> anyhow::Result<()> {
    println!("{DEMO_BANNER}");
    let options = DemoOptions {
        claims: args.claims,
        provisioner_name: args.provisioner_name.clone(),
        leader_election: args.leader_election,
        metrics_address: args.metrics_address,
        serve: args.serve,
        timeout: Duration::from_secs(args.timeout),
    };
    let mut out = std::io::stdout();
    let report = app::run_demo(&options, &mut out).await?;
    if let Some(row) = report.rows.iter().find(|r| !r.synced) {
        return Err(anyhow!(
            "the metadata of claim {} was not synced",
            row.claim
        ));
    }
    if !args.serve && report.volumes_left != 0 {
        return Err(anyhow!(
            "the CNS simulator still holds {} volumes",
            report.volumes_left
        ));
    }
    Ok(())
}

async fn run_real(
    args: &Args,
    kubeconfig: Option<PathBuf>,
    vsphere_config: PathBuf,
) -> anyhow::Result<()> {
    let options = RealOptions {
        provisioner_name: args.provisioner_name.clone(),
        leader_election: args.leader_election,
        metrics_address: args.metrics_address,
        datastores: args.datastores.clone(),
        default_datastores: args.default_datastores.clone(),
    };
    let real = app::connect_real(kubeconfig.as_deref(), &vsphere_config, &options, lookup).await?;
    println!(
        "running the provisioner {:?} and the CnsVolumeMetadata reconciler against vCenter {} until Ctrl-C",
        args.provisioner_name, real.host
    );
    let backend = CnsMetadataBackend::new(real.cns.clone());
    let running = app::start_controllers(real.kube, real.provisioner, backend, &real.settings);
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let result = running.run_until(ctrl_c).await;
    if let Err(e) = real.cns.logout().await {
        tracing::warn!(error = %e, "logout failed");
    }
    result
}
