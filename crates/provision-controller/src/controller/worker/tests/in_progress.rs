//! Claims in progress (their provisioning may run in the background) are never
//! forgotten by anything but the driver's answer: not the qualifier, a missing class or a
//! class that names another provisioner now.

use super::*;
use crate::annotations::ANN_PROVISIONED_BY;

fn the_claim() -> PersistentVolumeClaim {
    pvc("c")
        .uid("u1")
        .storage_class("fast")
        .provisioner(ME)
        .build()
}

fn in_progress(h: &mut Harness) {
    h.put_claim(the_claim());
    h.ctx.records.set_in_progress(
        "u1",
        Some(crate::controller::records::InProgress::new(
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

    let result = sync_claim(&h.ctx, "u1").await;
    assert_eq!(result.ok(), Some(Outcome::Done));
    assert_eq!(
        fake.provision_calls().len(),
        1,
        "the driver is asked again, so the asset it creates gets a PV"
    );
    assert!(
        !h.ctx.records.is_in_progress("u1"),
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
    assert_eq!(sync_claim(&h.ctx, "u1").await.ok(), Some(Outcome::Done));
    assert!(fake.provision_calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_claim_in_progress_keeps_its_mark_while_its_class_is_missing() {
    let fake = FakeProvisioner::new();
    let mut h = harness(Config::default(), fake.clone(), false);
    in_progress(&mut h);
    let result = sync_claim(&h.ctx, "u1").await;
    assert!(result.is_err(), "retried until the class is back");
    assert!(h.ctx.records.is_in_progress("u1"));
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

    let result = sync_claim(&h.ctx, "u1").await;
    assert_eq!(result.ok(), Some(Outcome::Done));
    assert_eq!(fake.provision_calls().len(), 1);
    assert!(!h.ctx.records.is_in_progress("u1"));
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
    assert_eq!(sync_claim(&h.ctx, "u1").await.ok(), Some(Outcome::Done));
    assert!(fake.provision_calls().is_empty());
}
