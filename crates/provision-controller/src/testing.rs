//! Test kit (feature `testing`): a recording [`FakeProvisioner`] with scripted results,
//! and chainable builders [`pvc`], [`pv`], [`class`].
//!
//! ```
//! use provision_controller::testing::{class, pvc, FakeProvisioner, ProvisionStep};
//!
//! let claim = pvc("data").namespace("apps").storage_class("fast").build();
//! let fast = class("fast").provisioner("example.com/fake").wait_for_first_consumer().build();
//! let fake = FakeProvisioner::new().script_provision([ProvisionStep::InBackground]);
//! # let _ = (claim, fast, fake);
//! ```

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use async_trait::async_trait;
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

use crate::{
    DeleteError, ProvisionError, ProvisionOptions, Provisioner,
    annotations::{
        ANN_MIGRATED_TO, ANN_PROVISIONED_BY, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
    },
};

/// What the next [`FakeProvisioner::provision`] call does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProvisionStep {
    /// Create the asset and return its PV (also what happens when the script is empty).
    Succeed,
    /// Return [`ProvisionError::InBackground`].
    InBackground,
    /// Return [`ProvisionError::Final`].
    Final,
    /// Return [`ProvisionError::NoChange`].
    NoChange,
    /// Return [`ProvisionError::Reschedule`].
    Reschedule,
    /// Return [`ProvisionError::Ignored`].
    Ignored,
    /// Panic.
    Panic,
    /// Never return (to exercise timeouts).
    Hang,
}

/// What the next [`FakeProvisioner::delete`] call does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeleteStep {
    /// Delete the asset (also what happens when the script is empty).
    Succeed,
    /// Return [`DeleteError::Failed`].
    Fail,
    /// Return [`DeleteError::Ignored`].
    Ignored,
}

#[derive(Default)]
struct State {
    provision_script: VecDeque<ProvisionStep>,
    delete_script: VecDeque<DeleteStep>,
    provision_calls: Vec<ProvisionOptions>,
    delete_calls: Vec<String>,
    assets: BTreeSet<String>,
}

/// A [`Provisioner`] that records its calls, keeps a set of "assets" (PV names) and
/// follows scripts. Clones share their state.
#[derive(Clone, Default)]
pub struct FakeProvisioner {
    state: Arc<Mutex<State>>,
    block: bool,
}

impl FakeProvisioner {
    /// A provisioner that succeeds at everything and does not support block volumes.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// Claims `supports_block() == true`.
    #[must_use]
    pub fn with_block_support(mut self) -> Self {
        self.block = true;
        self
    }
    /// Appends steps for the next `provision` calls.
    #[must_use]
    pub fn script_provision(self, steps: impl IntoIterator<Item = ProvisionStep>) -> Self {
        self.lock().provision_script.extend(steps);
        self
    }
    /// Appends steps for the next `delete` calls.
    #[must_use]
    pub fn script_delete(self, steps: impl IntoIterator<Item = DeleteStep>) -> Self {
        self.lock().delete_script.extend(steps);
        self
    }
    /// Every `provision` call so far, in order.
    #[must_use]
    pub fn provision_calls(&self) -> Vec<ProvisionOptions> {
        self.lock().provision_calls.clone()
    }
    /// The volume names of every `delete` call so far, in order.
    #[must_use]
    pub fn delete_calls(&self) -> Vec<String> {
        self.lock().delete_calls.clone()
    }
    /// The assets that exist now (created and not deleted).
    #[must_use]
    pub fn assets(&self) -> BTreeSet<String> {
        self.lock().assets.clone()
    }
    /// Adds an asset, as if an earlier run had created it.
    pub fn add_asset(&self, name: &str) {
        self.lock().assets.insert(name.to_owned());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is impossible: the scripted panic happens after.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl Provisioner for FakeProvisioner {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        let step = {
            let mut state = self.lock();
            state.provision_calls.push(options.clone());
            let step = state
                .provision_script
                .pop_front()
                .unwrap_or(ProvisionStep::Succeed);
            if step == ProvisionStep::Succeed {
                state.assets.insert(options.pv_name.clone());
            }
            step
        };
        let err = |msg: &str| -> crate::BoxError { msg.into() };
        match step {
            ProvisionStep::Succeed => Ok(volume_for(options)),
            ProvisionStep::InBackground => Err(ProvisionError::InBackground(err(
                "fake: still provisioning",
            ))),
            ProvisionStep::Final => Err(ProvisionError::Final(err("fake: provisioning failed"))),
            ProvisionStep::NoChange => Err(ProvisionError::NoChange(err("fake: no change"))),
            ProvisionStep::Reschedule => Err(ProvisionError::Reschedule(err(
                "fake: node cannot host the volume",
            ))),
            ProvisionStep::Ignored => Err(ProvisionError::Ignored {
                reason: "fake: not mine".into(),
            }),
            ProvisionStep::Panic => panic!("fake provisioner panicked as scripted"),
            ProvisionStep::Hang => std::future::pending().await,
        }
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        let mut state = self.lock();
        state.delete_calls.push(name.clone());
        match state
            .delete_script
            .pop_front()
            .unwrap_or(DeleteStep::Succeed)
        {
            DeleteStep::Succeed => {
                state.assets.remove(&name);
                Ok(())
            }
            DeleteStep::Fail => Err(DeleteError::Failed("fake: delete failed".into())),
            DeleteStep::Ignored => Err(DeleteError::Ignored {
                reason: "fake: not mine".into(),
            }),
        }
    }

    fn supports_block(&self) -> bool {
        self.block
    }
}

/// The PV a simple driver would return: capacity, access modes and volume mode from the
/// claim, reclaim policy and mount options from the class, a host-path source.
#[must_use]
pub fn volume_for(options: &ProvisionOptions) -> PersistentVolume {
    let claim_spec = options.claim.spec.clone().unwrap_or_default();
    let capacity = claim_spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage").cloned())
        .unwrap_or_else(|| Quantity("1Gi".into()));
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(options.pv_name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_owned(), capacity)])),
            access_modes: claim_spec
                .access_modes
                .or_else(|| Some(vec!["ReadWriteOnce".into()])),
            volume_mode: claim_spec.volume_mode,
            persistent_volume_reclaim_policy: Some(
                options
                    .storage_class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".into()),
            ),
            mount_options: options.storage_class.mount_options.clone(),
            host_path: Some(HostPathVolumeSource {
                path: format!("/fake/{}", options.pv_name),
                type_: None,
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

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
