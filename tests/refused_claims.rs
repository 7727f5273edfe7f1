//! A claim the vSphere provisioner refuses (a request it cannot make, a class parameter it
//! does not know) while a CNS volume of the claim's name exists: provision-controller with
//! `CnsProvisioner`, against kube-sim (with its PV binder) and the CNS simulator. The
//! volume is handed over as a PV, so a deleted claim is released and its volume reclaimed
//! (chaos seeds 2069, 4009, 4027: the claim stayed Terminating forever).

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use kube_sim::wait::Wait;
use provision_controller::{
    Config, ProvisionController,
    annotations::{ANN_STORAGE_PROVISIONER, JOURNAL_LABEL},
    testing::{class, pvc},
};
use vsphere_cns::simulator::CnsSimulator;
use vsphere_cns::{CSI_DRIVER, ClusterFlavor, CnsClient, CnsProvisioner, CnsVolumeId, MoRef};

const DS_URL: &str = "ds:///vmfs/volumes/test-ds/";
const DS_ID: &str = "datastore-7";
const CLUSTER: &str = "cluster-1";

/// kube-sim with its PV binder, the CNS simulator, and a client of each.
struct Env {
    kube: kube_sim::KubeSim,
    client: Client,
    cns: CnsSimulator,
}

impl Env {
    async fn start() -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let kube = kube_sim::KubeSim::builder()
            .pv_binder(true)
            .start()
            .await
            .unwrap();
        let client = kube.client();
        let cns = CnsSimulator::builder()
            .datastore(DS_ID, "TestDS", DS_URL)
            .start()
            .await
            .unwrap();
        Self { kube, client, cns }
    }

    /// Runs provision-controller with `CnsProvisioner` until the returned sender fires.
    async fn run_controller(
        &self,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    ) {
        let cns = CnsClient::connect(&self.cns.vc_config()).await.unwrap();
        // A PV younger than the settle window is deleted again until the window has
        // passed (a create another replica sent may still land): 1 s, not 6 minutes.
        let provisioner = CnsProvisioner::new(cns, CLUSTER, ClusterFlavor::Vanilla)
            .unwrap()
            .datastore_url(DS_URL, MoRef::datastore(DS_ID))
            .create_settle(Duration::from_secs(1));
        let config = Config::default()
            .leader_election(None)
            .resync_period(Duration::from_secs(2));
        let controller =
            ProvisionController::new(self.client.clone(), CSI_DRIVER, provisioner.clone())
                .asset_lookup(provisioner.clone())
                .late_assets(provisioner)
                .config(config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(async move {
            controller
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .map_err(anyhow::Error::from)
        });
        (stop, run)
    }

    async fn create_class(&self, parameters: &[(&str, &str)], reclaim_policy: &str) {
        let mut builder = class("vsphere")
            .provisioner(CSI_DRIVER)
            .reclaim_policy(reclaim_policy);
        for (key, value) in parameters {
            builder = builder.parameter(key, value);
        }
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &builder.build())
            .await
            .unwrap();
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Creates claim `name` of class `vsphere` requesting `request`; with `intent`, the
    /// controller's journal holds an intent for it, as a replica leaves it when it dies
    /// after its create was sent. Returns the claim's PV name, `pvc-<uid>`.
    async fn create_claim(&self, name: &str, request: &str, intent: bool) -> String {
        let builder = pvc(name)
            .storage_class("vsphere")
            .request(request)
            .annotation(ANN_STORAGE_PROVISIONER, CSI_DRIVER);
        let created = self
            .claims()
            .create(&PostParams::default(), &builder.build())
            .await
            .unwrap();
        let uid = created.metadata.uid.unwrap();
        let pv_name = format!("pvc-{uid}");
        if intent {
            // The journal of a controller without leader election: in the client's
            // namespace, under the lease name it would have (the provisioner name).
            let entry = serde_json::json!({
                "n": format!("default/{name}"),
                "v": pv_name,
                "t": k8s_openapi::jiff::Timestamp::now().as_second(),
                "w": "0badc0de",
                "r": created.spec,
            });
            let journal = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("{CSI_DRIVER}-journal-00000000")),
                    labels: Some([(JOURNAL_LABEL.to_owned(), CSI_DRIVER.to_owned())].into()),
                    ..ObjectMeta::default()
                },
                data: Some([(format!("e.{uid}"), entry.to_string())].into()),
                ..ConfigMap::default()
            };
            Api::<ConfigMap>::namespaced(self.client.clone(), "default")
                .create(&PostParams::default(), &journal)
                .await
                .unwrap();
        }
        pv_name
    }

    fn cns_ids(&self) -> Vec<String> {
        self.cns
            .volumes()
            .iter()
            .map(|v| v.id.to_string())
            .collect()
    }

    async fn shutdown(self) {
        self.cns.shutdown().await;
        drop(self.kube);
    }
}

/// Polls `check` every 50 ms for up to 60 s; on a timeout, panics with the claim, the
/// PV `pv_name` and the CNS volumes.
async fn wait_until<F, Fut>(env: &Env, pv_name: &str, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let wait = Wait::new()
        .limit(Duration::from_secs(60))
        .every(Duration::from_millis(50));
    if let Err(timed_out) = wait.poll(check).await {
        panic!(
            "{timed_out} waiting for {what}\n{}",
            state(env, pv_name).await
        );
    }
}

/// The claim, its PV and the CNS volumes, for a failure message.
async fn state(env: &Env, pv_name: &str) -> String {
    format!(
        "claim: {:?}\npv: {:?}\ncns: {:?}",
        env.claims().get_opt("data").await.unwrap(),
        env.volumes().get_opt(pv_name).await.unwrap(),
        env.cns.volumes()
    )
}

/// How many entries the controller's journal holds.
async fn journal_entries(env: &Env) -> usize {
    Api::<ConfigMap>::namespaced(env.client.clone(), "default")
        .list(&kube_client::api::ListParams::default().labels(JOURNAL_LABEL))
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|cm| cm.data.iter().flatten())
        .filter(|(key, _)| key.starts_with("e."))
        .count()
}

fn handle(volume: &PersistentVolume) -> Option<&str> {
    volume
        .spec
        .as_ref()?
        .csi
        .as_ref()
        .map(|c| c.volume_handle.as_str())
}

/// A claim deleted while the journal holds its intent, refused by the driver, with a
/// volume of its name: the cleanup saves a PV for the volume and the entry goes. Returns
/// the PV name and the volume's ID.
async fn deleted_refused_claim(
    env: &Env,
    parameters: &[(&str, &str)],
    reclaim_policy: &str,
    request: &str,
) -> (String, CnsVolumeId) {
    env.create_class(parameters, reclaim_policy).await;
    let pv_name = env.create_claim("data", request, true).await;
    // The volume an earlier attempt made (or a create that landed late).
    let id = env.cns.insert_volume(&pv_name, CLUSTER);
    env.claims()
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    // Nothing of ours holds the claim: it goes at once, and the journal entry is all the
    // cleanup has.
    wait_until(env, &pv_name, "the claim gone", || async {
        env.claims().get_opt("data").await.unwrap().is_none()
    })
    .await;
    (pv_name, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_claim_with_an_invalid_request_ends_gone_with_its_volume_deleted() {
    let env = Env::start().await;
    let (pv_name, id) =
        deleted_refused_claim(&env, &[("datastoreurl", DS_URL)], "Delete", "4Ei").await;
    assert_eq!(journal_entries(&env).await, 1);
    let (stop, run) = env.run_controller().await;

    wait_until(
        &env,
        &pv_name,
        "its PV and volume deleted, the journal entry gone",
        || async {
            env.volumes().get_opt(&pv_name).await.unwrap().is_none()
                && env.cns.volumes().is_empty()
                && journal_entries(&env).await == 0
        },
    )
    .await;
    let deletes = env
        .cns
        .requests()
        .iter()
        .filter(|r| r.method == "CnsDeleteVolume")
        .count();
    assert!(deletes >= 1, "the volume {id} was deleted through its PV");
    assert!(
        !env.cns
            .requests()
            .iter()
            .any(|r| r.method == "CnsCreateVolume"),
        "nothing was created"
    );

    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_claim_with_a_refused_class_parameter_and_retain_keeps_its_volume_in_a_pv() {
    let env = Env::start().await;
    let (pv_name, id) = deleted_refused_claim(
        &env,
        &[("datastoreurl", DS_URL), ("diskformat", "thin")],
        "Retain",
        "1Gi",
    )
    .await;
    let (stop, run) = env.run_controller().await;

    wait_until(
        &env,
        &pv_name,
        "the claim gone, its volume kept in a released PV",
        || async {
            env.claims().get_opt("data").await.unwrap().is_none()
                && env
                    .volumes()
                    .get_opt(&pv_name)
                    .await
                    .unwrap()
                    .is_some_and(|pv| {
                        pv.status.and_then(|s| s.phase).as_deref() == Some("Released")
                    })
        },
    )
    .await;
    let pv = env.volumes().get(&pv_name).await.unwrap();
    assert_eq!(handle(&pv), Some(id.as_str()), "the PV records the volume");
    assert_eq!(
        pv.spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    assert_eq!(
        env.cns_ids(),
        vec![id.to_string()],
        "Retain keeps the volume"
    );

    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_refused_claim_gets_its_volume_as_a_pv_and_releases_it_when_deleted() {
    let env = Env::start().await;
    env.create_class(&[("datastoreurl", DS_URL)], "Delete")
        .await;
    let pv_name = env.create_claim("data", "4Ei", false).await;
    let id = env.cns.insert_volume(&pv_name, CLUSTER);
    let (stop, run) = env.run_controller().await;

    wait_until(&env, &pv_name, "a PV for the volume", || async {
        let pv = env.volumes().get_opt(&pv_name).await.unwrap();
        pv.is_some_and(|pv| handle(&pv) == Some(id.as_str()))
    })
    .await;
    let pv = env.volumes().get(&pv_name).await.unwrap();
    assert_eq!(
        pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
        "1Gi",
        "the volume's own size"
    );

    env.claims()
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    wait_until(
        &env,
        &pv_name,
        "the claim gone, its PV and volume deleted",
        || async {
            env.claims().get_opt("data").await.unwrap().is_none()
                && env.volumes().get_opt(&pv_name).await.unwrap().is_none()
                && env.cns.volumes().is_empty()
        },
    )
    .await;

    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}
