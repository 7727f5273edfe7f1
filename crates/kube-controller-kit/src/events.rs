//! A cache-less writer of `events.k8s.io/v1` Events, written in the background.
//!
//! [`EventWriter::publish`] takes kube-runtime's [`Event`] and an [`ObjectReference`], as
//! kube-runtime's `Recorder::publish` does, but keeps no cache of past events: each event
//! is one `create` and is never turned into a series. kube-runtime's `Recorder` scans its
//! whole cache on every publish and keeps each event for 6 minutes, so a burst of events
//! about N objects costs O(N²); here publishing is O(1) in the number of events. A repeat
//! is a new Event object; `kubectl describe` lists each.
//!
//! Publishing queues the event and returns: the caller (a reconcile, a worker) never waits
//! for the API server. A writer task creates the queued events,
//! [`CONCURRENT_WRITES`] at a time, each bounded by [`WRITE_TIMEOUT`]. A full queue
//! ([`QUEUE_CAPACITY`] events) makes the publisher wait rather than drop the event (the
//! Go `EventBroadcaster` drops events beyond its queue), so a burst loses nothing. Failed
//! writes are logged, never returned: events are for users, and a controller never changes
//! its retry state from the event path. [`EventWriter::flush`] waits for the queue to
//! drain; call it when the controller stops.
//!
//! # Upstream
//! This would be better as a mode of kube-runtime's `Recorder`: a recorder without the
//! series cache (or with a bounded one), that writes in the background and can be
//! flushed. Until then, this writer keeps its shape (`publish(&Event, &ObjectReference)`
//! with kube-runtime's types) so that a switch back is a rename.
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::Resource;
//! use kube_controller_kit::events::{Event, EventType, EventWriter, Reporter};
//! # async fn doc(client: kube_client::Client, object: ConfigMap) {
//! let events = EventWriter::new(
//!     client,
//!     Reporter { controller: "example.com/my-controller".into(), instance: Some("pod-0".into()) },
//! );
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

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube_client::{Api, Client, api::PostParams};
use tokio::sync::{Notify, mpsc};

pub use kube_runtime::events::{Event, EventType, Reporter};

use crate::error::chain;

/// Longest note the API server accepts: it refuses an `events.k8s.io/v1` Event whose
/// `note` is longer than 1024 bytes (its validation counts bytes, not characters). Longer
/// notes are cut, see [`EventWriter::note_limit`].
pub const NOTE_LIMIT: usize = 1024;
/// Ends a note that was cut, so a reader knows the text goes on.
pub const CUT_MARKER: &str = "...";
/// Events queued for the writer task before a publisher waits (Go's `maxQueuedEvents`).
pub const QUEUE_CAPACITY: usize = 1000;
/// Event creates in flight at once.
pub const CONCURRENT_WRITES: usize = 4;
/// Limit of one event write, so a slow events API never holds the queue for long.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest name the API server accepts for an Event (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Publishes Events as one reporting controller and instance; cheap to clone (clones share
/// the queue and the writer task).
///
/// # Guarantees
/// The writer task ends once every clone is dropped and the queue is written out.
#[doc(alias = "Recorder")]
#[derive(Clone)]
pub struct EventWriter {
    /// `None` for [`EventWriter::disabled`].
    shared: Option<Arc<Shared>>,
    note_limit: usize,
}

/// What the clones of one writer share.
struct Shared {
    controller: String,
    instance: String,
    /// Makes names unique when two events of one object share a nanosecond.
    sequence: AtomicU64,
    queue: mpsc::Sender<K8sEvent>,
    pending: Arc<Pending>,
}

/// Events queued or being written.
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
                .field("pending", &shared.pending.count.load(Ordering::Relaxed));
        }
        s.field("note_limit", &self.note_limit).finish()
    }
}

impl EventWriter {
    /// A writer reporting as `reporter` (an instance of `None` reports the controller
    /// name as the instance, as kube-runtime's `Recorder` does), and its writer task.
    ///
    /// # Panics
    /// Outside a Tokio runtime: the writer task is spawned here.
    #[must_use]
    pub fn new(client: Client, reporter: Reporter) -> Self {
        let (queue, events) = mpsc::channel(QUEUE_CAPACITY);
        let pending = Arc::new(Pending::default());
        tokio::spawn(write_all(client, events, Arc::clone(&pending)));
        let Reporter {
            controller,
            instance,
        } = reporter;
        let instance = instance.unwrap_or_else(|| controller.clone());
        Self {
            shared: Some(Arc::new(Shared {
                controller,
                instance,
                sequence: AtomicU64::new(0),
                queue,
                pending,
            })),
            note_limit: NOTE_LIMIT,
        }
    }

    /// A writer that drops every event: for tests of code that publishes, or a controller
    /// run with events off.
    #[must_use]
    pub fn disabled() -> Self {
        Self {
            shared: None,
            note_limit: NOTE_LIMIT,
        }
    }

    /// Notes longer than `bytes` (at most [`NOTE_LIMIT`]) are cut on a character boundary
    /// and end in [`CUT_MARKER`], `bytes` long at most with the marker. Default
    /// [`NOTE_LIMIT`]. Applies to this handle and the clones made from it afterwards.
    #[must_use]
    pub fn note_limit(mut self, bytes: usize) -> Self {
        self.note_limit = bytes.min(NOTE_LIMIT);
        self
    }

    /// Queues `event` about `regarding` (its namespace is the event's; a cluster-scoped
    /// object's events go to `default`). Waits only while the queue is full.
    ///
    /// The Event is named `<object name>.<nanoseconds><sequence>` in hex (the object part
    /// cut so that the name stays a valid DNS subdomain), and carries `regarding`,
    /// `secondary` as `related`, the reporter, `eventTime` now and no series.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) {
        let Some(shared) = &self.shared else {
            return;
        };
        let event = shared.event(event, regarding.clone(), self.note_limit);
        shared.pending.count.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(event)) = shared.queue.send(event).await {
            shared.pending.done();
            tracing::warn!(
                reason = event.reason,
                object = ?event.regarding.and_then(|r| r.name),
                "event writer stopped; event not written"
            );
        }
    }

    /// Waits until every event queued so far is written (or has failed), at most `limit`;
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
    /// The Event as kube-runtime's `Recorder` fills a new one (no series).
    fn event(&self, event: &Event, regarding: ObjectReference, note_limit: usize) -> K8sEvent {
        let now = Timestamp::now();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let object = regarding.name.as_deref().unwrap_or(&self.controller);
        let name = event_name(object, now.as_nanosecond(), sequence);
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            note: event.note.clone().map(|note| truncate(note, note_limit)),
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

/// Creates the queued events, [`CONCURRENT_WRITES`] at a time, until the queue closes.
async fn write_all(client: Client, events: mpsc::Receiver<K8sEvent>, pending: Arc<Pending>) {
    let queued = futures::stream::unfold(events, |mut events| async move {
        events.recv().await.map(|event| (event, events))
    });
    queued
        .for_each_concurrent(CONCURRENT_WRITES, |event| {
            let client = client.clone();
            let pending = Arc::clone(&pending);
            async move {
                write(client, event).await;
                pending.done();
            }
        })
        .await;
}

/// Creates one event; a failure is logged.
async fn write(client: Client, event: K8sEvent) {
    let namespace = event.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<K8sEvent> = Api::namespaced(client, namespace);
    let params = PostParams::default();
    let create = api.create(&params, &event);
    let reason = event.reason.as_deref().unwrap_or_default();
    let object = event.regarding.as_ref().and_then(|r| r.name.as_deref());
    match tokio::time::timeout(WRITE_TIMEOUT, create).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::warn!(reason, object, error = %chain(&error), "failed to publish event");
        }
        Err(_) => {
            tracing::warn!(reason, object, "publishing event timed out");
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
    use kube_client::Resource;

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

    #[tokio::test]
    async fn each_publish_creates_one_event_without_a_shared_series() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::new(sim.client(), reporter(Some("host-1")));
        let regarding = object("c").object_ref(&());
        let note = "x".repeat(1500);
        let warning = event(EventType::Warning, note);
        events.publish(&warning, &regarding).await;
        events.publish(&warning, &regarding).await;
        events.flush(Duration::from_secs(10)).await;
        let listed = listed(&sim).await;
        assert_eq!(
            listed.len(),
            2,
            "a repeat is a new event, not a series of the first"
        );
        for event in &listed {
            assert!(event.metadata.name.as_deref().unwrap().starts_with("c."));
            assert!(event.series.is_none());
            assert_eq!(event.reason.as_deref(), Some("SyncFailed"));
            assert_eq!(event.type_.as_deref(), Some("Warning"));
            assert_eq!(event.action.as_deref(), Some("Sync"));
            let note = event.note.as_deref().unwrap();
            assert_eq!(note.len(), NOTE_LIMIT);
            assert!(note.ends_with(CUT_MARKER), "a cut note says so");
            assert_eq!(
                event.reporting_controller.as_deref(),
                Some("example.com/ctl")
            );
            assert_eq!(event.reporting_instance.as_deref(), Some("host-1"));
            assert!(event.event_time.is_some());
            assert_eq!(event.regarding.as_ref(), Some(&regarding));
            assert_eq!(event.related, None);
        }
        assert_ne!(listed[0].metadata.name, listed[1].metadata.name);
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
    async fn a_burst_larger_than_the_queue_is_written_whole_and_flushed() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = EventWriter::new(sim.client(), reporter(Some("host-1")));
        let regarding = object("c").object_ref(&());
        let n = QUEUE_CAPACITY + 200;
        for i in 0..n {
            let normal = event(EventType::Normal, format!("n{i}"));
            events.publish(&normal, &regarding).await;
        }
        events.flush(Duration::from_secs(60)).await;
        assert_eq!(
            listed(&sim).await.len(),
            n,
            "a full queue waits, it does not drop"
        );
    }

    #[tokio::test]
    async fn a_failed_write_is_logged_and_does_not_block_the_flush() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        sim.add_fault(kube_sim::FaultRule::new(kube_sim::Verb::Create, "events").always());
        let events = EventWriter::new(sim.client(), reporter(Some("host-1")));
        let warning = event(EventType::Warning, "x".into());
        events.publish(&warning, &object("c").object_ref(&())).await;
        let flushed = tokio::time::timeout(
            Duration::from_secs(10),
            events.flush(Duration::from_secs(60)),
        );
        assert!(flushed.await.is_ok(), "a failed write counts as done");
        assert_eq!(
            events
                .shared
                .as_ref()
                .unwrap()
                .pending
                .count
                .load(Ordering::Acquire),
            0
        );
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
