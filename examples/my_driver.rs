//! A storage driver on provision-controller: each volume is a directory under a root
//! folder, exposed as a hostPath PersistentVolume. Replace the directory with your
//! backend's disk; everything else stays as it is.

use std::{io::ErrorKind, io::IsTerminal, path::Path, path::PathBuf};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{HostPathVolumeSource, PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provision_controller::{
    Config, DeleteError, ProvisionController, ProvisionError, ProvisionOptions, Provisioner,
};
use tracing_subscriber::EnvFilter;

/// The name StorageClasses give as their `provisioner`.
const NAME: &str = "example.com/my-driver";

struct MyDriver {
    root: PathBuf,
}

#[async_trait]
impl Provisioner for MyDriver {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        // `pv_name` is the same at every call for a claim: create the disk idempotently.
        let path = self.root.join(&options.pv_name);
        tokio::fs::create_dir_all(&path)
            .await
            .map_err(ProvisionError::failed)?;
        let claim = options.claim.spec.clone().unwrap_or_default();
        let requests = claim.resources.and_then(|r| r.requests).unwrap_or_default();
        let reclaim = options.storage_class.reclaim_policy.clone();
        Ok(PersistentVolume {
            metadata: ObjectMeta {
                name: Some(options.pv_name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                // The API server requires a capacity, access modes and one volume source.
                capacity: Some(
                    requests
                        .into_iter()
                        .filter(|(k, _)| k == "storage")
                        .collect(),
                ),
                access_modes: claim.access_modes,
                volume_mode: claim.volume_mode,
                // The class's policy; a PV without one would be kept forever (Retain).
                persistent_volume_reclaim_policy: Some(reclaim.unwrap_or_else(|| "Delete".into())),
                mount_options: options.storage_class.mount_options.clone(),
                host_path: Some(HostPathVolumeSource {
                    path: path.display().to_string(),
                    type_: Some("Directory".into()),
                }),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        })
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let source = volume.spec.as_ref().and_then(|s| s.host_path.as_ref());
        let Some(path) = source
            .map(|s| Path::new(&s.path))
            .filter(|p| p.starts_with(&self.root))
        else {
            return Err(DeleteError::Ignored {
                reason: "not one of our directories".into(),
            });
        };
        match tokio::fs::remove_dir_all(path).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(DeleteError::Failed(e.into())),
            _ => Ok(()), // deleted, or already gone
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Logs on stderr, coloured only on a terminal, filtered by RUST_LOG (default: info).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let stderr_is_terminal = std::io::stderr().is_terminal();
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr);
    logs.with_ansi(stderr_is_terminal)
        .with_env_filter(filter)
        .init();
    // The binary reads the environment; the library never does.
    let root = std::env::var("MY_DRIVER_ROOT").unwrap_or_else(|_| "/var/lib/my-driver".into());
    // KUBECONFIG, else ~/.kube/config, else the pod's service account. The client speaks
    // TLS (rustls) and HTTP/2 (one connection for every request and watch).
    let (client, kube_config) = provision_controller::client::infer().await?;
    if let Err(error) = client.apiserver_version().await {
        let url = &kube_config.cluster_url;
        return Err(format!("cannot reach the API server at {url}: {error}").into());
    }
    // Leader election is on by default: the Lease in POD_NAMESPACE, else in the client's
    // namespace. Metrics, /healthz and /readyz on port 8080.
    let config = Config::from_lookup(|key| std::env::var(key).ok())?.metrics_port(8080);
    // SIGTERM (the kubelet stopping the pod) or SIGINT (Ctrl-C) starts a graceful stop:
    // operations in flight finish, then the lease is released.
    let shutdown = provision_controller::shutdown_signal()?;
    ProvisionController::new(client, NAME, MyDriver { root: root.into() })
        .config(config)
        // Lease renewals on a client of their own, so they never wait behind provisioning.
        .leader_election_client(provision_controller::client::for_leader_election(
            &kube_config,
        )?)
        .run(async move {
            shutdown.await;
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use provision_controller::testing::{DriverTest, conformance::Conformance, pvc};

    /// The driver, with a root folder of its own for each test.
    fn driver(test: &str) -> MyDriver {
        let root = std::env::temp_dir().join(format!("my-driver-{}-{test}", std::process::id()));
        MyDriver { root }
    }

    #[tokio::test]
    async fn a_claim_binds_and_its_directory_goes_with_it() -> Result<(), Box<dyn std::error::Error>>
    {
        let test = DriverTest::start(NAME, driver("binds")).await?;
        let volume = test.provision(pvc("data").request("2Gi")).await?;
        let path = volume
            .spec
            .and_then(|s| s.host_path)
            .map(|h| h.path)
            .unwrap_or_default();
        assert!(Path::new(&path).is_dir(), "{path} is not a directory");
        test.delete(&pvc("data").build()).await?;
        assert!(!Path::new(&path).exists(), "{path} is still there");
        Ok(test.stop().await?)
    }

    #[tokio::test]
    async fn the_driver_keeps_the_provisioner_contract() {
        Conformance::new(NAME)
            .check(&driver("conformance"))
            .await
            .assert_conforms();
    }
}
