//! The bench environment: the API server (kube-sim child or a cluster), clients, the run's
//! namespace and class, the pre-bound pairs, and the cleanup.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail};
use k8s_openapi::{
    api::{
        core::v1::{Namespace, PersistentVolume},
        storage::v1::StorageClass,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api, Client, Config,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;
use tokio::time::Instant;
use tower::Layer as _;

use crate::{
    Args, ClientKind, Scenario,
    counting::{ApiCounter, ClientService, CountLayer},
    objects::{self, Names},
    report::{Probe, ServerCounts},
    sim::SimChild,
};

/// Everything a scenario needs.
pub(crate) struct Env {
    /// The command line.
    pub(crate) args: Args,
    /// Names of this run.
    pub(crate) names: Names,
    /// The driver's client (on the driver thread).
    pub(crate) driver: Client,
    /// The runtime the controller runs on.
    pub(crate) controller: tokio::runtime::Handle,
    /// Measurements.
    pub(crate) probe: Probe,
    config: Config,
    kubeconfig: PathBuf,
    /// Whether the bench installed the CnsVolumeMetadata CRD (and so removes it).
    pub(crate) installed_crd: AtomicBool,
}

/// A client of `kind` from `config`.
fn client_for(kind: ClientKind, config: Config) -> anyhow::Result<Client> {
    Ok(match kind {
        ClientKind::H2 => provision_controller::client::from_config(config)?,
        ClientKind::H1 => ClientBuilder::try_from(config)?.build(),
    })
}

async fn load(path: &Path) -> anyhow::Result<Config> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("cannot use kubeconfig {}", path.display()))
}

impl Env {
    /// Starts the API server (a kube-sim child, unless `--kubeconfig` names a cluster) and
    /// the environment of a run on it.
    pub(crate) async fn start(
        args: Args,
        controller: tokio::runtime::Handle,
    ) -> anyhow::Result<(Self, Option<SimChild>)> {
        let sim = match &args.kubeconfig {
            Some(_) => None,
            None => Some(SimChild::start(args.sim_history, &args.sim_profile).await?),
        };
        let kubeconfig = match (&args.kubeconfig, &sim) {
            (Some(path), _) => path.clone(),
            (None, Some(sim)) => sim.kubeconfig.clone(),
            (None, None) => unreachable!("a sim runs when no kubeconfig is given"),
        };
        let config = load(&kubeconfig).await?;
        // The driver is a client-go-like load generator: one HTTP/2 connection, whatever
        // `--client` picks for the controller.
        let driver =
            client_for(ClientKind::H2, config.clone()).context("cannot build the driver client")?;
        let env = Self {
            names: Names::fresh(),
            driver,
            controller,
            probe: Probe::new(ApiCounter::default(), sim.as_ref().and_then(SimChild::pid)),
            config,
            kubeconfig,
            installed_crd: AtomicBool::new(false),
            args,
        };
        Ok((env, sim))
    }
}

/// An HTTP/2 client (as the driver's) for the cluster of `kubeconfig`.
pub(crate) async fn client_from_kubeconfig(kubeconfig: &Path) -> anyhow::Result<Client> {
    client_for(ClientKind::H2, load(kubeconfig).await?)
}

/// `--populate`: creates the pre-bound pairs, in a process of its own so its allocations
/// stay out of the controller's memory figures.
pub(crate) async fn populate_main(kubeconfig: &Path, args: &Args) -> anyhow::Result<()> {
    let client = client_for(ClientKind::H2, load(kubeconfig).await?)?;
    let names = Names::from_run(&args.run_id);
    objects::populate_pairs(client, &names, &args.csi_driver, args.n, args.in_flight).await
}

impl Env {
    /// The kubeconfig of the run's API server (kube-sim's or `--kubeconfig`).
    pub(crate) fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client for the controller: built on the controller's runtime, counting requests.
    pub(crate) async fn controller_client(&self) -> anyhow::Result<Client> {
        let config = self.config.clone();
        let layer = CountLayer(self.probe.api.clone());
        let kind = self.args.client;
        self.controller
            .spawn(async move {
                let client = client_for(kind, config)?;
                let namespace = client.default_namespace().to_owned();
                anyhow::Ok(Client::new(layer.layer(ClientService(client)), namespace))
            })
            .await
            .context("building the controller client panicked")?
    }

    /// Creates the run's namespace and, with `class`, its StorageClass.
    pub(crate) async fn setup(&self, class: bool) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.driver.clone());
        namespaces
            .create(&PostParams::default(), &objects::namespace(&self.names))
            .await
            .context("cannot create the bench namespace")?;
        if class {
            let classes: Api<StorageClass> = Api::all(self.driver.clone());
            classes
                .create(&PostParams::default(), &objects::class(&self.names))
                .await
                .context("cannot create the bench StorageClass")?;
        }
        Ok(())
    }

    /// Installs the CnsVolumeMetadata CRD unless it exists, and waits until it is served.
    pub(crate) async fn install_crd(&self) -> anyhow::Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.driver.clone());
        if crds.get_opt(cnsmetadata::CRD_NAME).await?.is_none() {
            crds.create(&PostParams::default(), &cnsmetadata::crd())
                .await
                .context("cannot install the CnsVolumeMetadata CRD")?;
            self.installed_crd.store(true, Ordering::Relaxed);
        }
        let api: Api<cnsmetadata::CnsVolumeMetadata> =
            Api::namespaced(self.driver.clone(), &self.names.namespace);
        let deadline = Instant::now() + Duration::from_secs(60);
        while api.list(&ListParams::default().limit(1)).await.is_err() {
            if Instant::now() > deadline {
                bail!("the CnsVolumeMetadata CRD is not served after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Creates `n` claims pre-bound to CSI PVs of `driver` in another process and waits
    /// until they are Bound.
    pub(crate) async fn populate(&self, driver: &str, n: usize) -> anyhow::Result<()> {
        let started = Instant::now();
        eprintln!("populating {n} bound claim/PV pairs (driver {driver})");
        let exe = std::env::current_exe().context("cannot find the bench binary")?;
        let status = tokio::process::Command::new(exe)
            .arg("--populate")
            .arg(&self.kubeconfig)
            .args(["--run-id", &self.names.run, "--csi-driver", driver])
            .args(["--n", &n.to_string()])
            .args(["--in-flight", &self.args.in_flight.to_string()])
            .stdin(Stdio::null())
            .status()
            .await
            .context("cannot start the populate process")?;
        if !status.success() {
            bail!("populating pairs failed ({status})");
        }
        eprintln!("populated in {:.1} s", started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Waits until the controller's client has started `watches` watches (its caches are
    /// filled: a kube watcher watches once its initial list is done).
    pub(crate) async fn wait_synced(&self, watches: u64) -> anyhow::Result<()> {
        wait_for("controller caches filled", self.args.timeout(), || {
            let started = self.probe.api.watches();
            if started >= watches {
                Ok(())
            } else {
                Err(format!("{started} of {watches} watches started"))
            }
        })
        .await
    }

    /// Deletes the run's objects from a real cluster.
    pub(crate) async fn cleanup(&self) -> anyhow::Result<()> {
        eprintln!(
            "cleaning up namespace {} and the run's objects",
            self.names.namespace
        );
        let client = self.driver.clone();
        let selector = ListParams::default().labels(&self.names.selector());
        if self.args.scenario == Some(Scenario::Metadata) {
            // Finalizers of a stopped reconciler would keep the namespace forever.
            let api: Api<cnsmetadata::CnsVolumeMetadata> =
                Api::namespaced(client.clone(), &self.names.namespace);
            if let Ok(list) = api.list(&ListParams::default()).await {
                let patch = Patch::Merge(json!({"metadata": {"finalizers": null}}));
                for object in list.items {
                    let name = object.metadata.name.unwrap_or_default();
                    let _ = api.patch(&name, &PatchParams::default(), &patch).await;
                }
            }
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let _ = namespaces
            .delete(&self.names.namespace, &DeleteParams::default())
            .await;
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        volumes
            .delete_collection(&DeleteParams::default(), &selector)
            .await
            .context("cannot delete the run's PVs")?;
        let classes: Api<StorageClass> = Api::all(client.clone());
        let _ = classes
            .delete(&self.names.class, &DeleteParams::default())
            .await;
        if self.installed_crd.load(Ordering::Relaxed) {
            let crds: Api<CustomResourceDefinition> = Api::all(client);
            let _ = crds
                .delete(cnsmetadata::CRD_NAME, &DeleteParams::default())
                .await;
        }
        Ok(())
    }
}

impl Env {
    /// kube-sim's request counters now (every client: this driver, the controller, the
    /// sim's PV binder); `None` against a cluster.
    pub(crate) async fn server_counts(&self) -> anyhow::Result<Option<ServerCounts>> {
        if self.args.kubeconfig.is_some() {
            return Ok(None);
        }
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("a /metrics request")?;
        let text = self
            .driver
            .request_text(request)
            .await
            .context("cannot read kube-sim's /metrics")?;
        Ok(Some(parse_metrics(&text)))
    }

    /// The most client connections kube-sim had open at once since it started (the
    /// driver's, the controller's); `None` against a cluster.
    pub(crate) async fn server_connections_peak(&self) -> anyhow::Result<Option<u64>> {
        if self.args.kubeconfig.is_some() {
            return Ok(None);
        }
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("a /metrics request")?;
        let text = self
            .driver
            .request_text(request)
            .await
            .context("cannot read kube-sim's /metrics")?;
        Ok(text.lines().find_map(|line| {
            line.strip_prefix("kube_sim_open_connections_peak ")?
                .trim()
                .parse()
                .ok()
        }))
    }
}

/// Parses `kube_sim_requests_total{verb="..",resource="..",...,client=".."} N` lines.
pub(crate) fn parse_metrics(text: &str) -> ServerCounts {
    let mut counts = ServerCounts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("kube_sim_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let labels = format!(",{labels}");
        let label = |name: &str| {
            let start = labels.find(&format!(",{name}=\""))? + name.len() + 3;
            let end = labels[start..].find('"')? + start;
            Some(labels[start..end].to_owned())
        };
        let (Some(verb), Some(resource), Some(client), Ok(n)) = (
            label("verb"),
            label("resource"),
            label("client"),
            value.trim().parse::<u64>(),
        ) else {
            continue;
        };
        *counts.entry((verb, resource, client)).or_default() += n;
    }
    counts
}

/// Polls `check` every 25 ms until it returns `Ok`; prints its `Err` (the progress) every 5 s.
pub(crate) async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    let mut last_note = start;
    loop {
        let progress = match check() {
            Ok(value) => return Ok(value),
            Err(progress) => progress,
        };
        let now = Instant::now();
        if now - start > timeout {
            bail!("timed out after {timeout:?} waiting for {what}: {progress}");
        }
        if now - last_note > Duration::from_secs(5) {
            let secs = (now - start).as_secs_f64();
            eprintln!("  {what}: {progress} ({secs:.0} s)");
            last_note = now;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the controller has sent no request for `quiet` (its background writes,
/// such as queued events, are done), at most `limit`, so each phase is charged with the
/// requests it caused. Throughput and latency come from the timeline, not from this.
pub(crate) async fn settle(
    counter: &crate::counting::ApiCounter,
    quiet: Duration,
    limit: Duration,
) {
    let total = || counter.snapshot().values().sum::<u64>();
    let start = Instant::now();
    let (mut last, mut since) = (total(), Instant::now());
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now = total();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sims_request_counters() {
        let text = "# TYPE kube_sim_requests_total counter\n\
            kube_sim_requests_total{verb=\"patch\",resource=\"persistentvolumes\",subresource=\"status\",code=\"200\",client=\"pv-binder\"} 7\n\
            kube_sim_requests_total{verb=\"patch\",resource=\"persistentvolumes\",subresource=\"\",code=\"409\",client=\"pv-binder\"} 2\n\
            kube_sim_requests_in_flight 3\n";
        let counts = parse_metrics(text);
        let key = (
            "patch".to_owned(),
            "persistentvolumes".to_owned(),
            "pv-binder".to_owned(),
        );
        assert_eq!(counts.get(&key), Some(&9));
        assert_eq!(counts.len(), 1);
    }
}
