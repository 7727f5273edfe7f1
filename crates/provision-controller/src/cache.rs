//! Caches of claims, volumes and storage classes (kube-runtime reflectors), the lookup of
//! claims by UID, and [`SharedCache`] for running on caches the caller already has.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex, MutexGuard},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::{Api, Client, Resource, ResourceExt};
use kube_runtime::{
    reflector::{self, ObjectRef, Store},
    watcher,
};
use serde::de::DeserializeOwned;

mod compact;
use compact::CompactVolume;

/// A cache the caller already runs (Go: `ClaimsInformer`, `VolumesInformer`,
/// `ClassesInformer`): a reflector [`Store`] and a stream of the objects it changes.
///
/// The controller reads the store and processes every object the stream yields; the
/// caller keeps driving the reflector. The stream can be a channel fed from the caller's
/// reflector output (below) or, with kube-runtime's `unstable-runtime-subscribe` feature,
/// a `Writer::subscribe` handle of a shared store.
///
/// ```no_run
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::PersistentVolumeClaim;
/// use kube_runtime::{reflector, watcher, WatchStreamExt};
/// use provision_controller::SharedCache;
/// # async fn doc(client: kube_client::Client) {
/// let (store, writer) = reflector::store::<PersistentVolumeClaim>();
/// let (tx, changes) = futures::channel::mpsc::unbounded();
/// let driver = watcher(kube_client::Api::all(client), watcher::Config::default())
///     .default_backoff()
///     .reflect(writer)
///     .touched_objects()
///     .for_each(move |claim| {
///         if let Ok(claim) = claim {
///             // ... the caller's own use of the claim, then:
///             let _ = tx.unbounded_send(Arc::new(claim));
///         }
///         async {}
///     });
/// tokio::spawn(driver); // the caller's reflector
/// let claims = SharedCache::new(store, changes);
/// # let _ = claims;
/// # }
/// ```
#[doc(alias = "SharedInformer")]
#[doc(alias = "informer")]
pub struct SharedCache<K: Resource<DynamicType = ()> + 'static> {
    pub(crate) store: Store<K>,
    pub(crate) changes: BoxStream<'static, Arc<K>>,
}

impl<K> SharedCache<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// A cache from a store and the stream of objects it changes.
    #[must_use]
    pub fn new(store: Store<K>, changes: impl Stream<Item = Arc<K>> + Send + 'static) -> Self {
        Self {
            store,
            changes: changes.boxed(),
        }
    }

    /// A cache whose changes the controller needs not hear about (storage classes).
    #[must_use]
    pub fn store_only(store: Store<K>) -> Self {
        Self::new(store, futures::stream::pending())
    }
}

impl<K: Resource<DynamicType = ()>> fmt::Debug for SharedCache<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedCache { .. }")
    }
}

/// Builds a cache on a watcher of `api`, with managed fields dropped from cached objects.
pub(crate) fn watch<K>(api: Api<K>) -> SharedCache<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    let (store, changes) = kube_controller_kit::store::watch(api, watcher::Config::default());
    SharedCache::new(store, changes)
}

/// The volume cache the controller reads: the caller's (full objects) or its own (compact).
pub(crate) enum VolumeStore {
    /// A cache the caller shares with the controller ([`crate::ProvisionController::volumes_cache`]).
    Shared(Store<PersistentVolume>),
    /// The controller's own cache, volumes held compact (see `compact`).
    Compact(Store<CompactVolume>),
}

impl From<Store<PersistentVolume>> for VolumeStore {
    fn from(store: Store<PersistentVolume>) -> Self {
        Self::Shared(store)
    }
}

impl VolumeStore {
    /// The cached volume with this name.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        match self {
            Self::Shared(store) => store.get(&ObjectRef::new(name)),
            Self::Compact(store) => compact::rebuild(&store.get(&ObjectRef::new(name))?),
        }
    }

    /// Whether a volume with this name is cached (without rebuilding it).
    pub(crate) fn contains(&self, name: &str) -> bool {
        match self {
            Self::Shared(store) => store.get(&ObjectRef::new(name)).is_some(),
            Self::Compact(store) => store.get(&ObjectRef::new(name)).is_some(),
        }
    }

    /// The names of the cached volumes.
    pub(crate) fn names(&self) -> Vec<String> {
        match self {
            Self::Shared(store) => store.state().iter().map(|v| v.name_any()).collect(),
            Self::Compact(store) => store.state().iter().map(|v| v.name_any()).collect(),
        }
    }

    /// Number of cached volumes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Shared(store) => store.state().len(),
            Self::Compact(store) => store.state().len(),
        }
    }

    /// Waits until the cache has listed once.
    pub(crate) async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        match self {
            Self::Shared(store) => store.wait_until_ready().await,
            Self::Compact(store) => store.wait_until_ready().await,
        }
    }
}

/// The volume cache and the volumes it changes.
pub(crate) struct VolumeCache {
    pub(crate) store: VolumeStore,
    pub(crate) changes: BoxStream<'static, VolumeChange>,
}

/// A volume the cache changed, as the watch saw it (for a deletion: its last state).
pub(crate) enum VolumeChange {
    Compact(Arc<CompactVolume>),
    Full(Arc<PersistentVolume>),
}

impl VolumeChange {
    pub(crate) fn name(&self) -> String {
        match self {
            Self::Compact(v) => v.name_any(),
            Self::Full(v) => v.name_any(),
        }
    }
}

impl VolumeCache {
    /// The controller's own cache: a watcher of every PV, held compact.
    pub(crate) fn watch(client: &Client) -> Self {
        let cache = watch::<CompactVolume>(Api::all(client.clone()));
        Self {
            store: VolumeStore::Compact(cache.store),
            changes: cache.changes.map(VolumeChange::Compact).boxed(),
        }
    }
}

impl From<SharedCache<PersistentVolume>> for VolumeCache {
    fn from(cache: SharedCache<PersistentVolume>) -> Self {
        Self {
            store: VolumeStore::Shared(cache.store),
            changes: cache.changes.map(VolumeChange::Full).boxed(),
        }
    }
}

/// The three caches with the lookups the flows need.
pub(crate) struct Caches {
    pub(crate) claims: Store<PersistentVolumeClaim>,
    pub(crate) volumes: VolumeStore,
    pub(crate) classes: Store<StorageClass>,
    /// Claim UID -> where it lives. Every claim is indexed before it is queued (the
    /// feeder, [`Caches::index_claim`]), so a UID missing here is not in the cache; entries
    /// of deleted claims are dropped when looked up (lookups check the UID) and at resync.
    uid_index: Mutex<HashMap<String, ObjectRef<PersistentVolumeClaim>>>,
    /// PVs this controller saved that the volume cache has not shown yet (Go adds them to
    /// its informer store, which a kube-runtime `Store` does not allow).
    saved_volumes: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Caches {
    pub(crate) fn new(
        claims: Store<PersistentVolumeClaim>,
        volumes: impl Into<VolumeStore>,
        classes: Store<StorageClass>,
    ) -> Self {
        Self {
            claims,
            volumes: volumes.into(),
            classes,
            uid_index: Mutex::default(),
            saved_volumes: Mutex::default(),
        }
    }

    /// Records where the claim with this UID lives; `None` for a claim without a UID
    /// (an empty one counts as none: it cannot key the queue nor name a PV).
    pub(crate) fn index_claim(&self, claim: &PersistentVolumeClaim) -> Option<String> {
        let uid = claim.metadata.uid.clone().filter(|uid| !uid.is_empty())?;
        lock(&self.uid_index).insert(uid.clone(), ObjectRef::from_obj(claim));
        Some(uid)
    }

    /// The cached claim with this UID (Go: the `uid` index of the claim informer); `None`
    /// when it is not in the cache (deleted, or never seen). O(1): never scans the cache.
    pub(crate) fn claim_by_uid(&self, uid: &str) -> Option<Arc<PersistentVolumeClaim>> {
        let mut index = lock(&self.uid_index);
        let found = self
            .claims
            .get(index.get(uid)?)
            .filter(|c| c.metadata.uid.as_deref() == Some(uid));
        if found.is_none() {
            // The claim is gone (or its name now holds another claim): forget it.
            index.remove(uid);
        }
        found
    }

    pub(crate) fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(name)
    }

    /// Whether a PV with this name exists in the cache or was just saved by us.
    pub(crate) fn volume_exists(&self, name: &str) -> bool {
        self.volumes.contains(name) || lock(&self.saved_volumes).contains(name)
    }

    pub(crate) fn mark_saved(&self, name: &str) {
        lock(&self.saved_volumes).insert(name.to_owned());
    }

    /// The volume cache has news of `name`: it no longer needs the saved marker.
    pub(crate) fn volume_seen(&self, name: &str) {
        lock(&self.saved_volumes).remove(name);
    }

    pub(crate) fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    /// Drops index entries whose claim is gone.
    pub(crate) fn prune_index(&self) {
        lock(&self.uid_index).retain(|_, r| self.claims.get(r).is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    #[test]
    fn a_claim_without_a_uid_is_not_indexed() {
        let (claims, _) = reflector::store();
        let (volumes, _) = reflector::store::<PersistentVolume>();
        let (classes, _) = reflector::store();
        let caches = Caches::new(claims, volumes, classes);
        assert_eq!(caches.index_claim(&pvc("c").build()), None);
        assert_eq!(
            caches.index_claim(&pvc("c").uid("").build()),
            None,
            "an empty uid cannot key the queue"
        );
        assert_eq!(
            caches.index_claim(&pvc("c").uid("u1").build()).as_deref(),
            Some("u1")
        );
    }

    fn apply(
        writer: &mut reflector::store::Writer<PersistentVolumeClaim>,
        claim: &PersistentVolumeClaim,
    ) {
        writer.apply_watcher_event(&watcher::Event::Apply(claim.clone()));
    }

    #[test]
    fn a_uid_missing_from_the_index_is_not_in_the_cache() {
        let (claims, mut writer) = reflector::store();
        let (volumes, _) = reflector::store::<PersistentVolume>();
        let (classes, _) = reflector::store();
        let caches = Caches::new(claims, volumes, classes);
        apply(&mut writer, &pvc("c").uid("u1").build());
        // Cached but never fed: the lookup answers from the index alone, no scan.
        assert!(caches.claim_by_uid("u1").is_none());
        caches.index_claim(&pvc("c").uid("u1").build());
        assert_eq!(
            caches
                .claim_by_uid("u1")
                .and_then(|c| c.metadata.uid.clone())
                .as_deref(),
            Some("u1")
        );
    }

    #[test]
    fn a_deleted_or_replaced_claim_is_gone_and_its_entry_dropped() {
        let (claims, mut writer) = reflector::store();
        let (volumes, _) = reflector::store::<PersistentVolume>();
        let (classes, _) = reflector::store();
        let caches = Caches::new(claims, volumes, classes);
        let old = pvc("c").uid("u1").build();
        apply(&mut writer, &old);
        caches.index_claim(&old);
        let new = pvc("c").uid("u2").build();
        apply(&mut writer, &new);
        caches.index_claim(&new);
        assert!(
            caches.claim_by_uid("u1").is_none(),
            "the name holds another claim"
        );
        assert!(!lock(&caches.uid_index).contains_key("u1"));
        writer.apply_watcher_event(&watcher::Event::Delete(new));
        assert!(caches.claim_by_uid("u2").is_none(), "deleted");
        assert!(lock(&caches.uid_index).is_empty());
    }
}
