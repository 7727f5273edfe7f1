//! Crash-safe provisioning and the slow retry of infeasible claims, one claim at a time:
//! a claim that vanished mid-provisioning, the qualifier before a cleanup, the class a
//! provisioning started with, and the wait after an infeasible answer.

use super::*;
use crate::{
    annotations::{ANN_PROVISIONING_OWNER, FINALIZER_PROVISIONING},
    controller::InProgress,
};

fn the_claim() -> PersistentVolumeClaim {
    pvc("c")
        .uid("u1")
        .storage_class("fast")
        .provisioner(ME)
        .build()
}

/// Requests the sim answered about claims.
fn claim_requests(sim: &kube_sim::KubeSim) -> Vec<kube_sim::RequestRecord> {
    sim.requests()
        .into_iter()
        .filter(|r| r.resource == "persistentvolumeclaims")
        .collect()
}

#[tokio::test]
async fn a_claim_that_vanished_while_provisioning_in_the_background_gets_its_asset_deleted_and_is_forgotten()
 {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::InBackground]);
    // Crash-safe provisioning is on (the default).
    let (sim, h) = sim_harness(Config::default(), fake.clone(), true).await;
    // What the controller kept of a claim whose provisioning runs in the background: the
    // claim as cached before our finalizer was written, and the class. Its finalizers
    // were then stripped by hand and it was deleted: it is in neither the cache nor the
    // API server.
    let class = h.ctx.caches.class("fast");
    h.ctx
        .set_in_progress("u1", Some(InProgress::new(Arc::new(the_claim()), class)));

    let first = claim::sync_claim(&h.ctx, "u1").await;
    assert!(first.is_err(), "the backend still works: {first:?}");
    assert!(h.ctx.is_in_progress("u1"));
    assert_eq!(fake.provision_calls().len(), 1);

    let second = claim::sync_claim(&h.ctx, "u1").await;
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(fake.provision_calls().len(), 2, "found by name");
    assert_eq!(fake.delete_calls(), ["pvc-u1"]);
    assert!(fake.assets().is_empty(), "{:?}", fake.assets());
    assert!(!h.ctx.is_in_progress("u1"), "the entry ends");

    let third = claim::sync_claim(&h.ctx, "u1").await;
    assert!(third.is_ok(), "{third:?}");
    assert_eq!(fake.provision_calls().len(), 2, "nothing is left to retry");
    assert_eq!(
        claim_requests(&sim),
        [],
        "the vanished claim is never written"
    );
}

#[tokio::test]
async fn a_deleted_claim_the_qualifier_refuses_is_not_cleaned_up_by_this_controller() {
    let fake = FakeProvisioner::new();
    let (sim, mut h) = sim_harness(Config::default(), fake.clone(), true).await;
    h.put_claim(
        pvc("c")
            .uid("u1")
            .storage_class("fast")
            .provisioner(ME)
            .finalizer(FINALIZER_PROVISIONING)
            .annotation(ANN_PROVISIONING_OWNER, ME)
            .deleting()
            .build(),
    );
    h.qualify.store(false, std::sync::atomic::Ordering::SeqCst);
    let refused = claim::sync_claim(&h.ctx, "u1").await;
    assert!(refused.is_ok(), "{refused:?}");
    assert!(fake.provision_calls().is_empty());
    assert!(fake.delete_calls().is_empty());
    assert_eq!(
        claim_requests(&sim),
        [],
        "the finalizer is left to its owner"
    );

    // Once the qualifier accepts it, this controller cleans it up.
    h.qualify.store(true, std::sync::atomic::Ordering::SeqCst);
    let accepted = claim::sync_claim(&h.ctx, "u1").await;
    assert!(accepted.is_ok(), "{accepted:?}");
    assert_eq!(fake.provision_calls().len(), 1);
    assert_eq!(fake.delete_calls(), ["pvc-u1"]);
    assert_eq!(claim_requests(&sim).len(), 1, "the finalizer removal");
}

#[tokio::test(start_paused = true)]
async fn a_claim_in_progress_whose_class_was_deleted_is_driven_with_the_class_it_started_with() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::InBackground]);
    let mut h = harness(Config::default(), fake.clone(), true);
    h.put_claim(the_claim());
    assert!(claim::sync_claim(&h.ctx, "u1").await.is_err());
    assert!(h.ctx.is_in_progress("u1"));

    h.classes.apply_watcher_event(&watcher::Event::Delete(
        class("fast").provisioner(ME).build(),
    ));
    assert!(h.ctx.caches.class("fast").is_none());
    let result = claim::sync_claim(&h.ctx, "u1").await;
    assert!(result.is_ok(), "{result:?}");
    let calls = fake.provision_calls();
    assert_eq!(calls.len(), 2, "the driver is polled on");
    assert_eq!(
        calls[1].storage_class.metadata.name.as_deref(),
        Some("fast")
    );
    assert_eq!(calls[1].storage_class.provisioner, ME);
    assert!(
        !h.ctx.is_in_progress("u1"),
        "the driver returned the volume"
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_the_driver_calls_infeasible_is_provisioned_again_only_after_five_minutes() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Infeasible]);
    // A low threshold: the wait must not count as failures.
    let config = Config::default().failed_provision_threshold(2);
    let mut h = harness(config, fake.clone(), true);
    let start = Instant::now();
    h.add_claim();
    h.run_for(400).await;
    assert_eq!(
        h.attempts(start),
        [0, 300],
        "the failure's retry after 15 s waits for the rest of the five minutes"
    );
    assert_eq!(fake.provision_calls().len(), 2);
    assert_eq!(fake.assets().len(), 1, "provisioned at last");
}

#[tokio::test(start_paused = true)]
async fn re_creating_the_class_ends_the_wait_of_an_infeasible_claim() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Infeasible]);
    let mut h = harness(Config::default(), fake.clone(), true);
    let start = Instant::now();
    h.add_claim();
    let worker = tokio::spawn(claim_worker(Arc::clone(&h.ctx)));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.attempts(start), [0], "waiting");

    let mut recreated = class("fast").provisioner(ME).build();
    recreated.metadata.uid = Some("class-uid-2".into());
    h.classes
        .apply_watcher_event(&watcher::Event::Apply(recreated));
    // What the class feeder does for the unbound claims of a class.
    h.ctx.claim_queue.add("u1".into());
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.ctx.claim_queue.shut_down();
    worker.await.unwrap();
    assert_eq!(h.attempts(start), [0, 30]);
    assert_eq!(fake.provision_calls().len(), 2);
}
