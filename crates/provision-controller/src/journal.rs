//! The provisioning journal: ConfigMaps in the controller's namespace (the Lease's), named
//! `<lease name>-journal-<seq>` and labelled [`JOURNAL_LABEL`]` = <lease name>`, each
//! holding one entry per claim whose provisioning started (`e.<claim uid>`) and the class
//! snapshots they refer to (`k.<hash>`), at most [`BUDGET`](format::BUDGET) bytes per object (new entries
//! fill one up to [`OPEN_BUDGET`](format::OPEN_BUDGET)), written in groups with conditional updates.
//! docs/architecture.md describes the entry states; [`Uninstall`] removes the journal.
//!
//! By concept: `format` (the entry and the objects it is kept in), `change` (put, settle,
//! remove, and how each applies to an object), `commit` (the group commit that writes
//! them), `uninstall`; here, the journal as this process knows it and its API.

mod change;
mod commit;
mod format;
mod uninstall;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::api::{core::v1::ConfigMap, storage::v1::StorageClass};
use kube_client::{Api, Client, api::ListParams};
use tokio::sync::{Notify, oneshot};

use crate::LeaderElection;
use change::{Change, later_due, removable, settle_entry};
pub(crate) use commit::FULL_GROUP;
use commit::Pending;
pub(crate) use format::JOURNAL_LABEL;
pub(crate) use format::{Entry, class_key, now_secs};
use format::{Shard, label_value, object_seq};
pub use uninstall::{JournalRecord, Uninstall, UninstallReport};

/// How long an API call of the journal may take when the config sets no limit.
const DEFAULT_CALL_LIMIT: Duration = Duration::from_secs(30);

/// What the journal holds, as this process knows it.
#[derive(Default)]
struct State {
    shards: BTreeMap<u64, Shard>,
    /// Claim uid -> the object holding its entry.
    index: HashMap<String, u64>,
    /// Objects a writer found full (a 422 for size): new entries go elsewhere.
    full: HashSet<u64>,
    /// Settles and removals enqueued and not written yet, by claim uid: what the entry
    /// will be (`None`: gone). Lookups see them at once, so a claim synced again before
    /// the lazy write is not swept or settled twice.
    overlay: HashMap<String, Option<Entry>>,
}

impl State {
    fn entry(&self, uid: &str) -> Option<&Entry> {
        if let Some(pending) = self.overlay.get(uid) {
            return pending.as_ref();
        }
        self.shards.get(self.index.get(uid)?)?.entries.get(uid)
    }

    fn set_shard(&mut self, seq: u64, shard: Shard) {
        if let Some(old) = self.shards.get(&seq) {
            for uid in old.entries.keys() {
                if self.index.get(uid) == Some(&seq) {
                    self.index.remove(uid);
                }
            }
        }
        if shard.version.is_none() && shard.entries.is_empty() {
            self.shards.remove(&seq);
            return;
        }
        for uid in shard.entries.keys() {
            self.index.insert(uid.clone(), seq);
        }
        self.shards.insert(seq, shard);
    }

    fn len(&self) -> usize {
        self.shards.values().map(|s| s.entries.len()).sum()
    }

    /// The object new entries go to: the newest one that is not full.
    fn open(&self) -> u64 {
        match self.shards.keys().next_back() {
            Some(&seq) if self.full.contains(&seq) => seq + 1,
            Some(&seq) => seq,
            None => 0,
        }
    }
}

/// Where the journal lives and how it is written ([`Journal::new`]).
pub(crate) struct JournalConfig {
    pub(crate) namespace: String,
    pub(crate) lease_name: String,
    pub(crate) writer: String,
    pub(crate) commit_delay: Duration,
    /// Intents that are written at once, without waiting for the commit delay
    /// ([`FULL_GROUP`], or half the claim workers when they are fewer: they wait for
    /// them, and a longer wait would only idle the workers).
    pub(crate) full_group: usize,
    pub(crate) capacity: usize,
    pub(crate) call_limit: Option<Duration>,
}

/// The provisioning journal of one controller (see the module docs).
pub(crate) struct Journal {
    api: Api<ConfigMap>,
    lease_name: String,
    label_value: String,
    writer: String,
    commit_delay: Duration,
    full_group: usize,
    capacity: usize,
    call_limit: Duration,
    state: Mutex<State>,
    pending: Mutex<Vec<Pending>>,
    /// Puts enqueued and not yet written (they count toward the capacity).
    puts_pending: std::sync::atomic::AtomicUsize,
    wake: Notify,
    space: Notify,
    metrics: Option<crate::metrics::ControllerMetrics>,
}

/// The namespace and lease name the journal of `provisioner_name` uses with `election`
/// (`None`: without leader election, the lease it would have); an empty namespace is the
/// client's.
pub(crate) fn location(
    client: &Client,
    provisioner_name: &str,
    election: Option<&LeaderElection>,
) -> (String, String) {
    let election = election
        .cloned()
        .unwrap_or_default()
        .resolved_for(provisioner_name);
    let namespace = if election.namespace.trim().is_empty() {
        client.default_namespace().to_owned()
    } else {
        election.namespace.clone()
    };
    (namespace, election.lease_name)
}

impl Journal {
    pub(crate) fn new(
        client: Client,
        config: JournalConfig,
        metrics: Option<crate::metrics::ControllerMetrics>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            label_value: label_value(&config.lease_name),
            lease_name: config.lease_name,
            writer: config.writer,
            commit_delay: config.commit_delay,
            full_group: config.full_group.max(1),
            capacity: config.capacity.max(1),
            call_limit: config.call_limit.unwrap_or(DEFAULT_CALL_LIMIT),
            state: Mutex::default(),
            pending: Mutex::default(),
            puts_pending: std::sync::atomic::AtomicUsize::new(0),
            wake: Notify::new(),
            space: Notify::new(),
            metrics,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This process's writer id.
    pub(crate) fn writer(&self) -> &str {
        &self.writer
    }

    /// The entry of claim `uid`, as this process knows it.
    pub(crate) fn entry(&self, uid: &str) -> Option<Entry> {
        self.state().entry(uid).cloned()
    }

    /// The class snapshot `key` refers to in the object holding claim `uid`'s entry.
    pub(crate) fn class(&self, uid: &str, key: &str) -> Option<Arc<StorageClass>> {
        let state = self.state();
        let json = state.shards.get(state.index.get(uid)?)?.classes.get(key)?;
        match serde_json::from_str::<StorageClass>(json) {
            Ok(class) => Some(Arc::new(class)),
            Err(err) => {
                tracing::warn!(claim_uid = uid, error = %err, "the class recorded in the journal is no StorageClass; ignoring it");
                None
            }
        }
    }

    /// Every entry: claim uid, entry.
    pub(crate) fn entries(&self) -> Vec<(String, Entry)> {
        let state = self.state();
        state
            .shards
            .values()
            .flat_map(|s| s.entries.iter().map(|(u, e)| (u.clone(), e.clone())))
            .collect()
    }

    /// How many entries the journal holds.
    pub(crate) fn len(&self) -> usize {
        self.state().len()
    }

    /// Reads every journal object again (at leadership start and resync): entries other
    /// processes wrote become known.
    ///
    /// # Errors
    /// The list failed; what was known stays.
    pub(crate) async fn reload(&self) -> Result<usize, kube_client::Error> {
        let params = ListParams::default().labels(&format!("{JOURNAL_LABEL}={}", self.label_value));
        let list = match tokio::time::timeout(self.call_limit, self.api.list(&params)).await {
            Ok(list) => list?,
            Err(_) => {
                return Err(kube_client::Error::Service(
                    format!("listing the journal timed out after {:?}", self.call_limit).into(),
                ));
            }
        };
        let mut state = self.state();
        let full = std::mem::take(&mut state.full);
        let overlay = std::mem::take(&mut state.overlay);
        *state = State::default();
        state.overlay = overlay;
        for cm in &list.items {
            let Some(seq) = cm
                .metadata
                .name
                .as_deref()
                .and_then(|n| object_seq(&self.lease_name, n))
            else {
                continue;
            };
            state.set_shard(seq, Shard::parse(cm));
        }
        state.full = full
            .into_iter()
            .filter(|s| state.shards.contains_key(s))
            .collect();
        let n = state.len();
        drop(state);
        self.report();
        Ok(n)
    }

    /// Writes `entry` for claim `uid` (with the class snapshot `class`: key and JSON) and
    /// returns once it is durable, sharing the write with every change pending for the
    /// same object by then. Waits while the journal is full.
    ///
    /// # Errors
    /// The write failed (the message says why); nothing may be asked of the driver.
    pub(crate) async fn put(
        &self,
        uid: &str,
        entry: Entry,
        class: Option<(String, String)>,
    ) -> Result<(), String> {
        use std::sync::atomic::Ordering;
        let mut warned = false;
        loop {
            let space = self.space.notified();
            let used = self.len() + self.puts_pending.load(Ordering::Acquire);
            if used < self.capacity || self.state().index.contains_key(uid) {
                break;
            }
            if !warned {
                tracing::warn!(
                    entries = used,
                    capacity = self.capacity,
                    "the provisioning journal is full; provisioning waits for room"
                );
                warned = true;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), space).await;
        }
        let (tx, rx) = oneshot::channel();
        self.state().overlay.remove(uid);
        self.puts_pending.fetch_add(1, Ordering::AcqRel);
        self.enqueue(
            Change::Put {
                uid: uid.to_owned(),
                entry: Box::new(entry),
                class,
            },
            self.commit_delay,
            Some(tx),
        );
        let result = rx
            .await
            .unwrap_or_else(|_| Err("the journal stopped before the write".to_owned()));
        self.puts_pending.fetch_sub(1, Ordering::AcqRel);
        result
    }

    /// Settles claim `uid`'s entry with its last sweep due `window` seconds from now (and
    /// at least `window` seconds after its latest attempt); written lazily with company,
    /// not waited for. Returns now + `window` (Unix seconds), for the claim's next sync.
    pub(crate) fn settle(&self, uid: &str, window: i64) -> i64 {
        let now_due = now_secs().saturating_add(window);
        let fallback = {
            let mut state = self.state();
            let Some(entry) = state.entry(uid).cloned() else {
                return now_due;
            };
            let due = later_due(&entry, now_due, window);
            if entry.due.is_some_and(|d| d >= due) {
                return now_due;
            }
            let class = entry.class.as_ref().and_then(|key| {
                let shard = state.shards.get(state.index.get(uid)?)?;
                Some((key.clone(), shard.classes.get(key)?.clone()))
            });
            let mut settled = entry.clone();
            settle_entry(&mut settled, due);
            state.overlay.insert(uid.to_owned(), Some(settled));
            Box::new((entry, class))
        };
        self.enqueue(
            Change::Settle {
                uid: uid.to_owned(),
                due: now_due,
                window,
                fallback: Some(fallback),
            },
            self.lazy_delay(),
            None,
        );
        now_due
    }

    /// Removes claim `uid`'s entry (`if_due`: only a settled one due at most then); written
    /// lazily with company, not waited for.
    pub(crate) fn remove(&self, uid: &str, if_due: Option<i64>) {
        self.remove_if(uid, if_due, None, None);
    }

    /// Removes claim `uid`'s entry if it is an intent this process wrote: the driver
    /// answered that it holds no asset, which says nothing of a create another replica
    /// sent (its intent, or the settled entry of the PV it saved, stays).
    pub(crate) fn remove_own_intent(&self, uid: &str) {
        self.remove_if(uid, None, Some(self.writer.clone()), None);
    }

    /// Removes claim `uid`'s entry if it is still `seen`, the entry a cleanup read before
    /// it found no asset: an entry rewritten since (another replica began an attempt,
    /// whose create may land after that lookup) stays.
    pub(crate) fn remove_unchanged(&self, uid: &str, seen: &Entry) {
        self.remove_if(uid, None, None, Some(Box::new(seen.clone())));
    }

    fn remove_if(
        &self,
        uid: &str,
        if_due: Option<i64>,
        intent_of: Option<String>,
        unchanged: Option<Box<Entry>>,
    ) {
        {
            let mut state = self.state();
            let Some(entry) = state.entry(uid) else {
                return;
            };
            if !removable(entry, if_due, intent_of.as_deref(), unchanged.as_deref()) {
                return;
            }
            state.overlay.insert(uid.to_owned(), None);
        }
        self.enqueue(
            Change::Remove {
                uid: uid.to_owned(),
                if_due,
                intent_of,
                unchanged,
            },
            self.lazy_delay(),
            None,
        );
    }

    /// Updates the journal metrics: entries and the age of the oldest, by state.
    pub(crate) fn report(&self) {
        let Some(m) = &self.metrics else {
            return;
        };
        let now = now_secs();
        let (mut intents, mut settled) = (0i64, 0i64);
        let (mut oldest_intent, mut oldest_settled) = (now, now);
        for shard in self.state().shards.values() {
            for entry in shard.entries.values() {
                if entry.is_intent() {
                    intents += 1;
                    oldest_intent = oldest_intent.min(entry.since);
                } else {
                    settled += 1;
                    oldest_settled = oldest_settled.min(entry.since);
                }
            }
        }
        m.set_journal("intent", intents, now.saturating_sub(oldest_intent));
        m.set_journal("settled", settled, now.saturating_sub(oldest_settled));
    }
}
