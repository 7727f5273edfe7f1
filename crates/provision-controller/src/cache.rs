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
    WatchStreamExt,
    reflector::{self, ObjectRef, Store},
    watcher,
};
use serde::de::DeserializeOwned;

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
    let (store, writer) = reflector::store();
    let changes = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|obj: &mut K| obj.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects()
        .filter_map(|item| async move {
            match item {
                Ok(obj) => Some(Arc::new(obj)),
                Err(err) => {
                    tracing::warn!(kind = %K::kind(&()), error = %err, "watch failed; retrying");
                    None
                }
            }
        });
    SharedCache::new(store, changes)
}

/// The three caches with the lookups the flows need.
pub(crate) struct Caches {
    pub(crate) claims: Store<PersistentVolumeClaim>,
    pub(crate) volumes: Store<PersistentVolume>,
    pub(crate) classes: Store<StorageClass>,
    /// Claim UID -> where it lives; entries may be stale, lookups check the UID.
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
        volumes: Store<PersistentVolume>,
        classes: Store<StorageClass>,
    ) -> Self {
        Self {
            claims,
            volumes,
            classes,
            uid_index: Mutex::default(),
            saved_volumes: Mutex::default(),
        }
    }

    /// Creates caches watching the whole cluster through `client`.
    pub(crate) fn watch_all(
        client: &Client,
    ) -> (
        SharedCache<PersistentVolumeClaim>,
        SharedCache<PersistentVolume>,
        SharedCache<StorageClass>,
    ) {
        (
            watch(Api::all(client.clone())),
            watch(Api::all(client.clone())),
            watch(Api::all(client.clone())),
        )
    }

    /// Records where the claim with this UID lives; `None` for a claim without a UID
    /// (an empty one counts as none: it cannot key the queue nor name a PV).
    pub(crate) fn index_claim(&self, claim: &PersistentVolumeClaim) -> Option<String> {
        let uid = claim.metadata.uid.clone().filter(|uid| !uid.is_empty())?;
        lock(&self.uid_index).insert(uid.clone(), ObjectRef::from_obj(claim));
        Some(uid)
    }

    /// The cached claim with this UID (Go: the `uid` index of the claim informer).
    pub(crate) fn claim_by_uid(&self, uid: &str) -> Option<Arc<PersistentVolumeClaim>> {
        let has_uid = |c: &PersistentVolumeClaim| c.metadata.uid.as_deref() == Some(uid);
        let indexed = lock(&self.uid_index).get(uid).cloned();
        if let Some(found) = indexed
            .and_then(|r| self.claims.get(&r))
            .filter(|c| has_uid(c))
        {
            return Some(found);
        }
        let found = self.claims.find(|c| has_uid(c))?;
        self.index_claim(&found);
        Some(found)
    }

    pub(crate) fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(&ObjectRef::new(name))
    }

    /// Whether a PV with this name exists in the cache or was just saved by us.
    pub(crate) fn volume_exists(&self, name: &str) -> bool {
        self.volume(name).is_some() || lock(&self.saved_volumes).contains(name)
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
        let (volumes, _) = reflector::store();
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
}
