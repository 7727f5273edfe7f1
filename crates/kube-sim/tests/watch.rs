//! Watches: kube-runtime's watcher and reflector against the sim, finalizers, bookmarks,
//! resume and 410 Expired.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{claim, eventually};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::ResourceExt;
use kube_client::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_runtime::{WatchStreamExt, reflector, watcher};
use kube_sim::KubeSim;
use serde_json::json;

async fn listed(api: &Api<PersistentVolumeClaim>) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| (c.name_any(), c.resource_version().unwrap()))
        .collect()
}

fn cached(reader: &reflector::Store<PersistentVolumeClaim>) -> BTreeMap<String, String> {
    reader
        .state()
        .iter()
        .map(|c| (c.name_any(), c.resource_version().unwrap()))
        .collect()
}

async fn converges(
    api: &Api<PersistentVolumeClaim>,
    reader: &reflector::Store<PersistentVolumeClaim>,
    what: &str,
) {
    eventually(what, || async { cached(reader) == listed(api).await }).await;
}

fn relists(sim: &KubeSim) -> usize {
    sim.requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "persistentvolumeclaims")
        .count()
}

#[tokio::test]
async fn reflector_stays_equal_to_a_fresh_list_across_cuts_and_compaction() {
    let sim = KubeSim::builder()
        .bookmark_interval(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    let (reader, writer) = reflector::store();
    let stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    reader.wait_until_ready().await.unwrap();

    for i in 0..5 {
        api.create(&PostParams::default(), &claim(&format!("c{i}"), "1Gi"))
            .await
            .unwrap();
    }
    let label = Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}}));
    api.patch("c1", &PatchParams::default(), &label)
        .await
        .unwrap();
    api.delete("c2", &DeleteParams::default()).await.unwrap();
    converges(&api, &reader, "creates, updates and deletes").await;
    assert_eq!(cached(&reader).len(), 4);

    sim.cut_watches();
    api.delete("c3", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &claim("c5", "1Gi"))
        .await
        .unwrap();
    converges(&api, &reader, "changes after a cut watch").await;
    let lists_before = relists(&sim);

    sim.compact();
    sim.cut_watches();
    api.patch("c4", &PatchParams::default(), &label)
        .await
        .unwrap();
    api.create(&PostParams::default(), &claim("c6", "1Gi"))
        .await
        .unwrap();
    converges(&api, &reader, "changes after a compaction").await;
    eventually("a relist after the compaction", || async {
        relists(&sim) > lists_before
    })
    .await;
    assert!(
        sim.requests()
            .iter()
            .any(|r| r.verb == "watch" && r.status == 200)
    );
    task.abort();
}

#[tokio::test]
async fn finalizer_lifecycle_ends_in_deleted_event_and_404() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    let mut c = claim("held", "1Gi");
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = api.create(&PostParams::default(), &c).await.unwrap();
    let rv = created.resource_version().unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    let deleting = api.delete("held", &DeleteParams::default()).await.unwrap();
    let obj = deleting
        .left()
        .expect("the object stays while a finalizer is set");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert_eq!(
        api.get("held")
            .await
            .unwrap()
            .metadata
            .deletion_grace_period_seconds,
        Some(0)
    );

    let unfinalize = Patch::Json::<()>(
        serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": ["example.com/hold"]},
            {"op": "remove", "path": "/metadata/finalizers"}
        ]))
        .unwrap(),
    );
    api.patch("held", &PatchParams::default(), &unfinalize)
        .await
        .unwrap();

    let mut kinds = Vec::new();
    while let Some(ev) = events.try_next().await.unwrap() {
        match ev {
            WatchEvent::Modified(_) => kinds.push("MODIFIED"),
            WatchEvent::Deleted(o) => {
                assert!(o.finalizers().is_empty());
                kinds.push("DELETED");
                break;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(kinds, ["MODIFIED", "MODIFIED", "DELETED"]);
    let (code, reason, _) = common::api_error(api.get("held").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_410_expired() {
    let sim = KubeSim::builder().history_window(3).start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    let first = api
        .create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    for i in 0..5 {
        api.create(&PostParams::default(), &claim(&format!("b{i}"), "1Gi"))
            .await
            .unwrap();
    }
    let old = first.resource_version().unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(
                status
                    .message
                    .starts_with(&format!("too old resource version: {old} (")),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 410 error event, got {other:?}"),
    }
    assert!(
        events.try_next().await.unwrap().is_none(),
        "the stream ends after the error"
    );
}

#[tokio::test]
async fn watch_replays_history_and_filters_by_label() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    let start = api
        .create(&PostParams::default(), &claim("other", "1Gi"))
        .await
        .unwrap();
    let mut c = claim("web", "1Gi");
    c.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    api.create(&PostParams::default(), &c).await.unwrap();
    api.create(&PostParams::default(), &claim("plain", "1Gi"))
        .await
        .unwrap();
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .unwrap();

    let wp = WatchParams::default().labels("app=web");
    let rv = start.resource_version().unwrap();
    let mut events = api.watch(&wp, &rv).await.unwrap().boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Added(o)) => assert_eq!(o.name_any(), "web"),
        other => panic!("expected ADDED web, got {other:?}"),
    }
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(o)) => {
            assert_eq!(
                o.name_any(),
                "web",
                "an object that stops matching is sent as DELETED"
            );
            assert_eq!(o.labels()["app"], "db");
        }
        other => panic!("expected DELETED web, got {other:?}"),
    }
}

#[tokio::test]
async fn idle_watch_gets_bookmarks_and_ends_at_its_timeout() {
    let sim = KubeSim::builder()
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    let created = api
        .create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    let wp = WatchParams {
        bookmarks: true,
        ..WatchParams::default()
    }
    .timeout(1);
    let events: Vec<_> = api
        .watch(&wp, "0")
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(
        matches!(&events[0], WatchEvent::Added(o) if o.name_any() == "a"),
        "{events:?}"
    );
    let bookmarks: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
            _ => None,
        })
        .collect();
    assert!(!bookmarks.is_empty(), "{events:?}");
    assert!(
        bookmarks
            .iter()
            .all(|rv| *rv == created.resource_version().unwrap())
    );
}

#[tokio::test]
async fn shutdown_ends_open_watches() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "default");
    let mut events = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    sim.shutdown().await;
    let next = events.try_next().await;
    assert!(matches!(next, Ok(None) | Err(_)), "{next:?}");
}
