//! A PV deleted inside its late-asset window, across a failover: the last sweep of its
//! name is made by the replica that leads when the window ends, whoever deleted it.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{api::core::v1::PersistentVolume, jiff::Timestamp};
use kube_client::api::{DeleteParams, PostParams};
use provision_controller::{
    DeleteError, ProvisionError, ProvisionOptions, Provisioner,
    testing::{FakeProvisioner, pv},
};

use crate::{ME, Replica, config, election, eventually, sim, volumes, wait_holder};

/// The fake with a late-asset window, recording every `volume_saved` call (PV name and
/// wall-clock time).
#[derive(Clone)]
struct Windowed {
    fake: FakeProvisioner,
    window: Duration,
    saved: Arc<Mutex<Vec<(String, Timestamp)>>>,
}

impl Windowed {
    fn new(window: Duration) -> Self {
        Self {
            fake: FakeProvisioner::new(),
            window,
            saved: Arc::default(),
        }
    }

    fn calls(&self, name: &str) -> Vec<Timestamp> {
        let saved = self.saved.lock().unwrap();
        saved
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .collect()
    }
}

#[async_trait::async_trait]
impl Provisioner for Windowed {
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
        Some(self.window)
    }
}

// Chaos seeds 50035 and 60133: a PV was deleted inside its window, the replica that
// deleted it stopped, and a create of its name landed later; the record of the sweep owed
// at the window's end had gone with that replica. A standby whose watch saw the PV go
// makes that sweep once it leads.
#[tokio::test]
async fn a_pv_deleted_inside_its_window_is_swept_at_its_end_by_the_standby_that_took_over() {
    let sim = sim().await;
    let window = Duration::from_secs(6);
    let a_driver = Windowed::new(window);
    let a = Replica::start_driver(
        &sim,
        a_driver.fake.clone(),
        a_driver.clone(),
        config(Some(election("a"))),
        false,
    );
    wait_holder(&sim, "a").await;
    let b_driver = Windowed::new(window);
    let b = Replica::start_driver(
        &sim,
        b_driver.fake.clone(),
        b_driver.clone(),
        config(Some(election("b"))),
        false,
    );

    // A young PV of ours (no claim: nothing else happens to it); the leader sweeps it at
    // its first sync.
    let name = "pvc-young";
    let created = volumes(&sim)
        .create(&PostParams::default(), &pv(name).provisioned_by(ME).build())
        .await
        .unwrap();
    let created_at = created.metadata.creation_timestamp.as_ref().unwrap().0;
    eventually("the leader's first sweep", || async {
        (!a_driver.calls(name).is_empty()).then_some(())
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

    let calls = eventually("the standby's last sweep of the deleted PV", || async {
        let calls = b_driver.calls(name);
        (!calls.is_empty()).then_some(calls)
    })
    .await;
    assert!(
        calls[0] >= window_end,
        "the sweep waits for the window's end: {calls:?}, window ends {window_end}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b_driver.calls(name).len(), 1, "once, and never again");
    b.stop().await.unwrap();
}
