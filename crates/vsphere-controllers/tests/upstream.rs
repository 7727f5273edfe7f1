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
    ConfigMap, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::api::PostParams;
use kube_client::{Api, Client};
use kube_sim::{FaultRule, KubeSim, Verb};
use vsphere_cns::simulator::{CnsSimulator, DEFAULT_PASSWORD, DEFAULT_USER};
use vsphere_cns::{ClusterFlavor, CnsClient, CnsMetadataBackend, CnsProvisioner};
use vsphere_controllers::{
    CRD_NOT_READY, FEATURE_STATES_NOT_READY, FeatureStates, RealOptions, Settings, connect_real,
    start_controllers,
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
    supervisor_feature_states(&kube, "false").await;
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
    supervisor_feature_states(&kube, "false").await;
    let (provisioner, backend) = provisioner(&cns).await;
    let running = start_controllers(
        kube.clone(),
        provisioner,
        backend,
        &settings(Ok(cnsmetadata::Config::default())),
    );
    wait_until("/readyz names the CRD", Duration::from_secs(10), || async {
        running.health().readiness() == Err(CRD_NOT_READY.to_owned())
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

/// A PV entity of a guest cluster whose reference names the supervisor claim `data`.
fn guest_pv(name: &str) -> CnsVolumeMetadata {
    CnsVolumeMetadata::new(
        name,
        CnsVolumeMetadataSpec {
            volume_names: vec!["data".to_owned()],
            guest_cluster_id: "guest-1".to_owned(),
            entity_type: EntityType::PersistentVolume,
            entity_name: name.to_owned(),
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
    )
}

async fn create_object(kube: &Client, object: &CnsVolumeMetadata) {
    Api::<CnsVolumeMetadata>::namespaced(kube.clone(), "default")
        .create(&PostParams::default(), object)
        .await
        .unwrap();
}

/// The cluster IDs of the references CNS holds for the entity `entity`.
fn references(cns: &CnsSimulator, entity: &str) -> Vec<Option<String>> {
    cns.volumes()
        .iter()
        .flat_map(|v| v.metadata.entity_metadata.clone())
        .filter(|e| e.entity_name == entity)
        .flat_map(|e| e.referred_entity)
        .map(|r| r.cluster_id)
        .collect()
}

async fn wait_for_references(cns: &CnsSimulator, entity: &str) -> Vec<Option<String>> {
    wait_until(
        &format!("the PV entity {entity} is on CNS"),
        Duration::from_secs(30),
        || async { !references(cns, entity).is_empty() },
    )
    .await;
    references(cns, entity)
}

/// The supervisor's feature states as its install ships them, `tkgs-ha` set to `tkgs_ha`.
async fn supervisor_feature_states(kube: &Client, tkgs_ha: &str) {
    FeatureStates::supervisor()
        .create(kube, &[("tkgs-ha", tkgs_ha), ("other-feature", "false")])
        .await
        .unwrap();
}

/// Provisions the claim `data` with the reconciler off (flavor VANILLA), so that a later
/// start finds the volume bound and reconciles at once; installs the CRD.
async fn provisioned(sim: &KubeSim, cns: &CnsSimulator) {
    let kube = sim.client();
    let claims = class_and_claim(&kube, &cns.datastores()[0].value.clone()).await;
    let (provisioner, backend) = provisioner(cns).await;
    let mut vanilla = settings(Ok(cnsmetadata::Config::default()));
    vanilla.flavor = cnsmetadata::ClusterFlavor::Vanilla;
    let running = start_controllers(kube.clone(), provisioner, backend, &vanilla);
    bound(&claims).await;
    running.run_until(async {}).await.unwrap();
    Api::<CustomResourceDefinition>::all(kube)
        .create(&PostParams::default(), &cnsmetadata::crd())
        .await
        .unwrap();
}

/// On a supervisor, `tkgs-ha: "true"` in `csi-feature-states` (where upstream reads it on
/// WORKLOAD, and where its stock supervisor manifest ships it): PV entity references carry
/// the supervisor ID from the first reconcile. The object and its bound volume exist
/// before the start and the ConfigMap's list is slow (2 s): nothing is pushed before the
/// feature states are read, so CNS never sees the cluster ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tkgs_ha_in_csi_feature_states_gives_supervisor_id_references_from_the_first_reconcile() {
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = Arc::new(CnsSimulator::start().await.unwrap());
    let kube = sim.client();
    supervisor_feature_states(&kube, "true").await;
    provisioned(&sim, &cns).await;
    create_object(&kube, &guest_pv("pvc-guest")).await;
    sim.add_fault(
        FaultRule::new(Verb::List, "configmaps")
            .namespace(vsphere_controllers::DEFAULT_FSS_NAMESPACE)
            .times(1)
            .no_status()
            .latency(Duration::from_secs(2)),
    );
    // Every value CNS holds for the entity while the reconciler runs, sampled.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (cns, seen) = (cns.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let now = references(&cns, "pvc-guest");
                if !now.is_empty() {
                    seen.lock().unwrap().push(now);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let (provisioner, backend) = provisioner(&cns).await;
    let running = start_controllers(
        kube.clone(),
        provisioner,
        backend,
        &settings(Ok(cnsmetadata::Config::default())),
    );
    let clusters = wait_for_references(&cns, "pvc-guest").await;
    assert_eq!(clusters, [Some(SUPERVISOR_ID.to_owned())]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    sampler.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|c| c == &[Some(SUPERVISOR_ID.to_owned())]),
        "CNS held another cluster ID: {seen:?}"
    );
    running.run_until(async {}).await.unwrap();
}

/// No feature-state ConfigMap on a supervisor: one error line naming it, `/readyz` says
/// why, and nothing is pushed (no guessed TKGsHA); once it is created the reconciler
/// starts with its states.
#[tokio::test]
async fn a_missing_feature_state_configmap_is_one_error_line_and_no_push() {
    let captured = Captured::default();
    let _guard = captured.install();
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::start().await.unwrap();
    let kube = sim.client();
    provisioned(&sim, &cns).await;
    create_object(&kube, &guest_pv("pvc-guest")).await;
    let (provisioner, backend) = provisioner(&cns).await;
    let running = start_controllers(
        kube.clone(),
        provisioner,
        backend,
        &settings(Ok(cnsmetadata::Config::default())),
    );
    wait_until(
        "/readyz names the ConfigMap",
        Duration::from_secs(10),
        || async { running.health().readiness() == Err(FEATURE_STATES_NOT_READY.to_owned()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(references(&cns, "pvc-guest").is_empty(), "nothing pushed");
    let errors: Vec<String> = captured
        .lines()
        .into_iter()
        .filter(|l| l.contains("ERROR"))
        .collect();
    assert_eq!(errors.len(), 1, "one line: {errors:#?}");
    assert!(
        errors[0].contains("the feature-state ConfigMap does not exist")
            && errors[0].contains("vmware-system-csi/csi-feature-states"),
        "{}",
        errors[0]
    );
    supervisor_feature_states(&kube, "true").await;
    let clusters = wait_for_references(&cns, "pvc-guest").await;
    assert_eq!(clusters, [Some(SUPERVISOR_ID.to_owned())]);
    wait_until("ready", Duration::from_secs(10), || async {
        running.health().readiness().is_ok()
    })
    .await;
    running.run_until(async {}).await.unwrap();
}

/// The feature-state ConfigMap deleted while running: one error line (upstream's syncer
/// exits), the last states kept (objects pushed meanwhile get the supervisor ID), and the
/// restored ConfigMap followed again (`tkgs-ha: "false"`: the cluster ID).
#[tokio::test]
async fn a_deleted_feature_state_configmap_is_one_error_line_and_its_last_states_are_kept() {
    let captured = Captured::default();
    let _guard = captured.install();
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::start().await.unwrap();
    let kube = sim.client();
    supervisor_feature_states(&kube, "true").await;
    provisioned(&sim, &cns).await;
    let (provisioner, backend) = provisioner(&cns).await;
    let running = start_controllers(
        kube.clone(),
        provisioner,
        backend,
        &settings(Ok(cnsmetadata::Config::default())),
    );
    create_object(&kube, &guest_pv("pv-before")).await;
    assert_eq!(
        wait_for_references(&cns, "pv-before").await,
        [Some(SUPERVISOR_ID.to_owned())]
    );
    let maps =
        Api::<ConfigMap>::namespaced(kube.clone(), vsphere_controllers::DEFAULT_FSS_NAMESPACE);
    maps.delete(
        vsphere_controllers::DEFAULT_SUPERVISOR_FSS_NAME,
        &Default::default(),
    )
    .await
    .unwrap();
    let deleted = |lines: &[String]| {
        lines
            .iter()
            .filter(|l| l.contains("ERROR") && l.contains("feature-state ConfigMap was deleted"))
            .count()
    };
    wait_until(
        "the deletion is logged",
        Duration::from_secs(10),
        || async { deleted(&captured.lines()) == 1 },
    )
    .await;
    create_object(&kube, &guest_pv("pv-while-deleted")).await;
    assert_eq!(
        wait_for_references(&cns, "pv-while-deleted").await,
        [Some(SUPERVISOR_ID.to_owned())],
        "the last states are kept"
    );
    supervisor_feature_states(&kube, "false").await;
    wait_until(
        "the restored states are read",
        Duration::from_secs(10),
        || async {
            captured
                .lines()
                .iter()
                .any(|l| l.contains("feature state changed") && l.contains("on=false"))
        },
    )
    .await;
    create_object(&kube, &guest_pv("pv-after")).await;
    assert_eq!(
        wait_for_references(&cns, "pv-after").await,
        [Some(CLUSTER_ID.to_owned())],
        "followed again"
    );
    assert_eq!(deleted(&captured.lines()), 1, "{:#?}", captured.lines());
    running.run_until(async {}).await.unwrap();
}

/// A CRD that exists (with labels and annotations of its own, and an older spec) keeps its
/// metadata: only its spec is set, as upstream's syncer updates it, across two starts.
#[tokio::test]
async fn an_existing_crd_keeps_its_metadata_across_a_restart() {
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::start().await.unwrap();
    let kube = sim.client();
    supervisor_feature_states(&kube, "false").await;
    let crds = Api::<CustomResourceDefinition>::all(kube.clone());
    let mut existing = cnsmetadata::crd();
    existing.metadata.labels = Some(BTreeMap::from([(
        "owner".to_owned(),
        "platform-team".to_owned(),
    )]));
    existing.metadata.annotations = Some(BTreeMap::from([(
        "example.com/note".to_owned(),
        "installed by hand".to_owned(),
    )]));
    existing.spec.names.short_names = Some(vec!["oldname".to_owned()]);
    let created = crds
        .create(&PostParams::default(), &existing)
        .await
        .unwrap();
    let wanted = cnsmetadata::crd();
    for start in ["first", "restart"] {
        let (provisioner, backend) = provisioner(&cns).await;
        let running = start_controllers(
            kube.clone(),
            provisioner,
            backend,
            &settings(Ok(cnsmetadata::Config::default())),
        );
        wait_until("ready", Duration::from_secs(10), || async {
            running.health().readiness().is_ok()
        })
        .await;
        running.run_until(async {}).await.unwrap();
        let crd = crds.get(cnsmetadata::CRD_NAME).await.unwrap();
        assert_eq!(
            crd.spec.names.short_names, wanted.spec.names.short_names,
            "{start}"
        );
        assert_eq!(
            crd.metadata.uid, created.metadata.uid,
            "{start}: the same object"
        );
        assert_eq!(crd.metadata.labels, existing.metadata.labels, "{start}");
        assert_eq!(
            crd.metadata.annotations, existing.metadata.annotations,
            "{start}"
        );
    }
    let updates = sim
        .requests()
        .into_iter()
        .filter(|r| r.verb == "update" && r.resource == "customresourcedefinitions")
        .count();
    assert_eq!(updates, 1, "the restart found the spec up to date");
}

/// `CLUSTER_FLAVOR` unset is `VANILLA`, as upstream: volumes are created with the
/// cluster ID as owner and flavor VANILLA (not the supervisor ID), the reconciler is off
/// with one line saying why, no CRD is installed, and the process is ready.
#[tokio::test]
async fn an_unset_cluster_flavor_behaves_as_vanilla() {
    let captured = Captured::default();
    let _guard = captured.install();
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::builder().https().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), &cns);
    let options = RealOptions {
        provisioner_name: PROVISIONER.to_owned(),
        ..RealOptions::default()
    };
    let real = connect_real(Some(sim.kubeconfig_path()), &conf, &options, |_| None)
        .await
        .unwrap();
    assert_eq!(real.settings.flavor, cnsmetadata::ClusterFlavor::Vanilla);
    assert_eq!(real.settings.feature_states, FeatureStates::internal());
    let cluster = real.provisioner.container_cluster().clone();
    assert_eq!(
        (cluster.cluster_id.as_str(), cluster.cluster_flavor),
        (CLUSTER_ID, Some(ClusterFlavor::Vanilla))
    );
    let claims = class_and_claim(&real.kube, &cns.datastores()[0].value.clone()).await;
    let backend = CnsMetadataBackend::new(real.cns.clone());
    let running = start_controllers(real.kube.clone(), real.provisioner, backend, &real.settings);
    bound(&claims).await;
    wait_until("ready", Duration::from_secs(10), || async {
        running.health().readiness().is_ok()
    })
    .await;
    running.run_until(async {}).await.unwrap();
    let volumes = cns.volumes();
    assert_eq!(volumes.len(), 1);
    let owner = &volumes[0].metadata.container_cluster;
    assert_eq!(owner.cluster_id, CLUSTER_ID);
    assert_eq!(owner.cluster_flavor, Some(ClusterFlavor::Vanilla));
    let lines: Vec<String> = captured
        .lines()
        .into_iter()
        .filter(|l| l.contains("CnsVolumeMetadata reconciler"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("the CnsVolumeMetadata reconciler is off")
            && lines[0].contains("flavor=VANILLA")
            && lines[0].contains("unset means VANILLA"),
        "{}",
        lines[0]
    );
    let touched_crds = sim
        .requests()
        .into_iter()
        .filter(|r| r.resource == "customresourcedefinitions")
        .count();
    assert_eq!(touched_crds, 0, "no CRD installed");
    assert!(!crd_installed(&real.kube).await);
}

fn write_conf(dir: &Path, cns: &CnsSimulator) -> std::path::PathBuf {
    let path = dir.join("csi-vsphere.conf");
    let text = format!(
        "[Global]\ncluster-id = \"{CLUSTER_ID}\"\nsupervisor-id = \"{SUPERVISOR_ID}\"\n\n\
         [VirtualCenter \"127.0.0.1\"]\n\
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
