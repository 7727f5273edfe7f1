//! The cost of crash-safe provisioning (the claim finalizer around `provision`).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::api::ListParams;
use provision_controller::{annotations::FINALIZER_PROVISIONING, testing::FakeProvisioner};

use crate::{Env, claim, eventually, fast_class, quiet};

const KEEP: &str = "example.com/keep";

/// The claim `name` once it is Bound and our finalizer is gone, read by a list (the test
/// must not GET the claim itself: it counts the controller's GETs).
async fn bound_without_intent(env: &Env, name: &str) -> PersistentVolumeClaim {
    eventually(
        &format!("claim {name} bound, finalizer removed"),
        || async {
            let listed = env.claims().list(&ListParams::default()).await.ok()?;
            let c = listed
                .items
                .into_iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))?;
            let bound = c.status.as_ref()?.phase.as_deref() == Some("Bound");
            let ours = c
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == FINALIZER_PROVISIONING);
            (bound && !ours).then_some(c)
        },
    )
    .await
}

/// Provisions one claim that carries another finalizer and returns the requests on the
/// claim (by the controller and by the sim's binder, which patches it twice).
async fn claim_requests(crash_safe: bool) -> Vec<kube_sim::RequestRecord> {
    let config = quiet().crash_safe_provisioning(crash_safe);
    let env = Env::start(config, FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    let mut data = claim("data");
    data.metadata.finalizers = Some(vec![KEEP.to_owned()]);
    env.create_claim(data).await;
    let bound = bound_without_intent(&env, "data").await;
    assert_eq!(
        crate::own_finalizers(bound.metadata.finalizers.as_ref()),
        [KEEP],
        "others' finalizers are kept"
    );
    assert_eq!(env.fake.provision_calls().len(), 1);
    let requests = env
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/namespaces/default/persistentvolumeclaims/data")
        .collect();
    env.stop().await;
    requests
}

#[tokio::test]
async fn crash_safety_costs_two_patches_of_the_claim_and_no_read() {
    let without = claim_requests(false).await;
    let with = claim_requests(true).await;
    let count = |list: &[kube_sim::RequestRecord], verb: &str| {
        list.iter().filter(|r| r.verb == verb).count()
    };
    assert_eq!(count(&with, "get"), 0, "the cache answers: {with:?}");
    assert_eq!(
        count(&with, "patch"),
        count(&without, "patch") + 2,
        "add then remove: {with:?}"
    );
    assert!(
        with.iter().all(|r| r.status == 200),
        "no conflicts with the binder's writes: {with:?}"
    );
}
