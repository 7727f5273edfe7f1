//! One leader: with leader election on, a standby neither provisions nor reconciles
//! `CnsVolumeMetadata` objects; once it holds the lease it does both, and that one Lease
//! is the only one: both controllers follow one election.

use std::collections::BTreeMap;
use std::time::Duration;

use cnsmetadata::CnsVolumeMetadata;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube_client::api::{DeleteParams, PostParams};
use kube_client::{Api, Client};
use kube_sim::KubeSim;
use kube_sim::wait::Wait;
use provision_controller::LeaderElection;
use vsphere_cns::simulator::CnsSimulator;
use vsphere_cns::{ClusterFlavor, CnsClient, CnsMetadataBackend, CnsProvisioner};
use vsphere_controllers::{Settings, start_controllers};

const PROVISIONER: &str = "csi.vsphere.vmware.com";
const NAMESPACE: &str = "default";
const CLUSTER: &str = "supervisor-1";

/// How often the waits below check.
const POLL: Duration = Duration::from_millis(50);

async fn install(kube: &Client, datastore: &str) {
    Api::<CustomResourceDefinition>::all(kube.clone())
        .create(&PostParams::default(), &cnsmetadata::crd())
        .await
        .unwrap();
    vsphere_controllers::FeatureStates::supervisor()
        .create(kube, &[(vsphere_controllers::TKGS_HA, "false")])
        .await
        .unwrap();
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
}

fn claim() -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
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
    }
}

/// A Lease held by another replica, renewed "now", for an hour.
fn held_by_other(lease_name: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("other-replica".to_owned()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

fn has_finalizer(object: &CnsVolumeMetadata) -> bool {
    object
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == "cns.vmware.com"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_neither_provisions_nor_reconciles_until_it_leads() {
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let cns = CnsSimulator::start().await.unwrap();
    let kube = sim.client();
    let datastore = cns.datastores()[0].value.clone();
    install(&kube, &datastore).await;
    let election = LeaderElection::for_provisioner(PROVISIONER, NAMESPACE)
        .unwrap()
        .timings(
            Duration::from_secs(2),
            Duration::from_millis(1500),
            Duration::from_millis(200),
        )
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(kube.clone(), NAMESPACE);
    leases
        .create(
            &PostParams::default(),
            &held_by_other(election.lease_name.as_str()),
        )
        .await
        .unwrap();

    let client = CnsClient::connect(&cns.vc_config()).await.unwrap();
    let provisioner = CnsProvisioner::new(client.clone(), CLUSTER, ClusterFlavor::Workload)
        .expect("CLUSTER is not empty");
    let settings = Settings {
        provisioner_name: PROVISIONER.to_owned(),
        leader_election: true,
        metrics_address: None,
        flavor: cnsmetadata::ClusterFlavor::Workload,
        cluster_id: CLUSTER.to_owned(),
        supervisor_id: None,
        vsphere_user: client.user().to_owned(),
        provision_config: provision_controller::Config::default()
            .leader_election(Some(election.clone())),
        metadata_config: Ok(cnsmetadata::Config::default()),
        feature_states: vsphere_controllers::FeatureStates::default(),
    };
    let running = start_controllers(
        kube.clone(),
        provisioner,
        CnsMetadataBackend::new(client),
        &settings,
    );

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(kube.clone(), NAMESPACE);
    claims
        .create(&PostParams::default(), &claim())
        .await
        .unwrap();
    let objects: Api<CnsVolumeMetadata> = Api::namespaced(kube.clone(), NAMESPACE);
    let object = CnsVolumeMetadata::new("gc-1-data", cnsmetadata::testing::pvc_spec());
    objects
        .create(&PostParams::default(), &object)
        .await
        .unwrap();

    // A standby: its caches fill, but nothing is provisioned or reconciled. (Give it ample
    // time: a replica that ignored the lease would have acted within a few hundred ms.)
    let acted = Wait::new()
        .limit(Duration::from_secs(3))
        .every(POLL)
        .poll(|| async {
            let object = objects.get("gc-1-data").await.unwrap();
            has_finalizer(&object) || !cns.volumes().is_empty()
        })
        .await;
    assert!(acted.is_err(), "a standby reconciled or provisioned");

    // The other replica goes away: this one takes the lease and does both.
    leases
        .delete(election.lease_name.as_str(), &DeleteParams::default())
        .await
        .unwrap();
    let leader = Wait::new().limit(Duration::from_secs(30)).every(POLL);
    leader
        .until(
            "the leader to reconcile the CnsVolumeMetadata object",
            || async { has_finalizer(&objects.get("gc-1-data").await.unwrap()) },
        )
        .await;
    leader
        .until("the leader to provision the claim", || async {
            cns.volumes().len() == 1
        })
        .await;

    // One election: the provision controller's Lease is the only one, held by this replica.
    let all: Vec<Lease> = Api::<Lease>::all(kube.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let names: Vec<_> = all.iter().map(|l| l.metadata.name.clone()).collect();
    assert_eq!(
        names,
        [Some(election.lease_name.as_str().to_owned())],
        "both controllers follow one Lease"
    );
    let holder = all[0].spec.as_ref().and_then(|s| s.holder_identity.clone());
    assert!(
        holder.is_some_and(|h| h != "other-replica"),
        "this replica holds the Lease"
    );

    running.stop(Duration::from_secs(10)).await.unwrap();
    cns.shutdown().await;
    sim.shutdown().await;
}
