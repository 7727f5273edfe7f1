//! The volume flow.

use k8s_openapi::api::core::v1::PersistentVolume;
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_sim::{FaultRule, Verb};
use provision_controller::{
    annotations::FINALIZER_PV,
    events::VOLUME_FAILED_DELETE,
    testing::{DeleteStep, FakeProvisioner, class, pv},
};

use crate::{Env, ME, claim, eventually, fast_class, quick, quiet, settle};

/// Creates a PV and sets its status phase. A Released PV gets a claimRef to a deleted
/// claim, as in a cluster (the binder makes unclaimed PVs Available).
pub(crate) async fn create_volume(env: &Env, mut volume: PersistentVolume, phase: &str) {
    let name = volume.metadata.name.clone().unwrap();
    let spec = volume.spec.as_mut().unwrap();
    if phase == "Released" && spec.claim_ref.is_none() {
        spec.claim_ref = pv("x")
            .claim_ref("default", "gone", "uid-of-a-deleted-claim")
            .build()
            .spec
            .unwrap()
            .claim_ref;
    }
    env.volumes()
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
    let status = serde_json::json!({"status": {"phase": phase}});
    env.volumes()
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_released_volume_is_deleted_with_its_asset() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.unwrap();
    assert_eq!(
        env.fake.assets().into_iter().collect::<Vec<_>>(),
        std::slice::from_ref(&name)
    );

    env.delete_claim("data").await;
    env.volume_gone(&name).await;
    assert!(env.fake.assets().is_empty());
    assert_eq!(env.fake.delete_calls(), [name]);
    env.stop().await;
}

#[tokio::test]
async fn only_released_delete_volumes_of_this_provisioner_are_deleted() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    create_volume(&env, pv("ours").provisioned_by(ME).build(), "Released").await;
    create_volume(
        &env,
        pv("theirs").provisioned_by("example.com/other").build(),
        "Released",
    )
    .await;
    create_volume(
        &env,
        pv("available").provisioned_by(ME).build(),
        "Available",
    )
    .await;
    create_volume(
        &env,
        pv("kept")
            .provisioned_by(ME)
            .reclaim_policy("Retain")
            .build(),
        "Released",
    )
    .await;
    create_volume(
        &env,
        pv("migrated")
            .provisioned_by("kubernetes.io/in-tree")
            .migrated_to(ME)
            .build(),
        "Released",
    )
    .await;
    env.volume_gone("ours").await;
    env.volume_gone("migrated").await;
    settle().await;
    let mut deleted = env.fake.delete_calls();
    deleted.sort();
    assert_eq!(deleted, ["migrated", "ours"]);
    for name in ["theirs", "available", "kept"] {
        assert!(
            env.volumes().get_opt(name).await.unwrap().is_some(),
            "{name} kept"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn an_ignored_delete_keeps_the_volume_without_an_event_and_counts_apart() {
    let fake = FakeProvisioner::new().script_delete([DeleteStep::Ignored]);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = provision_controller::ControllerMetrics::new(&mut registry);
    let env = Env::start_with(quiet(), fake, |c| c.metrics(metrics)).await;
    create_volume(&env, pv("v").provisioned_by(ME).build(), "Released").await;
    eventually("delete called", || async {
        (!env.fake.delete_calls().is_empty()).then_some(())
    })
    .await;
    settle().await;
    assert_eq!(env.fake.delete_calls().len(), 1, "ignored, not retried");
    assert!(env.volumes().get_opt("v").await.unwrap().is_some());
    assert!(env.events("v", VOLUME_FAILED_DELETE).await.is_empty());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let counted = |name: &str| text.lines().any(|l| l.starts_with(name));
    assert!(
        text.contains("controller_persistentvolume_delete_stopped_total{class=\"\"} 1"),
        "{text}"
    );
    assert!(
        !counted("controller_persistentvolume_delete_total"),
        "{text}"
    );
    assert!(
        !counted("controller_persistentvolume_delete_failed_total"),
        "{text}"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_failed_delete_emits_an_event_and_is_retried() {
    let fake = FakeProvisioner::new().script_delete([DeleteStep::Fail]);
    let env = Env::start(quick(), fake).await;
    create_volume(&env, pv("v").provisioned_by(ME).build(), "Released").await;
    env.volume_gone("v").await;
    assert_eq!(env.fake.delete_calls().len(), 2);
    env.wait_event("v", VOLUME_FAILED_DELETE).await;
    env.stop().await;
}

#[tokio::test]
async fn a_failing_pv_delete_call_is_retried() {
    let env = Env::start(quick(), FakeProvisioner::new()).await;
    env.sim.add_fault(
        FaultRule::new(Verb::Delete, "persistentvolumes")
            .times(2)
            .status(500, "InternalError"),
    );
    create_volume(&env, pv("v").provisioned_by(ME).build(), "Released").await;
    env.volume_gone("v").await;
    assert_eq!(
        env.fake.delete_calls().len(),
        3,
        "the asset delete is repeated, it is idempotent"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_deletion_guard_can_veto() {
    let env = Env::start_with(quick(), FakeProvisioner::new(), |c| {
        c.deletion_guard(|v: &PersistentVolume| v.metadata.name.as_deref() != Some("precious"))
    })
    .await;
    create_volume(&env, pv("precious").provisioned_by(ME).build(), "Released").await;
    create_volume(&env, pv("scratch").provisioned_by(ME).build(), "Released").await;
    env.volume_gone("scratch").await;
    settle().await;
    assert_eq!(env.fake.delete_calls(), ["scratch"]);
    assert!(env.volumes().get_opt("precious").await.unwrap().is_some());
    env.stop().await;
}

#[tokio::test]
async fn with_the_finalizer_option_the_volume_is_protected_until_its_asset_is_deleted() {
    let env = Env::start(quick().add_finalizer(true), FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.unwrap();
    assert_eq!(
        volume.metadata.finalizers,
        Some(vec![FINALIZER_PV.to_owned()])
    );
    env.delete_claim("data").await;
    env.volume_gone(&name).await;
    assert!(env.fake.assets().is_empty());
    env.stop().await;
}

#[tokio::test]
async fn the_finalizer_is_added_to_existing_volumes_and_removed_when_the_option_is_off() {
    let env = Env::start(quick().add_finalizer(true), FakeProvisioner::new()).await;
    create_volume(&env, pv("old").provisioned_by(ME).build(), "Available").await;
    create_volume(
        &env,
        pv("kept")
            .provisioned_by(ME)
            .reclaim_policy("Retain")
            .finalizer(FINALIZER_PV)
            .build(),
        "Available",
    )
    .await;
    let volumes = env.volumes();
    eventually("finalizer added and removed", || {
        let volumes = volumes.clone();
        async move {
            let old = volumes
                .get("old")
                .await
                .ok()?
                .metadata
                .finalizers
                .unwrap_or_default();
            let kept = volumes
                .get("kept")
                .await
                .ok()?
                .metadata
                .finalizers
                .unwrap_or_default();
            (old == [FINALIZER_PV] && kept.is_empty()).then_some(())
        }
    })
    .await;
    env.stop().await;

    let env2 = Env::start(quick(), FakeProvisioner::new()).await;
    create_volume(
        &env2,
        pv("old").provisioned_by(ME).finalizer(FINALIZER_PV).build(),
        "Available",
    )
    .await;
    let volumes = env2.volumes();
    eventually("finalizer removed", || {
        let volumes = volumes.clone();
        async move {
            let f = volumes
                .get("old")
                .await
                .ok()?
                .metadata
                .finalizers
                .unwrap_or_default();
            f.is_empty().then_some(())
        }
    })
    .await;
    env2.stop().await;
}

#[tokio::test]
async fn a_conflicting_finalizer_patch_is_retried() {
    let env = Env::start(quick().add_finalizer(true), FakeProvisioner::new()).await;
    env.sim.add_fault(
        FaultRule::new(Verb::Patch, "persistentvolumes")
            .times(1)
            .status(409, "Conflict"),
    );
    create_volume(&env, pv("old").provisioned_by(ME).build(), "Available").await;
    let volumes = env.volumes();
    eventually("finalizer added", || {
        let volumes = volumes.clone();
        async move {
            let f = volumes
                .get("old")
                .await
                .ok()?
                .metadata
                .finalizers
                .unwrap_or_default();
            (f == [FINALIZER_PV]).then_some(())
        }
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn a_retain_class_keeps_the_volume_and_its_asset_after_release() {
    let env = Env::start(quick().add_finalizer(true), FakeProvisioner::new()).await;
    env.create_class(
        class("keep")
            .provisioner(ME)
            .reclaim_policy("Retain")
            .build(),
    )
    .await;
    env.create_claim(crate::pvc_in("data", "keep")).await;
    let volume = env.bound_volume("data").await;
    let name = volume.metadata.name.clone().unwrap();
    let spec = volume.spec.unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert!(
        volume.metadata.finalizers.unwrap_or_default().is_empty(),
        "no finalizer on a Retain volume"
    );
    env.delete_claim("data").await;
    let volumes = env.volumes();
    eventually("volume released", || {
        let volumes = volumes.clone();
        let name = name.clone();
        async move {
            let v = volumes.get(&name).await.ok()?;
            (v.status?.phase.as_deref() == Some("Released")).then_some(())
        }
    })
    .await;
    settle().await;
    assert!(env.fake.delete_calls().is_empty());
    assert_eq!(env.fake.assets().len(), 1);
    env.stop().await;
}

/// A driver whose volumes carry much of what a real CSI volume has, and that keeps the
/// volume it is asked to delete.
struct Rich {
    fake: FakeProvisioner,
    deleted: std::sync::Mutex<Vec<PersistentVolume>>,
}

#[async_trait::async_trait]
impl provision_controller::Provisioner for Rich {
    async fn provision(
        &self,
        options: &provision_controller::ProvisionOptions,
    ) -> Result<PersistentVolume, provision_controller::ProvisionError> {
        let mut volume = self.fake.provision(options).await?;
        volume
            .metadata
            .labels
            .get_or_insert_default()
            .insert("zone".into(), "a".into());
        let spec = volume.spec.get_or_insert_default();
        spec.mount_options = Some(vec!["noatime".into()]);
        spec.csi = Some(
            serde_json::from_value(serde_json::json!({
                "driver": ME,
                "volumeHandle": "handle-42",
                "fsType": "ext4",
                "volumeAttributes": {"pool": "gold", "escaped": "a\"b\\c"},
                "nodePublishSecretRef": {"name": "s", "namespace": "default"}
            }))
            .unwrap(),
        );
        spec.node_affinity = Some(
            serde_json::from_value(serde_json::json!({
                "required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]}
                ]}]}
            }))
            .unwrap(),
        );
        spec.host_path = None;
        Ok(volume)
    }

    async fn delete(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(), provision_controller::DeleteError> {
        self.deleted.lock().unwrap().push(volume.clone());
        self.fake.delete(volume).await
    }
}

// The controller's volume cache holds volumes compact; what the driver gets to delete
// must still be the whole volume as the API server has it.
#[tokio::test]
async fn the_driver_deletes_the_whole_volume_as_the_api_server_has_it() {
    let fake = FakeProvisioner::new();
    let driver = std::sync::Arc::new(Rich {
        fake: fake.clone(),
        deleted: std::sync::Mutex::default(),
    });
    let env = Env::start_driver(quick(), fake, std::sync::Arc::clone(&driver), |c| c).await;
    env.create_class(fast_class()).await;
    env.create_claim(claim("data")).await;
    let bound = env.bound_volume("data").await;
    let name = bound.metadata.name.clone().unwrap();
    env.delete_claim("data").await;
    env.volume_gone(&name).await;

    let deleted = driver.deleted.lock().unwrap().clone();
    assert_eq!(deleted.len(), 1);
    let got = &deleted[0];
    assert_eq!(got.metadata.uid, bound.metadata.uid);
    assert_eq!(got.metadata.labels, bound.metadata.labels);
    assert_eq!(got.metadata.annotations, bound.metadata.annotations);
    assert!(
        got.metadata
            .managed_fields
            .clone()
            .unwrap_or_default()
            .is_empty(),
        "managed fields are not cached"
    );
    let (got_spec, bound_spec) = (got.spec.clone().unwrap(), bound.spec.clone().unwrap());
    assert_eq!(got_spec.csi, bound_spec.csi);
    assert_eq!(
        got_spec.csi.unwrap().volume_attributes.unwrap()["escaped"],
        "a\"b\\c"
    );
    assert_eq!(got_spec.mount_options, bound_spec.mount_options);
    assert_eq!(got_spec.node_affinity, bound_spec.node_affinity);
    assert_eq!(got_spec.capacity, bound_spec.capacity);
    assert_eq!(got_spec.claim_ref, bound_spec.claim_ref);
    assert_eq!(
        got.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Released")
    );
    env.stop().await;
}
