//! State shared by the HTTP handlers and the [`KubeSim`](crate::KubeSim) handle.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::fault::FaultRule;
use crate::rbac::Tokens;
use crate::requests::{RequestLog, RequestRecord};
use crate::resources::ResKey;
use crate::store::State;

/// Everything the server shares; one lock for the store.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// The newest resourceVersion of each resource that has watches, so a watch wakes
    /// up on writes to its resource only (not on every write to the store).
    changed: Mutex<HashMap<ResKey, watch::Sender<u64>>>,
    /// Bumped by `cut_watches`.
    pub(crate) cut: watch::Sender<u64>,
    /// Set on shutdown.
    pub(crate) shutdown: watch::Sender<bool>,
    faults: Mutex<Vec<FaultRule>>,
    log: Mutex<RequestLog>,
    /// How often an idle watch with bookmarks gets a BOOKMARK.
    pub(crate) bookmark_interval: Duration,
    /// `host:port` the server listens on.
    pub(crate) address: String,
    /// Whether requests with a minted token are checked against RBAC ([`Builder::rbac`](crate::Builder::rbac)).
    pub(crate) rbac: bool,
    tokens: Mutex<Tokens>,
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the data half-written in a way that
    // matters more than stopping the server would, so poisoning is ignored.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// New shared state.
    pub(crate) fn new(
        window: usize,
        log_limit: usize,
        bookmark_interval: Duration,
        address: String,
    ) -> Self {
        Self {
            state: Mutex::new(State::new(window)),
            changed: Mutex::default(),
            cut: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(RequestLog::new(log_limit)),
            bookmark_interval,
            address,
            rbac: false,
            tokens: Mutex::default(),
        }
    }

    /// Locks the store.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        relock(&self.state)
    }

    /// A receiver that changes when `res` has new history events (or the history was
    /// compacted).
    pub(crate) fn subscribe(&self, res: &ResKey) -> watch::Receiver<u64> {
        relock(&self.changed)
            .entry(res.clone())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Runs `f` under the store lock and wakes the watches of the resources it wrote.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let (out, after, written) = {
            let mut state = self.state();
            let before = state.rv;
            let from = state.end_pos();
            let out = f(&mut state);
            if state.rv == before {
                return out;
            }
            // Usually one or two resources (an Event is recorded under both APIs).
            let mut written: Vec<ResKey> = Vec::new();
            if let Some(events) = state.events_from(from) {
                for event in events {
                    if !written.contains(&event.res) {
                        written.push(event.res.clone());
                    }
                }
            }
            (out, state.rv, written)
        };
        let senders = relock(&self.changed);
        if written.is_empty() {
            // The version moved without events (a compaction): every watch checks.
            for sender in senders.values() {
                sender.send_replace(after);
            }
        } else {
            for res in &written {
                if let Some(sender) = senders.get(res) {
                    sender.send_replace(after);
                }
            }
        }
        out
    }

    /// The fault rules.
    pub(crate) fn faults(&self) -> MutexGuard<'_, Vec<FaultRule>> {
        relock(&self.faults)
    }

    /// Records a request.
    pub(crate) fn record(&self, record: RequestRecord) {
        relock(&self.log).push(record);
    }

    /// The minted bearer tokens.
    pub(crate) fn tokens(&self) -> MutexGuard<'_, Tokens> {
        relock(&self.tokens)
    }

    /// The request log.
    pub(crate) fn log(&self) -> MutexGuard<'_, RequestLog> {
        relock(&self.log)
    }
}
