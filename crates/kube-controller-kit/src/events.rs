//! A cache-less writer of `events.k8s.io/v1` Events, written in the background, that
//! never stalls its publishers and folds repeats into one Event series.
//!
//! [`EventWriter::publish`] takes kube-runtime's [`Event`] and an [`ObjectReference`], as
//! kube-runtime's `Recorder::publish` does. Publishing is O(1) in the number of events
//! published before (kube-runtime's `Recorder` scans its whole cache on every publish).
//!
//! # Never stalls the caller
//! Publishing queues a write and returns: the caller (a reconcile, a worker) never waits
//! for the API server. A writer task makes the queued writes, [`CONCURRENT_WRITES`] at a
//! time by default ([`EventWriterBuilder::writers`]), each bounded by [`WRITE_TIMEOUT`]. The
//! writers bound the event rate at about `writers / write latency`: four writers at 10 ms
//! a write are 400 events/s, fewer than two events per claim at a few hundred claims/s,
//! which is why the default is 64. When the queue ([`QUEUE_CAPACITY`] writes) is full, a
//! publisher waits at most [`FULL_QUEUE_WAIT`] ([`EventWriterBuilder::full_queue_wait`])
//! and then drops the event, counting it in `events_dropped_total{reason="queue_full"}`
//! (see [`EventMetrics`]): as in Go's `EventBroadcaster`, a burst costs events, never
//! provisioning time. Failed writes are logged and counted, never returned: events are for
//! users, and a controller never changes its retry state from the event path.
//! [`EventWriter::flush`] waits for the queue to drain; call it when the controller stops.
//!
//! # Aggregation
//! As client-go's event correlator does, repeats of one event (same object, ignoring its
//! resourceVersion, same type, reason, action, note and related object) seen within
//! [`SERIES_WINDOW`] of the previous occurrence are one Event: the first occurrence creates
//! it, later ones patch its `series` (`count`, `lastObservedTime`) instead of creating new
//! objects. Occurrences that arrive while a write of their series is queued or in flight
//! take no queue slot and cost no extra write: the next write carries the latest count. The
//! series are kept in an LRU cache of [`CACHE_SIZE`] keys
//! ([`EventWriterBuilder::cache_size`]), so memory stays flat; a forgotten series starts
//! a new Event. A patch that finds its Event gone (expired by the server's TTL) creates it
//! again with the whole count.
//!
//! Optionally ([`EventWriterBuilder::spam_filter`]), client-go's spam filter: a token
//! bucket per object (client-go: a burst of 25, one more every 5 minutes) drops the
//! occurrences beyond it, counted as `reason="spam_filter"`.
//!
//! # Upstream
//! This would be better as a mode of kube-runtime's `Recorder`: a recorder with a bounded
//! series cache that writes in the background, drops when full and can be flushed. Until
//! then, this writer keeps its shape (`publish(&Event, &ObjectReference)` with
//! kube-runtime's types) so that a switch back is a rename.
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::Resource;
//! use kube_controller_kit::events::{Event, EventMetrics, EventType, EventWriter, Reporter};
//! use prometheus_client::registry::Registry;
//! # async fn doc(client: kube_client::Client, object: ConfigMap) {
//! let mut registry = Registry::default();
//! let metrics = EventMetrics::default();
//! metrics.register(&mut registry);
//! let events = EventWriter::builder(
//!     client,
//!     Reporter { controller: "example.com/my-controller".into(), instance: Some("pod-0".into()) },
//! )
//! .metrics(metrics)
//! .full_queue_wait(Duration::from_millis(5))
//! .build();
//! let event = Event {
//!     type_: EventType::Warning,
//!     reason: "SyncFailed".into(),
//!     note: Some("the backend refused the update".into()),
//!     action: "Sync".into(),
//!     secondary: None,
//! };
//! events.publish(&event, &object.object_ref(&())).await; // queued, written in the background
//! events.flush(Duration::from_secs(5)).await; // when the controller stops
//! # }
//! ```

mod metrics;
mod series;

use std::{
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event as K8sEvent, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube_client::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};

pub use kube_runtime::events::{Event, EventType, Reporter};
pub use metrics::{DropReason, EventMetrics};

use crate::error::chain;
use series::{Bucket, Lru};

/// Longest note the API server accepts: it refuses an `events.k8s.io/v1` Event whose
/// `note` is longer than 1024 bytes (its validation counts bytes, not characters). Longer
/// notes are cut, see [`EventWriter::note_limit`].
pub const NOTE_LIMIT: usize = 1024;
/// Ends a note that was cut, so a reader knows the text goes on.
pub const CUT_MARKER: &str = "...";
/// Default number of writes queued for the writer task (Go's `maxQueuedEvents`).
pub const QUEUE_CAPACITY: usize = 1000;
/// Default number of event writes in flight at once. The writers cap the event rate at
/// about this many per write latency; four (the former value) stalled a controller making
/// two events per claim at a few hundred claims/s against a real API server.
pub const CONCURRENT_WRITES: usize = 64;
/// Default longest wait of a publisher for room in a full queue before the event is
/// dropped (and counted).
pub const FULL_QUEUE_WAIT: Duration = Duration::from_millis(5);
/// Default limit of one event write, so a slow events API never holds a writer for long.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default window of a series: a repeat within this long of the previous occurrence
/// patches the existing Event (as kube-runtime's `Recorder` and client-go's events.k8s.io
/// recorder, 6 minutes); a later one creates a new Event.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Default number of series remembered (client-go's LRU size).
pub const CACHE_SIZE: usize = 4096;
/// client-go's spam filter burst: events of one object written before the bucket is empty.
pub const SPAM_BURST: u32 = 25;
/// client-go's spam filter refill: one more event of an object per this long.
pub const SPAM_REFILL: Duration = Duration::from_secs(5 * 60);
/// Longest name the API server accepts for an Event (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Locks a mutex, recovering the data if a panicking thread poisoned it (every critical
/// section here leaves the data consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Publishes Events as one reporting controller and instance; cheap to clone (clones share
/// the queue, the series cache and the writer task).
///
/// # Guarantees
/// The writer task ends once every clone is dropped and the queue is written out.
/// [`publish`](Self::publish) returns within [`EventWriterBuilder::full_queue_wait`]
/// (plus lock hold times of microseconds).
#[doc(alias = "Recorder")]
#[derive(Clone)]
pub struct EventWriter {
    /// `None` for [`EventWriter::disabled`].
    shared: Option<Arc<Shared>>,
    note_limit: usize,
    metrics: EventMetrics,
}

/// Options of an [`EventWriter`]; made by [`EventWriter::builder`].
#[must_use]
pub struct EventWriterBuilder {
    client: Client,
    reporter: Reporter,
    writers: usize,
    queue_capacity: usize,
    full_queue_wait: Duration,
    write_timeout: Duration,
    series_window: Duration,
    cache_size: usize,
    spam: Option<(u32, Duration)>,
    metrics: EventMetrics,
    note_limit: usize,
}

/// What the clones of one writer share.
struct Shared {
    controller: String,
    instance: String,
    /// Makes names unique when two events of one object share a nanosecond.
    sequence: AtomicU64,
    queue: mpsc::Sender<Arc<Series>>,
    pending: Arc<Pending>,
    full_queue_wait: Duration,
    series_window: Duration,
    spam: Option<(u32, Duration)>,
    caches: Mutex<Caches>,
    metrics: EventMetrics,
}

/// The bounded caches: series by event key, token buckets by object.
struct Caches {
    series: Lru<Arc<Series>>,
    buckets: Lru<Bucket>,
}

/// One Event object and the occurrences it stands for.
struct Series {
    state: Mutex<SeriesState>,
}

struct SeriesState {
    /// The Event as first created (no series).
    event: K8sEvent,
    /// Occurrences seen.
    count: u32,
    /// Occurrences the server holds (0: not created yet).
    written: u32,
    /// When the last occurrence was seen.
    last_observed: Timestamp,
    last_seen: Instant,
    /// A write of this series is queued or in flight; it writes the latest count.
    queued: bool,
    /// Its create failed: the next occurrence starts a new series.
    dead: bool,
}

impl SeriesState {
    /// The series part for `count` occurrences (none for one).
    fn series(&self, count: u32) -> Option<EventSeries> {
        (count > 1).then(|| EventSeries {
            count: i32::try_from(count).unwrap_or(i32::MAX),
            last_observed_time: MicroTime(self.last_observed),
        })
    }

    /// Whether an occurrence seen at `now` belongs to this series.
    fn takes(&self, now: Instant, window: Duration) -> bool {
        !self.dead && now.saturating_duration_since(self.last_seen) <= window
    }
}

/// Writes queued or in flight.
#[derive(Default)]
struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

impl Pending {
    fn done(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("EventWriter");
        if let Some(shared) = &self.shared {
            s.field("controller", &shared.controller)
                .field("instance", &shared.instance)
                .field("pending", &shared.pending.count.load(Ordering::Relaxed))
                .field("series", &lock(&shared.caches).series.len());
        }
        s.field("note_limit", &self.note_limit).finish()
    }
}

impl std::fmt::Debug for EventWriterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriterBuilder")
            .field("reporter", &self.reporter)
            .field("writers", &self.writers)
            .field("queue_capacity", &self.queue_capacity)
            .field("full_queue_wait", &self.full_queue_wait)
            .field("write_timeout", &self.write_timeout)
            .field("series_window", &self.series_window)
            .field("cache_size", &self.cache_size)
            .field("spam", &self.spam)
            .field("note_limit", &self.note_limit)
            .finish_non_exhaustive()
    }
}

impl EventWriterBuilder {
    /// Event writes in flight at once (at least 1). Default [`CONCURRENT_WRITES`]. The
    /// event rate is capped at about `n / write latency`; more writers cost only memory
    /// for the requests in flight.
    pub fn writers(mut self, n: usize) -> Self {
        self.writers = n.max(1);
        self
    }

    /// Writes queued for the writers (at least 1). Default [`QUEUE_CAPACITY`].
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n.max(1);
        self
    }

    /// How long a publisher waits for room in a full queue before it drops the event
    /// (counted as `reason="queue_full"`). Default [`FULL_QUEUE_WAIT`]; zero drops at once.
    pub fn full_queue_wait(mut self, wait: Duration) -> Self {
        self.full_queue_wait = wait;
        self
    }

    /// Limit of one write. Default [`WRITE_TIMEOUT`].
    pub fn write_timeout(mut self, limit: Duration) -> Self {
        self.write_timeout = limit;
        self
    }

    /// A repeat within `window` of the previous occurrence joins its series. Default
    /// [`SERIES_WINDOW`]; zero makes (nearly) every occurrence a new Event.
    pub fn series_window(mut self, window: Duration) -> Self {
        self.series_window = window;
        self
    }

    /// Series remembered (at least 1); the least recently seen is forgotten first. Also
    /// the number of objects the spam filter remembers. Default [`CACHE_SIZE`].
    pub fn cache_size(mut self, n: usize) -> Self {
        self.cache_size = n.max(1);
        self
    }

    /// Writes at most `burst` occurrences of events about one object, then one more per
    /// `refill` (client-go: [`SPAM_BURST`], [`SPAM_REFILL`]); the rest are dropped and
    /// counted as `reason="spam_filter"`. Checked before aggregation, as in client-go, so
    /// repeats count too. Default: off.
    pub fn spam_filter(mut self, burst: u32, refill: Duration) -> Self {
        self.spam = Some((burst, refill));
        self
    }

    /// Counts into `metrics` (register them on a registry with
    /// [`EventMetrics::register`]). Default: metrics of the writer's own, registered
    /// nowhere; [`EventWriter::metrics`] returns them.
    pub fn metrics(mut self, metrics: EventMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// See [`EventWriter::note_limit`]. Default [`NOTE_LIMIT`].
    pub fn note_limit(mut self, bytes: usize) -> Self {
        self.note_limit = bytes.min(NOTE_LIMIT);
        self
    }

    /// The writer and its writer task.
    ///
    /// # Panics
    /// Outside a Tokio runtime: the writer task is spawned here.
    #[must_use]
    pub fn build(self) -> EventWriter {
        let (queue, jobs) = mpsc::channel(self.queue_capacity);
        let pending = Arc::new(Pending::default());
        let task = Writers {
            client: self.client,
            write_timeout: self.write_timeout,
            metrics: self.metrics.clone(),
            pending: Arc::clone(&pending),
        };
        tokio::spawn(task.run(jobs, self.writers));
        let Reporter {
            controller,
            instance,
        } = self.reporter;
        let instance = instance.unwrap_or_else(|| controller.clone());
        EventWriter {
            shared: Some(Arc::new(Shared {
                controller,
                instance,
                sequence: AtomicU64::new(0),
                queue,
                pending,
                full_queue_wait: self.full_queue_wait,
                series_window: self.series_window,
                spam: self.spam,
                caches: Mutex::new(Caches {
                    series: Lru::new(self.cache_size),
                    buckets: Lru::new(self.cache_size),
                }),
                metrics: self.metrics.clone(),
            })),
            note_limit: self.note_limit,
            metrics: self.metrics,
        }
    }
}

impl EventWriter {
    /// A writer reporting as `reporter` with the default options, and its writer task.
    /// An instance of `None` reports the controller name as the instance, as
    /// kube-runtime's `Recorder` does.
    ///
    /// # Panics
    /// Outside a Tokio runtime: the writer task is spawned here.
    #[must_use]
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self::builder(client, reporter).build()
    }

    /// Options for a writer reporting as `reporter`; [`EventWriterBuilder::build`] makes it.
    pub fn builder(client: Client, reporter: Reporter) -> EventWriterBuilder {
        EventWriterBuilder {
            client,
            reporter,
            writers: CONCURRENT_WRITES,
            queue_capacity: QUEUE_CAPACITY,
            full_queue_wait: FULL_QUEUE_WAIT,
            write_timeout: WRITE_TIMEOUT,
            series_window: SERIES_WINDOW,
            cache_size: CACHE_SIZE,
            spam: None,
            metrics: EventMetrics::default(),
            note_limit: NOTE_LIMIT,
        }
    }

    /// A writer that drops every event (without counting it): for tests of code that
    /// publishes, or a controller run with events off.
    #[must_use]
    pub fn disabled() -> Self {
        Self {
            shared: None,
            note_limit: NOTE_LIMIT,
            metrics: EventMetrics::default(),
        }
    }

    /// The metrics this writer counts into (register them with
    /// [`EventMetrics::register`]; clones count into the same metrics).
    #[must_use]
    pub fn metrics(&self) -> EventMetrics {
        self.metrics.clone()
    }

    /// Notes longer than `bytes` (at most [`NOTE_LIMIT`]) are cut on a character boundary
    /// and end in [`CUT_MARKER`], `bytes` long at most with the marker. Default
    /// [`NOTE_LIMIT`]. Applies to this handle and the clones made from it afterwards.
    #[must_use]
    pub fn note_limit(mut self, bytes: usize) -> Self {
        self.note_limit = bytes.min(NOTE_LIMIT);
        self
    }

    /// Records `event` about `regarding` (its namespace is the event's; a cluster-scoped
    /// object's events go to `default`). Returns at once, or after at most the full-queue
    /// wait, when the event is dropped.
    ///
    /// A new Event is named `<object name>.<nanoseconds><sequence>` in hex (the object part
    /// cut so that the name stays a valid DNS subdomain), and carries `regarding`,
    /// `secondary` as `related`, the reporter and `eventTime` now; a repeat within the
    /// series window patches its `series` instead (see the [module docs](self)).
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) {
        let Some(shared) = &self.shared else {
            return;
        };
        let note = event
            .note
            .clone()
            .map(|note| truncate(note, self.note_limit));
        let now = Instant::now();
        if !shared.admit(regarding, now) {
            shared.dropped(DropReason::SpamFilter, event, regarding);
            return;
        }
        let key = series::event_key(event, note.as_deref(), regarding);
        if shared.fold(&key, now, false).is_none() {
            return;
        }
        // A write is needed: wait, briefly, for room in the queue.
        let permit =
            match tokio::time::timeout(shared.full_queue_wait, shared.queue.reserve()).await {
                Ok(Ok(permit)) => permit,
                Ok(Err(_)) => {
                    shared.dropped(DropReason::WriterStopped, event, regarding);
                    return;
                }
                Err(_) => {
                    shared.dropped(DropReason::QueueFull, event, regarding);
                    return;
                }
            };
        // Another publisher may have queued a write of this series meanwhile.
        let job = match shared.fold(&key, now, true) {
            Some(Some(series)) => series,
            Some(None) => {
                let series = Arc::new(Series {
                    state: Mutex::new(SeriesState {
                        event: shared.event(event, regarding.clone(), note),
                        count: 1,
                        written: 0,
                        last_observed: Timestamp::now(),
                        last_seen: now,
                        queued: true,
                        dead: false,
                    }),
                });
                lock(&shared.caches)
                    .series
                    .insert(&key, Arc::clone(&series));
                series
            }
            None => return,
        };
        shared.pending.count.fetch_add(1, Ordering::AcqRel);
        permit.send(job);
    }

    /// Waits until every write queued so far is made (or has failed), at most `limit`;
    /// logs how many are left when the limit is reached.
    pub async fn flush(&self, limit: Duration) {
        let Some(shared) = &self.shared else {
            return;
        };
        let pending = &shared.pending;
        let drained = async {
            loop {
                let idle = pending.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if pending.count.load(Ordering::Acquire) == 0 {
                    return;
                }
                idle.await;
            }
        };
        if tokio::time::timeout(limit, drained).await.is_err() {
            tracing::warn!(
                unwritten = pending.count.load(Ordering::Acquire),
                "events still unwritten when the controller stopped"
            );
        }
    }
}

impl Shared {
    /// Counts `event` about `regarding` as dropped for `why`, and logs it (a stopped
    /// writer as a warning: it drops every event from then on).
    fn dropped(&self, why: DropReason, event: &Event, regarding: &ObjectReference) {
        self.metrics.drop_events(why, 1);
        let (reason, object) = (&event.reason, &regarding.name);
        match why {
            DropReason::WriterStopped => {
                tracing::warn!(reason, object, "event writer stopped; event not written");
            }
            DropReason::SpamFilter => {
                tracing::debug!(reason, object, "event dropped by the spam filter");
            }
            DropReason::QueueFull => {
                tracing::debug!(reason, object, "events queue full; event dropped");
            }
            DropReason::WriteFailed => {
                tracing::debug!(reason, object, "event write failed; event dropped");
            }
        }
    }

    /// Whether the spam filter lets an event about `regarding` through.
    fn admit(&self, regarding: &ObjectReference, now: Instant) -> bool {
        let Some((burst, refill)) = self.spam else {
            return true;
        };
        let key = series::object_key(regarding);
        let mut caches = lock(&self.caches);
        if let Some(bucket) = caches.buckets.get_mut(&key) {
            return bucket.take(burst, refill, now);
        }
        let mut bucket = Bucket::full(burst, now);
        let admitted = bucket.take(burst, refill, now);
        caches.buckets.insert(&key, bucket);
        admitted
    }

    /// Adds an occurrence at `now` to the live series of `key`, if there is one and a
    /// write of it is queued: `None` (nothing more to do). Otherwise a write is needed:
    /// without `queue_it`, `Some(None)` and nothing changes; with `queue_it` (the caller
    /// holds a queue slot) the occurrence is added and marks the series queued,
    /// `Some(Some(series))`, or, without a live series, `Some(None)`: create one.
    fn fold(&self, key: &str, now: Instant, queue_it: bool) -> Option<Option<Arc<Series>>> {
        let mut caches = lock(&self.caches);
        let Some(series) = caches.series.get_mut(key) else {
            return Some(None);
        };
        let mut state = lock(&series.state);
        if !state.takes(now, self.series_window) {
            return Some(None);
        }
        if !state.queued && !queue_it {
            return Some(None);
        }
        state.count = state.count.saturating_add(1);
        state.last_observed = Timestamp::now();
        state.last_seen = now;
        self.metrics.folded();
        if state.queued {
            return None;
        }
        state.queued = true;
        drop(state);
        Some(Some(Arc::clone(series)))
    }

    /// The Event as kube-runtime's `Recorder` fills a new one (no series).
    fn event(&self, event: &Event, regarding: ObjectReference, note: Option<String>) -> K8sEvent {
        let now = Timestamp::now();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let object = regarding.name.as_deref().unwrap_or(&self.controller);
        let name = event_name(object, now.as_nanosecond(), sequence);
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            note,
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(name),
                ..ObjectMeta::default()
            },
            regarding: Some(regarding),
            related: event.secondary.clone(),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            series: None,
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..K8sEvent::default()
        }
    }
}

/// The writer task: makes the queued writes, some at a time.
struct Writers {
    client: Client,
    write_timeout: Duration,
    metrics: EventMetrics,
    pending: Arc<Pending>,
}

/// One write of a series.
enum Write {
    Create(Box<K8sEvent>),
    Patch {
        name: String,
        namespace: String,
        series: EventSeries,
    },
}

/// The body of a series patch (a JSON merge patch).
#[derive(Debug, serde::Serialize)]
struct SeriesPatch<'a> {
    series: &'a EventSeries,
}

/// Why a write failed.
enum Failed {
    /// The Event to patch is gone.
    Gone,
    Other(String),
}

impl Writers {
    /// Writes the queued series, `writers` at a time, until the queue closes.
    async fn run(self, jobs: mpsc::Receiver<Arc<Series>>, writers: usize) {
        let queued = futures::stream::unfold(jobs, |mut jobs| async move {
            jobs.recv().await.map(|job| (job, jobs))
        });
        let this = &self;
        queued
            .for_each_concurrent(writers, |series| async move {
                this.write_series(&series).await;
                this.pending.done();
            })
            .await;
    }

    /// Writes `series` until the server holds its latest count (or a write failed).
    async fn write_series(&self, series: &Series) {
        // A patch of a vanished Event becomes one create, once per job.
        let mut recreated = false;
        loop {
            let (write, count) = {
                let mut state = lock(&series.state);
                if state.count <= state.written {
                    state.queued = false;
                    return;
                }
                let count = state.count;
                let write = if state.written == 0 {
                    let mut event = state.event.clone();
                    event.series = state.series(count);
                    Write::Create(Box::new(event))
                } else {
                    let Some(series) = state.series(count) else {
                        state.queued = false;
                        return;
                    };
                    Write::Patch {
                        name: state.event.metadata.name.clone().unwrap_or_default(),
                        namespace: state
                            .event
                            .metadata
                            .namespace
                            .clone()
                            .unwrap_or_else(|| "default".to_owned()),
                        series,
                    }
                };
                (write, count)
            };
            let creating = matches!(write, Write::Create(_));
            let result = self.write(write).await;
            let mut state = lock(&series.state);
            match result {
                Ok(()) => state.written = count,
                Err(Failed::Gone) if !recreated => {
                    recreated = true;
                    state.written = 0;
                }
                Err(failed) => {
                    let object = state.event.regarding.as_ref().and_then(|r| r.name.clone());
                    let reason = state.event.reason.clone().unwrap_or_default();
                    let error = match failed {
                        Failed::Gone => "the Event is gone".to_owned(),
                        Failed::Other(error) => error,
                    };
                    tracing::warn!(reason, object, error, "failed to publish event");
                    if creating {
                        // Nothing on the server: the occurrences so far are lost, and the
                        // next one starts a new Event.
                        self.metrics.drop_events(
                            DropReason::WriteFailed,
                            u64::from(state.count - state.written),
                        );
                        state.dead = true;
                        state.queued = false;
                        return;
                    }
                    // The Event keeps its older count; later occurrences patch it again.
                    self.metrics
                        .drop_events(DropReason::WriteFailed, u64::from(count - state.written));
                    state.written = count;
                }
            }
        }
    }

    /// Makes one write, bounded by the write timeout.
    async fn write(&self, write: Write) -> Result<(), Failed> {
        let result = match write {
            Write::Create(event) => {
                self.metrics.created();
                let namespace = event.metadata.namespace.as_deref().unwrap_or("default");
                let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
                let params = PostParams::default();
                tokio::time::timeout(self.write_timeout, api.create(&params, &event))
                    .await
                    .map(|result| result.map(drop))
            }
            Write::Patch {
                name,
                namespace,
                series,
            } => {
                self.metrics.patched();
                let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
                let patch = SeriesPatch { series: &series };
                let params = PatchParams::default();
                tokio::time::timeout(
                    self.write_timeout,
                    api.patch(&name, &params, &Patch::Merge(&patch)),
                )
                .await
                .map(|result| result.map(drop))
            }
        };
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(kube_client::Error::Api(status))) if status.code == 404 => Err(Failed::Gone),
            Ok(Err(error)) => Err(Failed::Other(chain(&error))),
            Err(_) => Err(Failed::Other("timed out".to_owned())),
        }
    }
}

/// `<object>.<nanoseconds><sequence>` in hex, the object part cut so that the name stays
/// a valid DNS subdomain however long the object's name is.
fn event_name(object: &str, nanos: i128, sequence: u64) -> String {
    let suffix = format!(".{nanos:x}{:04x}", sequence & 0xffff);
    let mut end = object.len().min(MAX_NAME.saturating_sub(suffix.len()));
    while !object.is_char_boundary(end) {
        end -= 1;
    }
    let prefix = object[..end].trim_end_matches(['-', '.']);
    format!("{prefix}{suffix}")
}

/// `note` cut to at most `max` bytes with [`CUT_MARKER`] at its end, on a character
/// boundary; a note that fits is kept whole.
fn truncate(mut note: String, max: usize) -> String {
    if note.len() > max {
        let mut cut = max.saturating_sub(CUT_MARKER.len());
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        if CUT_MARKER.len() <= max {
            note.push_str(CUT_MARKER);
        }
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::{Resource, api::DeleteParams};

    #[test]
    fn notes_are_cut_on_a_character_boundary_and_marked() {
        assert_eq!(truncate("abc".to_owned(), 1000), "abc");
        let fits = "x".repeat(NOTE_LIMIT);
        assert_eq!(
            truncate(fits.clone(), NOTE_LIMIT),
            fits,
            "a note that fits is whole"
        );
        let long = "é".repeat(600);
        let cut = truncate(long, NOTE_LIMIT);
        // 1021 bytes of text end inside an "é": 1020 bytes, then the marker.
        assert_eq!(cut.len(), 1023);
        assert!(cut.ends_with(CUT_MARKER));
        assert!(cut.starts_with(&"é".repeat(510)));
        let odd = format!("a{}", "é".repeat(600));
        assert_eq!(truncate(odd, NOTE_LIMIT).len(), NOTE_LIMIT);
        assert_eq!(
            truncate("abcdef".to_owned(), 2),
            "",
            "no room for the marker"
        );
    }

    #[test]
    fn event_names_stay_valid_for_the_longest_object_names() {
        let nanos = 1_767_000_000_000_000_000_i128;
        assert_eq!(event_name("m", nanos, 1), format!("m.{nanos:x}0001"));
        // Cut right after the dash, which must not end up before the dot.
        let long = format!("{}-{}", "a".repeat(231), "b".repeat(21));
        let name = event_name(&long, nanos, 0x1_0002);
        assert!(name.len() <= MAX_NAME, "{} bytes", name.len());
        assert!(name.starts_with(&"a".repeat(231)));
        assert!(!name.contains("-."), "{name}");
        assert!(name.ends_with(&format!(".{nanos:x}0002")));
    }

    fn object(name: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(name.into());
        object.metadata.namespace = Some("default".into());
        object.metadata.uid = Some("u1".into());
        object
    }

    fn event(type_: EventType, note: String) -> Event {
        Event {
            type_,
            reason: "SyncFailed".into(),
            note: Some(note),
            action: "Sync".into(),
            secondary: None,
        }
    }

    fn reporter(instance: Option<&str>) -> Reporter {
        Reporter {
            controller: "example.com/ctl".into(),
            instance: instance.map(Into::into),
        }
    }

    async fn listed(sim: &kube_sim::KubeSim) -> Vec<K8sEvent> {
        let api: Api<K8sEvent> = Api::namespaced(sim.client(), "default");
        api.list(&Default::default()).await.unwrap().items
    }

    /// The occurrences an Event stands for.
    fn count(event: &K8sEvent) -> i32 {
        event.series.as_ref().map_or(1, |series| series.count)
    }

    fn shared(events: &EventWriter) -> &Shared {
        events.shared.as_deref().unwrap()
    }

    #[tokio::test]
    async fn repeats_of_one_event_are_one_event_series_and_another_note_is_a_new_event() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::new(sim.client(), reporter(Some("host-1")));
        let regarding = object("c").object_ref(&());
        let warning = event(EventType::Warning, "x".repeat(1500));
        for _ in 0..10 {
            events.publish(&warning, &regarding).await;
        }
        // A newer resourceVersion of the object is the same object.
        let mut newer = regarding.clone();
        newer.resource_version = Some("999".into());
        events.flush(Duration::from_secs(10)).await;
        let listed_once = listed(&sim).await;
        assert_eq!(listed_once.len(), 1, "ten repeats are one Event");
        let written = &listed_once[0];
        assert_eq!(count(written), 10);
        let series = written.series.as_ref().unwrap();
        assert!(series.last_observed_time.0 >= written.event_time.as_ref().unwrap().0);
        assert!(written.metadata.name.as_deref().unwrap().starts_with("c."));
        assert_eq!(written.reason.as_deref(), Some("SyncFailed"));
        assert_eq!(written.type_.as_deref(), Some("Warning"));
        assert_eq!(written.action.as_deref(), Some("Sync"));
        let note = written.note.as_deref().unwrap();
        assert_eq!(note.len(), NOTE_LIMIT);
        assert!(note.ends_with(CUT_MARKER), "a cut note says so");
        assert_eq!(
            written.reporting_controller.as_deref(),
            Some("example.com/ctl")
        );
        assert_eq!(written.reporting_instance.as_deref(), Some("host-1"));
        assert_eq!(written.regarding.as_ref(), Some(&regarding));
        assert_eq!(written.related, None);

        events.publish(&warning, &newer).await;
        let other = event(EventType::Warning, "y".into());
        events.publish(&other, &regarding).await;
        events.flush(Duration::from_secs(10)).await;
        let mut listed = listed(&sim).await;
        listed.sort_by_key(count);
        assert_eq!(listed.len(), 2, "another note is a new Event");
        assert_eq!(listed[0].note.as_deref(), Some("y"));
        assert_eq!(count(&listed[0]), 1);
        assert!(
            listed[0].series.is_none(),
            "a single occurrence has no series"
        );
        assert_eq!(listed[1].metadata.name, written.metadata.name);
        assert_eq!(count(&listed[1]), 11);
        let metrics = events.metrics();
        assert_eq!(metrics.aggregated(), 10);
        assert_eq!(metrics.creates(), 2);
        assert!(
            metrics.patches() >= 1 && metrics.patches() <= 10,
            "repeats queued behind a write share it: {} patches",
            metrics.patches()
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_after_the_bounded_wait_and_counts_it() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        // Event creates hang for an hour: the one writer stays busy with the first event.
        sim.add_fault(
            kube_sim::FaultRule::new(kube_sim::Verb::Create, "events")
                .always()
                .no_status()
                .latency(Duration::from_secs(3600)),
        );
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = EventMetrics::default();
        metrics.register(&mut registry);
        let events = EventWriter::builder(sim.client(), reporter(Some("host-1")))
            .writers(1)
            .queue_capacity(1)
            .full_queue_wait(Duration::from_millis(20))
            .metrics(metrics.clone())
            .build();
        let regarding = object("c").object_ref(&());
        events
            .publish(&event(EventType::Normal, "1".into()), &regarding)
            .await;
        // Wait (generously) until the writer has taken it from the queue.
        let taken = async {
            while shared(&events).queue.capacity() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), taken)
            .await
            .expect("the writer takes the first event");
        let second = event(EventType::Normal, "2".into());
        events.publish(&second, &regarding).await; // fills the queue
        assert_eq!(metrics.dropped(DropReason::QueueFull), 0);

        let started = Instant::now();
        let third = event(EventType::Normal, "3".into());
        let publish = events.publish(&third, &regarding);
        tokio::time::timeout(Duration::from_secs(5), publish)
            .await
            .expect("a full queue never stalls the publisher");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(20), "it waited {waited:?}");
        assert!(waited < Duration::from_secs(5), "it waited {waited:?}");
        assert_eq!(metrics.dropped(DropReason::QueueFull), 1);

        // A repeat of the queued event needs no room in the queue: it joins the series.
        let started = Instant::now();
        events.publish(&second, &regarding).await;
        assert!(started.elapsed() < Duration::from_millis(20));
        assert_eq!(metrics.dropped(DropReason::QueueFull), 1);
        assert_eq!(metrics.aggregated(), 1);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"events_dropped_total{reason="queue_full"} 1"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_burst_larger_than_the_queue_is_written_whole_with_a_long_enough_wait() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::builder(sim.client(), reporter(Some("host-1")))
            .queue_capacity(10)
            .full_queue_wait(Duration::from_secs(60))
            .build();
        let regarding = object("c").object_ref(&());
        let n = 200;
        for i in 0..n {
            let normal = event(EventType::Normal, format!("n{i}"));
            events.publish(&normal, &regarding).await;
        }
        events.flush(Duration::from_secs(60)).await;
        assert_eq!(listed(&sim).await.len(), n);
        assert_eq!(events.metrics().dropped(DropReason::QueueFull), 0);
    }

    #[tokio::test]
    async fn the_series_cache_stays_bounded_and_a_forgotten_series_is_a_new_event() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::builder(sim.client(), reporter(None))
            .cache_size(2)
            .build();
        let regarding = object("c").object_ref(&());
        for note in ["a", "b", "c", "a"] {
            events
                .publish(&event(EventType::Normal, note.into()), &regarding)
                .await;
            events.flush(Duration::from_secs(10)).await;
        }
        for i in 0..100 {
            events
                .publish(&event(EventType::Normal, format!("m{i}")), &regarding)
                .await;
        }
        assert!(lock(&shared(&events).caches).series.len() <= 2);
        events.flush(Duration::from_secs(10)).await;
        let listed = listed(&sim).await;
        let a: Vec<_> = listed
            .iter()
            .filter(|e| e.note.as_deref() == Some("a"))
            .collect();
        assert_eq!(a.len(), 2, "\"a\" was forgotten before it came again");
        assert_eq!(listed.len(), 104);
    }

    #[tokio::test]
    async fn a_repeat_after_the_window_is_a_new_event() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::builder(sim.client(), reporter(None))
            .series_window(Duration::from_millis(1))
            .build();
        let regarding = object("c").object_ref(&());
        let normal = event(EventType::Normal, "n".into());
        events.publish(&normal, &regarding).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        events.publish(&normal, &regarding).await;
        events.flush(Duration::from_secs(10)).await;
        let listed = listed(&sim).await;
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|e| e.series.is_none()));
    }

    #[tokio::test]
    async fn a_series_whose_event_is_gone_is_created_again_with_its_whole_count() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::new(sim.client(), reporter(None));
        let regarding = object("c").object_ref(&());
        let normal = event(EventType::Normal, "n".into());
        events.publish(&normal, &regarding).await;
        events.flush(Duration::from_secs(10)).await;
        let first = listed(&sim).await.remove(0);
        let name = first.metadata.name.clone().unwrap();
        let api: Api<K8sEvent> = Api::namespaced(sim.client(), "default");
        api.delete(&name, &DeleteParams::default()).await.unwrap();
        events.publish(&normal, &regarding).await;
        events.flush(Duration::from_secs(10)).await;
        let listed = listed(&sim).await;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(count(&listed[0]), 2);
        assert_eq!(events.metrics().dropped(DropReason::WriteFailed), 0);
    }

    #[tokio::test]
    async fn the_spam_filter_drops_an_objects_events_beyond_its_burst() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::builder(sim.client(), reporter(None))
            .spam_filter(3, SPAM_REFILL)
            .build();
        let c = object("c").object_ref(&());
        for i in 0..5 {
            events
                .publish(&event(EventType::Normal, format!("n{i}")), &c)
                .await;
        }
        events
            .publish(
                &event(EventType::Normal, "n".into()),
                &object("d").object_ref(&()),
            )
            .await;
        events.flush(Duration::from_secs(10)).await;
        assert_eq!(listed(&sim).await.len(), 4, "three of c, one of d");
        assert_eq!(events.metrics().dropped(DropReason::SpamFilter), 2);
    }

    #[tokio::test]
    async fn the_note_limit_and_a_missing_instance_are_applied() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::new(sim.client(), reporter(None)).note_limit(1000);
        let secondary = object("other").object_ref(&());
        let mut normal = event(EventType::Normal, "é".repeat(600));
        normal.secondary = Some(secondary.clone());
        events.publish(&normal, &object("c").object_ref(&())).await;
        events.flush(Duration::from_secs(10)).await;
        let listed = listed(&sim).await;
        assert_eq!(listed.len(), 1);
        let written = &listed[0];
        assert_eq!(written.type_.as_deref(), Some("Normal"));
        // 997 bytes of text end inside an "é": 996 bytes, then the marker.
        assert_eq!(written.note.as_deref().map(str::len), Some(999));
        assert_eq!(
            written.reporting_instance.as_deref(),
            Some("example.com/ctl"),
            "no instance: the controller reports as its own instance"
        );
        assert_eq!(written.related.as_ref(), Some(&secondary));
        assert_eq!(
            EventWriter::disabled().note_limit(5000).note_limit,
            NOTE_LIMIT,
            "never above what the API server accepts"
        );
    }

    #[tokio::test]
    async fn a_failed_write_is_logged_counted_and_does_not_block_the_flush() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        sim.add_fault(kube_sim::FaultRule::new(kube_sim::Verb::Create, "events").times(1));
        let events = EventWriter::new(sim.client(), reporter(Some("host-1")));
        let warning = event(EventType::Warning, "x".into());
        events.publish(&warning, &object("c").object_ref(&())).await;
        let flushed = tokio::time::timeout(
            Duration::from_secs(10),
            events.flush(Duration::from_secs(60)),
        );
        assert!(flushed.await.is_ok(), "a failed write counts as done");
        assert_eq!(shared(&events).pending.count.load(Ordering::Acquire), 0);
        assert_eq!(events.metrics().dropped(DropReason::WriteFailed), 1);
        // The failed series is not patched: the next occurrence creates an Event.
        events.publish(&warning, &object("c").object_ref(&())).await;
        events.flush(Duration::from_secs(10)).await;
        let listed = listed(&sim).await;
        assert_eq!(listed.len(), 1);
        assert_eq!(count(&listed[0]), 1);
    }

    #[tokio::test]
    async fn a_disabled_writer_writes_nothing_and_flushes_at_once() {
        let events = EventWriter::disabled();
        let warning = event(EventType::Warning, "x".into());
        events.publish(&warning, &object("c").object_ref(&())).await;
        assert!(events.shared.is_none());
        let flushed = tokio::time::timeout(
            Duration::from_secs(10),
            events.flush(Duration::from_secs(60)),
        );
        assert!(flushed.await.is_ok());
    }
}
