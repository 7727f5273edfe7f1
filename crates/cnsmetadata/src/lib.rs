#![doc = include_str!("../README.md")]

mod backend;
mod backoff;
mod config;
mod context;
mod crd;
mod plan;
mod reconciler;
mod record;
mod related;
mod resource;
mod run;
mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
mod trigger;
mod validate;
mod write;

// The crates whose types this crate's API names (the objects and their serde impls, the
// client, the feature-state watch), so a caller names the very versions the reconciler uses.
pub use k8s_openapi;
pub use kube_client;
pub use serde;
pub use tokio;

// The public API, grouped as in the README's "Public API" table.
pub use backend::{
    BackendError, ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata,
    VolumeMetadataBackend, VolumeMetadataUpdate,
};
pub use config::{Config, ConfigError, ConfigOption, FeatureState, VSPHERE_CSI_DRIVER};
pub use context::{REASON_UPDATE_FAILED, REASON_UPDATE_SUCCEEDED, REPORTING_CONTROLLER};
pub use crd::{crd, crd_yaml};
/// Whether this replica leads, as it changes: what [`MetadataController::leading`] follows
/// (from kube-controller-kit, shared with provision-controller's `Health::leading`).
pub use kube_controller_kit::leader::Leading;
pub use record::PUSHED_ANNOTATION;
pub use resource::{
    CRD_NAME, CnsVolumeMetadata, CnsVolumeMetadataSpec, CnsVolumeMetadataStatus, EntityReference,
    EntityType, FINALIZER, VolumeStatus,
};
pub use run::{Error, MetadataController};

/// Locks `mutex`, recovering the data if a thread panicked while holding it: the crate's
/// one way to lock. Every critical section of the crate leaves its data consistent (plain
/// maps and lists, changed in one step), so a poisoned lock carries no broken invariant,
/// and refusing service would turn one panic into a dead reconciler.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
