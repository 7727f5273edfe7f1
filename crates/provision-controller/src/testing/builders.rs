//! Chainable builders of test objects: [`pvc`], [`pv`], [`class`].

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{
            HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
            PersistentVolumeClaimSpec, PersistentVolumeSpec, PersistentVolumeStatus,
            VolumeResourceRequirements,
        },
        storage::v1::StorageClass,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
};

use crate::annotations::{
    ANN_MIGRATED_TO, ANN_PROVISIONED_BY, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
};

/// Starts a claim builder: namespace `default`, 1Gi, ReadWriteOnce.
pub fn pvc(name: &str) -> PvcBuilder {
    PvcBuilder(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity("1Gi".into()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    })
}

/// Builds a [`PersistentVolumeClaim`]; see [`pvc`].
#[derive(Clone, Debug)]
#[must_use]
pub struct PvcBuilder(PersistentVolumeClaim);

fn spec(claim: &mut PersistentVolumeClaim) -> &mut PersistentVolumeClaimSpec {
    claim.spec.get_or_insert_with(Default::default)
}

impl PvcBuilder {
    /// Sets the namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.0.metadata.namespace = Some(ns.to_owned());
        self
    }
    /// Sets the UID (the API server sets it on create).
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.to_owned());
        self
    }
    /// Sets `spec.storageClassName`.
    pub fn storage_class(mut self, class: &str) -> Self {
        spec(&mut self.0).storage_class_name = Some(class.to_owned());
        self
    }
    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        self
    }
    /// Sets `volume.kubernetes.io/storage-provisioner` (what the PV controller does).
    pub fn provisioner(self, name: &str) -> Self {
        self.annotation(ANN_STORAGE_PROVISIONER, name)
    }
    /// Sets `volume.kubernetes.io/selected-node` (what the scheduler does).
    pub fn selected_node(self, node: &str) -> Self {
        self.annotation(ANN_SELECTED_NODE, node)
    }
    /// Adds a finalizer.
    pub fn finalizer(mut self, finalizer: &str) -> Self {
        let finalizers = self.0.metadata.finalizers.get_or_insert_with(Vec::new);
        finalizers.push(finalizer.to_owned());
        self
    }
    /// Sets a deletion timestamp (the claim is being deleted).
    pub fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        self
    }
    /// Sets `spec.volumeName` (a bound claim).
    pub fn volume_name(mut self, name: &str) -> Self {
        spec(&mut self.0).volume_name = Some(name.to_owned());
        self
    }
    /// Asks for `volumeMode: Block`.
    pub fn block(mut self) -> Self {
        spec(&mut self.0).volume_mode = Some("Block".into());
        self
    }
    /// Sets the requested storage, e.g. `"5Gi"`.
    pub fn request(mut self, quantity: &str) -> Self {
        spec(&mut self.0).resources = Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(quantity.into()),
            )])),
            ..VolumeResourceRequirements::default()
        });
        self
    }
    /// The claim.
    #[must_use]
    pub fn build(self) -> PersistentVolumeClaim {
        self.0
    }
}

impl From<PvcBuilder> for PersistentVolumeClaim {
    fn from(builder: PvcBuilder) -> Self {
        builder.build()
    }
}

/// Starts a volume builder: phase `Available`, reclaim policy `Delete`, 1Gi, host path.
pub fn pv(name: &str) -> PvBuilder {
    PvBuilder(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("1Gi".into()),
            )])),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            host_path: Some(HostPathVolumeSource {
                path: format!("/fake/{name}"),
                type_: None,
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Available".into()),
            ..PersistentVolumeStatus::default()
        }),
    })
}

/// Builds a [`PersistentVolume`]; see [`pv`].
#[derive(Clone, Debug)]
#[must_use]
pub struct PvBuilder(PersistentVolume);

impl PvBuilder {
    fn spec(&mut self) -> &mut PersistentVolumeSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }
    /// Sets `status.phase` (`Bound`, `Released`, `Failed`, ...).
    pub fn phase(mut self, phase: &str) -> Self {
        self.0.status.get_or_insert_with(Default::default).phase = Some(phase.to_owned());
        self
    }
    /// Sets the reclaim policy (`Delete`, `Retain`, `Recycle`).
    pub fn reclaim_policy(mut self, policy: &str) -> Self {
        self.spec().persistent_volume_reclaim_policy = Some(policy.to_owned());
        self
    }
    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        self
    }
    /// Sets `pv.kubernetes.io/provisioned-by`.
    pub fn provisioned_by(self, name: &str) -> Self {
        self.annotation(ANN_PROVISIONED_BY, name)
    }
    /// Sets `pv.kubernetes.io/migrated-to`.
    pub fn migrated_to(self, name: &str) -> Self {
        self.annotation(ANN_MIGRATED_TO, name)
    }
    /// Adds a finalizer.
    pub fn finalizer(mut self, finalizer: &str) -> Self {
        self.0
            .metadata
            .finalizers
            .get_or_insert_with(Default::default)
            .push(finalizer.to_owned());
        self
    }
    /// Sets a deletion timestamp (the object is being deleted).
    pub fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        self
    }
    /// Sets `spec.storageClassName`.
    pub fn storage_class(mut self, class: &str) -> Self {
        self.spec().storage_class_name = Some(class.to_owned());
        self
    }
    /// Sets `spec.claimRef`.
    pub fn claim_ref(mut self, namespace: &str, name: &str, uid: &str) -> Self {
        self.spec().claim_ref = Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectReference::default()
        });
        self
    }
    /// The volume.
    #[must_use]
    pub fn build(self) -> PersistentVolume {
        self.0
    }
}

/// Starts a StorageClass builder: provisioner `example.com/fake`, binding `Immediate`.
pub fn class(name: &str) -> ClassBuilder {
    ClassBuilder(StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: "example.com/fake".into(),
        volume_binding_mode: Some("Immediate".into()),
        ..StorageClass::default()
    })
}

/// Builds a [`StorageClass`]; see [`class`].
#[derive(Clone, Debug)]
#[must_use]
pub struct ClassBuilder(StorageClass);

impl ClassBuilder {
    /// Sets `provisioner`.
    pub fn provisioner(mut self, name: &str) -> Self {
        name.clone_into(&mut self.0.provisioner);
        self
    }
    /// Sets `volumeBindingMode: WaitForFirstConsumer`.
    pub fn wait_for_first_consumer(mut self) -> Self {
        self.0.volume_binding_mode = Some("WaitForFirstConsumer".into());
        self
    }
    /// Sets `reclaimPolicy`.
    pub fn reclaim_policy(mut self, policy: &str) -> Self {
        self.0.reclaim_policy = Some(policy.to_owned());
        self
    }
    /// Adds a parameter.
    pub fn parameter(mut self, key: &str, value: &str) -> Self {
        self.0
            .parameters
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        self
    }
    /// The class.
    #[must_use]
    pub fn build(self) -> StorageClass {
        self.0
    }
}
