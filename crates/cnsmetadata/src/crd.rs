//! The CustomResourceDefinition of `CnsVolumeMetadata` and its YAML manifest.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::resource::{CRD_NAME, GROUP, KIND, PLURAL, VERSION};

/// The CustomResourceDefinition, as upstream ships it: namespaced, one served and stored
/// version `v1alpha1`, a structural schema, and no status subresource (status is written
/// through the main resource).
///
/// # Panics
/// Never: the manifest is a constant checked by the unit tests.
#[must_use]
pub fn crd() -> CustomResourceDefinition {
    let string = || serde_json::json!({ "type": "string" });
    let manifest = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": CRD_NAME },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": "CnsVolumeMetadataList",
                "plural": PLURAL,
                "singular": "cnsvolumemetadata",
            },
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": {
                    "description": "Kubernetes entity metadata of a guest cluster that the CNS operator pushes to vSphere Cloud Native Storage.",
                    "type": "object",
                    "properties": {
                        "apiVersion": string(),
                        "kind": string(),
                        "metadata": { "type": "object" },
                        "spec": {
                            "description": "The entity, its guest cluster and the supervisor volumes it uses.",
                            "type": "object",
                            "required": ["entityname", "entityreferences", "entitytype", "guestclusterid", "volumenames"],
                            "properties": {
                                "volumenames": {
                                    "description": "Supervisor PVC names of the volumes; one for PV and PVC entities, one or more for pods.",
                                    "type": "array",
                                    "items": string(),
                                },
                                "guestclusterid": {
                                    "description": "ID of the guest cluster the entity lives in.",
                                    "type": "string",
                                },
                                "entitytype": {
                                    "description": "PERSISTENT_VOLUME, PERSISTENT_VOLUME_CLAIM or POD.",
                                    "type": "string",
                                },
                                "entityname": {
                                    "description": "Name of the entity in the guest cluster.",
                                    "type": "string",
                                },
                                "entityreferences": {
                                    "description": "Entities this entity refers to, with keys EntityType, EntityName, Namespace and ClusterID.",
                                    "type": "array",
                                    "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                                },
                                "labels": {
                                    "description": "Labels of the entity in the guest cluster (PV and PVC only).",
                                    "type": "object",
                                    "additionalProperties": string(),
                                },
                                "namespace": {
                                    "description": "Namespace of the entity in the guest cluster (PVC and pod only).",
                                    "type": "string",
                                },
                                "clusterdistribution": {
                                    "description": "Distribution of the guest cluster where the pvCSI driver runs.",
                                    "type": "string",
                                },
                            },
                        },
                        "status": {
                            "description": "Outcome of the last update on CNS, per volume.",
                            "type": "object",
                            "properties": {
                                "volumestatus": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["updated", "volumename"],
                                        "properties": {
                                            "volumename": string(),
                                            "updated": { "type": "boolean" },
                                            "errormessage": string(),
                                        },
                                    },
                                },
                            },
                        },
                    },
                }},
            }],
        },
    });
    serde_json::from_value(manifest).expect("the CRD manifest is a valid CustomResourceDefinition")
}

/// [`crd()`] as a YAML document, the content of `examples/deploy/cnsvolumemetadata-crd.yaml`.
///
/// # Panics
/// Never: serializing a `CustomResourceDefinition` to YAML cannot fail.
#[must_use]
pub fn crd_yaml() -> String {
    let body =
        serde_saphyr::to_string(&crd()).expect("a CustomResourceDefinition serializes to YAML");
    format!("# Generated by cnsmetadata::crd_yaml(); edit the crate, not this file.\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn crd_is_namespaced_without_status_subresource() {
        let crd = crd();
        assert_eq!(crd.metadata.name.as_deref(), Some(CRD_NAME));
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, PLURAL);
        assert_eq!(crd.spec.names.kind, KIND);
        let [version] = crd.spec.versions.as_slice() else {
            panic!("expected one version, got {:?}", crd.spec.versions);
        };
        assert_eq!(version.name, VERSION);
        assert!(version.served && version.storage);
        assert!(version.subresources.is_none());
        let schema = version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap();
        let spec = &schema.properties.as_ref().unwrap()["spec"];
        let mut required = spec.required.clone().unwrap();
        required.sort();
        assert_eq!(
            required,
            [
                "entityname",
                "entityreferences",
                "entitytype",
                "guestclusterid",
                "volumenames"
            ]
        );
    }
}
