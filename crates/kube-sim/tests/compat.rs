//! What real clients rely on beyond CRUD: `fieldValidation` (unknown fields of built-in
//! types are never stored), per-type field selectors, core/v1 and `events.k8s.io/v1` Events
//! as one storage, and allowed self reviews.

mod common;

use common::api_error;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    ValidationDirective, WatchEvent, WatchParams,
};
use kube_client::core::GroupVersionKind;
use kube_client::{Client, ResourceExt};
use kube_runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use kube_sim::KubeSim;
use serde_json::{Value, json};

const CLAIMS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";

fn claims_dynamic(client: Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("", "v1", "PersistentVolumeClaim");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "persistentvolumeclaims");
    Api::namespaced_with(client, "default", &resource)
}

/// A claim with unknown fields in its metadata and spec.
fn bogus_claim(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "bogusMeta": "x"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "bogus": 1,
        },
    })
}

/// Sends a raw request and returns the status, the `Warning` headers and the body.
async fn send(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Value,
) -> (u16, Vec<String>, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube_client::client::Body::from(
            serde_json::to_vec(&body).unwrap(),
        ))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bytes = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), 1 << 20)
        .await
        .unwrap();
    (status, warnings, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn strict_field_validation_refuses_unknown_fields_of_builtin_types() {
    let sim = KubeSim::start().await.unwrap();
    let api = claims_dynamic(sim.client());
    let body = bogus_claim("a");
    let path = format!("{CLAIMS}?fieldValidation=Strict");
    let (code, _, status) = send(&sim.client(), "POST", &path, "application/json", body).await;
    assert_eq!((code, &status["reason"]), (400, &json!("BadRequest")));
    assert_eq!(
        status["message"],
        "PersistentVolumeClaim in version \"v1\" cannot be handled as a PersistentVolumeClaim: \
         strict decoding error: unknown field \"metadata.bogusMeta\", unknown field \"spec.bogus\""
    );
    assert!(api.get_opt("a").await.unwrap().is_none());

    let claim: DynamicObject = serde_json::from_value(bogus_claim("a")).unwrap();
    api.create(&PostParams::default(), &claim).await.unwrap();
    let patch = Patch::Merge(json!({"spec": {"alsoBogus": true}}));
    let params = PatchParams {
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::default()
    };
    let (code, _, message) = api_error(api.patch("a", &params, &patch).await);
    assert_eq!(code, 400);
    assert_eq!(
        message,
        "strict decoding error: unknown field \"spec.alsoBogus\""
    );
    let apply = Patch::Apply(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "a"}, "spec": {"applyBogus": 1},
    }));
    let params = PatchParams {
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::apply("test")
    };
    let (code, _, message) = api_error(api.patch("a", &params, &apply).await);
    assert_eq!(code, 400);
    assert!(
        message.ends_with("default/a: .spec.applyBogus: field not declared in schema"),
        "{message}"
    );
}

#[tokio::test]
async fn unknown_fields_are_dropped_with_a_warning_and_never_stored() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client();
    let body = bogus_claim("w");
    // No fieldValidation is Warn, as on the real server.
    let (code, warnings, stored) = send(&client, "POST", CLAIMS, "application/json", body).await;
    assert_eq!(code, 201, "{stored}");
    assert_eq!(
        warnings,
        [
            r#"299 - "unknown field \"metadata.bogusMeta\"""#,
            r#"299 - "unknown field \"spec.bogus\"""#
        ]
    );
    assert!(stored["spec"].get("bogus").is_none(), "{stored}");
    assert_eq!(stored["spec"]["accessModes"], json!(["ReadWriteOnce"]));

    let path = format!("{CLAIMS}/w?fieldValidation=Ignore");
    let patch = json!({"spec": {"bogus": 2}, "metadata": {"labels": {"a": "b"}}});
    let (code, warnings, patched) = send(
        &client,
        "PATCH",
        &path,
        "application/merge-patch+json",
        patch,
    )
    .await;
    assert_eq!((code, warnings.len()), (200, 0), "{patched}");
    assert_eq!(patched["metadata"]["labels"]["a"], "b");
    assert!(patched["spec"].get("bogus").is_none(), "{patched}");

    let path = format!("{CLAIMS}/w?fieldValidation=Warn");
    let patch = json!({"spec": {"resources": {"requests": {"storage": "1Gi"}, "nope": 1}}});
    let (code, warnings, _) = send(
        &client,
        "PATCH",
        &path,
        "application/strategic-merge-patch+json",
        patch,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        warnings,
        [r#"299 - "unknown field \"spec.resources.nope\"""#]
    );

    let read = claims_dynamic(client.clone()).get("w").await.unwrap();
    let read = serde_json::to_value(read).unwrap();
    assert!(read["spec"].get("bogus").is_none(), "{read}");
    assert!(read["spec"]["resources"].get("nope").is_none(), "{read}");
    assert!(read["metadata"].get("bogusMeta").is_none(), "{read}");

    let path = format!("{CLAIMS}?fieldValidation=Loose");
    let (code, _, status) = send(&client, "POST", &path, "application/json", json!({})).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \
         \"Loose\": supported values: \"Ignore\", \"Strict\", \"Warn\""
    );
}

#[tokio::test]
async fn pods_select_by_node_and_phase() {
    let sim = KubeSim::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(sim.client());
    for (name, node) in [("a", "n1"), ("b", "n2"), ("c", "n1")] {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let names = |list: kube_client::api::ObjectList<Pod>| {
        list.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    };
    let on = |s: &str| ListParams::default().fields(s);
    assert_eq!(
        names(pods.list(&on("spec.nodeName=n1")).await.unwrap()),
        ["a", "c"]
    );
    assert_eq!(
        names(
            pods.list(&on("spec.nodeName!=n1,status.phase=Pending"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    let (code, _, message) = api_error(pods.list(&on("spec.bogus=x")).await);
    assert_eq!(
        (code, message.as_str()),
        (400, "field label not supported: spec.bogus")
    );
}

fn claim_ref(uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some("data".into()),
        namespace: Some("default".into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

#[tokio::test]
async fn events_are_one_storage_and_select_by_the_object_they_regard() {
    let sim = KubeSim::start().await.unwrap();
    let recorder = Recorder::new(
        sim.client(),
        Reporter {
            controller: "example.com/csi".into(),
            instance: Some("csi-0".into()),
        },
    );
    let failed = RecordedEvent {
        type_: EventType::Warning,
        reason: "ProvisioningFailed".into(),
        note: Some("no space left".into()),
        action: "Provision".into(),
        secondary: None,
    };
    recorder.publish(&failed, &claim_ref("u-1")).await.unwrap();
    recorder.publish(&failed, &claim_ref("u-1")).await.unwrap();
    let core: Api<CoreEvent> = Api::default_namespaced(sim.client());
    let other = serde_json::from_value(json!({
        "metadata": {"name": "other.1"},
        "involvedObject": {"kind": "PersistentVolumeClaim", "name": "other",
                           "namespace": "default", "uid": "u-2"},
        "reason": "ExternalProvisioning", "message": "waiting", "type": "Normal",
        "source": {"component": "persistentvolume-controller"},
    }))
    .unwrap();
    core.create(&PostParams::default(), &other).await.unwrap();

    // kubectl describe's query, on core/v1.
    let about_data = ListParams::default().fields(
        "involvedObject.name=data,involvedObject.namespace=default,\
         involvedObject.kind=PersistentVolumeClaim,involvedObject.uid=u-1",
    );
    let listed = core.list(&about_data).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    let seen = &listed.items[0];
    assert_eq!(seen.reason.as_deref(), Some("ProvisioningFailed"));
    assert_eq!(seen.message.as_deref(), Some("no space left"));
    assert_eq!(seen.type_.as_deref(), Some("Warning"));
    assert_eq!(seen.reporting_component.as_deref(), Some("example.com/csi"));
    assert_eq!(seen.series.as_ref().and_then(|s| s.count), Some(2));

    // The same storage through events.k8s.io/v1, with its own field labels.
    let v1: Api<Event> = Api::default_namespaced(sim.client());
    let all = v1.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 2);
    let waiting = v1
        .list(&ListParams::default().fields("regarding.name=other,reportingController="))
        .await
        .unwrap();
    assert_eq!(waiting.items.len(), 1);
    assert_eq!(waiting.items[0].note.as_deref(), Some("waiting"));
    assert_eq!(
        waiting.items[0].metadata.resource_version,
        core.get("other.1").await.unwrap().metadata.resource_version
    );
    let (code, _, message) = api_error(
        v1.list(&ListParams::default().fields("involvedObject.name=x"))
            .await,
    );
    assert_eq!(
        (code, message.as_str()),
        (400, "field label not supported: involvedObject.name")
    );

    // A delete through one API is a DELETED event in the other.
    let mut watch = core
        .watch(
            &WatchParams::default().fields("reason=ExternalProvisioning"),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    assert!(matches!(watch.next().await, Some(Ok(WatchEvent::Added(_)))));
    v1.delete("other.1", &DeleteParams::default())
        .await
        .unwrap();
    match watch.next().await {
        Some(Ok(WatchEvent::Deleted(e))) => assert_eq!(e.name_any(), "other.1"),
        other => panic!("expected DELETED, got {other:?}"),
    }
    assert!(core.get_opt("other.1").await.unwrap().is_none());
    assert_eq!(sim.object_count(), 4 + 1, "namespaces plus one event");
}

#[tokio::test]
async fn self_access_reviews_are_allowed() {
    let sim = KubeSim::start().await.unwrap();
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "delete", "resource": "persistentvolumes"}},
    });
    let (code, _, answer) = send(
        &sim.client(),
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        "application/json",
        review,
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(answer["status"]["allowed"], true);
    assert_eq!(answer["spec"]["resourceAttributes"]["verb"], "delete");
}
