//! A claim whose finalizers were stripped by hand while its provisioning ran, after the
//! controller that ran the provisioning is gone: the owner annotation left on the claim is
//! the one record that an asset may exist, on the claim while it lives (bound to a
//! matching static PV: chaos seed 10282, claim-108), and in the last state the watches
//! saw once it is deleted (chaos seeds 90347, 100578).

use kube_client::api::{Patch, PatchParams};
use provision_controller::{
    annotations::{ANN_PROVISIONING_OWNER, FINALIZER_PROVISIONING},
    testing::{FakeProvisioner, ProvisionStep, pv as pv_of},
};

use super::*;

/// Strips every finalizer of claim `name`, as a user would by hand (the annotations stay).
async fn strip(sim: &KubeSim, name: &str) {
    claims(sim)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}

/// Waits until a PV `pv` was saved for the asset, released and reclaimed (the asset
/// deleted, the PV gone), and checks that no asset is left.
async fn reclaimed(sim: &KubeSim, fake: &FakeProvisioner, pv: &str) {
    eventually(
        &format!("pv {pv} saved, released and reclaimed"),
        || async { fake.delete_calls().iter().any(|n| n == pv).then_some(()) },
    )
    .await;
    let volumes = volumes(sim);
    eventually(&format!("pv {pv} gone"), || async {
        volumes.get_opt(pv).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        fake.assets().is_empty(),
        "asset left behind: {:?}",
        fake.assets()
    );
}

#[tokio::test]
async fn a_claim_stripped_of_its_finalizer_and_bound_elsewhere_after_its_controller_died_leaves_no_asset()
 {
    let sim = sim().await;
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Block]);
    let first = Replica::start(&sim, fake.clone(), config(None), false);
    let pv = create_claim(&sim, "data").await;
    tokio::time::timeout(Duration::from_secs(20), fake.wait_blocked(1))
        .await
        .expect("the driver is called");
    let claim = claims(&sim).get("data").await.unwrap();
    let uid = claim.metadata.uid.clone().unwrap();
    assert!(
        claim
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER_PROVISIONING),
        "intent recorded before the driver call"
    );
    // The user strips every finalizer (the annotations stay), and a matching static PV
    // binds the claim elsewhere.
    strip(&sim, "data").await;
    volumes(&sim)
        .create(
            &PostParams::default(),
            &pv_of("static").claim_ref("default", "data", &uid).build(),
        )
        .await
        .unwrap();
    bound(&sim, "data", "static").await;
    // The controller dies mid-call; the backend finishes the asset anyway.
    first.kill().await;
    fake.wait_blocked(0).await;
    assert!(fake.assets().contains(&pv), "the backend created the asset");
    assert!(
        volumes(&sim).get_opt(&pv).await.unwrap().is_none(),
        "no PV saved"
    );

    let second = Replica::start(&sim, fake.clone(), config(None), false);
    // The PV saved for the asset names a claim bound elsewhere: the PV controller releases
    // it (dynamically provisioned, reclaim policy Delete), and it is reclaimed.
    reclaimed(&sim, &fake, &pv).await;
    let claims = claims(&sim);
    let cleaned = eventually("owner annotation removed", || async {
        let c = claims.get("data").await.ok()?;
        let owner = c
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANN_PROVISIONING_OWNER));
        (!owner).then_some(c)
    })
    .await;
    assert!(
        cleaned
            .metadata
            .finalizers
            .iter()
            .flatten()
            .next()
            .is_none(),
        "no finalizer put back: {:?}",
        cleaned.metadata.finalizers
    );
    bound(&sim, "data", "static").await;
    second.stop().await.unwrap();
}

// Chaos seeds 90347, 100578: a claim's finalizers were stripped and the claim deleted while
// its create ran on the leader; the leader was cut off before it cleaned up, and the copy
// of the claim it kept went with it. The standby's watch saw the claim deleted with the
// owner annotation left: it looks for the asset once it leads, and the asset goes.
#[tokio::test]
async fn a_claim_stripped_and_deleted_while_its_leader_provisioned_is_cleaned_up_by_the_standby() {
    let sim = sim().await;
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::Block]);
    let a = Replica::start(&sim, fake.clone(), config(Some(election("a"))), false);
    wait_holder(&sim, "a").await;
    let b = Replica::start(&sim, fake.clone(), config(Some(election("b"))), false);
    let pv = create_claim(&sim, "data").await;
    tokio::time::timeout(Duration::from_secs(20), fake.wait_blocked(1))
        .await
        .expect("the driver is called");
    // Give the standby's watch time to see the claim with the owner annotation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    strip(&sim, "data").await;
    delete_claim(&sim, "data").await;
    eventually("claim gone", || async {
        claims(&sim)
            .get_opt("data")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The leader dies mid-call; the backend finishes the asset anyway.
    a.kill().await;
    fake.wait_blocked(0).await;
    assert!(fake.assets().contains(&pv), "the backend created the asset");
    wait_holder(&sim, "b").await;

    reclaimed(&sim, &fake, &pv).await;
    b.stop().await.unwrap();
}
