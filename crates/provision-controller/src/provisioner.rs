//! The traits a storage driver implements: [`Provisioner`], and the opt-ins
//! [`Qualifier`], [`DeletionGuard`], [`AssetLookup`] and [`LateAssets`].

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
        }
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
///   the loser's in [`LateAssets::volume_saved`], which is called with the PV that was
///   saved (by either replica). A driver must never delete, while
///   provisioning, an asset another replica may have returned: a PV may already name it.
///
/// With [crash-safe provisioning](crate::Config::crash_safe_provisioning) these rules are
/// what lets a new controller clean up a claim deleted while an earlier one was
/// provisioning: its journal names the claim, the PV name and the class the provisioning
/// started with; it finds the asset with those options ([`AssetLookup::find`], else
/// `provision`), then saves a PV for the asset, which the PV controller releases and the controller reclaims as usual (a fresh
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
    fn supports_block(&self) -> bool {
        (**self).supports_block()
    }
}

/// Opt-in: finds the asset provisioned for a claim without creating one
/// ([`ProvisionController::asset_lookup`](crate::ProvisionController::asset_lookup)).
///
/// With crash-safe provisioning, a claim that will not get its volume the normal way
/// (deleted, bound to another PV) while an asset may exist for it is cleaned up: the
/// controller asks for that asset, records it in a PV, and the PV is then released and
/// reclaimed. Without a lookup the controller calls [`Provisioner::provision`], which is
/// correct (the asset is reclaimed all the same) but may create an asset only to delete
/// it. No Go counterpart.
#[async_trait]
pub trait AssetLookup: Send + Sync + 'static {
    /// The PV of the asset that exists for `options.pv_name`, or `None` when none does.
    /// **Create nothing.**
    ///
    /// # Errors
    /// [`ProvisionError::InBackground`] while an asset may still appear (a create in
    /// flight); any other error is retried with backoff.
    async fn find(
        &self,
        options: &ProvisionOptions,
    ) -> Result<Option<PersistentVolume>, ProvisionError>;
}

#[async_trait]
impl<P: AssetLookup + ?Sized> AssetLookup for Arc<P> {
    async fn find(
        &self,
        options: &ProvisionOptions,
    ) -> Result<Option<PersistentVolume>, ProvisionError> {
        (**self).find(options).await
    }
}

/// Opt-in for a backend in which more than one asset can be made for a claim, or an
/// asset can appear after the controller stopped waiting for it (a create that timed out
/// on the client and lands later, possibly sent by a replica that died meanwhile)
/// ([`ProvisionController::late_assets`](crate::ProvisionController::late_assets)).
/// No Go counterpart.
#[async_trait]
pub trait LateAssets: Send + Sync + 'static {
    /// Called once the PV `saved` is stored (by this replica, or by another one first):
    /// from now on it is the one record of the claim's asset. Release the other assets
    /// made for the same claim (by replicas that raced, or creates that landed late): no
    /// PV can name them any more. **Never touch the asset `saved` names.**
    ///
    /// # Errors
    /// A failure is logged and fails nothing; the asset `saved` names is kept whatever
    /// happens. With crash-safe provisioning the call is made again (from the journal, by
    /// whichever replica leads) until it succeeds, while the PV exists, is ours and is not
    /// being deleted.
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), DeleteError>;

    /// How long after a PV is saved an asset made for its claim may still appear; `None`
    /// (the default): never.
    ///
    /// With `Some(window)` and crash-safe provisioning, the journal keeps each claim it
    /// provisioned until `window` has passed since its PV was saved, and whichever
    /// replica leads then makes the last sweep: [`volume_saved`](Self::volume_saved)
    /// again when the PV exists, else a cleanup that records an asset that landed in a PV
    /// which is then reclaimed. A cleanup that finds no asset believes it only once
    /// `window` has passed since it first looked.
    fn window(&self) -> Option<std::time::Duration> {
        None
    }
}

#[async_trait]
impl<P: LateAssets + ?Sized> LateAssets for Arc<P> {
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), DeleteError> {
        (**self).volume_saved(saved).await
    }
    fn window(&self) -> Option<std::time::Duration> {
        (**self).window()
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
fn _dyn_compatible(
    _: &dyn Provisioner,
    _: &dyn Qualifier,
    _: &dyn DeletionGuard,
    _: &dyn AssetLookup,
    _: &dyn LateAssets,
) {
}

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
