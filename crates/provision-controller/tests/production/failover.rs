//! Two replicas on one lease: only the leader provisions; a killed leader is replaced
//! within the lease duration; a graceful shutdown hands over at once; a lost lease ends
//! `run` with an error instead of exiting.

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use provision_controller::{Error, testing::FakeProvisioner};
use tokio::time::Instant;

use super::*;

#[tokio::test]
async fn of_two_replicas_on_one_lease_only_the_leader_provisions() {
    let sim = sim().await;
    let a = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("a"))),
        true,
    );
    wait_holder(&sim, "a").await;
    let b = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("b"))),
        true,
    );

    let mut pvs = Vec::new();
    for i in 0..3 {
        pvs.push(create_claim(&sim, &format!("claim-{i}")).await);
    }
    for (i, pv) in pvs.iter().enumerate() {
        bound(&sim, &format!("claim-{i}"), pv).await;
    }
    // The standby serves probes and metrics too: ready, and not the leader.
    eventually("standby ready", || async {
        (b.get("/readyz").await? == (200, "ok".into())).then_some(())
    })
    .await;
    let (_, b_metrics) = b.get("/metrics").await.unwrap();
    assert!(
        b_metrics.lines().any(|l| l == "controller_leader 0"),
        "{b_metrics}"
    );
    let (_, a_metrics) = a.get("/metrics").await.unwrap();
    assert!(
        a_metrics.lines().any(|l| l == "controller_leader 1"),
        "{a_metrics}"
    );

    assert_eq!(a.fake.provision_calls().len(), 3);
    assert!(
        b.fake.provision_calls().is_empty(),
        "the standby never provisions"
    );
    assert_eq!(lease_holder(&sim.client()).await.as_deref(), Some("a"));
    // Once saved, the PVs hold the assets: the journal keeps no intent (and, the fake
    // having no late-asset window, no entry at all).
    eventually("journal emptied", || async {
        journal(&sim).await.is_empty().then_some(())
    })
    .await;
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test]
async fn a_killed_leader_is_replaced_within_the_lease_duration_and_every_claim_is_bound_once() {
    let sim = sim().await;
    let a = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("a"))),
        false,
    );
    wait_holder(&sim, "a").await;
    let b = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("b"))),
        false,
    );
    let mut claims = Vec::new();
    for i in 0..2 {
        let name = format!("before-{i}");
        let pv = create_claim(&sim, &name).await;
        bound(&sim, &name, &pv).await;
        claims.push((name, pv));
    }
    let a_fake = a.fake.clone();

    let killed = Instant::now();
    a.kill().await;
    for i in 0..2 {
        let name = format!("after-{i}");
        let pv = create_claim(&sim, &name).await;
        claims.push((name, pv));
    }
    wait_holder(&sim, "b").await;
    let handover = killed.elapsed();
    eprintln!("handover after a killed leader: {handover:?}");
    // b takes over one lease duration after it last saw a's renewal, plus its polling.
    assert!(
        handover < LEASE + RETRY * 5,
        "handover took {handover:?}, lease duration is {LEASE:?}"
    );
    for (name, pv) in &claims {
        bound(&sim, name, pv).await;
    }

    // Exactly one successful provision call per claim, across both replicas.
    let calls: Vec<String> = a_fake
        .provision_calls()
        .into_iter()
        .chain(b.fake.provision_calls())
        .map(|o| o.pv_name)
        .collect();
    let unique: BTreeSet<_> = calls.iter().cloned().collect();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(unique.len(), 4, "{calls:?}");
    assert_eq!(
        b.fake.provision_calls().len(),
        2,
        "b provisions only the new claims"
    );
    let assets: BTreeSet<_> = a_fake.assets().union(&b.fake.assets()).cloned().collect();
    assert_eq!(assets, claims.iter().map(|(_, pv)| pv.clone()).collect());
    b.stop().await.unwrap();
}

#[tokio::test]
async fn a_graceful_shutdown_releases_the_lease_and_the_standby_takes_over_at_once() {
    let sim = sim().await;
    let a = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("a"))),
        false,
    );
    wait_holder(&sim, "a").await;
    let b = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("b"))),
        true,
    );
    eventually("standby ready", || async {
        (b.get("/readyz").await? == (200, "ok".into())).then_some(())
    })
    .await;

    let stopping = Instant::now();
    a.stop().await.expect("a graceful stop is not an error");
    let stopped = stopping.elapsed();
    wait_holder(&sim, "b").await;
    let handover = stopping.elapsed();
    eprintln!("graceful handover: run returned after {stopped:?}, b leads after {handover:?}");
    assert!(
        handover < LEASE / 2 + RETRY * 2,
        "handover took {handover:?}; without the release it would take about {LEASE:?}"
    );
    let pv = create_claim(&sim, "after").await;
    bound(&sim, "after", &pv).await;
    assert_eq!(b.fake.provision_calls().len(), 1);
    b.stop().await.unwrap();
}

#[tokio::test]
async fn a_lost_lease_stops_the_workers_and_run_returns_an_error() {
    let sim = sim().await;
    let a = Replica::start(
        &sim,
        FakeProvisioner::new(),
        config(Some(election("a"))),
        false,
    );
    wait_holder(&sim, "a").await;
    let fake = a.fake.clone();
    // Another party takes the lease over (as after a long pause of this replica).
    let patch =
        serde_json::json!({"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 60}});
    Api::<Lease>::namespaced(sim.client(), "default")
        .patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let result = a.finished().await;
    assert!(
        matches!(result, Err(Error::LeadershipLost(_))),
        "run must report the loss, got {result:?}"
    );
    // Nothing runs any more: a new claim is not provisioned by the old leader.
    create_claim(&sim, "orphan").await;
    tokio::time::sleep(RETRY * 3).await;
    assert!(fake.provision_calls().is_empty());
    assert_eq!(
        lease_holder(&sim.client()).await.as_deref(),
        Some("intruder")
    );
}

#[tokio::test]
async fn a_lease_lost_while_draining_ends_the_drain_at_once_and_is_not_released() {
    let sim = sim().await;
    let fake = FakeProvisioner::new()
        .script_provision([provision_controller::testing::ProvisionStep::Block]);
    let replica = Replica::start(&sim, fake.clone(), config(Some(election("a"))), false);
    wait_holder(&sim, "a").await;
    create_claim(&sim, "data").await;
    tokio::time::timeout(std::time::Duration::from_secs(20), fake.wait_blocked(1))
        .await
        .expect("the driver is called");

    // A graceful stop waits for the blocked operation (up to the 30 s grace)...
    let stopping = tokio::spawn(replica.stop());
    tokio::time::sleep(RETRY * 2).await;
    assert!(
        !stopping.is_finished(),
        "run drains the operation in flight"
    );
    // ...until another party takes the lease over: then the drain ends at once.
    let patch =
        serde_json::json!({"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 60}});
    Api::<Lease>::namespaced(sim.client(), "default")
        .patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let started = Instant::now();
    let result = stopping.await.unwrap();
    assert!(
        matches!(result, Err(Error::LeadershipLost(_))),
        "run must report the loss, got {result:?}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "the drain ended long before its 30 s grace: {:?}",
        started.elapsed()
    );
    // The lease is someone else's now: it must not be released (overwritten) by us.
    assert_eq!(
        lease_holder(&sim.client()).await.as_deref(),
        Some("intruder")
    );
    fake.unblock();
}

// Go renews the lease on the workers' client (and its QPS limit). Here the client the
// caller passes allows one request at a time, and a PV create holds that slot for three
// lease durations: the renewals, on the leader-election client, keep the lease.
#[tokio::test]
async fn renewals_on_the_leader_election_client_keep_the_lease_while_the_main_client_is_busy() {
    let sim = sim().await;
    let fake = FakeProvisioner::new();
    let main = kube_controller_kit::client::InFlightLimit::new(std::num::NonZeroUsize::MIN)
        .wrap(sim.client());
    let kube_config = kube_client::Config::new(sim.url().parse().unwrap());
    let controller = ProvisionController::new(main, ME, fake.clone())
        .asset_lookup(fake.clone())
        .late_assets(fake.clone())
        .config(config(Some(election("a"))))
        .leader_election_client(client::for_leader_election(&kube_config).unwrap());
    let (stop, stopped) = oneshot::channel();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    wait_holder(&sim, "a").await;
    sim.add_fault(
        kube_sim::FaultRule::new(kube_sim::Verb::Create, "persistentvolumes")
            .no_status()
            .latency(LEASE * 3)
            .always(),
    );
    create_claim(&sim, "slow").await;
    eventually("the driver is called", || async {
        (!fake.provision_calls().is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(LEASE * 2).await;
    assert!(!run.is_finished(), "run ended: the lease was lost");
    assert_eq!(lease_holder(&sim.client()).await.as_deref(), Some("a"));
    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("run returns after shutdown")
        .expect("run does not panic");
    assert!(result.is_ok(), "{result:?}");
}
