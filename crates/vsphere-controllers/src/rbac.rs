//! The API permissions the vSphere application uses, for writing its RBAC rules: a
//! ClusterRole of [`cluster_permissions`] (the provision controller's rules and the
//! `CnsVolumeMetadata` reconciler's), a Role in the Deployment's namespace of
//! [`LEADER_ELECTION_PERMISSIONS`] and [`FEATURE_STATES_PERMISSIONS`], and a Role of
//! [`JOURNAL_PERMISSIONS`] in the journal's namespace of its own (`JOURNAL_NAMESPACE`,
//! `vmware-system-csi-journal` in the example deployment). `examples/deploy/vsphere-rbac.yaml` grants exactly
//! these (the repository's `tests/deploy_manifests.rs` keeps them equal); the demo's own
//! calls need no rule.

pub use provision_controller::rbac::{Names, Permission};

/// The provision controller's permissions in the leader-election namespace
/// ([`Permission::LEADER_ELECTION`]).
pub const LEADER_ELECTION_PERMISSIONS: &[Permission] = Permission::LEADER_ELECTION;

/// The provision controller's permissions for its journal ([`Permission::JOURNAL`]).
pub const JOURNAL_PERMISSIONS: &[Permission] = Permission::JOURNAL;

/// What the `CnsVolumeMetadata` reconciler ([`cnsmetadata::MetadataController`]) calls,
/// cluster-wide:
///
/// - claims and volumes: `list`/`watch` only (its caches; it never writes them);
/// - `cnsvolumemetadatas` in `cns.vmware.com`: `list`/`watch` (cache and trigger watch),
///   `get` (the latest version before a decision, and again after a conflict), `update`
///   (the status and the record annotation: the resource has no status subresource);
/// - events: `create`, then `patch` for a repeated event's series, on `events.k8s.io`
///   (kube-controller-kit's `EventWriter`, as the provision controller).
pub const METADATA_PERMISSIONS: &[Permission] = &[
    Permission::new("", "persistentvolumeclaims", &["list", "watch"]),
    Permission::new("", "persistentvolumes", &["list", "watch"]),
    Permission::new(
        "cns.vmware.com",
        "cnsvolumemetadatas",
        &["get", "list", "watch", "update"],
    ),
    Permission::new("events.k8s.io", "events", &["create", "patch"]),
];

/// What installing the `CnsVolumeMetadata` CRD at start ([`crate::install_crd`]) calls,
/// as upstream's syncer does: `create` (RBAC cannot limit a create by name), then, when it
/// exists, `get` and `update` of that one CRD only.
pub const CRD_PERMISSIONS: &[Permission] = &[
    Permission::new(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["create"],
    ),
    Permission::new(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["get", "update"],
    )
    .only(Names::Named(cnsmetadata::CRD_NAME)),
];

/// What reading and following the supervisor's feature-state ConfigMap
/// ([`crate::watch_feature_states`], in its namespace, by default `vmware-system-csi`)
/// calls: `list` and `watch` with the field selector `metadata.name=<name>`, so RBAC limits
/// them to that one ConfigMap (change `resourceNames` with `--supervisor-fss-name`).
pub const FEATURE_STATES_PERMISSIONS: &[Permission] =
    &[Permission::new("", "configmaps", &["list", "watch"])
        .only(Names::Named(crate::DEFAULT_SUPERVISOR_FSS_NAME))];

/// The cluster-wide permissions of the whole process (a ClusterRole): the union of the
/// provision controller's
/// [`Permission::CLUSTER`],
/// [`METADATA_PERMISSIONS`] and [`CRD_PERMISSIONS`], one rule per group, resource and
/// object names where one rule's verbs include the other's (else both rules are kept).
pub fn cluster_permissions() -> Vec<Permission> {
    let all = Permission::CLUSTER
        .iter()
        .chain(METADATA_PERMISSIONS)
        .chain(CRD_PERMISSIONS);
    union(all)
}

/// `permissions` as rules: a permission whose verbs a rule of the same group, resource and
/// names includes adds nothing; one that includes a rule's verbs replaces it.
fn union<'a>(permissions: impl IntoIterator<Item = &'a Permission>) -> Vec<Permission> {
    let covers = |a: &Permission, b: &Permission| b.verbs.iter().all(|v| a.verbs.contains(v));
    let mut rules: Vec<Permission> = Vec::new();
    for p in permissions {
        let same = |r: &&mut Permission| {
            (r.group, r.resource, r.names) == (p.group, p.resource, p.names)
                && (covers(r, p) || covers(p, r))
        };
        match rules.iter_mut().find(same) {
            Some(rule) if covers(rule, p) => {}
            Some(rule) => *rule = *p,
            None => rules.push(*p),
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn grants<'a>(
        permissions: impl IntoIterator<Item = &'a Permission>,
    ) -> BTreeSet<(&'static str, &'static str, &'static str, Names)> {
        permissions
            .into_iter()
            .flat_map(|p| p.verbs.iter().map(|v| (p.group, p.resource, *v, p.names)))
            .collect()
    }

    #[test]
    fn a_rule_is_merged_only_into_one_whose_verbs_include_it_or_that_it_includes() {
        let read = Permission::new("", "persistentvolumes", &["list", "watch"]);
        let write = Permission::new("", "persistentvolumes", &["get", "list", "watch", "create"]);
        let delete = Permission::new("", "persistentvolumes", &["delete"]);
        let named = delete.only(Names::Named("pv-1"));
        assert_eq!(union([&read, &write]), [write]);
        assert_eq!(union([&write, &read]), [write]);
        assert_eq!(union([&read, &delete, &named]), [read, delete, named]);
        assert_eq!(grants(&union([&read, &delete])), grants([&read, &delete]));
    }

    #[test]
    fn the_process_is_granted_the_union_of_both_controllers_permissions() {
        let union = grants(
            Permission::CLUSTER
                .iter()
                .chain(METADATA_PERMISSIONS)
                .chain(CRD_PERMISSIONS),
        );
        let cluster = cluster_permissions();
        assert_eq!(grants(&cluster), union);
        let rules: BTreeSet<_> = cluster
            .iter()
            .map(|p| (p.group, p.resource, p.names))
            .collect();
        assert_eq!(
            rules.len(),
            cluster.len(),
            "one rule per resource and names"
        );
        let named: Vec<_> = cluster
            .iter()
            .filter(|p| p.names != Names::Any)
            .map(|p| (p.resource, p.names))
            .collect();
        assert_eq!(
            named,
            [(
                "customresourcedefinitions",
                Names::Named("cnsvolumemetadatas.cns.vmware.com")
            )],
            "only the CRD rule names an object"
        );
    }
}
