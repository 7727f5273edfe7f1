//! Wiring: caches, the trigger watch, leadership terms and kube-runtime's `applier` (Go: `Add`
//! and `add`).

use std::{
    convert::Infallible,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use futures::{
    FutureExt, SinkExt, Stream, StreamExt,
    future::{self, BoxFuture, Shared},
    stream,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube_client::{Api, Client, Resource};
use kube_controller_kit::{error::chain, leader::Leading, store::drop_managed_fields};
use kube_runtime::{
    WatchStreamExt, applier,
    controller::{self, Action, Config as ControllerConfig, ReconcileReason, ReconcileRequest},
    reflector::{self, ObjectRef, Store, store::Writer},
    watcher,
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, info, warn};

use crate::{
    backend::{ClusterFlavor, VolumeMetadataBackend},
    backoff::PerObjectBackoff,
    config::{Config, ConfigError},
    context::{Context, ReconcileError},
    reconciler::{error_policy, reconcile},
    related::{ClaimKey, Related},
    resource::CnsVolumeMetadata,
    trigger::{Term, Triggers},
};

/// Why [`MetadataController::run`] stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot be used. Not returned by [`MetadataController::run`]: an empty
    /// cluster ID fails the objects that need it (its reconcile fails, naming the option).
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    /// A cache of claims or volumes stopped before it was filled.
    #[error("the {0} cache stopped before it was filled")]
    CacheStopped(&'static str),
}

/// A reflector filling `writer` with every `K`, managedFields dropped; runs until dropped.
/// `concerned` tells which claims each event may have changed the resolution of (it sees
/// every event after the store applied it); the objects naming them are reconciled, when a
/// term is running.
async fn fill_cache<K>(
    api: Api<K>,
    writer: Writer<K>,
    what: &'static str,
    triggers: Arc<Triggers>,
    concerned: impl Fn(&watcher::Event<K>) -> Vec<ClaimKey>,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(drop_managed_fields)
        .reflect(writer)
        .for_each(|event| {
            let next = match event {
                Ok(event) => {
                    let claims = concerned(&event);
                    if claims.is_empty() {
                        None
                    } else {
                        triggers.users_of(&claims)
                    }
                }
                Err(error) => {
                    warn!(cache = what, error = %chain(&error), "watch failed; retrying");
                    None
                }
            };
            async move {
                if let Some((mut queue, objects)) = next {
                    debug!(
                        cache = what,
                        objects = objects.len(),
                        "a claim or volume changed; reconciling the objects using it"
                    );
                    for object in objects {
                        // Fails only when the term ended meanwhile; the next one reconciles all.
                        if queue.send(object).await.is_err() {
                            break;
                        }
                    }
                }
            }
        })
        .await;
}

/// The watch of every `CnsVolumeMetadata`: fills `writer`, and feeds `triggers` (which
/// forgets deleted objects in `backoff` too); runs until dropped.
///
/// Each time `relist` changes, the watch starts over with a new list; once the list of
/// generation `g` is complete (the store swapped), `listed` says `g`. A term starts from
/// such a list: a watch that was broken (a replica cut off from the API server, watches
/// failing) may still show objects another leader deleted meanwhile, and a reconcile of
/// such an object would push its entity to CNS again, for good.
async fn watch_objects(
    client: Client,
    writer: Writer<CnsVolumeMetadata>,
    triggers: Arc<Triggers>,
    backoff: Arc<PerObjectBackoff>,
    relist: watch::Receiver<u64>,
    listed: watch::Sender<u64>,
) {
    let api = Api::<CnsVolumeMetadata>::all(client);
    // The generation of the list the watch below is on. The stream is polled in one task
    // and each event handled before the next is polled, so an `InitDone` handled below
    // belongs to the generation stored here.
    let generation = Arc::new(AtomicU64::new(0));
    let current = generation.clone();
    let events = stream::unfold(relist, move |mut relist| {
        let api = api.clone();
        let current = current.clone();
        async move {
            current.store(*relist.borrow_and_update(), Ordering::SeqCst);
            let mut next = relist.clone();
            let restart = async move {
                if next.changed().await.is_err() {
                    // No more terms: keep this watch.
                    future::pending::<()>().await;
                }
            };
            let watch = watcher(api, watcher::Config::default())
                .default_backoff()
                .take_until(restart);
            Some((watch, relist))
        }
    })
    .flatten();
    events
        .modify(drop_managed_fields)
        .reflect(writer)
        .for_each(|event| {
            let next = match event {
                Ok(event) => {
                    if matches!(event, watcher::Event::InitDone) {
                        listed.send_replace(generation.load(Ordering::SeqCst));
                    }
                    triggers.observe(&event, &backoff)
                }
                Err(error) => {
                    warn!(cache = "cnsvolumemetadatas", error = %chain(&error), "watch failed; retrying");
                    None
                }
            };
            async move {
                if let Some((mut queue, objects)) = next {
                    for object in objects {
                        // Fails only when the term ended meanwhile; the next one reconciles all.
                        if queue.send(object).await.is_err() {
                            break;
                        }
                    }
                }
            }
        })
        .await;
}

/// The `CnsVolumeMetadata` reconciler (Go: `cnsvolumemetadata.Add`): build it with
/// [`MetadataController::new`] and the builder methods, then [`run`](Self::run) it; `run`
/// consumes the controller, so no option can be changed once it runs.
///
/// # Example
/// ```no_run
/// # async fn doc(backend: impl cnsmetadata::VolumeMetadataBackend) -> Result<(), Box<dyn std::error::Error>> {
/// use cnsmetadata::{Config, Leading, MetadataController};
/// use cnsmetadata::tokio::sync::watch;
///
/// let client = kube_client::Client::try_default().await?;
/// // Whoever elects owns the sender: `send(true)` on acquiring the lease, `send(false)`
/// // on losing it. (Under provision-controller's election, pass its `Health::leading()`
/// // instead.)
/// let (elected, follower) = watch::channel(false);
/// let controller = MetadataController::new(client, backend)
///     .config(Config::default().cluster_id("domain-c8"))
///     .leading(Leading::from(follower));
/// // SIGTERM (the kubelet's) or SIGINT (Ctrl-C) starts the graceful stop.
/// let signal = kube_controller_kit::signal::shutdown_signal()?;
/// let reconciler = tokio::spawn(controller.run(async move {
///     signal.await;
/// }));
/// elected.send(true)?;
/// reconciler.await??;
/// # Ok(())
/// # }
/// ```
#[doc(alias = "Add")]
pub struct MetadataController {
    client: Client,
    backend: Arc<dyn VolumeMetadataBackend>,
    config: Config,
    leading: Leading,
    /// Per-object state, given by tests that look into it.
    triggers: Arc<Triggers>,
    backoff: Arc<PerObjectBackoff>,
}

impl MetadataController {
    /// A reconciler pushing to `backend`, with the default [`Config`], that always leads.
    #[must_use]
    pub fn new(client: Client, backend: impl VolumeMetadataBackend) -> Self {
        Self {
            client,
            backend: Arc::new(backend),
            config: Config::default(),
            leading: Leading::always(),
            triggers: Arc::default(),
            backoff: Arc::default(),
        }
    }

    /// Replaces the configuration.
    #[doc(alias = "with_config")]
    #[must_use]
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Reconciles only while `leading` says this replica is the leader: follow the
    /// election of another controller (provision-controller's `Health::leading`), or a
    /// watch your own election sends to ([`Leading::from`]).
    /// Default [`Leading::always`]: a single replica.
    #[must_use]
    pub fn leading(mut self, leading: Leading) -> Self {
        self.leading = leading;
        self
    }

    /// Uses the given per-object state (tests look into it).
    #[cfg(test)]
    pub(crate) fn state(mut self, triggers: Arc<Triggers>, backoff: Arc<PerObjectBackoff>) -> Self {
        self.triggers = triggers;
        self.backoff = backoff;
        self
    }

    /// Runs the reconciler until `shutdown` completes.
    ///
    /// Does nothing and returns `Ok(())` at once unless the cluster flavor is
    /// [`ClusterFlavor::Workload`]. Otherwise it starts at once, leader or not, the caches
    /// of supervisor claims and volumes (managedFields dropped) and the watch of
    /// `CnsVolumeMetadata` objects of every namespace, so that a standby is warm. Once
    /// they are filled, each time the replica turns to leading ([`leading`](Self::leading))
    /// a term starts: the objects are listed again, every object is reconciled (the new
    /// leader catches up on whatever happened meanwhile), then each object again on its
    /// creation, a change of spec or finalizers, the start of its deletion, a change of a
    /// supervisor claim it names or of that claim's PV (the claim appears, binds or goes;
    /// the PV appears, changes driver, volume handle or `claimRef`, or goes: seen in the
    /// same caches, no extra watch), and its retries, with [`Config::worker_threads`]
    /// workers.
    ///
    /// # Guarantees
    /// - A term reconciles nothing before a new list of the objects is complete (one LIST
    ///   per term): a standby's watch may have been broken, and a reconcile of an object
    ///   another leader deleted meanwhile would push its entity to CNS again, for good.
    /// - When the replica stops leading, no new reconcile starts; the ones running
    ///   finish, the retry delays are forgotten, and the replica waits to lead again.
    /// - A source of leadership that is gone (the elector or health handle dropped) means
    ///   "not leading" for good: the replica stays a warm standby until `shutdown`
    ///   completes.
    /// - When `shutdown` completes, no new reconcile starts; the ones running finish, then
    ///   `run` returns `Ok(())` (after writing the events published so far, for at most
    ///   5 s). No task outlives the returned future.
    ///
    /// # Errors
    /// [`Error::CacheStopped`] if a cache cannot be filled. A configuration whose PV
    /// references would get an empty ID ([`Config::validate`]) is no error here, as
    /// upstream keeps running with it: each object with PERSISTENT_VOLUME references fails
    /// its reconcile (a Warning
    /// event naming the option) until the ID or the feature state is right.
    ///
    /// # Assumptions
    /// The `CnsVolumeMetadata` CRD is installed ([`crate::crd()`]); until it is, the watch
    /// is retried with backoff. The client may list and watch claims, volumes and
    /// `cnsvolumemetadatas`, update `cnsvolumemetadatas` and create events. Leadership is
    /// decided elsewhere (a Lease); a replica that lost it may still finish the reconciles
    /// it had started.
    #[doc(alias = "Run")]
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let Self {
            client,
            backend,
            config,
            leading,
            triggers,
            backoff,
        } = self;
        // No `config.validate()` here: as upstream, an empty cluster ID does not stop the
        // reconciler (the TKGsHA state that picks the ID may change while it runs); an object
        // whose PV references would get an empty ID fails alone (`ReconcileError::Config`).
        let flavor = config.cluster_flavor;
        if flavor != ClusterFlavor::Workload {
            info!(%flavor, "not a supervisor (WORKLOAD) cluster; CnsVolumeMetadata reconciler not started");
            return Ok(());
        }
        let shutdown = shutdown.boxed().shared();
        let workers = config.worker_threads.get();

        let (claims, claims_writer) = reflector::store();
        let (volumes, volumes_writer) = reflector::store();
        let (objects, objects_writer) = reflector::store();
        let related = Arc::new(Related::default());
        let related_volumes = related.clone();
        let (relist, relist_asked) = watch::channel(0);
        let (listed_sender, listed) = watch::channel(0);
        let relists = Relists { relist, listed };
        let watches = future::join3(
            fill_cache(
                Api::<PersistentVolumeClaim>::all(client.clone()),
                claims_writer,
                "claims",
                triggers.clone(),
                move |event| related.observe_claim(event),
            ),
            fill_cache(
                Api::<PersistentVolume>::all(client.clone()),
                volumes_writer,
                "volumes",
                triggers.clone(),
                move |event| related_volumes.observe_volume(event),
            ),
            watch_objects(
                client.clone(),
                objects_writer,
                triggers.clone(),
                backoff.clone(),
                relist_asked,
                listed_sender,
            ),
        );
        let ctx = Arc::new(
            Context::new(client, backend, config, claims.clone(), volumes.clone())
                .with_backoff(backoff),
        );
        let terms = async move {
            let ready = future::try_join3(
                claims.wait_until_ready(),
                volumes.wait_until_ready(),
                objects.wait_until_ready(),
            );
            tokio::select! {
                ready = ready => ready.map_err(|_| Error::CacheStopped("claims, volumes or objects"))?,
                () = shutdown.clone() => return Ok(()),
            };
            info!(workers, "caches filled");
            lead(
                ctx.clone(),
                objects,
                triggers,
                relists,
                workers,
                leading,
                shutdown,
            )
            .await;
            ctx.flush_events(EVENTS_FLUSH_LIMIT).await;
            info!("CnsVolumeMetadata reconciler stopped");
            Ok(())
        };
        futures::pin_mut!(terms, watches);
        match future::select(terms, watches).await {
            future::Either::Left((result, _)) => result,
            future::Either::Right(_) => Err(Error::CacheStopped("claims, volumes or objects")),
        }
    }
}

/// How long a stopping reconciler waits for its events to be written.
const EVENTS_FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits until `leading` says this replica does not lead (or will never lead again).
async fn until_not_leading(mut leading: Leading) {
    leading.wait_not_leading().await;
}

/// How a term gets a fresh list of the objects from [`watch_objects`].
struct Relists {
    /// The generation of the list asked for.
    relist: watch::Sender<u64>,
    /// The generation of the last complete list.
    listed: watch::Receiver<u64>,
}

impl Relists {
    /// Asks the watch of objects for a new list and waits until it is complete (the store
    /// holds it); `false` when the watch is gone.
    async fn fresh_list(&mut self) -> bool {
        let generation = self.relist.borrow().wrapping_add(1);
        self.relist.send_replace(generation);
        self.listed.wait_for(|g| *g == generation).await.is_ok()
    }
}

/// Runs one controller per leadership term until `shutdown` completes.
async fn lead(
    ctx: Arc<Context>,
    objects: Store<CnsVolumeMetadata>,
    triggers: Arc<Triggers>,
    mut relists: Relists,
    workers: u16,
    mut leading: Leading,
    shutdown: Shared<BoxFuture<'static, ()>>,
) {
    loop {
        let leads = tokio::select! {
            leads = leading.wait_leading() => leads,
            () = shutdown.clone() => return,
        };
        if !leads {
            info!("leadership will not come back; standing by until shutdown");
            shutdown.await;
            return;
        }
        // The watch may have been broken while standing by: its store may still show
        // objects another leader deleted meanwhile. The term starts from a new list.
        info!("leading: listing every CnsVolumeMetadata object again");
        tokio::select! {
            listed = relists.fresh_list() => if !listed {
                // The watch is gone; `serve` returns.
                return;
            },
            () = until_not_leading(leading.clone()) => continue,
            () = shutdown.clone() => return,
        }
        info!(
            workers,
            "leading: reconciling every CnsVolumeMetadata object"
        );
        let term = triggers.subscribe();
        // The end of the queue is a graceful stop: no new reconcile starts, the running
        // ones finish, then the applier's stream ends.
        let stop = future::select(shutdown.clone(), until_not_leading(leading.clone()).boxed());
        let queue = term_queue(term, objects.clone()).take_until(stop);
        applier(
            spawn_reconcile,
            error_policy,
            ctx.clone(),
            objects.clone(),
            queue,
            ControllerConfig::default().concurrency(workers),
        )
        .for_each(|result| {
            outcome(result, &ctx);
            future::ready(())
        })
        .await;
        triggers.unsubscribe();
        // The next term reconciles every object anyway; a standby keeps no retry state.
        ctx.backoff().clear();
        if shutdown.peek().is_some() {
            return;
        }
        info!("no longer leading; reconciles stopped");
    }
}

/// The input of one term's applier: every object once (the term catches up on what
/// happened before it), then each object the watch saw created or changed, and each
/// object whose claim or volume changed (`Triggers`). What `Controller::for_stream`,
/// `reconcile_on` and `reconcile_all_on` would merge, on kube-runtime's stable API.
fn term_queue(
    term: Term,
    objects: Store<CnsVolumeMetadata>,
) -> impl Stream<Item = Result<ReconcileRequest<CnsVolumeMetadata>, Infallible>> + Send + 'static {
    let all = stream::once(async move {
        stream::iter(objects.state().into_iter().map(|object| ReconcileRequest {
            obj_ref: ObjectRef::from_obj(&*object),
            reason: ReconcileReason::BulkReconcile,
        }))
    })
    .flatten();
    let changed = term.objects.map(|object| ReconcileRequest {
        obj_ref: ObjectRef::from_obj(&object),
        reason: ReconcileReason::ObjectUpdated,
    });
    let related = term.related.map(|obj_ref| ReconcileRequest {
        obj_ref,
        reason: ReconcileReason::Custom {
            reason: "a claim or volume it names changed".to_owned(),
        },
    });
    stream::select(all, stream::select(changed, related)).map(Ok)
}

/// Runs one reconcile in a task of its own (the workers run in parallel), aborted if the
/// applier is dropped (no task outlives `run`'s future); a panic in it is passed on.
fn spawn_reconcile(
    object: Arc<CnsVolumeMetadata>,
    ctx: Arc<Context>,
) -> impl Future<Output = Result<Action, ReconcileError>> + Unpin + Send {
    AbortOnDropHandle::new(tokio::spawn(reconcile(object, ctx).in_current_span())).map(|joined| {
        match joined {
            Ok(result) => result,
            Err(error) => match error.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Aborted only when the handle is dropped, or by a runtime shutting down.
                Err(error) => std::panic::resume_unwind(Box::new(error.to_string())),
            },
        }
    })
}

type ControllerResult =
    Result<(ObjectRef<CnsVolumeMetadata>, Action), controller::Error<ReconcileError, Infallible>>;

/// Logs one controller outcome; a retry that found its object gone forgets its delay
/// (the deletion was seen before the failure recorded it).
fn outcome(result: ControllerResult, ctx: &Context) {
    match result {
        Err(controller::Error::ObjectNotFound(object)) => {
            debug!(object = %object, "object gone before its reconcile");
            let mut key = ObjectRef::<CnsVolumeMetadata>::new(&object.name);
            if let Some(namespace) = &object.namespace {
                key = key.within(namespace);
            }
            ctx.backoff().reset(&key);
        }
        // Already logged by `error_policy`.
        Err(controller::Error::ReconcilerFailed(..)) | Ok(_) => {}
        Err(error) => warn!(error = %chain(&error), "controller error"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        resource::FINALIZER,
        testing::{InMemoryBackend, bound_claim, csi_volume, pvc_spec},
    };
    use k8s_openapi::{
        api::core::v1::Namespace,
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    };
    use kube_client::{
        ResourceExt,
        api::{DeleteParams, ObjectMeta, PostParams},
    };
    use kube_sim::wait::eventually;

    fn assert_send<T: Send>(t: T) -> T {
        t
    }

    /// Compile-only: the future `run` returns can be spawned.
    #[allow(dead_code)]
    fn run_future_is_send(client: Client, backend: Arc<dyn VolumeMetadataBackend>) {
        let (_leader, leading) = watch::channel(false);
        drop(assert_send(
            MetadataController::new(client, backend)
                .leading(leading.into())
                .run(future::pending()),
        ));
    }

    #[tokio::test]
    async fn a_retry_that_finds_its_object_gone_forgets_its_delay() {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let (claims, _) = reflector::store();
        let (volumes, _) = reflector::store();
        let ctx = Context::new(
            sim.client(),
            Arc::new(InMemoryBackend::new()),
            Config::default(),
            claims,
            volumes,
        );
        let key = ObjectRef::<CnsVolumeMetadata>::new("gc-1-a").within("tenant");
        let other = ObjectRef::<CnsVolumeMetadata>::new("gc-1-a").within("team-a");
        ctx.backoff().next_delay(&key);
        ctx.backoff().next_delay(&other);
        outcome(
            Err(controller::Error::ObjectNotFound(Box::new(
                key.clone().erase(),
            ))),
            &ctx,
        );
        assert_eq!(ctx.backoff().len(), 1);
        assert_eq!(
            ctx.backoff().peek(&other),
            Duration::from_secs(2),
            "only that object's delay is forgotten"
        );
    }

    /// A kube-sim with the CRD and the namespace `tenant`.
    async fn sim_with_crd() -> kube_sim::KubeSim {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(sim.client());
        crds.create(&PostParams::default(), &crate::crd())
            .await
            .unwrap();
        let namespaces: Api<Namespace> = Api::all(sim.client());
        let tenant = Namespace {
            metadata: ObjectMeta {
                name: Some("tenant".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &tenant)
            .await
            .unwrap();
        sim
    }

    #[tokio::test]
    async fn claims_that_bind_and_volumes_that_appear_reconcile_their_objects_at_once() {
        let sim = sim_with_crd().await;
        let client = sim.client();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "tenant");
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        pvcs.create(
            &PostParams::default(),
            &bound_claim("tenant", "gc-1-vol-a", ""),
        )
        .await
        .unwrap();

        // Retries wait an hour: only a trigger can reconcile the object within the test.
        let hour = Duration::from_secs(3600);
        let backoff = Arc::new(PerObjectBackoff::new(hour, hour));
        let backend = InMemoryBackend::new();
        let triggers = Arc::new(Triggers::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (leader, leading) = watch::channel(true);
        let running = tokio::spawn(
            MetadataController::new(client.clone(), Arc::new(backend.clone()))
                .config(Config::default().cluster_id("cluster-7"))
                .leading(leading.into())
                .state(triggers.clone(), backoff.clone())
                .run(async move {
                    let _ = stopped.await;
                }),
        );
        let objects: Api<CnsVolumeMetadata> = Api::namespaced(client.clone(), "tenant");
        let mut object = CnsVolumeMetadata::new("gc-1-data", pvc_spec());
        object.metadata.namespace = Some("tenant".into());
        objects
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        let status = || async {
            let object = objects.get("gc-1-data").await.unwrap();
            object.status.volume_status.first().cloned()
        };
        let failed_with = |what: &'static str| {
            let status = &status;
            async move {
                let poll = async {
                    loop {
                        if let Some(s) = status().await
                            && !s.updated
                            && s.error_message.contains(what)
                        {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                };
                tokio::time::timeout(Duration::from_secs(20), poll)
                    .await
                    .unwrap_or_else(|_| panic!("timed out waiting for a failure: {what}"));
            }
        };
        failed_with("is not bound").await;
        eventually("the failure to wait an hour", || async {
            backoff.len() == 1
        })
        .await;

        // The claim binds to a PV that does not exist yet: reconciled at once, still failing.
        let mut claim = pvcs.get("gc-1-vol-a").await.unwrap();
        claim.spec.as_mut().unwrap().volume_name = Some("pv-a".into());
        pvcs.replace("gc-1-vol-a", &PostParams::default(), &claim)
            .await
            .unwrap();
        failed_with("persistentvolumes \"pv-a\" not found").await;
        assert!(backend.calls().is_empty());

        // The PV appears: reconciled at once, pushed.
        pvs.create(
            &PostParams::default(),
            &csi_volume("pv-a", crate::VSPHERE_CSI_DRIVER, "fcd-a"),
        )
        .await
        .unwrap();
        eventually("the entity pushed once the PV appears", || async {
            backend.successful_updates().len() == 1
        })
        .await;
        eventually("the retry delay forgotten", || async { backoff.is_empty() }).await;
        let pushed = backend.successful_updates();
        assert_eq!(pushed[0].volume_id, "fcd-a");

        // A status-only change of the claim or PV triggers nothing.
        let mut claim = pvcs.get("gc-1-vol-a").await.unwrap();
        claim.metadata.labels = Some([("seen".to_owned(), "yes".to_owned())].into());
        pvcs.replace("gc-1-vol-a", &PostParams::default(), &claim)
            .await
            .unwrap();

        // The PV gets another handle: the entity moves to it.
        let mut pv = pvs.get("pv-a").await.unwrap();
        pv.spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .volume_handle = "fcd-b".into();
        pvs.replace("pv-a", &PostParams::default(), &pv)
            .await
            .unwrap();
        eventually("the entity pushed to the new handle", || async {
            backend
                .successful_updates()
                .iter()
                .any(|u| u.volume_id == "fcd-b" && !u.entity_metadata.delete)
        })
        .await;
        let calls = backend.calls().len();
        let on_a: Vec<bool> = backend
            .successful_updates()
            .iter()
            .filter(|u| u.volume_id == "fcd-a")
            .map(|u| u.entity_metadata.delete)
            .collect();
        assert_eq!(
            on_a,
            [false, true],
            "one push to fcd-a (no reconcile for the label), then its removal"
        );

        // Not leading: claim and PV changes reconcile nothing.
        leader.send(false).unwrap();
        eventually("the term to end", || async { !triggers.in_term() }).await;
        let mut pv = pvs.get("pv-a").await.unwrap();
        pv.spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .volume_handle = "fcd-c".into();
        pvs.replace("pv-a", &PostParams::default(), &pv)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(backend.calls().len(), calls, "a standby reconciles nothing");

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("stops")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_new_term_never_acts_on_objects_its_broken_watch_still_shows() {
        let sim = sim_with_crd().await;
        let client = sim.client();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "tenant");
        for (claim, pv, handle) in [("gc-1-a", "pv-a", "fcd-a"), ("gc-1-b", "pv-b", "fcd-b")] {
            pvs.create(
                &PostParams::default(),
                &csi_volume(pv, crate::VSPHERE_CSI_DRIVER, handle),
            )
            .await
            .unwrap();
            pvcs.create(&PostParams::default(), &bound_claim("tenant", claim, pv))
                .await
                .unwrap();
        }
        let backend = InMemoryBackend::new();
        let triggers = Arc::new(Triggers::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (leader, leading) = watch::channel(true);
        let running = tokio::spawn(
            MetadataController::new(client.clone(), Arc::new(backend.clone()))
                .config(Config::default().cluster_id("cluster-7"))
                .leading(leading.into())
                .state(triggers.clone(), Arc::default())
                .run(async move {
                    let _ = stopped.await;
                }),
        );
        let objects: Api<CnsVolumeMetadata> = Api::namespaced(client.clone(), "tenant");
        let object = |name: &str, claim: &str| {
            let mut spec = pvc_spec();
            spec.volume_names = vec![claim.to_owned()];
            spec.entity_name = name.to_owned();
            let mut object = CnsVolumeMetadata::new(name, spec);
            object.metadata.namespace = Some("tenant".into());
            object
        };
        objects
            .create(&PostParams::default(), &object("gc-1-gone", "gc-1-a"))
            .await
            .unwrap();
        eventually("gc-1-gone pushed", || async {
            backend.entities().len() == 1
        })
        .await;

        // This replica stands by, and its watch of objects breaks.
        leader.send(false).unwrap();
        eventually("the term to end", || async { !triggers.in_term() }).await;
        sim.add_fault(
            kube_sim::FaultRule::new(kube_sim::Verb::Watch, "cnsvolumemetadatas")
                .status(500, "InternalError")
                .always(),
        );
        sim.cut_watches();
        // Meanwhile another leader deletes gc-1-gone (its entity removed, then the object),
        // and finalizes gc-1-new, created meanwhile (the next reconcile pushes it).
        let pushed = backend.entities()[0].clone();
        let mut removal = pushed.clone();
        removal.entity_metadata.delete = true;
        crate::VolumeMetadataBackend::update_volume_metadata(&backend, &removal)
            .await
            .unwrap();
        let mut gone = objects.get("gc-1-gone").await.unwrap();
        gone.metadata.finalizers = None;
        objects
            .replace("gc-1-gone", &PostParams::default(), &gone)
            .await
            .unwrap();
        objects
            .delete("gc-1-gone", &DeleteParams::default())
            .await
            .unwrap();
        let mut new = object("gc-1-new", "gc-1-b");
        new.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        objects.create(&PostParams::default(), &new).await.unwrap();

        // Leading again: the term works from a fresh list of the objects.
        leader.send(true).unwrap();
        let names = || -> Vec<String> {
            backend
                .entities()
                .iter()
                .map(|e| e.entity_metadata.entity_name.clone())
                .collect()
        };
        eventually("gc-1-new pushed, or gc-1-gone pushed again", || async {
            !backend.entities().is_empty()
        })
        .await;
        assert_eq!(
            names(),
            ["gc-1-new"],
            "nothing pushed for the deleted object"
        );
        let adds = backend
            .calls()
            .iter()
            .filter(|c| c.update.entity_metadata.entity_name == "gc-1-gone")
            .filter(|c| !c.update.entity_metadata.delete)
            .count();
        assert_eq!(adds, 1, "gc-1-gone was pushed once, before its deletion");

        sim.clear_faults();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("stops")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn per_object_state_of_deleted_objects_is_pruned() {
        let sim = sim_with_crd().await;
        let client = sim.client();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        pvs.create(
            &PostParams::default(),
            &csi_volume("pv-a", crate::VSPHERE_CSI_DRIVER, "fcd-a"),
        )
        .await
        .unwrap();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "tenant");
        pvcs.create(
            &PostParams::default(),
            &bound_claim("tenant", "gc-1-vol-a", "pv-a"),
        )
        .await
        .unwrap();

        let triggers = Arc::new(Triggers::default());
        let backoff = Arc::new(PerObjectBackoff::default());
        let backend = InMemoryBackend::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (_leader, leading) = watch::channel(true);
        let config = Config::default().cluster_id("cluster-7");
        let running = tokio::spawn(
            MetadataController::new(client.clone(), Arc::new(backend.clone()))
                .config(config)
                .leading(leading.into())
                .state(triggers.clone(), backoff.clone())
                .run(async move {
                    let _ = stopped.await;
                }),
        );

        // Valid objects are pushed; invalid ones and ones whose claim is missing fail and
        // get a retry delay.
        let objects: Api<CnsVolumeMetadata> = Api::namespaced(client.clone(), "tenant");
        let mut names = Vec::new();
        for i in 0..12 {
            let mut spec = pvc_spec();
            match i % 3 {
                0 => {}
                1 => spec.namespace.clear(),
                _ => spec.volume_names = vec![format!("gc-1-missing-{i}")],
            }
            let name = format!("gc-1-object-{i}");
            let mut object = CnsVolumeMetadata::new(&name, spec);
            object.metadata.namespace = Some("tenant".into());
            objects
                .create(&PostParams::default(), &object)
                .await
                .unwrap();
            names.push(name);
        }
        eventually(
            "every object seen, failures delayed, valid ones pushed",
            || async {
                triggers.tracked() == 12
                    && backoff.len() == 8
                    && backend.successful_updates().len() >= 4
            },
        )
        .await;

        for name in &names {
            objects
                .delete(name, &DeleteParams::default())
                .await
                .unwrap();
        }
        eventually("the per-object maps to empty", || async {
            triggers.tracked() == 0 && backoff.is_empty()
        })
        .await;
        let left = objects.list(&Default::default()).await.unwrap().items;
        assert!(
            left.iter()
                .all(|o| !o.finalizers().contains(&FINALIZER.to_owned())),
            "{left:?}"
        );
        assert!(left.is_empty(), "nothing stays Terminating: {left:?}");
        let removals = backend
            .successful_updates()
            .into_iter()
            .filter(|u| u.entity_metadata.delete)
            .count();
        assert_eq!(removals, 4, "every pushed entity is removed");

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("stops")
            .unwrap()
            .unwrap();
    }
}
