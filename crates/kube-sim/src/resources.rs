//! The resource types the sim serves: the built-in ones and those CRDs register.

use std::collections::HashMap;
use std::sync::Arc;

/// Identity of a stored resource: `"{group}/{plural}"` (core group is empty).
pub(crate) type ResKey = Arc<str>;

/// Builds the [`ResKey`] of a group and plural.
pub(crate) fn res_key(group: &str, plural: &str) -> ResKey {
    Arc::from(format!("{group}/{plural}"))
}

/// What the sim knows about one resource type.
#[derive(Clone, Debug)]
pub(crate) struct ResourceDef {
    pub(crate) key: ResKey,
    pub(crate) group: String,
    /// Served versions with, per version, whether `/status` is a subresource.
    pub(crate) versions: Vec<(String, bool)>,
    pub(crate) plural: String,
    pub(crate) singular: String,
    pub(crate) kind: String,
    pub(crate) list_kind: String,
    pub(crate) namespaced: bool,
    pub(crate) short_names: Vec<String>,
    /// Built into the server (strategic merge patch allowed); false for custom resources.
    pub(crate) builtin: bool,
}

impl ResourceDef {
    /// `apiVersion` for `version`: `v1` or `group/version`.
    pub(crate) fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// Whether `version` is served.
    pub(crate) fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|(v, _)| v == version)
    }

    /// Whether `version` has a `/status` subresource.
    pub(crate) fn has_status(&self, version: &str) -> bool {
        self.versions.iter().any(|(v, s)| v == version && *s)
    }

    /// Whether any version has a `/status` subresource (status kept on main writes).
    pub(crate) fn any_status(&self) -> bool {
        self.versions.iter().any(|(_, s)| *s)
    }

    /// Whether a PUT may create a missing object (real: events and leases).
    pub(crate) fn create_on_update(&self) -> bool {
        self.builtin && matches!(self.plural.as_str(), "events" | "leases")
    }

    /// Whether generation is tracked (types with a spec, and all custom resources).
    pub(crate) fn tracks_generation(&self) -> bool {
        !self.builtin
            || matches!(
                self.plural.as_str(),
                "persistentvolumeclaims"
                    | "persistentvolumes"
                    | "pods"
                    | "nodes"
                    | "namespaces"
                    | "leases"
                    | "customresourcedefinitions"
                    | "deployments"
            )
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
) -> ResourceDef {
    ResourceDef {
        key: res_key(group, plural),
        group: group.to_string(),
        versions: vec![(version.to_string(), status)],
        plural: plural.to_string(),
        singular: singular.to_string(),
        kind: kind.to_string(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        builtin: true,
    }
}

/// A built-in resource type: group, version, plural, singular, kind, namespaced, short
/// names, and whether it has a status subresource.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
);

/// The built-in resource types.
const BUILTINS: &[Builtin] = &[
    (
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        true,
    ),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
    ),
    (
        "",
        "v1",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        true,
    ),
    ("", "v1", "nodes", "node", "Node", false, &["no"], true),
    ("", "v1", "pods", "pod", "Pod", true, &["po"], true),
    ("", "v1", "events", "event", "Event", true, &["ev"], false),
    // Upstream's vSphere driver reads its feature states from a ConfigMap.
    (
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        false,
    ),
    // What a driver's manifests hold, so that `kubectl apply` (and its server-side dry
    // run) accepts them; RBAC is enforced only with `Builder::rbac`, and no pod is started.
    (
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        false,
    ),
    (
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
        true,
    ),
    // A CSI sidecar reads the secrets its classes name.
    ("", "v1", "secrets", "secret", "Secret", true, &[], false),
    (
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "volumeattachment",
        "VolumeAttachment",
        false,
        &[],
        true,
    ),
    (
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        &["sc"],
        false,
    ),
    // CSI sidecars read a node's topology keys from its CSINode.
    (
        "storage.k8s.io",
        "v1",
        "csinodes",
        "csinode",
        "CSINode",
        false,
        &[],
        false,
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        false,
    ),
    (
        "events.k8s.io",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        true,
    ),
];

/// The resource types served at start.
pub(crate) fn builtins() -> Vec<ResourceDef> {
    BUILTINS
        .iter()
        .map(
            |&(group, version, plural, singular, kind, namespaced, short, status)| {
                builtin(
                    group, version, plural, singular, kind, namespaced, short, status,
                )
            },
        )
        .collect()
}

/// All served resource types, by key.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    defs: HashMap<ResKey, Arc<ResourceDef>>,
    /// Keys in registration order, for stable discovery documents.
    order: Vec<ResKey>,
}

impl Registry {
    /// A registry with the built-in types.
    pub(crate) fn with_builtins() -> Self {
        let mut reg = Self::default();
        for def in builtins() {
            reg.insert(def);
        }
        reg
    }

    /// Adds or replaces a type.
    pub(crate) fn insert(&mut self, def: ResourceDef) {
        let key = def.key.clone();
        if !self.defs.contains_key(&key) {
            self.order.push(key.clone());
        }
        self.defs.insert(key, Arc::new(def));
    }

    /// Removes a type.
    pub(crate) fn remove(&mut self, key: &str) {
        self.defs.remove(key);
        self.order.retain(|k| &**k != key);
    }

    /// The type served at `group`/`version`/`plural`.
    pub(crate) fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceDef>> {
        let def = self.defs.get(format!("{group}/{plural}").as_str())?;
        def.serves(version).then(|| def.clone())
    }

    /// The type with this key.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<ResourceDef>> {
        self.defs.get(key).cloned()
    }

    /// All types in registration order.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<ResourceDef>> {
        self.order.iter().filter_map(|k| self.defs.get(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_checks_the_version() {
        let reg = Registry::with_builtins();
        assert!(reg.lookup("", "v1", "persistentvolumeclaims").is_some());
        assert!(reg.lookup("", "v2", "persistentvolumeclaims").is_none());
        let sc = reg
            .lookup("storage.k8s.io", "v1", "storageclasses")
            .unwrap();
        assert_eq!(sc.api_version("v1"), "storage.k8s.io/v1");
        assert!(!sc.tracks_generation());
    }
}
