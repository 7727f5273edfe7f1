//! The real-cluster path of `cargo run --example vsphere`: a kubeconfig and a
//! `csi-vsphere.conf` (TLS with a pinned thumbprint), here pointing at kube-sim and the CNS
//! simulator in HTTPS mode.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::Api;
use kube_client::api::PostParams;
use kube_sim::KubeSim;
use vsphere_cns::simulator::{CnsSimulator, DEFAULT_PASSWORD, DEFAULT_USER};
use vsphere_cns::{ClusterFlavor, CnsMetadataBackend};
use vsphere_controllers::{
    Options, RealOptions, connect_real, parse_datastore, run, start_controllers,
};

const DS_URL: &str = "ds:///vmfs/volumes/real-test/";

fn write_conf(dir: &Path, cns: &CnsSimulator, global: &str) -> std::path::PathBuf {
    let path = dir.join("csi-vsphere.conf");
    let text = format!(
        "[Global]\n{global}\n\n[VirtualCenter \"127.0.0.1\"]\nuser = \"{DEFAULT_USER}\"\n\
         password = \"{DEFAULT_PASSWORD}\"\nport = \"{}\"\nthumbprint = \"{}\"\n",
        cns.addr().port(),
        cns.thumbprint()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn options() -> RealOptions {
    RealOptions {
        provisioner_name: vsphere_cns::CSI_DRIVER.to_owned(),
        datastores: vec![(DS_URL.to_owned(), "datastore-7".to_owned())],
        ..RealOptions::default()
    }
}

fn vanilla(name: &str) -> Option<String> {
    (name == "CLUSTER_FLAVOR").then(|| "VANILLA".to_owned())
}

/// Creates the class `gold` (datastore [`DS_URL`]) and the claim `default/data` (2Gi) of it.
async fn create_class_and_claim(kube: &kube_client::Client) -> Api<PersistentVolumeClaim> {
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some("gold".into()),
            ..ObjectMeta::default()
        },
        provisioner: vsphere_cns::CSI_DRIVER.into(),
        parameters: Some(BTreeMap::from([("datastoreurl".into(), DS_URL.into())])),
        ..StorageClass::default()
    };
    Api::<StorageClass>::all(kube.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let claims = Api::<PersistentVolumeClaim>::namespaced(kube.clone(), "default");
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("gold".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("2Gi".into()))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    claims.create(&PostParams::default(), &claim).await.unwrap();
    claims
}

/// Waits (up to 30 s) until the claim `data` names its PV, and returns the PV's name.
async fn wait_bound(claims: &Api<PersistentVolumeClaim>) -> String {
    for _ in 0..300 {
        let claim = claims.get("data").await.unwrap();
        if let Some(pv) = claim.spec.and_then(|s| s.volume_name) {
            return pv;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the claim is not bound within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_and_a_vsphere_config_provision_for_real() {
    let kube_sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::builder()
        .datastore("datastore-7", "RealDS", DS_URL)
        .https()
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), &cns, "cluster-id = \"it-cluster\"");
    let real = connect_real(Some(kube_sim.kubeconfig_path()), &conf, &options(), vanilla)
        .await
        .unwrap();
    assert_eq!(real.host, "127.0.0.1");
    assert_eq!(real.settings.flavor, cnsmetadata::ClusterFlavor::Vanilla);
    let cluster = real.provisioner.container_cluster().clone();
    assert_eq!(cluster.cluster_id, "it-cluster");
    assert_eq!(cluster.cluster_flavor, Some(ClusterFlavor::Vanilla));

    let claims = create_class_and_claim(&real.kube).await;

    let backend = CnsMetadataBackend::new(real.cns.clone());
    let running = start_controllers(real.kube.clone(), real.provisioner, backend, &real.settings);
    let pv = wait_bound(&claims).await;
    // The reconciler does not run outside a supervisor cluster; that must not stop the run.
    running
        .run_until(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();

    let volumes = cns.volumes();
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].name, pv);
    assert_eq!(volumes[0].capacity_in_mb, 2048);
    assert_eq!(
        volumes[0].metadata.container_cluster.cluster_id,
        "it-cluster"
    );
    cns.shutdown().await;
    kube_sim.shutdown().await;
}

#[tokio::test]
async fn a_vsphere_config_without_cluster_id_is_refused() {
    let kube_sim = KubeSim::builder().start().await.unwrap();
    let cns = CnsSimulator::builder().https().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), &cns, "");
    let err = connect_real(Some(kube_sim.kubeconfig_path()), &conf, &options(), vanilla)
        .await
        .err()
        .expect("no cluster id");
    assert!(err.to_string().contains("cluster-id"), "{err:#}");
    cns.shutdown().await;
    kube_sim.shutdown().await;
}

/// The binary's path: `run` with `--kubeconfig` and `--vsphere-config` connects, prints what
/// it runs, provisions until `shutdown`, and returns `Ok`. The environment comes from `env`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_both_configs_provisions_until_shutdown() {
    let kube_sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::builder()
        .datastore("datastore-7", "RealDS", DS_URL)
        .https()
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), &cns, "cluster-id = \"it-cluster\"");
    let claims = create_class_and_claim(&kube_sim.client()).await;
    let options = Options {
        kubeconfig: Some(kube_sim.kubeconfig_path().to_owned()),
        vsphere_config: Some(conf),
        provisioner_name: vsphere_cns::CSI_DRIVER.to_owned(),
        leader_election: false,
        metrics_address: None,
        datastores: vec![parse_datastore(&format!("{DS_URL}=datastore-7")).unwrap()],
        default_datastores: Vec::new(),
        claims: 0,
        serve: false,
        timeout: Duration::from_secs(60),
        demo: false,
        supervisor_feature_states: vsphere_controllers::FeatureStates::supervisor(),
        internal_feature_states: vsphere_controllers::FeatureStates::internal(),
    };
    let mut out = Vec::new();
    run(&options, vanilla, wait_bound(&claims), &mut out)
        .await
        .unwrap();

    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text,
        "running the provisioner \"csi.vsphere.vmware.com\" and the CnsVolumeMetadata \
         reconciler against vCenter 127.0.0.1 until SIGTERM or Ctrl-C\n\
         stopped: the controllers stopped, vCenter session logged out\n"
    );
    let methods: Vec<String> = cns.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(
        methods.last().map(String::as_str),
        Some("Logout"),
        "the session ends after the controllers stopped: {methods:?}"
    );
    let pv = claims.get("data").await.unwrap().spec.unwrap().volume_name;
    let volumes = cns.volumes();
    assert_eq!(volumes.len(), 1);
    assert_eq!(Some(&volumes[0].name), pv.as_ref());
    assert_eq!(volumes[0].capacity_in_mb, 2048);
    cns.shutdown().await;
    kube_sim.shutdown().await;
}
