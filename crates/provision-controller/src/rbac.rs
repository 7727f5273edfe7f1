//! The API permissions the controller uses, for writing RBAC rules.
//!
//! `examples/deploy/provisioner-rbac.yaml` grants exactly these, rule by rule (the
//! repository's `tests/deploy_manifests.rs` keeps the two equal). A driver whose own code
//! calls more of the API adds its rules next to them.

/// Which objects of a resource a [`Permission`] covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Names {
    /// Every object: a rule without `resourceNames`. `list`, `watch` and `create` need
    /// it, since RBAC cannot limit them by name (a create request names no existing object).
    Any,
    /// Only the leader-election Lease: `resourceNames: [<lease name>]`, where the name is
    /// the [`LeaderElection`](crate::LeaderElection)'s `lease_name`, by default the
    /// provisioner name with `/` replaced by `-`
    /// ([`LeaderElection::lease_name_for`](crate::LeaderElection::lease_name_for)). Other
    /// Leases in the namespace (kube-controller-manager's, kube-scheduler's in
    /// kube-system) stay out of reach.
    LeaseName,
    /// Only the object of this name: `resourceNames: [<name>]` (`get`, `update`, and a
    /// `list`/`watch` whose field selector is `metadata.name=<name>`).
    Named(&'static str),
}

/// Verbs on one resource of one API group, on every object or only named ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Permission {
    /// The API group (`""` for core).
    pub group: &'static str,
    /// The resource (plural).
    pub resource: &'static str,
    /// The verbs the controller uses.
    pub verbs: &'static [&'static str],
    /// Which objects: every one, or only those a rule lists in `resourceNames`.
    pub names: Names,
}

impl Permission {
    /// `verbs` on every object of `group`/`resource`.
    #[must_use]
    pub const fn new(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
    ) -> Self {
        Self {
            group,
            resource,
            verbs,
            names: Names::Any,
        }
    }

    /// The same verbs, on the objects `names` says only.
    #[must_use]
    pub const fn only(mut self, names: Names) -> Self {
        self.names = names;
        self
    }
}

/// The controller's permissions, in three sets: each is one RBAC object's rules.
impl Permission {
    /// Cluster-wide permissions (a ClusterRole).
    ///
    /// - claims: `list`/`watch` (cache), `get`+`update` (reschedule: remove the selected
    ///   node); the controller writes nothing else on claims;
    /// - volumes: `list`/`watch` (cache), `create` (save), `get`+`delete` (delete),
    ///   `patch` (protection finalizer);
    /// - storage classes: `list`/`watch` (cache); no nodes: the selected node is passed by
    ///   name, never read (Go v13);
    /// - events: `create`, then `patch` to count a repeated event in its series, on
    ///   `events.k8s.io` (kube-controller-kit's `EventWriter`; no core events).
    pub const CLUSTER: &'static [Permission] = &[
        Self::new(
            "",
            "persistentvolumeclaims",
            &["get", "list", "watch", "update"],
        ),
        Self::new(
            "",
            "persistentvolumes",
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        Self::new("storage.k8s.io", "storageclasses", &["list", "watch"]),
        Self::new("events.k8s.io", "events", &["create", "patch"]),
    ];

    /// Permissions in the leader-election namespace (a Role): `create` the Lease (any name:
    /// RBAC cannot limit a create by name), and `get` and `update` (acquire, renew, release)
    /// only the Lease of this controller ([`Names::LeaseName`]).
    pub const LEADER_ELECTION: &'static [Permission] = &[
        Self::new("coordination.k8s.io", "leases", &["create"]),
        Self::new("coordination.k8s.io", "leases", &["get", "update"]).only(Names::LeaseName),
    ];

    /// Permissions in the controller's namespace (the Lease's, a Role) for the provisioning
    /// journal of crash-safe provisioning: ConfigMaps named
    /// `<lease name>-journal-<seq>`, which RBAC cannot list by a name pattern, so the rule
    /// covers the namespace's ConfigMaps: `list` (load the journal), `get` (read one again
    /// after a conflict), `create`, `update` and `delete` (write it). Not needed with
    /// [`Config::crash_safe_provisioning`](crate::Config::crash_safe_provisioning) off.
    pub const JOURNAL: &'static [Permission] = &[Permission::new(
        "",
        "configmaps",
        &["get", "list", "create", "update", "delete"],
    )];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_create_of_a_lease_is_not_limited_to_the_lease_name() {
        let unlimited: Vec<&str> = Permission::LEADER_ELECTION
            .iter()
            .filter(|p| p.names == Names::Any)
            .flat_map(|p| p.verbs.iter().copied())
            .collect();
        assert_eq!(unlimited, ["create"]);
        assert!(
            Permission::CLUSTER.iter().all(|p| p.names == Names::Any),
            "cluster-wide rules name no object"
        );
    }
}
