//! Claims in progress are never forgotten by anything but the driver's answer, and a
//! panic anywhere in a sync fails that key only.

use super::*;
use crate::{VolumeNamer, annotations::ANN_PROVISIONED_BY};

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
