//! The controller's Prometheus metrics, registered on a registry the caller owns
//! ([`ProvisionController::metrics_registry`](crate::ProvisionController::metrics_registry)).
//! Names and labels are the Go library's and client-go's work queues'; docs/production.md
//! lists them. The two `workqueue_*_seconds` gauges are computed at each scrape.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_controller_kit::client::InFlightLimit;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

/// Buckets of the provision and delete duration histograms: Prometheus' default buckets,
/// which the Go library uses (`prometheus.DefBuckets`).
const OPERATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// client-go's work-queue histograms: ten buckets from 10 ns growing tenfold to 10 s.
fn queue_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    class: String,
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: &'static str,
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it (every critical
/// section here leaves the maps consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The controller's metrics: the Go library's provisioning and deletion counters, queue
/// metrics, and a few gauges of controller state.
///
/// Cheap to clone; clones update the same metrics.
#[doc(alias = "MetricsInstance")]
#[derive(Clone, Debug)]
pub(crate) struct ControllerMetrics {
    provision_total: Family<ClaimLabels, Counter>,
    provision_failed: Family<ClaimLabels, Counter>,
    provision_stopped: Family<ClaimLabels, Counter>,
    provision_duration: HistogramFamily<ClaimLabels>,
    delete_total: Family<ClassLabels, Counter>,
    delete_failed: Family<ClassLabels, Counter>,
    delete_stopped: Family<ClassLabels, Counter>,
    delete_duration: HistogramFamily<ClassLabels>,
    claims_in_progress: Gauge,
    unsaved_pvs: Gauge,
    journal_entries: Family<StateLabels, Gauge>,
    journal_oldest: Family<StateLabels, Gauge>,
    journal_writes: Counter,
    leader: Gauge,
    queue_depth: Family<QueueLabels, Gauge>,
    queue_adds: Family<QueueLabels, Counter>,
    queue_retries: Family<QueueLabels, Counter>,
    queue_duration: HistogramFamily<QueueLabels>,
    work_duration: HistogramFamily<QueueLabels>,
    in_flight: Arc<InFlightCollector>,
    requests: Arc<RequestsCollector>,
}

impl ControllerMetrics {
    /// Creates the metrics and registers every one of them on `registry`.
    ///
    /// Nothing is registered globally. Call this once per registry: the names are fixed,
    /// so a second call on the same registry would encode every metric twice.
    #[must_use]
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            provision_total: Family::default(),
            provision_failed: Family::default(),
            provision_stopped: Family::default(),
            provision_duration: Family::new_with_constructor(operation_histogram),
            delete_total: Family::default(),
            delete_failed: Family::default(),
            delete_stopped: Family::default(),
            delete_duration: Family::new_with_constructor(operation_histogram),
            claims_in_progress: Gauge::default(),
            unsaved_pvs: Gauge::default(),
            journal_entries: Family::default(),
            journal_oldest: Family::default(),
            journal_writes: Counter::default(),
            leader: Gauge::default(),
            queue_depth: Family::default(),
            queue_adds: Family::default(),
            queue_retries: Family::default(),
            queue_duration: Family::new_with_constructor(queue_histogram),
            work_duration: Family::new_with_constructor(queue_histogram),
            in_flight: Arc::default(),
            requests: Arc::default(),
        };
        metrics.register(registry);
        metrics
    }

    fn register(&self, registry: &mut Registry) {
        // Counters are registered without `_total`: the encoder appends it.
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Persistent volumes provisioned successfully, by storage class and claim data source kind",
            self.provision_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Failed persistent volume provisioning attempts, by storage class and claim data source kind",
            self.provision_failed.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_stopped",
            "Provisioning attempts stopped without failure (ignored by the driver or volume already provisioned), by storage class and claim data source kind",
            self.provision_stopped.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Seconds taken to provision a persistent volume, successful attempts only, by storage class and claim data source kind",
            self.provision_duration.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete",
            "Persistent volumes deleted successfully, by storage class",
            self.delete_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Failed persistent volume deletion attempts, by storage class",
            self.delete_failed.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_stopped",
            "Persistent volume deletions the provisioner ignored (left to another provisioner), by storage class",
            self.delete_stopped.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Seconds taken to delete a persistent volume, successful attempts only, by storage class",
            self.delete_duration.clone(),
        );
        registry.register(
            "controller_claims_in_progress",
            "Claims whose provisioning continues in the background",
            self.claims_in_progress.clone(),
        );
        registry.register(
            "controller_unsaved_persistentvolumes",
            "Provisioned persistent volumes not yet saved to the API server",
            self.unsaved_pvs.clone(),
        );
        registry.register(
            "controller_journal_entries",
            "Entries of the provisioning journal, by state (intent: an asset may exist without a PV; settled: a late-asset sweep is still due)",
            self.journal_entries.clone(),
        );
        registry.register(
            "controller_journal_oldest_entry_seconds",
            "Age in seconds of the oldest provisioning journal entry, by state",
            self.journal_oldest.clone(),
        );
        registry.register(
            "controller_journal_writes",
            "Writes of provisioning journal objects",
            self.journal_writes.clone(),
        );
        registry.register(
            "controller_leader",
            "1 while this replica holds the leader election lease, 0 otherwise",
            self.leader.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Current depth of the work queue",
            self.queue_depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Keys added to the work queue",
            self.queue_adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Rate-limited re-adds to the work queue",
            self.queue_retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "Seconds a key waits in the work queue before it is processed",
            self.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "Seconds spent processing a key taken from the work queue",
            self.work_duration.clone(),
        );
        registry.register_collector(Box::new(Arc::clone(&self.in_flight)));
        registry.register_collector(Box::new(Arc::clone(&self.requests)));
    }

    /// Counts a volume provisioned for a claim of `class` whose data source kind is
    /// `source` (empty without a data source), and records how long it took.
    pub(crate) fn provision_succeeded(&self, class: &str, source: &str, elapsed: Duration) {
        let labels = claim_labels(class, source);
        self.provision_total.get_or_create(&labels).inc();
        self.provision_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a failed provisioning attempt.
    ///
    /// `elapsed` is not recorded: as in Go, the duration histogram holds successful
    /// attempts only, so failures that return at once do not drag the latency down.
    pub(crate) fn provision_failed(&self, class: &str, source: &str, elapsed: Duration) {
        let _ = elapsed;
        self.provision_failed
            .get_or_create(&claim_labels(class, source))
            .inc();
    }

    /// Counts a provisioning attempt that stopped without failing: the driver ignored the
    /// claim, or its PV already exists.
    ///
    /// Go counts these as failures; keeping them apart keeps the failure rate honest.
    pub(crate) fn provision_stopped(&self, class: &str, source: &str) {
        self.provision_stopped
            .get_or_create(&claim_labels(class, source))
            .inc();
    }

    /// Counts a volume of `class` deleted, and records how long it took.
    pub(crate) fn delete_succeeded(&self, class: &str, elapsed: Duration) {
        let labels = ClassLabels {
            class: class.to_owned(),
        };
        self.delete_total.get_or_create(&labels).inc();
        self.delete_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a failed deletion attempt; `elapsed` is not recorded (see
    /// [`provision_failed`](Self::provision_failed)).
    pub(crate) fn delete_failed(&self, class: &str, elapsed: Duration) {
        let _ = elapsed;
        self.delete_failed
            .get_or_create(&ClassLabels {
                class: class.to_owned(),
            })
            .inc();
    }

    /// Counts a deletion the driver ignored ([`DeleteError::Ignored`](crate::DeleteError::Ignored)):
    /// neither a success nor a failure (Go counts it as a success).
    pub(crate) fn delete_stopped(&self, class: &str) {
        self.delete_stopped
            .get_or_create(&ClassLabels {
                class: class.to_owned(),
            })
            .inc();
    }

    /// Sets the number of claims whose provisioning continues in the background.
    pub(crate) fn set_claims_in_progress(&self, n: i64) {
        self.claims_in_progress.set(n);
    }

    /// Sets the number of provisioned PVs still waiting to be saved.
    pub(crate) fn set_unsaved_pvs(&self, n: i64) {
        self.unsaved_pvs.set(n);
    }

    /// Sets the provisioning journal's entries of `state` (`intent` or `settled`) and the
    /// age in seconds of the oldest of them.
    pub(crate) fn set_journal(&self, state: &'static str, entries: i64, oldest_seconds: i64) {
        let labels = StateLabels { state };
        self.journal_entries.get_or_create(&labels).set(entries);
        self.journal_oldest
            .get_or_create(&labels)
            .set(if entries == 0 { 0 } else { oldest_seconds });
    }

    /// Counts one write of a provisioning journal object.
    pub(crate) fn journal_write(&self) {
        self.journal_writes.inc();
    }

    /// Reports `limit`, the bound on the controller's API requests in flight, at every
    /// scrape: `controller_requests_in_flight_limit` (where an adaptive bound stands now)
    /// and `controller_requests_in_flight`.
    pub(crate) fn watch_requests(&self, limit: InFlightLimit) {
        *lock(&self.requests.limit) = Some(limit);
    }

    /// Sets whether this replica currently holds the leader lease.
    pub(crate) fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Handles for a work queue named `name` (`claims`, `volumes` or `unsavedpvs`).
    pub(crate) fn queue(&self, name: &'static str) -> QueueMetrics {
        let labels = QueueLabels { name };
        QueueMetrics {
            depth: self.queue_depth.get_or_create_owned(&labels),
            adds: self.queue_adds.get_or_create_owned(&labels),
            retries: self.queue_retries.get_or_create_owned(&labels),
            queue_duration: self.queue_duration.get_or_create_owned(&labels),
            work_duration: self.work_duration.get_or_create_owned(&labels),
            in_flight: self.in_flight.track(name),
        }
    }
}

fn claim_labels(class: &str, source: &str) -> ClaimLabels {
    ClaimLabels {
        class: class.to_owned(),
        source: source.to_owned(),
    }
}

/// The metrics of one work queue; the queue calls these as keys move through it.
#[derive(Clone, Debug)]
pub(crate) struct QueueMetrics {
    depth: Gauge,
    adds: Counter,
    retries: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    in_flight: Arc<InFlight>,
}

impl QueueMetrics {
    /// A key became waiting (it was not waiting before).
    pub(crate) fn added(&self) {
        self.adds.inc();
    }

    /// A key was re-added after a failure.
    pub(crate) fn retried(&self) {
        self.retries.inc();
    }

    /// The number of keys waiting to be processed.
    pub(crate) fn set_depth(&self, depth: usize) {
        self.depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// A worker took `key`, which had been waiting since `waiting_since`.
    pub(crate) fn started(&self, key: &str, waiting_since: Instant, now: Instant) {
        self.queue_duration
            .observe(now.saturating_duration_since(waiting_since).as_secs_f64());
        lock(&self.in_flight.started).insert(key.to_owned(), now);
    }

    /// A worker finished `key`.
    pub(crate) fn finished(&self, key: &str, now: Instant) {
        if let Some(start) = lock(&self.in_flight.started).remove(key) {
            self.work_duration
                .observe(now.saturating_duration_since(start).as_secs_f64());
        }
    }
}

/// Start times of the keys one queue is processing.
#[derive(Debug, Default)]
struct InFlight {
    started: Mutex<HashMap<String, Instant>>,
}

/// Seconds the keys of one queue name have been in flight.
struct InFlightAges {
    name: &'static str,
    /// Summed age of every key in flight.
    unfinished: f64,
    /// Age of the oldest key in flight.
    longest: f64,
}

/// Encodes `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds` at scrape time.
///
/// Queues are held weakly: a dropped queue disappears from the next scrape.
#[derive(Default)]
struct InFlightCollector {
    queues: Mutex<BTreeMap<&'static str, Vec<Weak<InFlight>>>>,
}

impl InFlightCollector {
    fn track(&self, name: &'static str) -> Arc<InFlight> {
        let in_flight = Arc::new(InFlight::default());
        let mut queues = lock(&self.queues);
        let entry = queues.entry(name).or_default();
        entry.retain(|queue| queue.strong_count() > 0);
        entry.push(Arc::downgrade(&in_flight));
        in_flight
    }

    /// Ages of the keys in flight, per queue name that has a live queue.
    fn snapshot(&self, now: Instant) -> Vec<InFlightAges> {
        let queues = lock(&self.queues);
        queues
            .iter()
            .filter_map(|(name, instances)| {
                let live: Vec<_> = instances.iter().filter_map(Weak::upgrade).collect();
                if live.is_empty() {
                    return None;
                }
                let mut sum = Duration::ZERO;
                let mut longest = Duration::ZERO;
                for in_flight in live {
                    for start in lock(&in_flight.started).values() {
                        let age = now.saturating_duration_since(*start);
                        sum = sum.saturating_add(age);
                        longest = longest.max(age);
                    }
                }
                Some(InFlightAges {
                    name,
                    unfinished: sum.as_secs_f64(),
                    longest: longest.as_secs_f64(),
                })
            })
            .collect()
    }
}

impl fmt::Debug for InFlightCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightCollector")
            .field("queues", &lock(&self.queues).keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Collector for InFlightCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let snapshot = self.snapshot(Instant::now());
        encode_ages(
            &mut encoder,
            "workqueue_unfinished_work_seconds",
            "Summed seconds of work in progress that has not yet finished; a large value means stuck workers",
            &snapshot,
            |ages| ages.unfinished,
        )?;
        encode_ages(
            &mut encoder,
            "workqueue_longest_running_processor_seconds",
            "Seconds the longest running worker of the queue has been processing its key",
            &snapshot,
            |ages| ages.longest,
        )
    }
}

/// Reads the bound on requests in flight at scrape time (nothing before
/// [`ControllerMetrics::watch_requests`]).
#[derive(Debug, Default)]
struct RequestsCollector {
    limit: Mutex<Option<InFlightLimit>>,
}

impl Collector for RequestsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Some(limit) = lock(&self.limit).clone() else {
            return Ok(());
        };
        let gauges = [
            (
                "controller_requests_in_flight_limit",
                "The bound on the controller's API requests in flight (watches, leases and journal writes not counted): Config::max_requests_in_flight, or where the adaptive bound stands now",
                limit.limit(),
            ),
            (
                "controller_requests_in_flight",
                "The controller's API requests in flight now (watches, leases and journal writes not counted)",
                limit.in_flight(),
            ),
        ];
        for (name, help, value) in gauges {
            let value = i64::try_from(value).unwrap_or(i64::MAX);
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            metric.encode_gauge(&value)?;
        }
        Ok(())
    }
}

/// Encodes one gauge with a sample per queue name.
fn encode_ages(
    encoder: &mut DescriptorEncoder,
    name: &'static str,
    help: &str,
    snapshot: &[InFlightAges],
    value: impl Fn(&InFlightAges) -> f64,
) -> Result<(), fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for ages in snapshot {
        let labels = QueueLabels { name: ages.name };
        metric.encode_family(&labels)?.encode_gauge(&value(ages))?;
    }
    Ok(())
}

/// The `class` label of a claim's provisioning metrics: its `spec.storageClassName`, or
/// `""` (Go's `updateProvisionStats`; the beta annotation is not read).
#[must_use]
pub(crate) fn claim_label_class(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::{prometheus_text, text};

    fn encode(registry: &Registry) -> String {
        let mut out = String::new();
        text::encode(&mut out, registry).unwrap();
        out
    }

    fn lines_starting<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    /// A minimal parser check: every sample line is `name{labels} value` with a float value
    /// and every name has a `# TYPE` line.
    fn assert_parses(text: &str) {
        let mut typed = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.push(rest.split(' ').next().unwrap().to_owned());
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value = value.replace("+Inf", "inf");
            assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
            let name = series.split('{').next().unwrap();
            assert!(
                typed.iter().any(|t| name.starts_with(t.as_str())),
                "sample {name} has no TYPE line"
            );
            if let Some(labels) = series.split_once('{').map(|(_, l)| l) {
                assert!(labels.ends_with('}'), "unterminated labels in {line:?}");
            }
        }
    }

    #[test]
    fn counters_have_go_names_and_labels() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        metrics.provision_succeeded("fast", "", Duration::from_millis(300));
        metrics.provision_succeeded("fast", "", Duration::from_secs(3));
        metrics.provision_succeeded("fast", "VolumeSnapshot", Duration::from_millis(20));
        metrics.provision_failed("slow", "", Duration::from_secs(1));
        metrics.provision_stopped("fast", "");
        metrics.delete_succeeded("fast", Duration::from_millis(70));
        metrics.delete_failed("fast", Duration::from_secs(1));
        metrics.delete_failed("fast", Duration::from_secs(1));
        let text = encode(&registry);
        for line in [
            r#"controller_persistentvolumeclaim_provision_total{class="fast",source=""} 2"#,
            r#"controller_persistentvolumeclaim_provision_total{class="fast",source="VolumeSnapshot"} 1"#,
            r#"controller_persistentvolumeclaim_provision_failed_total{class="slow",source=""} 1"#,
            r#"controller_persistentvolumeclaim_provision_stopped_total{class="fast",source=""} 1"#,
            r#"controller_persistentvolume_delete_total{class="fast"} 1"#,
            r#"controller_persistentvolume_delete_failed_total{class="fast"} 2"#,
            r#"controller_persistentvolumeclaim_provision_duration_seconds_count{class="fast",source=""} 2"#,
            r#"controller_persistentvolumeclaim_provision_duration_seconds_sum{class="fast",source=""} 3.3"#,
            r#"controller_persistentvolumeclaim_provision_duration_seconds_bucket{le="0.5",class="fast",source=""} 1"#,
            r#"controller_persistentvolumeclaim_provision_duration_seconds_bucket{le="5.0",class="fast",source=""} 2"#,
            r#"controller_persistentvolume_delete_duration_seconds_count{class="fast"} 1"#,
            "# TYPE controller_persistentvolumeclaim_provision_duration_seconds histogram",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Failures record no duration, as in Go.
        assert!(
            !text.contains(
                r#"controller_persistentvolumeclaim_provision_duration_seconds_count{class="slow""#
            ),
            "{text}"
        );
        assert_parses(&text);
    }

    #[test]
    fn operation_histograms_use_go_default_buckets() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        metrics.delete_succeeded("c", Duration::from_millis(1));
        let text = encode(&registry);
        let buckets: Vec<_> = lines_starting(
            &text,
            "controller_persistentvolume_delete_duration_seconds_bucket",
        );
        assert_eq!(buckets.len(), 12, "{buckets:?}");
        assert!(buckets[0].contains(r#"le="0.005""#));
        assert!(buckets[10].contains(r#"le="10.0""#));
        assert!(buckets[11].contains(r#"le="+Inf""#));
    }

    #[test]
    fn gauges_report_controller_state() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        metrics.set_claims_in_progress(3);
        metrics.set_unsaved_pvs(2);
        metrics.set_leader(true);
        let text = encode(&registry);
        for line in [
            "controller_claims_in_progress 3",
            "controller_unsaved_persistentvolumes 2",
            "controller_leader 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        metrics.clone().set_leader(false);
        assert!(
            encode(&registry)
                .lines()
                .any(|l| l == "controller_leader 0")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn queue_metrics_are_labelled_by_queue_name() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        let claims = metrics.queue("claims");
        let volumes = metrics.queue("volumes");
        let t0 = Instant::now();
        claims.added();
        claims.added();
        claims.retried();
        claims.set_depth(2);
        volumes.added();
        tokio::time::advance(Duration::from_secs(2)).await;
        claims.started("a", t0, Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        claims.started("b", t0, Instant::now());
        volumes.started("v", t0, Instant::now());
        volumes.finished("v", Instant::now());
        tokio::time::advance(Duration::from_secs(4)).await;

        let text = encode(&registry);
        for line in [
            r#"workqueue_adds_total{name="claims"} 2"#,
            r#"workqueue_adds_total{name="volumes"} 1"#,
            r#"workqueue_retries_total{name="claims"} 1"#,
            r#"workqueue_depth{name="claims"} 2"#,
            r#"workqueue_queue_duration_seconds_count{name="claims"} 2"#,
            r#"workqueue_queue_duration_seconds_sum{name="claims"} 5.0"#,
            r#"workqueue_work_duration_seconds_count{name="volumes"} 1"#,
            r#"workqueue_work_duration_seconds_count{name="claims"} 0"#,
            // a: 5 s, b: 4 s in flight.
            r#"workqueue_unfinished_work_seconds{name="claims"} 9.0"#,
            r#"workqueue_longest_running_processor_seconds{name="claims"} 5.0"#,
            r#"workqueue_unfinished_work_seconds{name="volumes"} 0.0"#,
            "# TYPE workqueue_longest_running_processor_seconds gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert_parses(&text);

        claims.finished("a", Instant::now());
        claims.finished("b", Instant::now());
        let text = encode(&registry);
        assert!(text.contains(r#"workqueue_unfinished_work_seconds{name="claims"} 0.0"#));
        assert!(text.contains(r#"workqueue_work_duration_seconds_count{name="claims"} 2"#));

        // A dropped queue leaves the scrape-time gauges.
        drop(claims);
        let text = encode(&registry);
        assert!(
            !text.contains(r#"workqueue_longest_running_processor_seconds{name="claims"}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"workqueue_longest_running_processor_seconds{name="volumes"} 0.0"#)
        );
    }

    #[test]
    fn queue_histograms_use_client_go_buckets() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        let _queue = metrics.queue("unsavedpvs");
        let text = encode(&registry);
        let buckets = lines_starting(&text, r"workqueue_queue_duration_seconds_bucket");
        assert_eq!(buckets.len(), 11, "{buckets:?}");
        assert!(buckets[0].contains(r#"le="1e-8""#), "{}", buckets[0]);
        assert!(buckets[9].contains(r#"le="10.0""#), "{}", buckets[9]);
    }

    /// The bound on requests in flight is read at each scrape; nothing before it is set.
    #[tokio::test]
    async fn the_bound_on_requests_in_flight_is_reported_as_it_stands() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        assert!(
            lines_starting(&encode(&registry), "controller_requests_in_flight").is_empty(),
            "no bound, no sample"
        );
        let limit = InFlightLimit::new(std::num::NonZeroUsize::new(12).unwrap());
        metrics.watch_requests(limit.clone());
        let text = encode(&registry);
        assert_eq!(
            lines_starting(&text, "controller_requests_in_flight_limit "),
            ["controller_requests_in_flight_limit 12"],
            "{text}"
        );
        assert_eq!(
            lines_starting(&text, "controller_requests_in_flight "),
            ["controller_requests_in_flight 0"],
            "{text}"
        );
        assert_parses(&text);
    }

    #[test]
    fn prometheus_text_format_is_available_too() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::new(&mut registry);
        metrics.delete_succeeded("gold", Duration::from_secs(1));
        let mut out = String::new();
        prometheus_text::encode(&mut out, &registry).unwrap();
        assert!(
            out.lines()
                .any(|l| l == r#"controller_persistentvolume_delete_total{class="gold"} 1"#),
            "{out}"
        );
        assert!(!out.contains("# EOF"));
        assert_parses(&out);
    }
}
