//! Our own writes of a claim (the crash-safety finalizer added, then removed) do not queue
//! it again when their watch events come, whether before or after the answers; a
//! foreign write does.

use super::*;
use crate::annotations::FINALIZER_PROVISIONING;

fn the_claim() -> PersistentVolumeClaim {
    pvc("c")
        .uid("u1")
        .storage_class("fast")
        .provisioner(ME)
        .build()
}

/// Chaos seed 1031: a claim whose driver answers `Failed` is written twice per sync (our
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
