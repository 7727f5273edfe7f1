//! The cost of crash-safe provisioning: no write of the claim, and journal writes shared
//! by the claims of a batch.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::api::ListParams;
use provision_controller::testing::FakeProvisioner;

use crate::{Env, claim, eventually, fast_class, quiet};

const KEEP: &str = "example.com/keep";

/// The claim `name` once it is Bound, read by a list (the test must not GET the claim
/// itself: it counts the controller's requests).
async fn bound(env: &Env, name: &str) -> PersistentVolumeClaim {
    eventually(&format!("claim {name} bound"), || async {
        let listed = env.claims().list(&ListParams::default()).await.ok()?;
        let c = listed
            .items
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))?;
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await
}

/// Provisions `n` claims (one carries another finalizer) and returns the controller's
/// requests on claims and on ConfigMaps (the journal).
async fn requests(
    crash_safe: bool,
    n: usize,
) -> (Vec<kube_sim::RequestRecord>, Vec<kube_sim::RequestRecord>) {
    let config = quiet().crash_safe_provisioning(crash_safe);
    let env = Env::start(config, FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    let mut data = claim("data");
    data.metadata.finalizers = Some(vec![KEEP.to_owned()]);
    env.create_claim(data).await;
    for i in 1..n {
        env.create_claim(claim(&format!("data-{i}"))).await;
    }
    let first = bound(&env, "data").await;
    for i in 1..n {
        bound(&env, &format!("data-{i}")).await;
    }
    assert_eq!(
        crate::own_finalizers(first.metadata.finalizers.as_ref()),
        [KEEP],
        "others' finalizers are kept, and none of ours is added"
    );
    assert_eq!(env.fake.provision_calls().len(), n);
    // The settles and removals are written lazily: wait for the journal to empty.
    if crash_safe {
        eventually("journal emptied", || async {
            let maps: kube_client::Api<k8s_openapi::api::core::v1::ConfigMap> =
                kube_client::Api::all(env.sim.client());
            let list = maps
                .list(
                    &ListParams::default().labels(provision_controller::annotations::JOURNAL_LABEL),
                )
                .await
                .ok()?;
            list.items.is_empty().then_some(())
        })
        .await;
    }
    let all = env.sim.requests();
    let claims = all
        .iter()
        .filter(|r| r.path.ends_with("/persistentvolumeclaims/data"))
        .cloned()
        .collect();
    let journal = all
        .iter()
        .filter(|r| r.path.contains("/configmaps") && r.verb != "list" && r.verb != "watch")
        .cloned()
        .collect();
    env.stop().await;
    (claims, journal)
}

#[tokio::test]
async fn crash_safety_writes_no_claim_and_shares_journal_writes() {
    let (without, none) = requests(false, 1).await;
    assert!(none.is_empty(), "no journal without crash safety: {none:?}");
    let (with, journal) = requests(true, 8).await;
    let count = |list: &[kube_sim::RequestRecord], verb: &str| {
        list.iter().filter(|r| r.verb == verb).count()
    };
    assert_eq!(count(&with, "get"), 0, "the cache answers: {with:?}");
    assert_eq!(
        count(&with, "patch"),
        count(&without, "patch"),
        "the claim is not written: {with:?}"
    );
    // One create (the intents, shared), one delete (the last removals); at most one
    // write per claim even with no other claim to share with.
    assert!(!journal.is_empty(), "the journal was written");
    assert!(
        journal.len() <= 8,
        "{} journal writes for 8 claims: {journal:?}",
        journal.len()
    );
}

// A group of intents is written once half the claim workers wait on it, not after the
// commit delay: with one sync worker every intent goes at once, so a commit delay of a
// minute does not hold a claim back for a minute.
#[tokio::test]
async fn a_full_group_of_intents_is_written_without_waiting_for_the_commit_delay() {
    let config = quiet()
        .journal_commit_delay(std::time::Duration::from_secs(60))
        .sync_workers(std::num::NonZeroU16::MIN);
    let env = Env::start(config, FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    // `eventually` gives up long before the minute.
    bound(&env, "data").await;
    assert_eq!(env.fake.provision_calls().len(), 1);
    env.stop().await;
}
