//! What upstream's syncer does around the reconciler, done by `start_controllers`: the
//! CRD installed at start (or, without the permission, one line, a growing delay and a
//! `/readyz` reason), TKGsHA read from the feature-state ConfigMap, and a reconciler whose
//! configuration cannot be used stopping alone.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cnsmetadata::{CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference, EntityType};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::api::PostParams;
use kube_client::{Api, Client};
use kube_controller_kit::http::NotReady;
use kube_sim::{FaultRule, KubeSim, Verb};
use vsphere_cns::simulator::{CnsSimulator, DEFAULT_PASSWORD, DEFAULT_USER};
use vsphere_cns::{ClusterFlavor, CnsClient, CnsMetadataBackend, CnsProvisioner};
use vsphere_controllers::{
    CRD_NOT_READY, FeatureStates, RealOptions, Settings, connect_real, start_controllers,
};

const PROVISIONER: &str = "csi.vsphere.vmware.com";
const SUPERVISOR_ID: &str = "supervisor-9";
const CLUSTER_ID: &str = "domain-c8";

/// A tracing writer into a buffer the test reads.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Installs a subscriber writing into the buffer for this thread (the tests run on a
    /// current-thread runtime, so every task logs here).
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn settings(metadata_config: Result<cnsmetadata::Config, cnsmetadata::ConfigError>) -> Settings {
    Settings {
        provisioner_name: PROVISIONER.to_owned(),
        leader_election: false,
        metrics_address: None,
        flavor: cnsmetadata::ClusterFlavor::Workload,
        cluster_id: CLUSTER_ID.to_owned(),
        supervisor_id: Some(SUPERVISOR_ID.to_owned()),
        vsphere_user: DEFAULT_USER.to_owned(),
        provision_config: provision_controller::Config::default(),
        metadata_config,
        feature_states: FeatureStates::default(),
    }
}

async fn provisioner(cns: &CnsSimulator) -> (CnsProvisioner, CnsMetadataBackend) {
    let client = CnsClient::connect(&cns.vc_config()).await.unwrap();
    let provisioner = CnsProvisioner::new(client.clone(), SUPERVISOR_ID, ClusterFlavor::Workload)
        .expect("the id is not empty");
    (provisioner, CnsMetadataBackend::new(client))
}

async fn class_and_claim(kube: &Client, datastore: &str) -> Api<PersistentVolumeClaim> {
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some("vsphere".to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: PROVISIONER.to_owned(),
        parameters: Some(BTreeMap::from([(
            "datastoremoref".to_owned(),
            datastore.to_owned(),
        )])),
        ..StorageClass::default()
    };
    Api::<StorageClass>::all(kube.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let claims = Api::<PersistentVolumeClaim>::namespaced(kube.clone(), "default");
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some("vsphere".to_owned()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity("1Gi".to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    claims.create(&PostParams::default(), &claim).await.unwrap();
    claims
}

async fn bound(claims: &Api<PersistentVolumeClaim>) -> String {
    for _ in 0..600 {
        if let Some(volume) = claims
            .get("data")
            .await
            .ok()
            .and_then(|c| c.spec?.volume_name)
        {
            return volume;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the claim is not bound within 30 s");
}

async fn crd_installed(kube: &Client) -> bool {
    Api::<CustomResourceDefinition>::all(kube.clone())
        .get_opt(cnsmetadata::CRD_NAME)
        .await
        .unwrap()
        .is_some()
}

/// Against a cluster without the CRD, the binary installs it as upstream's syncer does,
/// and the reconciler then runs: no watch fails on a missing resource.
#[tokio::test]
async fn the_crd_is_installed_at_start() {
    let captured = Captured::default();
    let _guard = captured.install();
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::start().await.unwrap();
    let kube = sim.client();
    assert!(!crd_installed(&kube).await);
    let (provisioner, backend) = provisioner(&cns).await;
    let running = start_controllers(
        kube.clone(),
        provisioner,
        backend,
        &settings(Ok(cnsmetadata::Config::default())),
    );
    wait_until("the CRD is installed", Duration::from_secs(10), || {
        crd_installed(&kube)
    })
    .await;
    wait_until("ready", Duration::from_secs(10), || async {
        running.health().readiness().is_ok()
    })
    .await;
    running
        .run_until(tokio::time::sleep(Duration::from_millis(500)))
        .await
        .unwrap();
    let lines = captured.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("CnsVolumeMetadata CRD installed") && l.contains("created")),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("watch failed")),
        "{lines:#?}"
    );
}

/// Without the permission to create the CRD: one warning line naming the manifest, tries
/// spaced by a doubling delay (not once a second), `/readyz` saying why; once the CRD can
/// be created, it is, and the reconciler starts.
#[tokio::test]
async fn without_permission_one_line_names_the_manifest_and_the_tries_back_off() {
    let captured = Captured::default();
    let _guard = captured.install();
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    sim.add_fault(
        FaultRule::new(Verb::Create, "customresourcedefinitions")
            .always()
            .status(403, "Forbidden"),
    );
    let cns = CnsSimulator::start().await.unwrap();
    let kube = sim.client();
    let (provisioner, backend) = provisioner(&cns).await;
    let running = start_controllers(
        kube.clone(),
        provisioner,
        backend,
        &settings(Ok(cnsmetadata::Config::default())),
    );
    wait_until("/readyz names the CRD", Duration::from_secs(10), || async {
        running.health().readiness() == Err(NotReady::Unmet(CRD_NOT_READY))
    })
    .await;
    // Tries at 0 s, 1 s, 3 s and 7 s (delays 1, 2, 4 s): within 5 to 7 s, three.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let tries = sim
        .requests()
        .into_iter()
        .filter(|r| r.verb == "create" && r.resource == "customresourcedefinitions")
        .count();
    assert_eq!(tries, 3, "a doubling delay, not one try a second");
    let warnings: Vec<String> = captured
        .lines()
        .into_iter()
        .filter(|l| l.contains("WARN"))
        .collect();
    assert_eq!(warnings.len(), 1, "one line: {warnings:#?}");
    assert!(
        warnings[0].contains(
            "cannot install the CnsVolumeMetadata CRD (no permission): apply \
             examples/deploy/cnsvolumemetadata-crd.yaml"
        ),
        "{}",
        warnings[0]
    );
    assert!(!crd_installed(&kube).await);
    assert!(
        !captured.lines().iter().any(|l| l.contains("watch failed")),
        "the reconciler waits for the CRD"
    );
    // Someone applies the manifest: the next try finds it, and readiness comes back.
    sim.clear_faults();
    Api::<CustomResourceDefinition>::all(kube.clone())
        .create(&PostParams::default(), &cnsmetadata::crd())
        .await
        .unwrap();
    wait_until(
        "ready once the CRD is there",
        Duration::from_secs(10),
        || async { running.health().readiness().is_ok() },
    )
    .await;
    running.run_until(async {}).await.unwrap();
}

/// TKGsHA on in upstream's feature-state ConfigMap: PV entity references carry the
/// supervisor ID on CNS (the simulator), read at the reconcile, not at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tkgs_ha_on_in_the_configmap_gives_supervisor_id_references() {
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::start().await.unwrap();
    let kube = sim.client();
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(vsphere_controllers::DEFAULT_FSS_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(kube.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let states = ConfigMap {
        metadata: ObjectMeta {
            name: Some(vsphere_controllers::DEFAULT_FSS_NAME.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("tkgs-ha".to_owned(), "true".to_owned()),
            ("other-feature".to_owned(), "false".to_owned()),
        ])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(kube.clone(), vsphere_controllers::DEFAULT_FSS_NAMESPACE)
        .create(&PostParams::default(), &states)
        .await
        .unwrap();
    let datastore = cns.datastores()[0].value.clone();
    let claims = class_and_claim(&kube, &datastore).await;
    let (provisioner, backend) = provisioner(&cns).await;
    // A config with the supervisor ID and an empty cluster ID works with TKGsHA on.
    let mut settings = settings(Ok(cnsmetadata::Config::default()));
    settings.cluster_id = String::new();
    let running = start_controllers(kube.clone(), provisioner, backend, &settings);
    bound(&claims).await;
    wait_until("the CRD is installed", Duration::from_secs(10), || {
        crd_installed(&kube)
    })
    .await;
    let object = CnsVolumeMetadata::new(
        "guest-pv",
        CnsVolumeMetadataSpec {
            volume_names: vec!["data".to_owned()],
            guest_cluster_id: "guest-1".to_owned(),
            entity_type: EntityType::PersistentVolume,
            entity_name: "pvc-guest".to_owned(),
            entity_references: vec![EntityReference::new(
                EntityType::PersistentVolumeClaim,
                "data",
                "default",
                "",
            )],
            labels: BTreeMap::new(),
            namespace: String::new(),
            cluster_distribution: String::new(),
        },
    );
    Api::<CnsVolumeMetadata>::namespaced(kube.clone(), "default")
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let references = || {
        cns.volumes()
            .iter()
            .flat_map(|v| v.metadata.entity_metadata.clone())
            .filter(|e| e.entity_name == "pvc-guest")
            .flat_map(|e| e.referred_entity)
            .collect::<Vec<_>>()
    };
    wait_until(
        "the PV entity is on CNS",
        Duration::from_secs(30),
        || async { !references().is_empty() },
    )
    .await;
    let clusters: Vec<Option<String>> = references().into_iter().map(|r| r.cluster_id).collect();
    assert_eq!(clusters, [Some(SUPERVISOR_ID.to_owned())]);
    running.run_until(async {}).await.unwrap();
}

fn write_conf(dir: &Path, cns: &CnsSimulator) -> std::path::PathBuf {
    let path = dir.join("csi-vsphere.conf");
    let text = format!(
        "[Global]\ncluster-id = \"{CLUSTER_ID}\"\n\n[VirtualCenter \"127.0.0.1\"]\n\
         user = \"{DEFAULT_USER}\"\npassword = \"{DEFAULT_PASSWORD}\"\nport = \"{}\"\n\
         thumbprint = \"{}\"\n",
        cns.addr().port(),
        cns.thumbprint()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A metadata-reconciler variable that cannot be used stops the reconciler alone, with an
/// error naming it; the provisioner provisions on. Upstream's worker-thread values (10)
/// are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_config_error_leaves_the_provisioner_running() {
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::builder().https().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), &cns);
    let options = RealOptions {
        provisioner_name: PROVISIONER.to_owned(),
        ..RealOptions::default()
    };
    let upstream = |name: &str| match name {
        "WORKER_THREADS_VOLUME_METADATA" => Some("10".to_owned()),
        "CLUSTER_FLAVOR" => Some("WORKLOAD".to_owned()),
        _ => None,
    };
    let accepted = connect_real(Some(sim.kubeconfig_path()), &conf, &options, upstream)
        .await
        .unwrap();
    let workers = accepted
        .settings
        .metadata_config
        .as_ref()
        .unwrap()
        .worker_threads;
    assert_eq!(workers.get(), 10);

    let bad = |name: &str| match name {
        "WORKER_THREADS_VOLUME_METADATA" => Some("0".to_owned()),
        "CLUSTER_FLAVOR" => Some("WORKLOAD".to_owned()),
        _ => None,
    };
    let real = connect_real(Some(sim.kubeconfig_path()), &conf, &options, bad)
        .await
        .expect("a reconciler variable does not stop the process");
    let error = real.settings.metadata_config.clone().unwrap_err();
    assert_eq!(
        error.to_string(),
        "environment variable WORKER_THREADS_VOLUME_METADATA=\"0\" is invalid: expected a whole \
         number from 1 to 65535"
    );
    let claims = class_and_claim(&real.kube, &cns.datastores()[0].value.clone()).await;
    let backend = CnsMetadataBackend::new(real.cns.clone());
    let running = start_controllers(real.kube.clone(), real.provisioner, backend, &real.settings);
    // The reconciler stopped at once; the provisioner provisions the claim after that, and
    // runs until asked to stop.
    bound(&claims).await;
    running
        .run_until(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(cns.volumes().len(), 1);
    assert!(
        !crd_installed(&real.kube).await,
        "the reconciler never started"
    );
}
