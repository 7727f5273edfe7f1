//! Shared fixtures: a kube-sim with the CRD installed, volumes, waits and event reads.

#![allow(dead_code)]

use std::{future::Future, sync::Arc, time::Duration};

use crate::{
    CnsVolumeMetadata, CnsVolumeMetadataSpec, Config, FINALIZER, VSPHERE_CSI_DRIVER,
    context::{Context, ReconcileError},
    crd,
    reconciler::reconcile,
    testing::{InMemoryBackend, bound_claim, csi_volume, tokio_clock},
};
use futures::StreamExt;
use k8s_openapi::{
    api::{
        core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim},
        events::v1::Event,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api, Client, Resource,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use kube_runtime::{
    WatchStreamExt,
    controller::Action,
    reflector::{self, Store},
    watcher,
};
use kube_sim::KubeSim;
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;

/// Namespaces created in every sim besides `default`.
pub const NAMESPACES: [&str; 3] = ["tenant", "team-a", "team-b"];

pub struct Harness {
    pub sim: KubeSim,
    pub client: Client,
    pub backend: InMemoryBackend,
}

/// A kube-sim with the CRD installed through the API and the test namespaces.
pub async fn harness() -> Harness {
    let sim = KubeSim::builder().start().await.expect("kube-sim starts");
    let client = sim.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd())
        .await
        .expect("CRD is accepted");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in NAMESPACES {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }
    Harness {
        sim,
        client,
        backend: InMemoryBackend::new(),
    }
}

/// The config every test starts from.
pub fn config() -> Config {
    Config::default()
        .cluster_id("cluster-7")
        .supervisor_id("supervisor-9")
        .vsphere_user("cns-user@vsphere.local")
}

impl Harness {
    pub fn objects(&self, namespace: &str) -> Api<CnsVolumeMetadata> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// PV `pv` of `driver` with handle `handle`, and the claim `namespace/claim` bound to it.
    pub async fn volume(&self, namespace: &str, claim: &str, pv: &str, driver: &str, handle: &str) {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        pvs.create(&PostParams::default(), &csi_volume(pv, driver, handle))
            .await
            .expect("pv");
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        claims
            .create(&PostParams::default(), &bound_claim(namespace, claim, pv))
            .await
            .expect("claim");
    }

    /// A vSphere volume: PV `pv-<claim>` with handle `fcd-<claim>`.
    pub async fn vsphere_volume(&self, namespace: &str, claim: &str) {
        let (pv, handle) = (format!("pv-{claim}"), format!("fcd-{claim}"));
        self.volume(namespace, claim, &pv, VSPHERE_CSI_DRIVER, &handle)
            .await;
    }

    pub async fn create(&self, namespace: &str, name: &str, spec: CnsVolumeMetadataSpec) {
        let object = CnsVolumeMetadata::new(name, spec);
        self.objects(namespace)
            .create(&PostParams::default(), &object)
            .await
            .expect("object is created");
    }

    pub async fn get(&self, namespace: &str, name: &str) -> Option<CnsVolumeMetadata> {
        self.objects(namespace).get_opt(name).await.expect("get")
    }

    /// Replaces the object's spec with `change` applied to it.
    pub async fn edit(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut CnsVolumeMetadataSpec),
    ) {
        let mut object = self.get(namespace, name).await.expect("object exists");
        change(&mut object.spec);
        self.objects(namespace)
            .replace(name, &PostParams::default(), &object)
            .await
            .expect("object is replaced");
    }

    pub async fn delete(&self, namespace: &str, name: &str) {
        self.objects(namespace)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }

    /// events.k8s.io events regarding `namespace/name`.
    pub async fn events(&self, namespace: &str, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let list = events.list(&Default::default()).await.expect("list events");
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    /// A reconciler context over caches filled by reflectors that live in `tasks`.
    pub async fn direct(&self, config: Config) -> Direct {
        let mut tasks = JoinSet::new();
        let claims = cache::<PersistentVolumeClaim>(&self.client, &mut tasks);
        let volumes = cache::<PersistentVolume>(&self.client, &mut tasks);
        claims.wait_until_ready().await.expect("claims cache");
        volumes.wait_until_ready().await.expect("volumes cache");
        let backend = Arc::new(self.backend.clone());
        // The tokio clock is the wall clock unless a test pauses time.
        let ctx = Context::new(
            self.client.clone(),
            backend,
            config,
            claims.clone(),
            volumes.clone(),
        )
        .with_clock(tokio_clock());
        Direct {
            ctx: Arc::new(ctx),
            claims,
            _tasks: tasks,
        }
    }
}

pub struct Direct {
    pub ctx: Arc<Context>,
    pub claims: Store<PersistentVolumeClaim>,
    _tasks: JoinSet<()>,
}

fn cache<K>(client: &Client, tasks: &mut JoinSet<()>) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    tasks.spawn(stream.for_each(|_| futures::future::ready(())));
    reader
}

/// Polls `check` every 20 ms until it returns `Some`, for at most 10 s.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Reads the object from the server and reconciles it once; the events it published are
/// written when it returns (they are written in the background).
pub async fn step(
    h: &Harness,
    d: &Direct,
    namespace: &str,
    name: &str,
) -> Result<Action, ReconcileError> {
    let object = h.get(namespace, name).await.expect("object exists");
    let result = reconcile(Arc::new(object), d.ctx.clone()).await;
    d.ctx.flush_events(Duration::from_secs(10)).await;
    result
}

/// Creates the object and reconciles it twice: finalizer, then the first update.
pub async fn created_and_synced(
    h: &Harness,
    d: &Direct,
    namespace: &str,
    name: &str,
    spec: CnsVolumeMetadataSpec,
) -> CnsVolumeMetadata {
    h.create(namespace, name, spec).await;
    let calls = h.backend.calls().len();
    assert_eq!(
        step(h, d, namespace, name).await.unwrap(),
        Action::await_change()
    );
    let finalized = h.get(namespace, name).await.unwrap();
    assert_eq!(
        finalized.metadata.finalizers,
        Some(vec![FINALIZER.to_owned()])
    );
    assert_eq!(
        h.backend.calls().len(),
        calls,
        "the first reconcile only adds the finalizer"
    );
    step(h, d, namespace, name).await.unwrap();
    h.get(namespace, name).await.unwrap()
}
