//! A panic anywhere in a sync (a hook, a bug) and a malformed claim fail that claim
//! only, with an error naming the problem: the worker lives on.

use super::*;
use crate::VolumeNamer;

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
    let cases: Vec<(&str, PersistentVolumeClaim, Result<Outcome, &str>, bool)> = vec![
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
            Ok(Outcome::Done),
            true,
        ),
        (
            "an unparsable quantity is the driver's to judge",
            odd_quantity,
            Ok(Outcome::Done),
            true,
        ),
        (
            // The feeder never indexes nor queues it (the index is keyed by uid).
            "a claim with an empty uid is not found by uid and gets no PV",
            empty_uid,
            Ok(Outcome::Done),
            false,
        ),
    ];
    for (name, claim, want, called) in cases {
        let fake = FakeProvisioner::new();
        let mut h = harness(Config::default(), fake.clone(), true);
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        h.put_claim(claim);
        let got = sync_claim(&h.ctx, &uid).await.map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(str::to_owned), "case: {name}");
        assert_eq!(!fake.provision_calls().is_empty(), called, "case: {name}");
    }
}
