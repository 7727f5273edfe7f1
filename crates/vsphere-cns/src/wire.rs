//! The CNS data types [`CnsClient`](crate::CnsClient) sends and receives: govmomi's
//! `cns/types` without their `Cns`/`CnsKubernetes` prefix (each type's docs name its govmomi
//! type), kept in this module so that they do not clash with `cnsmetadata`'s Kubernetes-side
//! types (`EntityType`, `EntityReference`, the `CnsVolumeMetadata` CRD). Fields are listed
//! in wire order. [`CnsVolumeId`], [`MoRef`] and [`ClusterFlavor`] are also at the crate root.

use std::fmt;

/// The ID of a CNS volume: the UUID of its First Class Disk (govmomi: `CnsVolumeId`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CnsVolumeId(pub String);

impl CnsVolumeId {
    /// Wraps a volume ID.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The ID as a string (this is the CSI volume handle).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CnsVolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for CnsVolumeId {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl From<String> for CnsVolumeId {
    fn from(value: String) -> Self {
        Self(value)
    }
}

/// A managed object reference: `<x type="Datastore">datastore-59</x>`.
#[doc(alias = "ManagedObjectReference")]
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MoRef {
    /// The managed object type, for example `Datastore`.
    pub kind: String,
    /// The object ID, for example `datastore-59`.
    pub value: String,
}

impl MoRef {
    /// A reference to an object of type `kind`.
    pub fn new(kind: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            value: value.into(),
        }
    }

    /// A reference to a datastore, for example `MoRef::datastore("datastore-59")`.
    pub fn datastore(value: impl Into<String>) -> Self {
        Self::new("Datastore", value)
    }
}

/// `BLOCK` or `FILE` (govmomi: `CnsVolumeType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VolumeType {
    /// A block volume backed by a First Class Disk.
    #[default]
    Block,
    /// A vSAN file share.
    File,
}

impl VolumeType {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeType::Block => "BLOCK",
            VolumeType::File => "FILE",
        }
    }
}

/// The kind of Kubernetes cluster (govmomi: `CnsClusterFlavor`): cnsmetadata's type, whose
/// [`as_str`](ClusterFlavor::as_str) and [`parse`](ClusterFlavor::parse) are the wire
/// values.
pub use cnsmetadata::ClusterFlavor;

/// The container cluster a volume belongs to (govmomi: `CnsContainerCluster`).
#[doc(alias = "CnsContainerCluster")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerCluster {
    /// Always `KUBERNETES` today.
    pub cluster_type: String,
    /// The cluster ID (`[Global] cluster-id`, or the supervisor ID).
    pub cluster_id: String,
    /// The vSphere user the cluster's driver logs in as.
    pub vsphere_user: String,
    /// The cluster flavor.
    pub cluster_flavor: Option<ClusterFlavor>,
    /// The distribution (`[Global] cluster-distribution`), for example `OpenShift`.
    pub cluster_distribution: Option<String>,
    /// Marks the cluster for removal in an update.
    pub delete: Option<bool>,
}

impl ContainerCluster {
    /// A Kubernetes cluster of the given flavor.
    pub fn kubernetes(
        cluster_id: impl Into<String>,
        vsphere_user: impl Into<String>,
        flavor: ClusterFlavor,
    ) -> Self {
        Self {
            cluster_type: "KUBERNETES".into(),
            cluster_id: cluster_id.into(),
            vsphere_user: vsphere_user.into(),
            cluster_flavor: Some(flavor),
            cluster_distribution: None,
            delete: None,
        }
    }
}

impl Default for ContainerCluster {
    fn default() -> Self {
        Self {
            cluster_type: "KUBERNETES".into(),
            cluster_id: String::new(),
            vsphere_user: String::new(),
            cluster_flavor: None,
            cluster_distribution: None,
            delete: None,
        }
    }
}

/// The kind of Kubernetes object an entity describes (govmomi: `CnsKubernetesEntityType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityType {
    /// `PERSISTENT_VOLUME`
    PersistentVolume,
    /// `PERSISTENT_VOLUME_CLAIM`
    PersistentVolumeClaim,
    /// `POD`
    Pod,
}

impl EntityType {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityType::PersistentVolume => "PERSISTENT_VOLUME",
            EntityType::PersistentVolumeClaim => "PERSISTENT_VOLUME_CLAIM",
            EntityType::Pod => "POD",
        }
    }

    /// Parses a wire value.
    pub fn from_wire(value: &str) -> Option<Self> {
        match value {
            "PERSISTENT_VOLUME" => Some(EntityType::PersistentVolume),
            "PERSISTENT_VOLUME_CLAIM" => Some(EntityType::PersistentVolumeClaim),
            "POD" => Some(EntityType::Pod),
            _ => None,
        }
    }
}

/// A label (govmomi: `KeyValue`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyValue {
    /// Label key (under 320 bytes).
    pub key: String,
    /// Label value (under 64 bytes).
    pub value: String,
}

impl KeyValue {
    /// A label.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A reference from one entity to another (govmomi: `CnsKubernetesEntityReference`).
#[doc(alias = "CnsKubernetesEntityReference")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntityReference {
    /// The referred entity's type.
    pub entity_type: EntityType,
    /// The referred entity's name.
    pub entity_name: String,
    /// The referred entity's namespace.
    pub namespace: Option<String>,
    /// The cluster of the referred entity.
    pub cluster_id: Option<String>,
}

/// Metadata of one Kubernetes object that uses a volume
/// (govmomi: `CnsKubernetesEntityMetadata`, sent with `xsi:type`).
#[doc(alias = "CnsKubernetesEntityMetadata")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntityMetadata {
    /// The object's name.
    pub entity_name: String,
    /// The object's labels.
    pub labels: Vec<KeyValue>,
    /// `Some(true)` removes this entity in an update.
    pub delete: Option<bool>,
    /// The cluster the object lives in.
    pub cluster_id: Option<String>,
    /// The object's kind.
    pub entity_type: EntityType,
    /// The object's namespace (claims and pods).
    pub namespace: Option<String>,
    /// Objects this one refers to (a claim refers to its PV, a pod to its claim).
    pub referred_entity: Vec<EntityReference>,
}

impl EntityMetadata {
    /// An entity of `entity_type` named `entity_name`, with no labels or references.
    pub fn new(entity_type: EntityType, entity_name: impl Into<String>) -> Self {
        Self {
            entity_name: entity_name.into(),
            labels: Vec::new(),
            delete: None,
            cluster_id: None,
            entity_type,
            namespace: None,
            referred_entity: Vec::new(),
        }
    }
}

/// The metadata of a volume (govmomi: `CnsVolumeMetadata`; not the `CnsVolumeMetadata` CRD).
#[doc(alias = "CnsVolumeMetadata")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeMetadata {
    /// The cluster that owns the volume (deprecated upstream but still required).
    pub container_cluster: ContainerCluster,
    /// The Kubernetes objects that use the volume.
    pub entity_metadata: Vec<EntityMetadata>,
    /// Every cluster that uses the volume; normally `[container_cluster]`.
    pub container_cluster_array: Vec<ContainerCluster>,
}

impl VolumeMetadata {
    /// Metadata naming `cluster` as owner and only user, with the given entities.
    pub fn for_cluster(cluster: ContainerCluster, entities: Vec<EntityMetadata>) -> Self {
        Self {
            container_cluster: cluster.clone(),
            entity_metadata: entities,
            container_cluster_array: vec![cluster],
        }
    }
}

/// What to create (govmomi: `CnsVolumeCreateSpec` with `CnsBlockBackingDetails`).
#[doc(alias = "CnsVolumeCreateSpec")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeCreateSpec {
    /// The volume name; by convention the PV name.
    pub name: String,
    /// `BLOCK` (the only type this crate creates) or `FILE`.
    pub volume_type: VolumeType,
    /// Candidate datastores; required unless `backing_disk_id` is set.
    pub datastores: Vec<MoRef>,
    /// Owner cluster and entities.
    pub metadata: VolumeMetadata,
    /// Size in MiB (omitted on the wire when 0).
    pub capacity_in_mb: i64,
    /// Registers an existing First Class Disk instead of creating one (static provisioning).
    pub backing_disk_id: Option<String>,
    /// Storage policy (SPBM profile) ID.
    pub profile_id: Option<String>,
}

/// New metadata for an existing volume (govmomi: `CnsVolumeMetadataUpdateSpec`).
#[doc(alias = "CnsVolumeMetadataUpdateSpec")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeMetadataUpdateSpec {
    /// The volume to update.
    pub volume_id: CnsVolumeId,
    /// The cluster and the entities to add, replace or (with `delete`) remove.
    pub metadata: VolumeMetadata,
}

/// Which volumes [`CnsClient::query_volume`](crate::CnsClient::query_volume) returns
/// (govmomi: `CnsQueryFilter`). Empty lists do not filter.
#[doc(alias = "CnsQueryFilter")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryFilter {
    /// Only these volume IDs.
    pub volume_ids: Vec<CnsVolumeId>,
    /// Only volumes with these names.
    pub names: Vec<String>,
    /// Only volumes of these container clusters.
    pub container_cluster_ids: Vec<String>,
}

impl QueryFilter {
    /// A filter on volume IDs.
    pub fn by_ids(ids: impl IntoIterator<Item = CnsVolumeId>) -> Self {
        Self {
            volume_ids: ids.into_iter().collect(),
            ..Self::default()
        }
    }

    /// A filter on volume names.
    pub fn by_names<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self {
            names: names.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }
}

/// A volume as CNS reports it (govmomi: `CnsVolume`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CnsVolume {
    /// The volume ID.
    pub volume_id: CnsVolumeId,
    /// URL of the datastore that holds the volume.
    pub datastore_url: Option<String>,
    /// The volume name.
    pub name: Option<String>,
    /// `BLOCK` or `FILE`.
    pub volume_type: Option<String>,
    /// The storage policy ID.
    pub storage_policy_id: Option<String>,
    /// Owner cluster and entities.
    pub metadata: Option<VolumeMetadata>,
    /// Size in MiB.
    pub capacity_in_mb: Option<i64>,
    /// The First Class Disk ID.
    pub backing_disk_id: Option<String>,
    /// Policy compliance, for example `compliant`.
    pub compliance_status: Option<String>,
    /// Health, for example `green`.
    pub health_status: Option<String>,
}
