//! Volume IDs do not follow creation order; volumes can be planted as if made earlier.

use super::*;
use crate::CnsClient;
use crate::wire::*;

fn spec(sim: &CnsSimulator, name: &str) -> VolumeCreateSpec {
    let cluster =
        ContainerCluster::kubernetes("demo-cluster", DEFAULT_USER, ClusterFlavor::Vanilla);
    VolumeCreateSpec {
        name: name.into(),
        datastores: sim.datastores(),
        metadata: VolumeMetadata::for_cluster(cluster, vec![]),
        capacity_in_mb: 1024,
        ..VolumeCreateSpec::default()
    }
}

/// The IDs of `count` volumes created one after the other, in creation order.
async fn created_ids(sim: &CnsSimulator, count: usize) -> Vec<CnsVolumeId> {
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..count {
        let name = format!("pvc-{i}");
        ids.push(client.create_volume(&spec(sim, &name)).await.unwrap());
    }
    ids
}

#[tokio::test]
async fn volume_ids_are_uuids_not_in_creation_order() {
    let sim = CnsSimulator::start().await.unwrap();
    // 16 random IDs come out sorted with probability 1/16! (about 5e-14).
    let ids = created_ids(&sim, 16).await;
    assert!(
        ids.windows(2).any(|w| w[0] > w[1]),
        "IDs follow creation order: {ids:?}"
    );
    for id in &ids {
        assert!(uuid::Uuid::parse_str(id.as_str()).is_ok(), "{id}");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn a_seed_gives_the_same_ids_in_the_same_order_of_creates() {
    let first = CnsSimulator::builder().seed(7).start().await.unwrap();
    let second = CnsSimulator::builder().seed(7).start().await.unwrap();
    let other = CnsSimulator::builder().seed(8).start().await.unwrap();
    let a = created_ids(&first, 8).await;
    let b = created_ids(&second, 8).await;
    let c = created_ids(&other, 8).await;
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.windows(2).any(|w| w[0] > w[1]), "{a:?}");
    // Planted volumes draw from the same sequence.
    assert_eq!(
        first.insert_volume("x", "demo-cluster"),
        second.insert_volume("x", "demo-cluster")
    );
    for sim in [first, second, other] {
        sim.shutdown().await;
    }
}

#[tokio::test]
async fn an_inserted_volume_is_found_by_name_and_cluster_id() {
    let sim = CnsSimulator::start().await.unwrap();
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    let created = client.create_volume(&spec(&sim, "pvc-1")).await.unwrap();
    let planted = sim.insert_volume("pvc-1", "demo-cluster");
    let elsewhere = sim.insert_volume("pvc-1", "other-cluster");
    assert_ne!(created, planted);
    let mut filter = QueryFilter::by_names(["pvc-1"]);
    filter.container_cluster_ids = vec!["demo-cluster".into()];
    let mut found: Vec<CnsVolumeId> = client
        .query_volume(&filter)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.volume_id)
        .collect();
    found.sort();
    let mut expected = vec![created, planted.clone()];
    expected.sort();
    assert_eq!(found, expected);

    let volume = sim.volumes().into_iter().find(|v| v.id == planted).unwrap();
    assert_eq!(volume.name, "pvc-1");
    assert_eq!(volume.datastore, MoRef::datastore(DEFAULT_DATASTORE));
    assert_eq!(volume.metadata.container_cluster.cluster_id, "demo-cluster");
    assert_eq!(volume.metadata.container_cluster.vsphere_user, DEFAULT_USER);

    filter.container_cluster_ids = vec!["other-cluster".into()];
    let found = client.query_volume(&filter).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].volume_id, elsewhere);
    // It can be deleted like any other volume.
    client.delete_volume(&planted, true).await.unwrap();
    assert_eq!(sim.volumes().len(), 2);
    sim.shutdown().await;
}
