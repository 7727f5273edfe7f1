//! A storage driver on provision-controller: each volume is a directory under a root
//! folder, exposed as a hostPath PersistentVolume. Replace the directory with your
//! backend's disk; everything else stays as it is.

use std::{io::ErrorKind, io::IsTerminal, path::Path, path::PathBuf, process::ExitCode};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{HostPathVolumeSource, PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provision_controller::{
    Config, DeleteError, ProvisionController, ProvisionError, ProvisionOptions, Provisioner,
    Uninstall, manifests::Manifests,
};
use tracing_subscriber::EnvFilter;

/// The name StorageClasses give as their `provisioner`.
const NAME: &str = "example.com/my-driver";
/// Where `--print-manifests` installs it, and the image it runs.
const NAMESPACE: &str = "my-driver";
const IMAGE: &str = "registry.example.com/my-driver:0.1.0";
/// The StorageClass parameters this driver understands (none yet): any other is refused.
const PARAMETERS: &[&str] = &[];

struct MyDriver {
    root: PathBuf,
}

#[async_trait]
impl Provisioner for MyDriver {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        let parameters = options.storage_class.parameters.iter().flatten();
        if let Some((key, _)) = parameters
            .into_iter()
            .find(|(k, _)| !PARAMETERS.contains(&k.as_str()))
        {
            // One ProvisioningFailed event; the claim waits 5 minutes before the next try.
            let known = PARAMETERS.join(", ");
            let why = format!("unknown StorageClass parameter {key:?} (known: [{known}])");
            return Err(ProvisionError::infeasible(why));
        }
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
async fn main() -> ExitCode {
    // Errors as one line: what failed and why, each cause once.
    match run(std::env::args().skip(1).collect()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", provision_controller::error_chain(&*error));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
    // The binary reads the environment; the library never does.
    let port = std::env::var("METRICS_PORT").unwrap_or_else(|_| "8080".into());
    let port: u16 = port
        .parse()
        .map_err(|_| format!("METRICS_PORT={port:?} is no port"))?;
    let manifests = Manifests::new(NAME, NAMESPACE, IMAGE).metrics_port(port);
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => {}
        // `my-driver --print-manifests | kubectl apply -f -`
        ["--print-manifests"] => {
            print!("{}", manifests.to_yaml());
            return Ok(());
        }
        // Deletes the journal (run it once `kubectl delete -f` removed the rest).
        ["uninstall"] => {
            let (client, _) = provision_controller::client::infer().await?;
            let report = Uninstall::new(client, NAME)
                .namespace(NAMESPACE)
                .journal_namespace(manifests.journal_namespace())
                .run()
                .await?;
            println!("removed: {}", report.objects_deleted.join(", "));
            return Ok(());
        }
        _ => return Err("usage: my-driver [--print-manifests | uninstall]".into()),
    }
    // Logs on stderr, coloured only on a terminal, filtered by RUST_LOG (default: info).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let stderr_is_terminal = std::io::stderr().is_terminal();
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr);
    logs.with_ansi(stderr_is_terminal)
        .with_env_filter(filter)
        .init();
    let root = std::env::var("MY_DRIVER_ROOT").unwrap_or_else(|_| "/var/lib/my-driver".into());
    // KUBECONFIG, else ~/.kube/config, else the pod's service account. The client speaks
    // TLS (rustls) and HTTP/2 (one connection for every request and watch).
    let (client, kube_config) = provision_controller::client::infer().await?;
    provision_controller::client::check(&client, &kube_config).await?;
    // Leader election is on by default: the Lease in POD_NAMESPACE, else in the client's
    // namespace; the journal in JOURNAL_NAMESPACE. Metrics, /healthz and /readyz on
    // METRICS_PORT (default 8080).
    let config = Config::from_lookup(|key| std::env::var(key).ok())?.metrics_port(port);
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
        .await
        .map_err(|error| match error {
            // The metrics server could not listen (the port in use, most often).
            provision_controller::Error::Http(_) => {
                let line = provision_controller::error_chain(&error);
                format!("{line} (METRICS_PORT chooses another port)").into()
            }
            other => other.into(),
        })
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
    async fn an_unknown_parameter_is_refused_with_one_event()
    -> Result<(), Box<dyn std::error::Error>> {
        use provision_controller::testing::class;
        let test = DriverTest::start(NAME, driver("params")).await?;
        let test = test.limit(std::time::Duration::from_secs(3));
        test.create_class(
            &class("colourful")
                .provisioner(NAME)
                .parameter("colour", "red")
                .build(),
        )
        .await?;
        let claim = pvc("data").storage_class("colourful");
        assert!(test.provision(claim.clone()).await.is_err(), "bound anyway");
        let events = test.events(&claim.build()).await;
        let failed: Vec<_> = events
            .iter()
            .filter(|e| e.contains("ProvisioningFailed"))
            .collect();
        assert_eq!(failed.len(), 1, "{events:?}");
        assert!(
            failed[0].contains(r#"unknown StorageClass parameter "colour""#),
            "{events:?}"
        );
        Ok(test.stop().await?)
    }

    #[test]
    fn the_manifests_grant_the_journal_a_namespace_of_its_own() {
        let yaml = Manifests::new(NAME, NAMESPACE, IMAGE).to_yaml();
        assert!(yaml.contains("name: my-driver-journal"), "{yaml}");
    }

    #[tokio::test]
    async fn the_driver_keeps_the_provisioner_contract() {
        Conformance::new(NAME)
            .check(&driver("conformance"))
            .await
            .assert_conforms();
    }
}
