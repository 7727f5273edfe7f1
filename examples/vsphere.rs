//! `cargo run --example vsphere`: both controllers against the cluster and vCenter it finds,
//! or else a demo on simulators (`docs/vcenter.md`); `-- uninstall [--remove-pv-finalizers]`
//! removes what the provision controller leaves once every replica is stopped. The flags
//! and the runs are [`vsphere_controllers::cli::Cli`]'s; this binary adds the logs, the
//! environment and the signals.
//!
//! SIGTERM (the kubelet's) and SIGINT (Ctrl-C) both stop it gracefully: the drain, the lease
//! release, the vCenter logout, within the controllers' stop deadline; a second signal
//! exits at once (143 or 130).

use std::{io, io::IsTerminal, process::ExitCode};

use tracing_subscriber::EnvFilter;
use vsphere_controllers::{cli::Cli, shutdown_signal};

#[tokio::main]
async fn main() -> ExitCode {
    // `--help`, `--version` and a bad flag (one of upstream's too) end here: exit 0 or 2.
    let cli = Cli::parse(std::env::args()).unwrap_or_else(|error| error.exit());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // Colours only on a terminal: redirected logs get plain text.
    let subscriber = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal());
    subscriber.with_env_filter(filter).init();
    #[allow(clippy::disallowed_methods)] // reason: a binary reads its environment
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    // Installed when the run starts (not for `uninstall`, which Ctrl-C simply ends).
    let shutdown = || {
        let signal = shutdown_signal()?;
        Ok(async move {
            let signal = signal.await;
            eprintln!("{signal}: stopping (send it again to exit at once)");
            // From now on a second SIGTERM or SIGINT ends the process without the graceful stop.
            if let Ok(again) = shutdown_signal() {
                tokio::spawn(async move {
                    let signal = again.await;
                    eprintln!("{signal} again: exiting at once");
                    #[allow(clippy::disallowed_methods)] // reason: the binary decides to exit
                    std::process::exit(signal.exit_code().into());
                });
            }
        })
    };
    match cli.run(env, shutdown, &mut io::stdout()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
