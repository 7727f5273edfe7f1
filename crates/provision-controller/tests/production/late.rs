//! A PV deleted inside its late-asset window, across a failover: the last sweep of its
//! name is made by the replica that leads when the window ends, whoever deleted it.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube_client::api::{DeleteParams, PostParams};
use provision_controller::testing::{FakeProvisioner, pv};

use crate::{ME, Replica, config, election, eventually, sim, volumes, wait_holder};

/// How often `fake` was handed the PV `name` by `volume_saved`.
fn sweeps(fake: &FakeProvisioner, name: &str) -> usize {
    fake.volume_saved_calls()
        .iter()
        .filter(|v| v.metadata.name.as_deref() == Some(name))
        .count()
}

// Chaos seeds 50035 and 60133: a PV was deleted inside its window, the replica that
// deleted it stopped, and a create of its name landed later; the record of the sweep owed
// at the window's end had gone with that replica. A standby whose watch saw the PV go
// makes that sweep once it leads.
#[tokio::test]
async fn a_pv_deleted_inside_its_window_is_swept_at_its_end_by_the_standby_that_took_over() {
    let sim = sim().await;
    let window = Duration::from_secs(8);
    let a_fake = FakeProvisioner::new().with_late_asset_window(window);
    let a = Replica::start(&sim, a_fake.clone(), config(Some(election("a"))), false);
    wait_holder(&sim, "a").await;
    let b_fake = FakeProvisioner::new().with_late_asset_window(window);
    let b = Replica::start(&sim, b_fake.clone(), config(Some(election("b"))), false);

    // A young PV of ours (no claim: nothing else happens to it); the leader sweeps it at
    // its first sync.
    let name = "pvc-young";
    let created = volumes(&sim)
        .create(&PostParams::default(), &pv(name).provisioned_by(ME).build())
        .await
        .unwrap();
    let created_at = created.metadata.creation_timestamp.as_ref().unwrap().0;
    eventually("the leader's first sweep", || async {
        (sweeps(&a_fake, name) > 0).then_some(())
    })
    .await;
    // Give the standby's watch time to see the PV before it goes.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Deleted by someone else inside its window, then the leader dies: its memory of the
    // owed sweep goes with it.
    volumes(&sim)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let window_end = created_at + window;
    assert!(
        Timestamp::now() < window_end,
        "the test needs the deletion inside the window"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.kill().await;
    wait_holder(&sim, "b").await;
    assert!(
        Timestamp::now() < window_end,
        "the test needs the takeover inside the window"
    );

    // Not before the window's end...
    let before_end = Duration::try_from(window_end.duration_since(Timestamp::now()))
        .unwrap_or_default()
        .saturating_sub(Duration::from_millis(500));
    tokio::time::sleep(before_end).await;
    assert_eq!(
        sweeps(&b_fake, name),
        0,
        "the sweep waits for the window's end"
    );
    // ...but once it has passed.
    eventually("the standby's last sweep of the deleted PV", || async {
        (sweeps(&b_fake, name) > 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sweeps(&b_fake, name), 1, "once, and never again");
    b.stop().await.unwrap();
}
