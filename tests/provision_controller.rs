//! provision-controller as a driver author uses it, against kube-sim: a claim's whole
//! life, on caches the caller runs itself (Go: `ClaimsInformer`, `VolumesInformer`,
//! `ClassesInformer`).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use kube_runtime::{WatchStreamExt, reflector, watcher};
use kube_sim::wait::eventually;
use provision_controller::{
    Config, ProvisionController, SharedCache,
    testing::{FakeProvisioner, class, pvc},
};

const NAME: &str = "example.com/fake";

/// A reflector the caller drives; the controller gets its store and a copy of its changes.
fn shared<K>(api: Api<K>, tasks: &mut tokio::task::JoinSet<()>) -> SharedCache<K>
where
    K: kube_client::Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let (tx, changes) = futures::channel::mpsc::unbounded();
    tasks.spawn(
        watcher(api, watcher::Config::default())
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

#[tokio::test]
async fn a_claim_is_provisioned_and_reclaimed_on_caches_the_caller_runs() {
    let sim = kube_sim::KubeSim::builder()
        .pv_binder(true)
        .start()
        .await
        .unwrap();
    let client: Client = sim.client();
    let mut caller_tasks = tokio::task::JoinSet::new();
    let fake = FakeProvisioner::new();
    let config = Config::default()
        .leader_election(None)
        .resync_period(Duration::from_secs(5));
    let controller = ProvisionController::new(client.clone(), NAME, fake.clone())
        .config(config)
        .claims_cache(shared(Api::all(client.clone()), &mut caller_tasks))
        .volumes_cache(shared(Api::all(client.clone()), &mut caller_tasks))
        .classes_cache(shared(Api::all(client.clone()), &mut caller_tasks));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));

    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &class("fast").provisioner(NAME).build(),
        )
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = pvc("data").storage_class("fast").build();
    let uid = claims
        .create(&PostParams::default(), &claim)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let pv_name = format!("pvc-{uid}");

    eventually("claim bound", || async {
        let claim = claims.get("data").await.unwrap();
        claim.spec.and_then(|s| s.volume_name).as_deref() == Some(pv_name.as_str())
            && claim.status.and_then(|s| s.phase).as_deref() == Some("Bound")
    })
    .await;
    assert_eq!(
        fake.assets().into_iter().collect::<Vec<_>>(),
        std::slice::from_ref(&pv_name)
    );

    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    eventually("volume and asset deleted", || async {
        volumes.get_opt(&pv_name).await.unwrap().is_none() && fake.assets().is_empty()
    })
    .await;

    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    caller_tasks.abort_all();
}

/// GET `path` over HTTP/1.1; the status, or `None` while nothing listens.
async fn status_of(addr: std::net::SocketAddr, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.ok()?;
    raw.split(' ').nth(1)?.parse().ok()
}

#[tokio::test]
async fn with_the_production_defaults_a_replica_leads_serves_probes_and_releases_its_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    let sim = kube_sim::KubeSim::builder()
        .pv_binder(true)
        .start()
        .await
        .unwrap();
    let client: Client = sim.client();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // What a binary does: Config from its environment (here: none, so namespace
    // "default"), leader election on by default, a dedicated client for the lease.
    let config = Config::from_lookup(|_| None)
        .unwrap()
        .metrics_address([127, 0, 0, 1].into())
        .metrics_port(port);
    let kube_config = kube_client::Config::new(sim.url().parse().unwrap());
    let fake = FakeProvisioner::new();
    let controller = ProvisionController::new(client.clone(), NAME, fake.clone())
        .config(config)
        .leader_election_client(
            provision_controller::client::for_leader_election(&kube_config).unwrap(),
        );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    eventually("ready", || async {
        status_of(addr, "/readyz").await == Some(200)
    })
    .await;
    assert_eq!(status_of(addr, "/healthz").await, Some(200));

    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = || async {
        leases
            .get_opt("example.com-fake")
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    eventually("lease held", || async { holder().await.is_some() }).await;

    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &class("fast").provisioner(NAME).build(),
        )
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &pvc("data").storage_class("fast").build(),
        )
        .await
        .unwrap();
    eventually("claim bound", || async {
        let claim = claims.get("data").await.unwrap();
        claim.status.and_then(|s| s.phase).as_deref() == Some("Bound")
    })
    .await;
    assert_eq!(fake.provision_calls().len(), 1);

    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert_eq!(holder().await, None, "the lease is released on shutdown");
    assert_eq!(
        status_of(addr, "/healthz").await,
        None,
        "the server stopped with run"
    );
}
