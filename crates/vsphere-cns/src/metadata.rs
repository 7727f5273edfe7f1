//! [`CnsMetadataBackend`]: pushes `CnsVolumeMetadata` entities to CNS with
//! `CnsUpdateVolumeMetadata`.

use async_trait::async_trait;
use cnsmetadata::{BackendError, VolumeMetadataBackend, VolumeMetadataUpdate};
use tracing::instrument;

use crate::Error;
use crate::client::CnsClient;
use crate::wire::{
    CnsVolumeId, ContainerCluster, EntityMetadata, EntityReference, EntityType, KeyValue,
    VolumeMetadata, VolumeMetadataUpdateSpec,
};

/// A [`VolumeMetadataBackend`] that sends each update to vCenter with
/// `CnsUpdateVolumeMetadata`.
///
/// The update's container cluster is sent both as `containerCluster` and as the only
/// element of `containerClusterArray`, and its one entity alone in `entityMetadata`, as
/// vsphere-csi-driver does. A volume CNS does not know is [`BackendError::NotFound`]
/// (decided by [`Error::is_not_found`](crate::Error::is_not_found)). A call that got no
/// answer (it timed out, waiting for the call or for its task, or the connection broke
/// once the request may have been sent) is [`BackendError::Unanswered`]: vCenter may
/// still carry the update out, and the reconciler makes up for it.
///
/// ```no_run
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use vsphere_cns::{CnsClient, CnsMetadataBackend, VirtualCenterConfig};
///
/// let client = CnsClient::connect(&VirtualCenterConfig::new("vc.example.com", "user", "password")).await?;
/// let backend: Arc<dyn cnsmetadata::VolumeMetadataBackend> =
///     Arc::new(CnsMetadataBackend::new(client));
/// # let _ = backend;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct CnsMetadataBackend {
    client: CnsClient,
}

impl CnsMetadataBackend {
    /// A backend using `client`.
    pub fn new(client: CnsClient) -> Self {
        Self { client }
    }
}

#[async_trait]
impl VolumeMetadataBackend for CnsMetadataBackend {
    #[instrument(skip_all, fields(volume_id = %update.volume_id))]
    async fn update_volume_metadata(
        &self,
        update: &VolumeMetadataUpdate,
    ) -> Result<(), BackendError> {
        let spec = update_spec(update)?;
        self.client
            .update_volume_metadata(&spec)
            .await
            .map_err(|e| backend_error(e, &update.volume_id))
    }
}

/// The [`BackendError`] of a failed `CnsUpdateVolumeMetadata` of volume `volume_id`.
fn backend_error(error: Error, volume_id: &str) -> BackendError {
    if error.is_not_found() {
        return BackendError::not_found(volume_id);
    }
    let unanswered = match &error {
        Error::Timeout { .. } => true,
        // A connection that could not be made never carried the request.
        Error::Transport { source, .. } => !source.is_connect(),
        _ => false,
    };
    if unanswered {
        BackendError::unanswered(error)
    } else {
        BackendError::other(error)
    }
}

/// The CNS update spec for `update` (Go: the spec `updateCnsMetadata` builds).
fn update_spec(update: &VolumeMetadataUpdate) -> Result<VolumeMetadataUpdateSpec, BackendError> {
    let source = &update.container_cluster;
    let cluster = ContainerCluster {
        cluster_type: source.cluster_type.as_str().to_owned(),
        cluster_id: source.cluster_id.clone(),
        vsphere_user: source.vsphere_user.clone(),
        cluster_flavor: Some(source.cluster_flavor),
        cluster_distribution: non_empty(&source.cluster_distribution),
        delete: None,
    };
    let entity = &update.entity_metadata;
    let referred_entity = entity
        .referred_entities
        .iter()
        .map(|r| {
            Ok(EntityReference {
                entity_type: entity_type(&r.entity_type)?,
                entity_name: r.entity_name.clone(),
                namespace: non_empty(&r.namespace),
                cluster_id: non_empty(&r.cluster_id),
            })
        })
        .collect::<Result<Vec<_>, BackendError>>()?;
    let metadata = EntityMetadata {
        entity_name: entity.entity_name.clone(),
        labels: entity
            .labels
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect(),
        delete: entity.delete.then_some(true),
        cluster_id: non_empty(&entity.cluster_id),
        entity_type: entity_type(&entity.entity_type)?,
        namespace: non_empty(&entity.namespace),
        referred_entity,
    };
    Ok(VolumeMetadataUpdateSpec {
        volume_id: CnsVolumeId::new(update.volume_id.clone()),
        metadata: VolumeMetadata::for_cluster(cluster, vec![metadata]),
    })
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// The CNS entity type of a CRD entity type. The CRD's type is open (an object naming a
/// type CNS does not know is still read, and fails here, naming the type); the CNS wire
/// type is closed.
fn entity_type(value: &cnsmetadata::EntityType) -> Result<EntityType, BackendError> {
    EntityType::from_wire(value.as_str()).ok_or_else(|| {
        BackendError::other(format!(
            "entity type {:?} is not known to cns",
            value.as_str()
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::wire::ClusterFlavor;
    use cnsmetadata::{ClusterType, EntityReference as CrdReference};

    use super::*;

    fn update(delete: bool) -> VolumeMetadataUpdate {
        VolumeMetadataUpdate {
            volume_id: "fcd-1".into(),
            entity_metadata: cnsmetadata::EntityMetadata {
                entity_type: cnsmetadata::EntityType::PersistentVolumeClaim,
                entity_name: "data".into(),
                namespace: "shop".into(),
                labels: BTreeMap::from([("b".into(), "2".into()), ("a".into(), "1".into())]),
                delete,
                cluster_id: "gc-1".into(),
                referred_entities: vec![CrdReference::new(
                    cnsmetadata::EntityType::PersistentVolume,
                    "pvc-guest-a",
                    "",
                    "gc-1",
                )],
            },
            container_cluster: cnsmetadata::ContainerCluster {
                cluster_type: ClusterType::Kubernetes,
                cluster_id: "gc-1".into(),
                vsphere_user: "cns-user".into(),
                cluster_flavor: cnsmetadata::ClusterFlavor::GuestCluster,
                cluster_distribution: String::new(),
            },
        }
    }

    #[test]
    fn an_update_becomes_one_entity_with_the_cluster_twice() {
        let spec = update_spec(&update(false)).unwrap();
        let cluster = ContainerCluster {
            cluster_distribution: None,
            ..ContainerCluster::kubernetes("gc-1", "cns-user", ClusterFlavor::GuestCluster)
        };
        assert_eq!(spec.volume_id, CnsVolumeId::from("fcd-1"));
        assert_eq!(spec.metadata.container_cluster, cluster);
        assert_eq!(spec.metadata.container_cluster_array, vec![cluster]);
        assert_eq!(
            spec.metadata.entity_metadata,
            vec![EntityMetadata {
                entity_name: "data".into(),
                labels: vec![KeyValue::new("a", "1"), KeyValue::new("b", "2")],
                delete: None,
                cluster_id: Some("gc-1".into()),
                entity_type: EntityType::PersistentVolumeClaim,
                namespace: Some("shop".into()),
                referred_entity: vec![EntityReference {
                    entity_type: EntityType::PersistentVolume,
                    entity_name: "pvc-guest-a".into(),
                    namespace: None,
                    cluster_id: Some("gc-1".into()),
                }],
            }]
        );
    }

    #[test]
    fn a_timeout_may_land_later_and_a_fault_never() {
        let timeout = |operation| Error::Timeout {
            operation,
            after: std::time::Duration::from_millis(1_500),
        };
        for error in [timeout("CnsUpdateVolumeMetadata"), timeout("task wait")] {
            let error = backend_error(error, "fcd-1");
            assert!(error.may_land_later(), "{error:?}");
            assert!(!error.is_not_found());
        }
        let fault = |fault_type: &str| Error::Fault {
            operation: "CnsUpdateVolumeMetadata",
            fault_type: fault_type.into(),
            message: "injected".into(),
        };
        let busy = backend_error(fault("CnsFault"), "fcd-1");
        assert!(!busy.may_land_later() && !busy.is_not_found(), "{busy:?}");
        let gone = backend_error(fault("NotFound"), "fcd-1");
        assert!(gone.is_not_found() && !gone.may_land_later(), "{gone:?}");
        let garbled = Error::Protocol {
            operation: "CnsUpdateVolumeMetadata",
            detail: "no task".into(),
        };
        assert!(!backend_error(garbled, "fcd-1").may_land_later());
    }

    #[tokio::test]
    async fn a_refused_connection_never_carried_the_update() {
        // A port nobody listens on: bound, then released.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let url = format!("http://{addr}/sdk");
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let source = client.get(&url).send().await.expect_err("nobody listens");
        assert!(source.is_connect(), "{source:?}");
        let error = backend_error(
            Error::Transport {
                operation: "CnsUpdateVolumeMetadata",
                url,
                source,
            },
            "fcd-1",
        );
        assert!(!error.may_land_later(), "{error:?}");
    }

    #[test]
    fn delete_is_sent_only_when_set() {
        let spec = update_spec(&update(true)).unwrap();
        assert_eq!(spec.metadata.entity_metadata[0].delete, Some(true));
    }

    #[test]
    fn an_unknown_entity_type_is_an_error_not_a_panic() {
        let mut bad = update(false);
        bad.entity_metadata.entity_type = cnsmetadata::EntityType::Other("NODE".into());
        let err = update_spec(&bad).unwrap_err();
        assert!(!err.is_not_found());
    }
}
