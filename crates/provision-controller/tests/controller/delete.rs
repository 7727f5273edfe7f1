//! The volume flow.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_runtime::{reflector, watcher};
use kube_sim::{FaultRule, Verb};
use provision_controller::{
    SharedCache,
    annotations::FINALIZER_PV,
    testing::{DeleteStep, FakeProvisioner, class, pv, pvc},
};

use crate::{Env, ME, claim, eventually, fast_class, quick, quiet, settle};

/// The event reason operators see (Go's string).
const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

/// Creates a claim `claim` (without class: nothing provisions it) and the PV `volume`
/// with a claimRef to it; returns the PV once the binder has bound them.
pub(crate) async fn create_bound_volume(
    env: &Env,
    mut volume: PersistentVolume,
    claim: &str,
) -> PersistentVolume {
    let uid = env.create_claim(pvc(claim).build()).await;
    let name = volume.metadata.name.clone().unwrap();
    volume.spec.as_mut().unwrap().claim_ref = pv("x")
        .claim_ref("default", claim, &uid)
        .build()
        .spec
        .unwrap()
        .claim_ref;
    env.volumes()
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
    let volumes = env.volumes();
    eventually(&format!("pv {name} bound"), || {
        let volumes = volumes.clone();
        let name = name.clone();
        async move {
            let v = volumes.get(&name).await.ok()?;
            (v.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(v)
        }
    })
    .await
}

/// A volume cache the test feeds by hand, to show the controller a volume as an
/// earlier watch event had it (a cache that lags the API server).
struct HandCache {
    writer: reflector::store::Writer<PersistentVolume>,
    changes: futures::channel::mpsc::UnboundedSender<Arc<PersistentVolume>>,
}

fn hand_cache() -> (HandCache, SharedCache<PersistentVolume>) {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let (changes, stream) = futures::channel::mpsc::unbounded();
    (
        HandCache { writer, changes },
        SharedCache::new(store, stream),
    )
}

impl HandCache {
    /// Puts `volume` in the cache and tells the controller it changed.
    fn show(&mut self, volume: PersistentVolume) {
        self.writer
            .apply_watcher_event(&watcher::Event::Apply(volume.clone()));
        self.changes.unbounded_send(Arc::new(volume)).unwrap();
    }
}

/// The PV's finalizers but the cluster's `kubernetes.io/pv-protection`.
async fn finalizers(env: &Env, name: &str) -> Option<Vec<String>> {
    let volume = env.volumes().get_opt(name).await.ok()??;
    Some(crate::own_finalizers(volume.metadata.finalizers.as_ref()))
}

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
    let registry = std::sync::Arc::new(std::sync::Mutex::new(
        prometheus_client::registry::Registry::default(),
    ));
    let env = Env::start_with(quiet(), fake, |c| c.metrics_registry(registry.clone())).await;
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
    prometheus_client::encoding::text::encode(&mut text, &registry.lock().unwrap()).unwrap();
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

// Go: a panic in the driver's code kills the process.
#[tokio::test]
async fn a_panicking_deletion_guard_fails_that_volume_and_it_is_retried() {
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    // No resync: only the retry of the failed sync brings the volume back.
    let env = Env::start_with(quiet(), FakeProvisioner::new(), move |c| {
        c.deletion_guard(move |_: &PersistentVolume| {
            if counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                panic!("deletion guard bug");
            }
            true
        })
    })
    .await;
    create_volume(&env, pv("v").provisioned_by(ME).build(), "Released").await;
    env.volume_gone("v").await;
    assert!(asked.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    assert_eq!(env.fake.delete_calls(), ["v"]);
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
        crate::own_finalizers(volume.metadata.finalizers.as_ref()),
        [FINALIZER_PV]
    );
    env.delete_claim("data").await;
    env.volume_gone(&name).await;
    assert!(env.fake.assets().is_empty());
    env.stop().await;
}

#[tokio::test]
async fn the_finalizer_is_added_to_existing_volumes_and_removed_when_the_option_is_off() {
    let env = Env::start(quick().add_finalizer(true), FakeProvisioner::new()).await;
    create_bound_volume(&env, pv("old").provisioned_by(ME).build(), "data").await;
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
            let old = volumes.get("old").await.ok()?.metadata.finalizers;
            let old = crate::own_finalizers(old.as_ref());
            let kept = volumes.get("kept").await.ok()?.metadata.finalizers;
            let kept = crate::own_finalizers(kept.as_ref());
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
            let f = volumes.get("old").await.ok()?.metadata.finalizers;
            crate::own_finalizers(f.as_ref()).is_empty().then_some(())
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
    create_bound_volume(&env, pv("old").provisioned_by(ME).build(), "data").await;
    let volumes = env.volumes();
    eventually("finalizer added", || {
        let volumes = volumes.clone();
        async move {
            let f = volumes.get("old").await.ok()?.metadata.finalizers;
            (crate::own_finalizers(f.as_ref()) == [FINALIZER_PV]).then_some(())
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
        crate::own_finalizers(volume.metadata.finalizers.as_ref()).is_empty(),
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

// Go v13: the finalizer is added to Bound volumes only.
#[tokio::test]
async fn the_finalizer_is_added_to_bound_volumes_only() {
    let env = Env::start(quiet().add_finalizer(true), FakeProvisioner::new()).await;
    create_volume(&env, pv("free").provisioned_by(ME).build(), "Available").await;
    create_bound_volume(&env, pv("used").provisioned_by(ME).build(), "data").await;
    eventually("finalizer added to the bound volume", || async {
        (finalizers(&env, "used").await? == [FINALIZER_PV]).then_some(())
    })
    .await;
    settle().await;
    assert_eq!(
        finalizers(&env, "free").await,
        Some(vec![]),
        "an available volume gets no finalizer"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_volume_being_deleted_that_will_never_be_reclaimed_loses_our_finalizer() {
    let env = Env::start(quiet().add_finalizer(true), FakeProvisioner::new()).await;
    create_volume(
        &env,
        pv("free")
            .provisioned_by(ME)
            .finalizer(FINALIZER_PV)
            .build(),
        "Available",
    )
    .await;
    create_bound_volume(
        &env,
        pv("used")
            .provisioned_by(ME)
            .finalizer(FINALIZER_PV)
            .build(),
        "data",
    )
    .await;
    for name in ["free", "used"] {
        env.volumes()
            .delete(name, &Default::default())
            .await
            .unwrap();
    }
    env.volume_gone("free").await;
    settle().await;
    let used = env.volumes().get("used").await.unwrap();
    assert!(used.metadata.deletion_timestamp.is_some());
    assert_eq!(
        crate::own_finalizers(used.metadata.finalizers.as_ref()),
        [FINALIZER_PV],
        "a bound volume keeps it: its asset is deleted once it is released"
    );
    assert!(env.fake.delete_calls().is_empty(), "no asset deleted");
    env.stop().await;
}

// Go v13 patches finalizers without a resourceVersion: a finalizer patch computed from a
// cache that missed another writer's change neither conflicts nor drops that change.
#[tokio::test]
async fn a_finalizer_patch_from_a_stale_cache_does_not_conflict_and_keeps_other_finalizers() {
    let (mut hand, cache) = hand_cache();
    let env = Env::start_with(quiet().add_finalizer(true), FakeProvisioner::new(), |c| {
        c.volumes_cache(cache)
    })
    .await;
    let stale = create_bound_volume(&env, pv("v").provisioned_by(ME).build(), "data").await;
    let other = serde_json::json!({"metadata": {"finalizers": ["example.com/other"]}});
    env.volumes()
        .patch("v", &PatchParams::default(), &Patch::Merge(&other))
        .await
        .unwrap();
    hand.show(stale);
    eventually("our finalizer added next to the other one", || async {
        (finalizers(&env, "v").await? == ["example.com/other", FINALIZER_PV]).then_some(())
    })
    .await;
    let conflicts: Vec<_> = env
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.resource == "persistentvolumes" && r.status == 409)
        .collect();
    assert_eq!(conflicts, [], "no conflict with the other writer");
    env.stop().await;
}

// The driver's delete cannot be undone: it is decided on the volume as the API server
// has it right before, not on a cache that may lag.
#[tokio::test]
async fn the_asset_is_kept_when_the_volume_changed_since_the_cache_saw_it_released() {
    let (mut hand, cache) = hand_cache();
    let env = Env::start_with(quiet(), FakeProvisioner::new(), |c| c.volumes_cache(cache)).await;
    let released_in_cache = |mut v: PersistentVolume| {
        v.status.get_or_insert_default().phase = Some("Released".into());
        v.spec
            .get_or_insert_default()
            .persistent_volume_reclaim_policy = Some("Delete".into());
        v
    };
    // Switched to Retain after its release.
    create_volume(
        &env,
        pv("retained")
            .provisioned_by(ME)
            .reclaim_policy("Retain")
            .build(),
        "Released",
    )
    .await;
    hand.show(released_in_cache(
        env.volumes().get("retained").await.unwrap(),
    ));
    // Bound now.
    let bound = create_bound_volume(&env, pv("rebound").provisioned_by(ME).build(), "data").await;
    hand.show(released_in_cache(bound));
    // Deleted and re-created under the same name.
    create_volume(&env, pv("recreated").provisioned_by(ME).build(), "Released").await;
    let mut older = env.volumes().get("recreated").await.unwrap();
    older.metadata.uid = Some("uid-of-an-older-volume".into());
    hand.show(older);
    // Gone.
    let mut gone = pv("gone").provisioned_by(ME).build();
    gone.metadata.uid = Some("uid-of-a-deleted-volume".into());
    hand.show(released_in_cache(gone));
    // The cache is right about this one.
    create_volume(&env, pv("released").provisioned_by(ME).build(), "Released").await;
    hand.show(env.volumes().get("released").await.unwrap());

    env.volume_gone("released").await;
    settle().await;
    assert_eq!(env.fake.delete_calls(), ["released"]);
    for name in ["retained", "rebound", "recreated"] {
        assert!(
            env.volumes().get_opt(name).await.unwrap().is_some(),
            "{name} kept"
        );
    }
    env.stop().await;
}

// A PV saved for a claim that is gone (a crash-safety cleanup saves one) can be deleted
// by hand before the PV controller released it: it will be released, so our finalizer
// stays until its asset is reclaimed.
#[tokio::test]
async fn a_volume_deleted_before_its_release_keeps_our_finalizer_and_is_reclaimed() {
    let (mut hand, cache) = hand_cache();
    let env = Env::start_with(quiet().add_finalizer(true), FakeProvisioner::new(), |c| {
        c.volumes_cache(cache)
    })
    .await;
    env.fake.add_asset("v");
    create_volume(
        &env,
        pv("v")
            .provisioned_by(ME)
            .finalizer(FINALIZER_PV)
            .claim_ref("default", "gone", "uid-of-a-deleted-claim")
            .build(),
        "Available",
    )
    .await;
    env.volumes()
        .delete("v", &Default::default())
        .await
        .unwrap();
    let volumes = env.volumes();
    let released = eventually("the deleted volume released", || {
        let volumes = volumes.clone();
        async move {
            let v = volumes.get("v").await.ok()?;
            (v.status.as_ref()?.phase.as_deref() == Some("Released")).then_some(v)
        }
    })
    .await;
    // The controller sees it deleted while still Available.
    let mut stale = released.clone();
    stale.status.get_or_insert_default().phase = Some("Available".into());
    hand.show(stale);
    settle().await;
    assert_eq!(
        finalizers(&env, "v").await,
        Some(vec![FINALIZER_PV.to_owned()]),
        "our finalizer stays: the volume will be released"
    );
    assert!(env.fake.delete_calls().is_empty());

    hand.show(released);
    env.volume_gone("v").await;
    assert_eq!(env.fake.delete_calls(), ["v"]);
    assert!(env.fake.assets().is_empty());
    env.stop().await;
}

/// A driver whose delete also deletes the PV and waits until it is gone (another actor
/// deleting it while the driver works, as `kubectl delete pv` would).
struct DeletesItsVolume {
    fake: FakeProvisioner,
    client: kube_client::Client,
}

#[async_trait::async_trait]
impl provision_controller::Provisioner for DeletesItsVolume {
    async fn provision(
        &self,
        options: &provision_controller::ProvisionOptions,
    ) -> Result<PersistentVolume, provision_controller::ProvisionError> {
        self.fake.provision(options).await
    }

    async fn delete(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(), provision_controller::DeleteError> {
        self.fake.delete(volume).await?;
        let volumes: kube_client::Api<PersistentVolume> =
            kube_client::Api::all(self.client.clone());
        let name = volume.metadata.name.clone().unwrap();
        volumes.delete(&name, &Default::default()).await.unwrap();
        eventually(&format!("pv {name} gone"), || {
            let volumes = volumes.clone();
            let name = name.clone();
            async move { volumes.get_opt(&name).await.unwrap().is_none() }
        })
        .await;
        Ok(())
    }
}

// Go counts a PV delete answered 404 as a failed deletion; here the PV is gone, which is
// what the delete was for.
#[tokio::test]
async fn deleting_a_volume_already_gone_counts_as_deleted() {
    let registry = std::sync::Arc::new(std::sync::Mutex::new(
        prometheus_client::registry::Registry::default(),
    ));
    let sim = Env::sim().await;
    let fake = FakeProvisioner::new();
    let driver = DeletesItsVolume {
        fake: fake.clone(),
        client: sim.client(),
    };
    let env = Env::start_on(sim, quiet(), fake, driver, |c| {
        c.metrics_registry(registry.clone())
    })
    .await;
    create_volume(&env, pv("v").provisioned_by(ME).build(), "Released").await;
    env.volume_gone("v").await;
    let encoded = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry.lock().unwrap()).unwrap();
        text
    };
    eventually("the deletion counted", || async {
        encoded().contains("controller_persistentvolume_delete_total{class=\"\"} 1")
    })
    .await;
    settle().await;
    let text = encoded();
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("controller_persistentvolume_delete_failed_total")),
        "{text}"
    );
    assert!(env.events("v", VOLUME_FAILED_DELETE).await.is_empty());
    assert_eq!(env.fake.delete_calls(), ["v"]);
    env.stop().await;
}
