//! Crash-safe provisioning and the slow retry of infeasible claims, one claim at a time:
//! a claim that vanished mid-provisioning, the qualifier before a cleanup, the class a
//! provisioning started with, and the wait after an infeasible answer.

use k8s_openapi::api::core::v1::PersistentVolume;

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

/// The PV `name` in the sim, if any.
async fn sim_volume(sim: &kube_sim::KubeSim, name: &str) -> Option<PersistentVolume> {
    let volumes: kube_client::Api<PersistentVolume> = kube_client::Api::all(sim.client());
    volumes.get_opt(name).await.unwrap()
}

fn claim_ref_uid(volume: &PersistentVolume) -> Option<&str> {
    volume.spec.as_ref()?.claim_ref.as_ref()?.uid.as_deref()
}

#[tokio::test]
async fn a_claim_that_vanished_while_provisioning_in_the_background_gets_a_pv_for_its_asset_and_is_forgotten()
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

    // The backend finishes the asset.
    fake.add_asset("pvc-u1");
    let second = claim::sync_claim(&h.ctx, "u1").await;
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(fake.provision_calls().len(), 2, "found by name");
    // Saved, not deleted: the PV controller releases a PV whose claim is gone, and the
    // volume flow reclaims it.
    assert!(fake.delete_calls().is_empty(), "{:?}", fake.delete_calls());
    let saved = sim_volume(&sim, "pvc-u1")
        .await
        .expect("a PV records the asset");
    assert_eq!(claim_ref_uid(&saved), Some("u1"));
    assert_eq!(fake.assets().into_iter().collect::<Vec<_>>(), ["pvc-u1"]);
    assert_eq!(fake.volume_saved_calls().len(), 1);
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

// Chaos seeds 10132 and 10230: the cleanup of a vanished claim whose create never
// landed created a volume only to record it, and the replica stopped before its PV was
// saved: a volume nothing recorded. A cleanup now creates nothing.
#[tokio::test]
async fn the_cleanup_of_a_vanished_claim_whose_asset_never_appeared_creates_none_and_saves_no_pv() {
    let fake = FakeProvisioner::new();
    let (sim, h) = sim_harness(Config::default(), fake.clone(), true).await;
    // A claim whose provisioning was left in progress (a timed-out call, say), then
    // stripped and deleted; the backend's create never made the asset.
    let class = h.ctx.caches.class("fast");
    h.ctx
        .set_in_progress("u1", Some(InProgress::new(Arc::new(the_claim()), class)));

    let cleaned = claim::sync_claim(&h.ctx, "u1").await;
    assert!(cleaned.is_ok(), "{cleaned:?}");
    let calls = fake.provision_calls();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].cleanup, "the cleanup's lookup, not a provisioning");
    assert!(
        fake.assets().is_empty(),
        "the cleanup created an asset: {:?}",
        fake.assets()
    );
    assert!(
        sim_volume(&sim, "pvc-u1").await.is_none(),
        "no PV for no asset"
    );
    assert!(!h.ctx.is_in_progress("u1"), "the entry ends");
    assert_eq!(
        claim_requests(&sim),
        [],
        "the vanished claim is never written"
    );
}

// Chaos seed 20163: a replica's create timed out (it may still land), the claim was
// deleted, the replica stopped; the next one looked for the asset, found none yet, let the
// claim go, and the create landed: a volume nothing records. "None" is believed only once
// the driver's late-asset window has passed since the first look.
#[tokio::test]
async fn a_cleanup_that_finds_no_asset_waits_the_late_asset_window_before_it_lets_the_claim_go() {
    let window = Duration::from_millis(400);
    let fake = FakeProvisioner::new().with_late_asset_window(window);
    let (sim, mut h) = sim_harness(Config::default(), fake.clone(), true).await;
    let deleting = || {
        pvc("c")
            .uid("u1")
            .storage_class("fast")
            .provisioner(ME)
            .finalizer(FINALIZER_PROVISIONING)
            .annotation(ANN_PROVISIONING_OWNER, ME)
            .deleting()
            .build()
    };
    h.put_claim(deleting());
    let first = claim::sync_claim(&h.ctx, "u1").await;
    match first {
        Err(crate::controller::calls::OpError::Settling { wait, .. }) => {
            assert!(wait <= window, "{wait:?}");
        }
        other => panic!("no asset yet must not end the cleanup: {other:?}"),
    }
    assert_eq!(claim_requests(&sim), [], "the finalizer stays meanwhile");
    assert!(sim_volume(&sim, "pvc-u1").await.is_none());

    // The other replica's create lands within the window: the next look records it.
    fake.add_asset("pvc-u1");
    tokio::time::sleep(window).await;
    let second = claim::sync_claim(&h.ctx, "u1").await;
    assert!(second.is_ok(), "{second:?}");
    assert!(
        sim_volume(&sim, "pvc-u1").await.is_some(),
        "the late asset gets a PV"
    );
    assert!(fake.provision_calls().iter().all(|c| c.cleanup));

    // Another claim whose create never lands: let go once the window has passed.
    let fake = FakeProvisioner::new().with_late_asset_window(window);
    let (sim, mut h) = sim_harness(Config::default(), fake.clone(), true).await;
    h.put_claim(deleting());
    let first = claim::sync_claim(&h.ctx, "u1").await;
    assert!(
        matches!(
            first,
            Err(crate::controller::calls::OpError::Settling { .. })
        ),
        "{first:?}"
    );
    tokio::time::sleep(window).await;
    let second = claim::sync_claim(&h.ctx, "u1").await;
    assert!(second.is_ok(), "{second:?}");
    assert!(
        sim_volume(&sim, "pvc-u1").await.is_none(),
        "no asset, no PV"
    );
    assert!(fake.assets().is_empty());
    assert_eq!(claim_requests(&sim).len(), 1, "the finalizer removal");
}

#[tokio::test]
async fn a_deleted_claim_the_qualifier_refuses_is_not_cleaned_up_by_this_controller() {
    let fake = FakeProvisioner::new();
    // The provisioning that put the finalizer there created the asset.
    fake.add_asset("pvc-u1");
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
    assert!(
        matches!(
            refused,
            Err(crate::controller::calls::OpError::Refused { .. })
        ),
        "{refused:?}"
    );
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
    assert!(fake.delete_calls().is_empty());
    assert!(sim_volume(&sim, "pvc-u1").await.is_some(), "saved");
    assert_eq!(claim_requests(&sim).len(), 1, "the finalizer removal");
}

// The qualifier may accept the claim later (or another controller that owns it may be
// gone): a refusal is asked again slowly, not never.
#[tokio::test(start_paused = true)]
async fn a_cleanup_the_qualifier_refuses_is_asked_again_after_the_resync_period() {
    let config = Config::default().resync_period(Duration::from_secs(600));
    let mut h = harness(config, FakeProvisioner::new(), true);
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
    let start = Instant::now();
    h.ctx.claim_queue.add("u1".into());
    h.run_for(1900).await;
    assert_eq!(h.attempts(start), [0, 600, 1200, 1800]);
    assert_eq!(h.ctx.claim_queue.num_requeues("u1"), 0, "not a failure");
}

// Claims in progress and their cleanups are driven with the class their provisioning
// started with, recorded on the claim with the finalizer: a restarted controller has no
// memory of it, and the class may be gone or changed.
#[tokio::test]
async fn a_cleanup_after_a_restart_uses_the_class_recorded_on_the_claim() {
    let fake = FakeProvisioner::new();
    fake.add_asset("pvc-u1");
    // No class in the cache: it was deleted.
    let (sim, mut h) = sim_harness(Config::default(), fake.clone(), false).await;
    let mut started = class("fast")
        .provisioner(ME)
        .reclaim_policy("Retain")
        .build();
    started.parameters = Some([("pool".to_owned(), "gold".to_owned())].into());
    let snapshot = crate::controller::crash_safety::class_snapshot(&started).unwrap();
    h.put_claim(
        pvc("c")
            .uid("u1")
            .storage_class("fast")
            .provisioner(ME)
            .finalizer(FINALIZER_PROVISIONING)
            .annotation(ANN_PROVISIONING_OWNER, ME)
            .annotation(crate::annotations::ANN_PROVISIONING_CLASS, &snapshot)
            .deleting()
            .build(),
    );
    let result = claim::sync_claim(&h.ctx, "u1").await;
    assert!(result.is_ok(), "{result:?}");
    let calls = fake.provision_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].storage_class.parameters, started.parameters);
    let saved = sim_volume(&sim, "pvc-u1").await.expect("saved");
    assert_eq!(
        saved
            .spec
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain"),
        "the recorded class's reclaim policy"
    );
}

// A claim written by an older version records no class: without its class it waits.
#[tokio::test(start_paused = true)]
async fn a_cleanup_without_class_or_recorded_class_waits_for_the_class() {
    let fake = FakeProvisioner::new();
    let mut h = harness(Config::default(), fake.clone(), false);
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
    let result = claim::sync_claim(&h.ctx, "u1").await;
    assert!(
        matches!(
            result,
            Err(crate::controller::calls::OpError::ClassNotFound { .. })
        ),
        "{result:?}"
    );
    assert!(fake.provision_calls().is_empty());
}

// Our own removal of the finalizer may not be in the cache yet: a claim that shows it
// is provisioned again only after the finalizer is written again.
#[tokio::test]
async fn the_finalizer_is_written_again_before_the_driver_when_the_cache_predates_our_removal() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Block]);
    let (sim, mut h) = sim_harness(Config::default(), fake.clone(), true).await;
    let claims: kube_client::Api<PersistentVolumeClaim> =
        kube_client::Api::namespaced(sim.client(), "default");
    let created = claims
        .create(
            &Default::default(),
            &pvc("c").storage_class("fast").provisioner(ME).build(),
        )
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let with_intent = |mut c: PersistentVolumeClaim| {
        c.metadata.finalizers = Some(vec![FINALIZER_PROVISIONING.to_owned()]);
        c.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANN_PROVISIONING_OWNER.to_owned(), ME.to_owned());
        c
    };
    // Our last write removed the finalizer (the server has it without); the cache still
    // shows the claim as it was before.
    h.ctx.note_own_write(&created);
    h.put_claim(with_intent(created));
    // A PV for the claim was deleted by hand meanwhile: the claim is provisioned again.
    let ctx = Arc::clone(&h.ctx);
    let sync = tokio::spawn(async move { claim::sync_claim(&ctx, &uid).await });
    tokio::time::timeout(Duration::from_secs(10), fake.wait_blocked(1))
        .await
        .expect("the driver is called");
    let during = claims.get("c").await.unwrap();
    assert_eq!(
        during.metadata.finalizers,
        Some(vec![FINALIZER_PROVISIONING.to_owned()]),
        "the finalizer is on the claim while the driver runs"
    );
    fake.unblock();
    let result = sync.await.unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(fake.provision_calls().len(), 1);
}

// A 409 on the removal of our finalizer is "gone" only when the claim under the name is
// another one (or none); any other conflict is retried, or the finalizer would stay.
#[tokio::test]
async fn a_conflict_removing_the_finalizer_counts_as_gone_only_for_another_claim() {
    let (sim, h) = sim_harness(Config::default(), FakeProvisioner::new(), true).await;
    let claims: kube_client::Api<PersistentVolumeClaim> =
        kube_client::Api::namespaced(sim.client(), "default");
    let mut claim = pvc("c").storage_class("fast").provisioner(ME).build();
    claim.metadata.finalizers = Some(vec![FINALIZER_PROVISIONING.to_owned()]);
    let created = claims.create(&Default::default(), &claim).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let remove = |uid: String| {
        let ctx = Arc::clone(&h.ctx);
        async move {
            crate::controller::crash_safety::set_intent(
                &ctx,
                "default",
                "c",
                Some(&uid),
                crate::controller::crash_safety::Intent::Remove,
            )
            .await
        }
    };
    let conflict = || {
        kube_sim::FaultRule::new(kube_sim::Verb::Patch, "persistentvolumeclaims")
            .times(1)
            .status(409, "Conflict")
    };

    sim.add_fault(conflict());
    let result = remove(uid.clone()).await;
    assert!(result.is_err(), "the same claim: retried ({result:?})");

    // The uid precondition fails for a claim re-created under the name.
    let result = remove("uid-of-an-older-claim".into()).await;
    assert!(result.is_ok(), "another claim: gone ({result:?})");
    assert_eq!(
        claims.get("c").await.unwrap().metadata.finalizers,
        Some(vec![FINALIZER_PROVISIONING.to_owned()]),
        "the other claim is untouched"
    );

    let result = remove(uid).await;
    assert!(result.is_ok(), "{result:?}");
    let finalizers = claims.get("c").await.unwrap().metadata.finalizers;
    assert!(finalizers.unwrap_or_default().is_empty());
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
