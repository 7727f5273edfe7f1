//! Scenarios of upstream's `controller/controller_test.go` that the other files do not
//! cover (the behaviour, against kube-sim with its PV binder).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::{
    Api,
    api::{DeleteParams, PostParams},
};
use kube_runtime::{WatchStreamExt, reflector, watcher};
use kube_sim::KubeSim;
use provision_controller::{
    ProvisionController, SharedCache,
    annotations::{ANN_SELECTED_NODE, FINALIZER_PV},
    testing::{FakeProvisioner, ProvisionStep, pv, pvc},
};

use crate::{Env, ME, claim, delete::create_volume, eventually, fast_class, quick, quiet, settle};

// Go: "don't provision for claim-1 because it's already bound".
#[tokio::test]
async fn a_claim_that_is_already_bound_gets_no_volume() {
    let env = Env::start(quiet(), FakeProvisioner::new()).await;
    env.create_class(fast_class()).await;
    env.create_claim(
        pvc("bound")
            .storage_class("fast")
            .volume_name("pv-static")
            .build(),
    )
    .await;
    env.create_claim(claim("fresh")).await;
    env.bound_volume("fresh").await;
    settle().await;
    let calls = env.fake.provision_calls();
    assert_eq!(calls.len(), 1, "only the unbound claim");
    assert_eq!(calls[0].claim.metadata.name.as_deref(), Some("fresh"));
    env.stop().await;
}

// Go: "do not remove selectedNode if nothing changes".
#[tokio::test]
async fn a_no_change_answer_keeps_the_selected_node_and_is_retried() {
    let fake = FakeProvisioner::new().script_provision([ProvisionStep::NoChange]);
    let env = Env::start(quick(), fake).await;
    env.create_scheduled_claim().await;
    env.bound_volume("data").await;
    let calls = env.fake.provision_calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c.selected_node_name.as_deref() == Some("node-1")),
        "never rescheduled"
    );
    let claim = env.claims().get("data").await.unwrap();
    let annotations = claim.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(ANN_SELECTED_NODE).map(String::as_str),
        Some("node-1")
    );
    env.stop().await;
}

// Go: "ensure volume with finalizer is deleted if it is in a Released state and reclaim
// policy is Delete and already under deletion".
#[tokio::test]
async fn a_released_volume_already_being_deleted_gets_its_asset_deleted_and_the_finalizer_removed()
{
    let allow = Arc::new(AtomicBool::new(false));
    let guard = Arc::clone(&allow);
    let env = Env::start_with(
        quiet().add_finalizer(true),
        FakeProvisioner::new(),
        move |c| c.deletion_guard(move |_: &PersistentVolume| guard.load(Ordering::SeqCst)),
    )
    .await;
    create_volume(
        &env,
        pv("v").provisioned_by(ME).finalizer(FINALIZER_PV).build(),
        "Released",
    )
    .await;
    settle().await;
    assert!(env.fake.delete_calls().is_empty(), "vetoed so far");

    allow.store(true, Ordering::SeqCst);
    env.volumes()
        .delete("v", &DeleteParams::default())
        .await
        .unwrap();
    env.volume_gone("v").await;
    assert_eq!(env.fake.delete_calls(), ["v"]);
    env.stop().await;
}

// Go: "provisioner fails to delete the volume with finalizer, the pv is not deleted".
#[tokio::test]
async fn a_failed_asset_delete_keeps_the_volume_and_its_finalizer() {
    let fake = FakeProvisioner::new().script_delete(std::iter::repeat_n(
        provision_controller::testing::DeleteStep::Fail,
        100,
    ));
    let env = Env::start(quiet().add_finalizer(true), fake).await;
    create_volume(
        &env,
        pv("v").provisioned_by(ME).finalizer(FINALIZER_PV).build(),
        "Released",
    )
    .await;
    eventually("two delete attempts", || async {
        (env.fake.delete_calls().len() >= 2).then_some(())
    })
    .await;
    let volume = env.volumes().get("v").await.unwrap();
    assert_eq!(
        crate::own_finalizers(volume.metadata.finalizers.as_ref()),
        [FINALIZER_PV]
    );
    assert!(volume.metadata.deletion_timestamp.is_none());
    env.stop().await;
}

/// A cache run by the "caller", as the `SharedCache` docs show.
fn caller_cache<K>(
    client: &kube_client::Client,
    tasks: &mut tokio::task::JoinSet<()>,
) -> SharedCache<K>
where
    K: kube_client::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let (tx, changes) = futures::channel::mpsc::unbounded();
    tasks.spawn(
        watcher(Api::<K>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .touched_objects()
            .for_each(move |obj| {
                if let Ok(obj) = obj {
                    let _ = tx.unbounded_send(Arc::new(obj));
                }
                async {}
            }),
    );
    SharedCache::new(store, changes)
}

// Go: `TestControllerSharedInformers`.
#[tokio::test]
async fn the_controller_runs_on_caches_the_caller_already_has() {
    let sim = KubeSim::builder().pv_binder(true).start().await.unwrap();
    let client = sim.client();
    let mut tasks = tokio::task::JoinSet::new();
    let claims = caller_cache::<PersistentVolumeClaim>(&client, &mut tasks);
    let volumes = caller_cache::<PersistentVolume>(&client, &mut tasks);
    let classes = caller_cache::<StorageClass>(&client, &mut tasks);
    let fake = FakeProvisioner::new();
    let controller = ProvisionController::new(client.clone(), ME, fake.clone())
        .config(quick())
        .claims_cache(claims)
        .volumes_cache(volumes)
        .classes_cache(classes);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));

    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &fast_class())
        .await
        .unwrap();
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims_api
        .create(&PostParams::default(), &claim("data"))
        .await
        .unwrap();
    let name = eventually("claim bound", || {
        let claims_api = claims_api.clone();
        async move {
            let c = claims_api.get("data").await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound"))
                .then_some(c.spec?.volume_name)
                .flatten()
        }
    })
    .await;
    claims_api
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let volumes_api: Api<PersistentVolume> = Api::all(client.clone());
    eventually("volume deleted", || {
        let volumes_api = volumes_api.clone();
        let name = name.clone();
        async move {
            volumes_api
                .get_opt(&name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    assert!(fake.assets().is_empty());

    let _ = stop.send(());
    run.await.unwrap().unwrap();
    tasks.shutdown().await;
}
