//! `Config::max_requests_in_flight`: the requests of the claim and volume syncs stay under
//! one bound; watches are not counted, the journal's group writes have two slots of their
//! own and the events an eighth of the bound (at least one), so neither takes a PV
//! create's slot.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use kube_client::Client;
use kube_client::client::Body;
use kube_sim::{FaultRule, Verb};
use provision_controller::{ProvisionController, testing::FakeProvisioner};
use tokio::sync::oneshot;

use crate::{Env, ME, claim, fast_class, quick};

/// Requests in flight through a client, and the most seen at once (watches left out).
#[derive(Clone, Default)]
struct InFlight {
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Recording {
    client: Client,
    /// The requests but the journal's and the events'.
    seen: InFlight,
    /// The journal's (ConfigMaps).
    journal: InFlight,
    /// The event writes.
    events: InFlight,
}

impl tower::Service<Request<Body>> for Recording {
    type Response = Response<Body>;
    type Error = kube_client::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let path = request.uri().path();
        let seen = if path.contains("/configmaps") {
            self.journal.clone()
        } else if path.contains("/events") {
            self.events.clone()
        } else {
            self.seen.clone()
        };
        let watch = request
            .uri()
            .query()
            .is_some_and(|q| q.contains("watch=true"));
        Box::pin(async move {
            if !watch {
                let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most.fetch_max(now, Ordering::SeqCst);
            }
            let response = client.send(request).await;
            if !watch {
                seen.now.fetch_sub(1, Ordering::SeqCst);
            }
            response
        })
    }
}

/// Provisions 12 claims whose every claim patch and PV create takes 100 ms, through a
/// client that records its requests in flight; returns the most seen at once, the
/// journal's and the events' apart.
async fn most_in_flight(bound: Option<NonZeroUsize>) -> (usize, usize, usize) {
    let sim = Env::sim().await;
    for resource in ["persistentvolumeclaims", "persistentvolumes"] {
        let verb = if resource == "persistentvolumes" {
            Verb::Create
        } else {
            Verb::Patch
        };
        sim.add_fault(
            FaultRule::new(verb, resource)
                .always()
                .latency(Duration::from_millis(100))
                .no_status(),
        );
    }
    let (seen, journal, events) = (
        InFlight::default(),
        InFlight::default(),
        InFlight::default(),
    );
    let client = Client::new(
        Recording {
            client: sim.client(),
            seen: seen.clone(),
            journal: journal.clone(),
            events: events.clone(),
        },
        "default",
    );
    let config = quick().max_requests_in_flight(bound);
    let controller = ProvisionController::new(client, ME, FakeProvisioner::new()).config(config);
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    let env_client = sim.client();
    kube_client::Api::<k8s_openapi::api::storage::v1::StorageClass>::all(env_client.clone())
        .create(&Default::default(), &fast_class())
        .await
        .unwrap();
    let claims = kube_client::Api::namespaced(env_client.clone(), "default");
    for i in 0..12 {
        claims
            .create(&Default::default(), &claim(&format!("c{i}")))
            .await
            .unwrap();
    }
    crate::eventually("all 12 claims bound", || async {
        let list = claims.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .filter(|c: &&k8s_openapi::api::core::v1::PersistentVolumeClaim| {
                c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            })
            .count()
            .eq(&12)
            .then_some(())
    })
    .await;
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    (
        seen.most.load(Ordering::SeqCst),
        journal.most.load(Ordering::SeqCst),
        events.most.load(Ordering::SeqCst),
    )
}

#[tokio::test]
async fn the_controller_keeps_its_requests_in_flight_under_the_bound() {
    let (most, journal, events) = most_in_flight(NonZeroUsize::new(3)).await;
    assert!(most <= 3, "{most} requests in flight with a bound of 3");
    assert!(events >= 1, "no event was written");
    assert!(
        events <= 1,
        "{events} event writes in flight, beyond their one slot"
    );
    assert!(journal >= 1, "the journal was never written");
    assert!(
        journal <= 2,
        "{journal} journal writes in flight, beyond its 2 slots"
    );
}

#[tokio::test]
async fn without_a_bound_every_sync_worker_may_have_a_request_in_flight() {
    // The same load unbounded goes past 3: the bound above is what held it.
    let (most, _, _) = most_in_flight(None).await;
    assert!(most > 3, "only {most} requests in flight without a bound");
}
