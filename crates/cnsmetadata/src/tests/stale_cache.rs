//! A replica whose cache of objects is behind (its watch was cut, it was partitioned from
//! the API server, or both replicas run without leader election) never pushes an entity
//! for an object that is gone or has changed (chaos seed 364 at 30 claims, no leader
//! election: replica 1, just healed from a partition, retried meta-019 from its stale
//! cache after replica 0 had deleted it and removed its entity, and pushed it again, for
//! good).

use std::sync::Arc;

use super::support::{config, created_and_synced, harness, step};
use crate::{reconciler::reconcile, testing::pvc_spec};
use kube_runtime::controller::Action;

#[tokio::test]
async fn a_stale_copy_of_a_deleted_object_pushes_nothing() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    let stale = created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    assert_eq!(h.backend.entities().len(), 1);
    // Another replica deletes the object and removes its entity.
    h.delete("tenant", "gc-1-data").await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none());
    assert!(h.backend.entities().is_empty());
    let calls = h.backend.calls().len();

    // This replica's cache still shows the object as it was.
    let action = reconcile(Arc::new(stale), d.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(h.backend.calls().len(), calls, "nothing was sent to CNS");
    assert!(
        h.backend.entities().is_empty(),
        "{:?}",
        h.backend.entities()
    );
}

#[tokio::test]
async fn a_stale_copy_of_an_edited_object_pushes_the_spec_the_api_server_has() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    let stale = created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    h.edit("tenant", "gc-1-data", |spec| {
        spec.labels.insert("app".into(), "web".into());
    })
    .await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    let labels = |h: &super::support::Harness| {
        let entities = h.backend.entities();
        assert_eq!(entities.len(), 1, "{entities:?}");
        entities[0].entity_metadata.labels["app"].clone()
    };
    assert_eq!(labels(&h), "web");

    // A retry from a cache that missed the edit.
    reconcile(Arc::new(stale), d.ctx.clone()).await.unwrap();
    assert_eq!(labels(&h), "web", "the old labels were not pushed back");
}
