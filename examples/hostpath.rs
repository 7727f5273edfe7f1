//! A minimal storage driver (`cargo run --example hostpath [BASE_PATH]`): each volume is a
//! directory under a base path. It talks to the cluster of `KUBECONFIG` or of the pod it runs
//! in, else to an in-process kube-sim with its PV binder; creates a StorageClass and a claim,
//! waits until it is Bound, deletes it, waits until the directory and the PV are gone, exits.

use std::{env, io::ErrorKind, path::Path, path::PathBuf, process, time::Duration};

use anyhow::{Context as _, bail};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_client::{Api, Client, api::DeleteParams, api::PostParams};
use provision_controller::{Config, DeleteError, ProvisionController, ProvisionError};
use provision_controller::{ProvisionOptions, Provisioner};
use serde_json::json;
use tracing_subscriber::EnvFilter;

const NAME: &str = "example.com/hostpath";

/// The driver: `provision` makes a directory, `delete` removes it.
struct HostPath(PathBuf);

#[async_trait]
impl Provisioner for HostPath {
    async fn provision(&self, opts: &ProvisionOptions) -> Result<PersistentVolume, ProvisionError> {
        // The PV name is stable for a claim, so creating the directory twice is harmless.
        let path = self.0.join(&opts.pv_name);
        let created = tokio::fs::create_dir_all(&path).await;
        created.map_err(ProvisionError::failed)?;
        let claim = opts.claim.spec.clone().unwrap_or_default();
        let volume = json!({"metadata": {"name": opts.pv_name}, "spec": {
            "capacity": claim.resources.and_then(|r| r.requests), "accessModes": claim.access_modes,
            "persistentVolumeReclaimPolicy": opts.storage_class.reclaim_policy,
            "hostPath": {"path": path.display().to_string(), "type": "Directory"}}});
        serde_json::from_value(volume).map_err(ProvisionError::failed)
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let Some(source) = volume.spec.as_ref().and_then(|s| s.host_path.as_ref()) else {
            let reason = "not a host-path volume".into();
            return Err(DeleteError::Ignored { reason });
        };
        match tokio::fs::remove_dir_all(&source.path).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(DeleteError::Failed(e.into())),
            _ => Ok(()),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube_sim=warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let default_base = env::temp_dir().join(format!("hostpath-{}", process::id()));
    let base = env::args().nth(1).map_or(default_base, PathBuf::from);
    // A real cluster when one is configured, else an in-process one.
    let in_cluster = env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let (client, _sim) = if in_cluster || env::var_os("KUBECONFIG").is_some() {
        let client = Client::try_default().await;
        (client.context("connecting to the cluster")?, None)
    } else {
        println!("no cluster configured: starting kube-sim");
        let sim = kube_sim::KubeSim::builder().pv_binder(true).start().await?;
        (sim.client(), Some(sim))
    };
    let classes: Api<StorageClass> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let (post, delete) = (PostParams::default(), DeleteParams::default());

    // A class for this driver, its controller (until the demo is over), a claim of the class.
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "hostpath"}, "provisioner": NAME, "volumeBindingMode": "Immediate"}))?;
    classes.create(&post, &class).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = ProvisionController::new(client, NAME, HostPath(base.clone()))
        .config(Config::default().leader_election(None))
        .run(async { stopped.await.unwrap_or_default() });
    let controller = tokio::spawn(controller);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "hostpath-demo"}, "spec": {"storageClassName": "hostpath",
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))?;
    claims.create(&post, &claim).await?;
    let volume_name = wait_for("the claim to be bound", || async {
        let claim = claims.get("hostpath-demo").await.ok()?;
        let bound = claim.status?.phase.as_deref() == Some("Bound");
        bound.then_some(claim.spec?.volume_name?)
    })
    .await?;
    let spec = volumes.get(&volume_name).await?.spec;
    let path = spec.and_then(|s| s.host_path).unwrap_or_default().path;
    println!("claim default/hostpath-demo is bound to {volume_name}, a directory at {path}");
    claims.delete("hostpath-demo", &delete).await?;
    wait_for("the volume to be deleted", || async {
        let gone = volumes.get_opt(&volume_name).await.ok()?.is_none();
        (gone && !Path::new(&path).exists()).then_some(())
    })
    .await?;
    println!("claim deleted: {volume_name} and its directory are gone");
    classes.delete("hostpath", &delete).await?;
    let _ = stop.send(());
    controller.await??;
    let _ = std::fs::remove_dir(&base);
    Ok(())
}

/// Polls `check` until it returns `Some`, for at most a minute.
async fn wait_for<T, F>(what: &str, mut check: impl FnMut() -> F) -> anyhow::Result<T>
where
    F: Future<Output = Option<T>>,
{
    for _ in 0..600 {
        if let Some(value) = check().await {
            return Ok(value);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("timed out waiting for {what}")
}
