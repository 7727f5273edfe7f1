//! Measurements at checkpoints, percentiles, and the report (text or JSON).

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde_json::{Map, Value, json};
use tokio::time::Instant;

use crate::{
    counting::{ApiCounter, Counts},
    procfs,
};

/// What kube-sim answered, by `(verb, resource, client)`, from its `/metrics`; `None`
/// against a cluster (its `apiserver_request_total` has no client label).
pub(crate) type ServerCounts = std::collections::BTreeMap<(String, String, String), u64>;

/// What the process, the driver thread, the sim child and the controller's client had
/// used at one moment. Taken on the driver thread.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    at: Instant,
    process_cpu: f64,
    driver_cpu: f64,
    sim_cpu: f64,
    /// This process's memory.
    pub(crate) memory: procfs::Memory,
    api: Counts,
}

/// Takes [`Snapshot`]s; must be used from the driver thread only.
#[derive(Clone, Debug)]
pub(crate) struct Probe {
    /// The controller's request counter.
    pub(crate) api: ApiCounter,
    /// The sim child, when there is one.
    pub(crate) sim_pid: Option<u32>,
    peaks: Arc<Peaks>,
}

#[derive(Debug, Default)]
struct Peaks {
    rss_kib: AtomicU64,
    sim_rss_kib: AtomicU64,
}

impl Probe {
    /// A probe, with a sampler of the peak RSS every 100 ms on the current runtime.
    pub(crate) fn new(api: ApiCounter, sim_pid: Option<u32>) -> Self {
        let peaks = Arc::new(Peaks::default());
        let sampled = Arc::clone(&peaks);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let rss = procfs::memory().rss_kib;
                sampled.rss_kib.fetch_max(rss, Ordering::Relaxed);
                if let Some(pid) = sim_pid {
                    let sim = procfs::pid_memory(pid).rss_kib;
                    sampled.sim_rss_kib.fetch_max(sim, Ordering::Relaxed);
                }
            }
        });
        Self {
            api,
            sim_pid,
            peaks,
        }
    }

    /// The current figures.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            at: Instant::now(),
            process_cpu: procfs::process_cpu(),
            driver_cpu: procfs::thread_cpu(),
            sim_cpu: self.sim_pid.map_or(0.0, procfs::pid_cpu),
            memory: procfs::memory(),
            api: self.api.snapshot(),
        }
    }

    /// Peak RSS (this process, the sim) sampled since the last call, in KiB; restarts the peaks.
    pub(crate) fn take_peaks(&self) -> (u64, u64) {
        let rss = self
            .peaks
            .rss_kib
            .swap(procfs::memory().rss_kib, Ordering::Relaxed);
        let sim = self.sim_pid.map_or(0, |p| procfs::pid_memory(p).rss_kib);
        (rss, self.peaks.sim_rss_kib.swap(sim, Ordering::Relaxed))
    }
}

/// What happened between two snapshots.
#[derive(Clone, Debug)]
pub(crate) struct Phase {
    /// Wall time.
    pub(crate) seconds: f64,
    /// CPU of the process minus the driver thread's.
    pub(crate) controller_cpu: f64,
    /// CPU of the driver thread.
    pub(crate) driver_cpu: f64,
    /// CPU of the sim child.
    pub(crate) sim_cpu: f64,
    /// The controller's requests.
    pub(crate) api: Counts,
}

impl Phase {
    /// The difference `to - from`.
    pub(crate) fn between(from: &Snapshot, to: &Snapshot) -> Self {
        let driver_cpu = to.driver_cpu - from.driver_cpu;
        let api = to
            .api
            .iter()
            .map(|(k, n)| (k.clone(), n - from.api.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        Self {
            seconds: (to.at - from.at).as_secs_f64(),
            controller_cpu: (to.process_cpu - from.process_cpu - driver_cpu).max(0.0),
            driver_cpu,
            sim_cpu: to.sim_cpu - from.sim_cpu,
            api,
        }
    }

    /// CPU seconds as JSON.
    pub(crate) fn cpu_json(&self) -> Value {
        json!({
            "seconds": round(self.seconds, 2),
            "controller_cpu_s": round(self.controller_cpu, 2),
            "driver_cpu_s": round(self.driver_cpu, 2),
            "sim_cpu_s": round(self.sim_cpu, 2),
        })
    }
}

/// Requests by verb (summed over resources).
pub(crate) fn by_verb(api: &Counts) -> BTreeMap<String, u64> {
    let mut verbs = BTreeMap::new();
    for ((verb, _), n) in api {
        *verbs.entry(verb.clone()).or_default() += n;
    }
    verbs
}

/// Write requests (create, update, patch, delete).
pub(crate) fn writes(api: &Counts) -> u64 {
    let is_write = |v: &str| matches!(v, "create" | "update" | "patch" | "delete");
    api.iter()
        .filter(|((v, _), _)| is_write(v))
        .map(|(_, n)| n)
        .sum()
}

/// Requests per object by verb, and by `verb resource`.
pub(crate) fn per_object(api: &Counts, objects: usize) -> Value {
    let objects = objects.max(1) as f64;
    let mut verbs = Map::new();
    for verb in [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ] {
        let n = by_verb(api).get(verb).copied().unwrap_or(0);
        verbs.insert(verb.to_owned(), json!(round(n as f64 / objects, 3)));
    }
    let detail: Map<String, Value> = api
        .iter()
        .map(|((verb, res), n)| (format!("{verb} {res}"), json!(n)))
        .collect();
    json!({
        "per_object_by_verb": verbs,
        "writes_per_object": round(writes(api) as f64 / objects, 3),
        "totals": detail,
    })
}

/// What kube-sim answered between two readings of its counters, per object: writes and
/// reads by client (`client`: the controller and the driver; `pv-binder`: the sim's
/// binder), and the controller's share is in `api_requests`.
pub(crate) fn server_per_object(from: &ServerCounts, to: &ServerCounts, objects: usize) -> Value {
    let objects = objects.max(1) as f64;
    let is_write = |v: &str| {
        matches!(
            v,
            "create" | "update" | "patch" | "delete" | "deletecollection" | "write"
        )
    };
    let is_read = |v: &str| matches!(v, "get" | "list");
    let mut by_client: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut detail = Map::new();
    for (key @ (verb, resource, client), n) in to {
        let n = n - from.get(key).copied().unwrap_or(0);
        if n == 0 {
            continue;
        }
        let entry = by_client.entry(client.clone()).or_default();
        if is_write(verb) {
            entry.0 += n;
        } else if is_read(verb) {
            entry.1 += n;
        }
        detail.insert(format!("{client} {verb} {resource}"), json!(n));
    }
    let (writes, reads) = by_client
        .values()
        .fold((0, 0), |(w, r), (cw, cr)| (w + cw, r + cr));
    let clients: Map<String, Value> = by_client
        .iter()
        .map(|(client, (w, r))| {
            let per = |n: u64| round(n as f64 / objects, 3);
            (client.clone(), json!({"writes": per(*w), "reads": per(*r)}))
        })
        .collect();
    json!({
        "writes_per_object": round(writes as f64 / objects, 3),
        "reads_per_object": round(reads as f64 / objects, 3),
        "by_client": clients,
        "totals": detail,
    })
}

/// p50, p95, p99 and max (nearest rank) in milliseconds, and the count.
pub(crate) fn latency(mut samples: Vec<Duration>) -> Value {
    if samples.is_empty() {
        return json!({"count": 0});
    }
    samples.sort_unstable();
    let at = |p: f64| {
        let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
        round(
            samples[rank.clamp(1, samples.len()) - 1].as_secs_f64() * 1e3,
            1,
        )
    };
    json!({
        "count": samples.len(),
        "p50_ms": at(50.0),
        "p95_ms": at(95.0),
        "p99_ms": at(99.0),
        "max_ms": at(100.0),
    })
}

/// Rounds to `digits` decimals.
pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// KiB as MiB with one decimal.
pub(crate) fn mib(kib: u64) -> f64 {
    round(kib as f64 / 1024.0, 1)
}

/// Prints a report as indented `key: value` lines.
pub(crate) fn print_text(value: &Value) {
    fn walk(value: &Value, indent: usize, out: &mut String) {
        if let Value::Object(map) = value {
            for (key, v) in map {
                match v {
                    Value::Object(inner) if !inner.is_empty() => {
                        out.push_str(&format!("{:indent$}{key}:\n", ""));
                        walk(v, indent + 2, out);
                    }
                    _ => out.push_str(&format!("{:indent$}{key}: {v}\n", "")),
                }
            }
        }
    }
    let mut out = String::new();
    walk(value, 0, &mut out);
    print!("{out}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples = (1..=100).map(Duration::from_millis).collect();
        let l = latency(samples);
        assert_eq!(l["p50_ms"], json!(50.0));
        assert_eq!(l["p99_ms"], json!(99.0));
        assert_eq!(l["max_ms"], json!(100.0));
    }
}
