//! The other served types and verbs as controllers use them: events from kube-runtime's
//! Recorder, Leases through server-side apply, deletecollection, namespace deletion,
//! streaming lists, kube-runtime's finalizer patches and the CSINodes CSI sidecars read.

mod common;

use common::{api_error, claim, eventually};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::CSINode;
use kube_client::ResourceExt;
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use kube_runtime::{WatchStreamExt, reflector, watcher};
use kube_sim::KubeSim;
use serde_json::json;

#[tokio::test]
async fn recorder_events_are_accepted_and_series_patched() {
    let sim = KubeSim::start().await.unwrap();
    let reporter = Reporter {
        controller: "sim-test".into(),
        instance: None,
    };
    let recorder = Recorder::new(sim.client(), reporter);
    let reference = ObjectReference {
        kind: Some("PersistentVolumeClaim".into()),
        name: Some("data".into()),
        namespace: Some("default".into()),
        api_version: Some("v1".into()),
        ..ObjectReference::default()
    };
    let event = RecordedEvent {
        type_: EventType::Normal,
        reason: "Provisioning".into(),
        note: Some("External provisioner is provisioning volume".into()),
        action: "Provision".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<Event> = Api::default_namespaced(sim.client());
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(list.items[0].reason.as_deref(), Some("Provisioning"));
}

#[tokio::test]
async fn leases_work_with_server_side_apply_and_put() {
    let sim = KubeSim::start().await.unwrap();
    let leases: Api<Lease> = Api::default_namespaced(sim.client());
    let apply = |holder: &str| {
        Patch::Apply(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "leader"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}
        }))
    };
    let first = leases
        .patch("leader", &PatchParams::apply("a"), &apply("a"))
        .await
        .unwrap();
    assert_eq!(first.spec.unwrap().holder_identity.as_deref(), Some("a"));
    let taken = leases
        .patch("leader", &PatchParams::apply("b").force(), &apply("b"))
        .await
        .unwrap();
    assert_eq!(
        taken.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("b")
    );
    let again = leases
        .patch("leader", &PatchParams::apply("b").force(), &apply("b"))
        .await
        .unwrap();
    assert_eq!(
        again.resource_version(),
        taken.resource_version(),
        "a repeated apply is a no-op"
    );

    let put: Lease =
        serde_json::from_value(json!({"metadata": {"name": "put"}, "spec": {}})).unwrap();
    let created = leases
        .replace("put", &PostParams::default(), &put)
        .await
        .unwrap();
    assert!(created.uid().is_some(), "PUT creates a missing lease");
}

#[tokio::test]
async fn deletecollection_and_namespace_deletion_remove_objects() {
    let sim = KubeSim::start().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(sim.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "team");
    for (name, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let mut c = claim(name, "1Gi");
        c.labels_mut().insert("app".into(), app.into());
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=x"),
    )
    .await
    .unwrap();
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(left, ["c"]);
    namespaces
        .delete("team", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(api.get("c").await).0, 404);
    assert_eq!(api_error(namespaces.get("team").await).0, 404);
}

#[tokio::test]
async fn streaming_list_watcher_sees_initial_objects() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    for i in 0..3 {
        api.create(&PostParams::default(), &claim(&format!("c{i}"), "1Gi"))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().streaming_lists();
    let stream = watcher(api.clone(), config)
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.state().len(), 3);
    api.create(&PostParams::default(), &claim("c3", "1Gi"))
        .await
        .unwrap();
    eventually("the live event", || async { reader.state().len() == 4 }).await;
    let watches = sim
        .requests()
        .iter()
        .filter(|r| r.verb == "watch" && r.query.contains("sendInitialEvents=true"))
        .count();
    assert!(watches >= 1);
    task.abort();
}

#[tokio::test]
async fn kube_runtime_finalizer_patches_apply() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    api.create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    // What kube_runtime::finalizer sends to add its finalizer to an object without any.
    let add = json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/cleanup"]}
    ]);
    let patch = Patch::Json::<()>(serde_json::from_value(add.clone()).unwrap());
    let added = api
        .patch("a", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert_eq!(added.finalizers(), ["example.com/cleanup"]);
    let (code, _, _) = api_error(api.patch("a", &PatchParams::default(), &patch).await);
    assert_eq!(code, 422, "the test fails once finalizers exist");
    let remove = json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/cleanup"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]);
    let patch = Patch::Json::<()>(serde_json::from_value(remove).unwrap());
    let removed = api
        .patch("a", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert!(removed.finalizers().is_empty());
}

#[tokio::test]
async fn csinodes_are_served_cluster_wide() {
    let sim = KubeSim::start().await.unwrap();
    let csi_nodes: Api<CSINode> = Api::all(sim.client());
    let node: CSINode = serde_json::from_value(json!({
        "metadata": {"name": "node-1"},
        "spec": {"drivers": [{
            "name": "hostpath.csi.k8s.io", "nodeID": "node-1",
            "topologyKeys": ["topology.hostpath.csi/node"]
        }]}
    }))
    .unwrap();
    csi_nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let got = csi_nodes.get("node-1").await.unwrap();
    assert_eq!(
        got.spec.drivers[0].topology_keys.as_deref(),
        Some(&["topology.hostpath.csi/node".to_string()][..])
    );
    let listed = csi_nodes
        .list(&ListParams::default().fields("metadata.name=node-1"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let requests = sim.requests();
    assert_eq!(
        requests.last().unwrap().path,
        "/apis/storage.k8s.io/v1/csinodes"
    );
}
