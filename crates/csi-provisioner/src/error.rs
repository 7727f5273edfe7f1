//! [`CsiError`]: why the sidecar could not build a CSI request, or why the driver's answer
//! is refused. Each message is a sentence naming the claim, class, secret or volume; none
//! carries a secret's value.

use crate::csi::{Code, Status};

/// Why a claim could not be provisioned, or a volume deleted, by the CSI sidecar.
///
/// Wrapped in a [`provision_controller::ProvisionError`] (or
/// [`provision_controller::DeleteError`]) whose variant tells the controller what happens
/// next; the message lands in the claim's `ProvisioningFailed` event.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CsiError {
    /// The claim asks for its data from a snapshot or another claim.
    #[error(
        "claim {claim} asks for its data from {kind} {name:?}: clones and snapshots are not supported by this sidecar yet, so no volume is made (an empty one would lose the data asked for)"
    )]
    DataSourceUnsupported {
        /// `namespace/name` of the claim.
        claim: String,
        /// `VolumeSnapshot` or `PersistentVolumeClaim`.
        kind: String,
        /// The source's name.
        name: String,
    },
    /// The claim's data source names another namespace (upstream's
    /// `CrossNamespaceVolumeDataSource`, off by default there).
    #[error(
        "claim {claim} names a data source in namespace {namespace:?}: cross-namespace data sources are not supported by this sidecar"
    )]
    CrossNamespaceDataSource {
        /// `namespace/name` of the claim.
        claim: String,
        /// The namespace the source is in.
        namespace: String,
    },
    /// The claim's data source has no name.
    #[error("claim {claim} names a {kind} data source without a name")]
    DataSourceWithoutName {
        /// `namespace/name` of the claim.
        claim: String,
        /// The source's kind.
        kind: String,
    },
    /// The claim names a VolumeAttributesClass.
    #[error(
        "claim {claim} names VolumeAttributesClass {class:?}: VolumeAttributesClasses are not supported by this sidecar yet, so no volume is made"
    )]
    VolumeAttributesClassUnsupported {
        /// `namespace/name` of the claim.
        claim: String,
        /// The VolumeAttributesClass's name.
        class: String,
    },
    /// The claim has a label selector (static binding only).
    #[error("claim {claim} has a selector, which dynamic provisioning does not support")]
    Selector {
        /// `namespace/name` of the claim.
        claim: String,
    },
    /// The claim's storage request is not a quantity.
    #[error("claim {claim} requests storage {value:?}, which is not a quantity")]
    BadRequest {
        /// `namespace/name` of the claim.
        claim: String,
        /// The request as written.
        value: String,
    },
    /// The claim names an access mode CSI has no counterpart for.
    #[error("claim {claim} asks for access mode {mode:?}, which CSI does not support")]
    AccessMode {
        /// `namespace/name` of the claim.
        claim: String,
        /// The access mode.
        mode: String,
    },
    /// The class sets the filesystem type twice.
    #[error(
        "storage class {class:?} sets the filesystem type with both \"fstype\" and \"csi.storage.k8s.io/fstype\""
    )]
    FsTypeTwice {
        /// The class's name.
        class: String,
    },
    /// The class has a `csi.storage.k8s.io/` parameter the sidecar does not know.
    #[error(
        "storage class {class:?} has the unknown parameter {key:?} with the reserved prefix csi.storage.k8s.io/"
    )]
    UnknownPrefixedParameter {
        /// The class's name.
        class: String,
        /// The parameter.
        key: String,
    },
    /// The class's secret parameters are inconsistent or resolve to an invalid name.
    #[error("storage class {class:?}: {which} secret: {reason}")]
    SecretReference {
        /// The class's name.
        class: String,
        /// `provisioner`, `node-stage`, ... (the parameters' infix).
        which: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The secret could not be read.
    #[error("reading secret {namespace}/{name} failed")]
    SecretRead {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The client's error.
        #[source]
        source: kube_client::Error,
    },
    /// A secret's value is not UTF-8 text (CSI secrets are strings).
    #[error("the value of key {key:?} of secret {namespace}/{name} is not UTF-8 text")]
    SecretNotText {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The key whose value is not text.
        key: String,
    },
    /// A CSI call failed.
    #[error("{call} of {target} failed with {code:?}: {message}", code = .status.code(), message = .status.message())]
    Call {
        /// `CreateVolume`, `DeleteVolume`.
        call: &'static str,
        /// `volume "pvc-..."` (the PV name or volume id).
        target: String,
        /// The driver's answer.
        status: Status,
    },
    /// The driver answered CreateVolume without a volume, or with an empty volume id.
    #[error("CSI driver {driver} answered CreateVolume {name:?} without a volume id")]
    NoVolume {
        /// The driver's name.
        driver: String,
        /// The CreateVolume name.
        name: String,
    },
    /// The driver made a volume smaller than the claim asked for.
    #[error(
        "CSI driver {driver} made volume {name:?} of {made} bytes, less than the {requested} bytes requested; {cleanup}"
    )]
    TooSmall {
        /// The driver's name.
        driver: String,
        /// The CreateVolume name.
        name: String,
        /// The size the driver answered.
        made: i64,
        /// The size asked for.
        requested: i64,
        /// What became of the volume: deleted again, or why it could not be.
        cleanup: String,
    },
    /// The volume is not a CSI volume.
    #[error("persistentvolume {volume} has no CSI volume source")]
    NotCsi {
        /// The PV's name.
        volume: String,
    },
    /// The volume is still attached to a node (a VolumeAttachment names it).
    #[error("persistentvolume {volume} is still attached to node {node}")]
    Attached {
        /// The PV's name.
        volume: String,
        /// The node it is attached to.
        node: String,
    },
    /// The VolumeAttachments could not be listed.
    #[error("listing volumeattachments to check persistentvolume {volume} failed")]
    ListAttachments {
        /// The PV's name.
        volume: String,
        /// The client's error.
        #[source]
        source: kube_client::Error,
    },
}

impl CsiError {
    /// The gRPC code of a failed call, if this is one.
    #[must_use]
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Call { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}
