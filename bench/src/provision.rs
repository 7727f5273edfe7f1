//! `provision`: N claims at once through a no-op provisioner, then all deleted.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube_client::{Api, api::DeleteParams};
use kube_runtime::watcher;
use provision_controller::{Config, ProvisionController};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::{
    creators,
    env::{self, Env, wait_for},
    objects::{self, Names, Noop},
    report::{self, Phase, latency, mib, round},
    track::{Step, Timeline, follow},
};

/// No controller request for this long ends a phase's accounting (queued events written).
const SETTLE_QUIET: Duration = Duration::from_millis(300);
/// The longest wait for that.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// Runs the scenario and returns its report.
pub(crate) async fn run(env: &Env) -> anyhow::Result<Value> {
    let names = &env.names;
    let n = env.args.n;
    let workers = env.args.workers.unwrap_or(Config::DEFAULT_THREADS);
    env.setup(true).await?;

    // The driver's view: claims Bound, PVs created and gone.
    let timeline = Timeline::new(n);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.driver.clone(), &names.namespace);
    let watches = observe(env, &timeline).await?;

    // The controller, on its own runtime.
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
    if let Some(max) = env.args.max_in_flight {
        config = config.max_requests_in_flight(std::num::NonZeroUsize::new(max));
    }
    if let Some(on) = env.args.adapt {
        config = config.adapt_requests_in_flight(on);
    }
    if let Some(on) = env.args.crash_safe {
        config = config.crash_safe_provisioning(on);
    }
    let controller = ProvisionController::new(
        client,
        names.provisioner.clone(),
        Noop {
            driver: names.csi_driver(),
            labels: names.labels(),
        },
    )
    .config(config);
    let (stop, stopped) = oneshot::channel::<()>();
    let running = env.controller.spawn(controller.run(async {
        let _ = stopped.await;
    }));
    env.wait_synced(3).await?;
    let s1 = env.probe.snapshot();
    let server1 = env.server_counts().await?;
    eprintln!("controller synced; creating {n} claims");

    // Provision: create every claim, wait until all are Bound.
    let creators = creators::run(env, Some(&timeline)).await?;
    let created = creators.created;
    eprintln!("{created} claims created in {:.2} s", creators.seconds);
    // A phase that times out ends the run early, but its figures are still reported.
    let mut incomplete = wait_for("claims Bound", env.args.timeout(), || {
        let (pv, b) = (timeline.count(Step::Created), timeline.count(Step::Ready));
        (b >= created)
            .then_some(())
            .ok_or_else(|| format!("{pv} PVs created, {b} of {created} claims Bound"))
    })
    .await
    .err()
    .map(|e| format!("{e:#}"));
    env::settle(&env.probe.api, SETTLE_QUIET, SETTLE_LIMIT).await;
    let s2 = env.probe.snapshot();
    let server2 = env.server_counts().await?;
    let connections_peak = env.server_connections_peak().await?;
    let (peak_provision, sim_peak_provision) = env.probe.take_peaks();
    if incomplete.is_none() {
        eprintln!("all Bound; deleting {created} claims");
    }

    // Delete every claim, wait until every PV is gone.
    let deleting = if incomplete.is_some() { 0 } else { n };
    let deleted = futures::stream::iter(0..deleting)
        .map(|i| {
            let (claims, timeline) = (claims.clone(), timeline.clone());
            async move {
                timeline.mark(i, Step::DeleteSent);
                claims
                    .delete(&Names::claim(i), &DeleteParams::default())
                    .await
            }
        })
        .buffer_unordered(env.args.in_flight)
        .filter(|r| std::future::ready(r.is_ok()))
        .count()
        .await;
    if incomplete.is_none() {
        incomplete = wait_for("PVs deleted", env.args.timeout(), || {
            let gone = timeline.count(Step::Gone);
            (gone >= created)
                .then_some(())
                .ok_or_else(|| format!("{gone} of {created} PVs gone"))
        })
        .await
        .err()
        .map(|e| format!("{e:#}"));
    }
    env::settle(&env.probe.api, SETTLE_QUIET, SETTLE_LIMIT).await;
    let s3 = env.probe.snapshot();
    let server3 = env.server_counts().await?;
    let (peak_delete, sim_peak_delete) = env.probe.take_peaks();

    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .context("the controller did not stop within 60 s")?
        .context("the controller task panicked")?;
    let failures = env.probe.api.failures();
    let written = env.probe.api.written_bytes();
    for handle in watches {
        handle.abort();
    }
    result.context("the controller failed")?;

    let startup = Phase::between(&s0, &s1);
    let provision = Phase::between(&s1, &s2);
    let delete = Phase::between(&s2, &s3);
    let provision_span = timeline.span(Step::Sent, Step::Ready).unwrap_or_default();
    let delete_span = timeline
        .span(Step::DeleteSent, Step::Gone)
        .unwrap_or_default();
    let per_second = |count: usize, span: Duration| round(count as f64 / span.as_secs_f64(), 1);
    let (bound, gone) = (timeline.count(Step::Ready), timeline.count(Step::Gone));
    let volumes = created.max(1) as f64;
    let mut both = provision.api.clone();
    for (k, v) in &delete.api {
        *both.entry(k.clone()).or_default() += v;
    }
    let rss_growth = s2.memory.rss_kib.saturating_sub(s0.memory.rss_kib);
    let server = match (&server1, &server2, &server3) {
        (Some(a), Some(b), Some(c)) => json!({
            "provision": report::server_per_object(a, b, created),
            "delete": report::server_per_object(b, c, created),
        }),
        _ => Value::Null,
    };
    let pv_span = timeline.span(Step::Sent, Step::Created).unwrap_or_default();
    Ok(json!({
        "scenario": "provision",
        "incomplete": incomplete,
        "n": n,
        "created": created,
        "deleted": deleted,
        "workers": workers.get(),
        "crash_safe_provisioning": env.args.crash_safe.map_or(json!("default"), |on| json!(on)),
        "adapt_requests_in_flight": env.args.adapt.map_or(json!("default"), |on| json!(on)),
        "in_flight": env.args.in_flight,
        "provision": {
            "seconds": round(provision_span.as_secs_f64(), 2),
            "throughput_per_s": per_second(bound, provision_span),
            "pv_created_per_s": per_second(timeline.count(Step::Created), pv_span),
            "driver_send_seconds": round(creators.seconds, 2),
            "driver_creates_per_s": creators.per_second(),
            "creators": env.args.creators.name(),
            "latency_created_to_pv": latency(timeline.latencies(Step::Sent, Step::Created)),
            "latency_created_to_bound": latency(timeline.latencies(Step::Sent, Step::Ready)),
            "sim_connections_peak": connections_peak,
        },
        "delete": {
            "seconds": round(delete_span.as_secs_f64(), 2),
            "throughput_per_s": per_second(gone, delete_span),
            "latency_deleted_to_pv_gone": latency(timeline.latencies(Step::DeleteSent, Step::Gone)),
        },
        "cpu": {
            "controller_s_per_1000_volumes": round(
                (provision.controller_cpu + delete.controller_cpu) / volumes * 1000.0, 3),
            "controller_s_per_1000_provisioned": round(
                provision.controller_cpu / volumes * 1000.0, 3),
            "startup": startup.cpu_json(),
            "provision": provision.cpu_json(),
            "delete": delete.cpu_json(),
        },
        "memory_mib": {
            "before_controller": mib(s0.memory.rss_kib),
            "after_sync": mib(s1.memory.rss_kib),
            "all_bound": mib(s2.memory.rss_kib),
            "after_delete": mib(s3.memory.rss_kib),
            "peak_sampled_provision": mib(peak_provision),
            "peak_sampled_delete": mib(peak_delete),
            "peak_hwm": mib(s3.memory.hwm_kib),
            "rss_growth_per_bound_pair_kib": round(rss_growth as f64 / volumes, 2),
            "sim_peak": mib(sim_peak_provision.max(sim_peak_delete)),
        },
        "server_requests": server,
        "api_requests": {
            "startup": report::by_verb(&startup.api),
            "per_volume_provision": report::per_object(&provision.api, created),
            "per_volume_delete": report::per_object(&delete.api, created),
            "per_volume_total_by_verb": report::per_object(&both, created)["per_object_by_verb"],
            // Request body KiB the controller wrote, per volume, by resource (whole run).
            "written_kib_per_volume": written
                .iter()
                .map(|(resource, bytes)| {
                    (resource.clone(), json!(round(*bytes as f64 / 1024.0 / volumes, 2)))
                })
                .collect::<serde_json::Map<_, _>>(),
            "failed_responses": failures
                .iter()
                .map(|((what, code), n)| (format!("{what} {code}"), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
        },
    }))
}

/// Starts the driver's watches of the run's claims (Bound) and PVs (created, gone), marking
/// `timeline`, and waits until both have listed.
pub(crate) async fn observe(
    env: &Env,
    timeline: &Arc<Timeline>,
) -> anyhow::Result<[JoinHandle<()>; 2]> {
    let names = &env.names;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.driver.clone(), &names.namespace);
    let bound = |c: &PersistentVolumeClaim, t: &Timeline| {
        let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
        let name = c.metadata.name.as_deref().unwrap_or_default();
        if let (Some("Bound"), Some(i)) = (phase, objects::index_of(name, "bench-", t.len())) {
            t.mark(i, Step::Ready);
        }
    };
    let ns = names.namespace.clone();
    let index = move |v: &PersistentVolume, t: &Timeline| {
        let claim = v.spec.as_ref()?.claim_ref.as_ref()?;
        if claim.namespace.as_deref() != Some(&ns) {
            return None;
        }
        objects::index_of(claim.name.as_deref()?, "bench-", t.len())
    };
    let index2 = index.clone();
    let watches = [
        follow(
            claims.clone(),
            watcher::Config::default(),
            timeline.clone(),
            bound,
            |_, _| {},
        ),
        follow(
            Api::<PersistentVolume>::all(env.driver.clone()),
            watcher::Config::default().labels(&names.selector()),
            timeline.clone(),
            move |v, t| {
                if let Some(i) = index(v, t) {
                    t.mark(i, Step::Created);
                }
            },
            move |v, t| {
                if let Some(i) = index2(v, t) {
                    t.mark(i, Step::Gone);
                }
            },
        ),
    ];
    wait_for("driver watches", env.args.timeout(), || {
        let synced = timeline.synced();
        (synced >= 2)
            .then_some(())
            .ok_or_else(|| format!("{synced} of 2 synced"))
    })
    .await?;

    Ok(watches)
}
