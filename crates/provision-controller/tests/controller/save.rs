//! Saving the PV: blocking and background strategies, failures and cleanup, and
//! provisioning that continues after the claim is deleted.

use std::time::Duration;

use kube_sim::{FaultRule, Verb};
use provision_controller::{
    PvSaveStrategy,
    events::{PROVISIONING_CLEANUP_FAILED, PROVISIONING_FAILED},
    testing::{DeleteStep, FakeProvisioner, ProvisionStep},
};

use crate::{Env, claim, eventually, fast_class, quick, settle};

fn pv_create_fails(times: u32) -> FaultRule {
    FaultRule::new(Verb::Create, "persistentvolumes")
        .times(times)
        .status(500, "InternalError")
}

#[tokio::test]
async fn blocking_save_failure_deletes_the_asset_and_the_claim_is_retried() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    // Three tries per attempt: the whole first attempt fails.
    env.sim.add_fault(pv_create_fails(3));
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.unwrap();

    assert_eq!(env.fake.provision_calls().len(), 2);
    assert_eq!(
        env.fake.delete_calls(),
        std::slice::from_ref(&name),
        "the unsaved asset was deleted"
    );
    assert_eq!(env.fake.assets().into_iter().collect::<Vec<_>>(), [name]);
    let failed = env.wait_event("data", PROVISIONING_FAILED).await;
    assert!(failed.note.unwrap().contains("Deleting the volume"));
    env.stop().await;
}

#[tokio::test]
async fn blocking_save_failure_with_failing_cleanup_asks_for_manual_cleanup() {
    let fake = FakeProvisioner::new().script_delete([
        DeleteStep::Fail,
        DeleteStep::Fail,
        DeleteStep::Fail,
    ]);
    let env = Env::start(quick().failed_provision_threshold(1), fake).await;
    env.sim.add_fault(pv_create_fails(3));
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let event = env.wait_event("data", PROVISIONING_CLEANUP_FAILED).await;
    assert!(event.note.unwrap().contains("Please delete manually"));
    assert_eq!(env.fake.delete_calls().len(), 3);
    env.stop().await;
}

#[tokio::test]
async fn backoff_save_strategy_retries_with_growing_pauses() {
    let strategy = PvSaveStrategy::Backoff {
        initial: Duration::from_millis(10),
        factor: 2.0,
        steps: 4,
        cap: None,
    };
    let env = Env::start(quick().pv_save(strategy), FakeProvisioner::new()).await;
    env.sim.add_fault(pv_create_fails(3));
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    env.bound_volume("data").await;
    assert_eq!(
        env.fake.provision_calls().len(),
        1,
        "the fourth try saved it"
    );
    assert!(env.fake.delete_calls().is_empty());
    env.stop().await;
}

#[tokio::test]
async fn background_save_retries_until_saved_and_never_deletes_the_asset() {
    let env = Env::start(
        quick().pv_save(PvSaveStrategy::background()),
        FakeProvisioner::new(),
    )
    .await;
    env.sim.add_fault(pv_create_fails(2));
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    env.bound_volume("data").await;
    assert_eq!(
        env.fake.provision_calls().len(),
        1,
        "the claim counted as provisioned at once"
    );
    assert!(env.fake.delete_calls().is_empty());
    env.stop().await;
}

#[tokio::test]
async fn provisioning_in_the_background_continues_after_the_claim_is_deleted_without_a_leak() {
    let fake = FakeProvisioner::new().script_provision([
        ProvisionStep::InBackground,
        ProvisionStep::InBackground,
        ProvisionStep::InBackground,
    ]);
    // A threshold of 1 would make Go give up (and leak) after the first answer.
    let env = Env::start(quick().failed_provision_threshold(1), fake).await;
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    eventually("first provision call", || async {
        (!env.fake.provision_calls().is_empty()).then_some(())
    })
    .await;
    env.delete_claim("data").await;

    // The driver finishes, the PV is saved, released (its claim is gone) and deleted.
    eventually("asset created and then deleted", || async {
        let deleted = env.fake.delete_calls();
        (env.fake.provision_calls().len() == 4
            && deleted.len() == 1
            && env.fake.assets().is_empty())
        .then_some(())
    })
    .await;
    env.volume_gone(&format!("pvc-{uid}")).await;
    settle().await;
    assert_eq!(
        env.fake.provision_calls().len(),
        4,
        "no provisioning after the volume was saved"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_claim_deleted_while_its_pv_waits_in_the_background_saver_leaves_no_asset() {
    let env = Env::start(
        quick().pv_save(PvSaveStrategy::background()),
        FakeProvisioner::new(),
    )
    .await;
    env.sim.add_fault(
        FaultRule::new(Verb::Create, "persistentvolumes")
            .always()
            .status(500, "InternalError"),
    );
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    eventually("asset created", || async {
        (!env.fake.assets().is_empty()).then_some(())
    })
    .await;
    env.delete_claim("data").await;
    let claims = env.claims();
    eventually("claim gone", || {
        let claims = claims.clone();
        async move { claims.get_opt("data").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert!(
        env.fake.assets().is_empty(),
        "the claim kept its crash-safety finalizer until the asset of its unsaved PV was deleted"
    );

    env.sim.clear_faults();
    settle().await;
    let name = format!("pvc-{uid}");
    assert!(
        env.volumes().get_opt(&name).await.unwrap().is_none(),
        "the unsaved PV of the deleted asset is dropped, not saved"
    );
    env.stop().await;
}
