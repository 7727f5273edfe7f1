//! The provisioning journal: ConfigMaps in the controller's namespace (the Lease's), named
//! `<lease name>-journal-<seq>` and labelled [`JOURNAL_LABEL`]` = <lease name>`, each
//! holding one entry per claim whose provisioning started (`e.<claim uid>`) and the class
//! snapshots they refer to (`k.<hash>`), at most [`BUDGET`] bytes per object (new entries
//! fill one up to [`OPEN_BUDGET`]), written in groups with conditional updates.
//! docs/architecture.md describes the entry states; [`Uninstall`] removes the journal.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim},
    api::storage::v1::StorageClass,
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot};
use tracing::Instrument as _;

use crate::{LeaderElection, annotations::FINALIZER_PV};

/// The label every journal object carries, with the lease name (or, when that is no valid
/// label value, a hash of it) as value. The domain is the project's own.
pub(crate) const JOURNAL_LABEL: &str =
    "provisioning-journal.rust-storage-controllers.github.io/lease";

/// The most bytes of data (keys and values) one journal object holds: well under the API
/// server's 1 MiB limit of a ConfigMap, so an object stays below 512 KiB.
pub(crate) const BUDGET: usize = 384 * 1024;

/// New entries go to an object while it holds at most this many bytes of data; then the
/// next object opens. Every group write sends its whole object, so a small open object
/// keeps what the API server and etcd decode and store per write small (an object of
/// [`BUDGET`] bytes rewritten for every group would cost the server more than the
/// volumes themselves); objects the entries left are deleted.
pub(crate) const OPEN_BUDGET: usize = 16 * 1024;

/// The prefix of an entry's key; the claim's uid follows.
const ENTRY_PREFIX: &str = "e.";
/// The prefix of a class snapshot's key; a hash of the snapshot follows.
const CLASS_PREFIX: &str = "k.";
/// How long an API call of the journal may take when the config sets no limit.
const DEFAULT_CALL_LIMIT: Duration = Duration::from_secs(30);
/// Settles and removals wait this many times the commit delay for company, and at least
/// [`LAZY_MIN`].
const LAZY_FACTOR: u32 = 10;
/// The shortest wait of a settle or removal for company: no claim waits for them, and
/// they ride along with the intents written meanwhile.
const LAZY_MIN: Duration = Duration::from_secs(1);

/// One claim's record (see the module docs); the JSON keys are short, as there may be
/// hundreds of thousands of entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The claim's `namespace/name`.
    #[serde(rename = "n")]
    pub(crate) claim: String,
    /// The PV name.
    #[serde(rename = "v")]
    pub(crate) pv: String,
    /// When the intent was written (Unix seconds).
    #[serde(rename = "t")]
    pub(crate) since: i64,
    /// The process that wrote it.
    #[serde(rename = "w", default)]
    pub(crate) writer: String,
    /// The key of the class snapshot the provisioning started with.
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub(crate) class: Option<String>,
    /// The node the scheduler chose (while provisioning).
    #[serde(rename = "o", default, skip_serializing_if = "Option::is_none")]
    pub(crate) node: Option<String>,
    /// The claim's spec (while provisioning).
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub(crate) spec: Option<serde_json::Value>,
    /// Settled: when the last sweep is due (Unix seconds).
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    pub(crate) due: Option<i64>,
    /// When the latest provisioning attempt began (Unix seconds), when later than
    /// `since`: every attempt that may make the driver create writes it first, so a
    /// replica that finds no asset waits the late-asset window from it (a create sent
    /// since then may still land).
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempt: Option<i64>,
}

impl Entry {
    /// Whether the driver may be creating an asset no PV records (not settled).
    pub(crate) fn is_intent(&self) -> bool {
        self.due.is_none()
    }

    /// When the latest attempt that may have sent a create began (Unix seconds).
    pub(crate) fn last_attempt(&self) -> i64 {
        self.attempt.map_or(self.since, |a| a.max(self.since))
    }

    /// The claim as far as the entry knows it (namespace, name, uid, spec and selected
    /// node): what a cleanup passes to the driver when the claim is gone.
    pub(crate) fn claim(&self, uid: &str) -> PersistentVolumeClaim {
        let (namespace, name) = self.claim.split_once('/').unwrap_or(("", &self.claim));
        let annotations = self.node.as_ref().map(|node| {
            [(
                crate::annotations::ANN_SELECTED_NODE.to_owned(),
                node.clone(),
            )]
            .into()
        });
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
                annotations,
                ..ObjectMeta::default()
            },
            spec: self
                .spec
                .clone()
                .and_then(|s| serde_json::from_value(s).ok()),
            status: None,
        }
    }
}

/// The current time in Unix seconds.
pub(crate) fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

/// A stable 64-bit hash (FNV-1a), for class snapshot keys.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The key of a class snapshot's JSON.
pub(crate) fn class_key(json: &str) -> String {
    format!("{:016x}", fnv(json.as_bytes()))
}

/// One journal object as this process last read or wrote it.
#[derive(Clone, Debug, Default)]
struct Shard {
    /// Its resourceVersion; `None` while it does not exist.
    version: Option<String>,
    entries: BTreeMap<String, Entry>,
    classes: BTreeMap<String, String>,
}

impl Shard {
    fn parse(cm: &ConfigMap) -> Self {
        let mut shard = Self {
            version: cm.metadata.resource_version.clone(),
            ..Self::default()
        };
        for (key, value) in cm.data.iter().flatten() {
            if let Some(uid) = key.strip_prefix(ENTRY_PREFIX) {
                match serde_json::from_str::<Entry>(value) {
                    Ok(entry) => {
                        shard.entries.insert(uid.to_owned(), entry);
                    }
                    Err(err) => {
                        tracing::warn!(journal = cm.metadata.name.as_deref().unwrap_or_default(), key, error = %err,
                            "a journal entry that is no entry (edited by hand?); ignoring it");
                    }
                }
            } else if let Some(hash) = key.strip_prefix(CLASS_PREFIX) {
                shard.classes.insert(hash.to_owned(), value.clone());
            }
        }
        shard
    }

    /// The object's data: every entry, and the class snapshots they refer to.
    fn data(&self) -> BTreeMap<String, String> {
        let used: HashSet<&str> = self
            .entries
            .values()
            .filter_map(|e| e.class.as_deref())
            .collect();
        let mut data = BTreeMap::new();
        for (uid, entry) in &self.entries {
            let json = serde_json::to_string(entry).expect("an entry serializes");
            data.insert(format!("{ENTRY_PREFIX}{uid}"), json);
        }
        for (key, json) in &self.classes {
            if used.contains(key.as_str()) {
                data.insert(format!("{CLASS_PREFIX}{key}"), json.clone());
            }
        }
        data
    }
}

/// The bytes of an object's data as the budget counts them (keys and values).
fn data_bytes(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// A change of one claim's entry.
#[derive(Clone, Debug)]
pub(crate) enum Change {
    /// Writes the entry (and its class snapshot).
    Put {
        uid: String,
        entry: Box<Entry>,
        class: Option<(String, String)>,
    },
    /// Marks the entry settled with its last sweep due at this time, or `window`
    /// seconds after the entry's latest attempt when that is later (another replica may
    /// have begun one since this process looked), keeping a later due time. Without an
    /// entry (another replica removed the intent it wrote while this one saved the PV),
    /// `fallback` (the entry and class snapshot as this process knew them) is written
    /// settled, so the last sweep is not lost; without one, a no-op.
    Settle {
        uid: String,
        due: i64,
        window: i64,
        fallback: Option<Fallback>,
    },
    /// Removes the entry (no-op without entry). With `if_due`, only a settled entry
    /// whose due time is at most this (a newer intent stays); with `intent_of`, only an
    /// intent that writer wrote (another replica's intent, or a settled entry, stays);
    /// with `unchanged`, only that very entry (one rewritten since, by an attempt of
    /// another replica, stays).
    Remove {
        uid: String,
        if_due: Option<i64>,
        intent_of: Option<String>,
        unchanged: Option<Box<Entry>>,
    },
}

/// What a settle writes when the entry is gone: the entry and its class snapshot (key,
/// JSON) as the settling process knew them.
pub(crate) type Fallback = Box<(Entry, Option<(String, String)>)>;

/// Whether a removal with these conditions takes `entry` ([`Change::Remove`]).
fn removable(
    entry: &Entry,
    if_due: Option<i64>,
    intent_of: Option<&str>,
    unchanged: Option<&Entry>,
) -> bool {
    let due_ok = if_due.is_none_or(|limit| entry.due.is_some_and(|d| d <= limit));
    let writer_ok = intent_of.is_none_or(|w| entry.is_intent() && entry.writer == w);
    let same_ok = unchanged.is_none_or(|u| u == entry);
    due_ok && writer_ok && same_ok
}

/// The due time of a settle at `due`: later when `entry` records an attempt whose
/// create may land after it (`window` seconds after the attempt).
fn later_due(entry: &Entry, due: i64, window: i64) -> i64 {
    entry
        .attempt
        .map_or(due, |a| due.max(a.saturating_add(window)))
}

/// `entry` settled for a last sweep at `due`: the node goes, and of the spec what
/// describes the volume stays (the last sweep of a claim that is gone asks the driver
/// about the claim as the entry describes it: the class name, when no snapshot was kept,
/// and what a PV for the asset is made of).
fn settle_entry(entry: &mut Entry, due: i64) {
    entry.due = Some(due);
    entry.node = None;
    entry.spec = entry.spec.take().and_then(|spec| {
        let kept: serde_json::Map<String, serde_json::Value> = SETTLED_SPEC
            .iter()
            .filter_map(|key| Some(((*key).to_owned(), spec.get(*key)?.clone())))
            .collect();
        (!kept.is_empty()).then_some(serde_json::Value::Object(kept))
    });
}

impl Change {
    fn uid(&self) -> &str {
        match self {
            Self::Put { uid, .. } | Self::Settle { uid, .. } | Self::Remove { uid, .. } => uid,
        }
    }

    /// Applies the change to `shard`; whether it changed anything.
    fn apply(&self, shard: &mut Shard) -> bool {
        match self {
            Self::Put { uid, entry, class } => {
                if let Some((key, json)) = class {
                    shard.classes.insert(key.clone(), json.clone());
                }
                let entry = Entry::clone(entry);
                shard.entries.insert(uid.clone(), entry.clone()) != Some(entry)
            }
            Self::Settle {
                uid,
                due,
                window,
                fallback,
            } => match shard.entries.get_mut(uid) {
                Some(entry) => {
                    let due = later_due(entry, *due, *window);
                    if entry.due.is_some_and(|d| d >= due) {
                        return false;
                    }
                    settle_entry(entry, due);
                    true
                }
                None => {
                    let Some(fallback) = fallback else {
                        return false;
                    };
                    let (mut entry, class) = (**fallback).clone();
                    let due = later_due(&entry, *due, *window);
                    settle_entry(&mut entry, due);
                    if let Some((key, json)) = class {
                        shard.classes.insert(key, json);
                    }
                    shard.entries.insert(uid.clone(), entry);
                    true
                }
            },
            Self::Remove {
                uid,
                if_due,
                intent_of,
                unchanged,
            } => {
                let remove = shard.entries.get(uid).is_some_and(|e| {
                    removable(e, *if_due, intent_of.as_deref(), unchanged.as_deref())
                });
                if remove {
                    shard.entries.remove(uid);
                }
                remove
            }
        }
    }
}

/// A change waiting for its write.
struct Pending {
    change: Change,
    due: tokio::time::Instant,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

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

/// The fields of a claim's spec a settled entry keeps: what a PV for its asset is made of.
const SETTLED_SPEC: [&str; 4] = ["storageClassName", "accessModes", "volumeMode", "resources"];

/// A group of this many intents is written at once, without waiting for the commit
/// delay. Claims wait for their intent's write, so a group that fills faster than the
/// delay only costs them time; 8 keeps the writes at most one per 8 intents at 80
/// claims/s and more (and one per delay's worth below that).
pub(crate) const FULL_GROUP: usize = 8;

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

/// The label value for a lease name: the name itself when it is a valid label value,
/// else a hash of it.
fn label_value(lease_name: &str) -> String {
    let valid = !lease_name.is_empty()
        && lease_name.len() <= 63
        && lease_name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && lease_name.as_bytes()[0].is_ascii_alphanumeric()
        && lease_name.as_bytes()[lease_name.len() - 1].is_ascii_alphanumeric();
    if valid {
        lease_name.to_owned()
    } else {
        format!("h-{:016x}", fnv(lease_name.as_bytes()))
    }
}

/// The name of journal object `seq` for `lease_name`.
fn object_name(lease_name: &str, seq: u64) -> String {
    let base: String = lease_name.chars().take(200).collect();
    format!("{base}-journal-{seq:08}")
}

/// The `seq` of a journal object's name, when it is one of `lease_name`'s.
fn object_seq(lease_name: &str, name: &str) -> Option<u64> {
    let base: String = lease_name.chars().take(200).collect();
    let seq = name.strip_prefix(&base)?.strip_prefix("-journal-")?;
    (seq.len() == 8 && seq.bytes().all(|b| b.is_ascii_digit()))
        .then(|| seq.parse().ok())
        .flatten()
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

    fn pending(&self) -> MutexGuard<'_, Vec<Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long a settle or removal waits for company.
    fn lazy_delay(&self) -> Duration {
        (self.commit_delay * LAZY_FACTOR).max(LAZY_MIN)
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

    fn enqueue(
        &self,
        change: Change,
        delay: Duration,
        done: Option<oneshot::Sender<Result<(), String>>>,
    ) {
        self.pending().push(Pending {
            change,
            due: tokio::time::Instant::now() + delay,
            done,
        });
        self.wake.notify_one();
    }

    /// Writes pending changes until dropped: each object's changes once the first of them
    /// is due, all in one conditional write.
    pub(crate) async fn run_committer(self: Arc<Self>) {
        loop {
            let notified = self.wake.notified();
            let next = self.pending().iter().map(|p| p.due).min();
            match next {
                None => notified.await,
                Some(at) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
            }
            let batches = self.due_batches();
            if batches.is_empty() {
                continue;
            }
            let writes = batches
                .into_iter()
                .map(|(seq, changes)| self.write_batch(seq, changes));
            futures::future::join_all(writes).await;
            self.report();
        }
    }

    /// Takes the pending changes of every object that has one due, grouped by object
    /// (`None`: new entries, for the open object).
    fn due_batches(&self) -> Vec<(Option<u64>, Vec<Pending>)> {
        let now = tokio::time::Instant::now();
        let mut pending = self.pending();
        let targets: Vec<Option<u64>> = {
            let state = self.state();
            pending
                .iter()
                .map(|p| state.index.get(p.change.uid()).copied())
                .collect()
        };
        // A full group of intents goes at once: the claim workers wait for it.
        let full = pending.iter().filter(|p| p.done.is_some()).count() >= self.full_group;
        let mut due: HashSet<Option<u64>> = HashSet::new();
        for (p, target) in pending.iter().zip(&targets) {
            if p.due <= now || (full && p.done.is_some()) {
                due.insert(*target);
            }
        }
        let mut batches: BTreeMap<Option<u64>, Vec<Pending>> = BTreeMap::new();
        let mut kept = Vec::new();
        for (p, target) in pending.drain(..).zip(targets) {
            if due.contains(&target) {
                batches.entry(target).or_default().push(p);
            } else {
                kept.push(p);
            }
        }
        *pending = kept;
        batches.into_iter().collect()
    }

    /// Writes `batch` to object `seq` (`None`: the open object), retrying conflicts on a
    /// fresh read; completes every waiter.
    async fn write_batch(&self, seq: Option<u64>, mut batch: Vec<Pending>) {
        let mut failures = 0u32;
        loop {
            let (target, base) = {
                let state = self.state();
                let target = seq.unwrap_or_else(|| state.open());
                (
                    target,
                    state.shards.get(&target).cloned().unwrap_or_default(),
                )
            };
            let mut shard = base.clone();
            // Changes for uids another object holds now (a reload moved them) go there.
            let mut changed = false;
            for p in &batch {
                changed |= p.change.apply(&mut shard);
            }
            if !changed {
                let mut state = self.state();
                for p in batch.iter().filter(|p| p.done.is_none()) {
                    state.overlay.remove(p.change.uid());
                }
                drop(state);
                finish(batch, &Ok(()));
                return;
            }
            let data = shard.data();
            if seq.is_none() && !base.entries.is_empty() && data_bytes(&data) > OPEN_BUDGET {
                // The open object is full: new entries start the next one.
                self.state().full.insert(target);
                continue;
            }
            let name = object_name(&self.lease_name, target);
            let result = if seq.is_some() && data_bytes(&data) > BUDGET {
                // Over the hard limit (only puts into an old object can take it there):
                // handled as the server's answer for an object too large.
                Err(WriteError::TooLarge)
            } else {
                let span = tracing::debug_span!("journal_write", changes = batch.len());
                self.write_object(&name, &shard, data)
                    .instrument(span)
                    .await
            };
            match result {
                Ok(written) => {
                    if let Some(m) = &self.metrics {
                        m.journal_write();
                    }
                    let removed = batch
                        .iter()
                        .any(|p| matches!(p.change, Change::Remove { .. }));
                    {
                        let mut state = self.state();
                        state.set_shard(target, written);
                        for p in batch.iter().filter(|p| p.done.is_none()) {
                            state.overlay.remove(p.change.uid());
                        }
                    }
                    finish(batch, &Ok(()));
                    if removed {
                        self.space.notify_waiters();
                    }
                    return;
                }
                Err(WriteError::Stale) => {
                    // Another writer changed it: read it again and apply our changes to that.
                    match self.read_object(&name).await {
                        Ok(fresh) => self.state().set_shard(target, fresh),
                        Err(err) => failures = self.failed(failures, &name, &err).await,
                    }
                }
                Err(WriteError::TooLarge) => {
                    self.state().full.insert(target);
                    if seq.is_some() {
                        // An existing entry's object is full: only puts can grow it; they
                        // are retried through the open object.
                        for p in &mut batch {
                            if let Change::Put { .. } = p.change {
                                self.state().index.remove(p.change.uid());
                            }
                        }
                        let (puts, rest): (Vec<_>, Vec<_>) = batch
                            .into_iter()
                            .partition(|p| matches!(p.change, Change::Put { .. }));
                        if !puts.is_empty() {
                            self.pending().extend(puts);
                            self.wake.notify_one();
                        }
                        batch = rest;
                        if batch.is_empty() {
                            return;
                        }
                    }
                }
                Err(WriteError::Other(err)) => {
                    failures = self.failed(failures, &name, &err).await;
                    if failures >= 5 {
                        // Waiters get the error (a claim retries); lazy changes come back later.
                        let (waiting, lazy): (Vec<_>, Vec<_>) =
                            batch.into_iter().partition(|p| p.done.is_some());
                        finish(waiting, &Err(err));
                        let later = tokio::time::Instant::now() + Duration::from_secs(5);
                        let mut pending = self.pending();
                        pending.extend(lazy.into_iter().map(|mut p| {
                            p.due = later;
                            p
                        }));
                        return;
                    }
                }
            }
        }
    }

    /// Logs a failed journal call and waits before the next attempt; the failures so far.
    async fn failed(&self, failures: u32, name: &str, err: &str) -> u32 {
        let failures = failures + 1;
        tracing::warn!(
            journal = name,
            failures,
            error = err,
            "a journal write failed; retrying"
        );
        tokio::time::sleep(Duration::from_millis(100) * failures.min(10)).await;
        failures
    }

    async fn read_object(&self, name: &str) -> Result<Shard, String> {
        match tokio::time::timeout(self.call_limit, self.api.get_opt(name)).await {
            Ok(Ok(Some(cm))) => Ok(Shard::parse(&cm)),
            Ok(Ok(None)) => Ok(Shard::default()),
            Ok(Err(err)) => Err(kube_controller_kit::error::chain(&err)),
            Err(_) => Err(format!("reading {name} timed out")),
        }
    }

    /// One conditional write of object `name`: a create when it does not exist, an update
    /// with the version read, a delete (with that version) when it is left empty.
    async fn write_object(
        &self,
        name: &str,
        shard: &Shard,
        data: BTreeMap<String, String>,
    ) -> Result<Shard, WriteError> {
        let limit = self.call_limit;
        let timed_out = || WriteError::Other(format!("writing journal object {name} timed out"));
        if data.is_empty() {
            let Some(version) = &shard.version else {
                return Ok(Shard::default());
            };
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(version.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            return match tokio::time::timeout(limit, self.api.delete(name, &params)).await {
                Err(_) => Err(timed_out()),
                Ok(Ok(_)) => Ok(Shard::default()),
                Ok(Err(err)) => Err(classify(&err, true)),
            };
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                resource_version: shard.version.clone(),
                labels: Some([(JOURNAL_LABEL.to_owned(), self.label_value.clone())].into()),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        let params = PostParams::default();
        let answer = if shard.version.is_some() {
            tokio::time::timeout(limit, self.api.replace(name, &params, &cm)).await
        } else {
            tokio::time::timeout(limit, self.api.create(&params, &cm)).await
        };
        match answer {
            Err(_) => Err(timed_out()),
            Ok(Ok(written)) => {
                let mut shard = shard.clone();
                shard.version = written.metadata.resource_version;
                Ok(shard)
            }
            Ok(Err(err)) => Err(classify(&err, false)),
        }
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

/// Completes the waiters of `batch` with `result`.
fn finish(batch: Vec<Pending>, result: &Result<(), String>) {
    for p in batch {
        if let Some(done) = p.done {
            let _ = done.send(result.clone());
        }
    }
}

/// Why a conditional write failed.
enum WriteError {
    /// Another writer changed (or created, or deleted) the object first.
    Stale,
    /// The object would exceed the server's size limit.
    TooLarge,
    Other(String),
}

fn classify(err: &kube_client::Error, deleting: bool) -> WriteError {
    match err {
        kube_client::Error::Api(s) if s.code == 409 => WriteError::Stale,
        kube_client::Error::Api(s) if s.code == 404 && !deleting => WriteError::Stale,
        kube_client::Error::Api(s) if s.code == 404 => WriteError::Stale,
        kube_client::Error::Api(s) if s.code == 413 => WriteError::TooLarge,
        kube_client::Error::Api(s) if s.code == 422 && s.message.contains("Too long") => {
            WriteError::TooLarge
        }
        other => WriteError::Other(kube_controller_kit::error::chain(other)),
    }
}

/// One entry the journal still held when [`Uninstall::run`] removed it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalRecord {
    /// The claim's `namespace/name`.
    pub claim: String,
    /// The claim's uid.
    pub claim_uid: String,
    /// The PV name its asset has (or would have).
    pub pv_name: String,
    /// `true`: a provisioning had started and no PV recorded its asset yet: the backend
    /// may hold an asset for `pv_name` that nothing in the cluster names; check it.
    /// `false`: a PV recorded the asset; only the last late-asset sweep was still due.
    pub in_flight: bool,
}

/// What [`Uninstall::run`] found and removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UninstallReport {
    /// The journal objects deleted.
    pub objects_deleted: Vec<String>,
    /// The entries they held.
    pub records: Vec<JournalRecord>,
    /// The PVs whose finalizer
    /// [`FINALIZER_PV`] was removed.
    pub finalizers_removed: Vec<String>,
}

/// Removes what a provision controller leaves in a cluster once it no longer runs: its
/// journal objects and, when asked, the PV finalizer it shares with Go's library. Claims
/// carry nothing of the controller's.
///
/// Stop every replica first (scale the Deployment to 0): a running controller writes its
/// journal again. Then run this, read the report (entries still
/// [`in_flight`](JournalRecord::in_flight) name assets the backend may hold without a
/// PV), and delete the Lease and the RBAC objects (see `docs/production.md`).
///
/// ```no_run
/// # async fn doc(client: kube_client::Client) -> Result<(), kube_client::Error> {
/// use provision_controller::Uninstall;
/// let report = Uninstall::new(client, "example.com/nfs")
///     .namespace("storage")
///     .remove_pv_finalizers(true)
///     .run()
///     .await?;
/// for record in report.records.iter().filter(|r| r.in_flight) {
///     println!("check the backend for {} (claim {})", record.pv_name, record.claim);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Uninstall {
    client: Client,
    provisioner_name: String,
    additional_names: Vec<String>,
    election: LeaderElection,
    journal_namespace: Option<String>,
    remove_pv_finalizers: bool,
}

impl Uninstall {
    /// Uninstalls the controller of `provisioner_name`, whose journal is in the client's
    /// namespace under the default lease name, unless set otherwise.
    #[must_use]
    pub fn new(client: Client, provisioner_name: impl Into<String>) -> Self {
        Self {
            client,
            provisioner_name: provisioner_name.into(),
            additional_names: Vec::new(),
            election: LeaderElection::default(),
            journal_namespace: None,
            remove_pv_finalizers: false,
        }
    }

    /// The other names the controller answered to
    /// ([`Config::additional_provisioner_names`](crate::Config)): their PVs are the
    /// controller's too when [`remove_pv_finalizers`](Self::remove_pv_finalizers) is set.
    #[must_use]
    pub fn additional_provisioner_names(mut self, names: Vec<String>) -> Self {
        self.additional_names = names;
        self
    }

    /// The controller's namespace (its Lease's), when not the client's.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.election.namespace = namespace.into();
        self
    }

    /// The journal's namespace, when the controller had one set
    /// ([`Config::journal_namespace`](crate::Config::journal_namespace)).
    #[must_use]
    pub fn journal_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.journal_namespace = Some(namespace.into());
        self
    }

    /// The controller's lease name, when it was set with `LeaderElection::lease_name`.
    #[must_use]
    pub fn lease_name(mut self, lease_name: impl Into<String>) -> Self {
        self.election.lease_name = lease_name.into();
        self
    }

    /// Also removes [`FINALIZER_PV`] from every PV the
    /// controller would delete (made by this provisioner, `pv.kubernetes.io/provisioned-by`,
    /// migrated to it, or a static CSI PV of its driver name): for an uninstall that
    /// installs no other provisioner of the same name (Go's library and the CSI
    /// external-provisioner use the same finalizer and would keep using it). A PV being
    /// deleted then goes without its asset being deleted. Default off.
    #[must_use]
    pub fn remove_pv_finalizers(mut self, remove: bool) -> Self {
        self.remove_pv_finalizers = remove;
        self
    }

    /// Reports and deletes the journal, then removes the PV finalizers when asked.
    ///
    /// # Errors
    /// The first API call that failed; what was removed before stays removed, and running
    /// it again continues.
    pub async fn run(self) -> Result<UninstallReport, kube_client::Error> {
        let (namespace, lease_name) =
            location(&self.client, &self.provisioner_name, Some(&self.election));
        let namespace = self.journal_namespace.clone().unwrap_or(namespace);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
        let params =
            ListParams::default().labels(&format!("{JOURNAL_LABEL}={}", label_value(&lease_name)));
        let mut report = UninstallReport::default();
        // An object is deleted as it was read (resourceVersion precondition): one that a
        // replica still running wrote meanwhile is read again, so that what it holds is
        // reported before it goes.
        let mut todo: Vec<ConfigMap> = api.list(&params).await?.items;
        let mut rounds = 0;
        while let Some(cm) = todo.pop() {
            let Some(name) = cm.metadata.name.clone() else {
                continue;
            };
            if object_seq(&lease_name, &name).is_none() {
                continue;
            }
            let delete = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: cm.metadata.resource_version.clone(),
                    uid: cm.metadata.uid.clone(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &delete).await {
                Ok(_) => {}
                Err(kube_client::Error::Api(s)) if s.code == 404 => continue,
                Err(kube_client::Error::Api(s)) if s.code == 409 && rounds < 10 => {
                    rounds += 1;
                    if let Some(again) = api.get_opt(&name).await? {
                        todo.push(again);
                    }
                    continue;
                }
                Err(err) => return Err(err),
            }
            for (uid, entry) in Shard::parse(&cm).entries {
                report.records.push(JournalRecord {
                    claim: entry.claim.clone(),
                    claim_uid: uid,
                    pv_name: entry.pv.clone(),
                    in_flight: entry.is_intent(),
                });
            }
            report.objects_deleted.push(name);
        }
        if self.remove_pv_finalizers {
            let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
            for pv in volumes.list(&ListParams::default()).await?.items {
                let names = crate::controller::names::Names {
                    primary: &self.provisioner_name,
                    additional: &self.additional_names,
                };
                let ours = crate::controller::names::is_ours(&pv, names);
                if !ours || !crate::annotations::has_finalizer(&pv, FINALIZER_PV) {
                    continue;
                }
                let name = pv.metadata.name.clone().unwrap_or_default();
                let patch = serde_json::json!({"metadata": {
                    "$deleteFromPrimitiveList/finalizers": [FINALIZER_PV]
                }});
                match volumes
                    .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                {
                    Ok(_) => report.finalizers_removed.push(name),
                    Err(kube_client::Error::Api(s)) if s.code == 404 => {}
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(claim: &str) -> Entry {
        Entry {
            claim: claim.to_owned(),
            pv: "pvc-0d5bcfb2-5d25-4e4a-9b8e-2a4f3b1c7e10".to_owned(),
            since: 1_712_345_678,
            writer: "a1b2c3d4".to_owned(),
            class: Some("0123456789abcdef".to_owned()),
            node: None,
            spec: None,
            due: Some(1_712_346_038),
            attempt: None,
        }
    }

    #[test]
    fn a_settled_entry_is_small_enough_for_the_target_rate() {
        // What settling keeps of a typical claim's spec.
        let settled = Entry {
            spec: Some(serde_json::json!({
                "storageClassName": "fast-ssd",
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": "10Gi"}},
            })),
            ..entry("namespace-of-a-claim/claim-name-12345")
        };
        let json = serde_json::to_string(&settled).unwrap();
        let bytes = ENTRY_PREFIX.len() + 36 + json.len();
        println!("a settled entry: {bytes} bytes");
        assert!(bytes <= 360, "{bytes} bytes: {json}");
        // 1,000 claims/s with a 6-minute window: the objects it takes. An object is filled
        // with intents up to the open budget; settling makes them smaller, never larger.
        let intent = Entry {
            spec: Some(serde_json::json!({
                "storageClassName": "fast-ssd",
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": "10Gi"}},
                "volumeName": "pvc-0b4f2a57-6c1e-4d8e-9a43-5b1f3e0c9d21",
            })),
            due: None,
            ..settled.clone()
        };
        let intent_bytes = ENTRY_PREFIX.len() + 36 + serde_json::to_string(&intent).unwrap().len();
        let per_object = OPEN_BUDGET / intent_bytes + 1;
        let objects = 360_000_usize.div_ceil(per_object);
        println!(
            "an intent: {intent_bytes} bytes; {per_object} entries per object; 360,000 settled entries: {objects} objects of at most {} KiB",
            (per_object * bytes.max(intent_bytes)) / 1024 + 1
        );
        assert!(
            per_object * bytes <= BUDGET,
            "a settled object outgrows the budget"
        );
        const { assert!(OPEN_BUDGET < BUDGET && BUDGET < 512 * 1024) };
    }

    #[test]
    fn changes_apply_as_documented() {
        let mut shard = Shard::default();
        let put = |uid: &str| Change::Put {
            uid: uid.to_owned(),
            entry: Box::new(Entry {
                due: None,
                spec: Some(serde_json::json!({
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "fast",
                    "selector": {"matchLabels": {"tier": "gold"}},
                })),
                ..entry("ns/c")
            }),
            class: Some(("0123456789abcdef".into(), "{}".into())),
        };
        assert!(put("u1").apply(&mut shard));
        assert!(
            !put("u1").apply(&mut shard),
            "the same entry again changes nothing"
        );
        let settle = |due| Change::Settle {
            uid: "u1".into(),
            due,
            window: 0,
            fallback: None,
        };
        assert!(settle(100).apply(&mut shard));
        let settled = &shard.entries["u1"];
        assert_eq!(settled.due, Some(100));
        assert_eq!(
            settled.spec,
            Some(serde_json::json!({
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "fast",
            })),
            "a settled entry keeps what describes the volume"
        );
        assert!(
            !settle(50).apply(&mut shard),
            "an earlier due time is no change"
        );
        assert!(settle(150).apply(&mut shard));
        let remove_if = |limit| Change::Remove {
            uid: "u1".into(),
            if_due: Some(limit),
            intent_of: None,
            unchanged: None,
        };
        assert!(!remove_if(100).apply(&mut shard), "not due yet at 100");
        assert!(remove_if(150).apply(&mut shard));
        assert!(shard.entries.is_empty());
        assert!(
            !Change::Settle {
                uid: "u9".into(),
                due: 1,
                window: 0,
                fallback: None,
            }
            .apply(&mut shard),
            "no entry: nothing to settle"
        );
        put("u2").apply(&mut shard);
        assert!(
            !remove_if(i64::MAX).apply(&mut shard),
            "a conditional removal leaves an intent"
        );
    }

    /// Two replicas provision one claim: one's create fails ("no asset") while the other
    /// saves a PV. Whichever order their changes reach the object in, the entry ends
    /// settled, so the last sweep (which releases a create of the failed replica that
    /// lands late) is made.
    #[test]
    fn a_failed_replica_never_drops_the_entry_of_the_pv_another_one_saved() {
        let intent = |writer: &str| Entry {
            writer: writer.to_owned(),
            due: None,
            ..entry("ns/c")
        };
        let put = |writer: &str| Change::Put {
            uid: "u1".into(),
            entry: Box::new(intent(writer)),
            class: Some(("0123456789abcdef".into(), "{}".into())),
        };
        let settle_by_a = Change::Settle {
            uid: "u1".into(),
            due: 100,
            window: 0,
            fallback: Some(Box::new((
                intent("aaaaaaaa"),
                Some(("0123456789abcdef".into(), "{}".into())),
            ))),
        };
        let no_asset_of_b = Change::Remove {
            uid: "u1".into(),
            if_due: None,
            intent_of: Some("bbbbbbbb".into()),
            unchanged: None,
        };
        // b wrote the intent last; b's removal lands first, then a's settle.
        let mut shard = Shard::default();
        put("aaaaaaaa").apply(&mut shard);
        put("bbbbbbbb").apply(&mut shard);
        assert!(no_asset_of_b.apply(&mut shard), "b's own intent goes");
        assert!(
            settle_by_a.apply(&mut shard),
            "a's settle writes its entry back"
        );
        assert_eq!(shard.entries["u1"].due, Some(100));
        assert!(shard.classes.contains_key("0123456789abcdef"));
        // a's settle lands first, then b's removal: the settled entry stays.
        let mut shard = Shard::default();
        put("bbbbbbbb").apply(&mut shard);
        assert!(settle_by_a.apply(&mut shard));
        assert!(
            !no_asset_of_b.apply(&mut shard),
            "a settled entry is not b's intent"
        );
        assert_eq!(shard.entries["u1"].due, Some(100));
        // a wrote the intent last: b's removal leaves it.
        let mut shard = Shard::default();
        put("aaaaaaaa").apply(&mut shard);
        assert!(
            !no_asset_of_b.apply(&mut shard),
            "another writer's intent stays"
        );
    }

    /// A cleanup removes only the entry it read; another replica's stamp of a new attempt
    /// keeps it, and a settle of a stamped entry waits a window after the attempt.
    #[test]
    fn a_removal_takes_only_the_entry_read_and_a_settle_waits_for_the_attempt() {
        let seen = Entry {
            due: None,
            ..entry("ns/c")
        };
        let stamped = Entry {
            attempt: Some(seen.since + 50),
            writer: String::new(),
            ..seen.clone()
        };
        let put = |e: &Entry| Change::Put {
            uid: "u1".into(),
            entry: Box::new(e.clone()),
            class: None,
        };
        let remove_seen = Change::Remove {
            uid: "u1".into(),
            if_due: None,
            intent_of: None,
            unchanged: Some(Box::new(seen.clone())),
        };
        let mut shard = Shard::default();
        put(&seen).apply(&mut shard);
        put(&stamped).apply(&mut shard);
        assert!(!remove_seen.apply(&mut shard), "a stamped entry stays");
        assert_eq!(shard.entries["u1"], stamped);
        let settle = Change::Settle {
            uid: "u1".into(),
            due: seen.since + 10,
            window: 5,
            fallback: None,
        };
        assert!(settle.apply(&mut shard));
        assert_eq!(
            shard.entries["u1"].due,
            Some(seen.since + 55),
            "due a window after the attempt"
        );
        let mut shard = Shard::default();
        put(&seen).apply(&mut shard);
        assert!(remove_seen.apply(&mut shard), "the entry read goes");
        assert!(shard.entries.is_empty());
    }

    #[test]
    fn data_round_trips_and_drops_unused_classes() {
        let mut shard = Shard::default();
        shard.entries.insert("u1".into(), entry("ns/a"));
        shard
            .classes
            .insert("0123456789abcdef".into(), "{\"provisioner\":\"x\"}".into());
        shard.classes.insert("ffffffffffffffff".into(), "{}".into());
        let data = shard.data();
        assert_eq!(data.len(), 2, "{data:?}");
        let cm = ConfigMap {
            data: Some(data),
            ..ConfigMap::default()
        };
        let back = Shard::parse(&cm);
        assert_eq!(back.entries, shard.entries);
        assert_eq!(back.classes.len(), 1);
    }

    #[test]
    fn object_names_and_labels() {
        assert_eq!(
            object_name("example.com-nfs", 7),
            "example.com-nfs-journal-00000007"
        );
        assert_eq!(
            object_seq("example.com-nfs", "example.com-nfs-journal-00000007"),
            Some(7)
        );
        assert_eq!(
            object_seq("example.com-nfs", "example.com-nfs-journal-7"),
            None
        );
        assert_eq!(
            object_seq("example.com-nfs", "other-journal-00000007"),
            None
        );
        assert_eq!(label_value("example.com-nfs"), "example.com-nfs");
        let long = "a".repeat(80);
        assert!(label_value(&long).starts_with("h-"));
        assert_eq!(label_value(&long).len(), 18);
    }

    #[test]
    fn the_entry_rebuilds_the_claim_a_cleanup_needs() {
        let mut e = entry("ns/data");
        e.node = Some("node-1".into());
        e.spec = Some(
            serde_json::json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}),
        );
        let claim = e.claim("u1");
        assert_eq!(claim.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(claim.metadata.name.as_deref(), Some("data"));
        assert_eq!(claim.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(crate::annotations::selected_node(&claim), Some("node-1"));
        assert_eq!(
            claim.spec.unwrap().access_modes,
            Some(vec!["ReadWriteOnce".to_owned()])
        );
    }
}
