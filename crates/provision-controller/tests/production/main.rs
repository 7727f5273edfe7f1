//! The controller in production shape against kube-sim: leader election between
//! replicas, failover, graceful handover, lease loss, the metrics and probe endpoint,
//! crash-safe provisioning and the uninstall. Short lease timings (2 s lease, 1 s renew
//! deadline, 200 ms retry period) keep the tests fast; assertions are on counts and
//! states, with generous time bounds only where the timing is the behaviour under test.

mod crash;
mod failover;
mod late;
mod namespace;
mod probes;
mod uninstall;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use kube_controller_kit::backoff::ItemExponentialLimiter;
use kube_sim::KubeSim;
/// Polls a check until it returns `Some` (or `true`), failing the test after 20 s.
pub(crate) use kube_sim::wait::eventually;
use provision_controller::{
    Config, FailureBackoff, LeaderElection, ProvisionController, PvSaveStrategy, client,
    testing::{FakeProvisioner, class, pvc},
};
use tokio::{sync::oneshot, task::JoinHandle};

pub(crate) const ME: &str = "example.com/fake";
/// The Lease the controllers elect on: the provisioner name with '/' replaced by '-'.
pub(crate) const LEASE_NAME: &str = "example.com-fake";
pub(crate) const LEASE: Duration = Duration::from_secs(2);
pub(crate) const RENEW: Duration = Duration::from_secs(1);
pub(crate) const RETRY: Duration = Duration::from_millis(200);

pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
}

pub(crate) async fn sim() -> KubeSim {
    init_tracing();
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    Api::<StorageClass>::all(sim.client())
        .create(
            &PostParams::default(),
            &class("fast").provisioner(ME).build(),
        )
        .await
        .unwrap();
    sim
}

/// Leader election with the short test timings and a fixed identity.
pub(crate) fn election(identity: &str) -> LeaderElection {
    LeaderElection::default()
        .identity(identity)
        .lease_duration(LEASE)
        .renew_deadline(RENEW)
        .retry_period(RETRY)
}

/// Fast retries, no periodic resync during a test, leader election as given.
pub(crate) fn config(election: Option<LeaderElection>) -> Config {
    Config::default()
        .resync_period(Duration::from_secs(300))
        .leader_election(election)
        .failure_backoff(FailureBackoff::Custom(Arc::new(
            ItemExponentialLimiter::new(Duration::from_millis(50), Duration::from_millis(500)),
        )))
        .pv_save(PvSaveStrategy::Blocking {
            retries: 3,
            interval: Duration::from_millis(20),
        })
}

/// A free loopback port for a metrics server.
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// One controller process: `run` in a task, stoppable gracefully or killed.
pub(crate) struct Replica {
    pub(crate) fake: FakeProvisioner,
    pub(crate) metrics: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    run: Option<JoinHandle<Result<(), provision_controller::Error>>>,
}

impl Replica {
    /// Starts a controller on `sim`, with a dedicated leader-election client and, when
    /// `with_metrics`, the metrics server on a free loopback port.
    pub(crate) fn start(
        sim: &KubeSim,
        fake: FakeProvisioner,
        config: Config,
        with_metrics: bool,
    ) -> Self {
        Self::start_driver(sim, fake.clone(), fake, config, with_metrics)
    }

    /// [`start`](Self::start) with `driver` (typically wrapping `fake`) as the provisioner.
    pub(crate) fn start_driver(
        sim: &KubeSim,
        fake: FakeProvisioner,
        driver: impl provision_controller::Provisioner,
        config: Config,
        with_metrics: bool,
    ) -> Self {
        let metrics = with_metrics.then(|| SocketAddr::from(([127, 0, 0, 1], free_port())));
        let config = match metrics {
            Some(addr) => config.metrics_address(addr.ip()).metrics_port(addr.port()),
            None => config,
        };
        let kube_config = kube_client::Config::new(sim.url().parse().unwrap());
        let controller = ProvisionController::new(sim.client(), ME, driver)
            .asset_lookup(fake.clone())
            .late_assets(fake.clone())
            .config(config)
            .leader_election_client(client::for_leader_election(&kube_config).unwrap());
        let (stop, stopped) = oneshot::channel();
        let run = tokio::spawn(controller.run(async {
            let _ = stopped.await;
        }));
        Self {
            fake,
            metrics,
            stop: Some(stop),
            run: Some(run),
        }
    }

    /// Graceful shutdown: returns what `run` returned.
    pub(crate) async fn stop(mut self) -> Result<(), provision_controller::Error> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(15), self.run.take().unwrap())
            .await
            .expect("run returns after shutdown")
            .expect("run does not panic")
    }

    /// Waits for `run` to return on its own (e.g. after losing the lease).
    pub(crate) async fn finished(mut self) -> Result<(), provision_controller::Error> {
        tokio::time::timeout(Duration::from_secs(15), self.run.take().unwrap())
            .await
            .expect("run returns")
            .expect("run does not panic")
    }

    /// A crash: the `run` future is dropped mid-flight, nothing is released.
    pub(crate) async fn kill(mut self) {
        let run = self.run.take().unwrap();
        run.abort();
        let _ = run.await;
    }

    /// GET `path` on this replica's metrics server: (status, body).
    pub(crate) async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.metrics.expect("started with metrics"), path).await
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(run) = self.run.take() {
            run.abort();
        }
    }
}

/// A minimal HTTP/1.1 GET; `None` when nothing listens yet.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

pub(crate) fn claims(sim: &KubeSim) -> Api<PersistentVolumeClaim> {
    Api::namespaced(sim.client(), "default")
}

pub(crate) fn volumes(sim: &KubeSim) -> Api<PersistentVolume> {
    Api::all(sim.client())
}

/// Creates a claim of class `fast`; returns its PV name (`pvc-<uid>`).
pub(crate) async fn create_claim(sim: &KubeSim, name: &str) -> String {
    let created = claims(sim)
        .create(
            &PostParams::default(),
            &pvc(name).storage_class("fast").build(),
        )
        .await
        .unwrap();
    format!("pvc-{}", created.metadata.uid.unwrap())
}

pub(crate) async fn delete_claim(sim: &KubeSim, name: &str) {
    claims(sim)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Waits until the claim is Bound to `pv`.
pub(crate) async fn bound(sim: &KubeSim, name: &str, pv: &str) {
    let claims = claims(sim);
    eventually(&format!("claim {name} bound to {pv}"), || {
        let claims = claims.clone();
        async move {
            let c = claims.get_opt(name).await.ok()??;
            let phase = c.status.as_ref()?.phase.clone();
            (phase.as_deref() == Some("Bound") && c.spec?.volume_name.as_deref() == Some(pv))
                .then_some(())
        }
    })
    .await;
}

/// The holder of the controllers' Lease, if any.
pub(crate) async fn lease_holder(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), "default")
        .get_opt(LEASE_NAME)
        .await
        .ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

pub(crate) async fn wait_holder(sim: &KubeSim, identity: &str) {
    let client = sim.client();
    eventually(&format!("{identity} holds the lease"), || {
        let client = client.clone();
        async move { (lease_holder(&client).await.as_deref() == Some(identity)).then_some(()) }
    })
    .await;
}

/// Every entry of every provisioning journal in the cluster: (claim uid, entry JSON, the
/// class snapshot it refers to, if any).
pub(crate) async fn journal(
    sim: &KubeSim,
) -> Vec<(String, serde_json::Value, Option<StorageClass>)> {
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::all(sim.client());
    let params = kube_client::api::ListParams::default()
        .labels(provision_controller::annotations::JOURNAL_LABEL);
    let mut out = Vec::new();
    for cm in maps.list(&params).await.unwrap().items {
        let data = cm.data.unwrap_or_default();
        for (key, value) in &data {
            let Some(uid) = key.strip_prefix("e.") else {
                continue;
            };
            let entry: serde_json::Value = serde_json::from_str(value).unwrap();
            let class = entry["c"]
                .as_str()
                .and_then(|c| data.get(&format!("k.{c}")))
                .map(|json| serde_json::from_str(json).unwrap());
            out.push((uid.to_owned(), entry, class));
        }
    }
    out
}

/// Whether the journal holds an intent (a provisioning whose asset no PV records) for the
/// claim `uid`.
pub(crate) async fn has_intent(sim: &KubeSim, uid: &str) -> bool {
    journal(sim)
        .await
        .iter()
        .any(|(u, e, _)| u == uid && e.get("d").is_none())
}
