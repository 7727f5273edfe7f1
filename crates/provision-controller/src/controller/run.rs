//! `ProvisionController::run`: caches and probes on every replica, leader election,
//! workers while leading, and the drain on shutdown or lease loss.
//!
//! Timeline (each step logged at info, so an operator can follow a failover):
//! 1. the metrics/probe server starts (`/healthz` ok, `/readyz` 503 "starting");
//! 2. the caches start and sync (`/readyz` still 503 until they have);
//! 3. with leader election: the replica stands by (`/readyz` 200, `controller_leader` 0)
//!    until it holds the lease;
//! 4. leading: every cached claim and volume is queued and the workers start
//!    (`controller_leader` 1);
//! 5. on shutdown: the queues stop, the operations in flight get `shutdown_grace`, the
//!    lease is released; on lease loss: the workers are stopped at once and `run` fails.

use std::{future::Future, num::NonZeroUsize, sync::Arc, sync::atomic::Ordering};

use futures::StreamExt;
use kube_client::{Api, ResourceExt};
use kube_controller_kit::client::InFlightLimit;
use prometheus_client::registry::Registry;
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Context, Parts, ProvisionController, save, worker};
use kube_controller_kit::{
    http::{Health, HttpServer, HttpServerHandle, MetricsSource, Role},
    leader::{LeaderElection, LeaderElector, LeaderError, LeadershipLost},
};

use crate::{
    cache::{Caches, VolumeCache},
    config::Config,
    error::{Error, Result},
    events::Events,
    metrics::ControllerMetrics,
};

/// Requests in flight the journal may have beside [`Config::max_requests_in_flight`](crate::Config::max_requests_in_flight): it
/// writes one object per group, and rarely more than two objects at once.
const JOURNAL_IN_FLIGHT: NonZeroUsize = NonZeroUsize::new(2).expect("2 is not zero");

/// Event writes in flight beside [`Config::max_requests_in_flight`](crate::Config::max_requests_in_flight),
/// as a divisor of it (16: 2 event writes). Events are written in the background, and a
/// claim never waits for one: in slots of their own they cannot delay a PV create, and
/// few of them keep their load on the server small (Go writes them one at a time).
const EVENTS_SHARE: usize = 8;

/// How long a stopping controller waits for its queued events to be written.
const EVENT_FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Tasks that live as long as `run`: the shutdown watcher, the cache feeders, the
/// resync, and the metrics server. [`Background::finish`] stops them all.
struct Background {
    tasks: JoinSet<()>,
    server: Option<(HttpServerHandle, CancellationToken)>,
    health: Health,
}

impl Background {
    async fn finish(mut self, ctx: &Context, result: Result<()>) -> Result<()> {
        let name = &ctx.name;
        self.health.set_role(Role::Stopping);
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        // The workers are done: write out the events they queued.
        ctx.events.flush(EVENT_FLUSH_LIMIT).await;
        if let Some((server, stop)) = self.server.take() {
            stop.cancel();
            if let Err(error) = server.join().await {
                tracing::warn!(error = %crate::controller::calls::chain(&error), "metrics server ended with an error");
            }
        }
        match &result {
            Ok(()) => tracing::info!(provisioner = %name, "provision controller stopped"),
            Err(error) => {
                tracing::warn!(provisioner = %name, error = %crate::controller::calls::chain(error), "provision controller stopped")
            }
        }
        result
    }
}

/// The controller's life, one phase after the other: [`start`] (the probes, the caches,
/// the context), [`stand_by`] (until the caches sync and the lease is held), [`lead`] (the
/// workers), then, once shutdown is asked or the lease is lost ([`until_stopped`]),
/// [`step_down`] (the drain); [`Background::finish`] ends whatever is left.
pub(super) async fn run(
    ctrl: ProvisionController,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    ctrl.config.validate()?;
    let Started {
        ctx,
        mut bg,
        mut elector,
        stop,
    } = start(ctrl, shutdown).await?;
    let result = match stand_by(&ctx, &bg.health, elector.as_mut(), &stop).await {
        Ok(Turn::Lead) => {
            let leading = lead(&ctx, &bg.health, &mut bg.tasks).await;
            let lost = until_stopped(elector.as_ref(), &stop).await;
            step_down(&ctx, &bg.health, leading, elector, lost).await
        }
        Ok(Turn::Stop) => Ok(()),
        Err(err) => Err(err),
    };
    bg.finish(&ctx, result).await
}

/// What [`start`] made: the workers' context, the tasks that live as long as `run`, the
/// leader elector (with leader election) and the token that shutdown cancels.
struct Started {
    ctx: Arc<Context>,
    bg: Background,
    elector: Option<LeaderElector>,
    stop: CancellationToken,
}

/// Start: the metrics/probe server (`/readyz` 503 "starting"), the clients with their
/// in-flight limits, the caches and their feeders, and the workers' context, which
/// accepts no work yet.
///
/// # Errors
/// The leader election cannot be set up, or the metrics server cannot bind.
async fn start(
    ctrl: ProvisionController,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Started> {
    let ProvisionController {
        client,
        name,
        driver,
        config,
        metrics,
        claims,
        volumes,
        classes,
        leader_client,
        metrics_source,
        health,
    } = ctrl;
    let (metrics, source) = metrics_of(metrics, metrics_source);
    let mut elector = match &config.leader_election {
        Some(election) => {
            let election = election.clone().resolved_for(&name).to_kit();
            let client = leader_client.unwrap_or_else(|| client.clone());
            Some(LeaderElector::new(client, election).map_err(Error::leader_election)?)
        }
        None => None,
    };
    let identity = elector
        .as_ref()
        .map_or_else(LeaderElection::default_identity, |e| {
            e.identity().to_owned()
        });

    let health = health.unwrap_or_default();
    health.set_caches_synced(false);
    health.set_role(Role::Starting);
    if let Some(elector) = elector.as_mut() {
        // `/readyz` then says why the election cannot go on (a namespace that is missing).
        elector.report_to(health.clone());
    }
    let server = HttpServer::bind_configured(
        config.metrics_address,
        config.metrics_port,
        &config.metrics_path,
        source,
        health.clone(),
    )
    .await
    .map_err(Error::http)?
    .map(|server| {
        let stop = CancellationToken::new();
        (server.spawn(stop.clone().cancelled_owned()), stop)
    });

    let stop = CancellationToken::new();
    let mut bg = Background {
        tasks: JoinSet::new(),
        server,
        health,
    };
    let on_shutdown = stop.clone();
    bg.tasks.spawn(async move {
        shutdown.await;
        on_shutdown.cancel();
    });

    let clients = Clients::limited(&config, &metrics, client);
    let client = clients.syncs;
    let claims = claims.unwrap_or_else(|| crate::cache::watch(Api::all(client.clone())));
    let volumes = volumes.map_or_else(|| VolumeCache::watch(&client), VolumeCache::from);
    let classes = classes.unwrap_or_else(|| crate::cache::watch(Api::all(client.clone())));

    let ctx = Arc::new(Context::new(Parts {
        events: Events::new(clients.events, &name, identity.clone()),
        journal_client: clients.journal,
        client,
        name,
        driver,
        config,
        caches: Caches::new(claims.store.clone(), volumes.store, classes.store.clone()),
        metrics: Some(metrics),
    }));
    tracing::info!(
        provisioner = %ctx.name,
        %identity,
        leader_election = elector.is_some(),
        lease = elector.as_ref().map(|e| format!("{}/{}", e.config().namespace, e.config().lease_name)).unwrap_or_default(),
        metrics_address = bg.server.as_ref().map(|(s, _)| s.local_addr().to_string()).unwrap_or_default(),
        "starting provision controller"
    );

    spawn_feeders(
        &mut bg.tasks,
        &ctx,
        claims.changes,
        volumes.changes,
        classes.changes,
    );
    Ok(Started {
        ctx,
        bg,
        elector,
        stop,
    })
}

/// The metrics: the caller's, or our own registry, which the endpoint then serves; and
/// what the endpoint serves.
fn metrics_of(
    metrics: Option<ControllerMetrics>,
    metrics_source: Option<MetricsSource>,
) -> (ControllerMetrics, MetricsSource) {
    let (metrics, own_source) = match metrics {
        Some(m) => (m, None),
        None => {
            let mut registry = Registry::default();
            let m = ControllerMetrics::new(&mut registry);
            (m, Some(MetricsSource::from(Arc::new(registry))))
        }
    };
    let source = metrics_source
        .or(own_source)
        .unwrap_or_else(|| MetricsSource::from(Registry::default()));
    metrics.set_leader(false);
    (metrics, source)
}

/// The clients of the claim and volume syncs, of the events and of the journal.
struct Clients {
    syncs: kube_client::Client,
    events: kube_client::Client,
    journal: kube_client::Client,
}

impl Clients {
    /// One bound on the requests in flight of the claim and volume syncs (watches are not
    /// counted). The journal's group writes and the events have slots of their own: a
    /// journal write lets a whole group of claims go on, so it must not queue behind their
    /// PV writes, and an event write, which no claim waits for, must never make a PV
    /// create wait (measured: with the events in the shared slots, a PV create waited
    /// 170 ms for a slot at 16 threads).
    fn limited(config: &Config, metrics: &ControllerMetrics, client: kube_client::Client) -> Self {
        match config.max_requests_in_flight {
            Some(max) => {
                let journal = InFlightLimit::new(JOURNAL_IN_FLIGHT).wrap(client.clone());
                let events =
                    NonZeroUsize::new(max.get() / EVENTS_SHARE).unwrap_or(NonZeroUsize::MIN);
                let events = InFlightLimit::new(events).wrap(client.clone());
                let limit = if config.adapt_requests_in_flight {
                    InFlightLimit::adaptive(max)
                } else {
                    InFlightLimit::new(max)
                };
                metrics.watch_requests(limit.clone());
                Self {
                    syncs: limit.wrap(client),
                    events,
                    journal,
                }
            }
            None => Self {
                syncs: client.clone(),
                events: client.clone(),
                journal: client,
            },
        }
    }
}

/// How [`stand_by`] ended.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    /// The caches synced and the lease is held (or there is no election): lead.
    Lead,
    /// Shutdown was asked first.
    Stop,
}

/// Stand by: every replica syncs its caches, so a standby is ready to work the moment it
/// leads (`/readyz` 200 from then on); with leader election it then waits for the lease.
///
/// # Errors
/// The leader election failed.
async fn stand_by(
    ctx: &Context,
    health: &Health,
    elector: Option<&mut LeaderElector>,
    stop: &CancellationToken,
) -> Result<Turn> {
    let synced = async {
        let (a, b, c) = futures::join!(
            ctx.caches.claims.wait_until_ready(),
            ctx.caches.volumes.wait_until_ready(),
            ctx.caches.classes.wait_until_ready()
        );
        a.and(b).and(c)
    };
    tokio::select! {
        ready = synced => {
            if ready.is_err() {
                tracing::warn!("a cache writer was dropped before the caches synced");
            }
        }
        () = stop.cancelled() => return Ok(Turn::Stop),
    }
    health.set_caches_synced(true);
    tracing::info!(
        claims = ctx.caches.claims.state().len(),
        volumes = ctx.caches.volumes.len(),
        classes = ctx.caches.classes.state().len(),
        "caches synced"
    );
    let Some(elector) = elector else {
        return Ok(Turn::Lead);
    };
    health.set_role(Role::Standby);
    tracing::info!(identity = elector.identity(), "standing by for the lease");
    match elector.acquire(stop.cancelled()).await {
        Ok(()) => Ok(Turn::Lead),
        Err(LeaderError::Cancelled { .. }) => {
            tracing::info!("shutdown requested while standing by");
            Ok(Turn::Stop)
        }
        Err(err) => Err(Error::leader_election(err)),
    }
}

/// The tasks that run only while leading.
struct Leading {
    /// The claim and volume workers.
    workers: JoinSet<()>,
    /// The background PV savers (with [`PvSaveStrategy::background`](crate::PvSaveStrategy)).
    savers: JoinSet<()>,
}

/// Lead (or run without election): read the journal (what the last leader started),
/// queue everything and start the workers; the journal's committer and the resync join
/// `tasks`.
async fn lead(ctx: &Arc<Context>, health: &Health, tasks: &mut JoinSet<()>) -> Leading {
    health.set_role(Role::Leading);
    set_leader(ctx, true);
    if let Some(journal) = &ctx.journal {
        match journal.reload().await {
            Ok(entries) => tracing::info!(entries, "provisioning journal read"),
            Err(error) => {
                tracing::warn!(error = %crate::controller::calls::chain(&error), "failed to read the provisioning journal; read again at the next resync")
            }
        }
        tasks.spawn(Arc::clone(journal).run_committer());
    }
    ctx.accepting.store(true, Ordering::Release);
    let (queued_claims, queued_volumes) = ctx.queue_everything();
    let mut workers = JoinSet::new();
    let threads = ctx.config.threads.get();
    let sync_workers = ctx.config.sync_workers.get().max(threads);
    for i in 0..sync_workers {
        let c = Arc::clone(ctx);
        workers.spawn(worker::claim_worker(c).instrument(tracing::info_span!("claim_worker", i)));
        let c = Arc::clone(ctx);
        workers.spawn(worker::volume_worker(c).instrument(tracing::info_span!("volume_worker", i)));
    }
    let mut savers = JoinSet::new();
    if matches!(ctx.saver, save::Saver::Background(_)) {
        for _ in 0..Config::DEFAULT_THREADS.get() {
            savers.spawn(save::run_background_worker(Arc::clone(ctx)));
        }
    }
    tasks.spawn(worker::resync(Arc::clone(ctx)));
    tracing::info!(
        provisioner = %ctx.name,
        driver_slots = threads,
        claim_workers = sync_workers,
        volume_workers = sync_workers,
        queued_claims,
        queued_volumes,
        "leading: workers started"
    );
    Leading { workers, savers }
}

/// Waits for shutdown, or for the loss of the lease (`Some`).
async fn until_stopped(
    elector: Option<&LeaderElector>,
    stop: &CancellationToken,
) -> Option<LeadershipLost> {
    match elector {
        Some(elector) => tokio::select! {
            () = stop.cancelled() => None,
            lost = elector.lost() => Some(lost),
        },
        None => {
            stop.cancelled().await;
            None
        }
    }
}

/// What the queues held when leading stopped.
struct Unfinished {
    in_flight: usize,
    waiting_claims: usize,
    waiting_volumes: usize,
}

/// Drain: the queues stop; on lease loss (`lost`) the workers are stopped at once and the
/// result is an error, on shutdown the operations in flight get
/// [`Config::shutdown_grace`](crate::Config::shutdown_grace) and the lease is released.
///
/// # Errors
/// A worker ended abnormally, or the lease was lost (before or while draining).
async fn step_down(
    ctx: &Context,
    health: &Health,
    leading: Leading,
    elector: Option<LeaderElector>,
    lost: Option<LeadershipLost>,
) -> Result<()> {
    health.set_role(Role::Stopping);
    ctx.accepting.store(false, Ordering::Release);
    let unfinished = Unfinished {
        in_flight: ctx.claim_queue.in_flight() + ctx.volume_queue.in_flight(),
        waiting_claims: ctx.claim_queue.len(),
        waiting_volumes: ctx.volume_queue.len(),
    };
    ctx.claim_queue.shut_down();
    ctx.volume_queue.shut_down();
    match lost {
        Some(lost) => stop_at_once(ctx, leading, &unfinished, lost).await,
        None => drain_gracefully(ctx, leading, elector, &unfinished).await,
    }
}

/// The lease was lost: another replica may lead already, so the workers stop at once, as
/// Go's process exit would.
async fn stop_at_once(
    ctx: &Context,
    mut leading: Leading,
    unfinished: &Unfinished,
    lost: LeadershipLost,
) -> Result<()> {
    leading.workers.abort_all();
    leading.savers.abort_all();
    let result = join_all(&mut leading.workers, "worker")
        .await
        .and(join_all(&mut leading.savers, "pv saver").await);
    set_leader(ctx, false);
    tracing::warn!(
        abandoned = unfinished.in_flight,
        waiting_claims = unfinished.waiting_claims,
        waiting_volumes = unfinished.waiting_volumes,
        reason = %lost.reason,
        "lost the lease: workers stopped"
    );
    result.and(Err(Error::leadership_lost(lost)))
}

/// Shutdown: the operations in flight get the grace period (cut short when the lease is
/// lost meanwhile), the background saver the same, then the lease is released.
async fn drain_gracefully(
    ctx: &Context,
    mut leading: Leading,
    elector: Option<LeaderElector>,
    unfinished: &Unfinished,
) -> Result<()> {
    let in_flight = unfinished.in_flight;
    tracing::info!(
        in_flight,
        waiting_claims = unfinished.waiting_claims,
        waiting_volumes = unfinished.waiting_volumes,
        grace = ?ctx.config.shutdown_grace,
        "shutdown requested: queues stopped, waiting for the operations in flight"
    );
    let deadline = Instant::now() + ctx.config.shutdown_grace;
    let idle = async {
        futures::join!(ctx.claim_queue.wait_idle(), ctx.volume_queue.wait_idle());
    };
    // The drain ends early when the lease is lost meanwhile: another replica may lead.
    let lost_meanwhile = async {
        match elector.as_ref() {
            Some(elector) => elector.lost().await,
            None => std::future::pending().await,
        }
    };
    let mut abandoned = 0;
    let mut lost_while_draining = None;
    let drained = tokio::select! {
        drained = tokio::time::timeout_at(deadline, idle) => drained.is_ok(),
        lost = lost_meanwhile => {
            tracing::warn!(reason = %lost.reason, "lost the lease while draining; stopping at once");
            lost_while_draining = Some(lost);
            false
        }
    };
    if !drained {
        abandoned = ctx.claim_queue.in_flight() + ctx.volume_queue.in_flight();
        leading.workers.abort_all();
    }
    let mut result = join_all(&mut leading.workers, "worker").await;
    if let save::Saver::Background(saver) = &ctx.saver {
        saver.queue.shut_down();
        if tokio::time::timeout_at(deadline, saver.queue.wait_idle())
            .await
            .is_err()
        {
            leading.savers.abort_all();
        }
        let unsaved = saver.unsaved();
        if unsaved > 0 {
            tracing::warn!(
                unsaved,
                "stopping with provisioned volumes whose PV is not saved; the journal keeps their claims when crash safety is on"
            );
        }
    }
    result = result.and(join_all(&mut leading.savers, "pv saver").await);
    tracing::info!(
        finished = in_flight.saturating_sub(abandoned),
        abandoned,
        "workers stopped"
    );
    // A lease lost while draining belongs to someone else now: nothing to release, and the
    // operations that were cut short make this an error, as any other loss.
    if let Some(lost) = lost_while_draining {
        result = result.and(Err(Error::leadership_lost(lost)));
    } else if let Some(mut elector) = elector
        && let Err(error) = elector.release().await
    {
        tracing::warn!(error = %crate::controller::calls::chain(&error), "failed to release the lease; it expires after its duration");
    }
    set_leader(ctx, false);
    result
}

fn set_leader(ctx: &Context, leading: bool) {
    if let Some(m) = &ctx.metrics {
        m.set_leader(leading);
    }
}

/// Feeds the queues from the caches' change streams. Standbys keep their caches warm but
/// queue nothing (`Context::accepting`).
fn spawn_feeders(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    claims: futures::stream::BoxStream<
        'static,
        Arc<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    >,
    volumes: futures::stream::BoxStream<'static, crate::cache::VolumeChange>,
    classes: futures::stream::BoxStream<'static, Arc<k8s_openapi::api::storage::v1::StorageClass>>,
) {
    let feed = Arc::clone(ctx);
    tasks.spawn(claims.for_each(move |claim| {
        match feed.caches.index_claim(&claim) {
            Some(uid) => {
                if feed.accepting() {
                    feed.claim_queue.add(uid);
                }
            }
            None => tracing::warn!(pvc = %crate::annotations::claim_key(&claim), "claim without a uid; skipped"),
        }
        async {}
    }));
    let feed = Arc::clone(ctx);
    tasks.spawn(volumes.for_each(move |change| {
        let name = change.name();
        feed.caches.volume_seen(&name);
        if feed.accepting() {
            feed.volume_queue.add(name);
        }
        async {}
    }));
    // Go has no class handler: a claim whose class was missing waited for its backoff.
    let feed = Arc::clone(ctx);
    tasks.spawn(classes.for_each(move |class| {
        feed.requeue_claims_of(&class.name_any());
        async {}
    }));
}

/// Waits for every task, returning the first abnormal end (an abort is not one).
async fn join_all(set: &mut JoinSet<()>, task: &'static str) -> Result<()> {
    let mut result = Ok(());
    while let Some(joined) = set.join_next().await {
        if let Err(source) = joined
            && !source.is_cancelled()
            && result.is_ok()
        {
            result = Err(Error::task(task, source));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::FakeProvisioner;

    const ME: &str = "example.com/fake";

    /// A controller without leader election whose client talks to `client`.
    fn controller(client: kube_client::Client) -> ProvisionController {
        ProvisionController::new(client, ME, FakeProvisioner::new()).config(
            Config::default()
                .leader_election(None)
                .crash_safe_provisioning(false)
                .shutdown_grace(Duration::from_secs(5)),
        )
    }

    /// A client of an address where nothing answers: the caches never sync.
    fn unreachable_client() -> kube_client::Client {
        kube_client::Client::try_from(kube_client::Config::new(
            "http://127.0.0.1:9".parse().unwrap(),
        ))
        .unwrap()
    }

    /// Start and stand by on a fresh kube-sim, until leading may begin.
    async fn standing_by() -> (kube_sim::KubeSim, Started) {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let started = start(controller(sim.client()), std::future::pending())
            .await
            .unwrap();
        let turn = stand_by(&started.ctx, &started.bg.health, None, &started.stop).await;
        assert_eq!(turn.unwrap(), Turn::Lead);
        (sim, started)
    }

    #[tokio::test]
    async fn start_answers_probes_as_starting_and_accepts_no_work() {
        let started = start(controller(unreachable_client()), std::future::pending())
            .await
            .unwrap();
        assert_eq!(started.bg.health.role(), Role::Starting);
        assert!(!started.bg.health.caches_synced());
        assert!(started.elector.is_none(), "no election configured");
        assert!(!started.ctx.accepting(), "no work before leading");
        assert!(started.bg.server.is_none(), "metrics port 0: no server");
        assert!(!started.stop.is_cancelled());
        started.bg.finish(&started.ctx, Ok(())).await.unwrap();
    }

    #[tokio::test]
    async fn stand_by_stops_when_shutdown_comes_before_the_caches_sync() {
        let started = start(controller(unreachable_client()), async {})
            .await
            .unwrap();
        let turn = tokio::time::timeout(
            Duration::from_secs(5),
            stand_by(&started.ctx, &started.bg.health, None, &started.stop),
        )
        .await
        .expect("stand_by returns on shutdown");
        assert_eq!(turn.unwrap(), Turn::Stop);
        assert!(!started.bg.health.caches_synced());
        assert_eq!(started.bg.health.role(), Role::Starting);
        started.bg.finish(&started.ctx, Ok(())).await.unwrap();
    }

    #[tokio::test]
    async fn stand_by_leads_once_the_caches_synced() {
        let (_sim, started) = standing_by().await;
        assert!(started.bg.health.caches_synced());
        assert!(!started.ctx.accepting(), "standing by accepts no work");
        started.bg.finish(&started.ctx, Ok(())).await.unwrap();
    }

    #[tokio::test]
    async fn lead_accepts_work_and_starts_a_claim_and_a_volume_worker_per_sync_worker() {
        let (_sim, mut started) = standing_by().await;
        let leading = lead(&started.ctx, &started.bg.health, &mut started.bg.tasks).await;
        assert_eq!(started.bg.health.role(), Role::Leading);
        assert!(started.ctx.accepting());
        let sync_workers = started
            .ctx
            .config
            .sync_workers
            .get()
            .max(started.ctx.config.threads.get());
        assert_eq!(leading.workers.len(), 2 * usize::from(sync_workers));
        assert!(leading.savers.is_empty(), "the blocking saver has no tasks");
        let result = step_down(&started.ctx, &started.bg.health, leading, None, None).await;
        started.bg.finish(&started.ctx, result).await.unwrap();
    }

    #[tokio::test]
    async fn step_down_stops_the_queues_and_joins_the_workers() {
        let (_sim, mut started) = standing_by().await;
        let leading = lead(&started.ctx, &started.bg.health, &mut started.bg.tasks).await;
        started.stop.cancel();
        assert!(until_stopped(None, &started.stop).await.is_none());
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            step_down(&started.ctx, &started.bg.health, leading, None, None),
        )
        .await
        .expect("idle workers stop within the grace");
        result.unwrap();
        assert_eq!(started.bg.health.role(), Role::Stopping);
        assert!(!started.ctx.accepting());
        assert!(
            started.ctx.claim_queue.get().await.is_none(),
            "the claim queue is shut down"
        );
        assert!(started.ctx.volume_queue.get().await.is_none());
        started.bg.finish(&started.ctx, Ok(())).await.unwrap();
    }
}
