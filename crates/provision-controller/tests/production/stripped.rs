//! A claim whose finalizers were stripped by hand while its provisioning ran, then bound
//! to a matching static PV, after the controller that ran the provisioning is gone: the
//! owner annotation left on the claim is the one record that an asset may exist (chaos
//! seed 10282, claim-108).

use kube_client::api::{Patch, PatchParams};
use provision_controller::{
    annotations::{ANN_PROVISIONING_OWNER, FINALIZER_PROVISIONING},
    testing::{FakeProvisioner, ProvisionStep, pv as pv_of},
};

use super::*;

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
    claims(&sim)
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
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
    eventually(
        &format!("pv {pv} saved, released and reclaimed"),
        || async { fake.delete_calls().contains(&pv).then_some(()) },
    )
    .await;
    let volumes = volumes(&sim);
    eventually(&format!("pv {pv} gone"), || async {
        volumes.get_opt(&pv).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        fake.assets().is_empty(),
        "asset left behind: {:?}",
        fake.assets()
    );
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
