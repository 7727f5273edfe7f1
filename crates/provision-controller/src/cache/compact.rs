//! The controller's own volume cache: PersistentVolumes held in a compact form.
//!
//! A k8s-openapi `PersistentVolume` is 3,472 bytes before its strings and maps (its spec
//! has a field for every volume source), and a cached CSI volume costs about 5 KiB in
//! all. The controller reads a cached volume only when its queue entry is processed, so
//! the cache keeps the metadata parsed (the store is keyed by it) and the spec and status
//! as their compact JSON, about 600 bytes for a CSI volume, and rebuilds the
//! `PersistentVolume` when it is read. Nothing is dropped but managed fields: a rebuilt
//! volume equals the one the API server sent, less those.

use std::{borrow::Cow, sync::Arc};

use k8s_openapi::{
    api::core::v1::{PersistentVolume, PersistentVolumeSpec, PersistentVolumeStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube_client::{Resource, core::ClusterResourceScope};
use serde::{Deserialize, Deserializer, Serialize, de::Error as _};

/// A PersistentVolume with its spec and status kept as JSON (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CompactVolume {
    metadata: ObjectMeta,
    /// `{"spec":...,"status":...}`, as serde_json writes a [`Body`].
    body: Box<str>,
}

#[derive(Serialize, Deserialize, Default)]
struct Body {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<PersistentVolumeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<PersistentVolumeStatus>,
}

impl CompactVolume {
    /// The compact form of `volume`, without its managed fields.
    pub(crate) fn new(volume: PersistentVolume) -> Result<Self, serde_json::Error> {
        let PersistentVolume {
            mut metadata,
            spec,
            status,
        } = volume;
        metadata.managed_fields = None;
        let body = serde_json::to_string(&Body { spec, status })?.into_boxed_str();
        Ok(Self { metadata, body })
    }

    /// The volume this was made from (less its managed fields).
    pub(crate) fn volume(&self) -> Result<PersistentVolume, serde_json::Error> {
        let Body { spec, status } = serde_json::from_str(&self.body)?;
        Ok(PersistentVolume {
            metadata: self.metadata.clone(),
            spec,
            status,
        })
    }

    /// Bytes held by the JSON part (for tests and sizing).
    #[cfg(test)]
    pub(crate) fn body_len(&self) -> usize {
        self.body.len()
    }
}

impl<'de> Deserialize<'de> for CompactVolume {
    /// Decodes a PersistentVolume as the API server sends it, with the same checks as
    /// decoding a `PersistentVolume` (a malformed volume is an error, as it is there).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::new(PersistentVolume::deserialize(deserializer)?).map_err(D::Error::custom)
    }
}

impl Resource for CompactVolume {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        PersistentVolume::kind(&())
    }

    fn group((): &()) -> Cow<'_, str> {
        PersistentVolume::group(&())
    }

    fn version((): &()) -> Cow<'_, str> {
        PersistentVolume::version(&())
    }

    fn plural((): &()) -> Cow<'_, str> {
        PersistentVolume::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Rebuilds the volume of a cache entry; a failure (which would be a bug: the JSON is
/// our own) is logged and reads as "not cached", which never deletes anything.
pub(crate) fn rebuild(entry: &Arc<CompactVolume>) -> Option<Arc<PersistentVolume>> {
    match entry.volume() {
        Ok(volume) => Some(Arc::new(volume)),
        Err(error) => {
            tracing::error!(
                pv = entry.metadata.name.as_deref().unwrap_or_default(),
                %error,
                "cannot rebuild a cached volume; treating it as not cached"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn csi_volume() -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": "pvc-1",
                "uid": "u-1",
                "resourceVersion": "42",
                "annotations": {"pv.kubernetes.io/provisioned-by": "example.com/fake"},
                "finalizers": ["kubernetes.io/pv-protection"],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}]
            },
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "fast",
                "claimRef": {"namespace": "ns", "name": "c", "uid": "cu-1"},
                "csi": {"driver": "example.com/fake", "volumeHandle": "vol-1",
                        "volumeAttributes": {"a": "b"}}
            },
            "status": {"phase": "Bound"}
        }))
        .unwrap()
    }

    #[test]
    fn a_rebuilt_volume_equals_the_original_less_managed_fields() {
        let original = csi_volume();
        assert!(original.metadata.managed_fields.is_some());
        let compact: CompactVolume =
            serde_json::from_str(&serde_json::to_string(&original).unwrap()).unwrap();
        assert_eq!(compact.metadata.managed_fields, None);
        let mut expected = original;
        expected.metadata.managed_fields = None;
        assert_eq!(compact.volume().unwrap(), expected);
        assert!(
            compact.body_len() < 600,
            "the JSON of a CSI volume is small: {} bytes",
            compact.body_len()
        );
    }

    #[test]
    fn a_volume_without_spec_or_status_round_trips() {
        let bare = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("bare".into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        };
        let compact = CompactVolume::new(bare).unwrap();
        let rebuilt = compact.volume().unwrap();
        assert_eq!(rebuilt.spec, None);
        assert_eq!(rebuilt.status, None);
        assert_eq!(rebuilt.metadata.name.as_deref(), Some("bare"));
    }

    #[test]
    fn a_malformed_volume_is_an_error_naming_the_field() {
        let err = serde_json::from_str::<CompactVolume>(
            r#"{"metadata":{"name":"x"},"spec":{"capacity":"not a map"}}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("map"), "{err}");
    }

    #[test]
    fn a_corrupt_entry_reads_as_not_cached() {
        let entry = Arc::new(CompactVolume {
            metadata: ObjectMeta {
                name: Some("broken".into()),
                ..ObjectMeta::default()
            },
            body: r#"{"spec":{"capacity":7}}"#.into(),
        });
        assert!(rebuild(&entry).is_none());
    }

    #[test]
    fn it_is_served_at_the_persistent_volume_url() {
        assert_eq!(
            CompactVolume::url_path(&(), None),
            "/api/v1/persistentvolumes"
        );
        assert_eq!(CompactVolume::kind(&()), "PersistentVolume");
    }
}
