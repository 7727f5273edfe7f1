//! `kube-sim`: the in-process Kubernetes API server as a standalone program, so `kubectl` or a
//! controller under development can talk to it.
//!
//! ```text
//! cargo run -p kube-sim --features server -- --kubeconfig /tmp/sim.kubeconfig --pv-binder
//! kubectl --kubeconfig /tmp/sim.kubeconfig get pvc -A
//! ```
//!
//! It writes a kubeconfig to `--kubeconfig`, prints one line with the URL and that path, and
//! serves until Ctrl-C (or SIGTERM). Claims and volumes get their protection finalizers as
//! on a real server (`--protection-finalizers=false` to switch them off). Logs go to stderr; `RUST_LOG` filters them (default `info`).

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kube_sim::{KubeSim, LoadModel};
use tracing_subscriber::EnvFilter;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    name = "kube-sim",
    version,
    about = "An in-process Kubernetes API server for tests and demos"
)]
struct Args {
    /// Where to write a kubeconfig that points at the server (overwritten if it exists).
    #[arg(long, value_name = "PATH")]
    kubeconfig: PathBuf,
    /// Run the PV binder: storage-provisioner annotations, binding, Released volumes.
    #[arg(long)]
    pv_binder: bool,
    /// The protection finalizers, as a real server has them: `kubernetes.io/pvc-protection`
    /// on each claim and `kubernetes.io/pv-protection` on each PV, removed once the object
    /// is being deleted and nothing needs it, put back when removed from an object that is
    /// not being deleted (as kube-controller-manager does). `--protection-finalizers=false`
    /// switches them off.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    protection_finalizers: bool,
    /// Port to listen on at 127.0.0.1; 0 lets the OS pick one.
    #[arg(long, value_name = "N", default_value_t = 0)]
    port: u16,
    /// Watch events kept for resuming watches (default: the library's, 10000).
    #[arg(long, value_name = "N")]
    history_window: Option<NonZeroUsize>,
    /// What requests cost: `none` answers at once; `realistic` costs what a real
    /// kube-apiserver + etcd on two cores does (latency growing with the requests in
    /// flight, at most 400 reads and 200 writes in flight, 429 past them).
    #[arg(long, value_name = "NAME", default_value = "none",
          value_parser = clap::builder::PossibleValuesParser::new(LoadModel::PROFILES))]
    load_profile: String,
    /// Overrides the profile's bound on reads in flight (0: unbounded).
    #[arg(long, value_name = "N")]
    max_requests_inflight: Option<usize>,
    /// Overrides the profile's bound on writes in flight (0: unbounded).
    #[arg(long, value_name = "N")]
    max_mutating_requests_inflight: Option<usize>,
}

impl Args {
    /// The load model the options pick.
    fn load(&self) -> LoadModel {
        let mut model = LoadModel::named(&self.load_profile).unwrap_or_default();
        if let Some(n) = self.max_requests_inflight {
            model = model.max_requests_inflight(n);
        }
        if let Some(n) = self.max_mutating_requests_inflight {
            model = model.max_mutating_requests_inflight(n);
        }
        model
    }
}

/// Why the program stopped with an error.
#[derive(Debug, thiserror::Error)]
enum MainError {
    #[error("cannot start the server")]
    Start(#[source] kube_sim::Error),
    #[error("cannot listen for Ctrl-C or SIGTERM")]
    Signal(#[source] std::io::Error),
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kube-sim: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), MainError> {
    let mut builder = KubeSim::builder()
        .load(args.load())
        .pv_binder(args.pv_binder)
        .protection_finalizers(args.protection_finalizers)
        .port(args.port)
        .kubeconfig_path(&args.kubeconfig);
    if let Some(window) = args.history_window {
        builder = builder.history_window(window.get());
    }
    let sim = builder.start().await.map_err(MainError::Start)?;
    println!(
        "kube-sim listening on {} (kubeconfig: {})",
        sim.url(),
        args.kubeconfig.display()
    );
    let stopped = stop_signal().await;
    tracing::info!("shutting down");
    sim.shutdown().await;
    stopped.map_err(MainError::Signal)
}

/// Waits for Ctrl-C (SIGINT) or, on Unix, SIGTERM (as `docker stop` and `kill` send).
async fn stop_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            interrupted = tokio::signal::ctrl_c() => interrupted,
            _ = terminate.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

/// `error: cause: cause`, on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_options() {
        let args = Args::try_parse_from([
            "kube-sim",
            "--kubeconfig",
            "/tmp/k",
            "--pv-binder",
            "--port",
            "8080",
            "--history-window",
            "50",
        ])
        .unwrap();
        assert_eq!(args.kubeconfig, PathBuf::from("/tmp/k"));
        assert!(args.pv_binder);
        assert!(
            args.protection_finalizers,
            "on by default, as a real server"
        );
        assert_eq!(args.port, 8080);
        assert_eq!(args.history_window, NonZeroUsize::new(50));
        assert_eq!(args.load(), LoadModel::none());
    }

    #[test]
    fn load_profile_by_name_with_overrides() {
        let args = Args::try_parse_from([
            "kube-sim",
            "--kubeconfig",
            "k",
            "--load-profile",
            "realistic",
            "--max-mutating-requests-inflight",
            "3",
        ])
        .unwrap();
        assert_eq!(
            args.load(),
            LoadModel::realistic().max_mutating_requests_inflight(3)
        );
        let bad = Args::try_parse_from(["kube-sim", "--kubeconfig", "k", "--load-profile", "x"]);
        assert!(bad.unwrap_err().to_string().contains("realistic"));
    }

    #[test]
    fn history_window_must_not_be_zero() {
        let parsed =
            Args::try_parse_from(["kube-sim", "--kubeconfig", "k", "--history-window", "0"]);
        assert!(parsed.unwrap_err().to_string().contains("--history-window"));
    }

    #[test]
    fn protection_finalizers_can_be_switched_off() {
        let parse = |extra: &[&str]| {
            let args = ["kube-sim", "--kubeconfig", "k"].iter().chain(extra);
            Args::try_parse_from(args).unwrap().protection_finalizers
        };
        assert!(parse(&[]));
        assert!(parse(&["--protection-finalizers"]));
        assert!(!parse(&["--protection-finalizers=false"]));
    }

    #[test]
    fn kubeconfig_is_required() {
        let error = Args::try_parse_from(["kube-sim"]).unwrap_err();
        assert!(error.to_string().contains("--kubeconfig"), "{error}");
    }

    #[test]
    fn error_chain_is_one_line() {
        let error = MainError::Signal(std::io::Error::other("no signal handler"));
        assert_eq!(
            error_chain(&error),
            "cannot listen for Ctrl-C or SIGTERM: no signal handler"
        );
    }
}
