//! A small writer of `events.k8s.io/v1` Events: one `create` per event.
//!
//! kube-runtime's `Recorder` scans its whole cache of past events on every publish and
//! keeps each event for 6 minutes, so a burst of N objects cost O(N²); this writer keeps
//! nothing, and publishing is O(1) in the number of events.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube_client::{Api, Client, api::PostParams};
use tracing::warn;

use crate::backend::error_chain;

/// Limit of one event write, so a slow events API never stalls a reconcile for long.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether an event reports progress or a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Normal,
    Warning,
}

/// Writes events as one reporting controller (and instance).
pub(crate) struct EventWriter {
    client: Client,
    controller: String,
    instance: String,
    /// Makes names unique when two events of one object share a nanosecond.
    sequence: AtomicU64,
}

impl EventWriter {
    /// A writer reporting as `controller` (and `instance`, the controller when none).
    pub(crate) fn new(client: Client, controller: &str, instance: Option<&str>) -> Self {
        Self {
            client,
            controller: controller.to_owned(),
            instance: instance.unwrap_or(controller).to_owned(),
            sequence: AtomicU64::new(0),
        }
    }

    /// Creates the event; a failure is logged, never returned (events are for users).
    pub(crate) async fn publish(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let object = regarding.name.clone();
        let event = self.event(regarding, type_, reason, action, note);
        let params = PostParams::default();
        match tokio::time::timeout(PUBLISH_TIMEOUT, api.create(&params, &event)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                warn!(reason, ?object, error = %error_chain(&error), "failed to publish event");
            }
            Err(_) => warn!(reason, ?object, "publishing event timed out"),
        }
    }

    /// The event as kube-runtime's `Recorder` fills a new one (no series).
    fn event(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) -> Event {
        let now = Timestamp::now();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let object = regarding.name.as_deref().unwrap_or(&self.controller);
        let name = event_name(object, now.as_nanosecond(), sequence);
        Event {
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(name),
                ..ObjectMeta::default()
            },
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            series: None,
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..Event::default()
        }
    }
}

/// Longest name the API server accepts (a DNS subdomain).
const MAX_NAME: usize = 253;

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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn regarding() -> ObjectReference {
        ObjectReference {
            kind: Some("CnsVolumeMetadata".into()),
            namespace: Some("default".into()),
            name: Some("m".into()),
            uid: Some("u1".into()),
            ..ObjectReference::default()
        }
    }

    #[tokio::test]
    async fn each_publish_creates_one_event_without_a_shared_series() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let writer = EventWriter::new(sim.client(), "cns.vmware.com", None);
        for _ in 0..2 {
            writer
                .publish(
                    regarding(),
                    EventType::Warning,
                    "UpdateFailed",
                    "Validate",
                    "bad".into(),
                )
                .await;
        }
        let api: Api<Event> = Api::namespaced(sim.client(), "default");
        let listed = api.list(&Default::default()).await.unwrap().items;
        assert_eq!(
            listed.len(),
            2,
            "a repeat is a new event, not a series of the first"
        );
        for event in &listed {
            assert!(event.metadata.name.as_deref().unwrap().starts_with("m."));
            assert!(event.series.is_none());
            assert_eq!(event.type_.as_deref(), Some("Warning"));
            assert_eq!(event.reason.as_deref(), Some("UpdateFailed"));
            assert_eq!(event.action.as_deref(), Some("Validate"));
            assert_eq!(event.note.as_deref(), Some("bad"));
            assert_eq!(
                event.reporting_controller.as_deref(),
                Some("cns.vmware.com")
            );
            assert_eq!(event.reporting_instance.as_deref(), Some("cns.vmware.com"));
            assert!(event.event_time.is_some());
            assert_eq!(event.regarding, Some(regarding()));
        }
        assert_ne!(listed[0].metadata.name, listed[1].metadata.name);
    }
}
