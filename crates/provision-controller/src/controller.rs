//! [`ProvisionController`]: the builder, the shared context and `run`.

mod calls;
mod claim;
mod crash_safety;
pub(crate) mod names;
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

use kube_controller_kit::http::{Health, MetricsSource};

use crate::{
    LeaderElection,
    cache::{Caches, SharedCache},
    config::Config,
    error::Result,
    events::Events,
    metrics::ControllerMetrics,
    provisioner::{AssetLookup, DeletionGuard, LateAssets, Provisioner, Qualifier},
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
///   without a saved PV is recorded in the controller's provisioning journal
///   before the driver is called, with the class it
///   started with, so any later controller of that provisioner finishes it, whatever the
///   claim's annotation or class say now, even when its class was deleted. When the claim
///   will not get its PV the normal way (deleted, bound to another PV, now asking another
///   provisioner), the asset is recorded in a PV all the same, and that PV is reclaimed
///   once the PV controller releases it; a live claim that now asks another provisioner
///   gets it bound. Users' claims and PVs carry nothing of this.
/// - With crash-safe provisioning, provisioning and cleanup never delete an asset: only the
///   volume flow does, for a Released PV. Without it, a PV that could not be saved has its
///   asset deleted (Go), but only after a fresh read right before each attempt finds no PV
///   of its name. A PV saved first under the same name by another replica is kept; after
///   every save a driver with [`LateAssets`] hears of the PV that records the asset
///   ([`LateAssets::volume_saved`]), and releases any other asset of the name.
/// - With a [`LateAssets::window`] and crash-safe provisioning, the journal keeps each
///   provisioned claim until the window has passed since its PV was saved; whichever
///   replica leads then makes the last sweep ([`LateAssets::volume_saved`] again, or a
///   cleanup when the PV is gone), retried until the driver answers without
///   failing.
/// - [`Provisioner::delete`] is called only after a fresh read of the PV shows the same
///   object still Released with reclaim policy Delete.
#[doc(alias = "NewProvisionController")]
pub struct ProvisionController {
    client: Client,
    name: String,
    provisioner: Arc<dyn Provisioner>,
    qualifier: Option<Arc<dyn Qualifier>>,
    guard: Option<Arc<dyn DeletionGuard>>,
    asset_lookup: Option<Arc<dyn AssetLookup>>,
    late_assets: Option<Arc<dyn LateAssets>>,
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
            asset_lookup: None,
            late_assets: None,
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

    /// Looks up a claim's asset with `lookup` when crash-safe provisioning cleans the claim
    /// up, instead of calling [`Provisioner::provision`] (see [`AssetLookup`]).
    #[must_use]
    pub fn asset_lookup(mut self, lookup: impl AssetLookup) -> Self {
        self.asset_lookup = Some(Arc::new(lookup));
        self
    }

    /// Tells `late` of every saved PV and sweeps once more when its window has passed
    /// (see [`LateAssets`]).
    #[must_use]
    pub fn late_assets(mut self, late: impl LateAssets) -> Self {
        self.late_assets = Some(Arc::new(late));
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
    /// `client::for_leader_election`: every clone of a
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
    pub(crate) asset_lookup: Option<Arc<dyn AssetLookup>>,
    pub(crate) late_assets: Option<Arc<dyn LateAssets>>,
    pub(crate) config: Config,
    pub(crate) caches: Caches,
    /// Claims whose provisioning may run in the background, by UID (Go `claimsInProgress`).
    pub(crate) in_progress: Mutex<HashMap<String, InProgress>>,
    /// Claims the driver called infeasible, by UID (Go `slowSet`): not provisioned again
    /// before [`Config::infeasible_retry_delay`] unless their class was re-created.
    pub(crate) infeasible: Mutex<HashMap<String, Infeasible>>,
    /// The provisioning journal (with crash-safe provisioning).
    pub(crate) journal: Option<Arc<crate::journal::Journal>>,
    /// Claims that got the `ProvisioningHeld` event in this process, by UID.
    pub(crate) held_warned: Mutex<std::collections::HashSet<String>>,
    pub(crate) events: Events,
    pub(crate) metrics: Option<ControllerMetrics>,
    pub(crate) claim_queue: Arc<WorkQueue>,
    pub(crate) volume_queue: Arc<WorkQueue>,
    pub(crate) saver: save::Saver,
    /// Whether watch events are queued: only while leading (standbys keep their caches
    /// warm without queuing work).
    pub(crate) accepting: AtomicBool,
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

    /// A driver call of the volume flow (`delete`, `volume_saved`),
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
    /// The client of the journal's writes (its own in-flight slots).
    pub(crate) journal_client: Client,
    pub(crate) name: String,
    pub(crate) provisioner: Arc<dyn Provisioner>,
    pub(crate) qualifier: Option<Arc<dyn Qualifier>>,
    pub(crate) guard: Option<Arc<dyn DeletionGuard>>,
    pub(crate) asset_lookup: Option<Arc<dyn AssetLookup>>,
    pub(crate) late_assets: Option<Arc<dyn LateAssets>>,
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

impl Context {
    /// The one place a context is built (by `run`, and by the worker tests): queues that
    /// back off as [`Config::failure_backoff`] says, the PV saver of
    /// [`Config::pv_save`], and no work accepted until leading (`accepting`).
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            client,
            journal_client,
            name,
            provisioner,
            qualifier,
            guard,
            asset_lookup,
            late_assets,
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
        let journal = config.crash_safe_provisioning.then(|| {
            let (namespace, lease_name) =
                crate::journal::location(&client, &name, config.leader_election.as_ref());
            let identity = LeaderElection::default_identity();
            let writer: String = identity
                .chars()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            Arc::new(crate::journal::Journal::new(
                journal_client,
                crate::journal::JournalConfig {
                    namespace,
                    lease_name,
                    writer,
                    commit_delay: config.journal_commit_delay,
                    full_group: usize::from(config.sync_workers.get())
                        .div_ceil(2)
                        .min(crate::journal::FULL_GROUP),
                    capacity: config.journal_capacity.get(),
                    call_limit: config.provision_timeout,
                },
                metrics.clone(),
            ))
        });
        Self {
            claim_queue: queue("claims"),
            volume_queue: queue("volumes"),
            saver: save::Saver::new(&config.pv_save, metrics.as_ref()),
            client,
            name,
            provisioner,
            qualifier,
            guard,
            asset_lookup,
            late_assets,
            caches,
            in_progress: Mutex::default(),
            infeasible: Mutex::default(),
            journal,
            held_warned: Mutex::default(),
            events,
            metrics,
            accepting: AtomicBool::new(false),
            driver_slots: DriverSlots::new(usize::from(config.threads.get())),
            cleanups: Mutex::default(),
            config,
        }
    }

    /// The driver's late-asset window ([`LateAssets::window`]), when it opted in.
    pub(crate) fn late_window(&self) -> Option<std::time::Duration> {
        self.late_assets.as_ref().and_then(|late| late.window())
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

    pub(crate) fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    /// Queues every cached claim and volume (at resync, and when leadership starts).
    pub(crate) fn queue_everything(&self) -> (usize, usize) {
        self.caches.prune_index();
        let delay = self.config.infeasible_retry_delay;
        self.infeasible().retain(|_, e| e.since.elapsed() < delay);
        let claims = self.caches.claims.state();
        let volumes = self.caches.volumes.names();
        for claim in &claims {
            if let Some(uid) = self.caches.index_claim(claim) {
                self.claim_queue.add(uid);
            }
        }
        self.queue_journal();
        let queued_volumes = volumes.len();
        for volume in volumes {
            self.volume_queue.add(volume);
        }
        (claims.len(), queued_volumes)
    }

    /// Queues the claim of every journal entry: an intent at once (its claim may be gone:
    /// nothing else queues it), a settled entry at the time its last sweep is due.
    pub(crate) fn queue_journal(&self) {
        let Some(journal) = &self.journal else {
            return;
        };
        let now = crate::journal::now_secs();
        let entries = journal.entries();
        self.held_warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|uid| entries.iter().any(|(u, e)| u == uid && e.is_intent()));
        for (uid, entry) in entries {
            match entry.due {
                None => self.claim_queue.add(uid),
                Some(due) => {
                    let wait = u64::try_from(due.saturating_sub(now)).unwrap_or(0);
                    self.claim_queue
                        .add_after(uid, std::time::Duration::from_secs(wait + 1));
                }
            }
        }
        journal.report();
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
