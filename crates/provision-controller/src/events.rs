//! Event reasons (Go's strings) and the controller's publisher of `events.k8s.io/v1`
//! Events over [`kube_controller_kit::events::EventWriter`]: written in the background,
//! repeats folded into one Event series, dropped and counted when the queue stays full
//! (docs/production.md, "Events").

use std::time::Duration;

use kube_client::{Client, Resource};
use kube_controller_kit::events::{Event, EventType, EventWriter, Reporter};

/// On a claim: provisioning started.
pub(crate) const PROVISIONING: &str = "Provisioning";
/// On a claim: provisioning, or saving the PV, failed.
pub(crate) const PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// On a claim: the PV was saved.
pub(crate) const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// On a claim: an asset could not be cleaned up (without crash-safe provisioning, the PV
/// could not be saved and the asset not deleted either; the asset of a claim that will not get our
/// PV the normal way could not be recorded in a PV, or cannot be looked for without the
/// claim's class).
pub(crate) const PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
/// On a claim: its provisioning has been held in the journal (started, with no
/// volume and no final answer from the driver) for longer than
/// [`Config::provisioning_held_warning`](crate::Config::provisioning_held_warning). No Go
/// counterpart.
pub(crate) const PROVISIONING_HELD: &str = "ProvisioningHeld";
/// On a PV: deleting its asset failed.
pub(crate) const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

/// Publishes events; failures are logged, never returned (events are for users).
#[derive(Clone)]
pub(crate) struct Events {
    writer: EventWriter,
}

impl Events {
    /// A publisher and its writer task (spawned here; it ends when the last clone of the
    /// publisher is dropped and the queue is written out).
    pub(crate) fn new(client: Client, controller: &str, instance: String) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: Some(instance),
        };
        Self {
            writer: EventWriter::new(client, reporter),
        }
    }

    /// A publisher that drops every event, for unit tests that run without an API server.
    #[cfg(test)]
    pub(crate) fn disabled() -> Self {
        Self {
            writer: EventWriter::disabled(),
        }
    }

    pub(crate) async fn normal<K>(&self, obj: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(obj, EventType::Normal, reason, note).await;
    }

    pub(crate) async fn warning<K>(&self, obj: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(obj, EventType::Warning, reason, note).await;
    }

    async fn publish<K>(&self, obj: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action_for(reason).to_owned(),
            secondary: None,
        };
        self.writer.publish(&event, &obj.object_ref(&())).await;
    }

    /// Waits until every queued event is written (or has failed), at most `limit`.
    pub(crate) async fn flush(&self, limit: Duration) {
        self.writer.flush(limit).await;
    }
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
    use k8s_openapi::api::events::v1::Event;
    use kube_client::Api;

    #[tokio::test]
    async fn a_repeated_event_of_a_claim_is_one_event_series() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = Events::new(sim.client(), "example.com/ctl", "host-1".to_owned());
        let claim = crate::testing::pvc("c").uid("u1").build();
        let note = "x".repeat(1500);
        events
            .warning(&claim, PROVISIONING_FAILED, note.clone())
            .await;
        events.warning(&claim, PROVISIONING_FAILED, note).await;
        events
            .warning(&claim, PROVISIONING_FAILED, "other".into())
            .await;
        events.flush(Duration::from_secs(10)).await;
        let api: Api<Event> = Api::namespaced(sim.client(), "default");
        let mut listed = api.list(&Default::default()).await.unwrap().items;
        listed.sort_by_key(|e| e.series.as_ref().map_or(1, |s| s.count));
        assert_eq!(
            listed.len(),
            2,
            "a repeat joins the series of the first, another note is a new event"
        );
        assert!(listed[0].series.is_none());
        assert_eq!(listed[0].note.as_deref(), Some("other"));
        assert_eq!(listed[1].series.as_ref().map(|s| s.count), Some(2));
        for event in &listed {
            assert!(event.metadata.name.as_deref().unwrap().starts_with("c."));
            assert_eq!(event.reason.as_deref(), Some(PROVISIONING_FAILED));
            assert_eq!(event.type_.as_deref(), Some("Warning"));
            assert_eq!(event.action.as_deref(), Some("Provision"));
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
        assert_eq!(
            listed[1].note.as_deref().map(str::len),
            Some(kube_controller_kit::events::NOTE_LIMIT),
            "the kit's limit, as the metadata controller's events"
        );
    }

    #[tokio::test]
    async fn a_failed_deletion_is_reported_with_the_delete_action() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let events = Events::new(sim.client(), "example.com/ctl", "host-1".to_owned());
        let volume = crate::testing::pv("pv-1").build();
        events
            .warning(&volume, VOLUME_FAILED_DELETE, "busy".into())
            .await;
        events.normal(&volume, PROVISIONING, "n".into()).await;
        events.flush(Duration::from_secs(10)).await;
        let api: Api<Event> = Api::namespaced(sim.client(), "default");
        let mut listed: Vec<_> = api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| (e.reason.unwrap(), e.action.unwrap(), e.type_.unwrap()))
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [
                (PROVISIONING.into(), "Provision".into(), "Normal".into()),
                (
                    VOLUME_FAILED_DELETE.into(),
                    "Delete".into(),
                    "Warning".into()
                ),
            ]
        );
    }
}
