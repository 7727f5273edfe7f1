//! The driver's own metrics next to the controller's, on one registry that `/metrics`
//! serves (docs/production.md quotes this file; `cargo test` builds it).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use prometheus_client::{metrics::counter::Counter, registry::Registry};
use provision_controller::{
    Config, DeleteError, ProvisionController, ProvisionError, ProvisionOptions, Provisioner,
};

/// A driver that counts its backend calls (it has no backend: it refuses every claim).
struct Counted {
    backend_calls: Counter,
}

#[async_trait]
impl Provisioner for Counted {
    async fn provision(&self, _: &ProvisionOptions) -> Result<PersistentVolume, ProvisionError> {
        self.backend_calls.inc();
        Err(ProvisionError::infeasible("this example has no backend"))
    }

    async fn delete(&self, _: &PersistentVolume) -> Result<(), DeleteError> {
        self.backend_calls.inc();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Arc::new(Mutex::new(Registry::default()));
    let backend_calls = Counter::default();
    let help = "Calls to the storage backend";
    {
        let mut shared = registry.lock().map_err(|_| "registry lock poisoned")?;
        shared.register("driver_backend_calls", help, backend_calls.clone());
    }
    let (client, _) = provision_controller::client::infer().await?;
    let shutdown = provision_controller::shutdown_signal()?;
    ProvisionController::new(client, "example.com/my-driver", Counted { backend_calls })
        .config(Config::default().metrics_port(8080))
        // /metrics serves driver_backend_calls_total and the controller's metrics.
        .metrics_registry(registry)
        .run(async move {
            shutdown.await;
        })
        .await?;
    Ok(())
}
