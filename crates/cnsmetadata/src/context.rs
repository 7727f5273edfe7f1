//! The state every reconcile shares ([`Context`]), the error of one reconcile
//! ([`ReconcileError`]) and the events it publishes. The reconciler, the pushes (`sync`)
//! and the writes (`write`) all build on this module; it uses none of them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube_client::{Client, Resource, ResourceExt};
use kube_controller_kit::events::{Event, EventType, EventWriter, Reporter};
use kube_runtime::reflector::{ObjectRef, Store};

use crate::{
    backend::VolumeMetadataBackend,
    backoff::PerObjectBackoff,
    config::Config,
    record::{self, PushedEntry, Settle},
    resource::CnsVolumeMetadata,
    validate::InvalidSpec,
};

/// Event reason of failures.
pub const REASON_UPDATE_FAILED: &str = "UpdateFailed";
/// Event reason of successful updates.
pub const REASON_UPDATE_SUCCEEDED: &str = "UpdateSucceeded";
/// `reportingController` of published events (Go's event source component).
pub const REPORTING_CONTROLLER: &str = "cns.vmware.com";

/// Why one reconcile of one object failed; [`error_policy`](crate::error_policy) schedules the retry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ReconcileError {
    /// The spec breaks validation rules.
    #[error("cnsvolumemetadata {object} is invalid")]
    InvalidSpec {
        /// `namespace/name` of the object.
        object: String,
        /// Every broken rule.
        #[source]
        source: InvalidSpec,
    },
    /// Some CNS updates or removals failed; the status and the event say why.
    #[error("{failed} of {total} volumes of cnsvolumemetadata {object} failed to update on cns")]
    VolumesFailed {
        /// `namespace/name` of the object.
        object: String,
        /// Updates or removals that failed.
        failed: usize,
        /// Updates or removals tried (plus volumes that could not be resolved).
        total: usize,
    },
    /// The entity references of this object would get an empty cluster ID: the option
    /// [`Config::validate`] names (`cluster_id`, or `supervisor_id` while TKGsHA is on) is
    /// empty. Nothing is sent to CNS; retried with the object's backoff.
    #[error("cnsvolumemetadata {object} cannot be pushed to cns")]
    Config {
        /// `namespace/name` of the object.
        object: String,
        /// The option that is empty.
        #[source]
        source: crate::config::ConfigError,
    },
    /// Writing the object (finalizer or status) failed.
    #[error("failed to {action} of cnsvolumemetadata {object}")]
    Write {
        /// `namespace/name` of the object.
        object: String,
        /// What was written.
        action: &'static str,
        /// The API error.
        #[source]
        source: Box<kube_client::Error>,
    },
}

/// Everything `reconcile` needs: API client, caches, backend, options, retry state.
pub(crate) struct Context {
    pub(crate) client: Client,
    pub(crate) backend: Arc<dyn VolumeMetadataBackend>,
    pub(crate) config: Config,
    pub(crate) claims: Store<PersistentVolumeClaim>,
    pub(crate) volumes: Store<PersistentVolume>,
    events: EventWriter,
    pub(crate) backoff: Arc<PerObjectBackoff>,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    /// Per object, the entries whose push from this replica got no answer, marked with
    /// when it was sent; kept while such a push may still land (the record says so too,
    /// unless its write failed).
    unanswered: Mutex<HashMap<ObjectRef<CnsVolumeMetadata>, Vec<PushedEntry>>>,
}

impl Context {
    /// A context reading supervisor claims and volumes from the given caches (fill them
    /// with reflectors; [`MetadataController::run`](crate::MetadataController::run) does).
    ///
    /// Events are written in the background by kube-controller-kit's
    /// [`EventWriter`](kube_controller_kit::events::EventWriter) (notes longer than the
    /// 1024 bytes the API server accepts are cut and end in `...`); see
    /// [`flush_events`](Self::flush_events).
    ///
    /// # Panics
    /// Outside a Tokio runtime: the events writer task is spawned here.
    #[must_use]
    pub(crate) fn new(
        client: Client,
        backend: Arc<dyn VolumeMetadataBackend>,
        config: Config,
        claims: Store<PersistentVolumeClaim>,
        volumes: Store<PersistentVolume>,
    ) -> Self {
        Self {
            events: EventWriter::new(
                client.clone(),
                Reporter {
                    controller: REPORTING_CONTROLLER.to_owned(),
                    instance: config.reporting_instance.clone(),
                },
            ),
            client,
            backend,
            config,
            claims,
            volumes,
            backoff: Arc::default(),
            clock: Arc::new(SystemTime::now),
            unanswered: Mutex::default(),
        }
    }

    #[cfg(test)]
    /// Reads the time from `clock` instead of the system clock (`SystemTime::now`). The
    /// record stores when entities were removed from CNS, to remove them once more after
    /// the [settle period](Config::settle_period); tests and simulations pass a clock
    /// that follows tokio's paused time, like `testing::tokio_clock`.
    #[must_use]
    pub(crate) fn with_clock(
        mut self,
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    pub(crate) fn now(&self) -> SystemTime {
        (self.clock)()
    }

    fn unanswered_map(
        &self,
    ) -> MutexGuard<'_, HashMap<ObjectRef<CnsVolumeMetadata>, Vec<PushedEntry>>> {
        crate::lock(&self.unanswered)
    }

    /// Drops the marks of pushes that can no longer land, of every object.
    fn prune_unanswered(&self, map: &mut HashMap<ObjectRef<CnsVolumeMetadata>, Vec<PushedEntry>>) {
        let (now, period) = (self.now(), self.config.settle_period());
        for entries in map.values_mut() {
            entries.retain(|e| matches!(e.landing(now, period), Settle::Wait(_)));
        }
        map.retain(|_, entries| !entries.is_empty());
    }

    /// Remembers `entry` (marked with the time its push was sent) of `object`.
    pub(crate) fn remember_unanswered(
        &self,
        object: &ObjectRef<CnsVolumeMetadata>,
        entry: PushedEntry,
    ) {
        let mut map = self.unanswered_map();
        self.prune_unanswered(&mut map);
        let entries = map.entry(object.clone()).or_default();
        *entries = record::union(entries, &[entry]);
    }

    /// The entries of `object` whose push from this replica got no answer and may still
    /// land.
    pub(crate) fn remembered_unanswered(
        &self,
        object: &ObjectRef<CnsVolumeMetadata>,
    ) -> Vec<PushedEntry> {
        let mut map = self.unanswered_map();
        self.prune_unanswered(&mut map);
        map.get(object).cloned().unwrap_or_default()
    }

    /// Forgets the pushes without answer of an object that is gone.
    pub(crate) fn forget_unanswered(&self, object: &ObjectRef<CnsVolumeMetadata>) {
        self.unanswered_map().remove(object);
    }

    /// Uses `backoff` (shared with the watch, which forgets deleted objects in it).
    pub(crate) fn with_backoff(mut self, backoff: Arc<PerObjectBackoff>) -> Self {
        self.backoff = backoff;
        self
    }

    /// The retry delays per object.
    #[must_use]
    pub(crate) fn backoff(&self) -> &PerObjectBackoff {
        &self.backoff
    }

    pub(crate) async fn publish(
        &self,
        object: &CnsVolumeMetadata,
        type_: EventType,
        action: &str,
        note: String,
    ) {
        let reason = match type_ {
            EventType::Normal => REASON_UPDATE_SUCCEEDED,
            EventType::Warning => REASON_UPDATE_FAILED,
        };
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        self.events.publish(&event, &object.object_ref(&())).await;
    }

    /// Waits until every event published so far is written (or has failed), at most
    /// `limit`. Events are written in the background; [`MetadataController::run`](crate::MetadataController::run) flushes them
    /// when it stops, and a test that reads them after a [`reconcile`](crate::reconcile) flushes first.
    pub(crate) async fn flush_events(&self, limit: Duration) {
        self.events.flush(limit).await;
    }
}

pub(crate) fn describe(object: &CnsVolumeMetadata) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}
