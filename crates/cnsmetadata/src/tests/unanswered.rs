//! A push that got no answer (it timed out) may still be carried out by CNS later: a
//! deletion keeps the finalizer and removes the entity again once that push can no longer
//! land, and a newer push is sent again then (chaos seed 317 at 30 claims: meta-029's push
//! timed out in a slow CNS window, the object was deleted, its entry removed and the
//! finalizer dropped, then the push landed and left the entry on CNS for good).

use std::time::Duration;

use super::support::{Direct, Harness, config, harness, step};
use crate::{
    FINALIZER, PUSHED_ANNOTATION,
    context::ReconcileError,
    testing::{Failure, pvc_spec},
};
use kube_runtime::controller::Action;
use kube_sim::{FaultRule, Verb};

/// Backend timeout 10 s, settle margin 20 s: a push that got no answer may land for 30 s.
const SETTLE: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(10);

fn settling_config() -> crate::Config {
    config()
        .backend_timeout(TIMEOUT)
        .settle_margin(SETTLE - TIMEOUT)
}

/// `(entity name, labels)` of every entity on the in-memory CNS.
fn on_cns(h: &Harness) -> Vec<(String, Vec<(String, String)>)> {
    h.backend
        .entities()
        .into_iter()
        .map(|u| {
            let labels = u.entity_metadata.labels.into_iter().collect();
            (u.entity_metadata.entity_name, labels)
        })
        .collect()
}

fn data(labels: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
    let labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    ("data".to_owned(), labels)
}

/// Whether the object's record marks an entry with a push that got no answer.
async fn marked(h: &Harness, name: &str) -> bool {
    let object = h.get("tenant", name).await.expect("object exists");
    let annotations = object.metadata.annotations.unwrap_or_default();
    annotations
        .get(PUSHED_ANNOTATION)
        .is_some_and(|text| text.contains("\"unanswered\""))
}

/// A finalized object whose next push is about to be made.
async fn finalized(h: &Harness) -> Direct {
    h.vsphere_volume("tenant", "gc-1-vol-a").await;
    let d = h.direct(settling_config()).await;
    h.create("tenant", "gc-1-data", pvc_spec()).await;
    assert_eq!(
        step(h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    d
}

/// Deletes the object, lets the push without answer land, and checks that the finalizer
/// stays until that push can no longer land, then goes with the entity removed again.
async fn deletion_waits_for_the_push(h: &Harness, d: &Direct) {
    h.delete("tenant", "gc-1-data").await;
    let action = step(h, d, "tenant", "gc-1-data").await.unwrap();
    assert_ne!(
        action,
        Action::await_change(),
        "the deletion waits for the push without answer"
    );
    let object = h.get("tenant", "gc-1-data").await.expect("still there");
    assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert!(on_cns(h).is_empty(), "removed at once: {:?}", on_cns(h));

    // The push lands after the removal.
    assert_eq!(h.backend.land_late(), 1);
    assert_eq!(on_cns(h), [data(&[("app", "db")])]);

    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        step(h, d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none(), "finalized");
    assert!(on_cns(h).is_empty(), "removed again: {:?}", on_cns(h));
}

#[tokio::test(start_paused = true)]
async fn a_push_that_timed_out_and_lands_after_the_deletion_is_removed_again() {
    let h = harness().await;
    let d = finalized(&h).await;
    // The backend never answers: the reconciler's own timeout gives up.
    h.backend.fail_next(1, Failure::LandsLate);
    let error = step(&h, &d, "tenant", "gc-1-data").await.unwrap_err();
    assert!(
        matches!(error, ReconcileError::VolumesFailed { .. }),
        "{error}"
    );
    assert!(marked(&h, "gc-1-data").await, "the record marks the push");
    deletion_waits_for_the_push(&h, &d).await;
}

#[tokio::test(start_paused = true)]
async fn a_push_the_backend_reports_unanswered_holds_the_deletion_too() {
    let h = harness().await;
    let d = finalized(&h).await;
    // The vSphere client's own timeout: an answer at once, saying there was none.
    h.backend.fail_next(1, Failure::Unanswered);
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    deletion_waits_for_the_push(&h, &d).await;
}

#[tokio::test(start_paused = true)]
async fn the_replica_remembers_a_push_without_answer_when_the_status_write_fails() {
    let h = harness().await;
    let d = finalized(&h).await;
    h.backend.fail_next(1, Failure::Unanswered);
    // The record of the push is written; the status write after it fails.
    h.sim.add_fault(
        FaultRule::new(Verb::Update, "cnsvolumemetadatas")
            .after(1)
            .times(5),
    );
    let error = step(&h, &d, "tenant", "gc-1-data").await.unwrap_err();
    assert!(matches!(error, ReconcileError::Write { .. }), "{error}");
    h.sim.clear_faults();
    assert!(
        marked(&h, "gc-1-data").await,
        "the mark written before the push stays: the status write failed"
    );
    deletion_waits_for_the_push(&h, &d).await;
}

#[tokio::test(start_paused = true)]
async fn an_old_push_landing_after_a_newer_one_is_overwritten_once_it_cannot_land_anymore() {
    let h = harness().await;
    let d = finalized(&h).await;
    h.backend.fail_next(1, Failure::Unanswered);
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    h.edit("tenant", "gc-1-data", |spec| {
        spec.labels.insert("app".into(), "web".into());
    })
    .await;
    let action = step(&h, &d, "tenant", "gc-1-data").await.unwrap();
    assert_eq!(on_cns(&h), [data(&[("app", "web")])]);
    assert_ne!(
        action,
        Action::await_change(),
        "pushed again once the old push cannot land anymore"
    );
    // The old labels land after the new ones.
    assert_eq!(h.backend.land_late(), 1);
    assert_eq!(on_cns(&h), [data(&[("app", "db")])]);

    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert_eq!(on_cns(&h), [data(&[("app", "web")])]);
    assert!(!marked(&h, "gc-1-data").await, "the mark is gone");
}

#[tokio::test(start_paused = true)]
async fn a_failure_with_an_answer_never_holds_the_deletion() {
    let h = harness().await;
    let d = finalized(&h).await;
    h.backend
        .fail_next(1, Failure::error("CnsFault: volume busy"));
    assert!(step(&h, &d, "tenant", "gc-1-data").await.is_err());
    assert!(!marked(&h, "gc-1-data").await);
    h.delete("tenant", "gc-1-data").await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none());
}

/// Chaos seeds 30031, 30287, 30378, 40762 and 40810: one replica's push is on its way to
/// CNS (the replica cut off from the API server as the other took over, or both running
/// without leader election) while the other replica deletes the object. The deleting
/// replica must see that push in the record, marked before it was sent: without the mark
/// it removed the entity and the finalizer at once, and the push, landing after, left the
/// entity on CNS for good.
#[tokio::test(start_paused = true)]
async fn a_push_in_flight_on_another_replica_holds_the_deletion_until_it_cannot_land() {
    let h = harness().await;
    let sending = finalized(&h).await;
    let deleting = h.direct(settling_config()).await;
    // The sending replica's push gets no answer (its own timeout gives up after 10 s).
    h.backend.fail_next(1, Failure::LandsLate);
    let calls = h.backend.calls().len();
    let (pushed, deleted) = tokio::join!(step(&h, &sending, "tenant", "gc-1-data"), async {
        while h.backend.calls().len() == calls {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            marked(&h, "gc-1-data").await,
            "the push in flight is marked in the record"
        );
        h.delete("tenant", "gc-1-data").await;
        step(&h, &deleting, "tenant", "gc-1-data").await
    });
    assert!(pushed.is_err(), "the push got no answer");
    assert_ne!(
        deleted.unwrap(),
        Action::await_change(),
        "the deletion waits for the push in flight"
    );
    let object = h.get("tenant", "gc-1-data").await.expect("still there");
    assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));

    // The push lands after the removal.
    assert_eq!(h.backend.land_late(), 1);
    assert_eq!(on_cns(&h), [data(&[("app", "db")])]);
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        step(&h, &deleting, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none(), "finalized");
    assert!(on_cns(&h).is_empty(), "removed again: {:?}", on_cns(&h));
}

#[tokio::test(start_paused = true)]
async fn an_answered_push_leaves_no_mark_and_the_deletion_goes_at_once() {
    let h = harness().await;
    let d = finalized(&h).await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(
        !marked(&h, "gc-1-data").await,
        "the status write cleared the mark"
    );
    h.delete("tenant", "gc-1-data").await;
    assert_eq!(
        step(&h, &d, "tenant", "gc-1-data").await.unwrap(),
        Action::await_change()
    );
    assert!(h.get("tenant", "gc-1-data").await.is_none());
    assert!(on_cns(&h).is_empty());
}
