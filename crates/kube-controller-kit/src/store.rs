//! Reflector stores without managed fields, and the objects a reflected watch changes.
//!
//! A controller that caches every object of a kind pays for `metadata.managedFields` on
//! each: often the largest part of a small object, and never read by a controller.
//! [`drop_managed_fields`] strips them (pass it to kube-runtime's
//! `WatchStreamExt::modify`), and [`watch`] builds the whole reflector that way.
//!
//! [`in_store_changes`] turns a reflected watch into the objects it changed, each yielded
//! only once the store holds that change: kube-runtime's `touched_objects` yields the
//! objects of a (re)list as they arrive, before the reflector swaps the list into its
//! store at `InitDone`, so a worker that looks such an object up in the store may miss it.
//!
//! # Upstream
//! kube-runtime could offer both: a `touched_objects` that waits for the store, and a
//! reflector option to drop managed fields.

use std::{fmt, sync::Arc};

use futures::{Stream, StreamExt};
use kube_client::{Api, Resource, ResourceExt};
use kube_runtime::{
    WatchStreamExt,
    reflector::{self, Store},
    watcher,
};
use serde::de::DeserializeOwned;

/// Clears `object`'s `metadata.managedFields` (leaving an empty list); made for
/// `WatchStreamExt::modify`.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
/// use kube_controller_kit::store::drop_managed_fields;
///
/// let mut object = ConfigMap::default();
/// object.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
/// drop_managed_fields(&mut object);
/// assert!(object.metadata.managed_fields.unwrap_or_default().is_empty());
/// ```
pub fn drop_managed_fields<K: Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
}

/// A reflector of every `K` that `api` and `config` select, managed fields dropped, with
/// its store and the objects it changes (see [`in_store_changes`]).
///
/// The watch runs while the returned stream is polled (with kube-runtime's default
/// backoff); the store fills as it runs. A failing watch is logged and retried.
///
/// ```no_run
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::PersistentVolumeClaim;
/// use kube_client::Api;
/// use kube_runtime::watcher;
/// # async fn doc(client: kube_client::Client) {
/// let (store, changes) = kube_controller_kit::store::watch(
///     Api::<PersistentVolumeClaim>::all(client),
///     watcher::Config::default(),
/// );
/// let mut changes = std::pin::pin!(changes);
/// while let Some(claim) = changes.next().await {
///     // `claim` is in `store` (or, once deleted, gone from it).
///     # let _ = (&store, claim);
/// }
/// # }
/// ```
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (Store<K>, impl Stream<Item = Arc<K>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, config)
        .default_backoff()
        .modify(drop_managed_fields)
        .reflect(writer);
    (store.clone(), in_store_changes(events, store))
}

/// The objects a reflected watch changes, each yielded once the store has applied it.
///
/// `events` must be the output of a reflector writing `store`. A (re)list buffers its
/// objects in the reflector until `InitDone` and swaps them in then, so the objects of a
/// list are yielded at `InitDone`, from the store (shared, not copied), and never before:
/// a consumer that looks a yielded object up always finds it (or finds it gone for good).
/// An applied or deleted object is yielded as the watch saw it. Watch errors are logged
/// and skipped (the watcher retries).
pub fn in_store_changes<K, S>(events: S, store: Store<K>) -> impl Stream<Item = Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    events.flat_map(move |item| {
        let objects = match item {
            Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => vec![Arc::new(obj)],
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Vec::new(),
            Ok(watcher::Event::InitDone) => store.state(),
            Err(err) => {
                tracing::warn!(kind = %K::kind(&()), error = %err, "watch failed; retrying");
                Vec::new()
            }
        };
        futures::stream::iter(objects)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube_runtime::reflector::ObjectRef;

    fn pvc(name: &str, uid: &str) -> PersistentVolumeClaim {
        let mut claim = PersistentVolumeClaim::default();
        claim.metadata.name = Some(name.into());
        claim.metadata.namespace = Some("default".into());
        claim.metadata.uid = Some(uid.into());
        claim
    }

    #[tokio::test]
    async fn listed_objects_are_yielded_once_the_store_has_them() {
        let (store, mut writer) = reflector::store::<PersistentVolumeClaim>();
        let a = pvc("a", "ua");
        let b = pvc("b", "ub");
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(a.clone())),
            Ok(watcher::Event::InitApply(b)),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Delete(a)),
        ])
        .map(move |event: Result<_, watcher::Error>| {
            if let Ok(event) = &event {
                writer.apply_watcher_event(event);
            }
            event
        });
        let check = store.clone();
        let seen: Vec<(String, bool)> = in_store_changes(events, store)
            .map(|c| {
                let cached = check.get(&ObjectRef::from_obj(&*c)).is_some();
                (c.metadata.name.clone().unwrap(), cached)
            })
            .collect()
            .await;
        let mut listed = seen[..2].to_vec();
        listed.sort();
        assert_eq!(
            listed,
            vec![("a".to_owned(), true), ("b".to_owned(), true)],
            "a relist is yielded after the store swapped it in"
        );
        assert_eq!(
            seen[2],
            ("a".to_owned(), false),
            "a deletion is yielded once removed"
        );
        assert_eq!(seen.len(), 3);
    }

    #[tokio::test]
    async fn a_watched_store_holds_objects_without_managed_fields() {
        use k8s_openapi::api::core::v1::Node;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        use kube_client::api::PostParams;

        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let api: Api<Node> = Api::all(sim.client());
        let mut object = Node::default();
        object.metadata.name = Some("c".into());
        object.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("test".into()),
            operation: Some("Update".into()),
            ..ManagedFieldsEntry::default()
        }]);
        api.create(&PostParams::default(), &object).await.unwrap();
        let stored = api.get("c").await.unwrap();
        assert!(
            !stored
                .metadata
                .managed_fields
                .unwrap_or_default()
                .is_empty(),
            "the API server keeps the managed fields, so the test can see them dropped"
        );

        let (store, changes) = watch(Api::<Node>::all(sim.client()), watcher::Config::default());
        let mut changes = std::pin::pin!(changes);
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), changes.next())
            .await
            .expect("the list is yielded")
            .unwrap();
        assert_eq!(first.metadata.name.as_deref(), Some("c"));
        assert_eq!(first.metadata.managed_fields.as_deref(), Some(&[][..]));
        let cached = store.get(&ObjectRef::new("c")).unwrap();
        assert_eq!(cached.metadata.managed_fields.as_deref(), Some(&[][..]));
    }
}
