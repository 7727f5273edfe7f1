//! [`ProvisionController`]: the builder and `run`; the workers' shared [`Context`] is in
//! `context.rs`, what they remember of each claim in `records.rs`.

mod calls;
mod claim;
mod context;
mod crash_safety;
pub(crate) mod names;
mod provision;
mod records;
mod run;
mod save;
mod slots;
mod volume;
mod volume_object;
mod worker;

pub(crate) use context::{Context, Driver, Parts};
#[cfg(feature = "testing")]
pub(crate) use volume_object::{same_source, volume_source};

use std::{
    future::Future,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::Client;
use prometheus_client::registry::Registry;

use kube_controller_kit::http::{Health as KitHealth, MetricsSource};

use crate::{
    cache::SharedCache,
    config::Config,
    metrics::ControllerMetrics,
    provisioner::{AssetLookup, DeletionGuard, LateAssets, Provisioner, Qualifier},
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
    driver: Driver,
    config: Config,
    metrics: Option<ControllerMetrics>,
    claims: Option<SharedCache<PersistentVolumeClaim>>,
    volumes: Option<SharedCache<PersistentVolume>>,
    classes: Option<SharedCache<StorageClass>>,
    leader_client: Option<Client>,
    metrics_source: Option<MetricsSource>,
    health: Option<KitHealth>,
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
            driver: Driver {
                provisioner: Arc::new(provisioner),
                qualifier: None,
                guard: None,
                asset_lookup: None,
                late_assets: None,
            },
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
        self.driver.qualifier = Some(Arc::new(qualifier));
        self
    }

    /// Asks `guard` before deleting each released volume (Go: a `Provisioner` that is a
    /// `DeletionGuard`).
    #[must_use]
    pub fn deletion_guard(mut self, guard: impl DeletionGuard) -> Self {
        self.driver.guard = Some(Arc::new(guard));
        self
    }

    /// Looks up a claim's asset with `lookup` when crash-safe provisioning cleans the claim
    /// up, instead of calling [`Provisioner::provision`] (see [`AssetLookup`]).
    #[must_use]
    pub fn asset_lookup(mut self, lookup: impl AssetLookup) -> Self {
        self.driver.asset_lookup = Some(Arc::new(lookup));
        self
    }

    /// Tells `late` of every saved PV and sweeps once more when its window has passed
    /// (see [`LateAssets`]).
    #[must_use]
    pub fn late_assets(mut self, late: impl LateAssets) -> Self {
        self.driver.late_assets = Some(Arc::new(late));
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

    /// Drives `health` (caches synced, role) instead of a fresh one, so another part of
    /// the process follows this controller's election ([`Health::leading`](crate::Health::leading))
    /// or holds `/readyz` back ([`Health::set_unmet`](crate::Health::set_unmet)).
    #[must_use]
    pub fn health(mut self, health: crate::Health) -> Self {
        self.health = Some(health.into_inner());
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
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), crate::Error> {
        run::run(self, shutdown).await
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
