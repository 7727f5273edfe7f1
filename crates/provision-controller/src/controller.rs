//! [`ProvisionController`]: the builder, the shared context and `run`.

mod claim;
mod op;
mod save;
mod volume;
mod worker;

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::{Client, ResourceExt};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::{
    cache::{Caches, SharedCache},
    config::Config,
    error::{Error, Result},
    events::Events,
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
        }
    }

    /// Replaces the configuration.
    #[must_use]
    pub fn with_config(mut self, config: Config) -> Self {
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

    /// Counts into `metrics` (Go `MetricsInstance`). Without it nothing is counted.
    #[doc(alias = "MetricsInstance")]
    #[must_use]
    pub fn metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Registers the controller's metrics on `registry` and counts into them.
    #[must_use]
    pub fn metrics_registry(self, registry: &mut prometheus_client::registry::Registry) -> Self {
        self.metrics(ControllerMetrics::new(registry))
    }

    /// Reads claims from the caller's cache instead of watching them (Go `ClaimsInformer`).
    #[doc(alias = "ClaimsInformer")]
    #[must_use]
    pub fn claims_cache(mut self, cache: SharedCache<PersistentVolumeClaim>) -> Self {
        self.claims = Some(cache);
        self
    }

    /// Reads volumes from the caller's cache instead of watching them (Go `VolumesInformer`).
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

    /// Runs the controller until `shutdown` completes, then stops taking work, lets the
    /// operations in flight finish and returns.
    ///
    /// # Errors
    /// [`Error::Config`] when [`Config::validate`] fails (before anything starts);
    /// [`Error::Task`] when a task of the controller panicked.
    ///
    /// # Caveats
    /// Leader election and the metrics server are not implemented yet: when
    /// [`Config::leader_election`] is set (the default) or a metrics port is configured,
    /// `run` logs a warning and runs without them.
    #[doc(alias = "Run")]
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        self.config.validate()?;
        if self.config.leader_election.is_some() {
            tracing::warn!(
                "leader election is enabled but not implemented yet; running without it"
            );
        }
        if self.config.metrics_port != 0 {
            tracing::warn!(
                port = self.config.metrics_port,
                "the metrics server is not implemented yet; register the metrics on your own server"
            );
        }
        let (default_claims, default_volumes, default_classes) =
            if self.claims.is_none() || self.volumes.is_none() || self.classes.is_none() {
                let (c, v, s) = Caches::watch_all(&self.client);
                (Some(c), Some(v), Some(s))
            } else {
                (None, None, None)
            };
        let claims = self.claims.or(default_claims).expect("claims cache is set");
        let volumes = self
            .volumes
            .or(default_volumes)
            .expect("volumes cache is set");
        let classes = self
            .classes
            .or(default_classes)
            .expect("classes cache is set");

        let id = format!(
            "{}_{:016x}",
            gethostname::gethostname().to_string_lossy(),
            rand::random::<u64>()
        );
        let limiter = self.config.failure_backoff.limiter();
        let queue = |name| {
            Arc::new(WorkQueue::new(
                name,
                Arc::clone(&limiter),
                self.metrics.as_ref().map(|m| m.queue(name)),
            ))
        };
        let ctx = Arc::new(Context {
            events: Events::new(self.client.clone(), &self.name, id.clone()),
            client: self.client,
            provisioner: self.provisioner,
            qualifier: self.qualifier,
            guard: self.guard,
            caches: Caches::new(
                claims.store.clone(),
                volumes.store.clone(),
                classes.store.clone(),
            ),
            in_progress: Mutex::default(),
            saver: save::Saver::new(&self.config.pv_save, self.metrics.as_ref()),
            claim_queue: queue("claims"),
            volume_queue: queue("volumes"),
            metrics: self.metrics,
            name: self.name,
            config: self.config,
        });
        tracing::info!(provisioner = %ctx.name, %id, "starting provision controller");

        // Feeding tasks run until aborted; workers end when their queue shuts down.
        let mut feeders = JoinSet::new();
        let feed = Arc::clone(&ctx);
        feeders.spawn(claims.changes.for_each(move |claim| {
            if let Some(uid) = feed.caches.index_claim(&claim) {
                feed.claim_queue.add(uid);
            }
            async {}
        }));
        let feed = Arc::clone(&ctx);
        feeders.spawn(volumes.changes.for_each(move |volume| {
            let name = volume.name_any();
            feed.caches.volume_seen(&name);
            feed.volume_queue.add(name);
            async {}
        }));
        // Go has no class handler: a claim whose class was missing waited for its backoff.
        let feed = Arc::clone(&ctx);
        feeders.spawn(classes.changes.for_each(move |class| {
            feed.requeue_claims_of(&class.name_any());
            async {}
        }));

        let mut shutdown = std::pin::pin!(shutdown);
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
            () = shutdown.as_mut() => {
                feeders.abort_all();
                while feeders.join_next().await.is_some() {}
                return Ok(());
            }
        }

        let mut workers = JoinSet::new();
        for i in 0..ctx.config.threads.get() {
            let c = Arc::clone(&ctx);
            workers
                .spawn(worker::claim_worker(c).instrument(tracing::info_span!("claim_worker", i)));
            let c = Arc::clone(&ctx);
            workers.spawn(
                worker::volume_worker(c).instrument(tracing::info_span!("volume_worker", i)),
            );
        }
        let mut savers = JoinSet::new();
        if matches!(ctx.saver, save::Saver::Background(_)) {
            for _ in 0..Config::DEFAULT_THREADS.get() {
                savers.spawn(save::run_background_worker(Arc::clone(&ctx)));
            }
        }
        feeders.spawn(worker::resync(Arc::clone(&ctx)));
        tracing::info!(provisioner = %ctx.name, "started provision controller");

        shutdown.await;
        tracing::info!(provisioner = %ctx.name, "stopping provision controller");
        let (queued_claims, queued_volumes) = (ctx.claim_queue.len(), ctx.volume_queue.len());
        ctx.claim_queue.shut_down();
        ctx.volume_queue.shut_down();
        tracing::info!(
            queued_claims,
            queued_volumes,
            "waiting for the operations in flight"
        );
        futures::join!(ctx.claim_queue.wait_idle(), ctx.volume_queue.wait_idle());
        let mut result = drain(&mut workers, "worker").await;
        if let save::Saver::Background(bg) = &ctx.saver {
            bg.queue.shut_down();
            let unsaved = bg.unsaved();
            if unsaved > 0 {
                tracing::error!(
                    unsaved,
                    "stopping with provisioned volumes whose PV is not saved"
                );
            }
        }
        result = result.and(drain(&mut savers, "pv saver").await);
        feeders.abort_all();
        while feeders.join_next().await.is_some() {}
        result
    }
}

/// Waits for every task, returning the first abnormal end.
async fn drain(set: &mut JoinSet<()>, task: &'static str) -> Result<()> {
    let mut result = Ok(());
    while let Some(joined) = set.join_next().await {
        if let Err(source) = joined
            && result.is_ok()
        {
            result = Err(Error::Task { task, source });
        }
    }
    result
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
    pub(crate) in_progress: Mutex<HashMap<String, Arc<PersistentVolumeClaim>>>,
    pub(crate) events: Events,
    pub(crate) metrics: Option<ControllerMetrics>,
    pub(crate) claim_queue: Arc<WorkQueue>,
    pub(crate) volume_queue: Arc<WorkQueue>,
    pub(crate) saver: save::Saver,
}

impl Context {
    pub(crate) fn names(&self) -> op::Names<'_> {
        op::Names {
            primary: &self.name,
            additional: &self.config.additional_provisioner_names,
        }
    }

    fn in_progress(&self) -> MutexGuard<'_, HashMap<String, Arc<PersistentVolumeClaim>>> {
        self.in_progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn in_progress_claim(&self, uid: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.in_progress().get(uid).cloned()
    }

    pub(crate) fn is_in_progress(&self, uid: &str) -> bool {
        self.in_progress().contains_key(uid)
    }

    /// Remembers (`Some`) or forgets (`None`) that the claim's provisioning may run in the background.
    pub(crate) fn set_in_progress(&self, uid: &str, claim: Option<Arc<PersistentVolumeClaim>>) {
        let n = {
            let mut map = self.in_progress();
            match claim {
                Some(claim) => map.insert(uid.to_owned(), claim),
                None => map.remove(uid),
            };
            map.len()
        };
        if let Some(m) = &self.metrics {
            m.set_claims_in_progress(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Queues the unbound claims of `class` (it was created or changed).
    fn requeue_claims_of(&self, class: &str) {
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
        match op::call(self.config.provision_timeout, q.should_provision(claim)).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::warn!(error = %op::chain(&err.into_op("qualifier")), "qualifier failed; skipping claim");
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
        .with_config(config);
        let err = controller.run(std::future::pending()).await.unwrap_err();
        assert!(matches!(
            err,
            Error::Config(crate::ConfigError::Invalid {
                option: "resync_period",
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
        .with_config(Config::default().leader_election(None));
        let run = tokio::time::timeout(std::time::Duration::from_secs(5), controller.run(async {}));
        run.await.expect("run returns").expect("a clean stop");
    }

    // Compile-only: the future `run` returns can be spawned.
    #[allow(dead_code)]
    fn run_future_is_send(controller: ProvisionController) {
        drop(assert_send(controller.run(async {})));
    }
}
