//! Where the controller elects: `POD_NAMESPACE` when the binary passes it through
//! `Config::from_lookup`, else the client's namespace (the service account's in a pod).

use std::time::Duration;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::{Api, api::PostParams};
use kube_sim::KubeSim;
use provision_controller::{Config, ProvisionController, client};
use tokio::sync::oneshot;

use super::{LEASE_NAME, ME, config, election, eventually, sim};

async fn create_namespace(sim: &KubeSim, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(sim.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

/// Runs a controller configured from `lookup` whose clients default to namespace
/// `client_namespace`, until it holds a Lease; returns the Lease's namespace.
async fn elected_namespace(
    sim: &KubeSim,
    client_namespace: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> String {
    let mut kube_config = kube_client::Config::new(sim.url().parse().unwrap());
    kube_config.default_namespace = client_namespace.into();
    let client = kube_client::Client::try_from(kube_config.clone()).unwrap();
    let from_lookup = Config::from_lookup(lookup).unwrap();
    let namespace = from_lookup.leader_election.unwrap().namespace;
    let timings = election("a").namespace(namespace);
    let controller = ProvisionController::new(client, ME, fake())
        .config(config(Some(timings)))
        .leader_election_client(client::for_leader_election(&kube_config).unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    let leases: Api<Lease> = Api::all(sim.client());
    let found = eventually("the controller holds a lease", || {
        let leases = leases.clone();
        async move {
            let list = leases.list(&Default::default()).await.ok()?;
            let lease = list.items.into_iter().find(|l| {
                l.metadata.name.as_deref() == Some(LEASE_NAME)
                    && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("a")
            })?;
            lease.metadata.namespace
        }
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("run returns after shutdown")
        .unwrap()
        .unwrap();
    found
}

fn fake() -> provision_controller::testing::FakeProvisioner {
    provision_controller::testing::FakeProvisioner::new()
}

#[tokio::test]
async fn without_pod_namespace_the_lease_is_in_the_clients_namespace() {
    let sim = sim().await;
    create_namespace(&sim, "storage").await;
    assert_eq!(
        elected_namespace(&sim, "storage", |_| None).await,
        "storage"
    );
}

#[tokio::test]
async fn pod_namespace_wins_over_the_clients_namespace() {
    let sim = sim().await;
    create_namespace(&sim, "storage").await;
    create_namespace(&sim, "elsewhere").await;
    let lookup = |key: &str| (key == "POD_NAMESPACE").then(|| "elsewhere".to_owned());
    assert_eq!(
        elected_namespace(&sim, "storage", lookup).await,
        "elsewhere"
    );
}
