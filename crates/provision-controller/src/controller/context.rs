//! [`Context`]: what the workers share (Go: the fields of `ProvisionController`), built
//! once by [`Context::new`] from the builder's [`Parts`]; and what is queued when (at
//! resync, when leading starts, when a class changes).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::Client;

use super::{calls, names, records::Records, save, slots::DriverSlots};
use crate::{
    LeaderElection,
    cache::Caches,
    config::Config,
    events::Events,
    journal::{self, Journal, JournalConfig},
    metrics::ControllerMetrics,
    provisioner::{AssetLookup, DeletionGuard, LateAssets, Provisioner, Qualifier},
    queue::WorkQueue,
};

/// State shared by the workers (Go: the fields of `ProvisionController`).
pub(crate) struct Context {
    pub(crate) client: Client,
    pub(crate) name: String,
    /// The driver's traits.
    pub(crate) driver: Driver,
    pub(crate) config: Config,
    pub(crate) caches: Caches,
    /// What this process remembers of each claim between its syncs.
    pub(crate) records: Records,
    /// The provisioning journal (with crash-safe provisioning).
    pub(crate) journal: Option<Arc<Journal>>,
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
}

/// The driver's traits, as handed to the builder: the [`Provisioner`] and what it opts into.
#[derive(Clone)]
pub(crate) struct Driver {
    pub(crate) provisioner: Arc<dyn Provisioner>,
    pub(crate) qualifier: Option<Arc<dyn Qualifier>>,
    pub(crate) guard: Option<Arc<dyn DeletionGuard>>,
    pub(crate) asset_lookup: Option<Arc<dyn AssetLookup>>,
    pub(crate) late_assets: Option<Arc<dyn LateAssets>>,
}

/// What whoever builds a [`Context`] gives it ([`Context::new`]); the rest (queues,
/// saver, the records of claims and volumes) starts empty and is derived from `config`.
pub(crate) struct Parts {
    pub(crate) client: Client,
    /// The client of the journal's writes (its own in-flight slots).
    pub(crate) journal_client: Client,
    pub(crate) name: String,
    /// The driver's traits.
    pub(crate) driver: Driver,
    pub(crate) config: Config,
    pub(crate) caches: Caches,
    pub(crate) events: Events,
    pub(crate) metrics: Option<ControllerMetrics>,
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
            driver,
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
                journal::location(&client, &name, config.leader_election.as_ref());
            let namespace = config.journal_namespace.clone().unwrap_or(namespace);
            let identity = LeaderElection::default_identity();
            let writer: String = identity
                .chars()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            Arc::new(Journal::new(
                journal_client,
                JournalConfig {
                    namespace,
                    lease_name,
                    writer,
                    commit_delay: config.journal_commit_delay,
                    full_group: usize::from(config.sync_workers.get())
                        .div_ceil(2)
                        .min(journal::FULL_GROUP),
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
            driver,
            caches,
            records: Records::new(config.infeasible_retry_delay, metrics.clone()),
            journal,
            events,
            metrics,
            accepting: AtomicBool::new(false),
            driver_slots: DriverSlots::new(usize::from(config.threads.get())),
            config,
        }
    }

    /// The driver's late-asset window ([`LateAssets::window`]), when it opted in.
    pub(crate) fn late_window(&self) -> Option<std::time::Duration> {
        self.driver
            .late_assets
            .as_ref()
            .and_then(|late| late.window())
    }

    pub(crate) fn names(&self) -> names::Names<'_> {
        names::Names {
            primary: &self.name,
            additional: &self.config.additional_provisioner_names,
        }
    }

    pub(crate) fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    /// Queues every cached claim and volume (at resync, and when leadership starts).
    pub(crate) fn queue_everything(&self) -> (usize, usize) {
        self.caches.prune_index();
        self.records.prune_infeasible();
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
        let now = journal::now_secs();
        let entries = journal.entries();
        self.records
            .retain_held(|uid| entries.iter().any(|(u, e)| u == uid && e.is_intent()));
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
    pub(crate) fn requeue_claims_of(&self, class: &str) {
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
        let Some(q) = &self.driver.qualifier else {
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
