//! The whole process behind the binary's flags: choose the mode, then run the demo or the
//! real controllers.

use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vsphere_cns::CnsMetadataBackend;

use crate::app::{
    DEFAULT_VSPHERE_CONFIG, Found, Mode, RealOptions, connect_real, exists, logout, select_mode,
    start_controllers,
};

/// Why [`run`] refuses to run without configuration when built without the `demo` feature.
#[cfg(not(feature = "demo"))]
const NO_DEMO: &str = "no kubeconfig and no vSphere config: pass --kubeconfig FILE and \
     --vsphere-config FILE (this build has no demo on simulators: its `demo` feature is off)";

/// What the binary's flags ask for, in both modes.
#[derive(Clone, Debug)]
pub struct Options {
    /// `--kubeconfig`: a kubeconfig file (else `KUBECONFIG` or the in-cluster account).
    pub kubeconfig: Option<PathBuf>,
    /// `--vsphere-config`: a `csi-vsphere.conf` (else [`DEFAULT_VSPHERE_CONFIG`] if it exists).
    pub vsphere_config: Option<PathBuf>,
    /// The provisioner name that StorageClasses name.
    pub provisioner_name: String,
    /// Leader election on a Lease (see [`crate::Settings::leader_election`]).
    pub leader_election: bool,
    /// Where the provision controller serves metrics, if anywhere.
    pub metrics_address: Option<SocketAddr>,
    /// `datastoreurl` class parameters and the datastore MoRefs they stand for (see
    /// [`parse_datastore`]).
    pub datastores: Vec<(String, String)>,
    /// Datastore MoRefs for classes that name none.
    pub default_datastores: Vec<String>,
    /// Demo: number of claims to create.
    pub claims: usize,
    /// Demo: keep running after provisioning until the shutdown (SIGTERM or Ctrl-C).
    pub serve: bool,
    /// Demo: limit of each wait.
    pub timeout: Duration,
    /// Run the demo whatever else is configured.
    pub demo: bool,
    /// The supervisor's feature-state ConfigMap (`--supervisor-fss-name`,
    /// `--supervisor-fss-namespace`), read in a real run on a supervisor (`WORKLOAD`).
    pub supervisor_feature_states: crate::FeatureStates,
    /// The internal feature-state ConfigMap (`--fss-name`, `--fss-namespace`), upstream's
    /// on the other flavors (see [`crate::FeatureStates::of_flavor`]).
    pub internal_feature_states: crate::FeatureStates,
}

/// Why [`run`] failed.
#[derive(Debug)]
pub enum RunError {
    /// Half a configuration (a kubeconfig without a vSphere config, or the reverse); the
    /// message says what is missing.
    Usage(String),
    /// The demo or the real run failed.
    Failed(anyhow::Error),
}

impl RunError {
    /// The process exit code for this error: 2 for [`RunError::Usage`], else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Failed(_) => 1,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(message) => f.write_str(message),
            // Each cause once: a cause that repeats its source's text is not printed twice.
            Self::Failed(error) => f.write_str(&kube_controller_kit::error::chain(error.as_ref())),
        }
    }
}

impl std::error::Error for RunError {}

impl From<anyhow::Error> for RunError {
    fn from(error: anyhow::Error) -> Self {
        Self::Failed(error)
    }
}

/// Parses a `--datastore` value, `URL=MOREF` (split at the first `=`): a `datastoreurl`
/// class parameter and the datastore MoRef it stands for.
///
/// # Errors
/// A message naming the value when it has no `=` or an empty URL or MoRef.
pub fn parse_datastore(value: &str) -> Result<(String, String), String> {
    let (url, moref) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not URL=MOREF"))?;
    if url.is_empty() || moref.is_empty() {
        let empty = if url.is_empty() { "URL" } else { "MoRef" };
        return Err(format!(
            "{value:?} has an empty {empty}: expected URL=MOREF"
        ));
    }
    Ok((url.to_owned(), moref.to_owned()))
}

/// Chooses the mode from `options` and the environment, then runs the demo (against
/// kube-sim and the CNS simulator, writing its progress to `out`) or both controllers
/// against the real cluster and vCenter, until `shutdown` completes (its output is
/// ignored). A binary passes [`shutdown_signal`](crate::shutdown_signal), so that SIGTERM
/// and SIGINT both stop it gracefully.
///
/// # Shutdown
/// Once `shutdown` completes, the controllers stop: the provision controller's queues
/// stop, its operations in flight get `shutdown_grace` to finish, then it releases the
/// lease (when leading) so a standby takes over at once; the reconciler stops with it. The
/// whole stop is bounded by [`Settings::stop_deadline`](crate::Settings::stop_deadline)
/// (the grace plus the release's bound plus [`STOP_MARGIN`](crate::STOP_MARGIN)); then the
/// vCenter session is logged out (bounded by [`LOGOUT_TIMEOUT`](crate::LOGOUT_TIMEOUT)) and one last line on
/// `out`, starting with `stopped:`, says what was done. `shutdown` completing while the
/// demo provisions, or while connecting to vCenter, stops as well (the demo then fails,
/// as unfinished).
///
/// `env` reads one environment variable (`None` when unset or empty); the controllers'
/// options that name a file (a name starting with `/`, see
/// `provision_controller::Config::from_lookup`) are read from that file.
///
/// # Errors
/// [`RunError::Usage`] for half a configuration; [`RunError::Failed`] when the demo fails
/// (or leaves a claim unsynced or a volume behind) or a controller fails.
pub async fn run(
    options: &Options,
    env: impl Fn(&str) -> Option<String>,
    shutdown: impl Future,
    out: &mut (dyn Write + Send),
) -> Result<(), RunError> {
    if !options.demo {
        missing_files(
            options.vsphere_config.as_deref(),
            options.kubeconfig.as_deref(),
            &env,
        )
        .map_err(RunError::Usage)?;
    }
    let found = Found {
        kubeconfig_flag: options.kubeconfig.clone(),
        kubeconfig_env: env("KUBECONFIG").is_some(),
        in_pod: env("KUBERNETES_SERVICE_HOST").is_some(),
        vsphere_flag: options.vsphere_config.clone(),
        default_vsphere_exists: exists(DEFAULT_VSPHERE_CONFIG.as_ref()),
        force_demo: options.demo,
    };
    let shutdown = async {
        shutdown.await;
    };
    match select_mode(&found).map_err(RunError::Usage)? {
        #[cfg(feature = "demo")]
        Mode::Demo => demo(options, shutdown, out).await?,
        #[cfg(not(feature = "demo"))]
        Mode::Demo => return Err(RunError::Usage(NO_DEMO.to_owned())),
        Mode::Real {
            kubeconfig,
            vsphere_config,
        } => {
            let lookup = |name: &str| {
                if name.starts_with('/') {
                    std::fs::read_to_string(name).ok()
                } else {
                    env(name)
                }
            };
            real(
                options,
                kubeconfig.as_deref(),
                &vsphere_config,
                lookup,
                shutdown,
                out,
            )
            .await?;
        }
    }
    Ok(())
}

/// A configuration file named by a flag or by `KUBECONFIG` that does not exist: an error
/// naming each (found-or-not is decided only among files that exist).
pub(crate) fn missing_files(
    vsphere_config: Option<&Path>,
    kubeconfig: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let mut missing = Vec::new();
    if let Some(path) = vsphere_config
        && !exists(path)
    {
        missing.push(format!("--vsphere-config {}", path.display()));
    }
    if let Some(path) = kubeconfig
        && !exists(path)
    {
        missing.push(format!("--kubeconfig {}", path.display()));
    } else if kubeconfig.is_none()
        && let Some(list) = env("KUBECONFIG")
    {
        let paths: Vec<PathBuf> = std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        // kubectl skips the files of the list that do not exist, but not all of them.
        if !paths.is_empty() && !paths.iter().any(|p| exists(p)) {
            missing.push(format!("KUBECONFIG={list}"));
        }
    }
    match missing.as_slice() {
        [] => Ok(()),
        [one] => Err(format!("{one}: no such file")),
        many => Err(format!("no such files: {}", many.join(", "))),
    }
}

#[cfg(feature = "demo")]
async fn demo(
    options: &Options,
    shutdown: impl Future<Output = ()>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    use anyhow::anyhow;

    use crate::demo::{DemoOptions, run_demo};

    writeln!(out, "{}", crate::DEMO_BANNER)?;
    let demo_options = DemoOptions {
        claims: options.claims,
        provisioner_name: options.provisioner_name.clone(),
        leader_election: options.leader_election,
        metrics_address: options.metrics_address,
        serve: options.serve,
        timeout: options.timeout,
    };
    let report = run_demo(&demo_options, shutdown, out).await?;
    if let Some(row) = report.rows.iter().find(|r| !r.synced) {
        return Err(anyhow!(
            "the metadata of claim {} was not synced",
            row.claim
        ));
    }
    if !options.serve && report.volumes_left != 0 {
        return Err(anyhow!(
            "the CNS simulator still holds {} volumes",
            report.volumes_left
        ));
    }
    Ok(())
}

async fn real(
    options: &Options,
    kubeconfig: Option<&Path>,
    vsphere_config: &Path,
    lookup: impl Fn(&str) -> Option<String>,
    shutdown: impl Future<Output = ()>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let real_options = RealOptions {
        provisioner_name: options.provisioner_name.clone(),
        leader_election: options.leader_election,
        metrics_address: options.metrics_address,
        datastores: options.datastores.clone(),
        default_datastores: options.default_datastores.clone(),
        supervisor_feature_states: options.supervisor_feature_states.clone(),
        internal_feature_states: options.internal_feature_states.clone(),
    };
    tokio::pin!(shutdown);
    let real = tokio::select! {
        real = connect_real(kubeconfig, vsphere_config, &real_options, lookup) => real?,
        () = &mut shutdown => {
            // A session opened meanwhile is dropped with the process; vCenter ends it.
            writeln!(out, "stopped: asked to stop while connecting")?;
            return Ok(());
        }
    };
    writeln!(
        out,
        "running the provisioner {:?} and the CnsVolumeMetadata reconciler against vCenter {} until SIGTERM or Ctrl-C",
        options.provisioner_name, real.host
    )?;
    out.flush()?;
    let backend = CnsMetadataBackend::new(real.cns.clone());
    let running = start_controllers(real.kube, real.provisioner, backend, &real.settings);
    let result = running.run_until(shutdown).await;
    let logout = logout(&real.cns).await;
    let stopped = match &result {
        Ok(()) => "the controllers stopped",
        Err(_) => "a controller failed",
    };
    writeln!(out, "stopped: {stopped}, {logout}")?;
    out.flush()?;
    result
}

#[cfg(test)]
mod tests {
    use anyhow::anyhow;

    use super::*;

    #[test]
    fn a_datastore_flag_is_a_url_and_a_moref() {
        assert_eq!(
            parse_datastore("ds:///vmfs/volumes/a/=datastore-7"),
            Ok(("ds:///vmfs/volumes/a/".to_owned(), "datastore-7".to_owned()))
        );
    }

    #[test]
    fn a_bad_datastore_flag_is_a_clear_error_naming_it() {
        let no_equals = parse_datastore("ds:///vmfs/volumes/a/").unwrap_err();
        assert_eq!(no_equals, r#""ds:///vmfs/volumes/a/" is not URL=MOREF"#);
        let no_url = parse_datastore("=datastore-7").unwrap_err();
        assert!(
            no_url.contains(r#""=datastore-7" has an empty URL"#),
            "{no_url}"
        );
        let no_moref = parse_datastore("ds:///a/=").unwrap_err();
        assert!(
            no_moref.contains(r#""ds:///a/=" has an empty MoRef"#),
            "{no_moref}"
        );
    }

    #[test]
    fn a_usage_error_exits_2_and_a_failure_1_with_its_chain() {
        let usage = RunError::Usage("no kubeconfig".to_owned());
        assert_eq!(
            (usage.exit_code(), usage.to_string().as_str()),
            (2, "no kubeconfig")
        );
        let failed = RunError::from(anyhow!("inner").context("outer"));
        assert_eq!(
            (failed.exit_code(), failed.to_string().as_str()),
            (1, "outer: inner")
        );
    }
}
