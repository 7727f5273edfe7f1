//! The driver thread's main: set up the environment, run the scenario, clean up, print
//! the report.

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::{Args, Scenario, env::Env, report};

/// Runs the scenario `args` names, the controller on `controller`.
pub(crate) async fn run(args: Args, controller: tokio::runtime::Handle) -> anyhow::Result<()> {
    let scenario = args.scenario.context("no scenario given")?;
    let load_before = load_average();
    let (env, sim) = Env::start(args, controller).await?;
    eprintln!(
        "bench {scenario:?}: n={} against {}; namespace {}, provisioner {}",
        env.args.n,
        if sim.is_some() {
            "kube-sim (child process)"
        } else {
            "the cluster of --kubeconfig"
        },
        env.names.namespace,
        env.names.provisioner
    );
    let outcome = match scenario {
        Scenario::Provision => crate::provision::run(&env).await,
        Scenario::Steady => crate::steady::run(&env).await,
        Scenario::Metadata => crate::metadata::run(&env).await,
        Scenario::Create => crate::create::run(&env).await,
        Scenario::Matrix => Err(anyhow::anyhow!("matrix runs provision in child processes")),
        Scenario::Serve => Err(anyhow::anyhow!("serve runs without the driver")),
    };
    if sim.is_none() {
        // A real cluster: remove everything, whatever happened.
        if let Err(error) = env.cleanup().await {
            eprintln!("cleanup failed: {error:#}");
        }
    }
    if let Some(sim) = sim {
        sim.stop().await;
    }
    let mut report = outcome?;
    if let Value::Object(map) = &mut report {
        let command: Vec<String> = std::env::args().skip(1).collect();
        map.insert("command".into(), json!(command.join(" ")));
        // Other work on the machine skews every figure; keep a trace of it.
        map.insert(
            "load_average_1m".into(),
            json!({"before": load_before, "after": load_average()}),
        );
        map.insert(
            "api_server".into(),
            json!(if env.args.kubeconfig.is_some() {
                "cluster"
            } else {
                "kube-sim"
            }),
        );
        if env.args.kubeconfig.is_none() {
            map.insert("sim_profile".into(), json!(env.args.sim_profile));
        }
    }
    if env.args.json {
        println!("{report}");
    } else {
        report::print_text(&report);
    }
    match report.get("incomplete").and_then(Value::as_str) {
        Some(why) => bail!("the run did not complete: {why}"),
        None => Ok(()),
    }
}

/// The 1-minute load average of the machine.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
