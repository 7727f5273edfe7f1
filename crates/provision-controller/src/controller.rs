//! [`ProvisionController`]: the builder, the shared context and `run`.

mod calls;
mod claim;
mod crash_safety;
mod late;
mod names;
mod run;
mod save;
mod volume;
mod volume_object;
mod worker;

use std::{
    collections::HashMap,
    future::Future,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
};

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::Client;
use prometheus_client::registry::Registry;

use crate::{
    cache::{Caches, SharedCache},
    config::Config,
    error::Result,
    events::Events,
    http::{Health, MetricsSource},
    metrics::ControllerMetrics,
    provisioner::{DeletionGuard, Provisioner, Qualifier},
    queue::WorkQueue,
};

/// Provisions PersistentVolumes for PersistentVolumeClaims and deletes released ones,
/// driving a [`Provisioner`].
///
/// Build it with [`ProvisionController::new`] and the builder methods, then
/// [`run`](ProvisionController::run) it; `run` consumes the controller, so no option can
/// be changed once it runs.
///
/// # Guarantees
/// - A claim (by UID) and a volume (by name) are processed by one worker at a time.
/// - A claim whose provisioning runs in the background
///   ([`ProvisionError::InBackground`](crate::ProvisionError::InBackground)) keeps being
///   driven, even after the claim object is deleted and past the failure threshold,
///   until the driver returns a volume or a final answer, so its asset is never leaked.
/// - When `run` returns, no task of the controller is left running.
/// - With leader election, only the replica holding the lease runs workers; the others
///   keep their caches synced and answer probes and scrapes.
/// - With [`Config::crash_safe_provisioning`] (the default), a claim whose asset may exist
///   without a saved PV carries
///   [`FINALIZER_PROVISIONING`](crate::annotations::FINALIZER_PROVISIONING),
///   [`ANN_PROVISIONING_OWNER`](crate::annotations::ANN_PROVISIONING_OWNER) and
///   [`ANN_PROVISIONING_CLASS`](crate::annotations::ANN_PROVISIONING_CLASS) (the class it
///   started with), so any later controller of that owner finishes it, whatever the
///   claim's annotation or class say now, even when its class was deleted. When the
///   claim will not get its PV the normal way (deleted, bound to another PV, now asking
///   another provisioner, or vanished while its provisioning ran in the background), the
///   asset is recorded in a PV all the same, and that PV is reclaimed once the PV
///   controller releases it; a live claim that now asks another provisioner gets it bound.
/// - With crash-safe provisioning, provisioning and cleanup never delete an asset: only the
///   volume flow does, for a Released PV. Without it, a PV that could not be saved has its
///   asset deleted (Go), but only after a fresh read right before each attempt finds no PV
///   of its name. A PV saved first under the same name by another replica is kept, and
///   the driver releases ours ([`Provisioner::delete_duplicate`]); after every save the
///   driver hears of the PV that records the asset ([`Provisioner::volume_saved`]).
/// - With [`Provisioner::late_asset_window`], the driver hears again of each PV we
///   provisioned that is younger than the window and not being deleted: at its first
///   sync in this process (unless this process just saved it) and once when the window
///   has passed since its creation, bounded by [`Config::provision_timeout`]. A PV this
///   process never swept is swept once at its first sync while younger than the window
///   plus a takeover grace (the window again, plus the lease timings with leader
///   election), so the last sweep is made after a failover too.
/// - A failed [`Provisioner::volume_saved`] (after a save or a late-asset sweep) fails
///   nothing and is made again by the volume workers, after 1 s doubling up to
///   [`Config::resync_period`], until it succeeds, while the PV exists, is ours and is
///   not being deleted; only the leading replica does so, never after shutdown.
/// - [`Provisioner::delete`] is called only after a fresh read of the PV shows the same
///   object still Released with reclaim policy Delete.
#[doc(alias = "NewProvisionController")]
pub struct ProvisionController {
    client: Client,
    name: String,
    provisioner: Arc<dyn Provisioner>,
    qualifier: Option<Arc<dyn Qualifier>>,
    guard: Option<Arc<dyn DeletionGuard>>,
    config: Config,
    metrics: Option<ControllerMetrics>,
    claims: Option<SharedCache<PersistentVolumeClaim>>,
    volumes: Option<SharedCache<PersistentVolume>>,
    classes: Option<SharedCache<StorageClass>>,
    leader_client: Option<Client>,
    metrics_source: Option<MetricsSource>,
    health: Option<Health>,
}

impl ProvisionController {
    /// A controller for claims whose class names `provisioner_name`, with the default [`Config`].
    #[must_use]
    pub fn new(
        client: Client,
        provisioner_name: impl Into<String>,
        provisioner: impl Provisioner,
    ) -> Self {
        Self {
            client,
            name: provisioner_name.into(),
            provisioner: Arc::new(provisioner),
            qualifier: None,
            guard: None,
            config: Config::default(),
            metrics: None,
            claims: None,
            volumes: None,
            classes: None,
            leader_client: None,
            metrics_source: None,
            health: None,
        }
    }

    /// Replaces the configuration.
    #[doc(alias = "with_config")]
    #[must_use]
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Asks `qualifier` before provisioning each claim (Go: a `Provisioner` that is a `Qualifier`).
    #[must_use]
    pub fn qualifier(mut self, qualifier: impl Qualifier) -> Self {
        self.qualifier = Some(Arc::new(qualifier));
        self
    }

    /// Asks `guard` before deleting each released volume (Go: a `Provisioner` that is a
    /// `DeletionGuard`).
    #[must_use]
    pub fn deletion_guard(mut self, guard: impl DeletionGuard) -> Self {
        self.guard = Some(Arc::new(guard));
        self
    }

    /// Registers the controller's metrics on `registry`, counts into them, and serves
    /// `registry` on the metrics endpoint (when [`Config::metrics_port`] is not 0); Go
    /// `MetricsInstance`.
    ///
    /// Register the process's other metrics on the same registry, before or after this
    /// call: the endpoint encodes the whole registry at every scrape. A caller that serves
    /// metrics on a server of its own (with [`Config::metrics_port`] 0) serves this
    /// registry there. Without this call the controller counts into a registry of its
    /// own, which the endpoint serves.
    ///
    /// ```no_run
    /// use std::sync::{Arc, Mutex};
    /// use prometheus_client::{metrics::counter::Counter, registry::Registry};
    /// use provision_controller::{Config, ProvisionController, testing::FakeProvisioner};
    /// # fn doc(client: kube_client::Client) {
    /// let registry = Arc::new(Mutex::new(Registry::default()));
    /// let calls = Counter::<u64>::default();
    /// registry.lock().unwrap().register("driver_calls", "Calls to the backend", calls.clone());
    /// let controller = ProvisionController::new(client, "example.com/nfs", FakeProvisioner::new())
    ///     .config(Config::default().metrics_port(8080))
    ///     .metrics_registry(registry); // /metrics serves driver_calls_total and the controller's
    /// # }
    /// ```
    #[doc(alias = "MetricsInstance")]
    #[must_use]
    pub fn metrics_registry(mut self, registry: Arc<Mutex<Registry>>) -> Self {
        let metrics = ControllerMetrics::new(
            &mut registry
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        self.metrics = Some(metrics);
        self.metrics_source = Some(MetricsSource::from(registry));
        self
    }

    /// Reads claims from the caller's cache instead of watching them (Go `ClaimsInformer`).
    #[doc(alias = "ClaimsInformer")]
    #[must_use]
    pub fn claims_cache(mut self, cache: SharedCache<PersistentVolumeClaim>) -> Self {
        self.claims = Some(cache);
        self
    }

    /// Reads volumes from the caller's cache instead of watching them (Go `VolumesInformer`).
    ///
    /// The cache is used as it is. The controller's own volume cache holds each volume
    /// compact (about 5 KiB less per CSI volume than a `PersistentVolume`), so share a
    /// cache only when the process needs one anyway.
    #[doc(alias = "VolumesInformer")]
    #[must_use]
    pub fn volumes_cache(mut self, cache: SharedCache<PersistentVolume>) -> Self {
        self.volumes = Some(cache);
        self
    }

    /// Reads storage classes from the caller's cache instead of watching them
    /// (Go `ClassesInformer`).
    #[doc(alias = "ClassesInformer")]
    #[must_use]
    pub fn classes_cache(mut self, cache: SharedCache<StorageClass>) -> Self {
        self.classes = Some(cache);
        self
    }

    /// Renews the leader lease through `client` instead of the controller's client.
    ///
    /// Pass a client used for nothing else, built from the same `kube_client::Config` with
    /// [`leader::dedicated_client`](crate::leader::dedicated_client): every clone of a
    /// `kube_client::Client` shares one request buffer and connection, so without it a
    /// burst of provisioning requests or a slow LIST can hold a renewal back past the
    /// renew deadline and cost the lease. Default: the controller's client (works, but
    /// renewals then queue behind the workers' traffic).
    #[must_use]
    pub fn leader_election_client(mut self, client: Client) -> Self {
        self.leader_client = Some(client);
        self
    }

    /// Drives `health` (caches synced, role) instead of a fresh [`Health`]: for callers
    /// that serve probes on a server of their own (with [`Config::metrics_port`] 0).
    #[must_use]
    pub fn health(mut self, health: Health) -> Self {
        self.health = Some(health);
        self
    }

    /// Runs the controller until `shutdown` completes or the lease is lost.
    ///
    /// Every replica starts its caches and, when [`Config::metrics_port`] is not 0, the
    /// metrics and probe server (`/healthz`, `/readyz`, the metrics path). With leader
    /// election (the default) it then stands by until it holds the lease; only the
    /// leader runs workers. See `docs/production.md` for the timeline.
    ///
    /// On `shutdown`: the queues stop taking work, the operations in flight get
    /// [`Config::shutdown_grace`] to finish (then they are abandoned, which crash-safe
    /// provisioning makes safe), the lease is released so a standby takes over at once,
    /// and `run` returns `Ok`.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) when [`Config::validate`] fails (before anything starts);
    /// [`Error::LeaderElection`](crate::Error::LeaderElection) when the elector cannot be built; [`Error::Http`](crate::Error::Http) when
    /// the metrics server cannot bind; [`Error::LeadershipLost`](crate::Error::LeadershipLost) when the lease was lost
    /// (the workers were stopped at once; the process is never exited);
    /// [`Error::Task`](crate::Error::Task) when a task of the controller panicked.
    ///
    /// # Guarantees
    /// When `run` returns, no task it started is running, and the lease is released
    /// (after a shutdown) or no longer renewed (after a loss).
    #[doc(alias = "Run")]
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        run::run(self, shutdown).await
    }
}

/// State shared by the workers (Go: the fields of `ProvisionController`).
pub(crate) struct Context {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) provisioner: Arc<dyn Provisioner>,
    pub(crate) qualifier: Option<Arc<dyn Qualifier>>,
    pub(crate) guard: Option<Arc<dyn DeletionGuard>>,
    pub(crate) config: Config,
    pub(crate) caches: Caches,
    /// Claims whose provisioning may run in the background, by UID (Go `claimsInProgress`).
    pub(crate) in_progress: Mutex<HashMap<String, InProgress>>,
    /// Claims the driver called infeasible, by UID (Go `slowSet`): not provisioned again
    /// before [`Config::infeasible_retry_delay`] unless their class was re-created.
    pub(crate) infeasible: Mutex<HashMap<String, Infeasible>>,
    /// Claim UID -> the resourceVersion the cache showed when the API server answered
    /// that the claim is gone ([`Context::mark_gone`]).
    reported_gone: Mutex<HashMap<String, Option<String>>>,
    /// Claims deleted while they showed a provisioning of ours started and not finished
    /// (their finalizers stripped by hand), by UID: their last state as the watch saw it,
    /// to be cleaned up from (see [`Context::record_vanished`]).
    vanished: Mutex<HashMap<String, Vanished>>,
    pub(crate) events: Events,
    pub(crate) metrics: Option<ControllerMetrics>,
    pub(crate) claim_queue: Arc<WorkQueue>,
    pub(crate) volume_queue: Arc<WorkQueue>,
    pub(crate) saver: save::Saver,
    /// Whether watch events are queued: only while leading (standbys keep their caches
    /// warm without queuing work).
    pub(crate) accepting: AtomicBool,
    /// Claim UID -> our own finalizer writes not yet seen in the cache, whose watch events
    /// are not queued again (they would only repeat the sync that wrote them).
    pub(crate) own_writes: Mutex<HashMap<String, OwnWrite>>,
    /// PVs whose driver hears of them again: when their late-asset window ends
    /// ([`Provisioner::late_asset_window`]), or after a failed [`Provisioner::volume_saved`].
    pub(crate) late: late::LateAssets,
    /// The driver calls that may run at once ([`Config::threads`]): claim workers hold a
    /// slot of `provision` only around the driver's provision calls, volume workers one of
    /// `delete` only around its delete calls, so API round trips never hold one.
    pub(crate) driver_slots: DriverSlots,
    /// Claim UID -> when this process first looked for the asset of a claim that will not
    /// get our PV the normal way (the cleanup of [`crash_safety::before_provisioning`]):
    /// "no asset" is believed only once the driver's late-asset window has passed since (a
    /// create sent before, by any replica, lands within it). Removed when the cleanup ends.
    pub(crate) cleanups: Mutex<HashMap<String, tokio::time::Instant>>,
}

/// Bounds on concurrent driver calls, one per flow (Go: `Threadiness` claim workers and
/// as many volume workers, each holding its slot for a whole sync).
pub(crate) struct DriverSlots {
    provision: tokio::sync::Semaphore,
    delete: tokio::sync::Semaphore,
}

impl DriverSlots {
    fn new(threads: usize) -> Self {
        Self {
            provision: tokio::sync::Semaphore::new(threads),
            delete: tokio::sync::Semaphore::new(threads),
        }
    }

    /// A driver call of the claim flow (`provision`, also a cleanup's), bounded by `limit`
    /// with panics caught ([`calls::call`]), once a provision slot is free; the wait for
    /// the slot is not part of `limit` (a call that never started cannot have run).
    pub(crate) async fn provisioning<T>(
        &self,
        limit: Option<std::time::Duration>,
        call: impl std::future::Future<Output = T>,
    ) -> Result<T, calls::CallError> {
        let _slot = self.provision.acquire().await;
        calls::call(limit, call).await
    }

    /// A driver call of the volume flow (`delete`, `delete_duplicate`, `volume_saved`),
    /// as [`provisioning`](Self::provisioning) with a delete slot.
    pub(crate) async fn deleting<T>(
        &self,
        limit: Option<std::time::Duration>,
        call: impl std::future::Future<Output = T>,
    ) -> Result<T, calls::CallError> {
        let _slot = self.delete.acquire().await;
        calls::call(limit, call).await
    }
}

/// What whoever builds a [`Context`] gives it ([`Context::new`]); the rest (queues,
/// saver, the records of claims and volumes) starts empty and is derived from `config`.
pub(crate) struct Parts {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) provisioner: Arc<dyn Provisioner>,
    pub(crate) qualifier: Option<Arc<dyn Qualifier>>,
    pub(crate) guard: Option<Arc<dyn DeletionGuard>>,
    pub(crate) config: Config,
    pub(crate) caches: Caches,
    pub(crate) events: Events,
    pub(crate) metrics: Option<ControllerMetrics>,
}

/// A claim whose provisioning may run in the background, and the class it was started
/// with (the driver is polled with that class even when the class is deleted or changed).
#[derive(Clone)]
pub(crate) struct InProgress {
    pub(crate) claim: Arc<PersistentVolumeClaim>,
    pub(crate) class: Option<Arc<StorageClass>>,
}

impl InProgress {
    pub(crate) fn new(claim: Arc<PersistentVolumeClaim>, class: Option<Arc<StorageClass>>) -> Self {
        Self { claim, class }
    }
}

/// A claim that vanished while a provisioning of ours had started
/// ([`Context::record_vanished`]).
pub(crate) struct Vanished {
    claim: Arc<PersistentVolumeClaim>,
    seen: tokio::time::Instant,
}

/// Go's `ProvisioningState` after an attempt: what the controller must remember of the
/// claim in [`Context::in_progress`] ([`Context::remember`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Work may continue in the backend: keep driving the claim even once it is deleted.
    InBackground,
    /// Nothing runs in the backend.
    Finished,
    /// Keep whatever was remembered.
    NoChange,
}

/// When the driver called a claim infeasible, and the UID of the claim's class then.
pub(crate) struct Infeasible {
    since: tokio::time::Instant,
    class_uid: Option<String>,
}

/// Our writes of a claim that the cache does not show yet, and those still in flight:
/// one sync may write a claim twice (the finalizer added before the driver is called,
/// removed after a final answer), and the watch event of each, which may arrive before
/// the answer to the write, would otherwise queue the claim again, whose sync writes
/// twice again.
#[derive(Default)]
pub(crate) struct OwnWrite {
    /// The resource versions we wrote, oldest first (at most [`OwnWrite::KEPT`]).
    resource_versions: std::collections::VecDeque<String>,
    /// Whether the last one carried the crash-safety finalizer.
    intent: bool,
    /// Writes sent whose answer has not come yet.
    in_flight: u32,
    /// Resource versions of watch events that came while a write was in flight and were
    /// not known to be ours: ours if an answer names them, else queued once every write
    /// in flight is answered.
    early: Vec<String>,
    /// More early events came than are kept: the claim is queued once every write in
    /// flight is answered.
    early_overflow: bool,
}

impl OwnWrite {
    /// The most writes (and early events) of one claim remembered: a sync writes a claim
    /// at most twice.
    const KEPT: usize = 4;

    fn idle(&self) -> bool {
        self.resource_versions.is_empty()
            && self.in_flight == 0
            && self.early.is_empty()
            && !self.early_overflow
    }
}

/// A write of a claim in flight ([`Context::begin_own_write`]): its watch event is not
/// queued once [`OwnWriteGuard::done`] names the version written. Dropped without it
/// (the write failed, timed out or panicked), events seen meanwhile are queued.
pub(crate) struct OwnWriteGuard<'a> {
    ctx: &'a Context,
    uid: String,
    open: bool,
}

impl OwnWriteGuard<'_> {
    /// The write succeeded: `claim` is the claim as the API server answered it.
    pub(crate) fn done(mut self, claim: &PersistentVolumeClaim) {
        self.open = false;
        self.ctx.end_own_write(&self.uid, Some(claim));
    }
}

impl Drop for OwnWriteGuard<'_> {
    fn drop(&mut self) {
        if self.open {
            self.ctx.end_own_write(&self.uid, None);
        }
    }
}

impl Context {
    /// The one place a context is built (by `run`, and by the worker tests): queues that
    /// back off as [`Config::failure_backoff`] says, the PV saver of
    /// [`Config::pv_save`], and no work accepted until leading (`accepting`).
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            client,
            name,
            provisioner,
            qualifier,
            guard,
            config,
            caches,
            events,
            metrics,
        } = parts;
        let limiter = config.failure_backoff.limiter();
        let queue = |queue_name| {
            Arc::new(WorkQueue::new(
                queue_name,
                Arc::clone(&limiter),
                metrics.as_ref().map(|m| m.queue(queue_name)),
            ))
        };
        Self {
            claim_queue: queue("claims"),
            volume_queue: queue("volumes"),
            saver: save::Saver::new(&config.pv_save, metrics.as_ref()),
            client,
            name,
            provisioner,
            qualifier,
            guard,
            caches,
            in_progress: Mutex::default(),
            infeasible: Mutex::default(),
            reported_gone: Mutex::default(),
            vanished: Mutex::default(),
            events,
            metrics,
            accepting: AtomicBool::new(false),
            own_writes: Mutex::default(),
            late: late::LateAssets::default(),
            driver_slots: DriverSlots::new(usize::from(config.threads.get())),
            cleanups: Mutex::default(),
            config,
        }
    }

    pub(crate) fn names(&self) -> names::Names<'_> {
        names::Names {
            primary: &self.name,
            additional: &self.config.additional_provisioner_names,
        }
    }

    fn in_progress(&self) -> MutexGuard<'_, HashMap<String, InProgress>> {
        self.in_progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn in_progress_entry(&self, uid: &str) -> Option<InProgress> {
        self.in_progress().get(uid).cloned()
    }

    pub(crate) fn is_in_progress(&self, uid: &str) -> bool {
        self.in_progress().contains_key(uid)
    }

    /// How much longer a cleanup of claim `uid` that found no asset must wait before it
    /// believes that none exists: `window` (the driver's late-asset window) counted from
    /// this process's first look (recorded now if this is it); `None` once it has passed.
    pub(crate) fn cleanup_wait(
        &self,
        uid: &str,
        window: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let now = tokio::time::Instant::now();
        let first = *self
            .cleanups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(uid.to_owned())
            .or_insert(now);
        window
            .checked_sub(now.saturating_duration_since(first))
            .filter(|left| !left.is_zero())
    }

    /// Records claim `uid`, seen deleted by the claim watch while it showed a provisioning
    /// of ours started and not finished: its finalizers were stripped by hand, and the
    /// process that ran the provisioning may stop before it cleans up (the copy it kept
    /// goes with it). Every process records it, standbys too; the claim's sync then cleans
    /// up from this copy (`claim::sync_claim`), here or in the process that leads next
    /// (queued by [`Context::queue_everything`]). A record goes when its cleanup ended; a
    /// standby's, and one nothing works on, once older than [`Context::vanished_bound`].
    pub(crate) fn record_vanished(&self, uid: &str, claim: Arc<PersistentVolumeClaim>) {
        let mut vanished = self.vanished();
        if !self.accepting() {
            let bound = self.vanished_bound();
            vanished.retain(|_, v| v.seen.elapsed() <= bound);
        }
        vanished.entry(uid.to_owned()).or_insert_with(|| {
            tracing::info!(pvc = %crate::annotations::claim_key(&claim), claim_uid = uid,
                "claim deleted with its finalizers stripped while a provisioning of ours had started; its asset is looked for");
            Vanished {
                claim,
                seen: tokio::time::Instant::now(),
            }
        });
    }

    /// The copy of claim `uid` recorded by [`Context::record_vanished`].
    pub(crate) fn vanished_claim(&self, uid: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.vanished().get(uid).map(|v| Arc::clone(&v.claim))
    }

    /// Forgets the record of vanished claim `uid` (its cleanup ended).
    pub(crate) fn forget_vanished(&self, uid: &str) {
        self.vanished().remove(uid);
    }

    /// How long a record of a vanished claim lasts when nothing works on it: the
    /// late-asset window and the takeover grace ([`late::grace`]), plus a resync period.
    /// The leader works on it within that time, or the process that leads next does.
    fn vanished_bound(&self) -> std::time::Duration {
        let window = self.provisioner.late_asset_window().unwrap_or_default();
        late::grace(&self.config, window).saturating_add(self.config.resync_period)
    }

    fn vanished(&self) -> MutexGuard<'_, HashMap<String, Vanished>> {
        self.vanished
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets the first look of claim `uid`'s cleanup (it ended).
    pub(crate) fn forget_cleanup(&self, uid: &str) {
        self.cleanups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(uid);
    }

    /// Remembers (`Some`) or forgets (`None`) that the claim's provisioning may run in the
    /// background. An entry without a class keeps the class remembered before, if any.
    pub(crate) fn set_in_progress(&self, uid: &str, entry: Option<InProgress>) {
        let n = {
            let mut map = self.in_progress();
            match entry {
                Some(mut entry) => {
                    if entry.class.is_none() {
                        entry.class = map.get(uid).and_then(|e| e.class.clone());
                    }
                    map.insert(uid.to_owned(), entry);
                }
                None => {
                    map.remove(uid);
                }
            }
            map.len()
        };
        if let Some(m) = &self.metrics {
            m.set_claims_in_progress(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Records what a claim's sync left behind (`state`): the claim and `class`, the class
    /// its provisioning runs with, while it may run in the background; nothing once it
    /// finished. The one place a sync changes [`Context::in_progress`].
    pub(crate) fn remember(
        &self,
        uid: &str,
        state: State,
        claim: &Arc<PersistentVolumeClaim>,
        class: Option<Arc<StorageClass>>,
    ) {
        match state {
            State::InBackground => {
                self.set_in_progress(uid, Some(InProgress::new(Arc::clone(claim), class)));
            }
            State::Finished => self.set_in_progress(uid, None),
            State::NoChange => {}
        }
    }

    fn infeasible(&self) -> MutexGuard<'_, HashMap<String, Infeasible>> {
        self.infeasible
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that the API server answered that `claim` (as cached) is gone or being
    /// deleted, before anything was asked of the driver for it.
    pub(crate) fn mark_gone(&self, uid: &str, claim: &PersistentVolumeClaim) {
        self.reported_gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(uid.to_owned(), claim.metadata.resource_version.clone());
    }

    /// Whether the cache still shows `claim` as it was when the API server reported it
    /// gone ([`mark_gone`](Self::mark_gone)): a cache behind its watch (one waiting out
    /// its backoff after an outage shows deleted claims for up to half a minute) is not
    /// worked on again until it moves. A newer version forgets the record.
    pub(crate) fn reported_gone(&self, uid: &str, claim: &PersistentVolumeClaim) -> bool {
        let mut gone = self
            .reported_gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match gone.get(uid) {
            Some(version) if *version == claim.metadata.resource_version => true,
            Some(_) => {
                gone.remove(uid);
                false
            }
            None => false,
        }
    }

    /// Records that the driver called the claim infeasible with `class`; an earlier record
    /// that has not expired keeps its time (Go: a slow set keeps the first time).
    pub(crate) fn mark_infeasible(&self, uid: &str, class: Option<&StorageClass>) {
        let delay = self.config.infeasible_retry_delay;
        let mut map = self.infeasible();
        if map.get(uid).is_some_and(|e| e.since.elapsed() < delay) {
            return;
        }
        let entry = Infeasible {
            since: tokio::time::Instant::now(),
            class_uid: class.and_then(|c| c.metadata.uid.clone()),
        };
        map.insert(uid.to_owned(), entry);
    }

    /// How long the claim must still wait after the driver called it infeasible; `None`
    /// when it may be provisioned now. A class with another UID than the one the driver
    /// judged ends the wait; a missing class does not count (Go skips the check then).
    pub(crate) fn infeasible_wait(
        &self,
        uid: &str,
        class: Option<&StorageClass>,
    ) -> Option<std::time::Duration> {
        let class = class?;
        let delay = self.config.infeasible_retry_delay;
        let mut map = self.infeasible();
        let entry = map.get(uid)?;
        let remaining = delay.saturating_sub(entry.since.elapsed());
        if entry.class_uid != class.metadata.uid || remaining.is_zero() {
            map.remove(uid);
            return None;
        }
        Some(remaining)
    }

    fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    fn own_writes(&self) -> MutexGuard<'_, HashMap<String, OwnWrite>> {
        self.own_writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers that we wrote this version of the claim.
    pub(crate) fn note_own_write(&self, claim: &PersistentVolumeClaim) {
        if let Some(uid) = &claim.metadata.uid {
            Self::record_write(&mut self.own_writes(), uid, claim);
        }
    }

    /// Records `claim` as our write in `own` (under `uid`); an event already seen for
    /// it is consumed.
    fn record_write(own: &mut HashMap<String, OwnWrite>, uid: &str, claim: &PersistentVolumeClaim) {
        let Some(rv) = &claim.metadata.resource_version else {
            return;
        };
        let write = own.entry(uid.to_owned()).or_default();
        write.intent = crate::annotations::has_provisioning_finalizer(claim);
        if let Some(at) = write.early.iter().position(|e| e == rv) {
            // Its event came before its answer: the cache shows it already.
            write.early.remove(at);
            return;
        }
        if write.resource_versions.len() >= OwnWrite::KEPT {
            write.resource_versions.pop_front();
        }
        write.resource_versions.push_back(rv.clone());
    }

    /// Marks a write of the claim `uid` as sent: watch events of the claim that come
    /// before its answer wait for it ([`OwnWriteGuard`]).
    pub(crate) fn begin_own_write(&self, uid: &str) -> OwnWriteGuard<'_> {
        let mut own = self.own_writes();
        let write = own.entry(uid.to_owned()).or_default();
        write.in_flight = write.in_flight.saturating_add(1);
        OwnWriteGuard {
            ctx: self,
            uid: uid.to_owned(),
            open: true,
        }
    }

    /// A write of the claim `uid` was answered (`written`: the claim written) or failed.
    /// Once no write is in flight, events that came meanwhile and were not ours queue
    /// the claim.
    fn end_own_write(&self, uid: &str, written: Option<&PersistentVolumeClaim>) {
        let foreign = {
            let mut own = self.own_writes();
            if let Some(claim) = written {
                Self::record_write(&mut own, uid, claim);
            }
            let Some(write) = own.get_mut(uid) else {
                return;
            };
            write.in_flight = write.in_flight.saturating_sub(1);
            let foreign = write.in_flight == 0 && (!write.early.is_empty() || write.early_overflow);
            if write.in_flight == 0 {
                write.early.clear();
                write.early_overflow = false;
            }
            if write.idle() {
                own.remove(uid);
            }
            foreign
        };
        if foreign && self.accepting() {
            self.claim_queue.add(uid.to_owned());
        }
    }

    /// Whether this watch event need not queue the claim: it shows one of our own writes
    /// not seen yet (consumed, with any earlier one: events come in order), or it came
    /// while a write of ours is in flight (decided when that write is answered).
    fn is_own_write(&self, uid: &str, claim: &PersistentVolumeClaim) -> bool {
        let mut own = self.own_writes();
        let Some(write) = own.get_mut(uid) else {
            return false;
        };
        let Some(rv) = claim.metadata.resource_version.as_deref() else {
            return false;
        };
        if let Some(at) = write.resource_versions.iter().position(|w| w == rv) {
            write.resource_versions.drain(..=at);
            if write.idle() {
                own.remove(uid);
            }
            return true;
        }
        if write.in_flight == 0 {
            return false;
        }
        if write.early.len() >= OwnWrite::KEPT {
            write.early_overflow = true;
        } else {
            write.early.push(rv.to_owned());
        }
        true
    }

    /// Whether our last write of the claim, not yet seen in the cache, left it without our
    /// crash-safety finalizer: only we add it, so the server does not have it either, and
    /// a cached claim that still shows it is older than that write.
    pub(crate) fn wrote_intent_removed(&self, uid: &str) -> bool {
        self.own_writes().get(uid).is_some_and(|w| !w.intent)
    }

    /// Queues every cached claim and volume (at resync, and when leadership starts).
    pub(crate) fn queue_everything(&self) -> (usize, usize) {
        self.caches.prune_index();
        // Every claim is synced now anyway; this also bounds how long a record of a
        // write that no watch event confirms (a no-op patch) can be trusted. Writes in
        // flight stay: their answers are still to come.
        self.own_writes().retain(|_, w| {
            w.resource_versions.clear();
            w.in_flight > 0
        });
        let delay = self.config.infeasible_retry_delay;
        self.infeasible().retain(|_, e| e.since.elapsed() < delay);
        self.reported_gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|uid, _| self.caches.claim_by_uid(uid).is_some());
        let claims = self.caches.claims.state();
        let volumes = self.caches.volumes.names();
        self.late.retain(|name| self.caches.volume_exists(name));
        for claim in &claims {
            if let Some(uid) = self.caches.index_claim(claim) {
                self.claim_queue.add(uid);
            }
        }
        // Vanished claims still to be cleaned up (recorded while standing by, too); an old
        // one that no retry holds is dropped.
        let bound = self.vanished_bound();
        let vanished: Vec<String> = {
            let mut map = self.vanished();
            map.retain(|uid, v| {
                v.seen.elapsed() <= bound || self.claim_queue.num_requeues(uid) > 0
            });
            map.keys().cloned().collect()
        };
        for uid in vanished {
            self.claim_queue.add(uid);
        }
        let queued_volumes = volumes.len();
        for volume in volumes {
            self.volume_queue.add(volume);
        }
        // Deleted PVs whose last sweep is owed (recorded while standing by, too); one not
        // due yet is queued again for its time.
        for name in late::afterlife_names(self) {
            self.volume_queue.add(name);
        }
        (claims.len(), queued_volumes)
    }

    /// Queues the unbound claims of `class` (it was created or changed).
    fn requeue_claims_of(&self, class: &str) {
        if !self.accepting() {
            return;
        }
        let claims = self.caches.claims.state_filter(|c| {
            crate::annotations::claim_class(c) == class
                && c.spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_deref())
                    .is_none_or(str::is_empty)
        });
        for claim in claims {
            if let Some(uid) = self.caches.index_claim(&claim) {
                self.claim_queue.add(uid);
            }
        }
    }

    /// The qualifier's answer (true without a qualifier); a panic or timeout counts as no.
    pub(crate) async fn qualified(&self, claim: &PersistentVolumeClaim) -> bool {
        let Some(q) = &self.qualifier else {
            return true;
        };
        match calls::call(self.config.provision_timeout, q.should_provision(claim)).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::warn!(error = %calls::chain(&err.into_op("qualifier")), "qualifier failed; skipping claim");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(t: T) -> T {
        t
    }

    fn unreachable_client() -> Client {
        Client::try_from(kube_client::Config::new(
            "http://127.0.0.1:9".parse().unwrap(),
        ))
        .unwrap()
    }

    #[tokio::test]
    async fn run_refuses_an_invalid_config_before_starting() {
        let config = Config::default().resync_period(std::time::Duration::ZERO);
        let controller = ProvisionController::new(
            unreachable_client(),
            "example.com/fake",
            crate::testing::FakeProvisioner::new(),
        )
        .config(config);
        let err = controller.run(std::future::pending()).await.unwrap_err();
        assert!(matches!(
            err,
            crate::Error::Config(crate::ConfigError::Invalid {
                option: crate::ConfigOption::ResyncPeriod,
                ..
            })
        ));
    }

    #[tokio::test]
    async fn run_returns_when_shut_down_before_the_caches_sync() {
        let controller = ProvisionController::new(
            unreachable_client(),
            "example.com/fake",
            crate::testing::FakeProvisioner::new(),
        )
        .config(Config::default().leader_election(None));
        let run = tokio::time::timeout(std::time::Duration::from_secs(5), controller.run(async {}));
        run.await.expect("run returns").expect("a clean stop");
    }

    // Compile-only: the future `run` returns can be spawned.
    #[allow(dead_code)]
    fn run_future_is_send(controller: ProvisionController) {
        drop(assert_send(controller.run(async {})));
    }
}
