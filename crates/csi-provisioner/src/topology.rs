//! Topology: the accessibility requirements of a CreateVolume request and the node
//! affinity of the PV made from its answer.
//!
//! placeholder: the topology branch replaces this file.

use k8s_openapi::api::{core::v1::VolumeNodeAffinity, storage::v1::StorageClass};
use provision_controller::ProvisionError;

use crate::csi::{Topology, TopologyRequirement};

/// How the sidecar handles topology (upstream's `--feature-gates Topology=...`,
/// `--strict-topology`, `--immediate-topology`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopologySettings {
    /// Topology is used at all (upstream's `Topology` feature gate), for a driver that
    /// reports `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    pub enabled: bool,
    /// Late binding: only the selected node's topology is requisite (`--strict-topology`).
    pub strict: bool,
    /// Immediate binding: the topologies of every node with the driver are requisite
    /// (`--immediate-topology`); off, no requirement is sent.
    pub immediate: bool,
}

/// The accessibility requirements of a CreateVolume request for `class` and the selected
/// node.
#[allow(clippy::unused_async)]
pub(crate) async fn accessibility_requirements(
    _client: &kube_client::Client,
    _driver: &str,
    _class: &StorageClass,
    _selected_node: Option<&str>,
    _settings: TopologySettings,
) -> Result<Option<TopologyRequirement>, ProvisionError> {
    Ok(None)
}

/// The PV's node affinity from the volume's `accessible_topology`.
pub(crate) fn node_affinity(_accessible: &[Topology]) -> Option<VolumeNodeAffinity> {
    None
}
