//! A PV deleted inside its late-asset window, across a failover: the last sweep of its
//! name is made when the window ends by the replica that leads then, from the settled
//! journal entry, whoever deleted the PV.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use provision_controller::testing::FakeProvisioner;

use crate::{
    Replica, bound, config, create_claim, delete_claim, election, eventually, journal, sim,
    volumes, wait_holder,
};

// Chaos seeds 50035 and 60133 (under the former PV-annotation mechanism): a PV was deleted
// inside its window, the replica that deleted it stopped, and a create of its name landed
// later. The settled journal entry holds the due time of the last sweep, so the standby
// that takes over makes it, at the window's end and not before.
#[tokio::test]
async fn a_pv_deleted_inside_its_window_is_swept_at_its_end_by_the_standby_that_took_over() {
    let sim = sim().await;
    let window = Duration::from_secs(8);
    // One backend for both replicas.
    let fake = FakeProvisioner::new().with_late_asset_window(window);
    let a = Replica::start(&sim, fake.clone(), config(Some(election("a"))), false);
    wait_holder(&sim, "a").await;
    let b = Replica::start(&sim, fake.clone(), config(Some(election("b"))), false);

    let pv = create_claim(&sim, "data").await;
    let uid = pv.strip_prefix("pvc-").unwrap().to_owned();
    bound(&sim, "data", &pv).await;
    let saved_at = Timestamp::now();
    let entry = || async {
        journal(&sim)
            .await
            .into_iter()
            .find(|(u, ..)| *u == uid)
            .map(|(_, e, _)| e)
    };
    let settled = eventually("the entry settled with its due time", || async {
        entry().await.filter(|e| e.get("d").is_some())
    })
    .await;
    let due = settled["d"].as_i64().unwrap();

    // The claim is deleted inside the window: its PV is reclaimed at once (no PV is kept
    // for its window), and the entry stays for the sweep.
    delete_claim(&sim, "data").await;
    eventually("asset reclaimed", || async {
        fake.delete_calls().contains(&pv).then_some(())
    })
    .await;
    let volumes = volumes(&sim);
    eventually("pv deleted", || async {
        volumes.get_opt(&pv).await.ok()?.is_none().then_some(())
    })
    .await;
    // A create sent before the save lands now, and the leader dies.
    fake.add_asset(&pv);
    a.kill().await;
    wait_holder(&sim, "b").await;
    assert!(
        saved_at + window > Timestamp::now(),
        "the test needs the takeover inside the window"
    );
    assert!(entry().await.is_some(), "the settled entry outlives its PV");

    // Not before the window's end...
    let until_due =
        Duration::from_secs(u64::try_from(due - Timestamp::now().as_second()).unwrap_or_default())
            .saturating_sub(Duration::from_millis(700));
    tokio::time::sleep(until_due).await;
    assert!(
        fake.assets().contains(&pv),
        "the sweep waits for the window's end"
    );
    // ...but once it has passed, the standby finds the late asset, saves a PV for it and
    // reclaims it; then the entry goes.
    eventually("the late asset reclaimed by the standby", || async {
        fake.assets().is_empty().then_some(())
    })
    .await;
    assert_eq!(fake.delete_calls(), [pv.clone(), pv.clone()]);
    eventually("the entry removed after the last sweep", || async {
        entry().await.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fake.delete_calls().len(), 2, "swept once, never again");
    b.stop().await.unwrap();
}
