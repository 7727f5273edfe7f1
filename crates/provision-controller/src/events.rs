//! Event reasons (Go's strings) and a thin wrapper over kube-runtime's event [`Recorder`].

use k8s_openapi::api::core::v1::ObjectReference;
use kube_client::{Client, Resource};
use kube_runtime::events::{Event, EventType, Recorder, Reporter};
use std::time::Duration;

/// On a claim: provisioning started.
pub const PROVISIONING: &str = "Provisioning";
/// On a claim: provisioning, or saving the PV, failed.
pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// On a claim: the PV was saved.
pub const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// On a claim: the PV could not be saved and the asset could not be deleted either.
pub const PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
/// On a PV: deleting its asset failed.
pub const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

/// Limit of one event write, so a slow events API never stalls an operation for long.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes events; failures are logged, never returned (events are for users).
#[derive(Clone)]
pub(crate) struct Events {
    /// `None` in unit tests that run without an API server.
    recorder: Option<Recorder>,
}

impl Events {
    pub(crate) fn new(client: Client, controller: &str, instance: String) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: Some(instance),
        };
        Self {
            recorder: Some(Recorder::new(client, reporter)),
        }
    }

    #[cfg(test)]
    pub(crate) fn disabled() -> Self {
        Self { recorder: None }
    }

    pub(crate) async fn normal<K>(&self, obj: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(obj.object_ref(&()), EventType::Normal, reason, note)
            .await;
    }

    pub(crate) async fn warning<K>(&self, obj: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(obj.object_ref(&()), EventType::Warning, reason, note)
            .await;
    }

    async fn publish(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action_for(reason).to_owned(),
            secondary: None,
        };
        match tokio::time::timeout(PUBLISH_TIMEOUT, recorder.publish(&event, &regarding)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::warn!(reason, object = ?regarding.name, error = %err, "failed to publish event");
            }
            Err(_) => {
                tracing::warn!(reason, object = ?regarding.name, "publishing event timed out")
            }
        }
    }
}

fn action_for(reason: &str) -> &'static str {
    if reason == VOLUME_FAILED_DELETE {
        "Delete"
    } else {
        "Provision"
    }
}
