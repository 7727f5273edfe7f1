//! What the real run and the demo share: choosing the mode and running both controllers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use kube_client::Client;
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_controller_kit::error::chain;
use provision_controller::Health;
use tokio::sync::watch;
use tokio::task::JoinSet;
use vsphere_cns::{CnsClient, CnsMetadataBackend, CnsProvisioner, MoRef, VsphereConfig};

use crate::upstream::{FeatureStates, install_crd, watch_feature_states};

/// The name the reconciler's task reports itself by.
const RECONCILER: &str = "CnsVolumeMetadata reconciler";

/// Where `csi-vsphere.conf` is looked for when `--vsphere-config` is not given.
pub const DEFAULT_VSPHERE_CONFIG: &str = "/etc/cloud/csi-vsphere.conf";
/// The one line the demo starts with.
pub const DEMO_BANNER: &str =
    "no kubeconfig and no vSphere config: running the demo against kube-sim and the CNS simulator";

/// What the process found in its flags and environment.
#[derive(Clone, Debug, Default)]
pub struct Found {
    /// `--kubeconfig`.
    pub kubeconfig_flag: Option<PathBuf>,
    /// `KUBECONFIG` is set and not empty.
    pub kubeconfig_env: bool,
    /// `KUBERNETES_SERVICE_HOST` is set: running in a pod.
    pub in_pod: bool,
    /// `--vsphere-config`.
    pub vsphere_flag: Option<PathBuf>,
    /// [`DEFAULT_VSPHERE_CONFIG`] exists.
    pub default_vsphere_exists: bool,
    /// `--demo`: use the simulators whatever else is found.
    pub force_demo: bool,
}

/// How to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Against a real cluster and vCenter. `kubeconfig: None` means "infer" (`KUBECONFIG`,
    /// or the in-cluster service account).
    Real {
        /// An explicit kubeconfig file.
        kubeconfig: Option<PathBuf>,
        /// The `csi-vsphere.conf` to read.
        vsphere_config: PathBuf,
    },
    /// Against kube-sim and the CNS simulator.
    Demo,
}

/// Chooses the mode; a half configuration is an error saying what is missing.
pub fn select_mode(found: &Found) -> Result<Mode, String> {
    if found.force_demo {
        return Ok(Mode::Demo);
    }
    let kube = match (&found.kubeconfig_flag, found.kubeconfig_env, found.in_pod) {
        (Some(path), _, _) => Some(format!("--kubeconfig {}", path.display())),
        (None, true, _) => Some("KUBECONFIG".to_owned()),
        (None, false, true) => Some("KUBERNETES_SERVICE_HOST (in a pod)".to_owned()),
        (None, false, false) => None,
    };
    let vsphere = match (&found.vsphere_flag, found.default_vsphere_exists) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => Some(PathBuf::from(DEFAULT_VSPHERE_CONFIG)),
        (None, false) => None,
    };
    match (kube, vsphere) {
        (Some(_), Some(vsphere_config)) => Ok(Mode::Real {
            kubeconfig: found.kubeconfig_flag.clone(),
            vsphere_config,
        }),
        (None, None) => Ok(Mode::Demo),
        (Some(kube), None) => Err(format!(
            "found a kubeconfig ({kube}) but no vSphere config: pass --vsphere-config FILE or \
             create {DEFAULT_VSPHERE_CONFIG} (or pass --demo to use the simulators)"
        )),
        (None, Some(path)) => Err(format!(
            "found a vSphere config ({}) but no kubeconfig: pass --kubeconfig FILE or set \
             KUBECONFIG (or pass --demo to use the simulators)",
            path.display()
        )),
    }
}

/// The settings both controllers need.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The provisioner name claims' classes must name.
    pub provisioner_name: String,
    /// Leader election: one election, on the provision controller's Lease, for both
    /// controllers; the reconciler follows it. On in the binary; off runs both everywhere.
    pub leader_election: bool,
    /// Where the provision controller serves metrics, if anywhere.
    pub metrics_address: Option<SocketAddr>,
    /// The cluster flavor (`CLUSTER_FLAVOR`; unset means `VANILLA`, as upstream); only
    /// `WORKLOAD` runs the metadata reconciler (elsewhere one info line says it is off).
    pub flavor: cnsmetadata::ClusterFlavor,
    /// The cluster ID (`[Global] cluster-id`).
    pub cluster_id: String,
    /// The supervisor ID (`[Global] supervisor-id`), if any.
    pub supervisor_id: Option<String>,
    /// The vSphere user the controllers log in as.
    pub vsphere_user: String,
    /// Provision-controller options read from the environment (namespace of the lease).
    pub provision_config: provision_controller::Config,
    /// Metadata-reconciler options read from the environment (workers, flavor), or why
    /// they cannot be used: then the reconciler stops at once with that error and the
    /// provision controller runs on alone.
    pub metadata_config: Result<cnsmetadata::Config, cnsmetadata::ConfigError>,
    /// The feature-state ConfigMap upstream's syncer reads on this flavor
    /// ([`FeatureStates::of_flavor`]; on a supervisor `csi-feature-states`,
    /// `--supervisor-fss-name`): read before the reconciler starts, then followed; its
    /// `tkgs-ha` key switches PV entity references to the supervisor ID.
    pub feature_states: FeatureStates,
}

/// What the stop deadline adds to the provision controller's `shutdown_grace` besides the
/// lease release (bounded by the election's `renew_deadline`): time for the reconciler's
/// workers and the tasks to end. See [`Settings::stop_deadline`].
pub const STOP_MARGIN: Duration = Duration::from_secs(5);

impl Settings {
    /// How long [`Running::run_until`] waits for both controllers once asked to stop:
    /// the provision controller's `shutdown_grace` (the operations in flight), plus the
    /// election's `renew_deadline` when leader election is on (the bound of the lease
    /// release, which comes after the grace), plus [`STOP_MARGIN`]. With the defaults,
    /// 30 s + 10 s + 5 s = 45 s; a pod's `terminationGracePeriodSeconds` must be longer
    /// (plus the vCenter logout, see [`LOGOUT_TIMEOUT`]), or the kubelet's SIGKILL cuts
    /// off the release.
    pub fn stop_deadline(&self) -> Duration {
        let config = &self.provision_config;
        let release = match (&config.leader_election, self.leader_election) {
            (Some(election), true) => election.renew_deadline,
            _ => Duration::ZERO,
        };
        config.shutdown_grace + release + STOP_MARGIN
    }
}

/// The bound of the vCenter logout after the controllers stopped (a SOAP call's own
/// timeout is a minute, longer than a pod is given to stop).
pub const LOGOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// Logs out of vCenter within [`LOGOUT_TIMEOUT`]; says how it went.
pub(crate) async fn logout(cns: &CnsClient) -> &'static str {
    match tokio::time::timeout(LOGOUT_TIMEOUT, cns.logout()).await {
        Ok(Ok(())) => "vCenter session logged out",
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "vCenter logout failed");
            "vCenter logout failed"
        }
        Err(_) => {
            tracing::warn!(timeout = ?LOGOUT_TIMEOUT, "vCenter logout timed out");
            "vCenter logout timed out"
        }
    }
}

/// Both controllers, running until [`Running::stop`].
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
    deadline: Duration,
    health: Health,
}

/// Starts the provision controller and the `CnsVolumeMetadata` reconciler under one
/// election.
///
/// With [`Settings::leader_election`] on, the provision controller runs the election (on
/// its Lease, with its `LeaderElection` options) and reports its role to a
/// [`Health`] handle; the reconciler follows that one election through
/// [`Health::leading`] and reconciles only while this replica leads (its caches fill at
/// once, so a standby takes over warm). Without it, the reconciler runs once the provision
/// controller has started (it then reports itself leading). Losing the lease makes the provision controller fail, and
/// [`Running::run_until`] stops the reconciler too and returns the error: the process
/// should exit and be restarted.
///
/// The reconciler runs only on a supervisor (`WORKLOAD`), as upstream adds it; on any
/// other flavor one info line says it is off and why. On a supervisor, before the
/// reconciler starts, the `CnsVolumeMetadata` CRD is installed as upstream's syncer does
/// ([`install_crd`]: created, or its spec set with its metadata kept, then `Established`;
/// without the permission one warning line names the manifest, `/readyz` says why, and
/// the install is retried with a delay growing to 5 min), and the feature states are read
/// ([`watch_feature_states`]): the reconciler starts only once the ConfigMap has been read
/// (a missing one: one error line, `/readyz` says why, and it starts when the ConfigMap is
/// created), then its `tkgs-ha` key is followed and read at every reconcile. The
/// reconciler stopping with an error (its configuration cannot be used) is logged and
/// leaves the provision controller running.
pub fn start_controllers(
    kube: Client,
    provisioner: CnsProvisioner,
    backend: CnsMetadataBackend,
    settings: &Settings,
) -> Running {
    let (stop, stopped) = watch::channel(false);
    let shutdown = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let mut config = settings.provision_config.clone();
    if !settings.leader_election {
        config = config.leader_election(None);
    }
    if let Some(address) = settings.metrics_address {
        config = config
            .metrics_address(address.ip())
            .metrics_port(address.port());
    }
    let health = Health::new();
    let role = health.clone();
    // The one election: the provision controller drives it, the reconciler follows it.
    let leading = health.leading();
    let controller = provision_controller::ProvisionController::new(
        kube.clone(),
        settings.provisioner_name.clone(),
        provisioner.clone(),
    )
    .asset_lookup(provisioner.clone())
    .late_assets(provisioner)
    .config(config)
    .health(health);
    let metadata_config = settings.metadata_config.clone().map(|config| {
        config
            .cluster_flavor(settings.flavor)
            .cluster_id(settings.cluster_id.clone())
            .supervisor_id(settings.supervisor_id.clone().unwrap_or_default())
            .vsphere_user(settings.vsphere_user.clone())
    });
    let mut tasks = JoinSet::new();
    let provision_shutdown = shutdown();
    tasks.spawn(async move {
        let result = controller
            .run(provision_shutdown)
            .await
            .context("provision controller failed");
        ("provision controller", result)
    });
    let metadata_shutdown = shutdown();
    let feature_states = settings.feature_states.clone();
    let metadata_health = role.clone();
    if settings.flavor == cnsmetadata::ClusterFlavor::Workload {
        tasks.spawn(async move {
            let result = run_reconciler(
                kube,
                backend,
                metadata_config,
                feature_states,
                leading,
                metadata_health,
                metadata_shutdown,
            )
            .await;
            (RECONCILER, result)
        });
    } else {
        // As upstream's syncer adds the controller only on WORKLOAD.
        tracing::info!(flavor = %settings.flavor, "{OFF_ELSEWHERE}");
    }
    Running {
        stop,
        tasks,
        deadline: settings.stop_deadline(),
        health: role,
    }
}

/// The one line logged when the reconciler does not run on this cluster's flavor.
const OFF_ELSEWHERE: &str = "the CnsVolumeMetadata reconciler is off: upstream's syncer runs it \
     only on a supervisor cluster (CLUSTER_FLAVOR=WORKLOAD; unset means VANILLA)";

/// The reconciler's task on a supervisor (`WORKLOAD`): its configuration, the CRD, the feature states (loaded before it starts), then
/// [`cnsmetadata::MetadataController::run`].
async fn run_reconciler(
    kube: Client,
    backend: CnsMetadataBackend,
    config: Result<cnsmetadata::Config, cnsmetadata::ConfigError>,
    feature_states: FeatureStates,
    leading: kube_controller_kit::leader::Leading,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let config =
        config.context("the CnsVolumeMetadata reconciler cannot start; the provisioner runs on")?;
    let shutdown = futures::FutureExt::shared(futures::FutureExt::boxed(shutdown));
    tokio::select! {
        () = install_crd(&kube, &health) => {}
        () = shutdown.clone() => return Ok(()),
    }
    // Nothing is sent before the ConfigMap is read: the first change is the load.
    let (tkgs_ha, mut state) = watch::channel(false);
    let states = watch_feature_states(kube.clone(), feature_states, tkgs_ha, health);
    tokio::pin!(states);
    tokio::select! {
        loaded = state.changed() => loaded.context("the feature-state watch ended")?,
        () = &mut states => return Ok(()),
        () = shutdown.clone() => return Ok(()),
    }
    let config = config.use_supervisor_id_for_pv(cnsmetadata::FeatureState::follow(state));
    let reconciler = cnsmetadata::MetadataController::new(kube, backend)
        .config(config)
        .leading(leading)
        .run(shutdown);
    tokio::select! {
        result = reconciler => result.context("CnsVolumeMetadata reconciler failed"),
        () = states => Ok(()),
    }
}

impl Running {
    /// The provision controller's health as its probes serve it
    /// ([`Health::readiness`]: starting, caches not synced, stopping, an unmet condition)
    /// and whether it leads ([`Health::is_leading`]). It stops leading the moment the
    /// lease is lost, before [`run_until`](Self::run_until) returns.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// How long [`run_until`](Self::run_until) waits for the controllers to stop:
    /// [`Settings::stop_deadline`] of the settings they were started with.
    pub fn stop_deadline(&self) -> Duration {
        self.deadline
    }

    /// Waits until `until` completes (then stops, waiting up to
    /// [`stop_deadline`](Self::stop_deadline)) or the provision controller fails. A
    /// controller that returns `Ok` early (the reconciler outside a supervisor cluster) is
    /// not a failure; the reconciler failing (a configuration it cannot use) is logged as an
    /// error and the provision controller runs on, as its failure stops only itself.
    pub async fn run_until(mut self, until: impl Future<Output = ()>) -> anyhow::Result<()> {
        let deadline = self.deadline;
        tokio::pin!(until);
        loop {
            tokio::select! {
                () = &mut until => return self.stop(deadline).await,
                joined = self.tasks.join_next() => match joined {
                    None => { until.await; return Ok(()); }
                    Some(Ok((_, Ok(())))) => {}
                    Some(Ok((RECONCILER, Err(e)))) => {
                        tracing::error!(error = format!("{e:#}"), "the CnsVolumeMetadata reconciler stopped; the provisioner runs on");
                    }
                    Some(Ok((_, Err(e)))) => {
                        let _ = self.stop(deadline).await;
                        return Err(e);
                    }
                    Some(Err(e)) => {
                        let _ = self.stop(deadline).await;
                        return Err(anyhow!("a controller task panicked: {e}"));
                    }
                },
            }
        }
    }

    /// Tells both controllers to stop and waits up to `deadline` for them.
    pub async fn stop(mut self, deadline: Duration) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let drain = async {
            let mut first_error = None;
            while let Some(joined) = self.tasks.join_next().await {
                let error = match joined {
                    Ok((_, Ok(()))) => continue,
                    Ok((_, Err(e))) => e,
                    Err(e) => anyhow!("a controller task panicked: {e}"),
                };
                first_error.get_or_insert(error);
            }
            first_error.map_or(Ok(()), Err)
        };
        match tokio::time::timeout(deadline, drain).await {
            Ok(result) => result,
            Err(_) => {
                self.tasks.abort_all();
                Err(anyhow!("the controllers did not stop within {deadline:?}"))
            }
        }
    }
}

/// Options of a real run.
#[derive(Clone, Debug)]
pub struct RealOptions {
    /// The provisioner name claims' classes must name.
    pub provisioner_name: String,
    /// Leader election for the provision controller.
    pub leader_election: bool,
    /// Where the provision controller serves metrics, if anywhere.
    pub metrics_address: Option<SocketAddr>,
    /// `datastoreurl` values and the datastore MoRefs they stand for.
    pub datastores: Vec<(String, String)>,
    /// Datastore MoRefs for classes that name none.
    pub default_datastores: Vec<String>,
    /// The supervisor's feature-state ConfigMap (`--supervisor-fss-name`,
    /// `--supervisor-fss-namespace`), read on a supervisor (`WORKLOAD`).
    pub supervisor_feature_states: FeatureStates,
    /// The internal feature-state ConfigMap (`--fss-name`, `--fss-namespace`), upstream's
    /// on the other flavors, where nothing here reads feature states.
    pub internal_feature_states: FeatureStates,
}

impl Default for RealOptions {
    /// No provisioner name, no election, no metrics, no datastores, upstream's default
    /// feature-state ConfigMaps.
    fn default() -> Self {
        Self {
            provisioner_name: String::new(),
            leader_election: false,
            metrics_address: None,
            datastores: Vec::new(),
            default_datastores: Vec::new(),
            supervisor_feature_states: FeatureStates::supervisor(),
            internal_feature_states: FeatureStates::internal(),
        }
    }
}

/// Everything a real run needs, connected.
pub struct Real {
    /// The Kubernetes client.
    pub kube: Client,
    /// The logged-in CNS client.
    pub cns: CnsClient,
    /// The provisioner.
    pub provisioner: CnsProvisioner,
    /// The controllers' settings.
    pub settings: Settings,
    /// The vCenter host.
    pub host: String,
}

/// Builds the Kubernetes client, logs in to vCenter and configures both controllers.
/// `lookup` reads environment variables (and, for names starting with `/`, files).
pub async fn connect_real(
    kubeconfig: Option<&Path>,
    vsphere_config: &Path,
    options: &RealOptions,
    lookup: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Real> {
    let kube_config = kube_config(kubeconfig, lookup("KUBECONFIG").as_deref()).await?;
    let kube = Client::try_from(kube_config.clone()).context("cannot build a Kubernetes client")?;
    reachable(&kube, &kube_config).await?;
    // The parser logs its warnings (unknown keys) itself.
    let vsphere = VsphereConfig::load(vsphere_config)?;
    let vc = vsphere.virtual_centers.first().ok_or_else(|| {
        anyhow!(
            "{} has no [VirtualCenter \"host\"] section",
            vsphere_config.display()
        )
    })?;
    let cns = CnsClient::connect(vc)
        .await
        .with_context(|| format!("cannot log in to vCenter {}", vc.host))?;
    // The provisioner needs the flavor: a bad CLUSTER_FLAVOR stops the process. Any other
    // problem of the reconciler's variables stops the reconciler alone.
    let flavor = cnsmetadata::Config::from_lookup(|name: &str| {
        (name == cnsmetadata::Config::ENV_CLUSTER_FLAVOR)
            .then(|| lookup(name))
            .flatten()
    })?
    .cluster_flavor;
    let metadata_config = cnsmetadata::Config::from_lookup(&lookup);
    let owner = match (flavor, &vsphere.global.supervisor_id) {
        (cnsmetadata::ClusterFlavor::Workload, Some(id)) if !id.is_empty() => id.clone(),
        _ => vsphere.global.cluster_id.clone(),
    };
    if owner.is_empty() {
        return Err(anyhow!(
            "{}: [Global] cluster-id (or supervisor-id) is required",
            vsphere_config.display()
        ));
    }
    let default_datastores = options
        .default_datastores
        .iter()
        .map(MoRef::datastore)
        .collect();
    let mut provisioner =
        CnsProvisioner::new(cns.clone(), owner, flavor)?.default_datastores(default_datastores);
    if let Some(distribution) = &vsphere.global.cluster_distribution {
        provisioner = provisioner.cluster_distribution(distribution.clone());
    }
    for (url, moref) in &options.datastores {
        provisioner = provisioner.datastore_url(url.clone(), MoRef::datastore(moref.clone()));
    }
    let settings = Settings {
        provisioner_name: options.provisioner_name.clone(),
        leader_election: options.leader_election,
        metrics_address: options.metrics_address,
        flavor,
        cluster_id: vsphere.global.cluster_id.clone(),
        supervisor_id: vsphere.global.supervisor_id.clone(),
        vsphere_user: cns.user().to_owned(),
        provision_config: provision_controller::Config::from_lookup(&lookup)?,
        metadata_config,
        feature_states: FeatureStates::of_flavor(
            flavor,
            &options.supervisor_feature_states,
            &options.internal_feature_states,
        ),
    };
    Ok(Real {
        kube,
        cns,
        provisioner,
        settings,
        host: vc.host.clone(),
    })
}

/// The client configuration: from the kubeconfig file `path` (`--kubeconfig`), else from
/// the files `kubeconfig_env` lists (`KUBECONFIG`, merged as kubectl does), else the pod's
/// service account.
///
/// A file that cannot be read or parsed is an error naming the file and, for a parse
/// error, the line and column only: a kubeconfig holds tokens and keys, so none of its
/// content is ever quoted.
///
/// # Errors
/// A kubeconfig that is missing, unreadable, not a kubeconfig, or names no usable
/// cluster; no service account outside a pod.
pub async fn kube_config(
    path: Option<&Path>,
    kubeconfig_env: Option<&str>,
) -> anyhow::Result<kube_client::Config> {
    let (file, source) = match (path, kubeconfig_env) {
        (Some(path), _) => (read_kubeconfig(path)?, path.display().to_string()),
        (None, Some(list)) => {
            let mut merged = Kubeconfig::default();
            for path in std::env::split_paths(list).filter(|p| !p.as_os_str().is_empty()) {
                merged = merged
                    .merge(read_kubeconfig(&path)?)
                    .with_context(|| format!("cannot merge kubeconfig {}", path.display()))?;
            }
            (merged, format!("KUBECONFIG={list}"))
        }
        (None, None) => {
            return kube_client::Config::incluster()
                .map_err(|e| anyhow!("{}", chain(&e)))
                .context("cannot use the pod's service account");
        }
    };
    kube_client::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| anyhow!("{}", chain(&e)))
        .with_context(|| format!("cannot use kubeconfig {source}"))
}

/// Reads one kubeconfig file; its content never appears in an error.
fn read_kubeconfig(path: &Path) -> anyhow::Result<Kubeconfig> {
    use kube_client::config::KubeconfigError;
    match Kubeconfig::read_from(path) {
        Ok(file) => Ok(file),
        Err(KubeconfigError::ReadConfig(error, _)) => Err(anyhow!(
            "cannot read kubeconfig {}: {error}",
            path.display()
        )),
        Err(KubeconfigError::Parse(error)) => {
            let at = error
                .location()
                .map(|l| format!(" at line {}, column {}", l.line(), l.column()))
                .unwrap_or_default();
            Err(anyhow!(
                "kubeconfig {} is not a valid kubeconfig (a YAML error{at}; its content is not shown: it may hold credentials)",
                path.display()
            ))
        }
        Err(error) => Err(anyhow!(
            "cannot use kubeconfig {}: {}",
            path.display(),
            chain(&error)
        )),
    }
}

/// Asks the API server for its version, so that an unreachable or refusing server is
/// reported at once, with its address, rather than by every watch retrying.
///
/// # Errors
/// The server cannot be reached or refuses the client.
pub async fn reachable(client: &Client, config: &kube_client::Config) -> anyhow::Result<()> {
    match client.apiserver_version().await {
        Ok(_) => Ok(()),
        Err(error) => Err(anyhow!(
            "cannot reach the Kubernetes API server at {}: {}",
            config.cluster_url,
            chain(&error)
        )),
    }
}

/// Whether `path` exists (for the default vSphere config).
pub fn exists(path: &Path) -> bool {
    path.try_exists().unwrap_or(false)
}
