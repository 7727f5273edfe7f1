//! [`AttachedVolumeGuard`]: keeps a volume that a VolumeAttachment still names.

use async_trait::async_trait;
use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::VolumeAttachment};
use kube_client::{Api, Client, api::ListParams};
use provision_controller::DeletionGuard;

/// The node a VolumeAttachment attaches persistent volume `pv_name` to, if any
/// (upstream's `canDeleteVolume`).
pub(crate) async fn attached_node(
    client: &Client,
    pv_name: &str,
) -> Result<Option<String>, kube_client::Error> {
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    // Served from the API server's watch cache, as an informer's list would be.
    let list = attachments.list(&ListParams::default().match_any()).await?;
    Ok(list
        .items
        .into_iter()
        .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv_name))
        .map(|va| va.spec.node_name))
}

/// A [`DeletionGuard`] that vetoes deleting a released volume while a VolumeAttachment
/// names it, for a driver with `PUBLISH_UNPUBLISH_VOLUME` (a volume must be detached
/// before DeleteVolume).
///
/// [`CsiProvisioner`](crate::CsiProvisioner) already refuses such a deletion itself, as
/// upstream does: its `delete` fails with "persistentvolume ... is still attached to node
/// ...", which gives the volume a `VolumeFailedDelete` event and a retry with backoff. The
/// guard is the quiet alternative: no event, and the volume is looked at again only when
/// it changes or at the next resync. A list that fails lets the deletion go on (the
/// provisioner's own check then decides).
#[derive(Clone)]
pub struct AttachedVolumeGuard {
    client: Client,
}

impl std::fmt::Debug for AttachedVolumeGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedVolumeGuard")
            .finish_non_exhaustive()
    }
}

impl AttachedVolumeGuard {
    /// A guard reading VolumeAttachments with `client`.
    #[must_use]
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl DeletionGuard for AttachedVolumeGuard {
    async fn should_delete(&self, volume: &PersistentVolume) -> bool {
        let name = volume.metadata.name.as_deref().unwrap_or_default();
        match attached_node(&self.client, name).await {
            Ok(None) => true,
            Ok(Some(node)) => {
                tracing::info!(pv = name, %node, "volume still attached; not deleting it yet");
                false
            }
            Err(error) => {
                tracing::warn!(pv = name, %error, "listing volumeattachments failed");
                true
            }
        }
    }
}
