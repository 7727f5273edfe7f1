//! CustomResourceDefinitions created through the API: served at once, Established, CRUD and
//! watch with and without a status subresource, and removed with their objects.

mod common;

use common::api_error;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::ResourceExt;
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PostParams, WatchEvent, WatchParams,
};
use kube_runtime::wait::{await_condition, conditions};
use kube_sim::KubeSim;
use serde_json::json;

fn crd(status: bool) -> CustomResourceDefinition {
    let mut version = json!({
        "name": "v1alpha1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
    });
    if status {
        version["subresources"] = json!({"status": {}});
    }
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "cnsvolumemetadatas.cns.vmware.com"},
        "spec": {
            "group": "cns.vmware.com",
            "scope": "Namespaced",
            "names": {"plural": "cnsvolumemetadatas", "singular": "cnsvolumemetadata",
                      "kind": "CnsVolumeMetadata", "shortNames": ["cnsvm"]},
            "versions": [version]
        }
    }))
    .unwrap()
}

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cns.vmware.com", "v1alpha1", "CnsVolumeMetadata"),
        "cnsvolumemetadatas",
    )
}

fn metadata_object(name: &str) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &resource());
    obj.data = json!({
        "spec": {"volumenames": ["pvc-1"], "entitytype": "PERSISTENT_VOLUME_CLAIM", "entityname": "claim"},
        "status": {"volumestatus": [{"volumename": "pvc-1", "updated": false}]}
    });
    obj
}

async fn install(sim: &KubeSim, status: bool) {
    let crds: Api<CustomResourceDefinition> = Api::all(sim.client());
    crds.create(&PostParams::default(), &crd(status))
        .await
        .unwrap();
    let established = await_condition(
        crds,
        "cnsvolumemetadatas.cns.vmware.com",
        conditions::is_crd_established(),
    );
    let got = established.await.unwrap().expect("the CRD exists");
    let accepted = got.status.unwrap().accepted_names.unwrap();
    assert_eq!(accepted.list_kind.as_deref(), Some("CnsVolumeMetadataList"));
}

#[tokio::test]
async fn crd_without_status_subresource_serves_crud_and_watch() {
    let sim = KubeSim::start().await.unwrap();
    install(&sim, false).await;
    let api: Api<DynamicObject> = Api::namespaced_with(sim.client(), "default", &resource());
    let mut events = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();

    let created = api
        .create(&PostParams::default(), &metadata_object("m1"))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.data["status"]["volumestatus"][0]["volumename"], "pvc-1",
        "status is a plain field"
    );
    let patched = api
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumestatus": []}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["volumestatus"], json!([]));
    assert_eq!(
        patched.metadata.generation,
        Some(2),
        "without a status subresource status is spec-like"
    );
    let (code, reason, _) = api_error(
        api.patch(
            "m1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
    let (code, _, _) = api_error(
        api.patch_status("m1", &PatchParams::default(), &Patch::Merge(json!({})))
            .await,
    );
    assert_eq!(code, 404, "no /status without the subresource");
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
    api.delete("m1", &DeleteParams::default()).await.unwrap();

    let mut seen = Vec::new();
    while seen.len() < 3 {
        match events.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.name_any())),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.name_any())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.name_any())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED m1", "MODIFIED m1", "DELETED m1"]);
}

#[tokio::test]
async fn crd_with_status_subresource_splits_status_writes() {
    let sim = KubeSim::start().await.unwrap();
    install(&sim, true).await;
    let api: Api<DynamicObject> = Api::namespaced_with(sim.client(), "default", &resource());
    let created = api
        .create(&PostParams::default(), &metadata_object("m1"))
        .await
        .unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );
    let status = Patch::Merge(
        json!({"status": {"volumestatus": [{"volumename": "pvc-1", "updated": true}]}}),
    );
    let updated = api
        .patch_status("m1", &PatchParams::default(), &status)
        .await
        .unwrap();
    assert_eq!(updated.data["status"]["volumestatus"][0]["updated"], true);
    assert_eq!(updated.metadata.generation, Some(1));
    let main =
        Patch::Merge(json!({"spec": {"entityname": "other"}, "status": {"volumestatus": []}}));
    let after = api
        .patch("m1", &PatchParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(after.data["spec"]["entityname"], "other");
    assert_eq!(
        after.data["status"]["volumestatus"][0]["updated"], true,
        "main writes keep status"
    );
    assert_eq!(after.metadata.generation, Some(2));

    let mut stale = after.clone();
    stale.metadata.resource_version = None;
    let (code, reason, _) = api_error(api.replace("m1", &PostParams::default(), &stale).await);
    assert_eq!(
        (code, reason.as_str()),
        (422, "Invalid"),
        "custom resources need a resourceVersion on PUT"
    );
}

#[tokio::test]
async fn deleting_a_crd_removes_its_objects_and_routes() {
    let sim = KubeSim::start().await.unwrap();
    install(&sim, false).await;
    let api: Api<DynamicObject> = Api::namespaced_with(sim.client(), "default", &resource());
    api.create(&PostParams::default(), &metadata_object("m1"))
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(sim.client());
    crds.delete(
        "cnsvolumemetadatas.cns.vmware.com",
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    let (code, _, message) = api_error(api.get("m1").await);
    assert_eq!(code, 404);
    assert_eq!(message, "the server could not find the requested resource");
    let (code, reason, _) = api_error(
        crds.create(&PostParams::default(), &{
            let mut bad = crd(false);
            bad.metadata.name = Some("wrong".into());
            bad
        })
        .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
}
