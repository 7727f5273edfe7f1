//! The traits a storage driver implements: [`Provisioner`], [`Qualifier`], [`DeletionGuard`].

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};

use crate::error::{DeleteError, ProvisionError};

/// What [`Provisioner::provision`] needs to create one volume.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ProvisionOptions {
    /// The claim's StorageClass (its parameters, reclaim policy, mount options, topologies).
    pub storage_class: Arc<StorageClass>,
    /// The name the PersistentVolume must have (by default `pvc-<claim uid>`).
    ///
    /// The name is deterministic, so a driver can use it as an idempotency key: a second
    /// call with the same name must not create a second asset.
    #[doc(alias = "PVName")]
    pub pv_name: String,
    /// The claim being provisioned.
    #[doc(alias = "PVC")]
    pub claim: Arc<PersistentVolumeClaim>,
    /// The node the scheduler chose (`volume.kubernetes.io/selected-node`), for
    /// `WaitForFirstConsumer` classes. Passed by name, unchecked (as Go v13): the node
    /// may have been deleted since; answer [`ProvisionError::Reschedule`] to have the
    /// scheduler choose again.
    #[doc(alias = "SelectedNode")]
    pub selected_node_name: Option<String>,
    /// The claim will not get this volume the normal way (it was deleted, vanished or
    /// bound to another PV) and the controller only looks for an asset that may exist, to
    /// record it in a PV that is then released and reclaimed (crash-safe provisioning):
    /// **create nothing**. Return the PV of an asset that exists for
    /// [`pv_name`](Self::pv_name), [`ProvisionError::InBackground`] while one may still
    /// appear (a create in flight), or [`ProvisionError::Ignored`] when none exists.
    ///
    /// A driver that creates an asset anyway stays correct (its PV is released and the
    /// asset deleted), but makes an asset only to delete it, and one more asset that a
    /// controller stopped at the wrong moment cannot find again. No Go counterpart.
    pub cleanup: bool,
}

impl ProvisionOptions {
    /// Builds options from their parts (the struct is `#[non_exhaustive]`).
    #[must_use]
    pub fn new(
        storage_class: Arc<StorageClass>,
        pv_name: impl Into<String>,
        claim: Arc<PersistentVolumeClaim>,
        selected_node_name: Option<String>,
    ) -> Self {
        Self {
            storage_class,
            pv_name: pv_name.into(),
            claim,
            selected_node_name,
            cleanup: false,
        }
    }

    /// The same options for a cleanup ([`cleanup`](Self::cleanup)): find, do not create.
    #[must_use]
    pub fn for_cleanup(mut self) -> Self {
        self.cleanup = true;
        self
    }
}

/// Creates and deletes the storage assets behind PersistentVolumes.
///
/// The controller owns everything Kubernetes-side (claimRef, annotations, finalizers,
/// saving and deleting the PV object); the driver only manages its assets.
///
/// # Guarantees
/// - `provision` is never called twice at once for the same claim, nor `delete` for the
///   same volume.
/// - A panic inside either method is caught and treated as a failure of that call.
///
/// # Assumptions (the driver's contract)
/// The controller can be stopped, killed or lose its lease at any moment, also while a
/// call is running; another replica or a restarted process then calls again. A driver
/// must therefore honour what the Go library also assumes:
/// - **`provision` is idempotent by `options.pv_name`.** A call for a name whose asset
///   exists (complete or still being created) finds that asset and returns its PV (or
///   [`ProvisionError::InBackground`] while it is not ready); it never creates a second
///   asset. The name is deterministic (`pvc-<claim uid>` by default), so it can be the
///   backend's idempotency key or the asset's name.
/// - **Errors tell the truth about the backend.** [`ProvisionError::Failed`],
///   [`ProvisionError::Infeasible`], [`ProvisionError::Reschedule`] and
///   [`ProvisionError::Ignored`] mean that no asset
///   exists for this name (none was created, or it was removed again); anything that may
///   have left an asset behind is [`ProvisionError::InBackground`] or
///   [`ProvisionError::NoChange`].
/// - **`delete` accepts the PV that `provision` returned** (plus the fields the
///   controller adds) and succeeds when the asset is already gone.
/// - **Two replicas may provision one claim at once** (a failover, a replica cut off
///   from the API server whose calls still finish): both must end up describing one
///   asset (for example the oldest, or the lowest id, of those found by name), or release
///   the loser's in [`volume_saved`](Provisioner::volume_saved), which is called with
///   the PV that was saved (by either replica). A driver must never delete, while
///   provisioning, an asset another replica may have returned: a PV may already name it.
///
/// With [crash-safe provisioning](crate::Config::crash_safe_provisioning) these rules are
/// what lets a new controller clean up a claim deleted while an earlier one was
/// provisioning: its journal names the claim, the PV name and the class the provisioning
/// started with; it calls `provision` with those options and
/// [`cleanup`](ProvisionOptions::cleanup) set (finding the asset), then saves a PV for the
/// asset, which the PV controller releases and the controller reclaims as usual (a fresh
/// read, then `delete`).
///
/// ```
/// use async_trait::async_trait;
/// use k8s_openapi::api::core::v1::PersistentVolume;
/// use provision_controller::{DeleteError, ProvisionError, ProvisionOptions, Provisioner};
///
/// struct Nothing;
///
/// #[async_trait]
/// impl Provisioner for Nothing {
///     async fn provision(&self, _: &ProvisionOptions) -> Result<PersistentVolume, ProvisionError> {
///         Err(ProvisionError::Ignored { reason: "this driver provisions nothing".into() })
///     }
///     async fn delete(&self, _: &PersistentVolume) -> Result<(), DeleteError> {
///         Err(DeleteError::Ignored { reason: "nothing to delete".into() })
///     }
/// }
/// ```
#[async_trait]
pub trait Provisioner: Send + Sync + 'static {
    /// Creates the asset for `options.claim` and returns the PV that exposes it.
    ///
    /// The returned PV must be named `options.pv_name`. The controller sets its
    /// `spec.claimRef`, `spec.storageClassName`, the `pv.kubernetes.io/provisioned-by`
    /// annotation and (when configured) the protection finalizer.
    ///
    /// # Errors
    /// The variant tells the controller whether work may still be running in the backend;
    /// see [`ProvisionError`].
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError>;

    /// Deletes the asset behind `volume`; never deletes the PV object itself.
    ///
    /// Must succeed when the asset is already gone.
    ///
    /// # Errors
    /// [`DeleteError::Ignored`] leaves the volume to another provisioner;
    /// [`DeleteError::Failed`] is retried with backoff.
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError>;

    /// Called once the PV `saved` is stored (by this replica, or by another one first):
    /// from now on it is the one record of the claim's asset.
    ///
    /// A driver whose assets are not identified by the PV name alone may hold others made
    /// for the same claim by replicas that raced (a create that timed out and landed
    /// later, the loser of a race to save the PV, whose replica may have died before it
    /// could release its own): release them here. No PV can name them any more: a PV of
    /// this name exists, and PV names are unique. **Never touch the asset `saved` names.**
    /// The default does nothing.
    ///
    /// # Errors
    /// A failure is logged and fails nothing; the asset `saved` names is kept whatever
    /// happens. With crash-safe provisioning the call is made again (from the journal,
    /// by whichever replica leads) until it succeeds, while the PV exists, is ours and is
    /// not being deleted.
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), DeleteError> {
        let _ = saved;
        Ok(())
    }

    /// How long after a PV is saved an asset made for its claim may still appear: a
    /// create that timed out on the client and lands later, possibly sent by a replica
    /// that died or was cut off meanwhile. `None` (the default): never.
    ///
    /// With `Some(window)` and crash-safe provisioning, the controller's journal keeps
    /// each claim it provisioned until `window` has passed since its PV was saved, and
    /// whichever replica leads then makes the last sweep: [`volume_saved`](Self::volume_saved)
    /// again when the PV exists, else (the PV was deleted meanwhile) a cleanup `provision`
    /// call that saves a PV for an asset that landed, which is then reclaimed. A cleanup
    /// that finds no asset believes it only once `window` has passed since it first
    /// looked.
    fn late_asset_window(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether `volumeMode: Block` claims are supported. Default `false`.
    #[doc(alias = "BlockProvisioner")]
    #[doc(alias = "SupportsBlock")]
    fn supports_block(&self) -> bool {
        false
    }
}

#[async_trait]
impl<P: Provisioner + ?Sized> Provisioner for Arc<P> {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        (**self).provision(options).await
    }
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        (**self).delete(volume).await
    }
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), DeleteError> {
        (**self).volume_saved(saved).await
    }
    fn late_asset_window(&self) -> Option<std::time::Duration> {
        (**self).late_asset_window()
    }
    fn supports_block(&self) -> bool {
        (**self).supports_block()
    }
}

/// Decides whether a claim should be provisioned at all (Go: `Qualifier`).
///
/// Closures `Fn(&PersistentVolumeClaim) -> bool` implement it.
#[async_trait]
#[doc(alias = "ShouldProvision")]
pub trait Qualifier: Send + Sync + 'static {
    /// `false` makes the controller skip the claim without an event.
    async fn should_provision(&self, claim: &PersistentVolumeClaim) -> bool;
}

#[async_trait]
impl<F> Qualifier for F
where
    F: Fn(&PersistentVolumeClaim) -> bool + Send + Sync + 'static,
{
    async fn should_provision(&self, claim: &PersistentVolumeClaim) -> bool {
        self(claim)
    }
}

/// Vetoes the deletion of a released volume (Go: `DeletionGuard`).
///
/// Closures `Fn(&PersistentVolume) -> bool` implement it.
#[async_trait]
#[doc(alias = "ShouldDelete")]
pub trait DeletionGuard: Send + Sync + 'static {
    /// `false` keeps the volume and its asset.
    async fn should_delete(&self, volume: &PersistentVolume) -> bool;
}

#[async_trait]
impl<F> DeletionGuard for F
where
    F: Fn(&PersistentVolume) -> bool + Send + Sync + 'static,
{
    async fn should_delete(&self, volume: &PersistentVolume) -> bool {
        self(volume)
    }
}

#[cfg(test)]
fn _dyn_compatible(_: &dyn Provisioner, _: &dyn Qualifier, _: &dyn DeletionGuard) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closures_are_qualifiers_and_deletion_guards() {
        let q: Arc<dyn Qualifier> = Arc::new(|c: &PersistentVolumeClaim| c.spec.is_some());
        assert!(!q.should_provision(&PersistentVolumeClaim::default()).await);
        let g: Arc<dyn DeletionGuard> = Arc::new(|_: &PersistentVolume| true);
        assert!(g.should_delete(&PersistentVolume::default()).await);
    }
}
