//! The API permissions the controller uses, for writing RBAC rules.
//!
//! `examples/deploy/provisioner-rbac.yaml` grants exactly these (the repository's
//! `tests/deploy_manifests.rs` keeps the two equal). A driver whose own code calls more of
//! the API adds its rules next to them.

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
