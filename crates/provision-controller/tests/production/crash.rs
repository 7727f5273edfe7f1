//! Crash-safe provisioning: a controller stopped while the driver is creating an asset,
//! and a successor that finishes (live claim) or cleans up (deleted claim).

use kube_client::api::{Patch, PatchParams};
use provision_controller::{
    annotations::ANN_STORAGE_PROVISIONER,
    testing::{FakeProvisioner, ProvisionStep, class, pv as pv_of},
};

use super::*;

/// The claim uid of our PV name `pvc-<uid>`.
fn uid_of(pv: &str) -> &str {
    pv.strip_prefix("pvc-").unwrap()
}

/// Whether a claim carries nothing of ours: no finalizer or annotation other than Go's.
fn untouched(claim: &PersistentVolumeClaim) -> bool {
    let ours = |k: &String| {
        k.starts_with("external-provisioner.") || k.contains("rust-storage-controllers")
    };
    !claim.metadata.finalizers.iter().flatten().any(ours)
        && !claim
            .metadata
            .annotations
            .iter()
            .flatten()
            .any(|(k, _)| ours(k))
}

/// A controller that is mid-call in the driver when it is stopped (gracefully with a
/// short grace period, or killed). Returns the fake (the backend) and the PV name.
async fn stopped_mid_provision(sim: &KubeSim, kill: bool) -> (FakeProvisioner, String) {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Block]);
    let first = Replica::start(
        sim,
        fake.clone(),
        config(None).shutdown_grace(Duration::from_millis(200)),
        false,
    );
    let pv = create_claim(sim, "data").await;
    tokio::time::timeout(Duration::from_secs(20), fake.wait_blocked(1))
        .await
        .expect("the driver is called");
    let claim = claims(sim).get("data").await.unwrap();
    assert!(
        untouched(&claim),
        "the claim carries nothing of ours: {:?}",
        claim.metadata
    );
    let journal = journal(sim).await;
    let (_, entry, recorded) = journal
        .iter()
        .find(|(u, ..)| u == uid_of(&pv))
        .expect("intent recorded in the journal before the driver call");
    assert!(entry.get("d").is_none(), "an intent: {entry}");
    assert_eq!(entry["n"], "default/data");
    assert_eq!(entry["v"], pv.as_str());
    let recorded = recorded
        .clone()
        .expect("the class is recorded with the intent");
    assert_eq!(recorded.metadata.name.as_deref(), Some("fast"));
    assert_eq!(recorded.provisioner, ME);
    if kill {
        first.kill().await;
    } else {
        first.stop().await.unwrap();
    }
    fake.wait_blocked(0).await;
    assert!(fake.assets().contains(&pv), "the backend created the asset");
    assert!(
        volumes(sim).get_opt(&pv).await.unwrap().is_none(),
        "no PV saved"
    );
    (fake, pv)
}

async fn deleted_claim_ends_without_asset(kill: bool) {
    let sim = sim().await;
    let (fake, pv) = stopped_mid_provision(&sim, kill).await;
    delete_claim(&sim, "data").await;
    let claims = claims(&sim);
    eventually("claim gone at once, with no controller running", || async {
        claims.get_opt("data").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        has_intent(&sim, uid_of(&pv)).await,
        "the journal keeps what the cleanup needs"
    );

    let second = Replica::start(&sim, fake.clone(), config(None), false);
    // The cleanup saves a PV for the asset; the claim being gone, it is released and
    // reclaimed, and then the PV goes.
    eventually("asset reclaimed", || async {
        fake.assets().is_empty().then_some(())
    })
    .await;
    volume_gone(&sim, &pv).await;
    assert!(
        fake.assets().is_empty(),
        "asset left behind: {:?}",
        fake.assets()
    );
    assert_eq!(fake.delete_calls(), vec![pv.clone()]);
    assert_eq!(
        fake.provision_calls().len(),
        2,
        "the stopped call, then the cleanup's"
    );
    let saved = fake.volume_saved_calls();
    assert_eq!(saved.len(), 1, "the cleanup's save");
    eventually("journal entry gone", || async {
        journal(&sim).await.is_empty().then_some(())
    })
    .await;
    second.stop().await.unwrap();
}

async fn volume_gone(sim: &KubeSim, name: &str) {
    let volumes = volumes(sim);
    eventually(&format!("pv {name} reclaimed"), || async {
        volumes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_claim_deleted_while_its_controller_was_stopped_mid_provision_leaves_no_asset() {
    deleted_claim_ends_without_asset(false).await;
}

#[tokio::test]
async fn a_claim_deleted_while_its_controller_was_killed_mid_provision_leaves_no_asset() {
    deleted_claim_ends_without_asset(true).await;
}

// A matching static PV binds the claim elsewhere while the asset of its unfinished
// provisioning exists: nothing would ever use or delete that asset.
#[tokio::test]
async fn a_claim_bound_to_another_volume_while_its_controller_was_stopped_mid_provision_leaves_no_asset()
 {
    let sim = sim().await;
    let (fake, pv) = stopped_mid_provision(&sim, true).await;
    let uid = claims(&sim)
        .get("data")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    volumes(&sim)
        .create(
            &PostParams::default(),
            &pv_of("static").claim_ref("default", "data", &uid).build(),
        )
        .await
        .unwrap();
    bound(&sim, "data", "static").await;

    let second = Replica::start(&sim, fake.clone(), config(None), false);
    let claims = claims(&sim);
    eventually("finalizer removed", || async {
        (!has_intent(&sim, uid_of(&pv)).await && untouched(&claims.get("data").await.ok()?))
            .then_some(())
    })
    .await;
    // The PV saved for the asset names a claim bound elsewhere: the PV controller
    // releases it (dynamically provisioned, reclaim policy Delete), and it is reclaimed.
    volume_gone(&sim, &pv).await;
    assert!(
        fake.assets().is_empty(),
        "asset left behind: {:?}",
        fake.assets()
    );
    assert_eq!(fake.delete_calls(), vec![pv.clone()]);
    bound(&sim, "data", "static").await;
    second.stop().await.unwrap();
}

// The claim's class was re-created for another provisioner (which the claim then names):
// the claim is still ours to clean up, since it carries our finalizer. The cleanup saves
// a PV for the asset, which the live, unbound claim then gets: a real volume, no leak.
#[tokio::test]
async fn a_claim_that_asks_another_provisioner_after_its_controller_was_stopped_mid_provision_gets_the_asset()
 {
    let sim = sim().await;
    let (fake, pv) = stopped_mid_provision(&sim, true).await;
    let classes: Api<StorageClass> = Api::all(sim.client());
    classes
        .delete("fast", &DeleteParams::default())
        .await
        .unwrap();
    classes
        .create(
            &PostParams::default(),
            &class("fast").provisioner("example.com/other").build(),
        )
        .await
        .unwrap();
    let other = serde_json::json!({"metadata": {"annotations": {
        ANN_STORAGE_PROVISIONER: "example.com/other",
        "volume.beta.kubernetes.io/storage-provisioner": "example.com/other",
    }}});
    claims(&sim)
        .patch("data", &PatchParams::default(), &Patch::Merge(&other))
        .await
        .unwrap();

    let second = Replica::start(&sim, fake.clone(), config(None), false);
    let claims = claims(&sim);
    eventually("finalizer removed", || async {
        (!has_intent(&sim, uid_of(&pv)).await && untouched(&claims.get("data").await.ok()?))
            .then_some(())
    })
    .await;
    bound(&sim, "data", &pv).await;
    assert_eq!(fake.assets().into_iter().collect::<Vec<_>>(), [pv]);
    assert!(fake.delete_calls().is_empty());
    second.stop().await.unwrap();
}

// The class was deleted while the controller was stopped: the next one finishes the
// claim with the class recorded on it when the provisioning started.
#[tokio::test]
async fn a_claim_whose_class_was_deleted_while_its_controller_was_stopped_is_finished_with_the_recorded_class()
 {
    let sim = sim().await;
    let (fake, pv) = stopped_mid_provision(&sim, true).await;
    Api::<StorageClass>::all(sim.client())
        .delete("fast", &DeleteParams::default())
        .await
        .unwrap();
    let second = Replica::start(&sim, fake.clone(), config(None), false);
    bound(&sim, "data", &pv).await;
    let claims = claims(&sim);
    eventually("intent settled", || async {
        let c = claims.get("data").await.ok()?;
        (untouched(&c) && !has_intent(&sim, uid_of(&pv)).await).then_some(())
    })
    .await;
    let calls = fake.provision_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].storage_class.provisioner, ME);
    assert_eq!(fake.assets().into_iter().collect::<Vec<_>>(), [pv]);
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_claim_deleted_with_its_class_while_its_controller_was_stopped_leaves_no_asset() {
    let sim = sim().await;
    let (fake, pv) = stopped_mid_provision(&sim, true).await;
    Api::<StorageClass>::all(sim.client())
        .delete("fast", &DeleteParams::default())
        .await
        .unwrap();
    delete_claim(&sim, "data").await;
    let second = Replica::start(&sim, fake.clone(), config(None), false);
    let claims = claims(&sim);
    eventually("claim gone", || async {
        claims.get_opt("data").await.ok()?.is_none().then_some(())
    })
    .await;
    volume_gone(&sim, &pv).await;
    assert!(fake.assets().is_empty(), "{:?}", fake.assets());
    assert_eq!(fake.delete_calls(), [pv]);
    second.stop().await.unwrap();
}

/// A driver whose `delete` lets another replica's PV for the same asset land right
/// before it runs (the race of a cleanup that deleted after a 404), and that records
/// every delete of an asset a PV names that is not Released.
struct RacingReplica {
    fake: FakeProvisioner,
    client: kube_client::Client,
    landed: std::sync::atomic::AtomicBool,
    violations: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl provision_controller::Provisioner for RacingReplica {
    async fn provision(
        &self,
        options: &provision_controller::ProvisionOptions,
    ) -> Result<PersistentVolume, provision_controller::ProvisionError> {
        self.fake.provision(options).await
    }

    async fn delete(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(), provision_controller::DeleteError> {
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let name = volume.metadata.name.clone().unwrap_or_default();
        if !self.landed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let mut other = volume.clone();
            other.metadata.resource_version = None;
            other.metadata.uid = None;
            other.status = None;
            // AlreadyExists when a PV records the asset already: nothing to race with.
            let _ = volumes.create(&PostParams::default(), &other).await;
        }
        let phase = volumes
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .and_then(|v| v.status?.phase);
        if let Some(phase) = phase.filter(|p| p != "Released") {
            self.violations.lock().unwrap().push(format!(
                "deleted the asset of {name} while its PV was {phase}"
            ));
        }
        self.fake.delete(volume).await
    }
}

// Cleanup by saving: a replica that saves a PV for the asset while the cleanup runs can
// never end with a PV whose asset was deleted. The PV name is the one arbiter.
#[tokio::test]
async fn a_cleanup_never_deletes_an_asset_another_replica_saves_a_pv_for() {
    let sim = sim().await;
    let (fake, pv) = stopped_mid_provision(&sim, true).await;
    delete_claim(&sim, "data").await;
    let driver = std::sync::Arc::new(RacingReplica {
        fake: fake.clone(),
        client: sim.client(),
        landed: std::sync::atomic::AtomicBool::new(false),
        violations: std::sync::Mutex::default(),
    });
    let second = Replica::start_driver(
        &sim,
        fake.clone(),
        std::sync::Arc::clone(&driver),
        config(None),
        false,
    );
    let claims = claims(&sim);
    eventually("claim gone", || async {
        claims.get_opt("data").await.ok()?.is_none().then_some(())
    })
    .await;
    volume_gone(&sim, &pv).await;
    assert_eq!(*driver.violations.lock().unwrap(), Vec::<String>::new());
    assert!(fake.assets().is_empty(), "{:?}", fake.assets());
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_live_claim_is_finished_by_the_next_controller() {
    let sim = sim().await;
    let (fake, pv) = stopped_mid_provision(&sim, true).await;
    let second = Replica::start(&sim, fake.clone(), config(None), false);
    bound(&sim, "data", &pv).await;
    let claims = claims(&sim);
    eventually("finalizer removed", || async {
        (!has_intent(&sim, uid_of(&pv)).await && untouched(&claims.get("data").await.ok()?))
            .then_some(())
    })
    .await;
    assert_eq!(fake.assets().len(), 1, "one asset, found again by name");
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_graceful_shutdown_lets_the_operation_in_flight_finish_then_releases_the_lease() {
    let sim = sim().await;
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Block]);
    let replica = Replica::start(&sim, fake.clone(), config(Some(election("a"))), false);
    wait_holder(&sim, "a").await;
    let pv = create_claim(&sim, "data").await;
    tokio::time::timeout(Duration::from_secs(20), fake.wait_blocked(1))
        .await
        .expect("the driver is called");

    let stopping = tokio::spawn(replica.stop());
    tokio::time::sleep(RETRY * 2).await;
    assert!(
        !stopping.is_finished(),
        "run waits for the operation in flight"
    );
    assert_eq!(
        lease_holder(&sim.client()).await.as_deref(),
        Some("a"),
        "the lease is kept while draining"
    );
    fake.unblock();
    stopping.await.unwrap().expect("a clean stop");

    bound(&sim, "data", &pv).await;
    assert!(untouched(&claims(&sim).get("data").await.unwrap()));
    assert_eq!(
        lease_holder(&sim.client()).await,
        None,
        "released after the drain"
    );
    assert!(fake.delete_calls().is_empty());
}
