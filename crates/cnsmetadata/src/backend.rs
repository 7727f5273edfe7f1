//! The storage side: what the reconciler sends to vSphere Cloud Native Storage.
//!
//! [`VolumeMetadataUpdate`] mirrors the `CnsVolumeMetadataUpdateSpec` that the Go
//! controller builds (through `cnsvsphere.GetCnsKubernetesEntityMetaData`,
//! `CreateCnsKuberenetesEntityReference` and `GetContainerCluster`), one update per volume
//! with exactly one entity. The `vsphere-cns` crate implements [`VolumeMetadataBackend`]
//! with the real `CnsUpdateVolumeMetadata` call; `testing::InMemoryBackend` records updates.

use std::{collections::BTreeMap, fmt};

use async_trait::async_trait;

use crate::resource::{EntityReference, EntityType};

/// Pushes Kubernetes entity metadata of one volume to CNS (Go: `volumes.Manager`'s
/// `UpdateVolumeMetadata`).
///
/// Implementations must be safe to call concurrently: the reconciler runs several workers
/// (`Config::worker_threads`), never two at a time for the same `CnsVolumeMetadata` object,
/// but possibly two for the same volume (a PVC entity and a Pod entity that use it).
#[async_trait]
pub trait VolumeMetadataBackend: Send + Sync + 'static {
    /// Adds, replaces or (when `update.entity_metadata.delete` is set) removes the entity
    /// described by `update` on the volume `update.volume_id`.
    ///
    /// # Errors
    /// [`BackendError::NotFound`] when CNS does not know the volume (the reconciler treats
    /// that as success while deleting); [`BackendError::Other`] for everything else.
    async fn update_volume_metadata(
        &self,
        update: &VolumeMetadataUpdate,
    ) -> Result<(), BackendError>;
}

#[async_trait]
impl<B: VolumeMetadataBackend + ?Sized> VolumeMetadataBackend for std::sync::Arc<B> {
    async fn update_volume_metadata(
        &self,
        update: &VolumeMetadataUpdate,
    ) -> Result<(), BackendError> {
        (**self).update_volume_metadata(update).await
    }
}

/// One metadata update for one CNS volume (Go: `cnstypes.CnsVolumeMetadataUpdateSpec`).
#[doc(alias = "CnsVolumeMetadataUpdateSpec")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeMetadataUpdate {
    /// CNS volume ID: the CSI volume handle of the supervisor PV.
    pub volume_id: String,
    /// The one entity to add, replace or remove (Go puts it alone in `EntityMetadata`).
    pub entity_metadata: EntityMetadata,
    /// The guest cluster that owns the entity (Go sets it both as `ContainerCluster` and
    /// as the only element of `ContainerClusterArray`).
    pub container_cluster: ContainerCluster,
}

/// A Kubernetes entity of a guest cluster (Go: `cnstypes.CnsKubernetesEntityMetadata`).
#[doc(alias = "CnsKubernetesEntityMetadata")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntityMetadata {
    /// `PERSISTENT_VOLUME`, `PERSISTENT_VOLUME_CLAIM` or `POD`.
    pub entity_type: EntityType,
    /// Name of the entity in the guest cluster.
    pub entity_name: String,
    /// Namespace of the entity in the guest cluster; empty for PVs.
    pub namespace: String,
    /// Labels of the entity (sent to CNS as key/value pairs; empty for pods).
    pub labels: BTreeMap<String, String>,
    /// Remove this entity from the volume instead of adding or replacing it.
    pub delete: bool,
    /// The guest cluster ID (`spec.guestclusterid`).
    pub cluster_id: String,
    /// The one entity this one refers to for this volume (Go: `ReferredEntity`).
    pub referred_entities: Vec<EntityReference>,
}

/// The cluster an entity belongs to (Go: `cnstypes.CnsContainerCluster`).
#[doc(alias = "CnsContainerCluster")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerCluster {
    /// Always [`ClusterType::Kubernetes`].
    pub cluster_type: ClusterType,
    /// The guest cluster ID (`spec.guestclusterid`).
    pub cluster_id: String,
    /// The vCenter user the supervisor's CSI driver logs in with.
    pub vsphere_user: String,
    /// Flavor of the cluster that owns the entity: [`ClusterFlavor::GuestCluster`] for
    /// entities reported through `CnsVolumeMetadata`.
    pub cluster_flavor: ClusterFlavor,
    /// Distribution of the guest cluster (`spec.clusterdistribution`); may be empty.
    pub cluster_distribution: String,
}

/// Kind of container orchestrator (Go: `cnstypes.CnsClusterType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClusterType {
    /// `KUBERNETES`, the only type CNS knows.
    #[default]
    Kubernetes,
}

impl ClusterType {
    /// The CNS string.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubernetes => "KUBERNETES",
        }
    }
}

impl fmt::Display for ClusterType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Deployment flavor of a cluster (Go: `cnstypes.CnsClusterFlavor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClusterFlavor {
    /// `WORKLOAD`: a vSphere supervisor cluster; the only flavor that runs the reconciler.
    Workload,
    /// `GUEST_CLUSTER`: a Tanzu Kubernetes (guest) cluster running pvCSI.
    GuestCluster,
    /// `VANILLA`: a plain Kubernetes cluster running the vSphere CSI driver.
    Vanilla,
}

impl ClusterFlavor {
    /// The CNS string.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Workload => "WORKLOAD",
            Self::GuestCluster => "GUEST_CLUSTER",
            Self::Vanilla => "VANILLA",
        }
    }

    /// Parses the CNS string (`WORKLOAD`, `GUEST_CLUSTER`, `VANILLA`).
    #[must_use]
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "WORKLOAD" => Some(Self::Workload),
            "GUEST_CLUSTER" => Some(Self::GuestCluster),
            "VANILLA" => Some(Self::Vanilla),
            _ => None,
        }
    }
}

impl fmt::Display for ClusterFlavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a metadata update failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// CNS does not know the volume (Go: `cnsvsphere.IsNotFoundError`).
    #[error("volume {volume_id:?} not found in cns")]
    NotFound {
        /// The CNS volume ID that was not found.
        volume_id: String,
    },
    /// Any other failure: transport, session, a CNS fault.
    #[error("cns volume metadata update failed")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The call got no answer: it timed out, or the connection broke once the request may
    /// have been sent. CNS may still carry the update out later.
    #[error("cns volume metadata update got no answer")]
    Unanswered(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl BackendError {
    /// A [`BackendError::NotFound`] for `volume_id`.
    #[must_use]
    pub fn not_found(volume_id: impl Into<String>) -> Self {
        Self::NotFound {
            volume_id: volume_id.into(),
        }
    }

    /// A [`BackendError::Other`] wrapping `source`.
    #[must_use]
    pub fn other(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Other(source.into())
    }

    /// A [`BackendError::Unanswered`] wrapping `source`: the update may still be carried
    /// out after this error.
    #[must_use]
    pub fn unanswered(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unanswered(source.into())
    }

    /// Whether the update may still take effect on CNS after this error
    /// ([`BackendError::Unanswered`]). The reconciler then removes the entity once more
    /// when the object is deleted, or pushes it once more, after the
    /// [settle period](crate::Config::settle_period).
    #[must_use]
    pub fn may_land_later(&self) -> bool {
        matches!(self, Self::Unanswered(_))
    }

    /// Whether CNS reported that the volume does not exist.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}

#[cfg(test)]
fn _dyn_compatible(_: &dyn VolumeMetadataBackend) {}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_controller_kit::error::chain as error_chain;

    #[test]
    fn not_found_is_distinguishable() {
        assert!(BackendError::not_found("vol-1").is_not_found());
        assert!(!BackendError::other("session expired").is_not_found());
    }

    #[test]
    fn only_an_unanswered_call_may_land_later() {
        let unanswered = BackendError::unanswered("CnsUpdateVolumeMetadata timed out after 2s");
        assert!(unanswered.may_land_later());
        assert!(!unanswered.is_not_found());
        assert_eq!(
            error_chain(&unanswered),
            "cns volume metadata update got no answer: CnsUpdateVolumeMetadata timed out after 2s"
        );
        assert!(!BackendError::other("fault: CnsFault").may_land_later());
        assert!(!BackendError::not_found("vol-1").may_land_later());
    }

    #[test]
    fn error_chain_includes_every_source() {
        let error = BackendError::other("fault: ResourceInUse");
        assert_eq!(
            error_chain(&error),
            "cns volume metadata update failed: fault: ResourceInUse"
        );
        assert_eq!(
            error_chain(&BackendError::not_found("vol-1")),
            r#"volume "vol-1" not found in cns"#
        );
    }

    #[test]
    fn cluster_strings_match_cns() {
        for flavor in [
            ClusterFlavor::Workload,
            ClusterFlavor::GuestCluster,
            ClusterFlavor::Vanilla,
        ] {
            assert_eq!(ClusterFlavor::parse(flavor.as_str()), Some(flavor));
        }
        assert_eq!(ClusterFlavor::GuestCluster.as_str(), "GUEST_CLUSTER");
        assert_eq!(ClusterFlavor::parse("workload"), None);
        assert_eq!(ClusterType::Kubernetes.to_string(), "KUBERNETES");
    }
}
