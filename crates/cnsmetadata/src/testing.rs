//! Test helpers (feature `testing`): an in-memory backend, a clock that follows tokio's
//! paused time, and object builders.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use async_trait::async_trait;
use k8s_openapi::{
    api::core::v1::{
        CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim,
        PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube_client::api::ObjectMeta;

use crate::{
    backend::{BackendError, VolumeMetadataBackend, VolumeMetadataUpdate},
    config::Config,
    resource::{CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference, EntityType},
};

/// A scripted failure of [`InMemoryBackend`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Fail with [`BackendError::NotFound`] for the update's volume.
    NotFound,
    /// Fail with [`BackendError::Other`] carrying this message.
    Error(String),
    /// Never answer (the caller's timeout gives up), but take effect later: the update is
    /// held until [`InMemoryBackend::land_late`], as a CNS call that timed out (or that a
    /// replica which lost its lease sent) may still be carried out.
    LandsLate,
    /// Answer at once with [`BackendError::Unanswered`] (as the vSphere client's own
    /// timeout does), and take effect later, at [`InMemoryBackend::land_late`].
    Unanswered,
}

impl Failure {
    /// A [`Failure::Error`] with `message`.
    #[must_use]
    pub fn error(message: &str) -> Self {
        Self::Error(message.to_owned())
    }

    fn to_error(&self, volume_id: &str) -> BackendError {
        match self {
            Self::NotFound => BackendError::not_found(volume_id),
            Self::Error(message) => BackendError::other(message.clone()),
            Self::LandsLate => BackendError::other("no answer"),
            Self::Unanswered => BackendError::unanswered("timed out"),
        }
    }
}

/// One call to [`InMemoryBackend`] and what it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The update as received.
    pub update: VolumeMetadataUpdate,
    /// The scripted failure it got, or `None` when it succeeded.
    pub failure: Option<Failure>,
}

/// What identifies an entity on a CNS volume here: volume, entity type, name, namespace
/// and cluster ID.
type EntityKey = (String, String, String, String, String);

fn entity_key(update: &VolumeMetadataUpdate) -> EntityKey {
    let entity = &update.entity_metadata;
    (
        update.volume_id.clone(),
        entity.entity_type.as_str().to_owned(),
        entity.entity_name.clone(),
        entity.namespace.clone(),
        entity.cluster_id.clone(),
    )
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    next: VecDeque<Failure>,
    always: Option<Failure>,
    per_volume: HashMap<String, Failure>,
    /// The entity metadata on "CNS": the last add of each entity not removed since.
    entities: BTreeMap<EntityKey, VolumeMetadataUpdate>,
    /// Updates that get no answer and take effect at [`InMemoryBackend::land_late`].
    late: Vec<VolumeMetadataUpdate>,
}

impl State {
    fn apply(&mut self, update: &VolumeMetadataUpdate) {
        let key = entity_key(update);
        if update.entity_metadata.delete {
            self.entities.remove(&key);
        } else {
            self.entities.insert(key, update.clone());
        }
    }
}

/// A [`VolumeMetadataBackend`] that records every call, fails on demand, and keeps the
/// entity metadata that successful updates leave on CNS ([`entities`](Self::entities)).
///
/// Failures are chosen in this order: a failure scripted for the volume
/// ([`fail_volume`](Self::fail_volume)), then the queue of [`fail_next`](Self::fail_next),
/// then [`fail_always`](Self::fail_always); otherwise the call succeeds. Clones share state.
#[derive(Clone, Debug, Default)]
pub struct InMemoryBackend {
    state: Arc<Mutex<State>>,
}

impl InMemoryBackend {
    /// A backend that accepts every update.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// Fails the next `n` calls (after volume-specific failures) with `failure`.
    pub fn fail_next(&self, n: usize, failure: Failure) {
        self.state().next.extend(std::iter::repeat_n(failure, n));
    }

    /// Fails every call with `failure` until [`stop_failing`](Self::stop_failing).
    pub fn fail_always(&self, failure: Failure) {
        self.state().always = Some(failure);
    }

    /// Fails every call for `volume_id` with `failure` until [`stop_failing`](Self::stop_failing).
    pub fn fail_volume(&self, volume_id: &str, failure: Failure) {
        self.state()
            .per_volume
            .insert(volume_id.to_owned(), failure);
    }

    /// Clears every scripted failure.
    pub fn stop_failing(&self) {
        let mut state = self.state();
        state.next.clear();
        state.always = None;
        state.per_volume.clear();
    }

    /// Every call so far, in order.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// Every update received so far, failed or not, in order.
    #[must_use]
    pub fn updates(&self) -> Vec<VolumeMetadataUpdate> {
        self.state()
            .calls
            .iter()
            .map(|c| c.update.clone())
            .collect()
    }

    /// The updates that succeeded, in order.
    #[must_use]
    pub fn successful_updates(&self) -> Vec<VolumeMetadataUpdate> {
        let state = self.state();
        let ok = state.calls.iter().filter(|c| c.failure.is_none());
        ok.map(|c| c.update.clone()).collect()
    }

    /// Forgets the recorded calls (scripted failures and entities stay).
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// The entity metadata on CNS now: of each entity (volume, entity type, name,
    /// namespace, cluster ID), the last update that added it, unless a removal followed.
    /// Sorted by volume, then entity.
    #[must_use]
    pub fn entities(&self) -> Vec<VolumeMetadataUpdate> {
        self.state().entities.values().cloned().collect()
    }

    /// Carries out, in the order received, the updates held by [`Failure::LandsLate`]
    /// and [`Failure::Unanswered`] (their callers got no answer); returns how many there were.
    pub fn land_late(&self) -> usize {
        let mut state = self.state();
        let late = std::mem::take(&mut state.late);
        for update in &late {
            state.apply(update);
        }
        late.len()
    }
}

#[async_trait]
impl VolumeMetadataBackend for InMemoryBackend {
    async fn update_volume_metadata(
        &self,
        update: &VolumeMetadataUpdate,
    ) -> Result<(), BackendError> {
        let answer = {
            let mut state = self.state();
            let failure = match state.per_volume.get(&update.volume_id) {
                Some(failure) => Some(failure.clone()),
                None => state.next.pop_front().or_else(|| state.always.clone()),
            };
            state.calls.push(Call {
                update: update.clone(),
                failure: failure.clone(),
            });
            match failure {
                Some(Failure::LandsLate) => {
                    state.late.push(update.clone());
                    None
                }
                Some(Failure::Unanswered) => {
                    state.late.push(update.clone());
                    Some(Err(Failure::Unanswered.to_error(&update.volume_id)))
                }
                Some(failure) => Some(Err(failure.to_error(&update.volume_id))),
                None => {
                    state.apply(update);
                    Some(Ok(()))
                }
            }
        };
        match answer {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }
}

/// A wall clock for the crate's own tests (`Context::with_clock`): the system time when it
/// is made, then advancing with tokio's clock, so that `tokio::time::pause` and `advance`
/// (or `#[tokio::test(start_paused = true)]`) move it too.
#[cfg(test)]
pub(crate) fn tokio_clock() -> impl Fn() -> std::time::SystemTime + Send + Sync + 'static {
    let start = std::time::SystemTime::now();
    let anchor = tokio::time::Instant::now();
    move || start.checked_add(anchor.elapsed()).unwrap_or(start)
}

/// The entity references of `spec` as the reconciler sends them to CNS, one per volume
/// name, in order: references of a PV entity get [`Config::pv_reference_cluster_id`]
/// (for checks that compare CNS's entries with what the objects ask for).
#[must_use]
pub fn referred_entities(spec: &CnsVolumeMetadataSpec, config: &Config) -> Vec<EntityReference> {
    crate::plan::referred_entities(spec, config)
}

/// Whether the reconciler accepts the spec of `object` (one that it does not is never
/// pushed, and a Warning event lists what is wrong with it).
#[must_use]
pub fn is_valid(object: &CnsVolumeMetadata) -> bool {
    crate::validate::validate(object).is_ok()
}

/// Guest cluster ID used by the spec builders.
pub const GUEST_CLUSTER_ID: &str = "gc-1";

/// A valid PV entity: guest PV `pvc-guest-a` backed by supervisor PVC `gc-1-vol-a`.
#[must_use]
pub fn pv_spec() -> CnsVolumeMetadataSpec {
    CnsVolumeMetadataSpec {
        volume_names: vec!["gc-1-vol-a".into()],
        guest_cluster_id: GUEST_CLUSTER_ID.into(),
        entity_type: EntityType::PersistentVolume,
        entity_name: "pvc-guest-a".into(),
        entity_references: vec![EntityReference::new(
            EntityType::PersistentVolumeClaim,
            "gc-1-vol-a",
            "tenant",
            "",
        )],
        labels: BTreeMap::from([("tier".to_owned(), "gold".to_owned())]),
        ..CnsVolumeMetadataSpec::default()
    }
}

/// A valid PVC entity: guest claim `shop/data`, bound to guest PV `pvc-guest-a`.
#[must_use]
pub fn pvc_spec() -> CnsVolumeMetadataSpec {
    CnsVolumeMetadataSpec {
        volume_names: vec!["gc-1-vol-a".into()],
        guest_cluster_id: GUEST_CLUSTER_ID.into(),
        entity_type: EntityType::PersistentVolumeClaim,
        entity_name: "data".into(),
        entity_references: vec![EntityReference::new(
            EntityType::PersistentVolume,
            "pvc-guest-a",
            "",
            GUEST_CLUSTER_ID,
        )],
        labels: BTreeMap::from([("app".to_owned(), "db".to_owned())]),
        namespace: "shop".into(),
        cluster_distribution: "TKGService".into(),
    }
}

/// A valid Pod entity: guest pod `shop/web-0` using claims `data` and `logs`.
#[must_use]
pub fn pod_spec() -> CnsVolumeMetadataSpec {
    CnsVolumeMetadataSpec {
        volume_names: vec!["gc-1-vol-a".into(), "gc-1-vol-b".into()],
        guest_cluster_id: GUEST_CLUSTER_ID.into(),
        entity_type: EntityType::Pod,
        entity_name: "web-0".into(),
        entity_references: vec![
            EntityReference::new(
                EntityType::PersistentVolumeClaim,
                "data",
                "shop",
                GUEST_CLUSTER_ID,
            ),
            EntityReference::new(
                EntityType::PersistentVolumeClaim,
                "logs",
                "shop",
                GUEST_CLUSTER_ID,
            ),
        ],
        namespace: "shop".into(),
        ..CnsVolumeMetadataSpec::default()
    }
}

fn one_gib() -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_owned(), Quantity("1Gi".to_owned()))])
}

/// A supervisor claim `namespace/name` (1 GiB, `ReadWriteOnce`) bound to the PV
/// `volume_name`; an empty `volume_name` leaves it unbound.
#[must_use]
pub fn bound_claim(namespace: &str, name: &str, volume_name: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(one_gib()),
                ..VolumeResourceRequirements::default()
            }),
            volume_name: (!volume_name.is_empty()).then(|| volume_name.to_owned()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// A PV `name` (1 GiB, `ReadWriteOnce`) of CSI driver `driver` with volume handle
/// `volume_handle`.
#[must_use]
pub fn csi_volume(name: &str, driver: &str, volume_handle: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            capacity: Some(one_gib()),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_owned(),
                volume_handle: volume_handle.to_owned(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata};

    fn update(volume_id: &str) -> VolumeMetadataUpdate {
        VolumeMetadataUpdate {
            volume_id: volume_id.to_owned(),
            entity_metadata: EntityMetadata {
                entity_type: EntityType::Pod,
                entity_name: "web-0".into(),
                namespace: "shop".into(),
                labels: BTreeMap::new(),
                delete: false,
                cluster_id: GUEST_CLUSTER_ID.into(),
                referred_entities: Vec::new(),
            },
            container_cluster: ContainerCluster {
                cluster_type: ClusterType::Kubernetes,
                cluster_id: GUEST_CLUSTER_ID.into(),
                vsphere_user: "admin".into(),
                cluster_flavor: ClusterFlavor::GuestCluster,
                cluster_distribution: String::new(),
            },
        }
    }

    #[tokio::test]
    async fn scripted_failures_apply_in_order_then_stop() {
        let backend = InMemoryBackend::new();
        backend.fail_next(2, Failure::error("busy"));
        backend.fail_volume("vol-nf", Failure::NotFound);
        let first = backend.update_volume_metadata(&update("vol-1")).await;
        let missing = backend.update_volume_metadata(&update("vol-nf")).await;
        let second = backend.update_volume_metadata(&update("vol-1")).await;
        let third = backend.update_volume_metadata(&update("vol-1")).await;
        assert!(matches!(first, Err(BackendError::Other(_))));
        assert!(missing.unwrap_err().is_not_found());
        assert!(matches!(second, Err(BackendError::Other(_))));
        assert!(third.is_ok());
        assert_eq!(backend.updates().len(), 4);
        assert_eq!(backend.successful_updates(), vec![update("vol-1")]);
        assert_eq!(backend.calls()[1].failure, Some(Failure::NotFound));
    }

    #[tokio::test(start_paused = true)]
    async fn updates_leave_entities_and_late_ones_land_only_when_told() {
        let backend = InMemoryBackend::new();
        backend.update_volume_metadata(&update("v1")).await.unwrap();
        backend.update_volume_metadata(&update("v2")).await.unwrap();
        assert_eq!(backend.entities(), vec![update("v1"), update("v2")]);
        let mut removal = update("v1");
        removal.entity_metadata.delete = true;
        backend.fail_next(1, Failure::LandsLate);
        let late = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            backend.update_volume_metadata(&removal),
        )
        .await;
        assert!(late.is_err(), "a late update never answers");
        assert_eq!(backend.entities(), vec![update("v1"), update("v2")]);
        assert_eq!(backend.calls()[2].failure, Some(Failure::LandsLate));
        assert_eq!(backend.land_late(), 1);
        assert_eq!(backend.entities(), vec![update("v2")]);
        assert_eq!(backend.land_late(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_follows_paused_time() {
        let clock = tokio_clock();
        let before = clock();
        tokio::time::advance(std::time::Duration::from_secs(600)).await;
        let after = clock();
        assert_eq!(
            after.duration_since(before).unwrap(),
            std::time::Duration::from_secs(600)
        );
    }

    #[tokio::test]
    async fn fail_always_fails_until_stopped() {
        let backend = InMemoryBackend::new();
        backend.fail_always(Failure::error("down"));
        for _ in 0..3 {
            assert!(backend.update_volume_metadata(&update("v")).await.is_err());
        }
        backend.stop_failing();
        assert!(backend.update_volume_metadata(&update("v")).await.is_ok());
        backend.clear_calls();
        assert!(backend.calls().is_empty());
    }
}
