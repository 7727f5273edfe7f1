//! The cost of crash-safe provisioning (the claim finalizer around `provision`).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::api::ListParams;
use provision_controller::{
    FailureBackoff, ProvisionController,
    annotations::FINALIZER_PROVISIONING,
    ratelimit::ItemExponentialLimiter,
    testing::{FakeProvisioner, ProvisionStep},
};
use tokio::sync::oneshot;

use crate::{Env, ME, claim, eventually, fast_class, quiet};

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
        bound.metadata.finalizers,
        Some(vec![KEEP.to_owned()]),
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

/// Two replicas without leader election (or a cut-off one still working) on a claim the
/// driver keeps refusing (chaos seeds 40499, 50295): every attempt adds and removes the
/// crash-safety finalizer, and those writes must not queue the claim at once on the other
/// replica, which would retry it in a loop past its backoff.
#[tokio::test]
async fn two_replicas_retry_a_refused_claim_at_its_backoff_not_at_each_others_writes() {
    // A retry every second on one replica, every 0.7 s on the other (so that their
    // writes do not coincide): in 3 s they try at most 9 times, 2 patches a try (14
    // times, 23 patches, when each write queued the claim on the other).
    let config = |every: Duration| {
        quiet().failure_backoff(FailureBackoff::Custom(Arc::new(
            ItemExponentialLimiter::new(every, every),
        )))
    };
    let refusing = || {
        FakeProvisioner::new().script_provision(std::iter::repeat_n(ProvisionStep::Failed, 10_000))
    };
    let env = Env::start(config(Duration::from_secs(1)), refusing()).await;
    let other_fake = refusing();
    let (stop, stopped) = oneshot::channel::<()>();
    let other = tokio::spawn(
        ProvisionController::new(env.client.clone(), ME, other_fake.clone())
            .config(config(Duration::from_millis(700)))
            .run(async {
                let _ = stopped.await;
            }),
    );
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let patches = env
        .sim
        .requests()
        .iter()
        .filter(|r| {
            r.verb == "patch" && r.path == "/api/v1/namespaces/default/persistentvolumeclaims/data"
        })
        .count();
    let attempts = env.fake.provision_calls().len() + other_fake.provision_calls().len();
    assert!(attempts >= 2, "both replicas tried: {attempts}");
    assert!(
        patches <= 22 && attempts <= 10,
        "{patches} claim patches and {attempts} driver calls in 3 s: the replicas queue the \
         claim at each other's finalizer writes"
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), other)
        .await
        .expect("the other replica stops")
        .unwrap()
        .unwrap();
    env.stop().await;
}
