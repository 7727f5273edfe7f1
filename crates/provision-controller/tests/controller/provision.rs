//! The claim flow.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
use kube_sim::{FaultRule, Verb};
use provision_controller::{
    annotations::{ANN_PROVISIONED_BY, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER},
    testing::{FakeProvisioner, ProvisionStep, class, pv, pvc},
};

use crate::{Env, ME, claim, eventually, fast_class, quick, quiet, settle};

/// The event reason operators see (Go's string).
const PROVISIONING: &str = "Provisioning";
/// The event reason operators see (Go's string).
const PROVISIONING_FAILED: &str = "ProvisioningFailed";
/// The event reason operators see (Go's string).
const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";

#[tokio::test]
async fn a_claim_gets_a_bound_volume_with_claim_ref_annotations_and_events() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    let uid = env
        .create_claim(pvc("data").storage_class("fast").request("3Gi").build())
        .await;

    let volume = env.bound_volume("data").await;
    let name = format!("pvc-{uid}");
    assert_eq!(volume.metadata.name.as_deref(), Some(name.as_str()));
    let annotations = volume.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations.get(ANN_PROVISIONED_BY).map(String::as_str),
        Some(ME)
    );
    let spec = volume.spec.unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(
        (claim_ref.name.as_deref(), claim_ref.uid.as_deref()),
        (Some("data"), Some(uid.as_str()))
    );
    assert_eq!(spec.capacity.unwrap()["storage"].0, "3Gi");
    assert_eq!(
        volume.metadata.finalizers.as_deref(),
        Some(&["kubernetes.io/pv-protection".to_owned()][..]),
        "no finalizer of ours unless configured; the cluster's protection only"
    );

    let calls = env.fake.provision_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].pv_name, name);
    assert_eq!(calls[0].selected_node_name, None);
    assert_eq!(
        calls[0].storage_class.metadata.name.as_deref(),
        Some("fast")
    );
    env.wait_event("data", PROVISIONING).await;
    env.wait_event("data", PROVISIONING_SUCCEEDED).await;
    env.stop().await;
}

#[tokio::test]
async fn a_bound_claim_and_a_claim_for_another_provisioner_are_left_alone() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    env.create_class(class("other").provisioner("example.com/other").build())
        .await;
    env.create_claim(pvc("theirs").storage_class("other").build())
        .await;
    env.create_claim(claim("mine")).await;
    env.bound_volume("mine").await;
    settle().await;
    let calls = env.fake.provision_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].claim.metadata.name.as_deref(), Some("mine"));
    env.stop().await;
}

#[tokio::test]
async fn wait_for_first_consumer_waits_for_the_selected_node() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    env.create_class(
        class("late")
            .provisioner(ME)
            .wait_for_first_consumer()
            .build(),
    )
    .await;
    env.create_node("node-1").await;
    env.create_claim(pvc("data").storage_class("late").build())
        .await;
    settle().await;
    assert!(
        env.fake.provision_calls().is_empty(),
        "no node selected yet"
    );

    env.annotate_claim("data", ANN_SELECTED_NODE, "node-1")
        .await;
    env.bound_volume("data").await;
    let calls = env.fake.provision_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].selected_node_name.as_deref(), Some("node-1"));
    env.stop().await;
}

async fn wait_for_reschedule(env: &Env, name: &str) -> PersistentVolumeClaim {
    let claims = env.claims();
    eventually("selected node removed", || {
        let claims = claims.clone();
        async move {
            let c = claims.get(name).await.ok()?;
            let annotations = c.metadata.annotations.clone().unwrap_or_default();
            (!annotations.contains_key(ANN_SELECTED_NODE)).then_some(c)
        }
    })
    .await
}

#[tokio::test]
async fn a_reschedule_answer_removes_the_selected_node() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Reschedule]);
    let env = Env::start(quick(), fake).await;
    env.create_scheduled_claim().await;

    wait_for_reschedule(&env, "data").await;
    env.wait_event("data", PROVISIONING_FAILED).await;
    settle().await;
    assert_eq!(
        env.fake.provision_calls().len(),
        1,
        "no retry until the scheduler picks again"
    );
    assert!(
        env.volumes()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // The scheduler picks again: now it works.
    env.annotate_claim("data", ANN_SELECTED_NODE, "node-1")
        .await;
    env.bound_volume("data").await;
    env.stop().await;
}

// Go v13 passes the selected node by name: no node read, no reschedule when the node is
// missing (the driver judges the name, and may answer Reschedule).
#[tokio::test]
async fn a_selected_node_is_passed_to_the_driver_by_name_without_reading_the_node() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    env.create_class(
        class("late")
            .provisioner(ME)
            .wait_for_first_consumer()
            .build(),
    )
    .await;
    // No Node object by that name.
    env.create_claim(
        pvc("data")
            .storage_class("late")
            .selected_node("gone")
            .build(),
    )
    .await;
    env.bound_volume("data").await;
    let calls = env.fake.provision_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].selected_node_name.as_deref(), Some("gone"));
    let claim = env.claims().get("data").await.unwrap();
    let annotations = claim.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(ANN_SELECTED_NODE).map(String::as_str),
        Some("gone"),
        "not rescheduled"
    );
    let node_reads: Vec<_> = env
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes")
        .collect();
    assert_eq!(node_reads, []);
    env.stop().await;
}

// Go v13: an infeasible answer gets its own event and a slow retry, which a re-created
// class ends.
#[tokio::test]
async fn an_infeasible_claim_gets_the_go_event_and_waits_until_its_class_is_re_created() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Infeasible]);
    let env = Env::start(quick(), fake).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let event = env.wait_event("data", PROVISIONING_FAILED).await;
    assert_eq!(
        event.note.as_deref(),
        Some(
            "Volume provisioning failed with infeasible error. Retries will be delayed. \
             fake: the request cannot be served"
        )
    );
    // Several resyncs and normal retries would have come and gone.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(env.fake.provision_calls().len(), 1, "the claim waits");
    assert_eq!(env.events("data", PROVISIONING_FAILED).await.len(), 1);

    let classes: kube_client::Api<StorageClass> = kube_client::Api::all(env.client.clone());
    classes.delete("fast", &Default::default()).await.unwrap();
    env.create_class(fast_class()).await;
    env.bound_volume("data").await;
    assert_eq!(env.fake.provision_calls().len(), 2);
    env.stop().await;
}

#[tokio::test]
async fn a_conflicting_claim_update_during_reschedule_is_retried() {
    let fake = FakeProvisioner::new()
        .script_provision([ProvisionStep::Reschedule, ProvisionStep::Reschedule]);
    let env = Env::start(quick(), fake).await;
    env.sim.add_fault(
        FaultRule::new(Verb::Update, "persistentvolumeclaims")
            .times(1)
            .status(409, "Conflict"),
    );
    env.create_scheduled_claim().await;
    wait_for_reschedule(&env, "data").await;
    assert_eq!(
        env.fake.provision_calls().len(),
        2,
        "the first reschedule hit a conflict"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_block_claim_is_refused_with_an_event_and_not_retried() {
    let env = Env::start(quiet(), FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    env.create_claim(pvc("raw").storage_class("fast").block().build())
        .await;
    let event = env.wait_event("raw", PROVISIONING_FAILED).await;
    assert!(
        event
            .note
            .unwrap()
            .contains("does not support block volume provisioning")
    );
    settle().await;
    assert!(env.fake.provision_calls().is_empty());
    let events = env.events("raw", PROVISIONING_FAILED).await;
    assert_eq!(events.len(), 1, "refused once, not retried with backoff");
    assert!(events[0].series.is_none());
    env.stop().await;
}

#[tokio::test]
async fn a_block_claim_is_provisioned_by_a_driver_that_supports_block() {
    let env = Env::start(quick(), FakeProvisioner::new().with_block_support()).await;
    env.create_class(fast_class()).await;
    env.create_claim(pvc("raw").storage_class("fast").block().build())
        .await;
    let volume = env.bound_volume("raw").await;
    assert_eq!(volume.spec.unwrap().volume_mode.as_deref(), Some("Block"));
    env.stop().await;
}

#[tokio::test]
async fn a_missing_class_is_retried_until_it_appears() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    // What the PV controller would have set before the class was deleted.
    env.create_claim(claim("data")).await;
    env.annotate_claim("data", ANN_STORAGE_PROVISIONER, ME)
        .await;
    settle().await;
    assert!(env.fake.provision_calls().is_empty());
    env.create_class(fast_class()).await;
    env.bound_volume("data").await;
    env.stop().await;
}

// Go has no class handler: the claim waits for its backoff (or a resync). Here retries
// wait a minute and nothing resyncs, so only the class's own event can bring the claim
// back in time.
#[tokio::test]
async fn a_claim_created_before_its_class_is_provisioned_when_the_class_appears() {
    let config = quiet().failure_backoff(provision_controller::FailureBackoff::Custom(Arc::new(
        kube_controller_kit::backoff::ItemExponentialLimiter::new(
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(60),
        ),
    )));
    let env = Env::start(config, FakeProvisioner::new()).await;
    env.create_claim(claim("data")).await;
    // Both annotations the PV controller sets, so that the class's arrival changes nothing
    // on the claim (no claim event).
    env.annotate_claim("data", ANN_STORAGE_PROVISIONER, ME)
        .await;
    env.annotate_claim("data", "volume.beta.kubernetes.io/storage-provisioner", ME)
        .await;
    settle().await;
    assert!(env.fake.provision_calls().is_empty());
    env.create_class(fast_class()).await;
    let start = tokio::time::Instant::now();
    env.bound_volume("data").await;
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    env.stop().await;
}

#[tokio::test]
async fn additional_provisioner_names_are_served() {
    let config = quick().additional_provisioner_names(vec!["example.com/legacy".into()]);
    let env = Env::start(config, FakeProvisioner::new()).await;
    env.create_class(class("old").provisioner("example.com/legacy").build())
        .await;
    env.create_claim(pvc("data").storage_class("old").build())
        .await;
    let volume = env.bound_volume("data").await;
    let annotations = volume.metadata.annotations.unwrap();
    assert_eq!(annotations[ANN_PROVISIONED_BY], "example.com/legacy");
    env.stop().await;
}

#[tokio::test]
async fn an_ignored_claim_gets_no_volume_no_event_and_no_failure_count() {
    let registry = std::sync::Arc::new(std::sync::Mutex::new(
        prometheus_client::registry::Registry::default(),
    ));
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Ignored]);
    let env = Env::start_with(quiet(), fake, |c| c.metrics_registry(registry.clone())).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("first")).await;
    eventually("provision called", || async {
        (!env.fake.provision_calls().is_empty()).then_some(())
    })
    .await;
    settle().await;
    assert_eq!(
        env.fake.provision_calls().len(),
        1,
        "an ignored claim is not retried"
    );
    assert!(env.events("first", PROVISIONING_FAILED).await.is_empty());
    env.create_claim(claim("second")).await;
    env.bound_volume("second").await;

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry.lock().unwrap()).unwrap();
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .map(str::to_owned)
    };
    assert!(
        line("controller_persistentvolumeclaim_provision_failed_total").is_none(),
        "{text}"
    );
    assert!(
        line("controller_persistentvolumeclaim_provision_stopped_total")
            .unwrap()
            .ends_with(" 1")
    );
    assert!(
        line("controller_persistentvolumeclaim_provision_total")
            .unwrap()
            .ends_with(" 1")
    );
    env.stop().await;
}

#[tokio::test]
async fn a_failing_driver_gets_an_event_and_a_retry() {
    let fake =
        FakeProvisioner::new().script_provision([ProvisionStep::Failed, ProvisionStep::NoChange]);
    let env = Env::start(quick(), fake).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    env.bound_volume("data").await;
    assert_eq!(env.fake.provision_calls().len(), 3);
    let failed = env.wait_event("data", PROVISIONING_FAILED).await;
    assert!(
        failed
            .note
            .unwrap()
            .contains("failed to provision volume with StorageClass \"fast\"")
    );
    env.stop().await;
}

#[tokio::test]
async fn a_panicking_driver_fails_the_attempt_and_the_controller_keeps_running() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Panic]);
    let env = Env::start(quick(), fake).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    env.bound_volume("data").await;
    let failed = env.wait_event("data", PROVISIONING_FAILED).await;
    assert!(failed.note.unwrap().contains("panicked"));
    env.stop().await;
}

#[tokio::test]
async fn an_existing_volume_with_the_claims_name_stops_provisioning() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    // The class comes later, so the claim is not provisioned before its PV exists.
    let uid = env.create_claim(claim("data")).await;
    env.volumes()
        .create(&Default::default(), &pv(&format!("pvc-{uid}")).build())
        .await
        .unwrap();
    env.create_class(fast_class()).await;
    let claims = env.claims();
    eventually("claim annotated by the binder", || {
        let claims = claims.clone();
        async move {
            let c = claims.get("data").await.ok()?;
            c.metadata
                .annotations?
                .contains_key(ANN_STORAGE_PROVISIONER)
                .then_some(())
        }
    })
    .await;
    settle().await;
    assert!(env.fake.provision_calls().is_empty());
    env.stop().await;
}

#[tokio::test]
async fn a_qualifier_can_refuse_a_claim() {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let env = Env::start_with(quick(), FakeProvisioner::new(), move |c| {
        c.qualifier(move |claim: &PersistentVolumeClaim| {
            counter.fetch_add(1, Ordering::SeqCst);
            claim.metadata.name.as_deref() != Some("vetoed")
        })
    })
    .await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("vetoed")).await;
    env.create_claim(claim("fine")).await;
    env.bound_volume("fine").await;
    settle().await;
    assert_eq!(env.fake.provision_calls().len(), 1);
    assert!(asked.load(Ordering::SeqCst) >= 2);
    env.stop().await;
}

// Go: a panic in the driver's code kills the process. Here a qualifier that panics
// answers no for that claim; the others are provisioned.
#[tokio::test]
async fn a_panicking_qualifier_counts_as_a_no_and_the_other_claims_are_provisioned() {
    let env = Env::start_with(quick(), FakeProvisioner::new(), |c| {
        c.qualifier(|claim: &PersistentVolumeClaim| {
            assert_ne!(
                claim.metadata.name.as_deref(),
                Some("buggy"),
                "qualifier bug"
            );
            true
        })
    })
    .await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("buggy")).await;
    env.create_claim(claim("fine")).await;
    env.bound_volume("fine").await;
    settle().await;
    assert_eq!(env.fake.provision_calls().len(), 1);
    env.stop().await;
}

#[tokio::test]
async fn final_and_background_errors_keep_the_selected_node() {
    let fake = FakeProvisioner::new()
        .script_provision([ProvisionStep::Failed, ProvisionStep::InBackground]);
    let env = Env::start(quick(), fake).await;
    env.create_scheduled_claim().await;
    env.bound_volume("data").await;
    assert_eq!(env.fake.provision_calls().len(), 3);
    let claim = env.claims().get("data").await.unwrap();
    let annotations = claim.metadata.annotations.unwrap();
    assert_eq!(
        annotations.get(ANN_SELECTED_NODE).map(String::as_str),
        Some("node-1")
    );
    env.stop().await;
}

/// Go labels the provisioning metrics by `spec.storageClassName` (`updateProvisionStats`),
/// not by the beta annotation the provisioning reads first: a claim that names its class
/// only in `volume.beta.kubernetes.io/storage-class` counts under `class=""`.
#[tokio::test]
async fn the_metrics_class_label_is_the_spec_class_as_in_go() {
    let registry = std::sync::Arc::new(std::sync::Mutex::new(
        prometheus_client::registry::Registry::default(),
    ));
    let env = Env::start_with(quick(), FakeProvisioner::new(), |c| {
        c.metrics_registry(registry.clone())
    })
    .await;
    env.create_class(fast_class()).await;
    let legacy = pvc("legacy")
        .annotation("volume.beta.kubernetes.io/storage-class", "fast")
        .annotation(ANN_STORAGE_PROVISIONER, ME)
        .build();
    env.create_claim(legacy).await;
    env.create_claim(claim("spec")).await;
    env.bound_volume("legacy").await;
    env.bound_volume("spec").await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry.lock().unwrap()).unwrap();
    for class in ["", "fast"] {
        let line = format!(
            "controller_persistentvolumeclaim_provision_total{{class=\"{class}\",source=\"\"}} 1"
        );
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    env.stop().await;
}
