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
    leader::{LeaderElection, LeaderElector, LeaderError},
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

pub(super) async fn run(
    ctrl: ProvisionController,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    ctrl.config.validate()?;
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

    // Metrics: the caller's, or our own registry, which the endpoint then serves.
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
        health: health.clone(),
    };
    let on_shutdown = stop.clone();
    bg.tasks.spawn(async move {
        shutdown.await;
        on_shutdown.cancel();
    });

    // One bound on the requests in flight of the claim and volume syncs (watches are not
    // counted). The journal's group writes and the events have slots of their own: a
    // journal write lets a whole group of claims go on, so it must not queue behind their
    // PV writes, and an event write, which no claim waits for, must never make a PV
    // create wait (measured: with the events in the shared slots, a PV create waited
    // 170 ms for a slot at 16 threads).
    let (client, event_client, journal_client) = match config.max_requests_in_flight {
        Some(max) => {
            let journal_client = InFlightLimit::new(JOURNAL_IN_FLIGHT).wrap(client.clone());
            let events = NonZeroUsize::new(max.get() / EVENTS_SHARE).unwrap_or(NonZeroUsize::MIN);
            let event_client = InFlightLimit::new(events).wrap(client.clone());
            let limit = if config.adapt_requests_in_flight {
                InFlightLimit::adaptive(max)
            } else {
                InFlightLimit::new(max)
            };
            metrics.watch_requests(limit.clone());
            let client = limit.wrap(client);
            (client, event_client, journal_client)
        }
        None => (client.clone(), client.clone(), client),
    };
    let claims = claims.unwrap_or_else(|| crate::cache::watch(Api::all(client.clone())));
    let volumes = volumes.map_or_else(|| VolumeCache::watch(&client), VolumeCache::from);
    let classes = classes.unwrap_or_else(|| crate::cache::watch(Api::all(client.clone())));

    let ctx = Arc::new(Context::new(Parts {
        events: Events::new(event_client, &name, identity.clone()),
        journal_client,
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

    // Every replica syncs its caches, so a standby is ready to work the moment it leads.
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
        () = stop.cancelled() => return bg.finish(&ctx, Ok(())).await,
    }
    health.set_caches_synced(true);
    tracing::info!(
        claims = ctx.caches.claims.state().len(),
        volumes = ctx.caches.volumes.len(),
        classes = ctx.caches.classes.state().len(),
        "caches synced"
    );

    if let Some(elector) = elector.as_mut() {
        health.set_role(Role::Standby);
        tracing::info!(identity = elector.identity(), "standing by for the lease");
        match elector.acquire(stop.cancelled()).await {
            Ok(()) => {}
            Err(LeaderError::Cancelled { .. }) => {
                tracing::info!("shutdown requested while standing by");
                return bg.finish(&ctx, Ok(())).await;
            }
            Err(err) => return bg.finish(&ctx, Err(Error::leader_election(err))).await,
        }
    }

    // Leading (or running without election): read the journal (what the last leader
    // started), queue everything and start the workers.
    health.set_role(Role::Leading);
    set_leader(&ctx, true);
    if let Some(journal) = &ctx.journal {
        match journal.reload().await {
            Ok(entries) => tracing::info!(entries, "provisioning journal read"),
            Err(error) => {
                tracing::warn!(error = %crate::controller::calls::chain(&error), "failed to read the provisioning journal; read again at the next resync")
            }
        }
        bg.tasks.spawn(Arc::clone(journal).run_committer());
    }
    ctx.accepting.store(true, Ordering::Release);
    let (queued_claims, queued_volumes) = ctx.queue_everything();
    let mut workers = JoinSet::new();
    let threads = ctx.config.threads.get();
    let sync_workers = ctx.config.sync_workers.get().max(threads);
    for i in 0..sync_workers {
        let c = Arc::clone(&ctx);
        workers.spawn(worker::claim_worker(c).instrument(tracing::info_span!("claim_worker", i)));
        let c = Arc::clone(&ctx);
        workers.spawn(worker::volume_worker(c).instrument(tracing::info_span!("volume_worker", i)));
    }
    let mut savers = JoinSet::new();
    if matches!(ctx.saver, save::Saver::Background(_)) {
        for _ in 0..Config::DEFAULT_THREADS.get() {
            savers.spawn(save::run_background_worker(Arc::clone(&ctx)));
        }
    }
    bg.tasks.spawn(worker::resync(Arc::clone(&ctx)));
    tracing::info!(
        provisioner = %ctx.name,
        driver_slots = threads,
        claim_workers = sync_workers,
        volume_workers = sync_workers,
        queued_claims,
        queued_volumes,
        "leading: workers started"
    );

    let lost = match elector.as_ref() {
        Some(elector) => tokio::select! {
            () = stop.cancelled() => None,
            lost = elector.lost() => Some(lost),
        },
        None => {
            stop.cancelled().await;
            None
        }
    };
    health.set_role(Role::Stopping);
    ctx.accepting.store(false, Ordering::Release);
    let in_flight = ctx.claim_queue.in_flight() + ctx.volume_queue.in_flight();
    let (waiting_claims, waiting_volumes) = (ctx.claim_queue.len(), ctx.volume_queue.len());
    ctx.claim_queue.shut_down();
    ctx.volume_queue.shut_down();

    if let Some(lost) = lost {
        // Another replica may lead already: stop at once, as Go's process exit would.
        workers.abort_all();
        savers.abort_all();
        let result = drain(&mut workers, "worker")
            .await
            .and(drain(&mut savers, "pv saver").await);
        set_leader(&ctx, false);
        tracing::warn!(
            abandoned = in_flight,
            waiting_claims,
            waiting_volumes,
            reason = %lost.reason,
            "lost the lease: workers stopped"
        );
        drop(elector);
        let result = result.and(Err(Error::leadership_lost(lost)));
        return bg.finish(&ctx, result).await;
    }

    tracing::info!(
        in_flight,
        waiting_claims,
        waiting_volumes,
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
        workers.abort_all();
    }
    let mut result = drain(&mut workers, "worker").await;
    if let save::Saver::Background(saver) = &ctx.saver {
        saver.queue.shut_down();
        if tokio::time::timeout_at(deadline, saver.queue.wait_idle())
            .await
            .is_err()
        {
            savers.abort_all();
        }
        let unsaved = saver.unsaved();
        if unsaved > 0 {
            tracing::warn!(
                unsaved,
                "stopping with provisioned volumes whose PV is not saved; the journal keeps their claims when crash safety is on"
            );
        }
    }
    result = result.and(drain(&mut savers, "pv saver").await);
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
    set_leader(&ctx, false);
    bg.finish(&ctx, result).await
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
async fn drain(set: &mut JoinSet<()>, task: &'static str) -> Result<()> {
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
