//! The `CnsVolumeMetadata` custom resource (`cns.vmware.com/v1alpha1`).
//!
//! The JSON keys follow the upstream Go types exactly, so objects written by a guest
//! cluster's pvCSI driver (or by `kubectl`) round-trip through these types unchanged:
//! lowercase spec keys without separators, PascalCase keys inside `entityreferences`,
//! and the Go `omitempty` rules (`labels`, `namespace`, `clusterdistribution`,
//! `volumestatus` and `errormessage` are left out when empty; every other field is always
//! written, even when empty).

use std::{borrow::Cow, collections::BTreeMap, fmt};

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube_client::Resource;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod lenient;

/// API group of the resource.
pub(crate) const GROUP: &str = "cns.vmware.com";
/// API version of the resource.
pub(crate) const VERSION: &str = "v1alpha1";
/// `apiVersion` of the resource (`group/version`).
pub(crate) const API_VERSION: &str = "cns.vmware.com/v1alpha1";
/// Kind of the resource.
pub(crate) const KIND: &str = "CnsVolumeMetadata";
/// Plural (the REST resource name) of the resource.
pub(crate) const PLURAL: &str = "cnsvolumemetadatas";
/// Name of the CustomResourceDefinition (`plural.group`).
pub const CRD_NAME: &str = "cnsvolumemetadatas.cns.vmware.com";
/// Finalizer the reconciler puts on every object (Go: `cnsoperatortypes.CNSFinalizer`).
pub const FINALIZER: &str = "cns.vmware.com";

/// Metadata of one Kubernetes entity of a guest cluster, with the volumes it uses.
///
/// A guest cluster's pvCSI driver creates one object per PV, PVC and Pod that uses a
/// supervisor volume; the reconciler pushes it to vSphere Cloud Native Storage.
///
/// The type implements [`Resource`] by hand (namespaced, `cns.vmware.com/v1alpha1`,
/// plural `cnsvolumemetadatas`); `apiVersion` and `kind` are written on serialization and
/// ignored on deserialization.
#[doc(alias = "CnsVolumeMetadataList")]
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CnsVolumeMetadata {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// What the guest cluster reports.
    pub spec: CnsVolumeMetadataSpec,
    /// What the reconciler observed; written through the main resource (the upstream CRD
    /// has no status subresource).
    pub status: CnsVolumeMetadataStatus,
}

impl CnsVolumeMetadata {
    /// An object named `name` (no namespace yet) with the given spec and an empty status.
    #[must_use]
    pub fn new(name: &str, spec: CnsVolumeMetadataSpec) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: CnsVolumeMetadataStatus::default(),
        }
    }
}

impl Resource for CnsVolumeMetadata {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }
    fn group((): &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }
    fn version((): &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }
    fn api_version((): &()) -> Cow<'_, str> {
        Cow::Borrowed(API_VERSION)
    }
    fn plural((): &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Borrowed wire form, in the key order the Go types marshal (`kind`, `apiVersion` first).
#[derive(Serialize)]
struct WireOut<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: &'a ObjectMeta,
    spec: &'a CnsVolumeMetadataSpec,
    status: &'a CnsVolumeMetadataStatus,
}

/// Owned wire form; `apiVersion` and `kind` are accepted and dropped.
#[derive(Deserialize)]
struct WireIn {
    #[serde(default, deserialize_with = "null_default")]
    metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_default")]
    spec: CnsVolumeMetadataSpec,
    #[serde(default, deserialize_with = "null_default")]
    status: CnsVolumeMetadataStatus,
}

impl Serialize for CnsVolumeMetadata {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireOut {
            kind: KIND,
            api_version: API_VERSION,
            metadata: &self.metadata,
            spec: &self.spec,
            status: &self.status,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for CnsVolumeMetadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireIn::deserialize(deserializer)?;
        Ok(Self {
            metadata: wire.metadata,
            spec: wire.spec,
            status: wire.status,
        })
    }
}

/// Reads `null` (what Go writes for a nil slice or map) as the default value.
fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The desired state: which entity of which guest cluster uses which volumes.
///
/// Reading never fails, so that one malformed object (which a real API server would
/// reject, but a test server, an old CRD or a hand-made object may hold) cannot break the
/// decoding of every object listed with it: a missing or `null` field, or one of the
/// wrong JSON type, reads as empty (an `entitytype` that is not a string as its JSON
/// text), and validation then reports the object. A spec that is not an object reads as
/// the empty spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct CnsVolumeMetadataSpec {
    /// Names of the supervisor PVCs (in this object's namespace) behind the volumes.
    /// PV and PVC entities name exactly one; a Pod names one per volume it mounts.
    #[serde(rename = "volumenames")]
    pub volume_names: Vec<String>,
    /// ID of the guest cluster the entity lives in.
    #[serde(rename = "guestclusterid")]
    pub guest_cluster_id: String,
    /// Kind of entity this object describes.
    #[serde(rename = "entitytype")]
    pub entity_type: EntityType,
    /// Name of the entity in the guest cluster.
    #[serde(rename = "entityname")]
    pub entity_name: String,
    /// The entities this one refers to: a Pod refers to its PVCs, a PVC to its PV, both
    /// in the guest cluster (with `ClusterID` set); a guest PV refers to the supervisor
    /// PVC (with `ClusterID` empty).
    #[serde(rename = "entityreferences")]
    pub entity_references: Vec<EntityReference>,
    /// Labels of the entity in the guest cluster (PV and PVC only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Namespace of the entity in the guest cluster (PVC and Pod only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Distribution of the guest cluster where the pvCSI driver runs.
    #[serde(
        rename = "clusterdistribution",
        skip_serializing_if = "String::is_empty"
    )]
    pub cluster_distribution: String,
}

/// One entity referred to by the described entity (Go: `CnsOperatorEntityReference`).
///
/// The JSON keys are PascalCase (`EntityType`, `EntityName`, `Namespace`, `ClusterID`)
/// and always written, as the Go struct has no JSON tags. The older key `ClusterId` is
/// accepted when reading.
///
/// Reading is lenient, because the upstream CRD leaves these items untyped
/// (`x-kubernetes-preserve-unknown-fields`), so the API server accepts anything there: a
/// `null` item or value reads as empty, a number or boolean as its JSON text, unknown keys
/// are ignored. One malformed object then fails validation (with an event) instead of
/// failing the decoding of every object listed with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct EntityReference {
    /// Kind of the referred entity.
    #[serde(rename = "EntityType")]
    pub entity_type: EntityType,
    /// Name of the referred entity.
    #[serde(rename = "EntityName")]
    pub entity_name: String,
    /// Namespace of the referred entity (empty for PVs).
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// Cluster of the referred entity; empty when a guest PV refers to a supervisor PVC.
    #[serde(rename = "ClusterID")]
    pub cluster_id: String,
}

impl EntityReference {
    /// A reference to `entity_type` named `entity_name` in `namespace` of `cluster_id`.
    #[must_use]
    pub fn new(
        entity_type: EntityType,
        entity_name: &str,
        namespace: &str,
        cluster_id: &str,
    ) -> Self {
        Self {
            entity_type,
            entity_name: entity_name.to_owned(),
            namespace: namespace.to_owned(),
            cluster_id: cluster_id.to_owned(),
        }
    }
}

/// Kind of Kubernetes entity (Go: `CnsOperatorEntityType`, CNS `CnsKubernetesEntityType`).
///
/// Serialized as `PERSISTENT_VOLUME`, `PERSISTENT_VOLUME_CLAIM` or `POD`. Any other
/// string (including the empty string of an unset field) is kept in [`EntityType::Other`]
/// so that one malformed object cannot break a watch of all objects; validation rejects it.
/// A JSON value that is not a string reads as its JSON text, `null` as the empty string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EntityType {
    /// `PERSISTENT_VOLUME`.
    PersistentVolume,
    /// `PERSISTENT_VOLUME_CLAIM`.
    PersistentVolumeClaim,
    /// `POD`.
    Pod,
    /// Any other value, kept verbatim.
    Other(String),
}

impl EntityType {
    /// The wire string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::PersistentVolume => "PERSISTENT_VOLUME",
            Self::PersistentVolumeClaim => "PERSISTENT_VOLUME_CLAIM",
            Self::Pod => "POD",
            Self::Other(other) => other,
        }
    }

    /// Parses the wire string; unknown values become [`EntityType::Other`].
    #[must_use]
    pub fn parse(value: &str) -> Self {
        match value {
            "PERSISTENT_VOLUME" => Self::PersistentVolume,
            "PERSISTENT_VOLUME_CLAIM" => Self::PersistentVolumeClaim,
            "POD" => Self::Pod,
            other => Self::Other(other.to_owned()),
        }
    }
}

impl Default for EntityType {
    /// The empty string, as Go's zero value.
    fn default() -> Self {
        Self::Other(String::new())
    }
}

impl fmt::Display for EntityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EntityType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The observed state: the outcome of the last update, per volume.
///
/// Reading never fails: what is not of the expected JSON type reads as empty (the
/// reconciler rewrites the status anyway).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CnsVolumeMetadataStatus {
    /// One entry per name in `spec.volumenames`, in the same order.
    #[serde(rename = "volumestatus", skip_serializing_if = "Vec::is_empty")]
    pub volume_status: Vec<VolumeStatus>,
}

/// Outcome of the last update of one volume (Go: `CnsVolumeMetadataVolumeStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VolumeStatus {
    /// The name from `spec.volumenames`.
    #[serde(rename = "volumename")]
    pub volume_name: String,
    /// Whether CNS holds the metadata (also true for volumes of other drivers, which are
    /// skipped, as upstream does).
    pub updated: bool,
    /// Why the update failed; empty on success.
    #[serde(rename = "errormessage", skip_serializing_if = "String::is_empty")]
    pub error_message: String,
}

impl VolumeStatus {
    /// A successful update of `volume_name`.
    #[must_use]
    pub fn updated(volume_name: &str) -> Self {
        Self {
            volume_name: volume_name.to_owned(),
            updated: true,
            error_message: String::new(),
        }
    }

    /// A failed update of `volume_name` with `error_message`.
    #[must_use]
    pub fn failed(volume_name: &str, error_message: impl Into<String>) -> Self {
        Self {
            volume_name: volume_name.to_owned(),
            updated: false,
            error_message: error_message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// What `json.Marshal` of the upstream Go spec writes for a guest PVC entity.
    const GO_PVC_SPEC: &str = r#"{"volumenames":["gc-1-0a1b"],"guestclusterid":"gc-1","entitytype":"PERSISTENT_VOLUME_CLAIM","entityname":"data","entityreferences":[{"EntityType":"PERSISTENT_VOLUME","EntityName":"pvc-0a1b","Namespace":"","ClusterID":"gc-1"}],"labels":{"app":"db","tier":"backend"},"namespace":"shop","clusterdistribution":"TKGService"}"#;
    /// A Go POD spec: no labels, no distribution (omitempty), two volumes.
    const GO_POD_SPEC: &str = r#"{"volumenames":["gc-1-aa","gc-1-bb"],"guestclusterid":"gc-1","entitytype":"POD","entityname":"web-0","entityreferences":[{"EntityType":"PERSISTENT_VOLUME_CLAIM","EntityName":"a","Namespace":"shop","ClusterID":"gc-1"},{"EntityType":"PERSISTENT_VOLUME_CLAIM","EntityName":"b","Namespace":"shop","ClusterID":"gc-1"}],"namespace":"shop"}"#;
    /// A Go PV spec: no namespace, reference without a cluster ID (written as "").
    const GO_PV_SPEC: &str = r#"{"volumenames":["gc-1-0a1b"],"guestclusterid":"gc-1","entitytype":"PERSISTENT_VOLUME","entityname":"pvc-0a1b","entityreferences":[{"EntityType":"PERSISTENT_VOLUME_CLAIM","EntityName":"gc-1-0a1b","Namespace":"tenant","ClusterID":""}]}"#;
    /// A zero-value Go spec: every non-omitempty field is still written.
    const GO_EMPTY_SPEC: &str = r#"{"volumenames":[],"guestclusterid":"","entitytype":"","entityname":"","entityreferences":[]}"#;
    /// Go status with one success (no errormessage) and one failure.
    const GO_STATUS: &str = r#"{"volumestatus":[{"volumename":"a","updated":true},{"volumename":"b","updated":false,"errormessage":"persistentvolumeclaims \"b\" not found"}]}"#;

    #[test]
    fn specs_written_by_go_round_trip_byte_for_byte() {
        for json in [GO_PVC_SPEC, GO_POD_SPEC, GO_PV_SPEC, GO_EMPTY_SPEC] {
            let spec: CnsVolumeMetadataSpec = serde_json::from_str(json).unwrap();
            assert_eq!(serde_json::to_string(&spec).unwrap(), json);
        }
    }

    #[test]
    fn status_written_by_go_round_trips_byte_for_byte() {
        let status: CnsVolumeMetadataStatus = serde_json::from_str(GO_STATUS).unwrap();
        assert_eq!(
            status.volume_status,
            vec![
                VolumeStatus::updated("a"),
                VolumeStatus::failed("b", "persistentvolumeclaims \"b\" not found"),
            ]
        );
        assert_eq!(serde_json::to_string(&status).unwrap(), GO_STATUS);
        assert_eq!(
            serde_json::to_string(&CnsVolumeMetadataStatus::default()).unwrap(),
            "{}"
        );
    }

    #[test]
    fn pvc_spec_fields_map_to_the_go_keys() {
        let spec: CnsVolumeMetadataSpec = serde_json::from_str(GO_PVC_SPEC).unwrap();
        let expected = CnsVolumeMetadataSpec {
            volume_names: vec!["gc-1-0a1b".into()],
            guest_cluster_id: "gc-1".into(),
            entity_type: EntityType::PersistentVolumeClaim,
            entity_name: "data".into(),
            entity_references: vec![EntityReference::new(
                EntityType::PersistentVolume,
                "pvc-0a1b",
                "",
                "gc-1",
            )],
            labels: [("app", "db"), ("tier", "backend")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            namespace: "shop".into(),
            cluster_distribution: "TKGService".into(),
        };
        assert_eq!(spec, expected);
    }

    #[test]
    fn whole_object_from_the_api_server_round_trips() {
        let object = json!({
            "kind": "CnsVolumeMetadata",
            "apiVersion": "cns.vmware.com/v1alpha1",
            "metadata": {
                "name": "gc-1-0a1b",
                "namespace": "tenant",
                "uid": "5a6f",
                "resourceVersion": "42",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "finalizers": ["cns.vmware.com"],
            },
            "spec": serde_json::from_str::<Value>(GO_PV_SPEC).unwrap(),
            "status": serde_json::from_str::<Value>(GO_STATUS).unwrap(),
        });
        let parsed: CnsVolumeMetadata = serde_json::from_value(object.clone()).unwrap();
        assert_eq!(parsed.spec.entity_type, EntityType::PersistentVolume);
        assert_eq!(
            parsed.metadata.finalizers,
            Some(vec!["cns.vmware.com".to_owned()])
        );
        assert_eq!(serde_json::to_value(&parsed).unwrap(), object);
    }

    #[test]
    fn go_nil_slices_and_missing_status_read_as_empty() {
        let object = json!({
            "metadata": { "name": "x", "creationTimestamp": null },
            "spec": { "volumenames": null, "guestclusterid": "", "entitytype": "",
                      "entityname": "", "entityreferences": null },
        });
        let parsed: CnsVolumeMetadata = serde_json::from_value(object).unwrap();
        assert!(parsed.spec.volume_names.is_empty());
        assert!(parsed.spec.entity_references.is_empty());
        assert_eq!(parsed.status, CnsVolumeMetadataStatus::default());
    }

    #[test]
    fn unknown_entity_types_are_kept_verbatim() {
        let spec: CnsVolumeMetadataSpec = serde_json::from_str(
            &GO_EMPTY_SPEC.replace(r#""entitytype":"""#, r#""entitytype":"NODE""#),
        )
        .unwrap();
        assert_eq!(spec.entity_type, EntityType::Other("NODE".into()));
        assert!(
            serde_json::to_string(&spec)
                .unwrap()
                .contains(r#""entitytype":"NODE""#)
        );
    }

    #[test]
    fn the_older_cluster_id_key_is_accepted() {
        let reference: EntityReference = serde_json::from_str(
            r#"{"EntityType":"POD","EntityName":"p","Namespace":"n","ClusterId":"c"}"#,
        )
        .unwrap();
        assert_eq!(
            reference,
            EntityReference::new(EntityType::Pod, "p", "n", "c")
        );
    }

    #[test]
    fn resource_identity_matches_upstream() {
        assert_eq!(CnsVolumeMetadata::kind(&()), "CnsVolumeMetadata");
        assert_eq!(
            CnsVolumeMetadata::api_version(&()),
            "cns.vmware.com/v1alpha1"
        );
        assert_eq!(CnsVolumeMetadata::plural(&()), "cnsvolumemetadatas");
        assert_eq!(
            CnsVolumeMetadata::url_path(&(), Some("tenant")),
            "/apis/cns.vmware.com/v1alpha1/namespaces/tenant/cnsvolumemetadatas"
        );
    }
}
