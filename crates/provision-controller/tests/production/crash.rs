//! Crash-safe provisioning: a controller stopped while the driver is creating an asset,
//! and a successor that finishes (live claim) or cleans up (deleted claim).

use kube_client::api::{Patch, PatchParams};
use provision_controller::{
    annotations::{ANN_BETA_STORAGE_PROVISIONER, ANN_STORAGE_PROVISIONER, FINALIZER_PROVISIONING},
    testing::{FakeProvisioner, ProvisionStep, class, pv as pv_of},
};

use super::*;

fn has_intent(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER_PROVISIONING)
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
    assert!(has_intent(&claim), "intent recorded before the driver call");
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
    let claim = claims(&sim).get("data").await.unwrap();
    assert!(
        claim.metadata.deletion_timestamp.is_some() && has_intent(&claim),
        "the finalizer keeps the deleted claim until its asset is dealt with"
    );

    let second = Replica::start(&sim, fake.clone(), config(None), false);
    let claims = claims(&sim);
    eventually("claim gone", || async {
        claims.get_opt("data").await.ok()?.is_none().then_some(())
    })
    .await;
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
    assert!(volumes(&sim).get_opt(&pv).await.unwrap().is_none());
    second.stop().await.unwrap();
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
        (!has_intent(&claims.get("data").await.ok()?)).then_some(())
    })
    .await;
    assert!(
        fake.assets().is_empty(),
        "asset left behind: {:?}",
        fake.assets()
    );
    assert_eq!(fake.delete_calls(), vec![pv.clone()]);
    assert!(volumes(&sim).get_opt(&pv).await.unwrap().is_none());
    bound(&sim, "data", "static").await;
    second.stop().await.unwrap();
}

// The claim's class was re-created for another provisioner (which the claim then names):
// the claim is still ours to clean up, since it carries our finalizer.
#[tokio::test]
async fn a_claim_that_asks_another_provisioner_after_its_controller_was_stopped_mid_provision_leaves_no_asset()
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
        ANN_BETA_STORAGE_PROVISIONER: "example.com/other",
    }}});
    claims(&sim)
        .patch("data", &PatchParams::default(), &Patch::Merge(&other))
        .await
        .unwrap();

    let second = Replica::start(&sim, fake.clone(), config(None), false);
    let claims = claims(&sim);
    eventually("finalizer removed", || async {
        (!has_intent(&claims.get("data").await.ok()?)).then_some(())
    })
    .await;
    assert!(
        fake.assets().is_empty(),
        "asset left behind: {:?}",
        fake.assets()
    );
    assert_eq!(fake.delete_calls(), vec![pv.clone()]);
    assert!(volumes(&sim).get_opt(&pv).await.unwrap().is_none());
    let data = claims.get("data").await.unwrap();
    assert!(
        data.metadata.deletion_timestamp.is_none() && data.spec.unwrap().volume_name.is_none(),
        "the claim waits for the other provisioner"
    );
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
        (!has_intent(&claims.get("data").await.ok()?)).then_some(())
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
    assert!(!has_intent(&claims(&sim).get("data").await.unwrap()));
    assert_eq!(
        lease_holder(&sim.client()).await,
        None,
        "released after the drain"
    );
    assert!(fake.delete_calls().is_empty());
}
