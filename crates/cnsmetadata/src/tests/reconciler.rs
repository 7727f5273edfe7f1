//! `reconcile` and `error_policy` called directly against kube-sim, one step at a time.

use std::{sync::Arc, time::Duration};

use super::support::{Direct, Harness, config, created_and_synced, harness, step, wait_for};
use crate::{
    CnsVolumeMetadata, FINALIZER, REASON_UPDATE_FAILED, REASON_UPDATE_SUCCEEDED, VolumeStatus,
    context::ReconcileError,
    reconciler::error_policy,
    testing::{Failure, pod_spec, pvc_spec},
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::{
    Api,
    api::{DeleteParams, PostParams},
};
use kube_runtime::{controller::Action, reflector::ObjectRef};
use kube_sim::{FaultRule, Verb};

fn key(namespace: &str, name: &str) -> ObjectRef<CnsVolumeMetadata> {
    ObjectRef::new(name).within(namespace)
}

fn policy(d: &Direct, object: &CnsVolumeMetadata, error: &ReconcileError) -> Action {
    error_policy(Arc::new(object.clone()), error, d.ctx.clone())
}

#[tokio::test]
async fn backend_failure_warns_persists_status_and_backs_off_until_success() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    h.backend.fail_always(Failure::error("cns is down"));

    let error = step(&h, &d, "tenant", "gc-1-data").await.unwrap_err();
    assert!(
        matches!(
            error,
            ReconcileError::VolumesFailed {
                failed: 1,
                total: 1,
                ..
            }
        ),
        "{error}"
    );
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::failed(
            "gc-1-vol-a",
            "cns volume metadata update failed: cns is down"
        )]
    );
    let events = h.events("tenant", "gc-1-data").await;
    let warning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some(REASON_UPDATE_FAILED))
        .expect("an UpdateFailed event");
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(
        warning.note.as_deref(),
        Some(
            "Failed to update entry in CNS for instance with name \"data\" and entity type \
             \"PERSISTENT_VOLUME_CLAIM\" in the guest cluster \"gc-1\". Requeueing request. \
             gc-1-vol-a: cns volume metadata update failed: cns is down."
        )
    );

    let delays: Vec<Action> = (0..4).map(|_| policy(&d, &object, &error)).collect();
    let expected: Vec<Action> = [1, 2, 4, 8]
        .map(|s| Action::requeue(Duration::from_secs(s)))
        .into();
    assert_eq!(delays, expected);

    h.backend.stop_failing();
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-a")]
    );
    assert!(d.ctx.backoff().is_empty(), "success resets the delay");
    assert_eq!(
        policy(&d, &object, &error),
        Action::requeue(Duration::from_secs(1))
    );
}

#[tokio::test]
async fn same_name_in_two_namespaces_does_not_share_a_delay() {
    let h = harness().await;
    let d = h.direct(config()).await;
    let mut objects = Vec::new();
    for namespace in ["team-a", "team-b"] {
        h.create(namespace, "gc-1-data", pvc_spec()).await;
        step(&h, &d, namespace, "gc-1-data").await.unwrap();
        // No supervisor claim exists, so the update fails.
        let error = step(&h, &d, namespace, "gc-1-data").await.unwrap_err();
        let object = h.get(namespace, "gc-1-data").await.unwrap();
        assert_eq!(
            object.status.volume_status,
            vec![VolumeStatus::failed(
                "gc-1-vol-a",
                "persistentvolumeclaims \"gc-1-vol-a\" not found"
            )]
        );
        objects.push((object, error));
    }
    let (a, a_error) = &objects[0];
    let (b, b_error) = &objects[1];
    for seconds in [1, 2, 4] {
        assert_eq!(
            policy(&d, a, a_error),
            Action::requeue(Duration::from_secs(seconds))
        );
    }
    assert_eq!(
        policy(&d, b, b_error),
        Action::requeue(Duration::from_secs(1))
    );
    assert_eq!(
        d.ctx.backoff().peek(&key("team-a", "gc-1-data")),
        Duration::from_secs(8)
    );
    assert_eq!(
        d.ctx.backoff().peek(&key("team-b", "gc-1-data")),
        Duration::from_secs(2)
    );
    assert!(h.backend.calls().is_empty());
}

#[tokio::test]
async fn claim_gone_during_delete_still_removes_the_recorded_entry() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    assert_eq!(h.backend.updates().len(), 1);

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "tenant");
    claims
        .delete("gc-1-vol-a", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the claim to leave the cache", || async {
        d.claims
            .get(&ObjectRef::new("gc-1-vol-a").within("tenant"))
            .is_none()
            .then_some(())
    })
    .await;
    h.delete("tenant", "gc-1-data").await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(
        h.get("tenant", "gc-1-data").await.is_none(),
        "finalizer removed, object gone"
    );
    let updates = h.backend.updates();
    let mut removal = updates[0].clone();
    removal.entity_metadata.delete = true;
    assert_eq!(
        updates,
        vec![updates[0].clone(), removal],
        "the recorded entry is removed by its volume id (a retained volume outlives its claim)"
    );
}

#[tokio::test]
async fn backend_not_found_during_delete_finishes_the_deletion() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    h.backend.fail_always(Failure::NotFound);
    h.delete("tenant", "gc-1-data").await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none());
    let calls = h.backend.calls();
    let last = calls.last().unwrap();
    assert!(last.update.entity_metadata.delete);
    assert_eq!(last.failure, Some(Failure::NotFound));
}

#[tokio::test]
async fn backend_not_found_outside_delete_is_a_failure() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    h.backend.fail_next(1, Failure::NotFound);
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::failed(
            "gc-1-vol-a",
            "volume \"fcd-gc-1-vol-a\" not found in cns"
        )]
    );
}

#[tokio::test]
async fn failed_delete_keeps_the_finalizer_and_records_status() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    h.backend.fail_next(1, Failure::error("busy"));
    h.delete("tenant", "gc-1-data").await;
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    let object = h.get("tenant", "gc-1-data").await.expect("still there");
    assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::failed(
            "gc-1-vol-a",
            "cns volume metadata update failed: busy"
        )]
    );
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none());
}

#[tokio::test]
async fn volumes_of_other_drivers_and_unbound_claims() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    h.volume("tenant", "gc-1-vol-b", "pv-nfs", "nfs.csi.k8s.io", "nfs-1")
        .await;
    let d = h.direct(config()).await;
    h.create("tenant", "gc-1-web-0", pod_spec()).await;
    step(&h, &d, "tenant", "gc-1-web-0").await.unwrap();
    step(&h, &d, "tenant", "gc-1-web-0").await.unwrap();
    let object = h.get("tenant", "gc-1-web-0").await.unwrap();
    assert_eq!(
        object.status.volume_status,
        vec![
            VolumeStatus::updated("gc-1-vol-a"),
            VolumeStatus::updated("gc-1-vol-b")
        ]
    );
    let ids: Vec<String> = h
        .backend
        .updates()
        .into_iter()
        .map(|u| u.volume_id)
        .collect();
    assert_eq!(ids, ["fcd-gc-1-vol-a"], "the nfs volume is skipped");

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "team-a");
    let unbound = crate::testing::bound_claim("team-a", "gc-1-vol-a", "");
    claims
        .create(&PostParams::default(), &unbound)
        .await
        .unwrap();
    wait_for("the unbound claim in the cache", || async {
        d.claims
            .get(&ObjectRef::new("gc-1-vol-a").within("team-a"))
            .map(|_| ())
    })
    .await;
    h.create("team-a", "gc-1-data", pvc_spec()).await;
    step(&h, &d, "team-a", "gc-1-data").await.unwrap();
    assert!(step(&h, &d, "team-a", "gc-1-data").await.is_err());
    let object = h.get("team-a", "gc-1-data").await.unwrap();
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::failed(
            "gc-1-vol-a",
            "persistentvolumeclaim \"gc-1-vol-a\" is not bound to a volume"
        )]
    );
}

#[tokio::test]
async fn status_write_conflict_is_retried_on_a_fresh_copy() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    h.sim.add_fault(
        FaultRule::new(Verb::Update, "cnsvolumemetadatas")
            // The first replace records the push about to be sent; the status write follows.
            .after(1)
            .times(1)
            .status(409, "Conflict"),
    );
    h.sim.clear_requests();
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-a")]
    );
    let updates = h
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.verb == "update")
        .count();
    assert_eq!(
        updates, 3,
        "the record of the push, then one conflicting and one successful status replace"
    );
}

/// The `UpdateFailed` warnings about the finalizer of `namespace/name`, newest last.
async fn finalizer_warnings(h: &Harness, namespace: &str, name: &str) -> Vec<String> {
    h.events(namespace, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON_UPDATE_FAILED))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.note)
        .filter(|note| note.contains("finalizer"))
        .collect()
}

#[tokio::test]
async fn failing_to_add_the_finalizer_publishes_a_warning_event() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    h.sim.add_fault(
        FaultRule::new(Verb::Update, "cnsvolumemetadatas")
            .times(1)
            .status(500, "InternalError"),
    );
    let error = step(&h, &d, "tenant", "gc-1-data").await.unwrap_err();
    assert!(matches!(error, ReconcileError::Write { .. }), "{error}");
    let warnings = finalizer_warnings(&h, "tenant", "gc-1-data").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]
            .starts_with("Failed to add finalizer \"cns.vmware.com\" for \"gc-1-data\". Err: ")
            && warnings[0].ends_with(". Requeueing request."),
        "{}",
        warnings[0]
    );
    assert!(h.backend.calls().is_empty());
}

#[tokio::test]
async fn failing_to_remove_the_finalizer_publishes_a_warning_event() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    h.delete("tenant", "gc-1-data").await;
    h.sim.add_fault(
        FaultRule::new(Verb::Update, "cnsvolumemetadatas")
            .times(1)
            .status(500, "InternalError"),
    );
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    let warnings = finalizer_warnings(&h, "tenant", "gc-1-data").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]
            .starts_with("Failed to remove finalizer \"cns.vmware.com\" for \"gc-1-data\". Err: "),
        "{}",
        warnings[0]
    );
    let object = h.get("tenant", "gc-1-data").await.expect("still there");
    assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none());
}

/// Events go out as `events.k8s.io/v1` Events with `reportingController: cns.vmware.com`
/// (upstream writes core/v1 Events with `source.component: cns.vmware.com`): a core/v1
/// reader (`kubectl describe`, `kubectl get events`) reads the same Event, with
/// `reportingComponent: cns.vmware.com` and no `source` (docs/porting-notes.md).
#[tokio::test]
async fn events_are_events_k8s_io_v1_reported_by_cns_vmware_com() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(config()).await;
    // The finalizer, then the update.
    created_and_synced(&h, &d, "tenant", "gc-1-data", pvc_spec()).await;
    let events = h.events("tenant", "gc-1-data").await;
    let succeeded = events
        .iter()
        .find(|e| e.reason.as_deref() == Some(REASON_UPDATE_SUCCEEDED))
        .expect("an UpdateSucceeded event");
    assert_eq!(
        succeeded.reporting_controller.as_deref(),
        Some("cns.vmware.com")
    );
    assert_eq!(succeeded.type_.as_deref(), Some("Normal"));
    assert_eq!(succeeded.deprecated_source, None, "no core/v1 source");
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(h.client.clone(), "tenant");
    let core = core.list(&Default::default()).await.unwrap().items;
    let read = core
        .iter()
        .find(|e| {
            e.involved_object.name.as_deref() == Some("gc-1-data")
                && e.reason.as_deref() == Some(REASON_UPDATE_SUCCEEDED)
        })
        .expect("the same Event read through core/v1");
    assert_eq!(read.reporting_component.as_deref(), Some("cns.vmware.com"));
    assert_eq!(
        read.source.as_ref().and_then(|s| s.component.as_deref()),
        None,
        "upstream's source.component is not set"
    );
}
