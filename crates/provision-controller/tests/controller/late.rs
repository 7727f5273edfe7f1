//! Late assets (`Provisioner::late_asset_window`): a young PV we provisioned is handed to
//! `volume_saved` again at its first sync in a controller (a restarted replica sweeps
//! what its earlier life left in flight) and once more when its window has passed.
//!
//! Each test that shows something is NOT swept also has a young PV of ours that is, so
//! the sweep demonstrably ran.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{PersistentVolume, PersistentVolumeClaim},
    jiff::Timestamp,
};
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_sim::KubeSim;
use provision_controller::{
    DeleteError, ProvisionError, ProvisionOptions, Provisioner,
    annotations::{
        ANN_CLEANUP_RECORD, ANN_CREATES_MAY_LAND, ANN_PROVISIONING_OWNER, FINALIZER_PROVISIONING,
    },
    testing::{DeleteStep, FakeProvisioner, ProvisionStep, pv, pvc},
};

use crate::{Env, ME, claim, eventually, fast_class, quick};

const WINDOW: Duration = Duration::from_secs(2);

/// The fake, with the wall-clock time of every `volume_saved` call by PV name.
#[derive(Clone)]
struct Timed {
    fake: FakeProvisioner,
    window: Option<Duration>,
    saved: Arc<Mutex<Vec<(String, Timestamp)>>>,
}

impl Timed {
    fn new(window: Option<Duration>) -> Self {
        Self {
            fake: FakeProvisioner::new(),
            window,
            saved: Arc::default(),
        }
    }

    /// When `volume_saved` was called for the PV `name`, in order.
    fn calls(&self, name: &str) -> Vec<Timestamp> {
        let saved = self.saved.lock().unwrap();
        saved
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .collect()
    }

    async fn wait_calls(&self, name: &str, n: usize) -> Vec<Timestamp> {
        eventually(&format!("{n} volume_saved calls for {name}"), || async {
            let calls = self.calls(name);
            (calls.len() >= n).then_some(calls)
        })
        .await
    }
}

#[async_trait::async_trait]
impl Provisioner for Timed {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        self.fake.provision(options).await
    }
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        self.fake.delete(volume).await
    }
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), DeleteError> {
        let name = saved.metadata.name.clone().unwrap_or_default();
        self.saved.lock().unwrap().push((name, Timestamp::now()));
        self.fake.volume_saved(saved).await
    }
    fn late_asset_window(&self) -> Option<Duration> {
        self.window
    }
}

/// Creates a PV that names no claim (nothing else happens to it) and returns it as stored.
async fn create_pv(sim: &KubeSim, name: &str, provisioner: &str) -> PersistentVolume {
    let volumes = kube_client::Api::<PersistentVolume>::all(sim.client());
    let volume = pv(name).provisioned_by(provisioner).build();
    volumes
        .create(&PostParams::default(), &volume)
        .await
        .unwrap()
}

fn created(volume: &PersistentVolume) -> Timestamp {
    volume.metadata.creation_timestamp.as_ref().unwrap().0
}

/// Starts a controller on `driver` against `sim`.
async fn start(sim: KubeSim, driver: &Timed) -> Env {
    Env::start_on(sim, quick(), driver.fake.clone(), driver.clone(), |c| c).await
}

/// More than the window plus a resync (`quick` resyncs every 2 s): any further call
/// would have happened by then.
async fn past_window_and_resync() {
    tokio::time::sleep(WINDOW + Duration::from_millis(2500)).await;
}

#[tokio::test]
async fn a_young_volume_is_swept_at_its_first_sync_after_a_restart_and_once_when_its_window_ends() {
    let sim = Env::sim().await;
    // A PV an earlier life of the controller saved just before it stopped.
    let window = Duration::from_secs(3);
    let volume = create_pv(&sim, "pvc-young", ME).await;
    let driver = Timed::new(Some(window));
    let env = start(sim, &driver).await;

    let calls = driver.wait_calls("pvc-young", 2).await;
    let deadline = created(&volume) + window;
    assert!(
        calls[1] >= deadline,
        "the second call waits for the window to end: {calls:?}, created {}",
        created(&volume)
    );
    past_window_and_resync().await;
    assert_eq!(driver.calls("pvc-young").len(), 2, "and never again");
    env.stop().await;
}

#[tokio::test]
async fn a_volume_this_controller_saves_is_swept_once_more_when_its_window_ends() {
    let driver = Timed::new(Some(WINDOW));
    let env = Env::start_driver(quick(), driver.fake.clone(), driver.clone(), |c| c).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.clone().unwrap();

    // At the save, then at the end of the window (the first sync adds nothing).
    let calls = driver.wait_calls(&name, 2).await;
    assert!(calls[1] >= created(&volume) + WINDOW, "{calls:?}");
    past_window_and_resync().await;
    assert_eq!(driver.calls(&name).len(), 2);
    env.stop().await;
}

#[tokio::test]
async fn a_failed_window_end_sweep_is_retried_until_it_succeeds() {
    let driver = Timed::new(Some(WINDOW));
    // The call after the save succeeds, the one when the window ends fails.
    let fake = driver
        .fake
        .clone()
        .script_volume_saved([DeleteStep::Succeed, DeleteStep::Fail]);
    let env = Env::start_driver(quick(), fake, driver.clone(), |c| c).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.clone().unwrap();

    let calls = driver.wait_calls(&name, 3).await;
    assert!(calls[1] >= created(&volume) + WINDOW, "{calls:?}");
    // The first retry comes 1 s after the failure (a margin for the two clocks).
    let gap = calls[2].duration_since(calls[1]);
    assert!(
        gap >= k8s_openapi::jiff::SignedDuration::from_millis(900),
        "{calls:?}"
    );
    past_window_and_resync().await;
    assert_eq!(driver.calls(&name).len(), 3, "no call once one succeeded");
    env.stop().await;
}

#[tokio::test]
async fn a_volume_older_than_the_window_and_the_grace_is_not_swept() {
    let sim = Env::sim().await;
    create_pv(&sim, "pvc-old", ME).await;
    // Older than the window plus the takeover grace (the window again without leader
    // election) when the controller starts; creation times are whole seconds, and an age
    // counts from the end of the second shown.
    tokio::time::sleep(2 * WINDOW + Duration::from_secs(2)).await;
    create_pv(&sim, "pvc-young", ME).await;
    let driver = Timed::new(Some(WINDOW));
    let env = start(sim, &driver).await;

    driver.wait_calls("pvc-young", 2).await;
    past_window_and_resync().await;
    assert_eq!(driver.calls("pvc-old"), []);
    env.stop().await;
}

#[tokio::test]
async fn a_volume_of_another_provisioner_is_not_swept() {
    let sim = Env::sim().await;
    create_pv(&sim, "pvc-theirs", "example.com/other").await;
    create_pv(&sim, "pvc-young", ME).await;
    let driver = Timed::new(Some(WINDOW));
    let env = start(sim, &driver).await;

    driver.wait_calls("pvc-young", 2).await;
    past_window_and_resync().await;
    assert_eq!(driver.calls("pvc-theirs"), []);
    env.stop().await;
}

// A guard for drivers without a window: it cannot fail for want of the sweep, only if
// the sweep ran without being asked for.
#[tokio::test]
async fn without_a_window_volumes_are_not_swept_again() {
    let sim = Env::sim().await;
    create_pv(&sim, "pvc-young", ME).await;
    let driver = Timed::new(None);
    let env = start(sim, &driver).await;
    // A PV saved in this run proves the volume workers ran meanwhile.
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.clone().unwrap();

    past_window_and_resync().await;
    assert_eq!(driver.calls("pvc-young"), []);
    assert_eq!(driver.calls(&name).len(), 1, "only at the save");
    env.stop().await;
}

// Chaos seed 30341 (no leader election): a replica's create timed out and landed after the
// other replica had deleted the claim's PV; nothing swept the name again. A PV this
// controller deletes before its window ended is swept once more when the window ends.
/// Marks `name` as a PV that crash-safe provisioning saved only to record an asset its
/// claim will not use ([`ANN_CLEANUP_RECORD`]); the flows that save one are tested in
/// crash_safe.rs.
async fn mark_cleanup_record(env: &Env, name: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {ANN_CLEANUP_RECORD: "true"}}});
    env.volumes()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Releases the claim `data` of `env` inside the PV's 4 s window (the PV marked as a
/// cleanup record) and waits until the driver deleted the asset; returns the PV and when
/// its window ends.
async fn released_inside_the_window(env: &Env, driver: &Timed) -> (PersistentVolume, Timestamp) {
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.clone().unwrap();
    driver.wait_calls(&name, 1).await;
    mark_cleanup_record(env, &name).await;
    let window_end = delete_inside_the_window(env, &volume).await;
    (volume, window_end)
}

/// Chaos seeds 90144, 90297: a claim was bound to a static PV while its create ran; the
/// cleanup saved a PV for the asset found then, which was reclaimed at once; the create
/// landed later, and both replicas were restarted before the window ended, so the record
/// of the owed sweep in their memory was lost. A cleanup-record PV is itself the record:
/// it stays until the window ends, and its name is deleted again then.
#[tokio::test]
async fn a_volume_released_inside_its_window_stays_until_the_window_ends_then_its_name_is_deleted_again()
 {
    let driver = Timed::new(Some(Duration::from_secs(4)));
    let env = Env::start_driver(quick(), driver.fake.clone(), driver.clone(), |c| c).await;
    let (volume, window_end) = released_inside_the_window(&env, &driver).await;
    let name = volume.metadata.name.clone().unwrap();
    // The create another replica sent lands now.
    env.fake.add_asset(&name);
    env.volume_gone(&name).await;
    assert!(
        Timestamp::now() >= window_end,
        "the PV went before its window ended"
    );
    assert!(
        !env.fake.assets().contains(&name),
        "the asset that landed late went with the PV: {:?}",
        env.fake.assets()
    );
    let calls = driver.calls(&name);
    assert_eq!(
        calls.len(),
        2,
        "swept at the save and at the window's end: {calls:?}"
    );
    assert!(
        calls[1] >= window_end,
        "{calls:?}, window ends {window_end}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(driver.calls(&name).len(), 2, "and never again");
    env.stop().await;
}

#[tokio::test]
async fn a_volume_kept_for_its_window_is_finished_by_the_next_controller_after_a_restart() {
    let driver = Timed::new(Some(Duration::from_secs(4)));
    let mut env = Env::start_driver(quick(), driver.fake.clone(), driver.clone(), |c| c).await;
    let (volume, window_end) = released_inside_the_window(&env, &driver).await;
    let name = volume.metadata.name.clone().unwrap();
    // The process that kept the PV stops; the create another replica sent lands.
    next_controller_finishes(&mut env, &name, window_end).await;
    env.stop().await;
}

// Chaos seed 60133 (no leader election): the replica that deleted a young PV stopped
// before its window ended, and a create of its name landed later. Every replica whose
// watch sees a PV of ours go inside its window makes the last sweep, not only the one
// that deleted it.
#[tokio::test]
async fn a_volume_deleted_by_someone_else_before_its_window_ended_is_swept_once_more_when_it_ends()
{
    let sim = Env::sim().await;
    let window = Duration::from_secs(4);
    let driver = Timed::new(Some(window));
    let env = start(sim, &driver).await;
    let volume = create_pv(&env.sim, "pvc-other", ME).await;
    driver.wait_calls("pvc-other", 1).await;
    // Not this controller's delete: a PV without a claim carries no finalizer of ours.
    env.volumes()
        .delete("pvc-other", &Default::default())
        .await
        .unwrap();
    env.volume_gone("pvc-other").await;
    let window_end = created(&volume) + window;
    assert!(
        Timestamp::now() < window_end,
        "the test needs the delete inside the window"
    );
    assert!(
        !env.fake.delete_calls().contains(&"pvc-other".to_owned()),
        "the driver did not delete it"
    );

    let calls = driver.wait_calls("pvc-other", 2).await;
    assert!(
        calls[1] >= window_end,
        "the sweep after the deletion waits for the window's end: {calls:?}, window ends {window_end}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(driver.calls("pvc-other").len(), 2, "once, and never again");
    env.stop().await;
}

// A user's PV provisioned in one go by one process is not kept: it goes at once (the
// replicas that see it go make its last sweep, tested above).
#[tokio::test]
async fn a_users_volume_released_inside_its_window_goes_at_once() {
    let driver = Timed::new(Some(Duration::from_secs(6)));
    let env = Env::start_driver(quick(), driver.fake.clone(), driver.clone(), |c| c).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.clone().unwrap();
    assert_eq!(creates_may_land(&volume), None, "provisioned in one go");
    driver.wait_calls(&name, 1).await;
    env.delete_claim("data").await;
    env.volume_gone(&name).await;
    assert!(
        Timestamp::now() < created(&volume) + Duration::from_secs(6),
        "the PV went before its window ended"
    );
    env.stop().await;
}

fn creates_may_land(volume: &PersistentVolume) -> Option<&str> {
    volume
        .metadata
        .annotations
        .as_ref()?
        .get(ANN_CREATES_MAY_LAND)
        .map(String::as_str)
}

/// Deletes the claim `data` of `env` inside the 4 s window of its PV `volume`, waits until
/// the driver deleted the asset, checks that the PV stays, and returns when the window ends.
async fn delete_inside_the_window(env: &Env, volume: &PersistentVolume) -> Timestamp {
    let name = volume.metadata.name.clone().unwrap();
    env.delete_claim("data").await;
    eventually("the asset deleted", || async {
        env.fake.delete_calls().contains(&name).then_some(())
    })
    .await;
    let window_end = created(volume) + Duration::from_secs(4);
    assert!(
        Timestamp::now() < window_end,
        "the test needs the delete inside the window"
    );
    assert!(
        env.volumes().get_opt(&name).await.unwrap().is_some(),
        "the PV stays until its window ends"
    );
    window_end
}

/// Restarts the controller of `env` on a new driver, lets a late create of `name` land
/// there and checks that the next controller deletes it with the PV, at the window's end.
async fn next_controller_finishes(env: &mut Env, name: &str, window_end: Timestamp) {
    let next = Timed::new(Some(Duration::from_secs(4)));
    env.restart(quick(), next.clone()).await;
    next.fake.add_asset(name);
    env.volume_gone(name).await;
    assert!(
        Timestamp::now() >= window_end,
        "the PV went before its window ended"
    );
    assert!(
        next.fake.delete_calls().iter().any(|n| n == name),
        "the next controller deleted the name again: {:?}",
        next.fake.delete_calls()
    );
    assert!(
        !next.fake.assets().contains(name),
        "the asset that landed late went with the PV: {:?}",
        next.fake.assets()
    );
}

// Chaos seeds 90456, 100311: a claim's provisioning spanned two processes (a replica that
// stopped with a create in flight, and the one that went on); its PV was deleted inside
// its window, then both replicas restarted before the window ended, and the first one's
// create landed: nothing remembered the owed sweep. A PV whose claim showed a
// provisioning started elsewhere records that creates may land, and stays until its
// window ends, whoever leads then.
#[tokio::test]
async fn a_volume_whose_provisioning_another_process_started_stays_until_its_window_ends() {
    let driver = Timed::new(Some(Duration::from_secs(4)));
    // Another replica added the crash-safety finalizer and asked its driver.
    let started = pvc("data")
        .storage_class("fast")
        .finalizer(FINALIZER_PROVISIONING)
        .annotation(ANN_PROVISIONING_OWNER, ME)
        .build();
    kept_until_the_window_ends(&driver, started).await;
}

// The same for a create whose outcome this process did not know at first (the driver
// answered `InBackground`): an earlier life of this process may have sent another.
#[tokio::test]
async fn a_volume_whose_create_ran_in_the_background_stays_until_its_window_ends() {
    let mut driver = Timed::new(Some(Duration::from_secs(4)));
    driver.fake = FakeProvisioner::new().script_provision([ProvisionStep::InBackground]);
    kept_until_the_window_ends(&driver, claim("data")).await;
}

/// Provisions `data` (the claim `claim`) with `driver`, checks that its PV records that
/// creates may land, deletes the claim inside the PV's window, and checks that the PV
/// stays until the window ends, when the next controller (after a restart) deletes the
/// asset that landed late.
async fn kept_until_the_window_ends(driver: &Timed, claim: PersistentVolumeClaim) {
    let mut env = Env::start_driver(quick(), driver.fake.clone(), driver.clone(), |c| c).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.clone().unwrap();
    assert_eq!(creates_may_land(&volume), Some("true"));
    driver.wait_calls(&name, 1).await;
    let window_end = delete_inside_the_window(&env, &volume).await;
    next_controller_finishes(&mut env, &name, window_end).await;
    env.stop().await;
}
