//! Names of the objects a run creates.

/// The namespace of claims and `CnsVolumeMetadata` objects (and of the Lease).
pub const NAMESPACE: &str = "default";
/// The supervisor cluster ID: owner of every CNS volume the provisioners create.
pub const CLUSTER_ID: &str = "chaos-supervisor";
/// The guest cluster `CnsVolumeMetadata` objects speak for.
pub const GUEST_CLUSTER: &str = "chaos-guest";
/// Our provisioner name.
pub const PROVISIONER: &str = vsphere_cns::CSI_DRIVER;
/// The provisioner a re-created class may name instead.
pub const OTHER_PROVISIONER: &str = "example.com/other";
/// The simulator's datastore.
pub const DATASTORE_ID: &str = "datastore-101";
/// Its name.
pub const DATASTORE_NAME: &str = "ChaosDS";
/// Its URL, as classes name it.
pub const DATASTORE_URL: &str = "ds:///vmfs/volumes/chaos-datastore/";

/// Immediate binding, reclaim Delete.
pub const CLASS_IMMEDIATE: &str = "chaos-immediate";
/// WaitForFirstConsumer: claims carry a selected node.
pub const CLASS_WFFC: &str = "chaos-wffc";
/// Deleted and re-created (maybe with another provisioner) during the run.
pub const CLASS_VOLATILE: &str = "chaos-volatile";
/// Reclaim Retain.
pub const CLASS_RETAIN: &str = "chaos-retain";
/// Has a parameter the driver does not know.
pub const CLASS_BAD_PARAMETER: &str = "chaos-bad-parameter";
/// Never exists.
pub const CLASS_MISSING: &str = "chaos-missing";
/// The classes created at the start.
pub const CLASSES: &[&str] = &[
    CLASS_IMMEDIATE,
    CLASS_WFFC,
    CLASS_VOLATILE,
    CLASS_RETAIN,
    CLASS_BAD_PARAMETER,
];

/// The nodes created at the start.
pub const NODES: &[&str] = &["node-1", "node-2", "node-3"];

/// The name of claim number `n`.
#[must_use]
pub fn claim(n: usize) -> String {
    format!("claim-{n:03}")
}

/// The name of the static PV made for claim number `n`.
#[must_use]
pub fn static_pv(n: usize) -> String {
    format!("static-{n:03}")
}

/// The name of the CNS volume behind that static PV.
#[must_use]
pub fn static_volume(n: usize) -> String {
    format!("static-volume-{n:03}")
}

/// The name of the PV and CNS volume the provisioner makes for a claim.
#[must_use]
pub fn provisioned(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// The guest entity name a `CnsVolumeMetadata` object describes (unique per object).
#[must_use]
pub fn entity(object: &str) -> String {
    format!("guest-{object}")
}
