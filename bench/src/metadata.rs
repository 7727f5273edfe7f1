//! `metadata`: N CnsVolumeMetadata objects through the reconciler (in-memory backend),
//! until every volume is updated, then all deleted.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, ensure};
use cnsmetadata::{
    CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference, EntityType, VSPHERE_CSI_DRIVER,
    testing::InMemoryBackend,
};
use futures::StreamExt;
use kube_client::{
    Api,
    api::{DeleteParams, PostParams},
};
use kube_runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::{
    env::{Env, wait_for},
    objects::{self, Names},
    report::{self, Phase, latency, mib, round},
    track::{Step, Timeline, follow},
};

const GUEST_CLUSTER: &str = "gc-bench";
const PREFIX: &str = "cvm-";

/// A PVC entity of the guest cluster backed by supervisor claim `i`.
fn object(namespace: &str, i: usize) -> CnsVolumeMetadata {
    let spec = CnsVolumeMetadataSpec {
        volume_names: vec![Names::claim(i)],
        guest_cluster_id: GUEST_CLUSTER.into(),
        entity_type: EntityType::PersistentVolumeClaim,
        entity_name: format!("guest-claim-{i:06}"),
        entity_references: vec![EntityReference::new(
            EntityType::PersistentVolume,
            &format!("guest-pv-{i:06}"),
            "",
            GUEST_CLUSTER,
        )],
        labels: BTreeMap::from([("app".to_owned(), "bench".to_owned())]),
        namespace: "guest-ns".into(),
        cluster_distribution: "TKGService".into(),
    };
    let mut object = CnsVolumeMetadata::new(&format!("{PREFIX}{i:06}"), spec);
    object.metadata.namespace = Some(namespace.to_owned());
    object
}

/// Runs the scenario and returns its report.
pub(crate) async fn run(env: &Env) -> anyhow::Result<Value> {
    let names = &env.names;
    let n = env.args.n;
    let workers = env
        .args
        .workers
        .unwrap_or(cnsmetadata::Config::DEFAULT_WORKER_THREADS);
    env.setup(false).await?;
    env.install_crd().await?;
    env.populate(VSPHERE_CSI_DRIVER, n).await?;

    let timeline = Timeline::new(n);
    let api: Api<CnsVolumeMetadata> = Api::namespaced(env.driver.clone(), &names.namespace);
    let index = |o: &CnsVolumeMetadata, t: &Timeline| {
        objects::index_of(
            o.metadata.name.as_deref().unwrap_or_default(),
            PREFIX,
            t.len(),
        )
    };
    let watch = follow(
        api.clone(),
        watcher::Config::default(),
        timeline.clone(),
        move |o, t| {
            let status = &o.status.volume_status;
            if !status.is_empty()
                && status.iter().all(|s| s.updated)
                && let Some(i) = index(o, t)
            {
                t.mark(i, Step::Ready);
            }
        },
        move |o, t| {
            if let Some(i) = index(o, t) {
                t.mark(i, Step::Gone);
            }
        },
    );
    wait_for("driver watch", env.args.timeout(), || {
        (timeline.synced() >= 1)
            .then_some(())
            .ok_or_else(|| "not synced".to_owned())
    })
    .await?;

    let s0 = env.probe.snapshot();
    env.probe.take_peaks();
    let client = env.controller_client().await?;
    let backend = InMemoryBackend::new();
    let config = cnsmetadata::Config::default()
        .worker_threads(workers)
        .cluster_id("bench-cluster")
        .vsphere_user("bench@vsphere.local");
    let (stop, stopped) = oneshot::channel::<()>();
    let running = env.controller.spawn(
        cnsmetadata::MetadataController::new(client, backend.clone())
            .config(config)
            .run(async {
                let _ = stopped.await;
            }),
    );
    env.wait_synced(3).await?;
    let s1 = env.probe.snapshot();
    eprintln!("reconciler synced; creating {n} CnsVolumeMetadata objects");

    let created = futures::stream::iter(0..n)
        .map(|i| {
            let (api, timeline) = (api.clone(), timeline.clone());
            let object = object(&names.namespace, i);
            async move {
                timeline.mark(i, Step::Sent);
                api.create(&PostParams::default(), &object).await
            }
        })
        .buffer_unordered(env.args.in_flight)
        .filter(|r| std::future::ready(r.is_ok()))
        .count()
        .await;
    wait_for("objects updated", env.args.timeout(), || {
        let done = timeline.count(Step::Ready);
        (done >= created)
            .then_some(())
            .ok_or_else(|| format!("{done} of {created} updated"))
    })
    .await?;
    let s2 = env.probe.snapshot();
    let (peak_update, sim_peak_update) = env.probe.take_peaks();
    let updates = backend.successful_updates().len();
    backend.clear_calls();
    eprintln!("all updated; deleting {created} objects");

    futures::stream::iter(0..n)
        .map(|i| {
            let (api, timeline) = (api.clone(), timeline.clone());
            async move {
                timeline.mark(i, Step::DeleteSent);
                api.delete(&format!("{PREFIX}{i:06}"), &DeleteParams::default())
                    .await
            }
        })
        .buffer_unordered(env.args.in_flight)
        .for_each(|_| async {})
        .await;
    wait_for("objects gone", env.args.timeout(), || {
        let gone = timeline.count(Step::Gone);
        (gone >= created)
            .then_some(())
            .ok_or_else(|| format!("{gone} of {created} gone"))
    })
    .await?;
    let s3 = env.probe.snapshot();
    let (peak_delete, _) = env.probe.take_peaks();
    let removals = backend.successful_updates().len();

    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .context("the reconciler did not stop within 60 s")?
        .context("the reconciler task panicked")?;
    watch.abort();
    result.context("the reconciler failed")?;
    ensure!(
        updates >= created && removals >= created,
        "the backend saw {updates} updates and {removals} removals for {created} objects"
    );

    let startup = Phase::between(&s0, &s1);
    let update = Phase::between(&s1, &s2);
    let delete = Phase::between(&s2, &s3);
    let update_span = timeline.span(Step::Sent, Step::Ready).unwrap_or_default();
    let delete_span = timeline
        .span(Step::DeleteSent, Step::Gone)
        .unwrap_or_default();
    let per_second = |span: Duration| round(created as f64 / span.as_secs_f64(), 1);
    let objects = created.max(1) as f64;
    Ok(json!({
        "scenario": "metadata",
        "n": n,
        "created": created,
        "workers": workers.get(),
        "backend_updates": updates,
        "backend_removals": removals,
        "update": {
            "seconds": round(update_span.as_secs_f64(), 2),
            "throughput_per_s": per_second(update_span),
            "latency_created_to_updated": latency(timeline.latencies(Step::Sent, Step::Ready)),
        },
        "delete": {
            "seconds": round(delete_span.as_secs_f64(), 2),
            "throughput_per_s": per_second(delete_span),
            "latency_deleted_to_gone": latency(timeline.latencies(Step::DeleteSent, Step::Gone)),
        },
        "cpu": {
            "controller_s_per_1000_objects": round(
                (update.controller_cpu + delete.controller_cpu) / objects * 1000.0, 3),
            "startup": startup.cpu_json(),
            "update": update.cpu_json(),
            "delete": delete.cpu_json(),
        },
        "memory_mib": {
            "before_controller": mib(s0.memory.rss_kib),
            "after_sync": mib(s1.memory.rss_kib),
            "all_updated": mib(s2.memory.rss_kib),
            "after_delete": mib(s3.memory.rss_kib),
            "peak_sampled_update": mib(peak_update),
            "peak_sampled_delete": mib(peak_delete),
            "peak_hwm": mib(s3.memory.hwm_kib),
            "sim_peak": mib(sim_peak_update),
        },
        "api_requests": {
            "startup": report::by_verb(&startup.api),
            "per_object_update": report::per_object(&update.api, created),
            "per_object_delete": report::per_object(&delete.api, created),
        },
    }))
}
