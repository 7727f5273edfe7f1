//! Deletion and spec edits never strand an object or leave CNS entries behind: the record
//! of pushed entities, invalid specs, unbound claims, missing volumes, stripped finalizers.

use std::{sync::Arc, time::Duration};

use super::support::{Direct, Harness, config, created_and_synced, harness, step, wait_for};
use crate::VolumeMetadataBackend as _;
use crate::{
    CnsVolumeMetadata, EntityReference, EntityType, FINALIZER, PUSHED_ANNOTATION,
    REASON_UPDATE_FAILED, VolumeMetadataUpdate, VolumeStatus,
    context::ReconcileError,
    reconciler::{error_policy, reconcile},
    testing::{Failure, bound_claim, pod_spec, pvc_spec},
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::{Api, api::PostParams};
use kube_runtime::{controller::Action, reflector::ObjectRef};

/// The CNS volume IDs of the live entries (not tombstones) in the object's record, sorted.
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
        .filter(|e| e.get("removed").is_none())
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
    let legacy = |name: &str, change: fn(&mut crate::CnsVolumeMetadataSpec)| {
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

    assert_eq!(
        record_entries(&object)[0].0,
        "data",
        "the old entity is kept as a tombstone"
    );

    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    assert_eq!(
        h.backend.updates()[3..],
        [removal_of(&old), removal_of(&new)],
        "the current entity is removed, and the old one once more"
    );
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
async fn a_volume_the_record_lacks_never_holds_the_deletion() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    let synced = created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    assert_eq!(recorded_volumes(&synced), ["fcd-gc-1-vol-a"]);

    // The claim is re-created bound to another PV, which the object never pushed to; CNS
    // refuses every change of that volume.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "tenant");
    claims
        .delete("gc-1-vol-a", &Default::default())
        .await
        .unwrap();
    h.volume(
        "tenant",
        "gc-1-vol-a",
        "pv-other",
        crate::VSPHERE_CSI_DRIVER,
        "fcd-other",
    )
    .await;
    wait_for("the re-created claim in the cache", || async {
        let claim = d
            .claims
            .get(&ObjectRef::new("gc-1-vol-a").within("tenant"))?;
        let bound = claim.spec.as_ref()?.volume_name.as_deref()? == "pv-other";
        bound.then_some(())
    })
    .await;
    h.backend
        .fail_volume("fcd-other", Failure::error("volume busy"));

    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    let removals: Vec<(String, bool)> = h
        .backend
        .calls()
        .iter()
        .filter(|c| c.update.entity_metadata.delete)
        .map(|c| (c.update.volume_id.clone(), c.failure.is_none()))
        .collect();
    assert_eq!(
        removals,
        [
            ("fcd-gc-1-vol-a".to_owned(), true),
            ("fcd-other".to_owned(), false)
        ],
        "the recorded entry is removed, the unrecorded one tried once"
    );
    let warnings = warning_notes(&h, "gc-1-data").await;
    assert!(
        warnings
            .iter()
            .any(|n| n.contains("\"fcd-other\"") && n.contains("never pushed")),
        "{warnings:?}"
    );
}

/// Reconciles the object as it is on the server once; on failure, the retry `error_policy`
/// schedules.
async fn step_with_retry(h: &Harness, d: &Direct, name: &str) -> Option<Action> {
    let object = Arc::new(h.get("tenant", name).await.expect("object exists"));
    match reconcile(object.clone(), d.ctx.clone()).await {
        Ok(_) => None,
        Err(error) => Some(error_policy(object, &error, d.ctx.clone())),
    }
}

#[tokio::test]
async fn a_deletion_refused_by_cns_retries_after_the_initial_delay_not_the_earlier_failures() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;

    // CNS refuses every update for a while: the live object's retries back off.
    h.backend.fail_always(Failure::error("cns is down"));
    let mut delays = Vec::new();
    for _ in 0..6 {
        let retry = step_with_retry(&h, &d, "gc-1-data").await;
        delays.push(retry.expect("the push fails"));
    }
    let seconds = |s: u64| Action::requeue(Duration::from_secs(s));
    assert_eq!(
        delays,
        [1, 2, 4, 8, 16, 32].map(seconds),
        "the live object's failures back off"
    );

    // The deletion starts while CNS still refuses: its retries start over at 1 s.
    h.delete("tenant", "gc-1-data").await;
    let mut delays = Vec::new();
    for _ in 0..2 {
        let retry = step_with_retry(&h, &d, "gc-1-data").await;
        delays.push(retry.expect("the removal fails"));
    }
    assert_eq!(delays, [1, 2].map(seconds));
    let object = h.get("tenant", "gc-1-data").await.expect("still there");
    assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));

    h.backend.stop_failing();
    assert_eq!(step_with_retry(&h, &d, "gc-1-data").await, None);
    assert!(h.get("tenant", "gc-1-data").await.is_none());
    assert!(d.ctx.backoff().is_empty(), "success forgets the delay");
    let removals = h
        .backend
        .successful_updates()
        .into_iter()
        .filter(|u| u.entity_metadata.delete)
        .count();
    assert_eq!(removals, 1);
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
    let synced = created_and_synced(&h, &d, "tenant", "gc-1-pv", crate::testing::pv_spec()).await;
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

/// `(entity name, volume id)` of every entity on the in-memory CNS.
fn on_cns(h: &Harness) -> Vec<(String, String)> {
    h.backend
        .entities()
        .into_iter()
        .map(|u| (u.entity_metadata.entity_name, u.volume_id))
        .collect()
}

/// `(entity name, removal time)` of every entry of the object's record.
fn record_entries(object: &CnsVolumeMetadata) -> Vec<(String, Option<String>)> {
    let text = &object.metadata.annotations.as_ref().expect("annotations")[PUSHED_ANNOTATION];
    let entries: Vec<serde_json::Value> = serde_json::from_str(text).expect("record is JSON");
    entries
        .iter()
        .map(|e| {
            let name = e["entityname"].as_str().expect("entityname").to_owned();
            (name, e["removed"].as_str().map(str::to_owned))
        })
        .collect()
}

fn entity(name: &str) -> (String, String) {
    (name.to_owned(), "fcd-gc-1-vol-a".to_owned())
}

/// Backend timeout 10 s, settle margin 20 s: removals are sent again after 30 s.
const SETTLE: Duration = Duration::from_secs(30);

fn settling_config() -> crate::Config {
    config()
        .backend_timeout(Duration::from_secs(10))
        .settle_margin(Duration::from_secs(20))
}

#[tokio::test(start_paused = true)]
async fn a_push_that_lands_after_its_stale_removal_is_removed_once_the_removal_settled() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(settling_config()).await;
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    // The push of "data" gets no answer within the backend timeout...
    h.backend.fail_next(1, Failure::LandsLate);
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    assert!(on_cns(&h).is_empty());

    // ...the entity is renamed, so "data" is removed as stale...
    h.edit("tenant", "gc-1-data", |spec| {
        spec.entity_name = "data-renamed".into();
    })
    .await;
    let action = step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        action,
        Action::requeue(SETTLE),
        "the removal of \"data\" is sent again once it settled"
    );
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    let record = record_entries(&object);
    assert_eq!(record.len(), 2, "{record:?}");
    assert_eq!(record[0].0, "data");
    assert!(record[0].1.is_some(), "a tombstone: {record:?}");
    assert_eq!(record[1], ("data-renamed".to_owned(), None));
    assert_eq!(on_cns(&h), [entity("data-renamed")]);

    // ...and then the first push lands on CNS.
    assert_eq!(h.backend.land_late(), 1);
    assert_eq!(on_cns(&h), [entity("data"), entity("data-renamed")]);

    // Before the settle period ends, nothing is sent again.
    tokio::time::sleep(SETTLE / 3).await;
    let early = step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    assert_ne!(early, Action::await_change());
    assert_eq!(on_cns(&h), [entity("data"), entity("data-renamed")]);

    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert_eq!(on_cns(&h), [entity("data-renamed")]);
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        record_entries(&object),
        [("data-renamed".to_owned(), None)],
        "the tombstone is gone"
    );

    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    assert!(on_cns(&h).is_empty());
}

#[tokio::test(start_paused = true)]
async fn deleting_the_object_removes_tombstoned_entries_again_without_waiting() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(settling_config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    let old = h.backend.updates()[0].clone();
    h.edit("tenant", "gc-1-data", |spec| {
        spec.entity_name = "data-renamed".into();
    })
    .await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::requeue(SETTLE)
    );
    assert_eq!(on_cns(&h), [entity("data-renamed")]);
    // A push of "data" still in flight (another replica's) lands after its removal.
    h.backend.update_volume_metadata(&old).await.unwrap();
    assert_eq!(on_cns(&h), [entity("data"), entity("data-renamed")]);

    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    assert!(on_cns(&h).is_empty(), "{:?}", on_cns(&h));
    assert!(h.backend.updates().contains(&removal_of(&old)));
}

#[tokio::test(start_paused = true)]
async fn a_record_written_before_tombstones_existed_still_works() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(settling_config()).await;
    // "data" was pushed by the previous version, which recorded it in the old format.
    let legacy = r#"[{"volumename":"gc-1-vol-a","volumeid":"fcd-gc-1-vol-a","entitytype":"PERSISTENT_VOLUME_CLAIM","entityname":"data","namespace":"shop","guestclusterid":"gc-1","clusterdistribution":"TKGService","labels":{"app":"db"},"reference":{"EntityType":"PERSISTENT_VOLUME","EntityName":"pvc-guest-a","Namespace":"","ClusterID":"gc-1"}}]"#;
    let mut spec = pvc_spec();
    spec.entity_name = "data-renamed".into();
    let mut object = CnsVolumeMetadata::new("gc-1-data", spec);
    object.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
    object.metadata.annotations = Some([(PUSHED_ANNOTATION.to_owned(), legacy.to_owned())].into());
    h.objects("tenant")
        .create(&PostParams::default(), &object)
        .await
        .unwrap();

    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::requeue(SETTLE)
    );
    let updates = h.backend.updates();
    assert_eq!(updates.len(), 2, "{updates:?}");
    assert!(updates[0].entity_metadata.delete);
    assert_eq!(updates[0].entity_metadata.entity_name, "data");
    assert_eq!(updates[1].entity_metadata.entity_name, "data-renamed");
    let record = record_entries(&h.get("tenant", "gc-1-data").await.unwrap());
    assert_eq!(record[0].0, "data");
    assert!(record[0].1.is_some(), "{record:?}");
    // The old version's push lands late.
    let mut late = updates[0].clone();
    late.entity_metadata.delete = false;
    h.backend.update_volume_metadata(&late).await.unwrap();

    tokio::time::sleep(SETTLE).await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    assert_eq!(on_cns(&h), [entity("data-renamed")]);
    delete_and_finish(&h, &d, "tenant", "gc-1-data").await;
    assert!(on_cns(&h).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_malformed_record_is_reported_by_name_and_never_blocks() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(settling_config()).await;
    // A tombstone whose removal time was edited by hand: removed again at once.
    let odd = r#"[{"volumename":"gc-1-vol-a","volumeid":"fcd-gc-1-vol-a","entitytype":"PERSISTENT_VOLUME_CLAIM","entityname":"old","namespace":"shop","guestclusterid":"gc-1","removed":"last tuesday"}]"#;
    // Not a record at all.
    let junk = r#"{"entries": "?"}"#;
    for (name, text) in [("gc-1-odd", odd), ("gc-1-junk", junk)] {
        let mut object = CnsVolumeMetadata::new(name, pvc_spec());
        object.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        object.metadata.annotations =
            Some([(PUSHED_ANNOTATION.to_owned(), text.to_owned())].into());
        h.objects("tenant")
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }

    assert_eq!(
        step(&h, &d, "tenant", "gc-1-odd").await.unwrap(),
        Action::await_change()
    );
    let removal = &h.backend.updates()[0];
    assert!(removal.entity_metadata.delete);
    assert_eq!(removal.entity_metadata.entity_name, "old");
    let record = record_entries(&h.get("tenant", "gc-1-odd").await.unwrap());
    assert_eq!(record, [("data".to_owned(), None)]);
    let warnings = warning_notes(&h, "gc-1-odd").await;
    assert!(
        warnings
            .iter()
            .any(|n| n.contains("\"gc-1-odd\"") && n.contains("\"last tuesday\"")),
        "{warnings:?}"
    );

    assert_eq!(
        step(&h, &d, "tenant", "gc-1-junk").await.unwrap(),
        Action::await_change()
    );
    let warnings = warning_notes(&h, "gc-1-junk").await;
    assert!(
        warnings
            .iter()
            .any(|n| n.contains("\"gc-1-junk\"") && n.contains(PUSHED_ANNOTATION)),
        "{warnings:?}"
    );
    // The junk was replaced by a record of what was pushed.
    let record = record_entries(&h.get("tenant", "gc-1-junk").await.unwrap());
    assert_eq!(record, [("data".to_owned(), None)]);

    // Junk put back by hand does not hold the deletion either.
    let mut object = h.get("tenant", "gc-1-junk").await.unwrap();
    object
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(PUSHED_ANNOTATION.to_owned(), junk.to_owned());
    h.objects("tenant")
        .replace("gc-1-junk", &PostParams::default(), &object)
        .await
        .unwrap();
    delete_and_finish(&h, &d, "tenant", "gc-1-junk").await;
    delete_and_finish(&h, &d, "tenant", "gc-1-odd").await;
    assert!(on_cns(&h).is_empty(), "{:?}", on_cns(&h));
}

async fn warning_notes(h: &Harness, name: &str) -> Vec<String> {
    h.events("tenant", name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON_UPDATE_FAILED))
        .filter_map(|e| e.note)
        .collect()
}
