//! Event reasons (Go's strings) and a small writer of `events.k8s.io/v1` Events.
//!
//! Each event is one `create`: no shared cache of past events (kube-runtime's `Recorder`
//! scans its whole cache on every publish and keeps each event for 6 minutes, which made
//! a burst of N claims cost O(N²)), so publishing is O(1) in the number of events.
//!
//! As in Go, events are written in the background: publishing queues the event and the
//! worker goes on; a writer task creates them, four at a time. Unlike Go, which
//! drops events when its queue of 1,000 is full, a full queue makes the publisher wait,
//! so no event is lost to a burst. The controller flushes the queue when it stops.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use tokio::sync::{Notify, mpsc};

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube_client::{Api, Client, Resource, api::PostParams};

/// On a claim: provisioning started.
pub const PROVISIONING: &str = "Provisioning";
/// On a claim: provisioning, or saving the PV, failed.
pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// On a claim: the PV was saved.
pub const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// On a claim: an asset could not be cleaned up (without crash-safe provisioning, the PV
/// could not be saved and the asset not deleted either; the duplicate of a PV another
/// replica saved first could not be released; the asset of a claim that will not get our
/// PV the normal way could not be recorded in a PV, or cannot be looked for without the
/// claim's class).
pub const PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
/// On a PV: deleting its asset failed.
pub const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

/// Limit of one event write, so a slow events API never stalls an operation for long.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Events notes are limited to 1 kB.
const MAX_NOTE_BYTES: usize = 1000;
/// Events queued for the writer before a publisher waits (Go's `maxQueuedEvents`).
const QUEUE: usize = 1000;
/// Event creates in flight at once.
const WRITERS: usize = 4;

/// Who writes the events.
struct Reporter {
    controller: String,
    instance: String,
    /// Makes names unique when two events of one object share a nanosecond.
    sequence: AtomicU64,
    queue: mpsc::Sender<Event>,
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

/// Publishes events; failures are logged, never returned (events are for users).
#[derive(Clone)]
pub(crate) struct Events {
    /// `None` in unit tests that run without an API server.
    reporter: Option<Arc<Reporter>>,
}

impl Events {
    /// A publisher and its writer task (spawned here; it ends when the last clone of the
    /// publisher is dropped and the queue is written out).
    pub(crate) fn new(client: Client, controller: &str, instance: String) -> Self {
        let (queue, events) = mpsc::channel(QUEUE);
        let pending = Arc::new(Pending::default());
        tokio::spawn(write_all(client, events, Arc::clone(&pending)));
        Self {
            reporter: Some(Arc::new(Reporter {
                queue,
                pending,
                controller: controller.to_owned(),
                instance,
                sequence: AtomicU64::new(0),
            })),
        }
    }

    #[cfg(test)]
    pub(crate) fn disabled() -> Self {
        Self { reporter: None }
    }

    pub(crate) async fn normal<K>(&self, obj: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(obj.object_ref(&()), "Normal", reason, note)
            .await;
    }

    pub(crate) async fn warning<K>(&self, obj: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(obj.object_ref(&()), "Warning", reason, note)
            .await;
    }

    async fn publish(&self, regarding: ObjectReference, type_: &str, reason: &str, note: String) {
        let Some(reporter) = &self.reporter else {
            return;
        };
        let event = reporter.event(regarding, type_, reason, note);
        reporter.pending.count.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(event)) = reporter.queue.send(event).await {
            reporter.pending.done();
            tracing::warn!(reason, object = ?event.regarding.and_then(|r| r.name), "event writer stopped; event not written");
        }
    }

    /// Waits until every queued event is written (or has failed), at most `limit`.
    pub(crate) async fn flush(&self, limit: Duration) {
        let Some(reporter) = &self.reporter else {
            return;
        };
        let pending = &reporter.pending;
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

/// Creates the queued events, [`WRITERS`] at a time, until the queue closes.
async fn write_all(client: Client, events: mpsc::Receiver<Event>, pending: Arc<Pending>) {
    let queued = futures::stream::unfold(events, |mut events| async move {
        events.recv().await.map(|event| (event, events))
    });
    queued
        .for_each_concurrent(WRITERS, |event| {
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
async fn write(client: Client, event: Event) {
    let namespace = event.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<Event> = Api::namespaced(client, namespace);
    let params = PostParams::default();
    let create = api.create(&params, &event);
    let reason = event.reason.as_deref().unwrap_or_default();
    let object = event.regarding.as_ref().and_then(|r| r.name.as_deref());
    match tokio::time::timeout(PUBLISH_TIMEOUT, create).await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => {
            tracing::warn!(reason, object, error = %err, "failed to publish event");
        }
        Err(_) => {
            tracing::warn!(reason, object, "publishing event timed out");
        }
    }
}

impl Reporter {
    /// The event as kube-runtime's `Recorder` fills a new one (no series).
    fn event(&self, regarding: ObjectReference, type_: &str, reason: &str, note: String) -> Event {
        let now = Timestamp::now();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let object = regarding.name.as_deref().unwrap_or(&self.controller);
        let name = format!(
            "{object}.{:x}{:04x}",
            now.as_nanosecond(),
            sequence & 0xffff
        );
        Event {
            action: Some(action_for(reason).to_owned()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            note: Some(truncate(note, MAX_NOTE_BYTES)),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(name),
                ..ObjectMeta::default()
            },
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            series: None,
            type_: Some(type_.to_owned()),
            ..Event::default()
        }
    }
}

/// `note` cut to at most `max` bytes, on a character boundary.
fn truncate(mut note: String, max: usize) -> String {
    if note.len() > max {
        let mut cut = max;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    note
}

fn action_for(reason: &str) -> &'static str {
    if reason == VOLUME_FAILED_DELETE {
        "Delete"
    } else {
        "Provision"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("abc".to_owned(), 1000), "abc");
        let long = "é".repeat(600);
        let cut = truncate(long, 1000);
        assert_eq!(cut.len(), 1000);
        let odd = format!("a{}", "é".repeat(600));
        assert_eq!(truncate(odd, 1000).len(), 999);
    }

    #[tokio::test]
    async fn each_publish_creates_one_event_without_a_shared_series() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = Events::new(sim.client(), "example.com/ctl", "host-1".to_owned());
        let claim = crate::testing::pvc("c").uid("u1").build();
        let note = "x".repeat(1500);
        events
            .warning(&claim, PROVISIONING_FAILED, note.clone())
            .await;
        events.warning(&claim, PROVISIONING_FAILED, note).await;
        events.flush(Duration::from_secs(10)).await;
        let api: Api<Event> = Api::namespaced(sim.client(), "default");
        let listed = api.list(&Default::default()).await.unwrap().items;
        assert_eq!(
            listed.len(),
            2,
            "a repeat is a new event, not a series of the first"
        );
        for event in &listed {
            assert!(event.metadata.name.as_deref().unwrap().starts_with("c."));
            assert!(event.series.is_none());
            assert_eq!(event.reason.as_deref(), Some(PROVISIONING_FAILED));
            assert_eq!(event.type_.as_deref(), Some("Warning"));
            assert_eq!(event.action.as_deref(), Some("Provision"));
            assert_eq!(event.note.as_deref().map(str::len), Some(1000));
            assert_eq!(
                event.reporting_controller.as_deref(),
                Some("example.com/ctl")
            );
            assert_eq!(event.reporting_instance.as_deref(), Some("host-1"));
            assert!(event.event_time.is_some());
            let regarding = event.regarding.as_ref().unwrap();
            assert_eq!(regarding.uid.as_deref(), Some("u1"));
            assert_eq!(regarding.kind.as_deref(), Some("PersistentVolumeClaim"));
        }
        assert_ne!(listed[0].metadata.name, listed[1].metadata.name);
    }

    #[tokio::test]
    async fn a_burst_larger_than_the_queue_is_written_whole_and_flushed() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = Events::new(sim.client(), "example.com/ctl", "host-1".to_owned());
        let claim = crate::testing::pvc("c").uid("u1").build();
        let n = QUEUE + 200;
        for i in 0..n {
            events.normal(&claim, PROVISIONING, format!("n{i}")).await;
        }
        events.flush(Duration::from_secs(60)).await;
        let api: Api<Event> = Api::namespaced(sim.client(), "default");
        let listed = api.list(&Default::default()).await.unwrap().items;
        assert_eq!(listed.len(), n, "a full queue waits, it does not drop");
    }

    #[tokio::test]
    async fn a_failed_write_is_logged_and_does_not_block_the_flush() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        sim.add_fault(kube_sim::FaultRule::new(kube_sim::Verb::Create, "events").always());
        let events = Events::new(sim.client(), "example.com/ctl", "host-1".to_owned());
        let claim = crate::testing::pvc("c").uid("u1").build();
        events
            .warning(&claim, PROVISIONING_FAILED, "x".into())
            .await;
        let flushed = tokio::time::timeout(
            Duration::from_secs(10),
            events.flush(Duration::from_secs(60)),
        );
        assert!(flushed.await.is_ok(), "a failed write counts as done");
        assert_eq!(
            events
                .reporter
                .as_ref()
                .unwrap()
                .pending
                .count
                .load(Ordering::Acquire),
            0
        );
    }
}
