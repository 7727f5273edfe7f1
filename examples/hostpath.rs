//! A minimal storage driver: every volume is a directory under a base path.
//!
//! ```text
//! cargo run --example hostpath [BASE_PATH]
//! ```
//!
//! With `KUBECONFIG` set, or inside a pod, it talks to that cluster; otherwise it starts an
//! in-process API server (kube-sim) with its PV binder. Either way it creates a
//! StorageClass and a claim, waits until the claim is Bound, prints the volume, deletes
//! the claim, waits until the directory and the PV are gone, and exits.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use async_trait::async_trait;
use k8s_openapi::api::{
    core::v1::{
        HostPathVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    },
    storage::v1::StorageClass,
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use provision_controller::{
    Config, DeleteError, ProvisionController, ProvisionError, ProvisionOptions, Provisioner,
    testing::{class, pvc},
};

const NAME: &str = "example.com/hostpath";

/// The driver: `provision` makes a directory, `delete` removes it.
struct HostPath {
    base: PathBuf,
}

#[async_trait]
impl Provisioner for HostPath {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        // The PV name is stable for a claim, so creating the directory twice is harmless.
        let path = self.base.join(&options.pv_name);
        tokio::fs::create_dir_all(&path)
            .await
            .map_err(ProvisionError::final_)?;

        let claim = options.claim.spec.clone().unwrap_or_default();
        let mut volume = PersistentVolume::default();
        volume.metadata.name = Some(options.pv_name.clone());
        volume.spec = Some(PersistentVolumeSpec {
            capacity: claim.resources.and_then(|r| r.requests),
            access_modes: claim.access_modes,
            persistent_volume_reclaim_policy: options.storage_class.reclaim_policy.clone(),
            host_path: Some(HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some("Directory".into()),
            }),
            ..PersistentVolumeSpec::default()
        });
        Ok(volume)
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let Some(source) = volume.spec.as_ref().and_then(|s| s.host_path.as_ref()) else {
            return Err(DeleteError::Ignored {
                reason: "not a host-path volume".into(),
            });
        };
        match tokio::fs::remove_dir_all(&source.path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(DeleteError::Failed(e.into()))
            }
            _ => Ok(()),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_sim=warn".into()),
        )
        .init();
    let base = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join(format!("hostpath-{}", std::process::id())),
        PathBuf::from,
    );

    // A real cluster when one is configured, else an in-process one.
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let (client, _sim) = if in_cluster || std::env::var_os("KUBECONFIG").is_some() {
        (
            Client::try_default()
                .await
                .context("connecting to the cluster")?,
            None,
        )
    } else {
        println!("no cluster configured: starting kube-sim");
        let sim = kube_sim::KubeSim::builder().pv_binder(true).start().await?;
        (sim.client(), Some(sim))
    };

    // A class for this driver.
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &class("hostpath").provisioner(NAME).build(),
        )
        .await?;

    // Run the controller until the demo is over.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = Config::default().leader_election(None);
    let controller =
        ProvisionController::new(client.clone(), NAME, HostPath { base: base.clone() })
            .with_config(config)
            .run(async {
                let _ = stopped.await;
            });
    let controller = tokio::spawn(controller);

    // A claim of that class.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = pvc("hostpath-demo")
        .storage_class("hostpath")
        .request("1Gi")
        .build();
    claims.create(&PostParams::default(), &claim).await?;

    let volume_name = wait_for("the claim to be bound", || async {
        let claim = claims.get("hostpath-demo").await.ok()?;
        let bound = claim.status?.phase.as_deref() == Some("Bound");
        bound.then_some(claim.spec?.volume_name?)
    })
    .await?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let volume = volumes.get(&volume_name).await?;
    let path = volume
        .spec
        .and_then(|s| s.host_path)
        .map(|h| h.path)
        .unwrap_or_default();
    println!("claim default/hostpath-demo is bound to {volume_name}, a directory at {path}");

    claims
        .delete("hostpath-demo", &DeleteParams::default())
        .await?;
    wait_for("the volume to be deleted", || async {
        let gone = volumes.get_opt(&volume_name).await.ok()?.is_none();
        (gone && !std::path::Path::new(&path).exists()).then_some(())
    })
    .await?;
    println!("claim deleted: {volume_name} and its directory are gone");

    classes.delete("hostpath", &DeleteParams::default()).await?;
    let _ = stop.send(());
    controller.await??;
    let _ = std::fs::remove_dir(&base);
    Ok(())
}

/// Polls `check` until it returns `Some`, for at most a minute.
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..600 {
        if let Some(value) = check().await {
            return Ok(value);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("timed out waiting for {what}")
}
