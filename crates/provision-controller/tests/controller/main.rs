//! Whole-controller tests: a real `kube::Client` against kube-sim with its PV binder, and
//! the recording `FakeProvisioner`.

mod conformance;
mod crash_safe;
mod delete;
mod in_flight;

mod provision;
mod robust;
mod save;
mod slots;
mod upstream;

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim},
    events::v1::Event,
    storage::v1::StorageClass,
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use kube_sim::KubeSim;
/// Polls a check until it returns `Some` (or `true`), failing the test after 20 s.
pub(crate) use kube_sim::wait::eventually;

/// The finalizers the cluster itself puts on every claim and PV (kube-sim adds them at
/// creation and removes them as kube-controller-manager does, as a real cluster).
const PROTECTION: [&str; 2] = [
    "kubernetes.io/pvc-protection",
    "kubernetes.io/pv-protection",
];

/// The finalizers of an object other than the cluster's protection finalizers.
pub(crate) fn own_finalizers(finalizers: Option<&Vec<String>>) -> Vec<String> {
    finalizers
        .into_iter()
        .flatten()
        .filter(|f| !PROTECTION.contains(&f.as_str()))
        .cloned()
        .collect()
}
use kube_controller_kit::backoff::ItemExponentialLimiter;
use provision_controller::{
    Config, FailureBackoff, ProvisionController, PvSaveStrategy,
    testing::{FakeProvisioner, class, pvc},
};
use tokio::{sync::oneshot, task::JoinHandle};

pub(crate) const ME: &str = "example.com/fake";

/// A config for quick tests: short resync, fast retries, no leader election.
pub(crate) fn quick() -> Config {
    Config::default()
        .resync_period(Duration::from_secs(2))
        .leader_election(None)
        .failure_backoff(FailureBackoff::Custom(Arc::new(
            ItemExponentialLimiter::new(Duration::from_millis(50), Duration::from_millis(500)),
        )))
        .pv_save(PvSaveStrategy::Blocking {
            retries: 3,
            interval: Duration::from_millis(20),
        })
}

/// [`quick`] without resync, for tests that check that something happens only once.
pub(crate) fn quiet() -> Config {
    quick().resync_period(Duration::from_secs(300))
}

pub(crate) struct Env {
    pub(crate) sim: KubeSim,
    pub(crate) client: Client,
    pub(crate) fake: FakeProvisioner,
    stop: Option<oneshot::Sender<()>>,
    run: Option<JoinHandle<Result<(), provision_controller::Error>>>,
}

impl Env {
    pub(crate) async fn start(config: Config, fake: FakeProvisioner) -> Self {
        Self::start_with(config, fake, |c| c).await
    }

    pub(crate) async fn start_with(
        config: Config,
        fake: FakeProvisioner,
        build: impl FnOnce(ProvisionController) -> ProvisionController,
    ) -> Self {
        let driver = fake.clone();
        Self::start_driver(config, fake, driver, build).await
    }

    /// Runs the controller on `driver` (typically wrapping `fake`, which the test inspects).
    pub(crate) async fn start_driver(
        config: Config,
        fake: FakeProvisioner,
        driver: impl provision_controller::Provisioner,
        build: impl FnOnce(ProvisionController) -> ProvisionController,
    ) -> Self {
        Self::start_on(Self::sim().await, config, fake, driver, build).await
    }

    /// A fresh kube-sim with its PV binder, for [`start_on`](Self::start_on).
    pub(crate) async fn sim() -> KubeSim {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        KubeSim::builder().pv_binder(true).start().await.unwrap()
    }

    /// Runs the controller on `driver` against `sim`, which may hold objects already (a
    /// controller that starts, or restarts, on an existing cluster).
    pub(crate) async fn start_on(
        sim: KubeSim,
        config: Config,
        fake: FakeProvisioner,
        driver: impl provision_controller::Provisioner,
        build: impl FnOnce(ProvisionController) -> ProvisionController,
    ) -> Self {
        let client = sim.client();
        let controller = build(
            ProvisionController::new(client.clone(), ME, driver)
                .asset_lookup(fake.clone())
                .late_assets(fake.clone())
                .config(config),
        );
        let (stop, stopped) = oneshot::channel();
        let run = tokio::spawn(controller.run(async {
            let _ = stopped.await;
        }));
        Self {
            sim,
            client,
            fake,
            stop: Some(stop),
            run: Some(run),
        }
    }

    /// Stops the controller and checks that `run` ended cleanly.
    pub(crate) async fn stop(mut self) {
        self.stop_run().await;
    }

    async fn stop_run(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let run = self.run.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("run returns after shutdown")
            .unwrap()
            .unwrap();
    }

    /// Stops the controller (checking that `run` ended cleanly) and starts a new one on
    /// `driver` against the same sim: a replica restarted, or the next leader.
    #[allow(dead_code)]
    pub(crate) async fn restart(
        &mut self,
        config: Config,
        driver: impl provision_controller::Provisioner,
    ) {
        self.stop_run().await;
        let controller = ProvisionController::new(self.client.clone(), ME, driver)
            .asset_lookup(self.fake.clone())
            .late_assets(self.fake.clone())
            .config(config);
        let (stop, stopped) = oneshot::channel();
        self.run = Some(tokio::spawn(controller.run(async {
            let _ = stopped.await;
        })));
        self.stop = Some(stop);
    }

    pub(crate) fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), "default")
    }
    pub(crate) fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    pub(crate) async fn create_class(&self, class: StorageClass) {
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    pub(crate) async fn create_node(&self, name: &str) {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    /// Creates the claim and returns its UID.
    pub(crate) async fn create_claim(&self, claim: PersistentVolumeClaim) -> String {
        let created = self
            .claims()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap();
        created.metadata.uid.unwrap()
    }

    /// A WaitForFirstConsumer class `late`, a node `node-1`, and a claim `data` of that
    /// class on which the scheduler selected `node-1`.
    pub(crate) async fn create_scheduled_claim(&self) {
        self.create_class(
            class("late")
                .provisioner(ME)
                .wait_for_first_consumer()
                .build(),
        )
        .await;
        self.create_node("node-1").await;
        self.create_claim(
            pvc("data")
                .storage_class("late")
                .selected_node("node-1")
                .build(),
        )
        .await;
    }

    pub(crate) async fn delete_claim(&self, name: &str) {
        self.claims()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    pub(crate) async fn annotate_claim(&self, name: &str, key: &str, value: &str) {
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        self.claims()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// Waits until the claim is Bound and returns its PV.
    pub(crate) async fn bound_volume(&self, claim: &str) -> PersistentVolume {
        let claims = self.claims();
        let volume_name = eventually(&format!("claim {claim} bound"), || {
            let claims = claims.clone();
            async move {
                let c = claims.get_opt(claim).await.ok()??;
                let bound = c.status.as_ref()?.phase.as_deref() == Some("Bound");
                bound.then(|| c.spec?.volume_name).flatten()
            }
        })
        .await;
        self.volumes().get(&volume_name).await.unwrap()
    }

    pub(crate) async fn volume_gone(&self, name: &str) {
        let volumes = self.volumes();
        eventually(&format!("pv {name} deleted"), || {
            let volumes = volumes.clone();
            async move { volumes.get_opt(name).await.ok()?.is_none().then_some(()) }
        })
        .await;
    }

    /// Events of `reason` about the object named `name`, in namespace `default`.
    pub(crate) async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .collect()
    }

    pub(crate) async fn wait_event(&self, name: &str, reason: &str) -> Event {
        eventually(&format!("event {reason} on {name}"), || async {
            self.events(name, reason).await.into_iter().next()
        })
        .await
    }
}

/// Lets the controller run for a while (to show that something does NOT happen).
pub(crate) async fn settle() {
    tokio::time::sleep(Duration::from_millis(600)).await;
}

pub(crate) fn fast_class() -> StorageClass {
    class("fast").provisioner(ME).build()
}

pub(crate) fn claim(name: &str) -> PersistentVolumeClaim {
    pvc(name).storage_class("fast").build()
}

pub(crate) fn pvc_in(name: &str, class: &str) -> PersistentVolumeClaim {
    pvc(name).storage_class(class).build()
}

/// Whether the provisioning journal holds an intent (a provisioning whose asset no PV
/// records); `uid`: for that claim only.
pub(crate) async fn has_intent(env: &Env, uid: Option<&str>) -> bool {
    let maps: kube_client::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube_client::Api::all(env.sim.client());
    let params = kube_client::api::ListParams::default()
        .labels(provision_controller::annotations::JOURNAL_LABEL);
    maps.list(&params)
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|cm| cm.data.clone().unwrap_or_default())
        .any(|(key, value)| {
            key.strip_prefix("e.")
                .is_some_and(|u| uid.is_none_or(|want| want == u))
                && !value.contains("\"d\":")
        })
}
