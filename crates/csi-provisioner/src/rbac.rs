//! The API permissions the sidecar uses beyond provision-controller's, for writing RBAC
//! rules, and the name of its Lease.
//!
//! The sidecar needs provision-controller's
//! [`Permission::CLUSTER`],
//! [`Permission::LEADER_ELECTION`]
//! (with `--leader-election`, on the Lease [`lease_name`] names) and
//! [`Permission::JOURNAL`] (in the
//! journal's namespace), plus [`SIDECAR_PERMISSIONS`] cluster-wide.
//! `examples/deploy/csi-provisioner-rbac.yaml` grants exactly these (the repository's
//! `tests/deploy_manifests.rs` keeps the two equal).

use provision_controller::rbac::Permission;

/// Cluster-wide permissions of the sidecar's own code (a ClusterRole, next to
/// provision-controller's):
///
/// - secrets: `get` (the provisioner, deleter and other secrets a class names, in the
///   namespace the class or its template says; never listed);
/// - storage classes: `get` (a deleted volume's class, for its deletion secrets);
/// - volume attachments: `list` (a volume still attached is not deleted, for drivers with
///   `PUBLISH_UNPUBLISH_VOLUME`);
/// - nodes and CSINodes: `get` and `list` (accessibility requirements: the selected node's
///   topology, and the topologies of every node for immediate binding); only for drivers
///   with `VOLUME_ACCESSIBILITY_CONSTRAINTS` and the `Topology` gate on.
pub const SIDECAR_PERMISSIONS: &[Permission] = &[
    Permission::new("", "secrets", &["get"]),
    Permission::new("storage.k8s.io", "storageclasses", &["get"]),
    Permission::new("storage.k8s.io", "volumeattachments", &["list"]),
    Permission::new("", "nodes", &["get", "list"]),
    Permission::new("storage.k8s.io", "csinodes", &["get", "list"]),
];

/// The Lease name upstream's sidecar uses for a driver (csi-lib-utils: every character
/// that is not an ASCII letter, digit or `-` becomes `-`, and a trailing `-` gets an `X`),
/// so that replacing upstream's sidecar keeps the same Lease and a rolling update from one
/// to the other never has two leaders.
///
/// ```
/// assert_eq!(csi_provisioner::rbac::lease_name("hostpath.csi.k8s.io"), "hostpath-csi-k8s-io");
/// ```
#[must_use]
pub fn lease_name(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.ends_with('-') {
        name.push('X');
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_upstreams() {
        assert_eq!(lease_name("hostpath.csi.k8s.io"), "hostpath-csi-k8s-io");
        assert_eq!(lease_name("example.com/my-driver"), "example-com-my-driver");
        assert_eq!(lease_name("driver_"), "driver-X");
    }
}
