//! The sidecar in-process, killable: a [`CsiProvisioner`] over [`GrpcCsi`] to a
//! [`MockCsiDriver`], under a [`ProvisionController`], on a Tokio runtime of its own (its
//! own thread), so that a kill drops every task in the middle of what it was doing, as
//! SIGKILL would. And the leak check the leak and chaos tests end with.

#![allow(dead_code, unreachable_pub)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use csi_provisioner::{
    CsiOptions, CsiProvisioner, DriverCapabilities,
    csi::GrpcCsi,
    start::{self, StartConfig},
    testing::MockCsiDriver,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube_client::{Api, Client, api::ListParams};
use provision_controller::{Config, FailureBackoff, ProvisionController, PvSaveStrategy};
use tokio::{runtime::Runtime, sync::oneshot, time::Instant};

/// The driver's name in these tests.
pub const DRIVER: &str = "mock.csi.example.com";

/// How the sidecar is set up.
#[derive(Clone, Debug)]
pub struct SidecarSpec {
    /// The API server (kube-sim's URL).
    pub kube_url: String,
    /// The driver's `--csi-address`.
    pub csi_address: String,
    /// Each CSI call's limit (`--timeout`).
    pub call_timeout: Duration,
    /// The first and the longest retry delay (`--retry-interval-start`, `-max`).
    pub retry: (Duration, Duration),
}

impl SidecarSpec {
    /// The sidecar for `mock` on the API server at `kube_url`: 2 s per call, retries from
    /// 20 ms to 500 ms.
    pub fn new(kube_url: &str, mock: &MockCsiDriver) -> Self {
        Self {
            kube_url: kube_url.to_owned(),
            csi_address: mock.address(),
            call_timeout: Duration::from_secs(2),
            retry: (Duration::from_millis(20), Duration::from_millis(500)),
        }
    }

    /// Sets the CSI call timeout.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }
}

/// One life of the sidecar.
pub struct Sidecar {
    runtime: Option<Runtime>,
    stop: Option<oneshot::Sender<()>>,
    exit: oneshot::Receiver<Result<(), String>>,
}

impl Sidecar {
    /// Starts the sidecar as the binary does: the start sequence against the driver, then
    /// the controller with upstream's options (retries forever with a per-claim backoff,
    /// PVs saved in the background, the PV finalizer), leader election off.
    pub fn start(spec: &SidecarSpec) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sidecar")
            .enable_all()
            .build()
            .expect("a runtime for the sidecar");
        let (stop, stopped) = oneshot::channel::<()>();
        let (exited, exit) = oneshot::channel();
        let spec = spec.clone();
        runtime.spawn(async move {
            let result = run(spec, stopped).await;
            let _ = exited.send(result);
        });
        Self {
            runtime: Some(runtime),
            stop: Some(stop),
            exit,
        }
    }

    /// Kills it: its runtime goes with every task mid-call (a CSI call in flight is cut off
    /// on the client's side; the driver may still finish it).
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Whether it exited by itself (an error, or a start sequence that gave up), and how.
    pub fn exited(&mut self) -> Option<Result<(), String>> {
        self.exit.try_recv().ok()
    }

    /// Stops it gracefully (as SIGTERM: operations in flight finish) and waits for it.
    pub async fn stop(mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let exit = std::mem::replace(&mut self.exit, oneshot::channel().1);
        let result = tokio::time::timeout(Duration::from_secs(20), exit)
            .await
            .map_err(|_| "the sidecar did not stop within 20 s".to_owned())
            .and_then(|r| r.map_err(|_| "the sidecar vanished".to_owned()))
            .and_then(|r| r);
        self.kill();
        result
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn run(spec: SidecarSpec, stopped: oneshot::Receiver<()>) -> Result<(), String> {
    let driver = GrpcCsi::new(&spec.csi_address, spec.call_timeout).map_err(|e| e.to_string())?;
    let quick = StartConfig::default()
        .socket_timeout(Duration::from_secs(20))
        .probe_timeout(Duration::from_secs(20))
        .retry_interval(Duration::from_millis(20))
        .log_intervals(Duration::from_millis(500), Duration::from_secs(5));
    let info = start::start(&driver, driver.socket(), &quick)
        .await
        .map_err(|e| format!("start: {e}"))?;
    let config = kube_client::Config::new(spec.kube_url.parse().map_err(|e| format!("{e}"))?);
    let client = provision_controller::client::from_config(config).map_err(|e| e.to_string())?;
    let options = CsiOptions::default();
    let controller_config = Config::default()
        .leader_election(None)
        .failed_provision_threshold(0)
        .failed_delete_threshold(0)
        .failure_backoff(FailureBackoff::PerKey {
            initial: spec.retry.0,
            max: spec.retry.1,
        })
        .pv_save(PvSaveStrategy::background())
        .add_finalizer(true)
        .shutdown_grace(Duration::from_secs(5))
        .volume_namer(options.volume_namer());
    let provisioner = CsiProvisioner::new(
        Arc::new(driver),
        client.clone(),
        info.name.clone(),
        DriverCapabilities::default(),
        options,
    )
    .map_err(|e| e.to_string())?;
    ProvisionController::new(client, info.name, provisioner)
        .config(controller_config)
        .run(async {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| provision_controller::error_chain(&e))
}

/// What is left once the claims are gone, or what does not match while they exist.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leaks {
    /// Volumes on the driver that no PV names (`name id`).
    pub volumes_without_pv: Vec<String>,
    /// PVs of the driver whose volume is not on the driver.
    pub pvs_without_volume: Vec<String>,
    /// Claims that still exist (`namespace/name`, with a deletion mark when terminating).
    pub claims: Vec<String>,
    /// PVs that still exist.
    pub pvs: Vec<String>,
}

impl Leaks {
    /// Nothing leaked and nothing left.
    pub fn is_clean(&self) -> bool {
        *self == Self::default()
    }

    /// Every mock volume has its PV and every PV its volume (claims and PVs may exist).
    pub fn is_consistent(&self) -> bool {
        self.volumes_without_pv.is_empty() && self.pvs_without_volume.is_empty()
    }
}

/// Compares the driver's volumes with the PVs, and lists the claims and PVs left.
pub async fn leaks(client: &Client, mock: &MockCsiDriver) -> Leaks {
    let pvs: Vec<PersistentVolume> = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list PVs")
        .items;
    let claims: Vec<PersistentVolumeClaim> = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list claims")
        .items;
    let handles: BTreeMap<String, String> = pvs
        .iter()
        .filter_map(|pv| {
            let csi = pv.spec.as_ref()?.csi.as_ref()?;
            Some((
                csi.volume_handle.clone(),
                pv.metadata.name.clone().unwrap_or_default(),
            ))
        })
        .collect();
    let ids: BTreeSet<String> = mock.volumes().into_iter().map(|v| v.id).collect();
    Leaks {
        volumes_without_pv: mock
            .volumes()
            .into_iter()
            .filter(|v| !handles.contains_key(&v.id))
            .map(|v| format!("{} {}", v.name, v.id))
            .collect(),
        pvs_without_volume: handles
            .iter()
            .filter(|(id, _)| !ids.contains(*id))
            .map(|(id, pv)| format!("{pv} {id}"))
            .collect(),
        claims: claims
            .iter()
            .map(|c| {
                format!(
                    "{}/{}{}",
                    c.metadata.namespace.as_deref().unwrap_or_default(),
                    c.metadata.name.as_deref().unwrap_or_default(),
                    if c.metadata.deletion_timestamp.is_some() {
                        " (terminating)"
                    } else {
                        ""
                    }
                )
            })
            .collect(),
        pvs: pvs
            .iter()
            .map(|pv| pv.metadata.name.clone().unwrap_or_default())
            .collect(),
    }
}

/// Waits until [`leaks`] is clean, up to `limit`; the last findings on failure.
pub async fn until_clean(client: &Client, mock: &MockCsiDriver, limit: Duration) -> Leaks {
    let deadline = Instant::now() + limit;
    loop {
        let found = leaks(client, mock).await;
        if found.is_clean() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `done` every 20 ms until it holds, panicking with `what` after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The class every claim of these tests names: the mock driver's, `Immediate`, `Delete`.
pub const CLASS: &str = "csi";

/// kube-sim (with its PV binder, as kube-controller-manager) from `builder`, the mock
/// driver serving, the class created.
pub async fn world(builder: kube_sim::Builder) -> (kube_sim::KubeSim, MockCsiDriver) {
    let sim = builder
        .pv_binder(true)
        .start()
        .await
        .expect("kube-sim starts");
    let (mock, _socket) = MockCsiDriver::start(DRIVER).expect("the mock driver starts");
    let class = provision_controller::testing::class(CLASS)
        .provisioner(DRIVER)
        .reclaim_policy("Delete")
        .build();
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(sim.client())
        .create(&kube_client::api::PostParams::default(), &class)
        .await
        .expect("class created");
    (sim, mock)
}

/// Creates the claim `name` (1 GiB of [`CLASS`]) in `default`; returns the CreateVolume
/// name its volume gets (`pvc-<uid>`).
pub async fn create_claim(client: &Client, name: &str) -> String {
    let claim = provision_controller::testing::pvc(name)
        .storage_class(CLASS)
        .request("1Gi")
        .build();
    let created = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .create(&kube_client::api::PostParams::default(), &claim)
        .await
        .expect("claim created");
    format!("pvc-{}", created.metadata.uid.unwrap_or_default())
}

/// Deletes the claim `name` (already gone is fine).
pub async fn delete_claim(client: &Client, name: &str) {
    match Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .delete(name, &kube_client::api::DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube_client::Error::Api(status)) if status.is_not_found() => {}
        Err(error) => panic!("delete claim {name}: {error}"),
    }
}

/// Whether the claim `name` is gone.
pub async fn claim_gone(client: &Client, name: &str) -> bool {
    matches!(
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
            .get_opt(name)
            .await,
        Ok(None)
    )
}

/// Whether the claim `name` is bound.
pub async fn claim_bound(client: &Client, name: &str) -> bool {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.status?.phase)
        .as_deref()
        == Some("Bound")
}

/// How many PVs exist.
pub async fn pv_count(client: &Client) -> usize {
    Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list PVs")
        .items
        .len()
}
