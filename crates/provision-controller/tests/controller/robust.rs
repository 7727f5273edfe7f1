//! Bad input and odd answers: never a panic, a clear event, nothing deleted that should
//! not be.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use provision_controller::{
    DeleteError, ProvisionError, ProvisionOptions, Provisioner, testing::FakeProvisioner,
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
