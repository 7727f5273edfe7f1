//! Throughput of kube-sim as a real `kube::Client` sees it: a benchmark, not a test.
//!
//! ```text
//! cargo run --release -p kube-sim --example sim_bench -- [--objects N] [--writers C] [--watchers W]
//! ```
//!
//! Prints creates/s and updates/s (PVCs written by C concurrent tasks), list latency (p50/p95
//! over 20 lists, full and paged by 500), watch events/s delivered to kube-runtime watchers
//! while another client writes as fast as it can, the process RSS, and then, in a fresh sim
//! with the PV binder on, how fast claims get annotated and bound. The sim and the clients
//! share the process and its cores, as they do in tests.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_client::Client;
use kube_client::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_runtime::watcher;
use kube_sim::KubeSim;
use serde_json::json;
use tokio::time::Instant;

/// Benchmark options.
#[derive(Debug, Parser)]
struct Args {
    /// Claims created and updated (and listed) in each phase.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Concurrent writing tasks.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// Watchers in the fan-out watch phase.
    #[arg(long, default_value_t = 8)]
    watchers: usize,
    /// Lists per list-latency figure.
    #[arg(long, default_value_t = 20)]
    lists: usize,
    /// Runs only the PV binder phase (for profiling it).
    #[arg(long)]
    binder_only: bool,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "yes"}},
        "spec": {
            "storageClassName": "bench",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .expect("a valid claim")
}

/// Runs `op(i)` for every i in 0..count on `writers` tasks; returns the elapsed time.
async fn in_parallel<F, Fut>(count: usize, writers: usize, op: F) -> Result<Duration, BoxError>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), kube_client::Error>> + Send,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..writers {
        let op = op.clone();
        tasks.spawn(async move {
            for i in (writer..count).step_by(writers) {
                op(i).await?;
            }
            Ok::<_, kube_client::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(start.elapsed())
}

fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    (at(50), at(95))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn create_claims(
    client: Client,
    namespace: &str,
    prefix: &str,
    args: &Args,
) -> Result<Duration, BoxError> {
    let api = Api::<PersistentVolumeClaim>::namespaced(client, namespace);
    let prefix = prefix.to_owned();
    in_parallel(args.objects, args.writers, move |i| {
        let api = api.clone();
        let object = claim(&format!("{prefix}-{i}"));
        async move { api.create(&PostParams::default(), &object).await.map(drop) }
    })
    .await
}

/// Starts `count` watchers on `namespace`; each reports when it has seen its initial list and
/// then counts events until it has seen `expected`.
async fn start_watchers(
    client: &Client,
    namespace: &str,
    count: usize,
    expected: usize,
) -> Result<tokio::task::JoinSet<Result<Instant, watcher::Error>>, BoxError> {
    let mut watchers = tokio::task::JoinSet::new();
    let mut ready = Vec::new();
    for _ in 0..count {
        let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        ready.push(ready_rx);
        watchers.spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
            let mut ready_tx = Some(ready_tx);
            let mut seen = 0;
            while let Some(event) = stream.try_next().await? {
                match event {
                    watcher::Event::InitDone => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                        seen += 1;
                        if seen == expected {
                            break;
                        }
                    }
                    watcher::Event::Init | watcher::Event::InitApply(_) => {}
                }
            }
            Ok(Instant::now())
        });
    }
    for rx in ready {
        rx.await?;
    }
    Ok(watchers)
}

/// Events per second that `watchers` kube-runtime watchers receive while `args.objects` claims
/// are created in a fresh namespace.
async fn watch_phase(
    sim: &KubeSim,
    namespace: &str,
    watchers: usize,
    args: &Args,
) -> Result<(usize, Duration), BoxError> {
    let client = sim.client();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let mut running = start_watchers(&client, namespace, watchers, args.objects).await?;
    let start = Instant::now();
    create_claims(client, namespace, "w", args).await?;
    let mut last = start;
    while let Some(done) = running.join_next().await {
        last = last.max(done??);
    }
    Ok((watchers * args.objects, last - start))
}

/// With the PV binder on, in a sim of its own: how long until every claim carries the
/// provisioner annotation, and until every claim is Bound once a PV names it.
async fn binder_phase(args: &Args) -> Result<(Duration, Duration), BoxError> {
    let sim = KubeSim::builder().pv_binder(true).start().await?;
    let client = sim.client();
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "bench"}, "provisioner": "bench.example.com",
    }))?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;

    // One watcher tracks how many claims are annotated and how many are bound.
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let (progress_tx, mut progress) = tokio::sync::watch::channel((0, 0));
    let watch_api = api.clone();
    let tracker = tokio::spawn(async move {
        let mut annotated = HashSet::new();
        let mut bound = HashSet::new();
        let mut stream = std::pin::pin!(watcher(watch_api, watcher::Config::default()));
        while let Some(event) = stream.try_next().await? {
            if let watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) = event {
                let name = claim.metadata.name.clone().unwrap_or_default();
                let annotations = claim.metadata.annotations.unwrap_or_default();
                if annotations.contains_key("volume.kubernetes.io/storage-provisioner") {
                    annotated.insert(name.clone());
                }
                if claim.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                    bound.insert(name);
                }
                let _ = progress_tx.send((annotated.len(), bound.len()));
            }
        }
        Ok::<_, watcher::Error>(())
    });

    let start = Instant::now();
    create_claims(client.clone(), "default", "b", args).await?;
    progress
        .wait_for(|(annotated, _)| *annotated == args.objects)
        .await?;
    let annotated = start.elapsed();

    let claims = api.list(&ListParams::default()).await?;
    let uids: Arc<HashMap<String, String>> = Arc::new(
        claims
            .items
            .into_iter()
            .filter_map(|c| Some((c.metadata.name?, c.metadata.uid?)))
            .collect(),
    );
    let volumes = Api::<PersistentVolume>::all(client);
    let start = Instant::now();
    in_parallel(args.objects, args.writers, move |i| {
        let volumes = volumes.clone();
        let claim = format!("b-{i}");
        let volume: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": format!("pv-{i}")},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "bench",
                "csi": {"driver": "bench.example.com", "volumeHandle": format!("vol-{i}")},
                "claimRef": {"namespace": "default", "name": claim, "uid": uids.get(&claim)},
            },
        }))
        .expect("a valid volume");
        async move {
            volumes
                .create(&PostParams::default(), &volume)
                .await
                .map(drop)
        }
    })
    .await?;
    progress
        .wait_for(|(_, bound)| *bound == args.objects)
        .await?;
    let bound = start.elapsed();
    tracker.abort();
    sim.shutdown().await;
    Ok((annotated, bound))
}

fn print_rss(label: &str) {
    match rss_kib() {
        Some(kib) => println!("{label}: {:.1} MiB", kib as f64 / 1024.0),
        None => println!("{label}: unknown (no /proc/self/status)"),
    }
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Creates, updates, lists and watches in a sim without the binder.
async fn api_phases(args: &Args) -> Result<(), BoxError> {
    let sim = KubeSim::builder().start().await?;
    let client = sim.client();
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let elapsed = create_claims(client.clone(), "default", "c", args).await?;
    println!(
        "creates:  {:>7} in {:>6.2} s = {:>8.0}/s",
        args.objects,
        elapsed.as_secs_f64(),
        rate(args.objects, elapsed)
    );

    let patch_api = api.clone();
    let elapsed = in_parallel(args.objects, args.writers, move |i| {
        let api = patch_api.clone();
        let patch = json!({"metadata": {"labels": {"round": "1"}}});
        async move {
            let params = PatchParams::default();
            api.patch(&format!("c-{i}"), &params, &Patch::Merge(patch))
                .await
                .map(drop)
        }
    })
    .await?;
    println!(
        "updates:  {:>7} in {:>6.2} s = {:>8.0}/s (merge patches)",
        args.objects,
        elapsed.as_secs_f64(),
        rate(args.objects, elapsed)
    );

    let mut full = Vec::new();
    for _ in 0..args.lists {
        let start = Instant::now();
        let list = api.list(&ListParams::default()).await?;
        full.push(start.elapsed());
        assert_eq!(
            list.items.len(),
            args.objects,
            "a full list returns every claim"
        );
    }
    let (p50, p95) = percentiles(full);
    println!(
        "list {} objects, full:      p50 {:>7.1} ms, p95 {:>7.1} ms ({} lists)",
        args.objects,
        ms(p50),
        ms(p95),
        args.lists
    );
    let mut paged = Vec::new();
    for _ in 0..args.lists {
        let start = Instant::now();
        let mut params = ListParams::default().limit(500);
        let mut items = 0;
        loop {
            let page = api.list(&params).await?;
            items += page.items.len();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        paged.push(start.elapsed());
        assert_eq!(items, args.objects, "the pages add up to every claim");
    }
    let (p50, p95) = percentiles(paged);
    println!(
        "list {} objects, limit 500: p50 {:>7.1} ms, p95 {:>7.1} ms ({} paged lists)",
        args.objects,
        ms(p50),
        ms(p95),
        args.lists
    );

    let (events, elapsed) = watch_phase(&sim, "watch-1", 1, args).await?;
    println!(
        "watch, 1 watcher:  {:>7} events in {:>6.2} s = {:>8.0} events/s (bounded by the write rate)",
        events,
        elapsed.as_secs_f64(),
        rate(events, elapsed)
    );
    let watchers = args.watchers.max(1);
    let (events, elapsed) = watch_phase(&sim, "watch-n", watchers, args).await?;
    println!(
        "watch, {watchers} watchers: {:>7} events in {:>6.2} s = {:>8.0} events/s delivered in total",
        events,
        elapsed.as_secs_f64(),
        rate(events, elapsed)
    );

    let stored = sim.object_count();
    print_rss(&format!("RSS with {stored} objects stored"));
    sim.shutdown().await;

    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.objects == 0 || args.writers == 0 || args.lists == 0 {
        return Err("--objects, --writers and --lists must be at least 1".into());
    }
    println!(
        "kube-sim benchmark: {} objects, {} writers, {} CPUs",
        args.objects,
        args.writers,
        std::thread::available_parallelism().map_or(0, usize::from)
    );

    if !args.binder_only {
        api_phases(&args).await?;
    }

    let (annotated, bound) = binder_phase(&args).await?;
    println!(
        "pv binder: {} claims annotated {:>6.2} s after the first create; \
         {} PVs bound {:>6.2} s after the first PV create = {:>6.0} binds/s",
        args.objects,
        annotated.as_secs_f64(),
        args.objects,
        bound.as_secs_f64(),
        rate(args.objects, bound)
    );
    print_rss("RSS at end");
    Ok(())
}
