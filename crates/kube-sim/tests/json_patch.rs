//! A JSON patch whose `test` fails is answered as kube-apiserver answers it: 422, reason
//! `Invalid`, the generic message and no causes, and the object is left unchanged.

mod common;

use common::claim;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kube_client::{Error, ResourceExt};
use kube_sim::KubeSim;
use serde_json::json;

async fn patch(
    api: &Api<PersistentVolumeClaim>,
    ops: serde_json::Value,
) -> Result<PersistentVolumeClaim, Error> {
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(ops).unwrap()),
    )
    .await
}

#[tokio::test]
async fn a_failed_json_patch_test_is_422_invalid_with_the_real_servers_message() {
    let sim = KubeSim::start().await.unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client());
    let mut c = claim("c", "1Gi");
    c.metadata.labels = Some([("a".to_owned(), "1".to_owned())].into());
    api.create(&PostParams::default(), &c).await.unwrap();
    let failing = [
        // A value that differs.
        json!([{"op": "test", "path": "/metadata/labels/a", "value": "2"},
               {"op": "add", "path": "/metadata/labels/t", "value": "x"}]),
        // A member of a missing object is not null.
        json!([{"op": "test", "path": "/metadata/missing/x", "value": null},
               {"op": "add", "path": "/metadata/labels/t", "value": "x"}]),
        // A later operation that cannot apply fails the whole patch too.
        json!([{"op": "add", "path": "/metadata/labels/t", "value": "x"},
               {"op": "remove", "path": "/metadata/labels/missing"}]),
    ];
    for ops in failing {
        let Err(Error::Api(status)) = patch(&api, ops.clone()).await else {
            panic!("{ops} was not refused");
        };
        assert_eq!(status.code, 422, "{ops}");
        assert_eq!(status.reason, "Invalid", "{ops}");
        assert_eq!(
            status.message,
            "the server rejected our request due to an error in our request"
        );
        let causes = status.details.as_ref().map_or(0, |d| d.causes.len());
        assert_eq!(causes, 0, "the real server gives no causes: {status:?}");
        assert!(
            api.get("c").await.unwrap().labels().get("t").is_none(),
            "a refused patch changes nothing"
        );
    }

    // A passing test (a missing member of an existing object reads as null) applies.
    let passing = json!([{"op": "test", "path": "/metadata/labels/a", "value": "1"},
                         {"op": "test", "path": "/metadata/labels/none", "value": null},
                         {"op": "add", "path": "/metadata/labels/t", "value": "x"}]);
    let patched = patch(&api, passing).await.unwrap();
    assert_eq!(patched.labels()["t"], "x");
}
