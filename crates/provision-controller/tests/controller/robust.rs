//! Bad input and odd answers: never a panic, a clear event, nothing deleted that should
//! not be.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube_sim::{FaultRule, Verb};
use provision_controller::{
    DeleteError, ProvisionError, ProvisionOptions, Provisioner, events::PROVISIONING_FAILED,
    testing::FakeProvisioner,
};

use crate::{Env, claim, fast_class, quick};

/// A driver that returns its PV without a name.
struct Nameless(FakeProvisioner);

#[async_trait]
impl Provisioner for Nameless {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        let mut volume = self.0.provision(options).await?;
        volume.metadata.name = None;
        Ok(volume)
    }
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        self.0.delete(volume).await
    }
}

#[tokio::test]
async fn a_nameless_volume_from_the_driver_is_saved_under_the_name_it_must_have() {
    let fake = FakeProvisioner::new();
    let driver = Nameless(fake.clone());
    let env = Env::start_driver(quick(), fake, driver, |c| c).await;
    env.create_class(fast_class()).await;
    let uid = env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    assert_eq!(volume.metadata.name, Some(format!("pvc-{uid}")));
    assert_eq!(env.fake.provision_calls().len(), 1);
    assert!(env.fake.delete_calls().is_empty(), "nothing to clean up");

    env.delete_claim("data").await;
    env.volume_gone(&format!("pvc-{uid}")).await;
    assert!(env.fake.assets().is_empty());
    env.stop().await;
}

// Go sends `ProvisioningFailed` "failed to get target node: <err>" for any error but
// NotFound, its context deadline included.
#[tokio::test]
async fn a_selected_node_lookup_that_times_out_is_reported_and_retried() {
    let config = quick().provision_timeout(Some(Duration::from_millis(300)));
    let env = Env::start(config, FakeProvisioner::new()).await;
    env.sim.add_fault(
        FaultRule::new(Verb::Get, "nodes")
            .no_status()
            .latency(Duration::from_secs(2)),
    );
    env.create_scheduled_claim().await;
    let event = env.wait_event("data", PROVISIONING_FAILED).await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("get target node \"node-1\" timed out"),
        "{note}"
    );
    env.bound_volume("data").await;
    assert_eq!(env.fake.provision_calls().len(), 1);
    env.stop().await;
}
