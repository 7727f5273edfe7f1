//! Bad input gets the real status code and reason as a `Status` object, and the server keeps
//! serving afterwards.

mod common;

use common::{api_error, claim};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kube_sim::KubeSim;
use serde_json::{Value, json};

async fn send(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(body.to_vec())
        .unwrap();
    match client.request::<Value>(req).await {
        Err(kube_client::Error::Api(status)) => {
            let details = serde_json::to_value(&status.details).unwrap();
            (status.code, status.reason.clone(), details)
        }
        other => panic!("{method} {path}: expected an API error, got {other:?}"),
    }
}

/// method, path, content type, body, expected code, expected reason.
type Case = (
    &'static str,
    String,
    &'static str,
    Vec<u8>,
    u16,
    &'static str,
);

const CLAIMS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";

#[tokio::test]
async fn malformed_and_mismatched_requests_get_the_right_status() {
    let sim = KubeSim::start().await.unwrap();
    let c = sim.client();
    let json = "application/json";
    let cases: Vec<Case> = vec![
        (
            "POST",
            CLAIMS.into(),
            json,
            b"{not json".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CLAIMS.into(),
            json,
            b"[1, 2]".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CLAIMS.into(),
            json,
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CLAIMS.into(),
            json,
            br#"{"apiVersion":"v2","kind":"PersistentVolumeClaim","metadata":{"name":"x"}}"#
                .to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CLAIMS.into(),
            json,
            br#"{"metadata":{"name":"x","namespace":"other"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CLAIMS.into(),
            "application/vnd.kubernetes.protobuf",
            b"\x00".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
        (
            "GET",
            "/api/v1/widgets".into(),
            json,
            Vec::new(),
            404,
            "NotFound",
        ),
        (
            "GET",
            "/apis/nope.io/v1/things".into(),
            json,
            Vec::new(),
            404,
            "NotFound",
        ),
        (
            "GET",
            "/api/v1/persistentvolumeclaims/x".into(),
            json,
            Vec::new(),
            404,
            "NotFound",
        ),
        (
            "GET",
            format!("{CLAIMS}/missing"),
            json,
            Vec::new(),
            404,
            "NotFound",
        ),
        (
            "POST",
            format!("{CLAIMS}/x"),
            json,
            b"{}".to_vec(),
            405,
            "MethodNotAllowed",
        ),
        (
            "PATCH",
            format!("{CLAIMS}/x"),
            "text/plain",
            b"{}".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
        (
            "GET",
            format!("{CLAIMS}?labelSelector=a%20in%20x"),
            json,
            Vec::new(),
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{CLAIMS}?continue=zz"),
            json,
            Vec::new(),
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{CLAIMS}?watch=1&resourceVersion=abc"),
            json,
            Vec::new(),
            400,
            "BadRequest",
        ),
    ];
    for (method, path, ct, body, code, reason) in cases {
        let (got_code, got_reason, _) = send(&c, method, &path, ct, &body).await;
        assert_eq!(
            (got_code, got_reason.as_str()),
            (code, reason),
            "{method} {path}"
        );
    }

    // PUT with a name that does not match the URL.
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    api.create(&PostParams::default(), &claim("x", "1Gi"))
        .await
        .unwrap();
    let body = serde_json::to_vec(&claim("y", "1Gi")).unwrap();
    let (code, reason, _) = send(&c, "PUT", &format!("{CLAIMS}/x"), json, &body).await;
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    let (code, reason, _) = send(
        &c,
        "PATCH",
        &format!("{CLAIMS}/x"),
        "application/merge-patch+json",
        b"{bad",
    )
    .await;
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    let (code, reason, _) = send(
        &c,
        "PATCH",
        &format!("{CLAIMS}/x"),
        "application/apply-patch+yaml",
        b"{}",
    )
    .await;
    assert_eq!(
        (code, reason.as_str()),
        (400, "BadRequest"),
        "apply needs a fieldManager"
    );

    // Still serving.
    assert_eq!(
        api.get("x").await.unwrap().metadata.name.as_deref(),
        Some("x")
    );
}

#[tokio::test]
async fn invalid_objects_get_422_with_causes() {
    let sim = KubeSim::start().await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let (code, reason, message) = api_error(
        claims
            .create(&PostParams::default(), &claim("Bad_Name", "1Gi"))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.starts_with(
            "PersistentVolumeClaim \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": \
             a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
        ),
        "{message}"
    );
    let err = claims
        .create(&PostParams::default(), &claim("big", "lots"))
        .await;
    assert_eq!(
        api_error(err).0,
        400,
        "an unparseable quantity is a decode error"
    );
    let err = claims
        .create(&PostParams::default(), &claim("zero", "0"))
        .await;
    assert_eq!(api_error(err).0, 422);
    let mut no_modes = claim("modes", "1Gi");
    no_modes.spec.as_mut().unwrap().access_modes = None;
    let (code, _, message) = api_error(claims.create(&PostParams::default(), &no_modes).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.accessModes: Required value"),
        "{message}"
    );

    let pvs: Api<PersistentVolume> = Api::all(sim.client());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv"}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}
    }))
    .unwrap();
    let (code, _, message) = api_error(pvs.create(&PostParams::default(), &pv).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("spec: Required value: must specify a volume type"),
        "{message}"
    );

    let classes: Api<StorageClass> = Api::all(sim.client());
    let sc: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": "sc"}, "provisioner": ""})).unwrap();
    let (code, _, message) = api_error(classes.create(&PostParams::default(), &sc).await);
    assert_eq!(
        (code, message.as_str()),
        (
            422,
            "StorageClass \"sc\" is invalid: provisioner: Required value"
        )
    );

    let namespaces: Api<Namespace> = Api::all(sim.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "a.b"}})).unwrap();
    assert_eq!(
        api_error(namespaces.create(&PostParams::default(), &ns).await).0,
        422
    );

    // Immutable fields.
    let mut c = claim("keep", "1Gi");
    c.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
    let created = claims.create(&PostParams::default(), &c).await.unwrap();
    let mut moved = created.clone();
    moved.spec.as_mut().unwrap().storage_class_name = Some("slow".into());
    let (code, _, message) =
        api_error(claims.replace("keep", &PostParams::default(), &moved).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("spec: Forbidden: spec is immutable after creation"),
        "{message}"
    );
    let mut bound = created.clone();
    bound.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
    assert!(
        claims
            .replace("keep", &PostParams::default(), &bound)
            .await
            .is_ok(),
        "volumeName is set once"
    );

    assert!(claims.get("keep").await.is_ok(), "still serving");
}

#[tokio::test]
async fn dry_run_validates_without_storing() {
    let sim = KubeSim::start().await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let answered = claims.create(&pp, &claim("dry", "1Gi")).await.unwrap();
    assert_eq!(answered.metadata.name.as_deref(), Some("dry"));
    assert_eq!(api_error(claims.get("dry").await).0, 404);
    assert_eq!(
        api_error(claims.create(&pp, &claim("Bad", "1Gi")).await).0,
        422
    );
}

#[tokio::test]
async fn odd_bodies_on_every_verb_never_take_the_server_down() {
    let sim = KubeSim::start().await.unwrap();
    let c = sim.client();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    api.create(&PostParams::default(), &claim("x", "1Gi"))
        .await
        .unwrap();
    let bodies: [&[u8]; 9] = [
        b"",
        b"null",
        b"5",
        br#"{"metadata": "x"}"#,
        br#"{"metadata": {"name": 5, "labels": [1]}, "spec": "s", "status": 7}"#,
        br#"{"metadata": null, "spec": {"accessModes": "RWO", "resources": 1}}"#,
        br#"[{"op": "replace", "path": "", "value": 5}]"#,
        br#"[{"op": "add", "path": "/metadata", "value": "m"}]"#,
        b"\xff\xfe",
    ];
    let types = [
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    ];
    let targets = [
        CLAIMS.to_string(),
        format!("{CLAIMS}/x"),
        format!("{CLAIMS}/x/status"),
    ];
    for body in bodies {
        for ct in types {
            for path in &targets {
                for method in ["POST", "PUT", "PATCH", "DELETE"] {
                    let req = http::Request::builder()
                        .method(method)
                        .uri(format!("{path}?fieldManager=m"))
                        .header("content-type", ct)
                        .body(body.to_vec())
                        .unwrap();
                    let _ = c.request_text(req).await;
                }
            }
        }
    }
    let list = api.list(&Default::default()).await.unwrap();
    assert!(
        list.items.len() <= 1,
        "still serving: {:?}",
        list.items.len()
    );
    api.create(&PostParams::default(), &claim("after", "1Gi"))
        .await
        .unwrap();
}
