//! Saving the PV: blocking and background strategies, failures and cleanup, and
//! provisioning that continues after the claim is deleted.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::PersistentVolume;
use kube_client::{Api, api::PostParams};
use kube_sim::{FaultRule, Verb};
use provision_controller::{
    Config, DeleteError, ProvisionError, ProvisionOptions, Provisioner, PvSaveStrategy,
    testing::{DeleteStep, FakeProvisioner, ProvisionStep, pv},
};

use crate::{Env, ME, claim, eventually, fast_class, quick, settle};

/// The event reason operators see (Go's string).
const PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
/// The event reason operators see (Go's string).
const PROVISIONING_FAILED: &str = "ProvisioningFailed";

fn pv_create_fails(times: u32) -> FaultRule {
    FaultRule::new(Verb::Create, "persistentvolumes")
        .times(times)
        .status(500, "InternalError")
}

// With crash-safe provisioning the asset of a PV that could not be saved is never
// deleted: another replica may save a PV naming it at any moment. The claim keeps its
// finalizer and is provisioned (the driver finds the asset) and saved again.
#[tokio::test]
async fn a_blocking_save_failure_keeps_the_asset_and_the_claim_is_provisioned_again() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    // Three tries per attempt: the whole first attempt fails.
    env.sim.add_fault(pv_create_fails(3));
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.unwrap();

    assert_eq!(env.fake.provision_calls().len(), 2);
    assert!(env.fake.delete_calls().is_empty(), "the asset was kept");
    assert_eq!(env.fake.assets().into_iter().collect::<Vec<_>>(), [name]);
    let failed = env.wait_event("data", PROVISIONING_FAILED).await;
    let note = failed.note.unwrap_or_default();
    assert!(note.contains("Keeping the volume"), "{note}");
    env.stop().await;
}

// Go's behaviour without crash safety: the unsaved asset is deleted.
#[tokio::test]
async fn without_crash_safety_a_blocking_save_failure_deletes_the_asset_and_the_claim_is_retried() {
    let env = Env::start(
        quick().crash_safe_provisioning(false),
        FakeProvisioner::new(),
    )
    .await;
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
async fn without_crash_safety_a_failing_cleanup_asks_for_manual_cleanup() {
    let fake = FakeProvisioner::new().script_delete([
        DeleteStep::Fail,
        DeleteStep::Fail,
        DeleteStep::Fail,
    ]);
    let config = quick()
        .crash_safe_provisioning(false)
        .failed_provision_threshold(1);
    let env = Env::start(config, fake).await;
    env.sim.add_fault(pv_create_fails(3));
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let event = env.wait_event("data", PROVISIONING_CLEANUP_FAILED).await;
    assert!(event.note.unwrap().contains("Please delete manually"));
    assert_eq!(env.fake.delete_calls().len(), 3);
    env.stop().await;
}

/// A driver whose first `delete` lets another replica's PV for the same asset land first
/// (the PV it is asked to delete, saved by someone else), then fails.
struct SavedDuringTheFirstDelete {
    fake: FakeProvisioner,
    client: Arc<OnceLock<kube_client::Client>>,
    saved: AtomicBool,
}

#[async_trait::async_trait]
impl Provisioner for SavedDuringTheFirstDelete {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        self.fake.provision(options).await
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        if !self.saved.swap(true, Ordering::SeqCst) {
            let volumes: Api<PersistentVolume> = Api::all(self.client.get().unwrap().clone());
            let mut other = volume.clone();
            other.metadata.resource_version = None;
            volumes
                .create(&PostParams::default(), &other)
                .await
                .expect("the other replica saves its PV");
        }
        self.fake.delete(volume).await
    }
}

// Without crash safety the unsaved asset is deleted, but the PV is read again right
// before each delete attempt: a PV saved meanwhile names the asset.
#[tokio::test]
async fn without_crash_safety_the_pv_is_read_again_before_each_delete_attempt() {
    let fake = FakeProvisioner::new().script_delete([DeleteStep::Fail]);
    let client = Arc::new(OnceLock::new());
    let driver = SavedDuringTheFirstDelete {
        fake: fake.clone(),
        client: Arc::clone(&client),
        saved: AtomicBool::new(false),
    };
    let env = Env::start_driver(quick().crash_safe_provisioning(false), fake, driver, |c| c).await;
    assert!(client.set(env.client.clone()).is_ok());
    env.sim.add_fault(pv_create_fails(3));
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.unwrap();
    settle().await;
    assert_eq!(
        env.fake.delete_calls(),
        std::slice::from_ref(&name),
        "one failed attempt, then the PV was found"
    );
    assert_eq!(
        env.fake.assets().into_iter().collect::<Vec<_>>(),
        [name],
        "the asset the PV names exists"
    );
    assert_eq!(env.fake.provision_calls().len(), 1, "counted as saved");
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

// The claim of a PV waiting in the background saver is deleted: its cleanup saves the
// PV too, so the claim waits until the API server takes it; then the PV is released
// and reclaimed as usual.
#[tokio::test]
async fn a_claim_deleted_while_its_pv_waits_in_the_background_saver_is_finished_by_saving_it() {
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
    let name = format!("pvc-{uid}");
    eventually("asset created", || async {
        (!env.fake.assets().is_empty()).then_some(())
    })
    .await;
    env.delete_claim("data").await;
    let claims = env.claims();
    eventually("claim gone at once", || {
        let claims = claims.clone();
        async move { claims.get_opt("data").await.ok()?.is_none().then_some(()) }
    })
    .await;
    settle().await;
    assert!(
        crate::has_intent(&env, Some(&uid)).await,
        "the journal keeps the intent while no PV records the asset"
    );
    assert!(env.fake.delete_calls().is_empty(), "the asset is kept");

    env.sim.clear_faults();
    // The PV gets saved (nothing waits for it: the claim is already gone), released by
    // the binder and reclaimed; only then is the PV deleted.
    eventually("asset reclaimed", || async {
        env.fake.assets().is_empty().then_some(())
    })
    .await;
    env.volume_gone(&name).await;
    assert_eq!(env.fake.delete_calls(), [name], "reclaimed once released");
    // Settles are group-committed, so the intent goes a moment later.
    eventually("the intent goes once a PV records the asset", || async {
        (!crate::has_intent(&env, Some(&uid)).await).then_some(())
    })
    .await;
    env.stop().await;
}

/// A controller whose driver is in the middle of creating the asset of claim `data`
/// (class `fast`); returns the claim's uid and PV name.
async fn mid_provision(config: Config, fake: FakeProvisioner) -> (Env, String, String) {
    let env = Env::start(config, fake.script_provision([ProvisionStep::Block])).await;
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    tokio::time::timeout(Duration::from_secs(15), env.fake.wait_blocked(1))
        .await
        .expect("the driver is called");
    (env, uid.clone(), format!("pvc-{uid}"))
}

/// What another replica saved for the claim while ours was provisioning: a PV of the
/// same name for the claim, naming the asset at `path`.
async fn saved_by_another_replica(env: &Env, uid: &str, name: &str, path: &str) {
    let mut volume = pv(name)
        .provisioned_by(ME)
        .storage_class("fast")
        .claim_ref("default", "data", uid)
        .build();
    volume
        .spec
        .as_mut()
        .unwrap()
        .host_path
        .as_mut()
        .unwrap()
        .path = path.to_owned();
    env.volumes()
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
}

fn host_path(volume: &PersistentVolume) -> String {
    volume.spec.clone().unwrap().host_path.unwrap().path
}

async fn wait_intent_removed(env: &Env) {
    eventually("journal intent settled", || async {
        (!crate::has_intent(env, None).await).then_some(())
    })
    .await;
}

async fn releases_the_duplicate(strategy: PvSaveStrategy) {
    let (env, uid, name) = mid_provision(quick().pv_save(strategy), FakeProvisioner::new()).await;
    saved_by_another_replica(&env, &uid, &name, "/other-replica/asset").await;
    env.fake.unblock();

    let volume = env.bound_volume("data").await;
    assert_eq!(
        host_path(&volume),
        "/other-replica/asset",
        "the saved PV stays"
    );
    eventually("the driver hears of the saved PV", || async {
        (!env.fake.volume_saved_calls().is_empty()).then_some(())
    })
    .await;
    assert!(env.fake.delete_calls().is_empty(), "never a whole delete");
    let told: Vec<_> = env
        .fake
        .volume_saved_calls()
        .iter()
        .map(host_path)
        .collect();
    assert_eq!(
        told,
        ["/other-replica/asset"],
        "the driver hears of the saved PV, and releases ours (another asset of the name) there"
    );
    wait_intent_removed(&env).await;
    assert_eq!(
        env.fake.provision_calls().len(),
        1,
        "the save counts as done"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_pv_saved_first_under_our_name_with_another_source_gets_our_duplicate_released() {
    releases_the_duplicate(PvSaveStrategy::Blocking {
        retries: 3,
        interval: Duration::from_millis(20),
    })
    .await;
}

#[tokio::test]
async fn the_background_saver_releases_a_duplicate_too() {
    releases_the_duplicate(PvSaveStrategy::background()).await;
}

#[tokio::test]
async fn a_pv_saved_first_with_the_same_source_is_reused_without_a_release() {
    let (env, uid, name) = mid_provision(quick(), FakeProvisioner::new()).await;
    saved_by_another_replica(&env, &uid, &name, &format!("/fake/{name}")).await;
    env.fake.unblock();
    env.bound_volume("data").await;
    wait_intent_removed(&env).await;
    settle().await;
    assert!(env.fake.delete_calls().is_empty());
    env.stop().await;
}

// The blocking strategy deletes the asset of a PV it could not save, but never when a PV
// of that name exists: that PV may name the very same asset.
#[tokio::test]
async fn a_failed_save_never_deletes_the_asset_when_a_pv_of_its_name_exists() {
    let (env, uid, name) = mid_provision(quick(), FakeProvisioner::new()).await;
    saved_by_another_replica(&env, &uid, &name, &format!("/fake/{name}")).await;
    env.sim.add_fault(
        FaultRule::new(Verb::Create, "persistentvolumes")
            .always()
            .status(500, "InternalError"),
    );
    env.fake.unblock();
    wait_intent_removed(&env).await;
    settle().await;
    assert!(env.fake.delete_calls().is_empty(), "the asset is kept");
    assert_eq!(env.fake.assets().into_iter().collect::<Vec<_>>(), [name]);
    assert_eq!(env.fake.provision_calls().len(), 1, "counted as saved");
    env.stop().await;
}

#[tokio::test]
async fn a_failed_save_keeps_the_asset_while_it_is_unknown_whether_a_pv_exists() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    for verb in [Verb::Create, Verb::Get] {
        env.sim.add_fault(
            FaultRule::new(verb, "persistentvolumes")
                .always()
                .status(500, "InternalError"),
        );
    }
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    eventually("provisioned again", || async {
        (env.fake.provision_calls().len() >= 2).then_some(())
    })
    .await;
    assert!(env.fake.delete_calls().is_empty(), "the asset is kept");
    assert_eq!(env.fake.assets().len(), 1);
    assert!(
        crate::has_intent(&env, Some(&uid)).await,
        "the journal keeps the claim's intent"
    );

    env.sim.clear_faults();
    let volume = env.bound_volume("data").await;
    assert_eq!(volume.metadata.name, Some(format!("pvc-{uid}")));
    assert!(env.fake.delete_calls().is_empty());
    assert_eq!(env.fake.assets().len(), 1, "one asset, found again by name");
    env.stop().await;
}

#[tokio::test]
async fn the_driver_hears_of_each_pv_saved_for_its_asset() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    env.bound_volume("data").await;
    let told = env.fake.volume_saved_calls();
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].metadata.name, Some(format!("pvc-{uid}")));
    assert!(told[0].metadata.uid.is_some(), "the PV as saved");
    env.stop().await;
}

#[tokio::test]
async fn the_background_saver_tells_the_driver_of_the_pv_it_saved() {
    let env = Env::start(
        quick().pv_save(PvSaveStrategy::background()),
        FakeProvisioner::new(),
    )
    .await;
    env.sim.add_fault(pv_create_fails(2));
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    env.bound_volume("data").await;
    let told = env.fake.volume_saved_calls();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].metadata.name, Some(format!("pvc-{uid}")));
    env.stop().await;
}

#[tokio::test]
async fn a_failing_volume_saved_hook_fails_nothing() {
    let fake = FakeProvisioner::new().script_volume_saved([DeleteStep::Fail]);
    let env = Env::start(quick(), fake).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    env.bound_volume("data").await;
    wait_intent_removed(&env).await;
    // Asked again (after 1 s), and it succeeds then.
    wait_volume_saved_calls(&env, 2).await;
    settle().await;
    assert_eq!(env.fake.provision_calls().len(), 1, "not retried");
    assert_eq!(env.fake.volume_saved_calls().len(), 2);
    assert!(env.events("data", PROVISIONING_FAILED).await.is_empty());
    assert!(env.fake.delete_calls().is_empty());
    env.stop().await;
}

async fn wait_volume_saved_calls(env: &Env, n: usize) -> Vec<PersistentVolume> {
    eventually(&format!("{n} volume_saved calls"), || async {
        let calls = env.fake.volume_saved_calls();
        (calls.len() >= n).then_some(calls)
    })
    .await
}

// Without a late-asset window the call after the save is the only one: a leftover it
// failed to release (a transient backend fault) would stay forever under Retain.
#[tokio::test]
async fn a_volume_saved_hook_that_fails_twice_is_asked_again_until_it_succeeds() {
    let fake = FakeProvisioner::new().script_volume_saved([DeleteStep::Fail, DeleteStep::Fail]);
    let env = Env::start(quick(), fake).await;
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    // After 1 s, then 2 s (the cap: `quick` resyncs every 2 s).
    let calls = wait_volume_saved_calls(&env, 3).await;
    for call in &calls {
        assert_eq!(call.metadata.name, Some(format!("pvc-{uid}")));
        assert_eq!(call.metadata.uid, volume.metadata.uid, "the PV as saved");
    }
    // Past the longest backoff and a resync: no call once one succeeded.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(env.fake.volume_saved_calls().len(), 3);
    assert_eq!(
        env.fake.provision_calls().len(),
        1,
        "the claim is not retried"
    );
    assert!(env.events("data", PROVISIONING_FAILED).await.is_empty());
    env.stop().await;
}

/// A PV the API server refuses as invalid (422) fails the attempt at once, with a Warning
/// event that quotes the server naming the field; Go retries the same PV 5 times 10 s
/// apart (the default `pv_save`) before its first event.
#[tokio::test]
async fn a_volume_the_server_refuses_as_invalid_fails_the_claim_at_once() {
    use provision_controller::testing::{DriverTest, HarnessError, pvc, volume_for};

    struct NoCapacity;
    #[async_trait::async_trait]
    impl Provisioner for NoCapacity {
        async fn provision(
            &self,
            options: &ProvisionOptions,
        ) -> Result<PersistentVolume, ProvisionError> {
            let mut volume = volume_for(options);
            volume.spec.as_mut().unwrap().capacity = None;
            Ok(volume)
        }
        async fn delete(&self, _: &PersistentVolume) -> Result<(), DeleteError> {
            Ok(())
        }
    }

    let test = DriverTest::start(ME, NoCapacity)
        .await
        .unwrap()
        .limit(Duration::from_secs(5));
    let error = test.provision(pvc("data")).await.unwrap_err();
    let HarnessError::NotBound { events, .. } = &error else {
        panic!("{error}");
    };
    assert!(
        events.contains("Warning ProvisioningFailed: The API server refused the PersistentVolume")
            && events.contains("spec.capacity: Required value"),
        "{events}"
    );
    let creates = test
        .sim()
        .requests()
        .iter()
        .filter(|r| r.verb == "create" && r.resource == "persistentvolumes")
        .count();
    assert_eq!(creates, 1, "one attempt, one create");
    test.stop().await.unwrap();
}
