//! Where a volume may live: the accessibility requirements of `CreateVolume` and the node
//! affinity of the PV, as kubernetes-csi/external-provisioner computes them
//! (`GenerateAccessibilityRequirements` and `GenerateVolumeNodeAffinity`).
//!
//! The computation is [`requirement`], a pure function of the class's `allowedTopologies`,
//! the selected node's CSINode and Node, and (when it aggregates) the cluster's CSINodes and
//! Nodes. [`accessibility_requirements_for_claim`] reads those from the API server and maps
//! the outcome to a [`ProvisionError`].
//!
//! # Differences from upstream
//! - Upstream keeps the topology keys, node labels and requisite terms it computed for a
//!   claim in memory until the claim's `CreateVolume` ends (so that a retry after a timeout
//!   asks for the same topology even if the node is gone meanwhile). These functions keep no
//!   state: a caller that replays a `CreateVolume` keeps the request it sent.
//! - Upstream reads from informer caches; this reads from the API server at each call (a GET
//!   of the selected node's CSINode and Node, a LIST of Nodes carrying the topology keys when
//!   it aggregates, and a LIST of CSINodes for immediate binding).
//! - For immediate binding upstream takes the topology keys from a CSINode chosen at random
//!   among those that have keys for the driver; this takes the first one in the API's order
//!   (by name), so that two calls ask for the same thing.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, TopologySelectorTerm,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube_client::api::{Api, ListParams};
use provision_controller::ProvisionError;

use crate::csi::{Topology, TopologyRequirement};

#[cfg(test)]
mod tests;

/// How the sidecar computes the accessibility requirements of `CreateVolume` and the node
/// affinity of the PV (upstream's flags `--feature-gates Topology=...`, `--strict-topology`
/// and `--immediate-topology`).
///
/// `Default` turns everything off (no topology at all). Upstream's flag defaults are
/// `Topology=true` (the gate is GA), `--strict-topology=false` and
/// `--immediate-topology=true`; the binary parses its flags with those defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopologySettings {
    /// Topology is used: the `Topology` feature gate is on *and* the driver announces the
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS` plugin capability (upstream's
    /// `SupportsTopology`). When false, `CreateVolume` carries no accessibility
    /// requirements and the PV gets no node affinity.
    pub enabled: bool,
    /// `--strict-topology`: with a selected node (`WaitForFirstConsumer`), ask for the
    /// selected node's topology only, instead of every topology of the cluster that has the
    /// selected node's topology keys.
    pub strict: bool,
    /// `--immediate-topology`: without a selected node (`Immediate` binding) and without
    /// `allowedTopologies`, ask for a volume reachable from one of the topologies of the
    /// nodes the driver runs on; when false, ask for nothing.
    pub immediate: bool,
}

/// Why no accessibility requirement could be computed. Each names the node or the keys at
/// fault; [`ProvisionError::from`] gives the state upstream would give.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TopologyError {
    /// The selected node has no CSINode: the scheduler should pick another node.
    #[error("CSINode of selected node {node:?} not found")]
    CsiNodeNotFound { node: String },
    /// The selected node's CSINode lists no topology keys for the driver (the driver is not
    /// running on it, or has not registered yet).
    #[error(
        "no topology key found for node {node:?}: its CSINode has no topology keys for driver {driver:?}"
    )]
    NoTopologyKeys { node: String, driver: String },
    /// The selected node's Node object does not exist.
    #[error("selected node {node:?} not found")]
    NodeNotFound { node: String },
    /// The selected node lacks a label its CSINode names as a topology key.
    #[error(
        "selected node {node:?} has no label {key:?}, a topology key of driver {driver:?} on its CSINode"
    )]
    MissingLabel {
        node: String,
        key: String,
        driver: String,
    },
    /// Strict topology: the selected node's topology is not in the class's
    /// `allowedTopologies`.
    #[error(
        "topology {topology} of selected node {node:?} is not in the allowed topologies of the storage class"
    )]
    NotAllowed { node: String, topology: String },
    /// Immediate binding without `allowedTopologies`: no CSINode lists topology keys for the
    /// driver (the driver runs on no node yet).
    #[error("no available topology found: no CSINode has topology keys for driver {driver:?}")]
    NoKeysOnAnyNode { driver: String },
    /// No Node carries all the topology keys.
    #[error("topology keys {keys:?} were not found on any node")]
    NoNodeWithKeys { keys: Vec<String> },
    /// The selected node's topology matches none of the requisite topologies.
    #[error("topology {topology} of selected node {node:?} is not in the requisite topologies")]
    NotInRequisite { node: String, topology: String },
    /// The API server did not answer a read.
    #[error("could not {action}")]
    Api {
        action: String,
        #[source]
        source: kube_client::Error,
    },
}

/// The context upstream puts before the errors of this step in its events.
#[derive(Debug, thiserror::Error)]
#[error("error generating accessibility requirements")]
struct Generating(#[source] TopologyError);

impl From<TopologyError> for ProvisionError {
    /// As upstream: a selected node without a CSINode (a `NotFound` from its lister) is
    /// [`ProvisionError::Reschedule`], so the scheduler picks another node; everything else
    /// is [`ProvisionError::NoChange`] (upstream's `ProvisioningNoChange`): nothing was
    /// sent to the driver, and the claim is retried as it stands (a node whose driver has
    /// not registered yet, or whose labels are being set, may be fine at the next try).
    fn from(err: TopologyError) -> Self {
        match err {
            TopologyError::CsiNodeNotFound { .. } => ProvisionError::Reschedule(Box::new(err)),
            other => ProvisionError::NoChange(Box::new(Generating(other))),
        }
    }
}

/// The selected node and what the API server has for it (`None`: not found).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SelectedNode<'a> {
    /// The `volume.kubernetes.io/selected-node` annotation.
    pub(crate) name: &'a str,
    /// Its CSINode.
    pub(crate) csi_node: Option<&'a CSINode>,
    /// Its Node.
    pub(crate) node: Option<&'a Node>,
}

/// What [`requirement`] reads of the cluster.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClusterView<'a> {
    /// The selected node, for `WaitForFirstConsumer` classes.
    pub(crate) selected: Option<SelectedNode<'a>>,
    /// Every CSINode (read for immediate binding without `allowedTopologies`).
    pub(crate) csi_nodes: &'a [CSINode],
    /// The Nodes (read when aggregating; those without every topology key are skipped).
    pub(crate) nodes: &'a [Node],
}

/// Which lists [`requirement`] reads, so that its caller fetches only those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListsNeeded {
    pub(crate) csi_nodes: bool,
    pub(crate) nodes: bool,
}

impl ListsNeeded {
    /// For a class with `allowed` topologies, with or without a selected node.
    pub(crate) fn of(
        allowed: &[TopologySelectorTerm],
        selected: bool,
        settings: TopologySettings,
    ) -> Self {
        let aggregates = settings.enabled
            && allowed.is_empty()
            && if selected {
                !settings.strict
            } else {
                settings.immediate
            };
        Self {
            csi_nodes: aggregates && !selected,
            nodes: aggregates,
        }
    }
}

/// The accessibility requirements of `CreateVolume` for claim `claim_name` of `class`:
/// `None` when topology is off, when neither the class nor a selected node limits where the
/// volume goes and immediate topology is off, or when `allowedTopologies` has no values.
///
/// Reads the selected node's CSINode and Node, and the lists [`ListsNeeded`] names (Nodes
/// by a label selector on the topology keys), then computes [`requirement`].
///
/// # Errors
/// [`ProvisionError::Reschedule`] when the selected node has no CSINode;
/// [`ProvisionError::NoChange`] for everything else that stops the computation (a failed
/// read, a node without the driver's topology keys or labels, see [`TopologyError`]).
pub(crate) async fn accessibility_requirements_for_claim(
    client: &kube_client::Client,
    driver: &str,
    class: &StorageClass,
    claim_name: &str,
    selected_node: Option<&str>,
    settings: TopologySettings,
) -> Result<Option<TopologyRequirement>, ProvisionError> {
    if !settings.enabled {
        return Ok(None);
    }
    let allowed = class.allowed_topologies.as_deref().unwrap_or_default();
    let selected_node = selected_node.filter(|name| !name.is_empty());

    let mut selected_csi_node = None;
    let mut selected_node_object = None;
    if let Some(name) = selected_node {
        selected_csi_node = get::<CSINode>(client, "CSINode", name).await?;
        let has_keys = selected_csi_node
            .as_ref()
            .is_some_and(|csi_node| !driver_keys(csi_node, driver).is_empty());
        if has_keys {
            selected_node_object = get::<Node>(client, "Node", name).await?;
        }
    }

    let needed = ListsNeeded::of(allowed, selected_node.is_some(), settings);
    let csi_nodes = if needed.csi_nodes {
        list::<CSINode>(client, "CSINodes", &ListParams::default()).await?
    } else {
        Vec::new()
    };
    let keys = aggregation_keys(driver, selected_csi_node.as_ref(), &csi_nodes);
    let nodes = if needed.nodes && !keys.is_empty() {
        let params = ListParams::default().labels(&keys.join(","));
        list::<Node>(client, "Nodes", &params).await?
    } else {
        Vec::new()
    };

    let view = ClusterView {
        selected: selected_node.map(|name| SelectedNode {
            name,
            csi_node: selected_csi_node.as_ref(),
            node: selected_node_object.as_ref(),
        }),
        csi_nodes: &csi_nodes,
        nodes: &nodes,
    };
    Ok(requirement(driver, claim_name, allowed, &view, settings)?)
}

async fn get<K>(
    client: &kube_client::Client,
    kind: &str,
    name: &str,
) -> Result<Option<K>, TopologyError>
where
    K: kube_client::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    Api::<K>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(|source| TopologyError::Api {
            action: format!("get {kind} {name:?}"),
            source,
        })
}

async fn list<K>(
    client: &kube_client::Client,
    kind: &str,
    params: &ListParams,
) -> Result<Vec<K>, TopologyError>
where
    K: kube_client::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let action = match &params.label_selector {
        Some(selector) => format!("list {kind} with labels {selector:?}"),
        None => format!("list {kind}"),
    };
    Api::<K>::all(client.clone())
        .list(params)
        .await
        .map(|list| list.items)
        .map_err(|source| TopologyError::Api { action, source })
}

/// One topology as a sorted list of (key, value) pairs: an AND of labels (upstream's
/// `topologyTerm`). A list, not a map, because `allowedTopologies` may repeat a key.
type Term = Vec<(String, String)>;

/// The accessibility requirements for claim `claim_name`, from the class's `allowed`
/// topologies and what `view` holds of the cluster (upstream's
/// `GenerateAccessibilityRequirements`).
///
/// - **Requisite**: with a selected node and strict topology, the selected node's topology
///   (which must be in `allowed`, if any); else the terms of `allowed` (each term's values
///   multiplied out); else, with a selected node or immediate topology, every distinct
///   topology of the Nodes that carry the topology keys (the selected node's CSINode's keys
///   for the driver, or for immediate binding the first CSINode that has keys for it);
///   else nothing. Sorted (fewer keys first, then by key and value) without duplicates.
/// - **Preferred**: the requisite list rotated to start at the first term the selected
///   node's topology contains (strict: the requisite itself); without a selected node, at
///   the position derived from the claim's name ([`spread_offset`]).
///
/// # Errors
/// See [`TopologyError`]; the checks of the selected node come first.
pub(crate) fn requirement(
    driver: &str,
    claim_name: &str,
    allowed: &[TopologySelectorTerm],
    view: &ClusterView<'_>,
    settings: TopologySettings,
) -> Result<Option<TopologyRequirement>, TopologyError> {
    if !settings.enabled {
        return Ok(None);
    }
    let selected = view.selected.filter(|s| !s.name.is_empty());

    let mut selected_topology = None;
    let mut requisite: Vec<Term> = Vec::new();
    if let Some(node) = selected {
        let topology = selected_node_topology(driver, node)?;
        if settings.strict {
            if !allowed.is_empty() && !flatten(allowed).iter().any(|t| is_subset(t, &topology)) {
                return Err(TopologyError::NotAllowed {
                    node: node.name.to_string(),
                    topology: describe(&topology),
                });
            }
            requisite.push(topology.clone());
        }
        selected_topology = Some((node, topology));
    }

    if requisite.is_empty() {
        if !allowed.is_empty() {
            requisite = flatten(allowed);
        } else if selected.is_none() && !settings.immediate {
            return Ok(None);
        } else {
            let keys = aggregation_keys(driver, selected.and_then(|s| s.csi_node), view.csi_nodes);
            if keys.is_empty() {
                return Err(TopologyError::NoKeysOnAnyNode {
                    driver: driver.to_string(),
                });
            }
            requisite = view
                .nodes
                .iter()
                .filter_map(|node| term_of(node, keys).ok())
                .collect();
            if requisite.is_empty() {
                return Err(TopologyError::NoNodeWithKeys {
                    keys: keys.to_vec(),
                });
            }
        }
    }
    if requisite.is_empty() {
        // `allowedTopologies` without any value: as if topology were off.
        return Ok(None);
    }
    requisite.sort_by(compare);
    requisite.dedup();

    let preferred = match &selected_topology {
        Some(_) if settings.strict => requisite.clone(),
        Some((node, topology)) => {
            let Some(start) = requisite.iter().position(|t| is_subset(t, topology)) else {
                return Err(TopologyError::NotInRequisite {
                    node: node.name.to_string(),
                    topology: describe(topology),
                });
            };
            rotated(&requisite, start)
        }
        None => {
            let start = spread_offset(claim_name) % requisite.len() as u32;
            rotated(&requisite, start as usize)
        }
    };
    Ok(Some(TopologyRequirement {
        requisite: to_topologies(requisite),
        preferred: to_topologies(preferred),
    }))
}

/// The selected node's topology: its Node's values of the keys its CSINode lists for the
/// driver.
fn selected_node_topology(driver: &str, node: SelectedNode<'_>) -> Result<Term, TopologyError> {
    let Some(csi_node) = node.csi_node else {
        return Err(TopologyError::CsiNodeNotFound {
            node: node.name.to_string(),
        });
    };
    let keys = driver_keys(csi_node, driver);
    if keys.is_empty() {
        return Err(TopologyError::NoTopologyKeys {
            node: node.name.to_string(),
            driver: driver.to_string(),
        });
    }
    let Some(object) = node.node else {
        return Err(TopologyError::NodeNotFound {
            node: node.name.to_string(),
        });
    };
    term_of(object, keys).map_err(|key| TopologyError::MissingLabel {
        node: node.name.to_string(),
        key: key.to_string(),
        driver: driver.to_string(),
    })
}

/// The keys Nodes are aggregated by: the selected node's (from its CSINode), or without a
/// selected node those of the first CSINode with keys for the driver.
fn aggregation_keys<'a>(
    driver: &str,
    selected: Option<&'a CSINode>,
    csi_nodes: &'a [CSINode],
) -> &'a [String] {
    match selected {
        Some(csi_node) => driver_keys(csi_node, driver),
        None => csi_nodes
            .iter()
            .map(|csi_node| driver_keys(csi_node, driver))
            .find(|keys| !keys.is_empty())
            .unwrap_or_default(),
    }
}

/// The topology keys of the first entry for `driver` on `csi_node`.
fn driver_keys<'a>(csi_node: &'a CSINode, driver: &str) -> &'a [String] {
    csi_node
        .spec
        .drivers
        .iter()
        .find(|entry| entry.name == driver)
        .and_then(|entry| entry.topology_keys.as_deref())
        .unwrap_or_default()
}

/// `node`'s values of `keys`, or the first key it has no label for.
fn term_of<'k>(node: &Node, keys: &'k [String]) -> Result<Term, &'k str> {
    let labels = node.metadata.labels.as_ref();
    let mut term = keys
        .iter()
        .map(|key| match labels.and_then(|l| l.get(key)) {
            Some(value) => Ok((key.clone(), value.clone())),
            None => Err(key.as_str()),
        })
        .collect::<Result<Term, _>>()?;
    term.sort();
    Ok(term)
}

/// The terms of `allowedTopologies`: within a term, each expression's values multiplied out
/// over the other expressions (`zone in (a, b)` and `rack in (x)` give `a/x` and `b/x`).
/// An expression without values drops what came before it in its term, as upstream.
fn flatten(allowed: &[TopologySelectorTerm]) -> Vec<Term> {
    let mut all = Vec::new();
    for selector in allowed {
        let mut terms: Vec<Term> = Vec::new();
        for expression in selector.match_label_expressions.iter().flatten() {
            let mut next = Vec::with_capacity(expression.values.len() * terms.len().max(1));
            for value in &expression.values {
                let pair = (expression.key.clone(), value.clone());
                if terms.is_empty() {
                    next.push(vec![pair]);
                } else {
                    next.extend(terms.iter().map(|term| {
                        let mut term = term.clone();
                        term.push(pair.clone());
                        term
                    }));
                }
            }
            terms = next;
        }
        all.extend(terms);
    }
    for term in &mut all {
        term.sort();
    }
    all
}

/// Fewer pairs first, then pair by pair (key, then value).
fn compare(a: &Term, b: &Term) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Whether every pair of `part` is in `whole`, both sorted: walks `whole` once, matching the
/// pairs of `part` in order; a key of `part` with another value in `whole` is a mismatch.
fn is_subset(part: &Term, whole: &Term) -> bool {
    let mut wanted = part.iter().peekable();
    for (key, value) in whole {
        let Some((want_key, want_value)) = wanted.peek() else {
            return true;
        };
        if want_key != key {
            continue;
        }
        if want_value != value {
            return false;
        }
        wanted.next();
    }
    wanted.peek().is_none()
}

fn rotated(terms: &[Term], start: usize) -> Vec<Term> {
    let mut terms = terms.to_vec();
    terms.rotate_left(start);
    terms
}

fn to_topologies(terms: Vec<Term>) -> Vec<Topology> {
    terms
        .into_iter()
        .filter(|term| !term.is_empty())
        .map(|term| Topology {
            segments: term.into_iter().collect::<BTreeMap<_, _>>(),
        })
        .collect()
}

fn describe(term: &Term) -> String {
    let pairs: Vec<String> = term.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", pairs.join(", "))
}

/// Where the preferred list of an immediate-binding claim starts (before taking it modulo
/// the list's length): Kubernetes' StatefulSet spreading, as upstream. A name ending in
/// `-<number>` (`data-web-2`) hashes only the part between its last two dashes (`web`) and
/// adds the number, so the replicas of a StatefulSet go round the topologies and a
/// replica's claims land together; other names hash whole. The hash is 32-bit FNV-1.
///
/// Upstream draws a random start for an empty name; this hashes the empty name.
pub(crate) fn spread_offset(claim_name: &str) -> u32 {
    let mut base = claim_name;
    let mut index = 0;
    if let Some((prefix, suffix)) = claim_name.rsplit_once('-') {
        let digits = !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit());
        if let Some(id) = digits.then(|| suffix.parse::<u32>().ok()).flatten() {
            index = id;
            base = prefix.rsplit_once('-').map_or(prefix, |(_, set)| set);
        }
    }
    fnv1_32(base.as_bytes()).wrapping_add(index)
}

fn fnv1_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash: u32, &byte| {
        hash.wrapping_mul(0x0100_0193) ^ u32::from(byte)
    })
}

/// The node affinity of a PV whose volume is reachable from `accessible` (upstream's
/// `GenerateVolumeNodeAffinity`): one node selector term per topology (any of them will
/// do), each with one `In` requirement per segment (all of them must hold). `None` for an
/// empty list.
///
/// Call it only when [`TopologySettings::enabled`] holds: upstream sets no affinity
/// otherwise.
///
/// Upstream skips topologies without segments but still returns an affinity when all of
/// them are empty, which the API server rejects (a required node selector needs a term);
/// this returns `None` then, as for an empty list.
pub(crate) fn node_affinity(accessible: &[Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = accessible
        .iter()
        .filter(|topology| !topology.segments.is_empty())
        .map(|topology| NodeSelectorTerm {
            match_expressions: Some(
                topology
                    .segments
                    .iter()
                    .map(|(key, value)| NodeSelectorRequirement {
                        key: key.clone(),
                        operator: "In".to_string(),
                        values: Some(vec![value.clone()]),
                    })
                    .collect(),
            ),
            match_fields: None,
        })
        .collect();
    if terms.is_empty() {
        return None;
    }
    Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}
