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
mod trigger;
mod validate;
mod write;

pub use backend::{
    BackendError, BoxError, ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata,
    VolumeMetadataBackend, VolumeMetadataUpdate,
};
pub use backoff::PerObjectBackoff;
pub use config::{
    Config, ConfigError, ConfigOption, ENV_CLUSTER_FLAVOR, ENV_WORKER_THREADS, FeatureState,
    VSPHERE_CSI_DRIVER,
};
pub use context::{
    Context, REASON_UPDATE_FAILED, REASON_UPDATE_SUCCEEDED, REPORTING_CONTROLLER, ReconcileError,
};
pub use crd::{crd, crd_yaml};
pub use plan::{plan_update, referred_entities};
pub use reconciler::{FINALIZER, error_policy, reconcile};
pub use record::PUSHED_ANNOTATION;
pub use resource::{
    API_VERSION, CRD_NAME, CnsVolumeMetadata, CnsVolumeMetadataSpec, CnsVolumeMetadataStatus,
    EntityReference, EntityType, GROUP, KIND, PLURAL, VERSION, VolumeStatus,
};
pub use run::{Error, MetadataController};
pub use validate::{InvalidSpec, Violation, validate};

/// Locks `mutex`, recovering the data if a thread panicked while holding it: the crate's
/// one way to lock. Every critical section of the crate leaves its data consistent (plain
/// maps and lists, changed in one step), so a poisoned lock carries no broken invariant,
/// and refusing service would turn one panic into a dead reconciler.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
