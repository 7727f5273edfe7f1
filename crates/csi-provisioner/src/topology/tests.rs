//! Tables after upstream's topology_test.go (its cases, not its code), then the API wrapper
//! against kube-sim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, TopologySelectorLabelRequirement, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::api::{Api, PostParams};
use provision_controller::ProvisionError;

use super::*;

const DRIVER: &str = "com.example.csi/test-driver";
const ZONE: &str = "com.example.csi/zone";
const RACK: &str = "com.example.csi/rack";
const DISK: &str = "com.example.csi/disk";

type Pairs = &'static [(&'static str, &'static str)];

/// `node-{i}` with `labels`, plus a label of another driver on every node.
fn node(i: usize, labels: Pairs) -> Node {
    let mut map: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    map.insert("net.example.storage/rack".into(), "rack1".into());
    Node {
        metadata: ObjectMeta {
            name: Some(format!("node-{i}")),
            labels: Some(map),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// The CSINode of `node-{i}`: another driver, and [`DRIVER`] with `keys` unless `None`
/// (`Some(&[])`: registered without topology keys).
fn csi_node(i: usize, keys: Option<&[&str]>) -> CSINode {
    let name = format!("node-{i}");
    let entry = |driver: &str, keys: Option<Vec<String>>| CSINodeDriver {
        name: driver.to_string(),
        node_id: name.clone(),
        topology_keys: keys,
        allocatable: None,
    };
    let mut drivers = vec![entry(
        "net.example.storage/other-driver",
        Some(vec!["net.example.storage/rack".into()]),
    )];
    if let Some(keys) = keys {
        let keys = (!keys.is_empty()).then(|| keys.iter().map(|k| k.to_string()).collect());
        drivers.insert(0, entry(DRIVER, keys));
    }
    CSINode {
        metadata: ObjectMeta {
            name: Some(name),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec { drivers },
        ..CSINode::default()
    }
}

/// `allowedTopologies`: terms of (key, values) expressions.
fn allowed(terms: &[&[(&str, &[&str])]]) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|expressions| TopologySelectorTerm {
            match_label_expressions: Some(
                expressions
                    .iter()
                    .map(|(key, values)| TopologySelectorLabelRequirement {
                        key: key.to_string(),
                        values: values.iter().map(|v| v.to_string()).collect(),
                    })
                    .collect(),
            ),
        })
        .collect()
}

fn pairs(topologies: &[Topology]) -> Vec<Vec<(String, String)>> {
    topologies
        .iter()
        .map(|t| t.segments.clone().into_iter().collect())
        .collect()
}

fn owned(topologies: &[Pairs]) -> Vec<Vec<(String, String)>> {
    topologies
        .iter()
        .map(|t| {
            t.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn kind(err: &TopologyError) -> &'static str {
    match err {
        TopologyError::CsiNodeNotFound { .. } => "CsiNodeNotFound",
        TopologyError::NoTopologyKeys { .. } => "NoTopologyKeys",
        TopologyError::NodeNotFound { .. } => "NodeNotFound",
        TopologyError::MissingLabel { .. } => "MissingLabel",
        TopologyError::NotAllowed { .. } => "NotAllowed",
        TopologyError::NoKeysOnAnyNode { .. } => "NoKeysOnAnyNode",
        TopologyError::NoNodeWithKeys { .. } => "NoNodeWithKeys",
        TopologyError::NotInRequisite { .. } => "NotInRequisite",
        TopologyError::Api { .. } => "Api",
    }
}

#[derive(Debug)]
enum Want {
    Nothing,
    Topology {
        requisite: &'static [Pairs],
        preferred: &'static [Pairs],
    },
    Error(&'static str),
}

struct Case {
    name: &'static str,
    allowed: Vec<TopologySelectorTerm>,
    /// Labels of node-0, node-1, ...
    nodes: &'static [Pairs],
    /// The CSINodes of node-0, node-1, ... (see [`csi_node`]); fewer than nodes is fine.
    csi_nodes: &'static [Option<&'static [&'static str]>],
    /// Whether node-0 is the selected node (it may have no Node or CSINode).
    selected: bool,
    claim: &'static str,
    /// `None`: both.
    strict: Option<bool>,
    immediate: Option<bool>,
    want: Want,
}

impl Case {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            allowed: Vec::new(),
            nodes: &[],
            csi_nodes: &[],
            selected: false,
            claim: "testpvc",
            strict: None,
            immediate: None,
            want: Want::Nothing,
        }
    }
}

const Z1: Pairs = &[(ZONE, "zone1")];
const Z2: Pairs = &[(ZONE, "zone2")];
const Z3: Pairs = &[(ZONE, "zone3")];
const ZK: &[&str] = &[ZONE];
const ZRK: &[&str] = &[ZONE, RACK];
// Two keys, sorted by key: rack before zone.
const A1: Pairs = &[(RACK, "rackA"), (ZONE, "zone1")];
const A2: Pairs = &[(RACK, "rackA"), (ZONE, "zone2")];
const B1: Pairs = &[(RACK, "rackB"), (ZONE, "zone1")];
const B2: Pairs = &[(RACK, "rackB"), (ZONE, "zone2")];
const C3: Pairs = &[(RACK, "rackC"), (ZONE, "zone3")];
const D4: Pairs = &[(RACK, "rackD"), (ZONE, "zone4")];
const FOUR_RACKS: &[Pairs] = &[
    &[(ZONE, "zone1"), (RACK, "rackA")],
    &[(ZONE, "zone2"), (RACK, "rackB")],
    &[(ZONE, "zone3"), (RACK, "rackC")],
    &[(ZONE, "zone4"), (RACK, "rackD")],
];
const FOUR_CSI_NODES: &[Option<&[&str]>] = &[Some(ZRK), Some(ZRK), Some(ZRK), Some(ZRK)];
const THREE_RACKS: &[Pairs] = &[
    &[(ZONE, "zone2"), (RACK, "rackA")],
    &[(ZONE, "zone1"), (RACK, "rackA")],
    &[(ZONE, "zone1"), (RACK, "rackB")],
];
const THREE_CSI_NODES: &[Option<&[&str]>] = &[Some(ZRK), Some(ZRK), Some(ZRK)];

fn cases() -> Vec<Case> {
    let zones_12 = || allowed(&[&[(ZONE, &["zone1", "zone2"]), (RACK, &["rackA", "rackB"])]]);
    vec![
        // Aggregation (no allowedTopologies), upstream's TestTopologyAggregation.
        Case {
            nodes: &[Z1, Z1, Z1],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            immediate: Some(true),
            want: Want::Topology {
                requisite: &[Z1],
                preferred: &[Z1],
            },
            ..Case::new("immediate: same keys and values across the cluster")
        },
        Case {
            nodes: &[Z1, Z1, Z1],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            immediate: Some(false),
            want: Want::Nothing,
            ..Case::new("immediate topology off: no requirement")
        },
        Case {
            nodes: &[Z1, Z1, Z1],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            selected: true,
            want: Want::Topology {
                requisite: &[Z1],
                preferred: &[Z1],
            },
            ..Case::new("selected node: same keys and values across the cluster")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            immediate: Some(true),
            // "testpvc" hashes to an even number: the rotation starts at 0 of 2.
            want: Want::Topology {
                requisite: &[Z1, Z2],
                preferred: &[Z1, Z2],
            },
            ..Case::new("immediate: different values across the cluster")
        },
        Case {
            nodes: &[Z2, Z1, Z2],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            selected: true,
            strict: Some(false),
            want: Want::Topology {
                requisite: &[Z1, Z2],
                preferred: &[Z2, Z1],
            },
            ..Case::new("selected node: different values, preferred starts at the node's")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            selected: true,
            strict: Some(true),
            want: Want::Topology {
                requisite: &[Z1],
                preferred: &[Z1],
            },
            ..Case::new("strict: only the selected node's topology")
        },
        Case {
            nodes: &[Z1, A1, A1],
            csi_nodes: &[Some(ZK), Some(ZRK), Some(ZRK)],
            selected: true,
            want: Want::Topology {
                requisite: &[Z1],
                preferred: &[Z1],
            },
            ..Case::new("selected node: its keys, not the other nodes'")
        },
        Case {
            nodes: &[],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            immediate: Some(true),
            want: Want::Error("NoNodeWithKeys"),
            ..Case::new("immediate: no nodes")
        },
        Case {
            nodes: &[&[("com.example.csi/foo", "bar")]],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            immediate: Some(true),
            want: Want::Error("NoNodeWithKeys"),
            ..Case::new("immediate: no node has the key")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[],
            immediate: Some(true),
            want: Want::Error("NoKeysOnAnyNode"),
            ..Case::new("immediate: no CSINodes")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[],
            immediate: Some(false),
            want: Want::Nothing,
            ..Case::new("immediate topology off: no CSINodes is no error")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[Some(&[]), Some(&[]), Some(&[])],
            immediate: Some(true),
            want: Want::Error("NoKeysOnAnyNode"),
            ..Case::new("immediate: the driver registered without keys")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[None, None, None],
            immediate: Some(true),
            want: Want::Error("NoKeysOnAnyNode"),
            ..Case::new("immediate: the driver runs on no node")
        },
        Case {
            nodes: &[
                &[("com.example.another/zone", "zone1")],
                &[("com.example.another/zone", "zone2")],
                Z3,
            ],
            csi_nodes: &[Some(&[]), Some(&[]), Some(ZK)],
            immediate: Some(true),
            want: Want::Topology {
                requisite: &[Z3],
                preferred: &[Z3],
            },
            ..Case::new("immediate: one node has been upgraded")
        },
        Case {
            nodes: &[Z1, Z2, Z3],
            csi_nodes: &[Some(&[]), Some(&[]), Some(ZK)],
            immediate: Some(true),
            // "testpvc" hashes to 2 modulo 3.
            want: Want::Topology {
                requisite: &[Z1, Z2, Z3],
                preferred: &[Z3, Z1, Z2],
            },
            ..Case::new("immediate: node labels exist where the driver has no keys yet")
        },
        Case {
            nodes: &[&[("com.example.csi/foo", "bar")]],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            selected: true,
            want: Want::Error("MissingLabel"),
            ..Case::new("selected node lacks the key's label")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[],
            selected: true,
            want: Want::Error("CsiNodeNotFound"),
            ..Case::new("selected node without a CSINode")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[Some(&[]), Some(&[]), Some(&[])],
            selected: true,
            want: Want::Error("NoTopologyKeys"),
            ..Case::new("selected node: the driver registered without keys")
        },
        Case {
            nodes: &[Z1, Z2, Z2],
            csi_nodes: &[None, Some(ZK), Some(ZK)],
            selected: true,
            want: Want::Error("NoTopologyKeys"),
            ..Case::new("selected node: the driver is missing from its CSINode")
        },
        Case {
            nodes: &[],
            csi_nodes: &[Some(ZK)],
            selected: true,
            want: Want::Error("NodeNotFound"),
            ..Case::new("selected node: CSINode without a Node")
        },
        // allowedTopologies, upstream's TestPreferredTopologies.
        Case {
            allowed: zones_12(),
            nodes: THREE_RACKS,
            csi_nodes: THREE_CSI_NODES,
            selected: true,
            strict: Some(false),
            want: Want::Topology {
                requisite: &[A1, A2, B1, B2],
                preferred: &[A2, B1, B2, A1],
            },
            ..Case::new("allowed: values multiplied out, preferred from the node's")
        },
        Case {
            allowed: zones_12(),
            nodes: THREE_RACKS,
            csi_nodes: THREE_CSI_NODES,
            selected: true,
            strict: Some(true),
            want: Want::Topology {
                requisite: &[A2],
                preferred: &[A2],
            },
            ..Case::new("allowed, strict: only the node's topology")
        },
        Case {
            allowed: zones_12(),
            nodes: THREE_RACKS,
            csi_nodes: &[],
            selected: true,
            want: Want::Error("CsiNodeNotFound"),
            ..Case::new("allowed: selected node without a CSINode")
        },
        Case {
            allowed: zones_12(),
            nodes: THREE_RACKS,
            csi_nodes: &[Some(&["com.example.csi/foo", RACK])],
            selected: true,
            want: Want::Error("MissingLabel"),
            ..Case::new("allowed: the CSINode's key is not a label of the node")
        },
        Case {
            nodes: THREE_RACKS,
            csi_nodes: THREE_CSI_NODES,
            selected: true,
            strict: Some(false),
            want: Want::Topology {
                requisite: &[A1, A2, B1],
                preferred: &[A2, B1, A1],
            },
            ..Case::new("aggregation with two keys")
        },
        Case {
            nodes: &[&[], &[], &[]],
            csi_nodes: &[Some(&[]), Some(&[]), Some(&[])],
            selected: true,
            want: Want::Error("NoTopologyKeys"),
            ..Case::new("aggregation without any topology")
        },
        Case {
            allowed: allowed(&[&[(ZONE, &["zone1"])]]),
            nodes: &[Z2, Z1, Z1],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            selected: true,
            strict: Some(false),
            want: Want::Error("NotInRequisite"),
            ..Case::new("allowed: the selected node's topology is not allowed")
        },
        Case {
            allowed: allowed(&[&[(ZONE, &["zone1"])]]),
            nodes: &[Z2, Z1, Z1],
            csi_nodes: &[Some(ZK), Some(ZK), Some(ZK)],
            selected: true,
            strict: Some(true),
            want: Want::Error("NotAllowed"),
            ..Case::new("allowed, strict: the selected node's topology is not allowed")
        },
        Case {
            allowed: allowed(&[&[(DISK, &["ssd"]), (ZONE, &["zone1"])]]),
            nodes: &[
                &[(ZONE, "zone1"), (RACK, "rack1"), (DISK, "ssd")],
                &[(ZONE, "zone2"), (RACK, "rack2"), (DISK, "ssd")],
            ],
            csi_nodes: &[Some(&[ZONE, RACK, DISK]), Some(&[ZONE, RACK, DISK])],
            selected: true,
            strict: Some(false),
            want: Want::Topology {
                requisite: &[&[(DISK, "ssd"), (ZONE, "zone1")]],
                preferred: &[&[(DISK, "ssd"), (ZONE, "zone1")]],
            },
            ..Case::new("allowed is a subset of the node's topology")
        },
        Case {
            allowed: allowed(&[&[(DISK, &["ssd"]), (ZONE, &["zone1"])]]),
            nodes: &[&[(ZONE, "zone1"), (RACK, "rack1"), (DISK, "ssd")]],
            csi_nodes: &[Some(&[ZONE, RACK, DISK])],
            selected: true,
            strict: Some(true),
            want: Want::Topology {
                requisite: &[&[(DISK, "ssd"), (RACK, "rack1"), (ZONE, "zone1")]],
                preferred: &[&[(DISK, "ssd"), (RACK, "rack1"), (ZONE, "zone1")]],
            },
            ..Case::new("allowed is a subset of the node's topology, strict: the node's")
        },
        Case {
            allowed: allowed(&[&[(ZONE, &["zone1"])]]),
            nodes: &[&[(ZONE, "zone10"), (RACK, "rack1")]],
            csi_nodes: &[Some(ZRK)],
            selected: true,
            strict: Some(false),
            want: Want::Error("NotInRequisite"),
            ..Case::new("allowed is not a subset of the node's topology")
        },
        // allowedTopologies without a selected node, upstream's TestAllowedTopologies: the
        // cluster is not read, immediate topology does not matter.
        Case {
            allowed: allowed(&[&[(ZONE, &["zone1"])], &[(ZONE, &["zone2"])]]),
            want: Want::Topology {
                requisite: &[Z1, Z2],
                preferred: &[Z1, Z2],
            },
            ..Case::new("allowed: two terms, one key")
        },
        Case {
            allowed: allowed(&[
                &[(ZONE, &["zone1", "zone2"])],
                &[(ZONE, &["zone2", "zone3"])],
            ]),
            want: Want::Topology {
                requisite: &[Z1, Z2, Z3],
                preferred: &[Z3, Z1, Z2],
            },
            ..Case::new("allowed: overlapping values appear once")
        },
        Case {
            allowed: allowed(&[
                &[(ZONE, &["zone1"])],
                &[(ZONE, &["zone1", "zone2"]), (RACK, &["rackA", "rackB"])],
            ]),
            claim: "testset-2",
            want: Want::Topology {
                requisite: &[Z1, A1, A2, B1, B2],
                // (hash("testset") + 2) % 5 = 2.
                preferred: &[A2, B1, B2, Z1, A1],
            },
            ..Case::new("allowed: a subset duplicate is kept, fewer keys first")
        },
        Case {
            allowed: allowed(&[
                &[(ZONE, &["zone1"]), (RACK, &["rackB"])],
                &[(ZONE, &["zone1", "zone2"]), (RACK, &["rackA", "rackB"])],
            ]),
            claim: "testset-2",
            want: Want::Topology {
                requisite: &[A1, A2, B1, B2],
                // (hash("testset") + 2) % 4 = 1.
                preferred: &[A2, B1, B2, A1],
            },
            ..Case::new("allowed: an identical duplicate appears once")
        },
        Case {
            allowed: allowed(&[&[(ZONE, &[])]]),
            want: Want::Nothing,
            ..Case::new("allowed without values: no requirement")
        },
        Case {
            allowed: allowed(&[&[(ZONE, &[]), (RACK, &["rackA"])]]),
            want: Want::Topology {
                requisite: &[&[(RACK, "rackA")]],
                preferred: &[&[(RACK, "rackA")]],
            },
            ..Case::new("allowed: an expression without values drops what came before")
        },
        // StatefulSet spreading, upstream's TestStatefulSetSpreading: hash("testset") is 3
        // modulo 4, and the number after the last dash is added.
        Case {
            nodes: FOUR_RACKS,
            csi_nodes: FOUR_CSI_NODES,
            immediate: Some(true),
            claim: "testpvcA-testset-1",
            want: Want::Topology {
                requisite: &[A1, B2, C3, D4],
                preferred: &[A1, B2, C3, D4],
            },
            ..Case::new("spreading: testset-1 starts at 0")
        },
        Case {
            nodes: FOUR_RACKS,
            csi_nodes: FOUR_CSI_NODES,
            immediate: Some(true),
            claim: "testpvcB-testset-1",
            want: Want::Topology {
                requisite: &[A1, B2, C3, D4],
                preferred: &[A1, B2, C3, D4],
            },
            ..Case::new("spreading: the claim's own prefix does not count")
        },
        Case {
            nodes: FOUR_RACKS,
            csi_nodes: FOUR_CSI_NODES,
            immediate: Some(true),
            claim: "testset-2",
            want: Want::Topology {
                requisite: &[A1, B2, C3, D4],
                preferred: &[B2, C3, D4, A1],
            },
            ..Case::new("spreading: testset-2 starts at 1")
        },
        Case {
            nodes: FOUR_RACKS,
            csi_nodes: FOUR_CSI_NODES,
            immediate: Some(true),
            claim: "testpvc-testset-3",
            want: Want::Topology {
                requisite: &[A1, B2, C3, D4],
                preferred: &[C3, D4, A1, B2],
            },
            ..Case::new("spreading: testset-3 starts at 2")
        },
        Case {
            nodes: FOUR_RACKS,
            csi_nodes: FOUR_CSI_NODES,
            immediate: Some(true),
            claim: "testpvc-testset-4",
            want: Want::Topology {
                requisite: &[A1, B2, C3, D4],
                preferred: &[D4, A1, B2, C3],
            },
            ..Case::new("spreading: testset-4 starts at 3")
        },
        Case {
            allowed: allowed(&[&[(ZONE, &["zone1"]), (RACK, &["rackA"])]]),
            claim: "testpvcC-testset-1",
            want: Want::Topology {
                requisite: &[A1],
                preferred: &[A1],
            },
            ..Case::new("spreading over allowed: one term")
        },
        Case {
            allowed: allowed(&[
                &[(ZONE, &["zone2"]), (RACK, &["rackB"])],
                &[(ZONE, &["zone1"]), (RACK, &["rackA"])],
            ]),
            claim: "testpvcB-testset-2",
            want: Want::Topology {
                requisite: &[A1, B2],
                preferred: &[B2, A1],
            },
            ..Case::new("spreading over allowed: testset-2 starts at 1")
        },
    ]
}

#[test]
fn requirements_follow_upstreams_tables() {
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in cases() {
        let nodes: Vec<Node> = case
            .nodes
            .iter()
            .enumerate()
            .map(|(i, labels)| node(i, labels))
            .collect();
        let csi_nodes: Vec<CSINode> = case
            .csi_nodes
            .iter()
            .enumerate()
            .map(|(i, keys)| csi_node(i, *keys))
            .collect();
        let selected = case.selected.then(|| SelectedNode {
            name: "node-0",
            csi_node: csi_nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some("node-0")),
            node: nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some("node-0")),
        });
        for strict in [false, true] {
            for immediate in [false, true] {
                if case.strict.is_some_and(|s| s != strict)
                    || case.immediate.is_some_and(|i| i != immediate)
                {
                    continue;
                }
                runs += 1;
                let settings = TopologySettings {
                    enabled: true,
                    strict,
                    immediate,
                };
                // Only the lists the wrapper would fetch.
                let needed = ListsNeeded::of(&case.allowed, case.selected, settings);
                let view = ClusterView {
                    selected,
                    csi_nodes: if needed.csi_nodes { &csi_nodes } else { &[] },
                    nodes: if needed.nodes { &nodes } else { &[] },
                };
                let got = requirement(DRIVER, case.claim, &case.allowed, &view, settings);
                let ok = match (&case.want, &got) {
                    (Want::Nothing, Ok(None)) => true,
                    (
                        Want::Topology {
                            requisite,
                            preferred,
                        },
                        Ok(Some(r)),
                    ) => {
                        pairs(&r.requisite) == owned(requisite)
                            && pairs(&r.preferred) == owned(preferred)
                    }
                    (Want::Error(want), Err(err)) => kind(err) == *want,
                    _ => false,
                };
                if !ok {
                    failures.push(format!(
                        "{} (strict {strict}, immediate {immediate}): want {:?}, got {:?}",
                        case.name, case.want, got
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(runs > 60, "only {runs} runs");
}

#[test]
fn disabled_topology_asks_for_nothing() {
    let view = ClusterView::default();
    let settings = TopologySettings {
        enabled: false,
        strict: true,
        immediate: true,
    };
    let allowed = allowed(&[&[(ZONE, &["zone1"])]]);
    let got = requirement(DRIVER, "claim", &allowed, &view, settings).unwrap();
    assert_eq!(got, None);
    assert_eq!(
        ListsNeeded::of(&[], false, settings),
        ListsNeeded {
            csi_nodes: false,
            nodes: false
        }
    );
}

#[test]
fn the_claim_name_hash_is_fnv1_with_statefulset_spreading() {
    // FNV-1 (not 1a) test vectors.
    assert_eq!(fnv1_32(b""), 0x811c_9dc5);
    assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
    let testset = fnv1_32(b"testset");
    assert_eq!(spread_offset("data-testset-7"), testset.wrapping_add(7));
    assert_eq!(spread_offset("testset-7"), testset.wrapping_add(7));
    assert_eq!(spread_offset("a-b-testset-0"), testset);
    // Not a replica number: the whole name is hashed.
    for name in [
        "testset-x",
        "testset-",
        "testset-+7",
        "testset-4294967296",
        "testset",
    ] {
        assert_eq!(spread_offset(name), fnv1_32(name.as_bytes()), "{name}");
    }
}

#[test]
fn subset_matches_upstreams_walk() {
    let t = |p: Pairs| -> Term {
        let mut t: Term = p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        t.sort();
        t
    };
    let node = t(&[("a", "1"), ("b", "2"), ("c", "3")]);
    assert!(is_subset(&t(&[]), &node));
    assert!(is_subset(&t(&[("a", "1"), ("c", "3")]), &node));
    assert!(is_subset(&node, &node));
    assert!(!is_subset(&t(&[("b", "3")]), &node));
    assert!(!is_subset(&t(&[("d", "4")]), &node));
    assert!(!is_subset(&node, &t(&[("a", "1")])));
    // A key repeated with two values cannot be in one node's topology.
    assert!(!is_subset(&t(&[("a", "1"), ("a", "2")]), &node));
    // Fewer keys sort first, then by key and value.
    let mut terms = [
        t(&[("b", "1"), ("c", "1")]),
        t(&[("z", "9")]),
        t(&[("a", "2"), ("c", "1")]),
    ];
    terms.sort_by(compare);
    assert_eq!(terms[0], t(&[("z", "9")]));
    assert_eq!(terms[1], t(&[("a", "2"), ("c", "1")]));
}

#[test]
fn errors_map_to_upstreams_states_and_name_the_node() {
    let reschedule = ProvisionError::from(TopologyError::CsiNodeNotFound {
        node: "node-7".into(),
    });
    assert!(
        matches!(&reschedule, ProvisionError::Reschedule(e) if e.to_string().contains("\"node-7\""))
    );

    let missing = TopologyError::MissingLabel {
        node: "node-7".into(),
        key: ZONE.into(),
        driver: DRIVER.into(),
    };
    let message = missing.to_string();
    assert!(
        message.contains("\"node-7\"") && message.contains(ZONE),
        "{message}"
    );
    let ProvisionError::NoChange(source) = ProvisionError::from(missing) else {
        panic!("not NoChange");
    };
    assert_eq!(
        source.to_string(),
        "error generating accessibility requirements"
    );
    assert_eq!(source.source().unwrap().to_string(), message);
}

#[test]
fn node_affinity_has_a_term_per_topology_and_a_requirement_per_segment() {
    assert_eq!(node_affinity(&[]), None);
    assert_eq!(node_affinity(&[Topology::default()]), None);

    let topology = |p: Pairs| Topology {
        segments: p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let affinity = node_affinity(&[topology(A1), Topology::default(), topology(Z2)]).unwrap();
    let json = serde_json::to_value(&affinity).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": RACK, "operator": "In", "values": ["rackA"]},
                {"key": ZONE, "operator": "In", "values": ["zone1"]},
            ]},
            {"matchExpressions": [
                {"key": ZONE, "operator": "In", "values": ["zone2"]},
            ]},
        ]}})
    );
}

#[tokio::test]
async fn the_wrapper_reads_nodes_and_csinodes_from_the_api() {
    let sim = kube_sim::KubeSim::start().await.unwrap();
    let client = sim.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    for (i, labels) in THREE_RACKS.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &node(i, labels))
            .await
            .unwrap();
        csi_nodes
            .create(&PostParams::default(), &csi_node(i, Some(ZRK)))
            .await
            .unwrap();
    }
    // A node without the driver's labels: not listed.
    nodes
        .create(&PostParams::default(), &node(3, &[(ZONE, "zone9")]))
        .await
        .unwrap();
    let on = TopologySettings {
        enabled: true,
        strict: false,
        immediate: true,
    };
    let class = StorageClass::default();

    // Selected node: GET its CSINode and Node, LIST Nodes by the keys.
    sim.clear_requests();
    let got = accessibility_requirements_for_claim(&client, DRIVER, &class, "", Some("node-0"), on)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pairs(&got.requisite), owned(&[A1, A2, B1]));
    assert_eq!(pairs(&got.preferred), owned(&[A2, B1, A1]));
    let requests: Vec<String> = sim
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.verb, r.path))
        .collect();
    assert_eq!(
        requests,
        [
            "get /apis/storage.k8s.io/v1/csinodes/node-0",
            "get /api/v1/nodes/node-0",
            "list /api/v1/nodes",
        ],
        "{requests:?}"
    );
    assert!(sim.requests()[2].query.contains("labelSelector"));

    // Immediate binding: the keys from the CSINodes, the topologies from the Nodes.
    let got = accessibility_requirements_for_claim(&client, DRIVER, &class, "testpvc", None, on)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pairs(&got.requisite), owned(&[A1, A2, B1]));
    assert_eq!(pairs(&got.preferred), owned(&[B1, A1, A2]));

    // Strict with allowedTopologies: no list at all.
    let strict = TopologySettings { strict: true, ..on };
    let allowed_class = StorageClass {
        allowed_topologies: Some(allowed(&[&[(ZONE, &["zone1", "zone2"])]])),
        ..StorageClass::default()
    };
    sim.clear_requests();
    let got = accessibility_requirements_for_claim(
        &client,
        DRIVER,
        &allowed_class,
        "",
        Some("node-1"),
        strict,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(pairs(&got.requisite), owned(&[A1]));
    assert_eq!(sim.requests().len(), 2, "{:?}", sim.requests());

    // No CSINode: rescheduled; the message names the node.
    let err = accessibility_requirements_for_claim(&client, DRIVER, &class, "", Some("node-3"), on)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProvisionError::Reschedule(e) if e.to_string().contains("\"node-3\"")),
        "{err:?}"
    );

    // A CSINode whose Node is gone: no change.
    csi_nodes
        .create(&PostParams::default(), &csi_node(4, Some(ZK)))
        .await
        .unwrap();
    let err = accessibility_requirements_for_claim(&client, DRIVER, &class, "", Some("node-4"), on)
        .await
        .unwrap_err();
    assert!(matches!(err, ProvisionError::NoChange(_)), "{err:?}");

    // An API error: no change, naming what was read.
    sim.add_fault(
        kube_sim::FaultRule::new(kube_sim::Verb::Get, "csinodes")
            .name("node-0")
            .status(500, "InternalError"),
    );
    let err = accessibility_requirements_for_claim(&client, DRIVER, &class, "", Some("node-0"), on)
        .await
        .unwrap_err();
    let ProvisionError::NoChange(source) = &err else {
        panic!("{err:?}");
    };
    let cause = source.source().unwrap().to_string();
    assert_eq!(cause, "could not get CSINode \"node-0\"");

    // Topology off: nothing read, nothing asked.
    sim.clear_requests();
    let off = TopologySettings::default();
    let got = accessibility_requirements_for_claim(
        &client,
        DRIVER,
        &allowed_class,
        "",
        Some("node-0"),
        off,
    )
    .await
    .unwrap();
    assert_eq!(got, None);
    assert!(sim.requests().is_empty());
    sim.shutdown().await;
}
