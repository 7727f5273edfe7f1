//! Deletion and spec edits never strand an object or leave CNS entries behind: the record
//! of pushed entities, invalid specs, unbound claims, missing volumes, stripped finalizers.

mod support;

use cnsmetadata::{
    CnsVolumeMetadata, EntityReference, EntityType, FINALIZER, PUSHED_ANNOTATION,
    REASON_UPDATE_FAILED, ReconcileError, VolumeMetadataUpdate, VolumeStatus,
    testing::{Failure, bound_claim, pod_spec, pvc_spec},
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::{Api, api::PostParams};
use kube_runtime::{controller::Action, reflector::ObjectRef};
use support::{Direct, Harness, config, created_and_synced, harness, step, wait_for};

/// The CNS volume IDs in the object's record, sorted.
fn recorded_volumes(object: &CnsVolumeMetadata) -> Vec<String> {
    let Some(text) = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PUSHED_ANNOTATION))
    else {
        return Vec::new();
    };
    let entries: Vec<serde_json::Value> = serde_json::from_str(text).expect("record is JSON");
    let mut ids: Vec<String> = entries
        .iter()
        .map(|e| e["volumeid"].as_str().expect("volumeid").to_owned())
        .collect();
    ids.sort();
    ids
}

fn removal_of(update: &VolumeMetadataUpdate) -> VolumeMetadataUpdate {
    let mut removal = update.clone();
    removal.entity_metadata.delete = true;
    removal
}

/// Deletes the object and reconciles it once; asserts it is gone.
async fn delete_and_finish(h: &Harness, d: &Direct, namespace: &str, name: &str) {
    h.delete(namespace, name).await;
    assert_eq!(
        step(h, d, namespace, name).await.unwrap(),
        Action::await_change()
    );
    assert!(
        h.get(namespace, name).await.is_none(),
        "{namespace}/{name} is still there"
    );
}

async fn claim(h: &Harness, namespace: &str, name: &str, pv: &str) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), namespace);
    claims
        .create(&PostParams::default(), &bound_claim(namespace, name, pv))
        .await
        .unwrap();
}

async fn cached_claim(d: &Direct, namespace: &str, name: &str) {
    wait_for("the claim in the cache", || async {
        d.claims
            .get(&ObjectRef::new(name).within(namespace))
            .map(|_| ())
    })
    .await;
}

#[tokio::test]
async fn spec_made_invalid_after_the_finalizer_still_deletes_what_was_pushed() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    let synced = created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    assert_eq!(recorded_volumes(&synced), ["fcd-gc-1-vol-a"]);
    let pushed = h.backend.updates()[0].clone();

    h.edit("tenant", "gc-1-data", |spec| {
        spec.entity_type = EntityType::Other("NODE".into());
        spec.entity_name.clear();
    })
    .await;
    let error = step(&h, &d, "tenant", "gc-1-data").await.unwrap_err();
    assert!(
        matches!(error, ReconcileError::InvalidSpec { .. }),
        "{error}"
    );

    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    assert_eq!(
        h.backend.updates(),
        vec![pushed.clone(), removal_of(&pushed)],
        "the entity pushed under the valid spec is removed"
    );
}

#[tokio::test]
async fn invalid_object_without_a_record_is_released_after_a_best_effort_removal() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    // Finalized by an older version that kept no record, then made invalid.
    let legacy = |name: &str, change: fn(&mut cnsmetadata::CnsVolumeMetadataSpec)| {
        let mut spec = pvc_spec();
        change(&mut spec);
        let mut object = CnsVolumeMetadata::new(name, spec);
        object.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        object
    };
    let objects = h.objects("tenant");
    for object in [
        legacy("gc-1-no-namespace", |s| s.namespace.clear()),
        legacy("gc-1-node", |s| {
            s.entity_type = EntityType::Other("NODE".into());
        }),
    ] {
        objects
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
    h.backend.fail_always(Failure::error("cns is down"));

    delete_and_finish(&h, &d, "tenant", "gc-1-no-namespace").await;
    let calls = h.backend.calls();
    assert_eq!(calls.len(), 1, "one best-effort removal: {calls:?}");
    let removal = &calls[0].update;
    assert!(removal.entity_metadata.delete);
    assert_eq!(removal.volume_id, "fcd-gc-1-vol-a");
    assert_eq!(removal.entity_metadata.entity_name, "data");
    let warnings: Vec<String> = h
        .events("tenant", "gc-1-no-namespace")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON_UPDATE_FAILED))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        warnings.iter().any(|n| n.contains("\"fcd-gc-1-vol-a\"")
            && n.contains("\"gc-1-no-namespace\"")
            && n.contains("cns is down")),
        "{warnings:?}"
    );

    delete_and_finish(&h, &d, "tenant", "gc-1-node").await;
    assert_eq!(
        h.backend.calls().len(),
        1,
        "an unknown entity type cannot be named on CNS: nothing to send"
    );
}

#[tokio::test]
async fn unbound_claim_or_missing_pv_during_delete_does_not_block() {
    let h = harness().await;
    let d = h.direct(config()).await;
    claim(&h, "tenant", "gc-1-unbound", "").await;
    claim(&h, "tenant", "gc-1-lost", "pv-that-is-gone").await;
    cached_claim(&d, "tenant", "gc-1-unbound").await;
    cached_claim(&d, "tenant", "gc-1-lost").await;
    for (name, volume, message) in [
        (
            "gc-1-a",
            "gc-1-unbound",
            "persistentvolumeclaim \"gc-1-unbound\" is not bound to a volume",
        ),
        (
            "gc-1-b",
            "gc-1-lost",
            "persistentvolumes \"pv-that-is-gone\" not found",
        ),
    ] {
        let mut spec = pvc_spec();
        spec.volume_names = vec![volume.to_owned()];
        h.create("tenant", name, spec).await;
        step(&h, &d, "tenant", name).await.unwrap();
        assert!(step(&h, &d, "tenant", name).await.is_err());
        let object = h.get("tenant", name).await.unwrap();
        assert_eq!(
            object.status.volume_status,
            vec![VolumeStatus::failed(volume, message)]
        );
        delete_and_finish(&h, &d, "tenant", name).await;
    }
    assert!(h.backend.calls().is_empty(), "nothing was ever on CNS");
}

#[tokio::test]
async fn renaming_the_entity_removes_the_old_entry_before_pushing_the_new_one() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    let old = h.backend.updates()[0].clone();

    h.edit("tenant", "gc-1-data", |spec| {
        spec.entity_name = "data-renamed".into();
    })
    .await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    let mut new = old.clone();
    new.entity_metadata.entity_name = "data-renamed".into();
    assert_eq!(
        h.backend.updates(),
        vec![old.clone(), removal_of(&old), new.clone()]
    );
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(recorded_volumes(&object), ["fcd-gc-1-vol-a"]);

    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    assert_eq!(
        h.backend.updates().last(),
        Some(&removal_of(&new)),
        "only the current entity is left to remove"
    );
    assert_eq!(h.backend.updates().len(), 4);
}

#[tokio::test]
async fn a_volume_dropped_from_a_pod_loses_the_pod_entity() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    h.vsphere_volume("tenant", "gc-1-vol-b").await;
    let d = h.direct(config()).await;
    let synced = created_and_synced(&h, &d, "tenant", "gc-1-web-0", pod_spec()).await;
    assert_eq!(
        recorded_volumes(&synced),
        ["fcd-gc-1-vol-a", "fcd-gc-1-vol-b"]
    );
    let pushed = h.backend.updates();
    assert_eq!(pushed.len(), 2);

    h.edit("tenant", "gc-1-web-0", |spec| {
        spec.volume_names.truncate(1);
        spec.entity_references.truncate(1);
    })
    .await;
    step(&h, &d, "tenant", "gc-1-web-0").await.unwrap();
    let updates = h.backend.updates();
    assert_eq!(
        updates[2..],
        [removal_of(&pushed[1]), pushed[0].clone()],
        "the entity leaves volume b, then volume a is refreshed"
    );
    let object = h.get("tenant", "gc-1-web-0").await.unwrap();
    assert_eq!(recorded_volumes(&object), ["fcd-gc-1-vol-a"]);
}

#[tokio::test]
async fn an_entry_whose_push_failed_is_still_removed_on_delete() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    let finalized = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        recorded_volumes(&finalized),
        ["fcd-gc-1-vol-a"],
        "what the next reconcile pushes is recorded before it is pushed"
    );
    // A failed (or timed out) update may still have reached CNS.
    h.backend.fail_next(1, Failure::error("timed out"));
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    h.edit("tenant", "gc-1-data", |spec| {
        spec.entity_references.clear();
    })
    .await;
    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    let updates = h.backend.updates();
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[1], removal_of(&updates[0]));
}

#[tokio::test]
async fn a_failed_removal_keeps_the_finalizer_and_only_what_is_left_is_retried() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    h.vsphere_volume("tenant", "gc-1-vol-b").await;
    let d = h.direct(config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-web-0", pod_spec()).await;
    h.backend
        .fail_volume("fcd-gc-1-vol-b", Failure::error("volume busy"));
    h.delete("tenant", "gc-1-web-0").await;
    let error = step(&h, &d, "tenant", "gc-1-web-0").await.unwrap_err();
    assert!(
        matches!(
            error,
            ReconcileError::VolumesFailed {
                failed: 1,
                total: 2,
                ..
            }
        ),
        "{error}"
    );
    let object = h.get("tenant", "gc-1-web-0").await.expect("still there");
    assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert_eq!(
        object.status.volume_status,
        vec![
            VolumeStatus::updated("gc-1-vol-a"),
            VolumeStatus::failed(
                "gc-1-vol-b",
                "cns volume metadata update failed: volume busy"
            ),
        ]
    );
    assert_eq!(recorded_volumes(&object), ["fcd-gc-1-vol-b"]);

    h.backend.stop_failing();
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-web-0").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-web-0").await.is_none());
}

#[tokio::test]
async fn entries_are_removed_when_our_finalizer_was_stripped_by_hand() {
    const HOLD: &str = "example.com/hold";
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    let mut object = CnsVolumeMetadata::new("gc-1-data", pvc_spec());
    object.metadata.finalizers = Some(vec![HOLD.to_owned()]);
    h.objects("tenant")
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    let pushed = h.backend.updates();
    assert_eq!(pushed.len(), 1);

    let mut stripped = h.get("tenant", "gc-1-data").await.unwrap();
    stripped.metadata.finalizers = Some(vec![HOLD.to_owned()]);
    h.objects("tenant")
        .replace("gc-1-data", &PostParams::default(), &stripped)
        .await
        .unwrap();
    h.delete("tenant", "gc-1-data").await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert_eq!(
        h.backend.updates(),
        vec![pushed[0].clone(), removal_of(&pushed[0])]
    );
    let lingering = h
        .get("tenant", "gc-1-data")
        .await
        .expect("held by another finalizer");
    assert!(recorded_volumes(&lingering).is_empty());
    assert_eq!(lingering.metadata.finalizers, Some(vec![HOLD.to_owned()]));
    // Nothing is left to do: a further reconcile sends nothing.
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    assert_eq!(h.backend.updates().len(), 2);
}

#[tokio::test]
async fn pv_references_recorded_keep_the_cluster_id_they_were_sent_with() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    let synced =
        created_and_synced(&h, &d, "tenant", "gc-1-pv", cnsmetadata::testing::pv_spec()).await;
    let text = &synced.metadata.annotations.as_ref().unwrap()[PUSHED_ANNOTATION];
    let entries: Vec<serde_json::Value> = serde_json::from_str(text).unwrap();
    let reference: EntityReference =
        serde_json::from_value(entries[0]["reference"].clone()).unwrap();
    assert_eq!(reference.cluster_id, "cluster-7");
    // The reference stays the one that was sent, whatever the spec says later.
    h.edit("tenant", "gc-1-pv", |spec| {
        spec.entity_references[0].cluster_id = "not-allowed".into();
    })
    .await;
    delete_and_finish(&h, &d, "tenant", "gc-1-pv").await;
    let updates = h.backend.updates();
    assert_eq!(updates[1], removal_of(&updates[0]));
}
