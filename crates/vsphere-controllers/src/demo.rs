//! The demo: both controllers against kube-sim (with its PV binder) and the CNS simulator.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use cnsmetadata::{CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference, EntityType};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::api::{DeleteParams, PostParams};
use kube_client::{Api, Client};
use kube_sim::KubeSim;
use provision_controller::LeaderElection;
use tokio::time::Instant;
use vsphere_cns::simulator::CnsSimulator;
use vsphere_cns::{ClusterFlavor, CnsClient, CnsMetadataBackend, CnsProvisioner, MoRef};

use crate::app::{Settings, start_controllers};

/// The StorageClass the demo creates.
pub const CLASS: &str = "vsphere-demo";
const NAMESPACE: &str = "default";
const DATASTORE_ID: &str = "datastore-101";
const DATASTORE_NAME: &str = "DemoDS";
const DATASTORE_URL: &str = "ds:///vmfs/volumes/demo-datastore/";
const SUPERVISOR_CLUSTER: &str = "demo-supervisor";
const GUEST_CLUSTER: &str = "demo-guest";
const SIZES: [&str; 3] = ["1Gi", "1500Mi", "2G"];
const POLL: Duration = Duration::from_millis(100);

/// What the demo does.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// How many claims to create.
    pub claims: usize,
    /// The provisioner name (the class's `provisioner`).
    pub provisioner_name: String,
    /// Leader election for the provision controller.
    pub leader_election: bool,
    /// Where the provision controller serves metrics, if anywhere.
    pub metrics_address: Option<SocketAddr>,
    /// Keep running after provisioning until the shutdown (SIGTERM or Ctrl-C in the
    /// binary), for `kubectl`.
    pub serve: bool,
    /// Limit of each wait.
    pub timeout: Duration,
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The claim name.
    pub claim: String,
    /// The PV bound to it.
    pub pv: String,
    /// The CNS volume ID (the PV's volume handle).
    pub volume_id: String,
    /// The PV's capacity.
    pub size: String,
    /// Whether the simulator holds the claim's entity metadata for the volume.
    pub synced: bool,
}

/// What the demo provisioned and what was left at the end.
#[derive(Clone, Debug)]
pub struct DemoReport {
    /// One row per claim.
    pub rows: Vec<Row>,
    /// CNS volumes the simulator still held when the demo ended (0 unless `--serve`).
    pub volumes_left: usize,
}

struct Demo<'a> {
    kube: Client,
    cns: &'a CnsSimulator,
    started: Instant,
    timeout: Duration,
    out: &'a mut (dyn Write + Send),
}

impl Demo<'_> {
    fn say(&mut self, claim: &str, message: &str) -> anyhow::Result<()> {
        let elapsed = self.started.elapsed().as_secs_f64();
        writeln!(self.out, "[{elapsed:>5.1}s] {claim:<14} {message}")?;
        Ok(())
    }

    fn line(&mut self, text: &str) -> anyhow::Result<()> {
        writeln!(self.out, "{text}")?;
        Ok(())
    }

    fn synced(&self, volume_id: &str, claim: &str) -> bool {
        self.cns
            .volumes()
            .iter()
            .filter(|v| v.id.as_str() == volume_id)
            .flat_map(|v| &v.metadata.entity_metadata)
            .any(|e| {
                e.entity_type == vsphere_cns::wire::EntityType::PersistentVolumeClaim
                    && e.entity_name == claim
                    && e.cluster_id.as_deref() == Some(GUEST_CLUSTER)
            })
    }

    fn volume_exists(&self, volume_id: &str) -> bool {
        self.cns
            .volumes()
            .iter()
            .any(|v| v.id.as_str() == volume_id)
    }
}

/// Runs the demo and returns the table it printed.
///
/// With `options.serve`, it keeps running after provisioning until `shutdown` completes;
/// without, it deletes everything and returns (or stops early, failing, if `shutdown`
/// completes first). Either way it then stops the controllers as the real run does
/// (within [`Settings::stop_deadline`]), checks that the Lease was released (when leader
/// election is on), logs out of the CNS simulator, and writes one last line, for example
/// `stopped: lease default/csi.vsphere.vmware.com released, vCenter session logged out`.
///
/// # Errors
/// When a simulator cannot start, an API call fails, a step does not finish within
/// `options.timeout`, or `shutdown` completes before the claims are provisioned (and,
/// without `serve`, deleted).
pub async fn run_demo(
    options: &DemoOptions,
    shutdown: impl Future<Output = ()>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<DemoReport> {
    let kube_sim = KubeSim::builder()
        .pv_binder(true)
        .start()
        .await
        .context("cannot start kube-sim")?;
    let cns = CnsSimulator::builder()
        .datastore(DATASTORE_ID, DATASTORE_NAME, DATASTORE_URL)
        .start()
        .await
        .context("cannot start the CNS simulator")?;
    let kube = kube_sim.client();
    let cns_client = CnsClient::connect(&cns.vc_config())
        .await
        .context("cannot log in to the CNS simulator")?;
    let provisioner = CnsProvisioner::new(
        cns_client.clone(),
        SUPERVISOR_CLUSTER,
        ClusterFlavor::Workload,
    )?
    .datastore_url(DATASTORE_URL, MoRef::datastore(DATASTORE_ID));
    // The Lease in the demo's namespace, where the stop reads it back.
    let election = LeaderElection::default().namespace(NAMESPACE);
    let lease_name = LeaderElection::lease_name_for(&options.provisioner_name);
    let settings = Settings {
        provisioner_name: options.provisioner_name.clone(),
        leader_election: options.leader_election,
        metrics_address: options.metrics_address,
        flavor: cnsmetadata::ClusterFlavor::Workload,
        cluster_id: SUPERVISOR_CLUSTER.to_owned(),
        supervisor_id: None,
        vsphere_user: cns_client.user().to_owned(),
        provision_config: provision_controller::Config::default().leader_election(Some(election)),
        metadata_config: Ok(cnsmetadata::Config::default()),
        feature_states: crate::FeatureStates::default(),
    };
    let mut demo = Demo {
        kube: kube.clone(),
        cns: &cns,
        started: Instant::now(),
        timeout: options.timeout,
        out,
    };
    demo.line(&format!(
        "kube-sim at {}, CNS simulator at {} (datastore {DATASTORE_URL})",
        kube_sim.url(),
        cns.url()
    ))?;
    install(&kube, &options.provisioner_name).await?;
    let running = start_controllers(
        kube.clone(),
        provisioner,
        CnsMetadataBackend::new(cns_client.clone()),
        &settings,
    );
    tokio::pin!(shutdown);
    let result = tokio::select! {
        result = steps(&mut demo, options, &kube_sim) => result,
        () = &mut shutdown => Err(anyhow!("asked to stop before the demo finished")),
    };
    if options.serve && result.is_ok() {
        shutdown.await;
        demo.line("stopping")?;
    }
    let deadline = running.stop_deadline();
    let stopped = running.stop(deadline).await;
    let lease = if options.leader_election {
        lease_state(&kube, &lease_name).await
    } else {
        "no lease (leader election off)".to_owned()
    };
    let logout = crate::app::logout(&cns_client).await;
    demo.line(&format!("stopped: {lease}, {logout}"))?;
    demo.out.flush()?;
    let volumes_left = cns.volumes().len();
    cns.shutdown().await;
    kube_sim.shutdown().await;
    let rows = result?;
    stopped?;
    Ok(DemoReport { rows, volumes_left })
}

/// Whether the demo's Lease was released: read back from the API server after the stop.
async fn lease_state(kube: &Client, name: &str) -> String {
    let lease = format!("lease {NAMESPACE}/{name}");
    match Api::<Lease>::namespaced(kube.clone(), NAMESPACE)
        .get_opt(name)
        .await
    {
        Ok(Some(found)) => match found.spec.and_then(|s| s.holder_identity) {
            Some(holder) if !holder.is_empty() => format!("{lease} still held by {holder}"),
            _ => format!("{lease} released"),
        },
        Ok(None) => format!("{lease} never created"),
        Err(error) => format!("{lease} unreadable ({error})"),
    }
}

/// Installs the CRD and the StorageClass.
async fn install(kube: &Client, provisioner_name: &str) -> anyhow::Result<()> {
    Api::<CustomResourceDefinition>::all(kube.clone())
        .create(&PostParams::default(), &cnsmetadata::crd())
        .await
        .context("cannot install the CnsVolumeMetadata CRD")?;
    // The supervisor's feature states, as its install ships them (the demo has no
    // supervisor ID, so TKGsHA is off): the reconciler reads them before it starts.
    crate::FeatureStates::supervisor()
        .create(kube, &[(crate::TKGS_HA, "false")])
        .await
        .context("cannot create the feature-state ConfigMap")?;
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(CLASS.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: provisioner_name.to_owned(),
        parameters: Some(BTreeMap::from([
            ("datastoreurl".to_owned(), DATASTORE_URL.to_owned()),
            ("csi.storage.k8s.io/fstype".to_owned(), "ext4".to_owned()),
        ])),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("Immediate".to_owned()),
        ..StorageClass::default()
    };
    Api::<StorageClass>::all(kube.clone())
        .create(&PostParams::default(), &class)
        .await
        .context("cannot create the StorageClass")?;
    Ok(())
}

fn claim_object(name: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some(CLASS.to_owned()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(size.to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// The guest cluster's view of a claim, as pvCSI reports it: a PVC entity that uses the
/// supervisor claim `claim` and refers to the guest PV.
fn metadata_object(claim: &str, pv: &str) -> CnsVolumeMetadata {
    CnsVolumeMetadata::new(
        &format!("{claim}-pvc"),
        CnsVolumeMetadataSpec {
            volume_names: vec![claim.to_owned()],
            guest_cluster_id: GUEST_CLUSTER.to_owned(),
            entity_type: EntityType::PersistentVolumeClaim,
            entity_name: claim.to_owned(),
            entity_references: vec![EntityReference::new(
                EntityType::PersistentVolume,
                pv,
                "",
                GUEST_CLUSTER,
            )],
            labels: BTreeMap::from([("app".to_owned(), "vsphere-demo".to_owned())]),
            namespace: NAMESPACE.to_owned(),
            cluster_distribution: String::new(),
        },
    )
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Bound,
    Synced,
    MetadataRemoved,
    Deleted,
}

/// The demo's claims, volumes and CnsVolumeMetadata objects.
struct Apis {
    claims: Api<PersistentVolumeClaim>,
    volumes: Api<PersistentVolume>,
    metadata: Api<CnsVolumeMetadata>,
}

async fn steps(
    demo: &mut Demo<'_>,
    options: &DemoOptions,
    kube_sim: &KubeSim,
) -> anyhow::Result<Vec<Row>> {
    let apis = Apis {
        claims: Api::namespaced(demo.kube.clone(), NAMESPACE),
        volumes: Api::all(demo.kube.clone()),
        metadata: Api::namespaced(demo.kube.clone(), NAMESPACE),
    };
    let names: Vec<String> = (1..=options.claims)
        .map(|i| format!("demo-claim-{i}"))
        .collect();
    for (i, name) in names.iter().enumerate() {
        let size = SIZES[i % SIZES.len()];
        apis.claims
            .create(&PostParams::default(), &claim_object(name, size))
            .await
            .with_context(|| format!("cannot create claim {name}"))?;
        demo.say(name, &format!("created, {size}, class {CLASS}"))?;
    }
    let rows = provision_and_sync(demo, &apis, &names).await?;
    demo.line("")?;
    demo.line(&table(&rows))?;

    if options.serve {
        let path = kube_sim.kubeconfig_path().display().to_string();
        demo.line(&format!(
            "serving; kubeconfig: {path}\n  try: KUBECONFIG={path} kubectl get sc,pvc,pv,cnsvolumemetadatas\n\
             press Ctrl-C (or send SIGTERM) to stop"
        ))?;
        demo.out.flush()?;
        return Ok(rows);
    }
    delete_all(demo, &apis, &rows).await?;
    let left = demo.cns.volumes().len();
    demo.line(&format!(
        "done: {} provisioned, synced and deleted; the CNS simulator holds {left} volumes",
        plural(rows.len(), "claim")
    ))?;
    Ok(rows)
}

/// Waits until every claim of `names` is bound (then its CnsVolumeMetadata is created)
/// and its metadata synced to CNS; a row per claim.
async fn provision_and_sync(
    demo: &mut Demo<'_>,
    apis: &Apis,
    names: &[String],
) -> anyhow::Result<Vec<Row>> {
    let (claims_api, volumes_api, metadata_api) = (&apis.claims, &apis.volumes, &apis.metadata);
    let mut rows: Vec<Option<Row>> = vec![None; names.len()];
    let mut states = vec![State::Pending; names.len()];
    let deadline = Instant::now() + demo.timeout;
    while states.iter().any(|s| *s != State::Synced) {
        for (i, name) in names.iter().enumerate() {
            match states[i] {
                State::Pending => {
                    let Some(row) = bound_row(claims_api, volumes_api, name).await? else {
                        continue;
                    };
                    let message = format!("bound to {}, CNS volume {}", row.pv, row.volume_id);
                    demo.say(name, &message)?;
                    metadata_api
                        .create(&PostParams::default(), &metadata_object(name, &row.pv))
                        .await
                        .with_context(|| format!("cannot create CnsVolumeMetadata for {name}"))?;
                    rows[i] = Some(row);
                    states[i] = State::Bound;
                }
                State::Bound => {
                    let row = rows[i].as_mut().expect("bound claims have a row");
                    if demo.synced(&row.volume_id, name) {
                        row.synced = true;
                        states[i] = State::Synced;
                        demo.say(name, "metadata synced to CNS")?;
                    }
                }
                _ => {}
            }
        }
        wait_or_fail(
            deadline,
            demo.timeout,
            "claims to be provisioned and synced",
            names,
            &states,
        )
        .await?;
    }
    Ok(rows.into_iter().flatten().collect())
}

/// Deletes the CnsVolumeMetadata objects, then each claim once its metadata left CNS,
/// and waits until its PV and CNS volume are gone.
async fn delete_all(demo: &mut Demo<'_>, apis: &Apis, rows: &[Row]) -> anyhow::Result<()> {
    let (claims_api, volumes_api, metadata_api) = (&apis.claims, &apis.volumes, &apis.metadata);
    demo.line(&format!(
        "deleting {} CnsVolumeMetadata objects, then the claims",
        rows.len()
    ))?;
    for row in rows {
        metadata_api
            .delete(&format!("{}-pvc", row.claim), &DeleteParams::default())
            .await
            .with_context(|| format!("cannot delete CnsVolumeMetadata of {}", row.claim))?;
    }
    let mut states = vec![State::Synced; rows.len()];
    let deadline = Instant::now() + demo.timeout;
    while states.iter().any(|s| *s != State::Deleted) {
        for (i, row) in rows.iter().enumerate() {
            match states[i] {
                State::Synced => {
                    let gone = metadata_api.get_opt(&format!("{}-pvc", row.claim)).await?;
                    if gone.is_none() && !demo.synced(&row.volume_id, &row.claim) {
                        demo.say(&row.claim, "metadata removed from CNS")?;
                        claims_api
                            .delete(&row.claim, &DeleteParams::default())
                            .await
                            .with_context(|| format!("cannot delete claim {}", row.claim))?;
                        states[i] = State::MetadataRemoved;
                    }
                }
                State::MetadataRemoved => {
                    let pv_gone = volumes_api.get_opt(&row.pv).await?.is_none();
                    if pv_gone && !demo.volume_exists(&row.volume_id) {
                        let message = format!("claim, {} and CNS volume deleted", row.pv);
                        demo.say(&row.claim, &message)?;
                        states[i] = State::Deleted;
                    }
                }
                _ => {}
            }
        }
        let claim_names: Vec<String> = rows.iter().map(|r| r.claim.clone()).collect();
        wait_or_fail(
            deadline,
            demo.timeout,
            "the volumes to be deleted",
            &claim_names,
            &states,
        )
        .await?;
    }
    Ok(())
}

/// The row of claim `name` once it is bound to a CSI PV.
async fn bound_row(
    claims: &Api<PersistentVolumeClaim>,
    volumes: &Api<PersistentVolume>,
    name: &str,
) -> anyhow::Result<Option<Row>> {
    let claim = claims.get(name).await?;
    let Some(pv_name) = claim
        .spec
        .and_then(|s| s.volume_name)
        .filter(|n| !n.is_empty())
    else {
        return Ok(None);
    };
    let Some(pv) = volumes.get_opt(&pv_name).await? else {
        return Ok(None);
    };
    let spec = pv.spec.unwrap_or_default();
    let Some(csi) = spec.csi else {
        bail!("persistentvolume {pv_name} bound to claim {name} is not a CSI volume");
    };
    let size = spec
        .capacity
        .and_then(|c| c.get("storage").map(|q| q.0.clone()))
        .unwrap_or_default();
    Ok(Some(Row {
        claim: name.to_owned(),
        pv: pv_name,
        volume_id: csi.volume_handle,
        size,
        synced: false,
    }))
}

/// Sleeps one poll interval, or fails naming the claims that are not done.
async fn wait_or_fail(
    deadline: Instant,
    timeout: Duration,
    what: &str,
    names: &[String],
    states: &[State],
) -> anyhow::Result<()> {
    if Instant::now() >= deadline {
        let stuck: Vec<String> = names
            .iter()
            .zip(states)
            .map(|(name, state)| format!("{name}: {state:?}"))
            .collect();
        bail!(
            "timed out after {timeout:?} waiting for {what} ({})",
            stuck.join(", ")
        );
    }
    tokio::time::sleep(POLL).await;
    Ok(())
}

/// `n thing` or `n things`.
fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// The table of claims, PVs, volume IDs and sync state.
pub(crate) fn table(rows: &[Row]) -> String {
    let width = |f: fn(&Row) -> &str, title: &str| {
        rows.iter()
            .map(|r| f(r).len())
            .chain([title.len()])
            .max()
            .unwrap_or(0)
    };
    let (c, p, v, s) = (
        width(|r| &r.claim, "CLAIM"),
        width(|r| &r.pv, "PV"),
        width(|r| &r.volume_id, "CNS VOLUME ID"),
        width(|r| &r.size, "SIZE"),
    );
    let mut text = format!(
        "{:<c$}  {:<p$}  {:<v$}  {:<s$}  METADATA SYNCED",
        "CLAIM", "PV", "CNS VOLUME ID", "SIZE"
    );
    for row in rows {
        let synced = if row.synced { "yes" } else { "no" };
        let _ = write!(
            text,
            "\n{:<c$}  {:<p$}  {:<v$}  {:<s$}  {synced}",
            row.claim, row.pv, row.volume_id, row.size
        );
    }
    text
}
