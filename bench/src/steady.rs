//! `steady`: N bound claims and PVs in the controller's caches, idle.

use std::time::Duration;

use anyhow::Context as _;
use provision_controller::{Config, ProvisionController};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::{
    env::Env,
    objects::Noop,
    report::{self, Phase, mib, round},
};

/// Longest wait for the controller to finish processing its initial caches.
const MAX_SETTLE: Duration = Duration::from_secs(300);
/// A second with less controller CPU than this counts as idle.
const IDLE_CPU_PER_SECOND: f64 = 0.02;

/// Runs the scenario and returns its report.
pub(crate) async fn run(env: &Env) -> anyhow::Result<Value> {
    let names = &env.names;
    let n = env.args.n;
    let workers = env.args.workers.unwrap_or(Config::DEFAULT_THREADS);
    env.setup(true).await?;
    env.populate(&names.provisioner, n).await?;

    let s0 = env.probe.snapshot();
    env.probe.take_peaks();
    let client = env.controller_client().await?;
    let mut config = Config::default()
        .threads(workers)
        .leader_election(None)
        .metrics_port(0);
    if let Some(secs) = env.args.resync_secs {
        config = config.resync_period(Duration::from_secs(secs));
    }
    if let Some(on) = env.args.crash_safe {
        config = config.crash_safe_provisioning(on);
    }
    let provisioner = Noop {
        driver: names.csi_driver(),
        labels: names.labels(),
    };
    let controller =
        ProvisionController::new(client, names.provisioner.clone(), provisioner).config(config);
    let (stop, stopped) = oneshot::channel::<()>();
    let running = env.controller.spawn(controller.run(async {
        let _ = stopped.await;
    }));
    env.wait_synced(3).await?;
    let s1 = env.probe.snapshot();
    eprintln!("controller synced; waiting until it is idle");

    // Every cached claim and volume is processed once at start; wait until that is done.
    let mut last = s1.clone();
    let settle_deadline = tokio::time::Instant::now() + MAX_SETTLE;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = env.probe.snapshot();
        let busy = Phase::between(&last, &now).controller_cpu;
        last = now;
        if busy < IDLE_CPU_PER_SECOND || tokio::time::Instant::now() > settle_deadline {
            break;
        }
    }
    let s2 = last;
    let (peak_startup, sim_peak_startup) = env.probe.take_peaks();
    eprintln!("idle; measuring for {} s", env.args.idle_secs);

    let mut minutes = Vec::new();
    let mut minute_start = s2.clone();
    let idle_end = tokio::time::Instant::now() + Duration::from_secs(env.args.idle_secs);
    loop {
        let left = idle_end.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(left.min(Duration::from_secs(60))).await;
        let now = env.probe.snapshot();
        let phase = Phase::between(&minute_start, &now);
        minutes.push(json!({
            "seconds": round(phase.seconds, 1),
            "controller_cpu_s": round(phase.controller_cpu, 3),
            "rss_mib": mib(now.memory.rss_kib),
        }));
        minute_start = now;
    }
    let s3 = env.probe.snapshot();
    let (peak_idle, _) = env.probe.take_peaks();

    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .context("the controller did not stop within 60 s")?
        .context("the controller task panicked")?;
    result.context("the controller failed")?;

    let sync = Phase::between(&s0, &s1);
    let startup = Phase::between(&s0, &s2);
    let idle = Phase::between(&s2, &s3);
    let pairs = n.max(1) as f64;
    let growth = s3.memory.rss_kib.saturating_sub(s0.memory.rss_kib);
    Ok(json!({
        "scenario": "steady",
        "struct_bytes": {
            "PersistentVolume": std::mem::size_of::<k8s_openapi::api::core::v1::PersistentVolume>(),
            "PersistentVolumeClaim":
                std::mem::size_of::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(),
            "ObjectMeta": std::mem::size_of::<kube_client::api::ObjectMeta>(),
        },
        "n": n,
        "workers": workers.get(),
        "crash_safe_provisioning": env.args.crash_safe.map_or(json!("default"), |on| json!(on)),
        "startup": {
            "seconds_to_sync": round(sync.seconds, 2),
            "seconds_to_idle": round(startup.seconds, 2),
            "controller_cpu_s": round(startup.controller_cpu, 2),
            "sim_cpu_s": round(startup.sim_cpu, 2),
            "controller_cpu_s_per_1000_pairs": round(startup.controller_cpu / pairs * 1000.0, 3),
            "api_requests": report::by_verb(&startup.api),
        },
        "idle": {
            "seconds": round(idle.seconds, 1),
            "controller_cpu_s": round(idle.controller_cpu, 3),
            "controller_cpu_s_per_minute": round(idle.controller_cpu / idle.seconds * 60.0, 3),
            "driver_cpu_s": round(idle.driver_cpu, 3),
            "api_requests": report::by_verb(&idle.api),
            "minutes": minutes,
        },
        "memory_mib": {
            "before_controller": mib(s0.memory.rss_kib),
            "after_sync": mib(s1.memory.rss_kib),
            "idle_start": mib(s2.memory.rss_kib),
            "idle_end": mib(s3.memory.rss_kib),
            "peak_sampled_startup": mib(peak_startup),
            "peak_sampled_idle": mib(peak_idle),
            "peak_hwm": mib(s3.memory.hwm_kib),
            "controller_rss_idle_end": mib(growth),
            "rss_per_cached_pair_kib": round(growth as f64 / pairs, 2),
            "sim_peak": mib(sim_peak_startup),
        },
    }))
}
