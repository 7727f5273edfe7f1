//! The `csi-provisioner` sidecar: kubernetes-csi/external-provisioner's command line in
//! front of provision-controller.
//!
//! It waits for the CSI driver on `--csi-address`, learns its name and capabilities, and
//! provisions for it with the options upstream's sidecar sets on the Go library (retries
//! forever with per-claim exponential backoff, PVs saved in the background, a finalizer on
//! claims being provisioned), plus provision-controller's journal: a volume whose
//! CreateVolume was sent is never forgotten across restarts, timeouts or deletions.
//!
//! Errors end the process with one line on stderr naming what failed: exit 2 for a flag
//! this sidecar refuses, 1 for anything else.

mod flags;

use std::{
    error::Error, io::IsTerminal, num::NonZeroU16, path::Path, process::ExitCode, sync::Arc,
};

use clap::Parser;
use csi_provisioner::{
    CsiOptions, CsiProvisioner, DriverCapabilities, TopologySettings,
    csi::GrpcCsi,
    start::{self, Capabilities, StartConfig},
};
use kube_client::{Client, config::KubeConfigOptions, config::Kubeconfig};
use provision_controller::{
    Config, FailureBackoff, LeaderElection, ProvisionController, PvSaveStrategy,
};
use tracing_subscriber::EnvFilter;

use flags::Flags;

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse_from(std::env::args_os().map(go_style));
    if let Err(refused) = flags.refuse_unsupported() {
        eprintln!("csi-provisioner: {refused}");
        return ExitCode::from(2);
    }
    // Logs on stderr, coloured only on a terminal; RUST_LOG wins over --v.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "warn,csi_provisioner={0},provision_controller={0},kube_controller_kit={0}",
            flags.log_level()
        ))
    });
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .init();
    match run(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "csi-provisioner: {}",
                provision_controller::error_chain(&*error)
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: Flags) -> Result<(), Box<dyn Error>> {
    let http = flags.http_address()?;
    // SIGTERM (the kubelet stopping the pod) or SIGINT: operations in flight finish, then
    // the lease is released.
    let shutdown = provision_controller::shutdown_signal()?;
    if flags.kube_api_qps != 5.0 || flags.kube_api_burst != 10 {
        tracing::info!(
            "--kube-api-qps and --kube-api-burst are accepted and not used: this sidecar bounds \
             its requests in flight and gives way when the API server answers 429"
        );
    }

    let driver = GrpcCsi::new(&flags.csi_address, flags.timeout)?;
    let info = start::start(&driver, driver.socket(), &StartConfig::default()).await?;
    tracing::info!(
        driver = %info.name,
        version = %info.vendor_version,
        "the CSI driver is ready"
    );

    let (client, kube_config) = kube_client(&flags.kubeconfig).await?;
    provision_controller::client::check(&client, &kube_config).await?;

    let options = CsiOptions::default()
        .volume_name_prefix(flags.volume_name_prefix.clone())
        .volume_name_uuid_length(flags.uuid_length())
        .extra_create_metadata(flags.extra_create_metadata)
        .default_fstype(flags.default_fstype.clone())
        .topology(TopologySettings {
            enabled: flags.feature_gates.enabled("Topology"),
            strict: flags.strict_topology,
            immediate: flags.immediate_topology,
        });
    let volume_namer = options.volume_namer();
    let provisioner = CsiProvisioner::new(
        Arc::new(driver),
        client.clone(),
        info.name.clone(),
        capabilities(&info.capabilities),
        options,
    )?;

    let mut config = controller_config(&flags)?
        .volume_namer(volume_namer)
        .leader_election(leader_election(&flags, &info.name)?);
    if let Some(address) = http {
        config = config
            .metrics_address(address.ip())
            .metrics_port(address.port())
            .metrics_path(flags.metrics_path.clone());
    }
    let mut controller =
        ProvisionController::new(client, info.name.clone(), provisioner).config(config);
    if flags.leader_election {
        // Lease renewals on a client of their own, so they never wait behind provisioning.
        controller = controller.leader_election_client(
            provision_controller::client::for_leader_election(&kube_config)?,
        );
    }
    controller
        .run(async move {
            shutdown.await;
        })
        .await?;
    Ok(())
}

/// The options upstream's sidecar gives the Go library, from the flags.
///
/// The journal's namespace comes from `JOURNAL_NAMESPACE` (unset: the controller's), as
/// for every driver on provision-controller: give it a namespace of its own, never
/// kube-system (its Role covers every ConfigMap of that namespace).
#[expect(
    clippy::disallowed_methods,
    reason = "the binary reads the environment; the library takes a Config"
)]
fn controller_config(flags: &Flags) -> Result<Config, Box<dyn Error>> {
    let threads = u16::try_from(flags.worker_threads).unwrap_or(u16::MAX);
    let config = Config::from_lookup(|key| std::env::var(key).ok())?
        .threads(NonZeroU16::new(threads).unwrap_or(Config::DEFAULT_THREADS))
        // Upstream retries forever (FailedProvisionThreshold(0), FailedDeleteThreshold(0))
        // with a per-claim exponential backoff between --retry-interval-start and -max.
        .failed_provision_threshold(0)
        .failed_delete_threshold(0)
        .failure_backoff(FailureBackoff::PerKey {
            initial: flags.retry_interval_start,
            max: flags.retry_interval_max,
        })
        // Upstream saves PVs in the background (CreateProvisionedPVLimiter) and puts a
        // finalizer on claims being provisioned (AddFinalizer(true)).
        .pv_save(PvSaveStrategy::background())
        .add_finalizer(true);
    Ok(config)
}

/// Leader election as upstream's `--leader-election*` flags ask (off by default), on the
/// Lease upstream names after the driver, so that a rolling update from upstream's sidecar
/// to this one never has two leaders.
#[expect(
    clippy::disallowed_methods,
    reason = "the binary reads the environment; the library takes the namespace"
)]
fn leader_election(flags: &Flags, driver: &str) -> Result<Option<LeaderElection>, Box<dyn Error>> {
    if !flags.leader_election {
        return Ok(None);
    }
    // Empty: POD_NAMESPACE, else the client's namespace (the service account's in a pod).
    let namespace = if flags.leader_election_namespace.is_empty() {
        std::env::var("POD_NAMESPACE")
            .map(|ns| ns.trim().to_owned())
            .unwrap_or_default()
    } else {
        flags.leader_election_namespace.clone()
    };
    let election = LeaderElection::new(csi_provisioner::rbac::lease_name(driver), namespace)?
        .lease_duration(flags.leader_election_lease_duration)
        .renew_deadline(flags.leader_election_renew_deadline)
        .retry_period(flags.leader_election_retry_period);
    election.validate()?;
    Ok(Some(election))
}

/// The capabilities the provisioner acts on, from what the start sequence learnt.
fn capabilities(reported: &Capabilities) -> DriverCapabilities {
    DriverCapabilities::default()
        .single_node_multi_writer(reported.single_node_multi_writer)
        .accessibility_constraints(reported.accessibility_constraints)
        .publish_unpublish(reported.publish_unpublish_volume)
}

/// The client: `--kubeconfig` when given (as upstream), else KUBECONFIG, `~/.kube/config`
/// or the pod's service account.
async fn kube_client(kubeconfig: &str) -> Result<(Client, kube_client::Config), Box<dyn Error>> {
    if kubeconfig.is_empty() {
        return Ok(provision_controller::client::infer().await?);
    }
    let path = Path::new(kubeconfig);
    let file = Kubeconfig::read_from(path)
        .map_err(|error| format!("--kubeconfig {}: {error}", path.display()))?;
    let config = kube_client::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|error| format!("--kubeconfig {}: {error}", path.display()))?;
    let client = provision_controller::client::from_config(config.clone())?;
    Ok((client, config))
}

/// Go's flag package accepts `-name=value` for a long flag as well as `--name=value`
/// (upstream's manifests use both): a single dash before a name of more than one letter is
/// read as two. `-v=5` and `-v 5` stay short flags; values (no leading dash) are untouched.
fn go_style(arg: std::ffi::OsString) -> std::ffi::OsString {
    let Some(text) = arg.to_str() else {
        return arg;
    };
    let name = text.split('=').next().unwrap_or_default();
    if name.starts_with('-') && !name.starts_with("--") && name.len() > 2 {
        return format!("-{text}").into();
    }
    arg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        let args = std::iter::once("csi-provisioner")
            .chain(args.iter().copied())
            .map(std::ffi::OsString::from);
        Flags::parse_from(args.map(go_style))
    }

    #[test]
    fn single_dash_long_flags_are_read_as_go_reads_them() {
        let flags = parse(&["-csi-address=/csi/csi.sock", "-v=5", "-leader-election"]);
        assert_eq!(flags.csi_address, "/csi/csi.sock");
        assert_eq!(flags.verbosity, 5);
        assert!(flags.leader_election);
        let flags = parse(&["--timeout", "30s", "-v", "2"]);
        assert_eq!(flags.timeout, std::time::Duration::from_secs(30));
        assert_eq!(flags.verbosity, 2);
    }
}
