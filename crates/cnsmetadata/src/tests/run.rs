//! `run` end to end against kube-sim: watch, predicate, finalizer, backend, status, events.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use super::support::{Harness, config, harness, wait_for};
use crate::{
    ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata, EntityReference, EntityType,
    FINALIZER, MetadataController, REASON_UPDATE_FAILED, REASON_UPDATE_SUCCEEDED,
    VolumeMetadataUpdate, VolumeStatus,
    testing::{pod_spec, pv_spec, pvc_spec},
};
use kube_client::Api;
use tokio::sync::{Semaphore, oneshot, watch};

fn container_cluster(distribution: &str) -> ContainerCluster {
    ContainerCluster {
        cluster_type: ClusterType::Kubernetes,
        cluster_id: "gc-1".into(),
        vsphere_user: "cns-user@vsphere.local".into(),
        cluster_flavor: ClusterFlavor::GuestCluster,
        cluster_distribution: distribution.into(),
    }
}

/// Starts the reconciler in a task owned by the test; returns the shutdown trigger and the handle.
fn start(
    h: &Harness,
    config: crate::Config,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), crate::Error>>,
) {
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let handle = tokio::spawn(
        MetadataController::new(h.client.clone(), h.backend.clone())
            .config(config)
            .run(shutdown),
    );
    (stop, handle)
}

async fn stop(
    stop: oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<Result<(), crate::Error>>,
) {
    stop.send(()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), handle).await;
    result.expect("run drains and returns").unwrap().unwrap();
}

#[tokio::test]
async fn pvc_entity_is_pushed_finalized_and_removed_on_delete() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let (trigger, handle) = start(&h, config());
    h.create("tenant", "gc-1-data", pvc_spec()).await;

    let object = wait_for("status of gc-1-data", || async {
        let object = h.get("tenant", "gc-1-data").await?;
        (!object.status.volume_status.is_empty()).then_some(object)
    })
    .await;
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-a")]
    );
    assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    let expected = VolumeMetadataUpdate {
        volume_id: "fcd-gc-1-vol-a".into(),
        entity_metadata: EntityMetadata {
            entity_type: EntityType::PersistentVolumeClaim,
            entity_name: "data".into(),
            namespace: "shop".into(),
            labels: BTreeMap::from([("app".into(), "db".into())]),
            delete: false,
            cluster_id: "gc-1".into(),
            referred_entities: vec![EntityReference::new(
                EntityType::PersistentVolume,
                "pvc-guest-a",
                "",
                "gc-1",
            )],
        },
        container_cluster: container_cluster("TKGService"),
    };
    assert_eq!(h.backend.updates(), vec![expected.clone()]);
    // Events are written in the background: wait for it.
    wait_for("an UpdateSucceeded event", || async {
        let events = h.events("tenant", "gc-1-data").await;
        events
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some(REASON_UPDATE_SUCCEEDED)
                    && e.type_.as_deref() == Some("Normal")
            })
            .then_some(())
    })
    .await;

    h.delete("tenant", "gc-1-data").await;
    wait_for("gc-1-data to be gone", || async {
        h.get("tenant", "gc-1-data").await.is_none().then_some(())
    })
    .await;
    let mut removal = expected.clone();
    removal.entity_metadata.delete = true;
    assert_eq!(h.backend.updates(), vec![expected, removal]);
    stop(trigger, handle).await;
}

#[tokio::test]
async fn pv_entity_references_get_the_supervisor_id_when_switched_on() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let (trigger, handle) = start(&h, config().use_supervisor_id_for_pv(true));
    h.create("tenant", "gc-1-pv", pv_spec()).await;
    wait_for("one update", || async {
        (h.backend.updates().len() == 1).then_some(())
    })
    .await;
    let expected = VolumeMetadataUpdate {
        volume_id: "fcd-gc-1-vol-a".into(),
        entity_metadata: EntityMetadata {
            entity_type: EntityType::PersistentVolume,
            entity_name: "pvc-guest-a".into(),
            namespace: String::new(),
            labels: BTreeMap::from([("tier".into(), "gold".into())]),
            delete: false,
            cluster_id: "gc-1".into(),
            referred_entities: vec![EntityReference::new(
                EntityType::PersistentVolumeClaim,
                "gc-1-vol-a",
                "tenant",
                "supervisor-9",
            )],
        },
        container_cluster: container_cluster(""),
    };
    assert_eq!(h.backend.updates(), vec![expected]);
    stop(trigger, handle).await;
}

#[tokio::test]
async fn pod_entity_pairs_each_volume_with_its_reference() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    h.vsphere_volume("tenant", "gc-1-vol-b").await;
    let (trigger, handle) = start(&h, config());
    h.create("tenant", "gc-1-web-0", pod_spec()).await;
    let object = wait_for("status of gc-1-web-0", || async {
        let object = h.get("tenant", "gc-1-web-0").await?;
        (object.status.volume_status.len() == 2).then_some(object)
    })
    .await;
    assert_eq!(
        object.status.volume_status,
        vec![
            VolumeStatus::updated("gc-1-vol-a"),
            VolumeStatus::updated("gc-1-vol-b")
        ]
    );
    let update = |volume_id: &str, claim: &str| VolumeMetadataUpdate {
        volume_id: volume_id.into(),
        entity_metadata: EntityMetadata {
            entity_type: EntityType::Pod,
            entity_name: "web-0".into(),
            namespace: "shop".into(),
            labels: BTreeMap::new(),
            delete: false,
            cluster_id: "gc-1".into(),
            referred_entities: vec![EntityReference::new(
                EntityType::PersistentVolumeClaim,
                claim,
                "shop",
                "gc-1",
            )],
        },
        container_cluster: container_cluster(""),
    };
    assert_eq!(
        h.backend.updates(),
        vec![
            update("fcd-gc-1-vol-a", "data"),
            update("fcd-gc-1-vol-b", "logs")
        ]
    );
    stop(trigger, handle).await;
}

#[tokio::test]
async fn invalid_object_gets_a_warning_event_naming_every_problem() {
    let h = harness().await;
    let (trigger, handle) = start(&h, config());
    let mut spec = pod_spec();
    spec.namespace.clear();
    spec.labels.insert("app".into(), "web".into());
    spec.volume_names.push("gc-1-vol-c".into());
    h.create("tenant", "gc-1-bad", spec).await;
    let event = wait_for("an UpdateFailed event", || async {
        let events = h.events("tenant", "gc-1-bad").await;
        events
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(REASON_UPDATE_FAILED))
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.note.as_deref(),
        Some(
            "Failed to validate reconcile request with error: Namespace should be set for POD instances; \
             Labels cannot be set for POD instances; VolumeNames and EntityReferences should \
             have the same length for POD instances (got 3 volume names and 2 entity references)"
        )
    );
    let object = h.get("tenant", "gc-1-bad").await.unwrap();
    assert_eq!(
        object.metadata.finalizers, None,
        "invalid objects are not finalized"
    );
    assert!(h.backend.calls().is_empty());
    stop(trigger, handle).await;
}

#[tokio::test]
async fn other_flavors_start_nothing() {
    let h = harness().await;
    h.sim.clear_requests();
    for flavor in [ClusterFlavor::GuestCluster, ClusterFlavor::Vanilla] {
        let config = config().cluster_flavor(flavor);
        let never = futures::future::pending::<()>();
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            MetadataController::new(h.client.clone(), h.backend.clone())
                .config(config)
                .run(never),
        )
        .await;
        assert!(matches!(result, Ok(Ok(()))), "{flavor}: {result:?}");
    }
    assert_eq!(
        h.sim.requests().len(),
        0,
        "no request may reach the API server"
    );
}

/// Upstream keeps running with an empty cluster ID, and reads TKGsHA at every reconcile.
/// Here too: the reconciler runs; an object whose PV references would get the empty ID
/// fails alone (a Warning event naming the option, nothing sent to CNS), and succeeds once
/// TKGsHA, switched on while it runs, gives them the supervisor ID.
#[tokio::test]
async fn an_empty_cluster_id_fails_only_its_objects_until_tkgs_ha_is_switched_on() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let (tkgs_ha, state) = watch::channel(false);
    let config = config()
        .cluster_id("")
        .supervisor_id("supervisor-9")
        .use_supervisor_id_for_pv(state);
    let (trigger, handle) = start(&h, config);
    h.create("tenant", "gc-1-pv", pv_spec()).await;
    let note = wait_for("a Warning event naming the empty option", || async {
        h.events("tenant", "gc-1-pv")
            .await
            .into_iter()
            .filter_map(|e| e.note)
            .find(|n| n.contains("cluster_id"))
    })
    .await;
    assert_eq!(
        note,
        "Failed to build the entity references: invalid value for option cluster_id (Go \
         [Global] cluster-id): is empty, but PERSISTENT_VOLUME entity references get it as \
         their cluster id"
    );
    assert!(
        h.backend.updates().is_empty(),
        "nothing sent with an empty id"
    );
    assert!(!handle.is_finished(), "the reconciler keeps running");
    tkgs_ha.send_replace(true);
    wait_for("the push with the supervisor id", || async {
        (h.backend.updates().len() == 1).then_some(())
    })
    .await;
    let reference = &h.backend.updates()[0].entity_metadata.referred_entities[0];
    assert_eq!(reference.cluster_id, "supervisor-9");
    stop(trigger, handle).await;
}

/// Starts a standby reconciler (not leading) with `backend`; returns the leadership sender, the shutdown
/// trigger and the handle.
fn start_standby(
    h: &Harness,
    backend: Arc<dyn crate::VolumeMetadataBackend>,
) -> (
    watch::Sender<bool>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), crate::Error>>,
) {
    let (elected, leading) = watch::channel(false);
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(
        MetadataController::new(h.client.clone(), backend)
            .config(config())
            .leading(leading.into())
            .run(async move {
                let _ = stopped.await;
            }),
    );
    (elected, stop, handle)
}

/// Waits until the sim has served a watch of each resource a standby keeps warm.
async fn standby_is_warm(h: &Harness) {
    wait_for("the standby's watches", || async {
        let requests = h.sim.requests();
        let watching = |resource: &str| {
            requests
                .iter()
                .any(|r| r.verb == "watch" && r.resource == resource)
        };
        (watching("cnsvolumemetadatas")
            && watching("persistentvolumeclaims")
            && watching("persistentvolumes"))
        .then_some(())
    })
    .await;
}

/// Nothing can be observed to *not* happen; this gives a wrong reconcile ample time to
/// show (a correct reconciler passes whatever the delay).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

async fn synced(h: &Harness, name: &str) -> crate::CnsVolumeMetadata {
    wait_for("the status of the object", || async {
        let object = h.get("tenant", name).await?;
        (!object.status.volume_status.is_empty()).then_some(object)
    })
    .await
}

#[tokio::test]
async fn reconciles_run_only_while_leading() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    h.vsphere_volume("tenant", "gc-1-vol-b").await;
    let (elected, trigger, handle) = start_standby(&h, Arc::new(h.backend.clone()));

    // A standby fills its caches at once but reconciles nothing.
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    standby_is_warm(&h).await;
    settle().await;
    assert!(h.backend.calls().is_empty());
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        object.metadata.finalizers, None,
        "not touched while standing by"
    );

    // Leading: the object created meanwhile is caught up with.
    elected.send(true).unwrap();
    synced(&h, "gc-1-data").await;
    assert_eq!(h.backend.updates().len(), 1);

    // Stepping down: neither new objects nor edits are reconciled.
    elected.send(false).unwrap();
    settle().await;
    let mut spec = pod_spec();
    spec.volume_names.truncate(1);
    spec.entity_references.truncate(1);
    h.create("tenant", "gc-1-web-0", spec).await;
    h.edit("tenant", "gc-1-data", |spec| {
        spec.labels.insert("tier".into(), "gold".into());
    })
    .await;
    settle().await;
    assert_eq!(h.backend.updates().len(), 1, "{:?}", h.backend.updates());
    let pod = h.get("tenant", "gc-1-web-0").await.unwrap();
    assert_eq!(pod.metadata.finalizers, None);

    // Leading again: every object is reconciled, the edit included.
    elected.send(true).unwrap();
    synced(&h, "gc-1-web-0").await;
    wait_for("the edited labels on CNS", || async {
        h.backend
            .successful_updates()
            .iter()
            .any(|u| u.entity_metadata.labels.get("tier").map(String::as_str) == Some("gold"))
            .then_some(())
    })
    .await;

    // A dropped sender is "not leading" for good.
    drop(elected);
    settle().await;
    let calls = h.backend.calls().len();
    h.delete("tenant", "gc-1-data").await;
    settle().await;
    assert_eq!(h.backend.calls().len(), calls);
    let terminating = h
        .get("tenant", "gc-1-data")
        .await
        .expect("kept by the finalizer");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    stop(trigger, handle).await;
}

/// A backend whose calls wait for a permit; counts the calls that started.
#[derive(Clone)]
struct GatedBackend {
    inner: crate::testing::InMemoryBackend,
    gate: Arc<Semaphore>,
    started: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl crate::VolumeMetadataBackend for GatedBackend {
    async fn update_volume_metadata(
        &self,
        update: &VolumeMetadataUpdate,
    ) -> Result<(), crate::BackendError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.gate.acquire().await.expect("gate open").forget();
        self.inner.update_volume_metadata(update).await
    }
}

fn gated(h: &Harness) -> GatedBackend {
    GatedBackend {
        inner: h.backend.clone(),
        gate: Arc::new(Semaphore::new(0)),
        started: Arc::new(AtomicUsize::new(0)),
    }
}

async fn in_backend(backend: &GatedBackend, calls: usize) {
    wait_for("a call in the backend", || async {
        (backend.started.load(Ordering::SeqCst) == calls).then_some(())
    })
    .await;
}

#[tokio::test]
async fn stepping_down_lets_the_running_reconcile_finish_and_starts_no_other() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let backend = gated(&h);
    let (elected, trigger, handle) = start_standby(&h, Arc::new(backend.clone()));
    elected.send(true).unwrap();
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    in_backend(&backend, 1).await;

    elected.send(false).unwrap();
    settle().await;
    h.create("tenant", "gc-1-other", pvc_spec()).await;
    backend.gate.add_permits(10);
    let object = synced(&h, "gc-1-data").await;
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-a")],
        "the reconcile that was running finished"
    );
    settle().await;
    assert_eq!(backend.started.load(Ordering::SeqCst), 1);
    let other = h.get("tenant", "gc-1-other").await.unwrap();
    assert_eq!(other.metadata.finalizers, None);
    stop(trigger, handle).await;
}

#[tokio::test]
async fn shutdown_waits_for_the_running_reconcile() {
    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let backend = gated(&h);
    let (elected, trigger, handle) = start_standby(&h, Arc::new(backend.clone()));
    elected.send(true).unwrap();
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    in_backend(&backend, 1).await;

    trigger.send(()).unwrap();
    settle().await;
    assert!(
        !handle.is_finished(),
        "returned while a reconcile was running"
    );
    backend.gate.add_permits(10);
    let result = tokio::time::timeout(Duration::from_secs(10), handle).await;
    result.expect("returns once it finished").unwrap().unwrap();
    let object = h.get("tenant", "gc-1-data").await.unwrap();
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-a")]
    );
    drop(elected);
}

#[tokio::test]
async fn shutdown_of_a_standby_returns_at_once() {
    let h = harness().await;
    let (elected, trigger, handle) = start_standby(&h, Arc::new(h.backend.clone()));
    standby_is_warm(&h).await;
    stop(trigger, handle).await;
    drop(elected);
}

#[tokio::test]
async fn malformed_objects_get_an_event_and_do_not_hold_up_the_others() {
    use kube_client::api::{ApiResource, DynamicObject, PostParams};
    use serde_json::json;

    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    // Objects a real API server would reject with the CRD's schema.
    let resource = ApiResource::erase::<crate::CnsVolumeMetadata>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(h.client.clone(), "tenant", &resource);
    let malformed = [
        (
            "gc-1-wrong-types",
            json!({ "volumenames": "gc-1-vol-a", "guestclusterid": "gc-1", "entitytype": 5,
                    "entityname": { "x": 1 }, "entityreferences": "none", "labels": [1] }),
            "Invalid entity type \"5\"",
        ),
        (
            "gc-1-not-an-object",
            json!("spec"),
            "EntityName, EntityType and GuestClusterID are required parameters.",
        ),
        (
            "gc-1-empty-names",
            json!({ "volumenames": [""], "guestclusterid": "gc-1", "entitytype": "PERSISTENT_VOLUME",
                    "entityname": "", "entityreferences": [null] }),
            "EntityName, EntityType and GuestClusterID are required parameters.",
        ),
    ];
    for (name, spec, _) in &malformed {
        let object = DynamicObject::new(name, &resource)
            .within("tenant")
            .data(json!({ "spec": spec, "status": { "volumestatus": 3 } }));
        raw.create(&PostParams::default(), &object).await.unwrap();
    }
    let (trigger, handle) = start(&h, config());
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    let object = wait_for("status of gc-1-data", || async {
        let object = h.get("tenant", "gc-1-data").await?;
        (!object.status.volume_status.is_empty()).then_some(object)
    })
    .await;
    assert_eq!(
        object.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-a")]
    );
    for (name, _, problem) in &malformed {
        let event = wait_for("an UpdateFailed event", || async {
            let events = h.events("tenant", name).await;
            events
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(REASON_UPDATE_FAILED))
        })
        .await;
        let note = event.note.unwrap_or_default();
        assert!(note.contains(problem), "{name}: {note}");
        let regarding = event.regarding.and_then(|r| r.name);
        assert_eq!(regarding.as_deref(), Some(*name));
    }
    assert_eq!(
        h.backend.calls().len(),
        1,
        "only the valid object is pushed"
    );
    stop(trigger, handle).await;
}

#[tokio::test]
async fn changes_missed_while_the_watch_was_down_are_reconciled_after_the_relist() {
    use kube_sim::{FaultRule, Verb};

    let h = harness().await;
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    h.vsphere_volume("tenant", "gc-1-vol-b").await;
    let (trigger, handle) = start(&h, config());
    h.create("tenant", "gc-1-old", pvc_spec()).await;
    wait_for("gc-1-old pushed", || async {
        let object = h.get("tenant", "gc-1-old").await?;
        (!object.status.volume_status.is_empty()).then_some(())
    })
    .await;

    // The watch goes down; meanwhile one object is created and another deleted.
    h.sim
        .add_fault(FaultRule::new(Verb::Watch, "cnsvolumemetadatas").always());
    h.sim.cut_watches();
    let mut spec = pvc_spec();
    spec.volume_names = vec!["gc-1-vol-b".into()];
    spec.entity_name = "new".into();
    h.create("tenant", "gc-1-new", spec).await;
    h.delete("tenant", "gc-1-old").await;
    // Its history gone, the watch must list again when it comes back.
    h.sim.compact();
    h.sim.clear_faults();

    wait_for("gc-1-old to be gone", || async {
        h.get("tenant", "gc-1-old").await.is_none().then_some(())
    })
    .await;
    let new = wait_for("gc-1-new pushed", || async {
        let object = h.get("tenant", "gc-1-new").await?;
        (!object.status.volume_status.is_empty()).then_some(object)
    })
    .await;
    assert_eq!(
        new.status.volume_status,
        vec![VolumeStatus::updated("gc-1-vol-b")]
    );
    let lists = h
        .sim
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "cnsvolumemetadatas")
        .count();
    assert!(lists >= 2, "the watch listed again ({lists} lists)");
    stop(trigger, handle).await;
}
