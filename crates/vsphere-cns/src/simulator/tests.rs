//! The client against the simulator: the whole volume lifecycle, sessions, faults, timeouts.

use std::time::Duration;

use super::*;
use crate::error::Error;
use crate::wire::*;
use crate::{CnsClient, VirtualCenterConfig};

fn cluster() -> ContainerCluster {
    ContainerCluster::kubernetes("demo-cluster", DEFAULT_USER, ClusterFlavor::Vanilla)
}

fn spec(sim: &CnsSimulator, name: &str) -> VolumeCreateSpec {
    VolumeCreateSpec {
        name: name.into(),
        datastores: sim.datastores(),
        metadata: VolumeMetadata::for_cluster(cluster(), vec![]),
        capacity_in_mb: 1024,
        ..VolumeCreateSpec::default()
    }
}

fn claim_metadata(pv: &str, claim: &str) -> VolumeMetadata {
    let pv_entity = EntityMetadata {
        cluster_id: Some("demo-cluster".into()),
        ..EntityMetadata::new(EntityType::PersistentVolume, pv)
    };
    let claim_entity = EntityMetadata {
        labels: vec![KeyValue::new("team", "storage")],
        cluster_id: Some("demo-cluster".into()),
        namespace: Some("default".into()),
        referred_entity: vec![EntityReference {
            entity_type: EntityType::PersistentVolume,
            entity_name: pv.into(),
            namespace: None,
            cluster_id: Some("demo-cluster".into()),
        }],
        ..EntityMetadata::new(EntityType::PersistentVolumeClaim, claim)
    };
    VolumeMetadata::for_cluster(cluster(), vec![pv_entity, claim_entity])
}

async fn connected() -> (CnsSimulator, CnsClient) {
    let sim = CnsSimulator::start().await.unwrap();
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    (sim, client)
}

fn count(sim: &CnsSimulator, method: &str) -> usize {
    sim.requests().iter().filter(|r| r.method == method).count()
}

#[tokio::test]
async fn create_query_update_delete_and_delete_again() {
    let (sim, client) = connected().await;
    let id = client.create_volume(&spec(&sim, "pvc-1")).await.unwrap();

    let volumes = sim.volumes();
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].id, id);
    assert_eq!(volumes[0].capacity_in_mb, 1024);
    assert_eq!(volumes[0].datastore, MoRef::datastore(DEFAULT_DATASTORE));

    let found = client
        .query_volume(&QueryFilter::by_ids([id.clone()]))
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name.as_deref(), Some("pvc-1"));
    assert_eq!(found[0].capacity_in_mb, Some(1024));
    let by_name = client
        .query_volume(&QueryFilter::by_names(["pvc-1"]))
        .await
        .unwrap();
    assert_eq!(by_name[0].volume_id, id);
    assert!(
        client
            .query_volume(&QueryFilter::by_names(["other"]))
            .await
            .unwrap()
            .is_empty()
    );

    let update = VolumeMetadataUpdateSpec {
        volume_id: id.clone(),
        metadata: claim_metadata("pvc-1", "claim-1"),
    };
    client.update_volume_metadata(&update).await.unwrap();
    let metadata = client
        .query_volume(&QueryFilter::by_ids([id.clone()]))
        .await
        .unwrap()[0]
        .metadata
        .clone()
        .unwrap();
    assert_eq!(metadata.entity_metadata, update.metadata.entity_metadata);

    client.delete_volume(&id, true).await.unwrap();
    assert!(sim.volumes().is_empty());
    let again = client.delete_volume(&id, true).await.unwrap_err();
    assert!(again.is_not_found(), "{again}");
    assert!(
        client
            .query_volume(&QueryFilter::by_ids([id]))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn datastores_are_found_by_inventory_path() {
    let sim = CnsSimulator::builder()
        .datastore("datastore-60", "shared-ds", "ds:///vmfs/volumes/shared/")
        .start()
        .await
        .unwrap();
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    let found = client
        .find_by_inventory_path("DC0/datastore/LocalDS_0")
        .await
        .unwrap();
    assert_eq!(found, Some(MoRef::datastore(DEFAULT_DATASTORE)));
    let found = client
        .find_by_inventory_path("DC0/datastore/shared-ds")
        .await
        .unwrap();
    assert_eq!(found, Some(MoRef::datastore("datastore-60")));
    assert_eq!(
        client
            .find_by_inventory_path("DC0/datastore/nope")
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn metadata_updates_merge_per_entity_and_honour_delete() {
    let (sim, client) = connected().await;
    let id = client.create_volume(&spec(&sim, "pvc-2")).await.unwrap();
    let update = VolumeMetadataUpdateSpec {
        volume_id: id.clone(),
        metadata: claim_metadata("pvc-2", "claim-2"),
    };
    client.update_volume_metadata(&update).await.unwrap();
    let mut removal = claim_metadata("pvc-2", "claim-2");
    removal.entity_metadata.remove(0);
    removal.entity_metadata[0].delete = Some(true);
    client
        .update_volume_metadata(&VolumeMetadataUpdateSpec {
            volume_id: id,
            metadata: removal,
        })
        .await
        .unwrap();
    let entities = &sim.volumes()[0].metadata.entity_metadata;
    assert_eq!(entities.len(), 1);
    assert_eq!(entities[0].entity_type, EntityType::PersistentVolume);
}

#[tokio::test]
async fn updating_an_unknown_volume_is_not_found() {
    let (_sim, client) = connected().await;
    let update = VolumeMetadataUpdateSpec {
        volume_id: "no-such-volume".into(),
        metadata: claim_metadata("pv", "c"),
    };
    let err = client.update_volume_metadata(&update).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test]
async fn requests_use_the_endpoints_versions_and_cookie_govmomi_uses() {
    let (sim, client) = connected().await;
    client.create_volume(&spec(&sim, "pvc-3")).await.unwrap();
    let requests = sim.requests();
    let find = |method: &str| {
        requests
            .iter()
            .find(|r| r.method == method)
            .unwrap()
            .clone()
    };
    let login = find("Login");
    assert_eq!(
        (login.path.as_str(), login.soap_action.as_deref()),
        ("/sdk", Some("urn:vim25/8.0.3.0"))
    );
    let create = find("CnsCreateVolume");
    assert_eq!(create.path, "/vsanHealth");
    assert_eq!(create.soap_action.as_deref(), Some("urn:vsan/8.0.3.0"));
    assert!(
        create.authenticated,
        "the session cookie must reach /vsanHealth"
    );
    let poll = find("RetrievePropertiesEx");
    assert_eq!(
        (poll.path.as_str(), poll.soap_action.as_deref()),
        ("/sdk", Some("urn:vsan/8.0.3.0"))
    );
    assert!(poll.authenticated);
}

#[tokio::test]
async fn a_bad_password_is_reported_as_invalid_login_without_the_password() {
    let sim = CnsSimulator::start().await.unwrap();
    let config = VirtualCenterConfig {
        password: "wrong-password-123".into(),
        ..sim.vc_config()
    };
    let err = CnsClient::connect(&config).await.unwrap_err();
    assert!(err.is_invalid_login(), "{err}");
    assert!(!err.to_string().contains("wrong-password-123"));
    assert!(!format!("{err:?}").contains("wrong-password-123"));
}

#[tokio::test]
async fn an_expired_session_is_logged_in_again_once() {
    let (sim, client) = connected().await;
    sim.expire_sessions();
    assert!(
        client
            .query_volume(&QueryFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(count(&sim, "Login"), 2);
    let queries: Vec<bool> = sim
        .requests()
        .iter()
        .filter(|r| r.method == "CnsQueryVolume")
        .map(|r| r.authenticated)
        .collect();
    assert_eq!(queries, [false, true]);
}

#[tokio::test]
async fn not_authenticated_twice_in_a_row_is_returned_not_retried_forever() {
    let (sim, client) = connected().await;
    for _ in 0..3 {
        sim.fail_next("CnsQueryVolume", SimFault::call("NotAuthenticated"));
    }
    let err = client
        .query_volume(&QueryFilter::default())
        .await
        .unwrap_err();
    assert!(err.is_not_authenticated(), "{err}");
    assert_eq!(count(&sim, "Login"), 2);
    assert_eq!(count(&sim, "CnsQueryVolume"), 2);
}

#[tokio::test]
async fn calls_after_logout_log_in_again() {
    let (sim, client) = connected().await;
    client.logout().await.unwrap();
    client.create_volume(&spec(&sim, "pvc-4")).await.unwrap();
    assert_eq!(count(&sim, "Login"), 2);
    assert_eq!(sim.volumes().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_call_times_out() {
    let sim = CnsSimulator::start().await.unwrap();
    let client = CnsClient::connect(&sim.vc_config().timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    sim.delay("CnsQueryVolume", Duration::from_secs(30));
    let err = client
        .query_volume(&QueryFilter::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Timeout { operation: "CnsQueryVolume", after } if after == Duration::from_secs(5)),
        "{err}"
    );
    sim.delay("CnsQueryVolume", Duration::ZERO);
    client.query_volume(&QueryFilter::default()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_task_that_never_finishes_in_time_times_out() {
    let sim = CnsSimulator::start().await.unwrap();
    let config = sim.vc_config().task_timeout(Duration::from_secs(3));
    let client = CnsClient::connect(&config).await.unwrap();
    sim.delay("RetrievePropertiesEx", Duration::from_secs(10));
    let err = client
        .create_volume(&spec(&sim, "pvc-5"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "CnsCreateVolume",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn create_without_datastores_is_invalid_argument() {
    let (sim, client) = connected().await;
    let err = client
        .create_volume(&VolumeCreateSpec {
            datastores: vec![],
            ..spec(&sim, "pvc-6")
        })
        .await
        .unwrap_err();
    assert_eq!(err.fault_type(), Some("InvalidArgument"));
    assert!(err.to_string().contains("createSpecs.datastores"), "{err}");
    assert!(sim.volumes().is_empty());
}

#[tokio::test]
async fn injected_faults_show_up_where_they_were_placed() {
    let (sim, client) = connected().await;
    let id = client.create_volume(&spec(&sim, "pvc-7")).await.unwrap();

    sim.fail_next("CnsDeleteVolume", SimFault::call("NotFound"));
    assert!(
        client
            .delete_volume(&id, true)
            .await
            .unwrap_err()
            .is_not_found()
    );
    sim.fail_next(
        "CnsDeleteVolume",
        SimFault::volume_result("ResourceInUse").message("attached"),
    );
    let in_use = client.delete_volume(&id, true).await.unwrap_err();
    assert_eq!(in_use.fault_type(), Some("ResourceInUse"));
    assert!(!in_use.is_not_found());
    sim.fail_next(
        "CnsCreateVolume",
        SimFault::task("CnsFault").message("CNS: broken"),
    );
    let err = client
        .create_volume(&spec(&sim, "pvc-8"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "CnsCreateVolume failed with vSphere fault CnsFault: CNS: broken"
    );
    assert_eq!(sim.volumes().len(), 1, "failed calls change nothing");
    client.delete_volume(&id, false).await.unwrap();
}

#[tokio::test]
async fn https_with_the_pinned_thumbprint_connects() {
    let sim = CnsSimulator::builder().https().start().await.unwrap();
    assert!(sim.url().starts_with("https://127.0.0.1:"));
    let client = CnsClient::connect(&sim.vc_config()).await.unwrap();
    client.create_volume(&spec(&sim, "pvc-tls")).await.unwrap();
    assert_eq!(sim.volumes().len(), 1);
}

#[tokio::test]
async fn https_with_a_wrong_thumbprint_is_refused_before_login() {
    let sim = CnsSimulator::builder().https().start().await.unwrap();
    let wrong = crate::Thumbprint::of_certificate(b"some other certificate");
    let err = CnsClient::connect(&sim.vc_config().tls(TlsMode::Thumbprint(wrong)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err}");
    assert_eq!(
        count(&sim, "Login"),
        0,
        "no credentials may be sent to an unverified server"
    );
}

#[tokio::test]
async fn https_verified_against_the_ca_file() {
    let sim = CnsSimulator::builder().https().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, CnsSimulator::test_ca_pem()).unwrap();
    let client = CnsClient::connect(&sim.vc_config().tls(TlsMode::CaFile(ca)))
        .await
        .unwrap();
    assert!(
        client
            .query_volume(&QueryFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn https_with_default_verification_rejects_the_unknown_ca() {
    let sim = CnsSimulator::builder().https().start().await.unwrap();
    let err = CnsClient::connect(&sim.vc_config().tls(TlsMode::Verified))
        .await
        .unwrap_err();
    // Transport (unknown issuer) or, on a machine without system roots, Settings.
    assert!(
        matches!(err, Error::Transport { .. } | Error::Settings(_)),
        "{err}"
    );
    assert_eq!(count(&sim, "Login"), 0);
}

#[tokio::test]
async fn https_insecure_accepts_the_certificate_when_asked_to() {
    let sim = CnsSimulator::builder().https().start().await.unwrap();
    let client = CnsClient::connect(&sim.vc_config().tls(TlsMode::Insecure))
        .await
        .unwrap();
    assert!(
        client
            .query_volume(&QueryFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}
