//! Claims in progress are never forgotten by anything but the driver's answer, and a
//! panic anywhere in a sync fails that key only.

use super::*;
use crate::{
    VolumeNamer,
    annotations::{ANN_PROVISIONED_BY, FINALIZER_PROVISIONING},
};

fn the_claim() -> PersistentVolumeClaim {
    pvc("c")
        .uid("u1")
        .storage_class("fast")
        .provisioner(ME)
        .build()
}

fn in_progress(h: &mut Harness) {
    h.put_claim(the_claim());
    h.ctx.set_in_progress(
        "u1",
        Some(crate::controller::InProgress::new(
            Arc::new(the_claim()),
            None,
        )),
    );
}

fn background(h: &Harness) -> &crate::controller::save::Background {
    let Saver::Background(bg) = &h.ctx.saver else {
        unreachable!("the harness saves in the background")
    };
    bg
}

#[tokio::test(start_paused = true)]
async fn a_claim_in_progress_is_driven_even_when_the_qualifier_now_refuses_it() {
    let fake = FakeProvisioner::new();
    let mut h = harness(Config::default(), fake.clone(), true);
    in_progress(&mut h);
    h.qualify.store(false, std::sync::atomic::Ordering::SeqCst);

    let result = claim::sync_claim(&h.ctx, "u1").await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        fake.provision_calls().len(),
        1,
        "the driver is asked again, so the asset it creates gets a PV"
    );
    assert!(
        !h.ctx.is_in_progress("u1"),
        "the driver returned the volume"
    );
    assert_eq!(background(&h).unsaved(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_is_not_in_progress_is_skipped_when_the_qualifier_refuses_it() {
    let fake = FakeProvisioner::new();
    let mut h = harness(Config::default(), fake.clone(), true);
    h.put_claim(the_claim());
    h.qualify.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(claim::sync_claim(&h.ctx, "u1").await.is_ok());
    assert!(fake.provision_calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_claim_in_progress_keeps_its_mark_while_its_class_is_missing() {
    let fake = FakeProvisioner::new();
    let mut h = harness(Config::default(), fake.clone(), false);
    in_progress(&mut h);
    let result = claim::sync_claim(&h.ctx, "u1").await;
    assert!(result.is_err(), "retried until the class is back");
    assert!(h.ctx.is_in_progress("u1"));
    assert!(fake.provision_calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_claim_in_progress_is_driven_when_its_class_now_names_another_provisioner() {
    let fake = FakeProvisioner::new();
    let mut h = harness(Config::default(), fake.clone(), true);
    h.classes.apply_watcher_event(&watcher::Event::Apply(
        class("fast").provisioner("example.com/other").build(),
    ));
    in_progress(&mut h);

    let result = claim::sync_claim(&h.ctx, "u1").await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(fake.provision_calls().len(), 1);
    assert!(!h.ctx.is_in_progress("u1"));
    let volume = background(&h)
        .pending_volume("pvc-u1")
        .expect("the PV waits for the background saver");
    let annotations = volume.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(ANN_PROVISIONED_BY).map(String::as_str),
        Some(ME),
        "this controller holds the asset, so the PV names it for deletion"
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_not_in_progress_stops_when_its_class_names_another_provisioner() {
    let fake = FakeProvisioner::new();
    let mut h = harness(Config::default(), fake.clone(), true);
    h.classes.apply_watcher_event(&watcher::Event::Apply(
        class("fast").provisioner("example.com/other").build(),
    ));
    h.put_claim(the_claim());
    assert!(claim::sync_claim(&h.ctx, "u1").await.is_ok());
    assert!(fake.provision_calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_panic_outside_the_driver_fails_the_claim_and_the_worker_lives_on() {
    let config = Config::default()
        .failed_provision_threshold(2)
        .volume_namer(VolumeNamer::new(|_| panic!("volume namer bug")));
    let fake = FakeProvisioner::new();
    let mut h = harness(config, fake.clone(), true);
    let start = Instant::now();
    h.add_claim();
    h.run_for(100).await; // the worker task must end normally
    assert_eq!(
        h.ctx.claim_queue.num_requeues("u1"),
        2,
        "each panic counted as one failure, retried up to the threshold"
    );
    assert_eq!(
        h.attempts(start).len(),
        3,
        "each attempt failed after the qualifier, at the namer"
    );
    assert!(fake.provision_calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn bad_claims_never_panic_and_fail_with_an_error_naming_the_problem() {
    let ours = || pvc("c").uid("u1").provisioner(ME);
    let mut no_spec = ours().build();
    no_spec.spec = None;
    let mut no_request = ours().storage_class("fast").build();
    no_request.spec.as_mut().unwrap().resources = None;
    let odd_quantity = ours().storage_class("fast").request("lots").build();
    let no_class = ours().build();
    let empty_uid = pvc("c")
        .uid("")
        .storage_class("fast")
        .provisioner(ME)
        .build();
    // (case, claim, sync result, driver called)
    let cases: Vec<(&str, PersistentVolumeClaim, Result<(), &str>, bool)> = vec![
        (
            "a claim without spec has no class",
            no_spec,
            Err("storageclass \"\" not found"),
            false,
        ),
        (
            "a claim without class name has no class",
            no_class,
            Err("storageclass \"\" not found"),
            false,
        ),
        (
            "a claim without a storage request is the driver's to judge",
            no_request,
            Ok(()),
            true,
        ),
        (
            "an unparsable quantity is the driver's to judge",
            odd_quantity,
            Ok(()),
            true,
        ),
        (
            // The feeder never indexes nor queues it (the index is keyed by uid).
            "a claim with an empty uid is not found by uid and gets no PV",
            empty_uid,
            Ok(()),
            false,
        ),
    ];
    for (name, claim, want, called) in cases {
        let fake = FakeProvisioner::new();
        let mut h = harness(Config::default(), fake.clone(), true);
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        h.put_claim(claim);
        let got = claim::sync_claim(&h.ctx, &uid)
            .await
            .map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(str::to_owned), "case: {name}");
        assert_eq!(!fake.provision_calls().is_empty(), called, "case: {name}");
    }
}

/// Chaos seed 1031: a claim whose driver answers `Final` is written twice per sync (our
/// finalizer added before the call, removed after it). Only the last write was
/// remembered, so the watch event of the first queued the claim again, whose sync wrote
/// twice again: a claim given up on was synced over and over, and the system never
/// stayed unchanged.
#[tokio::test]
async fn every_own_write_not_yet_seen_is_skipped_by_the_watch_and_a_foreign_one_is_not() {
    let h = harness(Config::default(), FakeProvisioner::new(), true);
    let version = |rv: &str, intent: bool| {
        let mut claim = the_claim();
        claim.metadata.resource_version = Some(rv.to_owned());
        if intent {
            claim.metadata.finalizers = Some(vec![FINALIZER_PROVISIONING.to_owned()]);
        }
        claim
    };
    // One sync: the finalizer added (rv 11), then removed after a final answer (rv 12).
    h.ctx.note_own_write(&version("11", true));
    h.ctx.note_own_write(&version("12", false));
    assert!(h.ctx.wrote_intent_removed("u1"));
    assert!(h.ctx.is_own_write("u1", &version("11", true)), "the add");
    assert!(
        h.ctx.wrote_intent_removed("u1"),
        "the cache shows the add, not our removal yet"
    );
    assert!(
        h.ctx.is_own_write("u1", &version("12", false)),
        "the removal"
    );
    assert!(!h.ctx.wrote_intent_removed("u1"), "the cache caught up");
    assert!(
        !h.ctx.is_own_write("u1", &version("12", false)),
        "consumed: a repeated event is not ours any more"
    );

    // A change by someone else between our writes is queued; our writes are not.
    h.ctx.note_own_write(&version("21", true));
    h.ctx.note_own_write(&version("23", false));
    assert!(h.ctx.is_own_write("u1", &version("21", true)));
    assert!(!h.ctx.is_own_write("u1", &version("22", true)), "not ours");
    assert!(h.ctx.is_own_write("u1", &version("23", false)));

    // An event that skips our first write (a relist) consumes it with the later one.
    h.ctx.note_own_write(&version("31", true));
    h.ctx.note_own_write(&version("32", false));
    assert!(h.ctx.is_own_write("u1", &version("32", false)));
    assert!(
        !h.ctx.is_own_write("u1", &version("31", true)),
        "older: gone"
    );
    assert!(!h.ctx.wrote_intent_removed("u1"));
}

/// The watch event of a write may come before its answer (kube-sim sends it first more
/// often than not): it is held until the answer tells whether it was ours.
#[tokio::test]
async fn an_event_that_comes_before_the_answer_to_our_write_is_ours_only_if_the_answer_says_so() {
    let h = harness(Config::default(), FakeProvisioner::new(), true);
    let version = |rv: &str| {
        let mut claim = the_claim();
        claim.metadata.resource_version = Some(rv.to_owned());
        claim
    };
    // Our write's event, then its answer: not queued.
    let write = h.ctx.begin_own_write("u1");
    assert!(h.ctx.is_own_write("u1", &version("11")), "held");
    write.done(&version("11"));
    assert_eq!(h.ctx.claim_queue.len(), 0, "it was ours");
    assert!(
        !h.ctx.is_own_write("u1", &version("11")),
        "nothing left to match"
    );

    // Someone else's change while our write is in flight: queued once it is answered.
    let write = h.ctx.begin_own_write("u1");
    assert!(h.ctx.is_own_write("u1", &version("21")), "held");
    assert_eq!(h.ctx.claim_queue.len(), 0);
    write.done(&version("22"));
    assert_eq!(h.ctx.claim_queue.len(), 1, "not ours: queued");
    assert!(
        h.ctx.is_own_write("u1", &version("22")),
        "our write's own event"
    );

    // A write that fails (or panics) releases what it held.
    let write = h.ctx.begin_own_write("u2");
    assert!(h.ctx.is_own_write("u2", &version("31")));
    drop(write);
    assert_eq!(h.ctx.claim_queue.len(), 2, "queued when the write failed");
    assert!(
        !h.ctx.is_own_write("u2", &version("32")),
        "nothing in flight"
    );
}
