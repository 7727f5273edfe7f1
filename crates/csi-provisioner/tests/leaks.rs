//! The volume leaks kubernetes-csi/external-provisioner is known for, replayed against the
//! sidecar: a [`MockCsiDriver`] over real gRPC on a unix socket, kube-sim with its PV
//! binder, and the sidecar on a runtime of its own that a test can kill mid-call. Each
//! ends with 0 leaked volumes: every volume on the driver has its PV, and none is left
//! once the claims are gone.
//!
//! - #486: the sidecar dies between CreateVolume and the PV, the claim is deleted, a new
//!   sidecar starts: upstream never learns that the volume exists.
//! - #311: CreateVolume outlives `--timeout` and the claim is deleted meanwhile: upstream
//!   stops asking and the volume that lands is leaked.
//! - #1469: provisioning and deletion run concurrently (the claim is deleted as its
//!   volume is made, or while its PV is saved): upstream leaks the volume.

mod sidecar;

use std::time::Duration;

use csi_provisioner::{
    csi::Code,
    testing::{Answer, CsiMethod, MockCsiDriver},
};
use kube_sim::{Cost, FaultRule, KubeSim, LoadModel, Verb};
use sidecar::{
    Sidecar, SidecarSpec, claim_bound, claim_gone, create_claim, delete_claim, eventually,
    pv_count, until_clean, world,
};

/// How long a test waits for one step.
const STEP: Duration = Duration::from_secs(15);

/// Waits (bounded) until the mock holds `count` volumes.
async fn volumes_on_driver(mock: &MockCsiDriver, count: usize) {
    tokio::time::timeout(STEP, mock.wait_until(|m| m.volume_count() == count))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the driver does not hold {count} volumes: {:?}",
                mock.volumes()
            )
        });
}

/// Waits (bounded) until CreateVolume was called `calls` times.
async fn creates_arrived(mock: &MockCsiDriver, calls: u64) {
    tokio::time::timeout(
        STEP,
        mock.wait_until(|m| m.calls(CsiMethod::CreateVolume) >= calls),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{calls} CreateVolume calls did not arrive ({} did)",
            mock.calls(CsiMethod::CreateVolume)
        )
    });
}

/// Ends a test: nothing leaked, nothing left; the volume `id` was deleted on the driver.
async fn assert_volume_deleted(sim: &KubeSim, mock: &MockCsiDriver, id: &str) {
    let found = until_clean(&sim.client(), mock, STEP).await;
    assert!(
        found.is_clean(),
        "leaked or left over: {found:?}; DeleteVolume calls: {}",
        mock.calls(CsiMethod::DeleteVolume)
    );
    let delete = mock.last_delete_volume().expect("DeleteVolume was called");
    assert_eq!(delete.volume_id, id, "DeleteVolume of the volume made");
}

/// kubernetes-csi/external-provisioner#486: CreateVolume is sent, the sidecar is killed
/// before it saves the PV (the driver makes the volume anyway), the claim is deleted while
/// no sidecar runs, then a new sidecar starts. It must find the volume (its journal kept
/// the claim's intent), replay CreateVolume, record the volume in a PV and delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_486_sidecar_killed_between_create_volume_and_pv() {
    let (sim, mock) = world(KubeSim::builder()).await;
    let client = sim.client();
    let spec = SidecarSpec::new(sim.url(), &mock);
    // The backend accepted the operation: the volume is made 1 s after the call whatever
    // becomes of the caller.
    mock.script(
        CsiMethod::CreateVolume,
        [Answer::LandsAfter(Duration::from_secs(1))],
    );
    let first = Sidecar::start(&spec);
    let name = create_claim(&client, "doomed").await;
    creates_arrived(&mock, 1).await;
    first.kill();

    volumes_on_driver(&mock, 1).await;
    let made = mock
        .volume(&name)
        .expect("the volume of the claim was made");
    assert_eq!(pv_count(&client).await, 0, "no PV: the sidecar died first");
    delete_claim(&client, "doomed").await;
    eventually("the claim is gone", STEP, async || {
        claim_gone(&client, "doomed").await
    })
    .await;
    let creates_before = mock.calls(CsiMethod::CreateVolume);

    let second = Sidecar::start(&spec);
    assert_volume_deleted(&sim, &mock, &made.id).await;
    assert!(
        mock.calls(CsiMethod::CreateVolume) > creates_before,
        "the restarted sidecar replayed CreateVolume to learn the volume's id"
    );
    second.stop().await.expect("the sidecar stops cleanly");
}

/// #486, the other order: the sidecar is killed while the driver still holds the call (a
/// driver that honours its caller's cancellation makes nothing), the claim is deleted: the
/// restarted sidecar's replay makes the volume, and it is deleted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_486_sidecar_killed_while_the_driver_holds_create_volume() {
    let (sim, mock) = world(KubeSim::builder()).await;
    let client = sim.client();
    let spec = SidecarSpec::new(sim.url(), &mock);
    mock.set_delay(CsiMethod::CreateVolume, Duration::from_secs(30));
    let first = Sidecar::start(&spec);
    create_claim(&client, "doomed").await;
    creates_arrived(&mock, 1).await;
    first.kill();
    delete_claim(&client, "doomed").await;
    eventually("the claim is gone", STEP, async || {
        claim_gone(&client, "doomed").await
    })
    .await;
    mock.clear_faults();

    let second = Sidecar::start(&spec);
    tokio::time::timeout(
        STEP,
        mock.wait_until(|m| m.calls(CsiMethod::DeleteVolume) >= 1),
    )
    .await
    .expect("the replayed volume is deleted");
    let found = until_clean(&client, &mock, STEP).await;
    assert!(found.is_clean(), "leaked or left over: {found:?}");
    assert!(mock.calls(CsiMethod::CreateVolume) >= 2, "replayed");
    second.stop().await.expect("the sidecar stops cleanly");
}

/// kubernetes-csi/external-provisioner#311: every CreateVolume outlives the sidecar's
/// `--timeout` (the first one lands in the backend later), the claim is deleted after a
/// few retries. Upstream stops asking once the claim is gone and leaks the volume; here
/// CreateVolume is asked again until it answers, and the volume is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_311_create_volume_outlives_the_timeout_and_the_claim_is_deleted() {
    let (sim, mock) = world(KubeSim::builder()).await;
    let client = sim.client();
    let spec = SidecarSpec::new(sim.url(), &mock).call_timeout(Duration::from_millis(300));
    // The first call lands 1.5 s later (retries meanwhile are refused: an operation is
    // pending); later ones are held 30 s (past the timeout: the caller gives up and they do
    // nothing).
    mock.script(
        CsiMethod::CreateVolume,
        [Answer::LandsAfter(Duration::from_millis(1500))],
    );
    mock.set_delay(CsiMethod::CreateVolume, Duration::from_secs(30));
    let sidecar = Sidecar::start(&spec);
    let name = create_claim(&client, "slow").await;
    creates_arrived(&mock, 3).await;
    delete_claim(&client, "slow").await;
    eventually("the claim is gone", STEP, async || {
        claim_gone(&client, "slow").await
    })
    .await;
    let creates_at_deletion = mock.calls(CsiMethod::CreateVolume);
    volumes_on_driver(&mock, 1).await;
    let made = mock.volume(&name).expect("the first create landed");
    // CreateVolume is still being asked although the claim is gone.
    creates_arrived(&mock, creates_at_deletion + 1).await;
    assert_eq!(pv_count(&client).await, 0);
    // The driver recovers: the next CreateVolume answers the landed volume.
    mock.clear_faults();
    assert_volume_deleted(&sim, &mock, &made.id).await;
    sidecar.stop().await.expect("the sidecar stops cleanly");
}

/// #311 as a driver sees it that made the volume and answered `DeadlineExceeded` anyway,
/// then keeps answering it for a while: the claim is deleted before any CreateVolume
/// succeeds. The volume is deleted once a replay answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_311_the_driver_made_the_volume_and_answered_deadline_exceeded() {
    let (sim, mock) = world(KubeSim::builder()).await;
    let client = sim.client();
    let spec = SidecarSpec::new(sim.url(), &mock);
    mock.script(
        CsiMethod::CreateVolume,
        std::iter::once(Answer::ErrorAfterWork(Code::DeadlineExceeded)).chain(std::iter::repeat_n(
            Answer::Error(Code::DeadlineExceeded),
            8,
        )),
    );
    let sidecar = Sidecar::start(&spec);
    let name = create_claim(&client, "late").await;
    creates_arrived(&mock, 2).await;
    let made = mock
        .volume(&name)
        .expect("the first create made the volume");
    delete_claim(&client, "late").await;
    eventually("the claim is gone", STEP, async || {
        claim_gone(&client, "late").await
    })
    .await;
    assert!(
        mock.calls(CsiMethod::CreateVolume) < 10,
        "the claim was deleted before a CreateVolume succeeded"
    );
    assert_volume_deleted(&sim, &mock, &made.id).await;
    assert!(
        mock.calls(CsiMethod::CreateVolume) >= 10,
        "asked until it answered"
    );
    sidecar.stop().await.expect("the sidecar stops cleanly");
}

/// kubernetes-csi/external-provisioner#1469: provisioning and deletion of one claim run
/// at once. Each CreateVolume takes 100 ms at the driver; each claim is deleted at a
/// growing offset after its CreateVolume arrived: while the driver works, right as it
/// answers, while the PV is saved, after. The API server's watches arrive late, so the
/// sidecar acts on stale claims, as in the issue. No volume is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_1469_claims_deleted_as_their_volumes_are_made() {
    let stale =
        LoadModel::none().watch_delivery(Cost::new(Duration::from_millis(50), Duration::ZERO));
    let (sim, mock) = world(KubeSim::builder().load(stale)).await;
    let client = sim.client();
    let spec = SidecarSpec::new(sim.url(), &mock);
    mock.set_delay(CsiMethod::CreateVolume, Duration::from_millis(100));
    let sidecar = Sidecar::start(&spec);
    let offsets_ms = [0_u64, 30, 60, 90, 95, 100, 103, 106, 110, 120, 150, 200];
    for (i, offset_ms) in offsets_ms.into_iter().enumerate() {
        let claim = format!("race-{i}");
        let calls = mock.calls(CsiMethod::CreateVolume);
        create_claim(&client, &claim).await;
        creates_arrived(&mock, calls + 1).await;
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        delete_claim(&client, &claim).await;
    }
    let found = until_clean(&client, &mock, STEP).await;
    assert!(found.is_clean(), "leaked or left over: {found:?}");
    assert!(mock.calls(CsiMethod::DeleteVolume) >= offsets_ms.len() as u64);
    sidecar.stop().await.expect("the sidecar stops cleanly");
}

/// #1469, the claim deleted while its PV is being saved: the PV create is slow (300 ms at
/// the API server), the claim goes meanwhile; and once more with the PV create answered
/// `409 AlreadyExists` (upstream took that for "the PV is saved" while the old PV of that
/// name was on its way out). The volume is deleted either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_1469_claim_deleted_while_its_pv_is_saved() {
    let (sim, mock) = world(KubeSim::builder()).await;
    let client = sim.client();
    let spec = SidecarSpec::new(sim.url(), &mock);
    let sidecar = Sidecar::start(&spec);

    // A bound claim first: the sidecar works.
    create_claim(&client, "warm").await;
    eventually("the first claim binds", STEP, async || {
        claim_bound(&client, "warm").await
    })
    .await;

    sim.add_fault(
        FaultRule::new(Verb::Create, "persistentvolumes")
            .latency(Duration::from_millis(300))
            .no_status(),
    );
    let name = create_claim(&client, "saving").await;
    tokio::time::timeout(STEP, mock.wait_until(|m| m.volume(&name).is_some()))
        .await
        .expect("the volume is made");
    delete_claim(&client, "saving").await;

    sim.add_fault(
        FaultRule::new(Verb::Create, "persistentvolumes")
            .status(409, "AlreadyExists")
            .message("persistentvolumes already exists"),
    );
    let conflicted = create_claim(&client, "conflicted").await;
    tokio::time::timeout(STEP, mock.wait_until(|m| m.volume(&conflicted).is_some()))
        .await
        .expect("the volume is made");
    delete_claim(&client, "conflicted").await;
    delete_claim(&client, "warm").await;

    let found = until_clean(&client, &mock, STEP).await;
    assert!(found.is_clean(), "leaked or left over: {found:?}");
    assert!(
        mock.calls(CsiMethod::DeleteVolume) >= 3,
        "one each at least"
    );
    sidecar.stop().await.expect("the sidecar stops cleanly");
}
