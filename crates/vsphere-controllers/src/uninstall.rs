//! `vsphere uninstall`: what the provision controller leaves in a cluster once it no longer
//! runs, reported and removed ([`provision_controller::Uninstall`]).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube_client::{Api, Client};
use kube_controller_kit::error::chain;
use provision_controller::LeaderElection;
use provision_controller::annotations::FINALIZER_PV;
use provision_controller::{Uninstall, UninstallReport};

use crate::app::{kube_config, reachable};
use crate::run::{RunError, missing_files};

/// What `vsphere uninstall` is asked for.
#[derive(Clone, Debug, Default)]
pub struct UninstallOptions {
    /// `--kubeconfig`: a kubeconfig file (else `KUBECONFIG` or the in-cluster account).
    pub kubeconfig: Option<PathBuf>,
    /// The provisioner name the controller ran with (`--provisioner-name`).
    pub provisioner_name: String,
    /// The controller's namespace, its Lease's (`--namespace`); else `POD_NAMESPACE`, as
    /// the controller itself takes it, else the kubeconfig context's namespace.
    pub namespace: Option<String>,
    /// The controller's Lease name (`--lease-name`); else the one it uses, the provisioner
    /// name with `/` replaced by `-`.
    pub lease_name: Option<String>,
    /// The namespace of the controller's journal (`--journal-namespace`); else
    /// `JOURNAL_NAMESPACE`, as the controller itself takes it, else the controller's
    /// namespace.
    pub journal_namespace: Option<String>,
    /// Also remove [`FINALIZER_PV`] from the PVs this provisioner made
    /// (`--remove-pv-finalizers`); see
    /// [`Uninstall::remove_pv_finalizers`].
    pub remove_pv_finalizers: bool,
}

/// Removes what the provision controller of `options.provisioner_name` leaves in the
/// cluster once every replica is stopped: its provisioning journal (ConfigMaps in its
/// journal's namespace) and, with [`UninstallOptions::remove_pv_finalizers`], the PV finalizer on its
/// PVs. Writes a readable report to `out`: the objects deleted, the provisionings that were
/// in flight (each a volume to check for in vCenter, as it may exist without a PV), the
/// finalizers removed. Running it again continues an uninstall that stopped, and after a
/// complete one does nothing.
///
/// It refuses to run while the controller's Lease is held and not expired (a running
/// controller writes its journal again): stop every replica first (scale the Deployment to
/// 0). `env` reads one environment variable (`KUBECONFIG`, `POD_NAMESPACE`,
/// `JOURNAL_NAMESPACE`).
///
/// The credentials used need, in the controller's namespace, `get` on its Lease, in the
/// journal's namespace `list` and `delete` on ConfigMaps, and, for `remove_pv_finalizers`, `list` and `patch`
/// on PersistentVolumes.
///
/// # Errors
/// [`RunError::Usage`] when a kubeconfig named by the flag or `KUBECONFIG` does not exist;
/// [`RunError::Failed`] when the API server cannot be used, the Lease is held, or an API
/// call fails (what was removed before stays removed; the message says to run it again).
pub async fn uninstall(
    options: &UninstallOptions,
    env: impl Fn(&str) -> Option<String>,
    out: &mut (dyn Write + Send),
) -> Result<UninstallReport, RunError> {
    if options.provisioner_name.trim().is_empty() {
        return Err(RunError::Usage(
            "uninstall needs the provisioner name the controller ran with (--provisioner-name)"
                .to_owned(),
        ));
    }
    missing_files(None, options.kubeconfig.as_deref(), &env).map_err(RunError::Usage)?;
    let config = kube_config(options.kubeconfig.as_deref(), env("KUBECONFIG").as_deref()).await?;
    let client = Client::try_from(config.clone()).context("cannot build a Kubernetes client")?;
    reachable(&client, &config).await?;
    let namespace = options
        .namespace
        .clone()
        .or_else(|| env("POD_NAMESPACE"))
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let journal_namespace = options
        .journal_namespace
        .clone()
        .or_else(|| env("JOURNAL_NAMESPACE"))
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| namespace.clone());
    let lease_name = options
        .lease_name
        .clone()
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| LeaderElection::lease_name_for(&options.provisioner_name));
    let lease = format!("{namespace}/{lease_name}");
    not_running(&client, &namespace, &lease_name).await?;
    writeln!(
        out,
        "uninstalling the provisioner {:?}: the journal of its Lease {lease} (ConfigMaps in namespace {journal_namespace})",
        options.provisioner_name
    )
    .map_err(anyhow::Error::from)?;
    let report = Uninstall::new(client, options.provisioner_name.clone())
        .namespace(namespace.clone())
        .journal_namespace(journal_namespace.clone())
        .lease_name(lease_name)
        .remove_pv_finalizers(options.remove_pv_finalizers)
        .run()
        .await
        .map_err(|error| {
            anyhow!(
                "the uninstall of the provisioner {:?} (journal of the Lease {lease}) stopped: {}; what was removed stays removed, run it again to continue",
                options.provisioner_name,
                chain(&error)
            )
        })?;
    write_report(
        &report,
        &journal_namespace,
        options.remove_pv_finalizers,
        out,
    )
    .map_err(anyhow::Error::from)?;
    Ok(report)
}

/// An error when the Lease `namespace/name` is held and not expired: a controller runs.
async fn not_running(client: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = leases.get_opt(name).await.map_err(|error| {
        anyhow!(
            "cannot read the Lease {namespace}/{name} to check that the controller is stopped: {}",
            chain(&error)
        )
    })?;
    let Some(spec) = lease.and_then(|l| l.spec) else {
        return Ok(());
    };
    let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
        return Ok(());
    };
    let renewed = spec
        .renew_time
        .or(spec.acquire_time)
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    let expires = renewed.checked_add(duration).unwrap_or(renewed);
    let now = Timestamp::now();
    if expires > now {
        let left = expires.duration_since(now).as_secs().max(1);
        return Err(anyhow!(
            "the controller still runs: the Lease {namespace}/{name} is held by {holder} (it expires in {left} s unless renewed); stop every replica (scale its Deployment to 0), then run uninstall again"
        ));
    }
    Ok(())
}

/// Writes `report` for a person: what went, and what to check in vCenter.
fn write_report(
    report: &UninstallReport,
    namespace: &str,
    removed_finalizers: bool,
    out: &mut (dyn Write + Send),
) -> std::io::Result<()> {
    writeln!(
        out,
        "journal objects deleted: {}",
        report.objects_deleted.len()
    )?;
    for name in &report.objects_deleted {
        writeln!(out, "  configmap {namespace}/{name}")?;
    }
    let (in_flight, settled): (Vec<_>, Vec<_>) = report.records.iter().partition(|r| r.in_flight);
    if in_flight.is_empty() {
        writeln!(out, "provisionings in flight: none")?;
    } else {
        writeln!(
            out,
            "provisionings in flight: {} (their CNS volumes may exist in vCenter without a PV)",
            in_flight.len()
        )?;
        for record in in_flight {
            writeln!(
                out,
                "  check the backend for volume {} (claim {}): a CNS volume of that name that no PV names is left over",
                record.pv_name, record.claim
            )?;
        }
    }
    writeln!(
        out,
        "settled records: {} (a PV records each volume; nothing to check)",
        settled.len()
    )?;
    if removed_finalizers {
        writeln!(
            out,
            "PV finalizers removed: {}",
            report.finalizers_removed.len()
        )?;
        for name in &report.finalizers_removed {
            writeln!(out, "  persistentvolume {name}: {FINALIZER_PV}")?;
        }
    } else {
        writeln!(
            out,
            "PV finalizers kept ({FINALIZER_PV}): with --remove-pv-finalizers they go too, when no provisioner of this name will run again"
        )?;
    }
    out.flush()
}
