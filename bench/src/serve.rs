//! `serve`: the controller alone, with the no-op provisioner, until SIGTERM or Ctrl-C, for
//! an external load generator (one that samples this process's CPU and memory by its PID,
//! as the Go anchor's is sampled). The client is the one a driver gets by default:
//! `provision_controller::client::infer` (`KUBECONFIG`, `~/.kube/config` or the pod's
//! service account), or `--kubeconfig`.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use provision_controller::{Config, ProvisionController};

use crate::{Args, objects::Noop};

/// Runs the controller until a shutdown signal; the library's defaults except what the
/// command line names.
pub(crate) async fn run(args: &Args) -> anyhow::Result<()> {
    let name = args
        .provisioner
        .clone()
        .context("serve: --provisioner NAME is required")?;
    let client = match &args.kubeconfig {
        Some(path) => crate::env::client_from_kubeconfig(path).await?,
        None => provision_controller::client::infer().await?.0,
    };
    let mut config = Config::default().leader_election(None).metrics_port(0);
    if let Some(workers) = args.workers {
        config = config.threads(workers);
    }
    if let Some(secs) = args.resync_secs {
        config = config.resync_period(Duration::from_secs(secs));
    }
    if let Some(max) = args.max_in_flight {
        config = config.max_requests_in_flight(std::num::NonZeroUsize::new(max));
    }
    if let Some(on) = args.adapt {
        config = config.adapt_requests_in_flight(on);
    }
    if let Some(on) = args.crash_safe {
        config = config.crash_safe_provisioning(on);
    }
    let driver = Noop {
        driver: "noop.bench.example.com".to_owned(),
        labels: BTreeMap::new(),
    };
    let signal = provision_controller::shutdown_signal()?;
    eprintln!(
        "bench serve: provisioner {name}, pid {}",
        std::process::id()
    );
    ProvisionController::new(client, name, driver)
        .config(config)
        .run(async {
            signal.await;
            eprintln!("shutdown signal: stopping");
        })
        .await?;
    Ok(())
}
