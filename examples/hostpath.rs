//! A minimal storage driver (`cargo run --example hostpath [BASE_PATH]`): each volume is a
//! directory under a base path. It talks to the cluster of `KUBECONFIG` or of the pod it runs
//! in, else to an in-process kube-sim with its PV binder; creates a StorageClass and a claim,
//! waits until it is Bound, deletes it, waits until the directory and the PV are gone, exits.
//! SIGTERM or Ctrl-C stops it early (gracefully). Its tests run the driver against kube-sim
//! (`provision_controller::testing::DriverTest`) and through the conformance suite.

use std::{
    env,
    io::{ErrorKind, IsTerminal},
    path::Path,
    path::PathBuf,
    process::{self, ExitCode},
    time::Duration,
};

use anyhow::bail;
use async_trait::async_trait;
use clap::Parser;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_client::{Api, Client, api::DeleteParams, api::PostParams};
use provision_controller::{AssetLookup, ProvisionOptions, Provisioner};
use provision_controller::{Config, DeleteError, ProvisionController, ProvisionError};
use serde_json::json;
use tracing_subscriber::EnvFilter;

const NAME: &str = "example.com/hostpath";

/// A minimal storage driver: each volume is a directory under BASE_PATH. Runs against the
/// cluster of KUBECONFIG or of its pod, else against an in-process kube-sim: provisions one
/// claim, deletes it, exits.
#[derive(Debug, Parser)]
#[command(name = "hostpath", version)]
struct Args {
    /// Where the volumes' directories are made (default: a new folder in the temp dir).
    #[arg(value_name = "BASE_PATH")]
    base: Option<PathBuf>,
}

/// The driver: `provision` makes a directory, `delete` removes it, `find` looks one up.
#[derive(Clone)]
struct HostPath(PathBuf);

#[async_trait]
impl Provisioner for HostPath {
    async fn provision(&self, opts: &ProvisionOptions) -> Result<PersistentVolume, ProvisionError> {
        // The PV name is stable for a claim, so creating the directory twice is harmless.
        let path = self.0.join(&opts.pv_name);
        let created = tokio::fs::create_dir_all(&path).await;
        created.map_err(ProvisionError::failed)?;
        volume(opts, &path)
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let source = volume.spec.as_ref().and_then(|s| s.host_path.as_ref());
        // Only a directory under the base path is ours to delete.
        let Some(path) = source
            .map(|s| Path::new(&s.path))
            .filter(|p| p.starts_with(&self.0))
        else {
            let reason = "not a directory of this driver".into();
            return Err(DeleteError::Ignored { reason });
        };
        match tokio::fs::remove_dir_all(path).await {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(DeleteError::Failed(e.into())),
            _ => Ok(()),
        }
    }
}

/// Crash-safe provisioning's cleanup looks for a claim's directory without making one.
#[async_trait]
impl AssetLookup for HostPath {
    async fn find(
        &self,
        opts: &ProvisionOptions,
    ) -> Result<Option<PersistentVolume>, ProvisionError> {
        let path = self.0.join(&opts.pv_name);
        if !path.is_dir() {
            return Ok(None);
        }
        volume(opts, &path).map(Some)
    }
}

/// The PV of the directory `path` for `opts`' claim.
fn volume(opts: &ProvisionOptions, path: &Path) -> Result<PersistentVolume, ProvisionError> {
    let claim = opts.claim.spec.clone().unwrap_or_default();
    let volume = json!({"metadata": {"name": opts.pv_name}, "spec": {
        "capacity": claim.resources.and_then(|r| r.requests), "accessModes": claim.access_modes,
        "persistentVolumeReclaimPolicy": opts.storage_class.reclaim_policy,
        "hostPath": {"path": path.display().to_string(), "type": "Directory"}}});
    serde_json::from_value(volume).map_err(ProvisionError::failed)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Logs on stderr, coloured only on a terminal (redirected logs get plain text).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube_sim=warn".into());
    let terminal = std::io::stderr().is_terminal();
    logs(std::io::stderr, terminal)
        .with_env_filter(filter)
        .init();
    match demo(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line, each cause once.
            eprintln!(
                "error: {}",
                kube_controller_kit::error::chain(error.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

/// The log output, written by `writer`, with colours only when it is a `terminal`.
fn logs<W>(
    writer: W,
    terminal: bool,
) -> tracing_subscriber::fmt::SubscriberBuilder<
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    tracing_subscriber::filter::LevelFilter,
    W,
>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(terminal)
}

/// A client of the cluster of `KUBECONFIG` or of this pod (checked: an unreachable server is
/// an error naming its address), or `None` when neither is configured.
async fn cluster(kubeconfig: Option<String>, in_pod: bool) -> anyhow::Result<Option<Client>> {
    if kubeconfig.is_none() && !in_pod {
        return Ok(None);
    }
    // Names the kubeconfig file in its errors and never quotes it (it holds credentials).
    let config = vsphere_controllers::kube_config(None, kubeconfig.as_deref()).await?;
    let client = provision_controller::client::from_config(config.clone())?;
    vsphere_controllers::reachable(&client, &config).await?;
    Ok(Some(client))
}

async fn demo(args: Args) -> anyhow::Result<()> {
    let default_base = env::temp_dir().join(format!("hostpath-{}", process::id()));
    let base = args.base.unwrap_or(default_base);
    // SIGTERM (the kubelet's) or SIGINT (Ctrl-C) stops the controller gracefully.
    let signal = provision_controller::shutdown_signal()?;
    // A real cluster when one is configured, else an in-process one.
    let in_pod = env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let kubeconfig = env::var("KUBECONFIG").ok().filter(|v| !v.is_empty());
    let (client, _sim) = if let Some(client) = cluster(kubeconfig, in_pod).await? {
        (client, None)
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
    let driver = HostPath(base.clone());
    let controller = ProvisionController::new(client, NAME, driver.clone())
        .asset_lookup(driver)
        .config(Config::default().leader_election(None))
        .run(async {
            tokio::select! {
                _ = stopped => {}
                () = signal => eprintln!("shutdown signal: stopping"),
            }
        });
    let controller = tokio::spawn(controller);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "hostpath-demo"}, "spec": {"storageClassName": "hostpath",
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))?;
    claims.create(&post, &claim).await?;
    let volume_name = wait_for("the claim to be bound", &controller, || async {
        let claim = claims.get("hostpath-demo").await.ok()?;
        let bound = claim.status?.phase.as_deref() == Some("Bound");
        bound.then_some(claim.spec?.volume_name?)
    })
    .await?;
    let spec = volumes.get(&volume_name).await?.spec;
    let path = spec.and_then(|s| s.host_path).unwrap_or_default().path;
    println!("claim default/hostpath-demo is bound to {volume_name}, a directory at {path}");
    claims.delete("hostpath-demo", &delete).await?;
    wait_for("the volume to be deleted", &controller, || async {
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

/// Polls `check` until it returns `Some`, for at most a minute, while the controller runs.
async fn wait_for<T, F, R>(
    what: &str,
    controller: &tokio::task::JoinHandle<R>,
    mut check: impl FnMut() -> F,
) -> anyhow::Result<T>
where
    F: Future<Output = Option<T>>,
{
    for _ in 0..600 {
        if controller.is_finished() {
            bail!("the controller stopped (SIGTERM or SIGINT) while waiting for {what}");
        }
        if let Some(value) = check().await {
            return Ok(value);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("timed out waiting for {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use provision_controller::testing::{DriverTest, conformance::Conformance, pvc};

    fn driver(test: &str) -> HostPath {
        HostPath(env::temp_dir().join(format!("hostpath-test-{}-{test}", process::id())))
    }

    #[tokio::test]
    async fn a_claim_gets_a_directory_that_goes_with_it() {
        let test = DriverTest::start(NAME, driver("binds")).await.unwrap();
        let volume = test.provision(pvc("data").request("3Gi")).await.unwrap();
        let spec = volume.spec.unwrap();
        assert_eq!(spec.capacity.unwrap()["storage"].0, "3Gi");
        let path = spec.host_path.unwrap().path;
        assert!(Path::new(&path).is_dir(), "{path}");
        test.delete(&pvc("data").build()).await.unwrap();
        assert!(!Path::new(&path).exists(), "{path}");
        test.stop().await.unwrap();
    }

    #[tokio::test]
    async fn the_driver_keeps_the_provisioner_contract() {
        let driver = driver("conformance");
        let report = Conformance::new(NAME)
            .check_with_lookup(&driver, &driver)
            .await;
        report.assert_conforms();
    }

    #[tokio::test]
    async fn it_never_deletes_a_directory_outside_its_base() {
        let outside = env::temp_dir().join(format!("hostpath-outside-{}", process::id()));
        std::fs::create_dir_all(&outside).unwrap();
        let volume: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "x"},
            "spec": {"hostPath": {"path": outside.display().to_string()}}}))
        .unwrap();
        let answer = driver("outside").delete(&volume).await;
        assert!(
            matches!(answer, Err(DeleteError::Ignored { .. })),
            "{answer:?}"
        );
        assert!(outside.is_dir());
        std::fs::remove_dir(&outside).unwrap();
    }

    #[test]
    fn help_prints_the_usage_and_is_not_a_base_path() {
        let error = Args::try_parse_from(["hostpath", "--help"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayHelp);
        let help = error.to_string();
        assert!(
            help.starts_with(
                "A minimal storage driver: each volume is a directory under BASE_PATH."
            ),
            "{help}"
        );
        assert!(help.contains("Usage: hostpath [BASE_PATH]"), "{help}");
        let base = Args::try_parse_from(["hostpath", "/srv/volumes"])
            .unwrap()
            .base;
        assert_eq!(base, Some(PathBuf::from("/srv/volumes")));
    }

    #[test]
    fn logs_to_a_file_or_pipe_have_no_colours() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let written = |terminal: bool| {
            let buffer = Buffer::default();
            let writer = buffer.clone();
            let subscriber = logs(move || writer.clone(), terminal).finish();
            tracing::subscriber::with_default(subscriber, || tracing::warn!(pv = "pvc-1", "saved"));
            let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
            assert!(text.contains("saved"), "{text}");
            text
        };
        assert!(
            !written(false).contains('\u{1b}'),
            "no escape codes off a terminal"
        );
        assert!(written(true).contains('\u{1b}'), "colours on a terminal");
    }

    #[tokio::test]
    async fn an_unreachable_api_server_is_named_in_one_line() {
        let dir = env::temp_dir().join(format!("hostpath-kubeconfig-{}", process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("config");
        std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n").unwrap();
        let Err(error) = cluster(Some(kubeconfig.display().to_string()), false).await else {
            panic!("nothing listens on 127.0.0.1:1");
        };
        let line = kube_controller_kit::error::chain(error.as_ref());
        assert!(
            line.starts_with("cannot reach the Kubernetes API server at http://127.0.0.1:1/: "),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
