//! Group commit: changes wait in [`Pending`] for company and are written per object in
//! one conditional write ([`Journal::run_committer`]); intents are waited for, settles and
//! removals are lazy.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, MutexGuard},
    time::Duration,
};

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube_client::api::{DeleteParams, PostParams, Preconditions};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::{
    Journal,
    change::Change,
    format::{BUDGET, JOURNAL_LABEL, OPEN_BUDGET, Shard, data_bytes, object_name},
};

/// Settles and removals wait this many times the commit delay for company, and at least
/// [`LAZY_MIN`].
const LAZY_FACTOR: u32 = 10;
/// The shortest wait of a settle or removal for company: no claim waits for them, and
/// they ride along with the intents written meanwhile.
const LAZY_MIN: Duration = Duration::from_secs(1);

/// A change waiting for its write.
pub(super) struct Pending {
    change: Change,
    due: tokio::time::Instant,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// A group of this many intents is written at once, without waiting for the commit
/// delay. Claims wait for their intent's write, so a group that fills faster than the
/// delay only costs them time; 8 keeps the writes at most one per 8 intents at 80
/// claims/s and more (and one per delay's worth below that).
pub(crate) const FULL_GROUP: usize = 8;

impl Journal {
    pub(super) fn pending(&self) -> MutexGuard<'_, Vec<Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long a settle or removal waits for company.
    pub(super) fn lazy_delay(&self) -> Duration {
        (self.commit_delay * LAZY_FACTOR).max(LAZY_MIN)
    }

    pub(super) fn enqueue(
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
