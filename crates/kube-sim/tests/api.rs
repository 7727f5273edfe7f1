//! CRUD semantics through a real kube client: defaults, conflicts, generateName, selectors,
//! paging, status subresource, patches and delete preconditions.

mod common;

use common::{api_error, claim};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_client::ResourceExt;
use kube_client::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube_sim::KubeSim;
use serde_json::json;

#[tokio::test]
async fn create_sets_server_fields_and_defaults() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let created = api
        .create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    assert!(created.uid().is_some_and(|u| u.len() == 36));
    assert!(created.resource_version().unwrap().parse::<u64>().is_ok());
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(
        created.spec.unwrap().volume_mode.as_deref(),
        Some("Filesystem")
    );

    let (code, reason, message) =
        api_error(api.create(&PostParams::default(), &claim("a", "1Gi")).await);
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(message, "persistentvolumeclaims \"a\" already exists");

    let namespaces: Api<Namespace> = Api::all(sim.client());
    for ns in ["default", "kube-system", "kube-public"] {
        let got = namespaces.get(ns).await.unwrap();
        assert_eq!(got.status.unwrap().phase.as_deref(), Some("Active"));
    }
    let classes: Api<StorageClass> = Api::all(sim.client());
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "fast"}, "provisioner": "csi.example.com"
    }))
    .unwrap();
    let sc = classes.create(&PostParams::default(), &sc).await.unwrap();
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(sc.volume_binding_mode.as_deref(), Some("Immediate"));
    assert_eq!(sc.metadata.generation, None);
}

#[tokio::test]
async fn missing_namespace_is_404() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(sim.client(), "nowhere");
    let (code, _, message) =
        api_error(api.create(&PostParams::default(), &claim("a", "1Gi")).await);
    assert_eq!(
        (code, message.as_str()),
        (404, "namespaces \"nowhere\" not found")
    );
}

#[tokio::test]
async fn stale_update_is_409_conflict_and_generation_follows_spec() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let first = api
        .create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    let mut labelled = first.clone();
    labelled.labels_mut().insert("x".into(), "y".into());
    let second = api
        .replace("a", &PostParams::default(), &labelled)
        .await
        .unwrap();
    assert_eq!(
        second.metadata.generation,
        Some(1),
        "metadata changes keep the generation"
    );
    assert_ne!(second.resource_version(), first.resource_version());

    let err = api.replace("a", &PostParams::default(), &first).await;
    match err {
        Err(kube_client::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
            assert_eq!(
                status.message,
                "Operation cannot be fulfilled on persistentvolumeclaims \"a\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }

    // A Pending claim's spec is immutable but for `volumeName`, which may be set once.
    let mut bigger = second.clone();
    bigger.spec.as_mut().unwrap().volume_name = Some("pv-a".into());
    let third = api
        .replace("a", &PostParams::default(), &bigger)
        .await
        .unwrap();
    assert_eq!(third.metadata.generation, Some(2));

    let mut other_uid = third.clone();
    other_uid.metadata.uid = Some("0000".into());
    let (code, _, message) = api_error(api.replace("a", &PostParams::default(), &other_uid).await);
    assert_eq!(code, 409);
    assert!(
        message.contains("Precondition failed: UID in precondition: 0000"),
        "{message}"
    );

    let mut unconditional = third.clone();
    unconditional.metadata.resource_version = None;
    unconditional.labels_mut().insert("z".into(), "1".into());
    assert!(
        api.replace("a", &PostParams::default(), &unconditional)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn main_writes_keep_status_and_status_writes_keep_the_rest() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    api.create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    let status = Patch::Merge(
        json!({"status": {"phase": "Bound"}, "metadata": {"labels": {"ignored": "yes"}}}),
    );
    let bound = api
        .patch_status("a", &PatchParams::default(), &status)
        .await
        .unwrap();
    assert_eq!(
        bound.status.as_ref().unwrap().phase.as_deref(),
        Some("Bound")
    );
    assert!(
        bound.labels().get("ignored").is_none(),
        "a status write changes only status"
    );

    let main =
        Patch::Merge(json!({"status": {"phase": "Lost"}, "metadata": {"labels": {"kept": "yes"}}}));
    let after = api
        .patch("a", &PatchParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Bound"),
        "main writes keep status"
    );
    assert_eq!(after.labels()["kept"], "yes");
}

#[tokio::test]
async fn generate_name_gives_a_fresh_valid_name() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let mut c = claim("", "1Gi");
    c.metadata.name = None;
    c.metadata.generate_name = Some("claim-".into());
    let a = api.create(&PostParams::default(), &c).await.unwrap();
    let b = api.create(&PostParams::default(), &c).await.unwrap();
    assert!(a.name_any().starts_with("claim-") && a.name_any().len() == "claim-".len() + 5);
    assert_ne!(a.name_any(), b.name_any());
    c.metadata.generate_name = Some("Bad_".into());
    let (code, _, message) = api_error(api.create(&PostParams::default(), &c).await);
    assert_eq!(code, 422);
    assert!(message.contains("metadata.generateName"), "{message}");
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    for (name, app) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let mut c = claim(name, "1Gi");
        c.labels_mut().insert("app".into(), app.into());
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    api.create(&PostParams::default(), &claim("d", "1Gi"))
        .await
        .unwrap();
    let names = |list: kube_client::api::ObjectList<PersistentVolumeClaim>| {
        list.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    };
    let q = |s: &str| ListParams::default().labels(s);
    assert_eq!(names(api.list(&q("app=web")).await.unwrap()), ["a", "c"]);
    assert_eq!(names(api.list(&q("app!=web")).await.unwrap()), ["b", "d"]);
    assert_eq!(names(api.list(&q("app in (db,x)")).await.unwrap()), ["b"]);
    assert_eq!(
        names(api.list(&q("app notin (web)")).await.unwrap()),
        ["b", "d"]
    );
    assert_eq!(names(api.list(&q("!app")).await.unwrap()), ["d"]);
    assert_eq!(names(api.list(&q("app")).await.unwrap()), ["a", "b", "c"]);
    let f = ListParams::default().fields("metadata.name=b");
    assert_eq!(names(api.list(&f).await.unwrap()), ["b"]);
    let all: Api<PersistentVolumeClaim> = Api::all(sim.client());
    let f = ListParams::default().fields("metadata.namespace!=default");
    assert!(all.list(&f).await.unwrap().items.is_empty());
    let (code, reason, _) = api_error(
        api.list(&ListParams::default().fields("spec.volumeName=x"))
            .await,
    );
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
}

#[tokio::test]
async fn limit_and_continue_page_through_25_objects() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    for i in 0..25 {
        api.create(&PostParams::default(), &claim(&format!("c{i:02}"), "1Gi"))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().limit(10);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        seen.extend(page.items.iter().map(ResourceExt::name_any));
        assert!(page.metadata.resource_version.is_some());
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => {
                assert_eq!(
                    page.metadata.remaining_item_count,
                    Some(25 - seen.len() as i64)
                );
                token = Some(t);
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("c{i:02}")).collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn delete_preconditions_and_missing_objects() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let created = api
        .create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let (code, reason, message) = api_error(api.delete("a", &wrong).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    // The real server's words (`rest.BeforeDelete`): the kind, not the resource.
    let uid = created.metadata.uid.clone().unwrap();
    assert_eq!(
        message,
        format!(
            "Operation cannot be fulfilled on PersistentVolumeClaim \"a\": the UID in the \
             precondition (nope) does not match the UID in record ({uid}). The object might \
             have been deleted and then recreated"
        )
    );
    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..DeleteParams::default()
    };
    assert_eq!(api_error(api.delete("a", &stale).await).0, 409);
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.uid(),
            resource_version: created.resource_version(),
        }),
        ..DeleteParams::default()
    };
    api.delete("a", &right).await.unwrap();
    let (code, reason, _) = api_error(api.delete("a", &DeleteParams::default()).await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn patches_merge_json_strategic_and_apply() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let mut c = claim("a", "1Gi");
    c.metadata.finalizers = Some(vec!["one".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    let pp = PatchParams::default();

    let merged = api
        .patch(
            "a",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"m": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.labels()["m"], "1");

    let ops = json!([{"op": "add", "path": "/metadata/annotations", "value": {"j": "2"}}]);
    let jsoned = api
        .patch(
            "a",
            &pp,
            &Patch::Json::<()>(serde_json::from_value(ops).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(jsoned.annotations()["j"], "2");

    let failing = json!([{"op": "test", "path": "/metadata/name", "value": "b"},
                         {"op": "add", "path": "/metadata/labels/t", "value": "x"}]);
    let (code, reason, _) = api_error(
        api.patch(
            "a",
            &pp,
            &Patch::Json::<()>(serde_json::from_value(failing).unwrap()),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        api.get("a").await.unwrap().labels().get("t").is_none(),
        "a failed test changes nothing"
    );

    let strategic = json!({"metadata": {"finalizers": ["two"], "labels": {"m": null, "s": "3"}}});
    let sm = api
        .patch("a", &pp, &Patch::Strategic(strategic))
        .await
        .unwrap();
    assert_eq!(sm.finalizers(), ["one", "two"], "finalizers merge as a set");
    assert_eq!(sm.labels().get("m"), None);
    assert_eq!(sm.labels()["s"], "3");

    let apply = PatchParams::apply("sim-test").force();
    let applied = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "metadata": {"name": "a", "labels": {"ssa": "4"}}});
    let ssa = api
        .patch("a", &apply, &Patch::Apply(applied))
        .await
        .unwrap();
    assert_eq!(ssa.labels()["ssa"], "4");
    assert_eq!(ssa.labels()["s"], "3");
    let fields = ssa.metadata.managed_fields.unwrap();
    assert!(fields.iter().any(
        |f| f.manager.as_deref() == Some("sim-test") && f.operation.as_deref() == Some("Apply")
    ));

    let fresh = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "new"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let created = api
        .patch("new", &apply, &Patch::Apply(fresh))
        .await
        .unwrap();
    assert_eq!(
        created.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "apply creates a missing object"
    );
}

#[tokio::test]
async fn kubectl_style_table_requests_get_a_table() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    api.create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    let req = http::Request::builder()
        .uri("/api/v1/namespaces/default/persistentvolumeclaims")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
    let table: serde_json::Value = sim.client().request(req).await.unwrap();
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Status",
            "Volume",
            "Capacity",
            "Access Modes",
            "StorageClass",
            "VolumeAttributesClass",
            "Age",
            "VolumeMode"
        ]
    );
    assert_eq!(table["columnDefinitions"][8]["priority"], 1);
    assert_eq!(table["rows"][0]["cells"][0], "a");
    assert_eq!(table["rows"][0]["cells"][1], "Pending");
    assert_eq!(table["rows"][0]["object"]["metadata"]["name"], "a");
}

/// A real kube-apiserver (v1.36) treats a `metadata.uid` in a patch as a change of an
/// immutable field, not as a precondition: 422 Invalid, for merge and strategic-merge
/// patches alike (a PUT's uid stays a precondition: 409, see above).
#[tokio::test]
async fn a_patch_with_another_uid_is_invalid_as_on_a_real_server() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let created = api
        .create(&PostParams::default(), &claim("a", "1Gi"))
        .await
        .unwrap();
    let other = "00000000-0000-0000-0000-000000000000";
    let body = json!({"metadata": {"uid": other, "labels": {"x": "1"}}});
    for patch in [Patch::Merge(body.clone()), Patch::Strategic(body.clone())] {
        let Err(kube_client::Error::Api(status)) =
            api.patch("a", &PatchParams::default(), &patch).await
        else {
            panic!("expected an API error");
        };
        assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
        assert_eq!(
            status.message,
            format!(
                "PersistentVolumeClaim \"a\" is invalid: metadata.uid: Invalid value: \
                 \"{other}\": field is immutable"
            )
        );
        let details = status.details.expect("details");
        assert_eq!(
            (
                details.name.as_str(),
                details.kind.as_str(),
                details.group.as_str()
            ),
            ("a", "PersistentVolumeClaim", "")
        );
        let causes: Vec<(String, String, String)> = details
            .causes
            .iter()
            .map(|c| (c.reason.clone(), c.field.clone(), c.message.clone()))
            .collect();
        assert_eq!(
            causes,
            [(
                "FieldValueInvalid".to_owned(),
                "metadata.uid".to_owned(),
                format!("Invalid value: \"{other}\": field is immutable"),
            )]
        );
    }
    let unchanged = api.get("a").await.unwrap();
    assert_eq!(unchanged.uid(), created.uid());
    assert!(unchanged.labels().get("x").is_none(), "nothing was written");
    // The object's own uid (or none) is no change.
    let own = json!({"metadata": {"uid": created.uid(), "labels": {"x": "1"}}});
    api.patch("a", &PatchParams::default(), &Patch::Merge(own))
        .await
        .unwrap();
    // A stale resourceVersion in a patch body is a conflict before anything is validated.
    let stale = json!({"metadata": {"uid": other, "resourceVersion": "1"}});
    let (code, reason, _) = api_error(
        api.patch("a", &PatchParams::default(), &Patch::Merge(stale))
            .await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
}

/// The real server refuses new finalizers on an object being deleted (422), and its delete
/// preconditions name the resourceVersions as `rest.BeforeDelete` does.
#[tokio::test]
async fn no_new_finalizers_on_a_deleted_object_and_the_real_precondition_words() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let mut held = claim("a", "1Gi");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = api.create(&PostParams::default(), &held).await.unwrap();
    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..DeleteParams::default()
    };
    let (code, _, message) = api_error(api.delete("a", &stale).await);
    assert_eq!(code, 409);
    let rv = created.resource_version().unwrap();
    assert_eq!(
        message,
        format!(
            "Operation cannot be fulfilled on PersistentVolumeClaim \"a\": the ResourceVersion \
             in the precondition (1) does not match the ResourceVersion in record ({rv}). The \
             object might have been modified"
        )
    );
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let add = json!({"metadata": {"finalizers": ["example.com/late"]}});
    let (code, reason, message) = api_error(
        api.patch("a", &PatchParams::default(), &Patch::Strategic(add))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        "PersistentVolumeClaim \"a\" is invalid: metadata.finalizers: Forbidden: no new \
         finalizers can be added if the object is being deleted, found new finalizers \
         []string{\"example.com/late\"}"
    );
    let release =
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/hold"]}});
    api.patch("a", &PatchParams::default(), &Patch::Strategic(release))
        .await
        .unwrap();
    assert!(api.get_opt("a").await.unwrap().is_none());
}
