//! Driver slots (`Config::threads`): only the driver's calls take one; the API round trips
//! of a claim's sync (the crash-safety finalizer, the PV, events) run in the sync workers
//! (`Config::sync_workers`) without one.

use std::{num::NonZeroU16, time::Duration};

use kube_sim::{FaultRule, Verb};
use provision_controller::testing::{FakeProvisioner, ProvisionStep};

use crate::{Env, claim, eventually, fast_class, quick, settle};

fn threads(n: u16) -> NonZeroU16 {
    NonZeroU16::new(n).expect("not zero")
}

#[tokio::test]
async fn no_more_driver_calls_run_at_once_than_threads_even_with_many_sync_workers() {
    let fake =
        FakeProvisioner::new().script_provision(std::iter::repeat_n(ProvisionStep::Block, 6));
    let config = quick().threads(threads(2)).sync_workers(threads(16));
    let env = Env::start(config, fake.clone()).await;
    env.create_class(fast_class()).await;
    for i in 0..6 {
        env.create_claim(claim(&format!("c{i}"))).await;
    }
    fake.wait_blocked(2).await;
    settle().await;
    assert_eq!(
        fake.provision_calls().len(),
        2,
        "a third driver call started while two held both slots"
    );
    fake.unblock();
    for i in 0..6 {
        env.bound_volume(&format!("c{i}")).await;
    }
    assert_eq!(fake.provision_calls().len(), 6);
    env.stop().await;
}

#[tokio::test]
async fn a_slow_pv_save_does_not_hold_the_driver_slot() {
    // One driver slot. Every PV create answers only after 5 s: with the slot held across
    // the save (Go's worker), the second claim's driver call would wait for the first
    // claim's PV to be saved.
    let env = Env::start(quick().threads(threads(1)), FakeProvisioner::new()).await;
    env.sim.add_fault(
        FaultRule::new(Verb::Create, "persistentvolumes")
            .always()
            .latency(Duration::from_secs(5))
            .no_status(),
    );
    env.create_class(fast_class()).await;
    env.create_claim(claim("first")).await;
    env.create_claim(claim("second")).await;
    eventually(
        "both claims' driver calls, before any PV is saved",
        || async { (env.fake.provision_calls().len() == 2).then_some(()) },
    )
    .await;
    let saved = env.volumes().list(&Default::default()).await.unwrap();
    assert!(
        saved.items.is_empty(),
        "the driver calls were meant to overlap the first save: {:?}",
        saved
            .items
            .iter()
            .map(|v| v.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    env.bound_volume("first").await;
    env.bound_volume("second").await;
    env.stop().await;
}
