//! A controller whose leader-election namespace (`POD_NAMESPACE`) does not exist: its
//! readiness names the namespace and what to do, and once the namespace is created it
//! leads and provisions.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube_client::Api;
use provision_controller::testing::{DriverTest, FakeProvisioner, pvc};
use provision_controller::{Config, Health, LeaderElection, ProvisionController};

const NAME: &str = "example.com/my-driver";

#[tokio::test]
async fn readyz_names_the_missing_namespace_and_the_controller_leads_once_it_exists() {
    let health = Health::new();
    let probe = health.clone();
    let election = LeaderElection::for_provisioner(NAME, "not-created-yet")
        .unwrap()
        .timings(
            Duration::from_secs(2),
            Duration::from_secs(1),
            Duration::from_millis(100),
        )
        .unwrap();
    let test = DriverTest::start_controller(NAME, move |client| {
        ProvisionController::new(client, NAME, FakeProvisioner::new())
            .config(Config::default().leader_election(Some(election)))
            .health(health)
    })
    .await
    .unwrap()
    .limit(Duration::from_secs(20));

    let blocked = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Err(why) = probe.readiness()
                && why.starts_with("leader election:")
            {
                return why;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("readiness never named the missing namespace");
    assert_eq!(
        blocked,
        "leader election: namespace \"not-created-yet\" does not exist; create it, or set \
         the leader-election namespace (POD_NAMESPACE) to one that exists"
    );
    assert!(!probe.is_leading(), "a standby");

    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "not-created-yet"}
    }))
    .unwrap();
    Api::<Namespace>::all(test.client())
        .create(&Default::default(), &namespace)
        .await
        .unwrap();
    test.provision(pvc("data")).await.unwrap();
    assert!(probe.is_leading());
    assert_eq!(probe.readiness(), Ok(()));
    test.stop().await.unwrap();
}
