//! The API permissions the controller uses, for writing RBAC rules.
//!
//! `examples/deploy/provisioner-rbac.yaml` grants exactly these (a unit test keeps the two
//! equal). A driver whose own code calls more of the API adds its rules next to them.

/// Verbs on one resource of one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Permission {
    /// The API group (`""` for core).
    pub group: &'static str,
    /// The resource (plural).
    pub resource: &'static str,
    /// The verbs the controller uses.
    pub verbs: &'static [&'static str],
}

/// Cluster-wide permissions (a ClusterRole).
///
/// - claims: `list`/`watch` (cache), `get`+`patch` (crash-safety finalizer), `get`+`update`
///   (reschedule: remove the selected node);
/// - volumes: `list`/`watch` (cache), `create` (save), `get`+`delete` (delete),
///   `patch` (protection finalizer);
/// - storage classes: `list`/`watch` (cache); no nodes: the selected node is passed by
///   name, never read (Go v13);
/// - events: `create` and `patch` on `events.k8s.io` (kube-runtime's recorder; no core events).
pub const CLUSTER_PERMISSIONS: &[Permission] = &[
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "list", "watch", "update", "patch"],
    },
    Permission {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "list", "watch", "create", "delete", "patch"],
    },
    Permission {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["list", "watch"],
    },
    Permission {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
    },
];

/// Permissions in the leader-election namespace (a Role): read, create and renew (or
/// release) the Lease.
pub const LEADER_ELECTION_PERMISSIONS: &[Permission] = &[Permission {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "update"],
}];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    type Grants = BTreeSet<(String, String, String)>;

    fn flatten(permissions: &[Permission]) -> Grants {
        permissions
            .iter()
            .flat_map(|p| {
                p.verbs
                    .iter()
                    .map(|v| (p.group.to_owned(), p.resource.to_owned(), (*v).to_owned()))
            })
            .collect()
    }

    fn granted(docs: &[serde_json::Value], kind: &str) -> Grants {
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        let mut out = Grants::new();
        for doc in docs.iter().filter(|d| d["kind"] == kind) {
            for rule in doc["rules"].as_array().into_iter().flatten() {
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            out.insert((group.clone(), resource.clone(), verb));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_example_rbac_grants_exactly_what_the_controller_uses() {
        let yaml = include_str!("../../../examples/deploy/provisioner-rbac.yaml");
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).unwrap();
        assert_eq!(granted(&docs, "ClusterRole"), flatten(CLUSTER_PERMISSIONS));
        assert_eq!(granted(&docs, "Role"), flatten(LEADER_ELECTION_PERMISSIONS));
        let bound: Vec<_> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
            .map(|d| d["subjects"][0]["name"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(bound, ["example-provisioner", "example-provisioner"]);
    }
}
