//! The object store: objects per resource, the global resourceVersion counter and the
//! bounded event history that watches replay from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::events;
use crate::resources::{Registry, ResKey};

/// A stored object with its JSON, serialised once per write.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) value: Value,
    pub(crate) bytes: Bytes,
}

impl Stored {
    /// Serialises `value`.
    pub(crate) fn new(value: Value) -> Arc<Self> {
        let bytes =
            Bytes::from(serde_json::to_vec(&value).expect("a JSON value always serialises"));
        Arc::new(Self { value, bytes })
    }

    /// `metadata.labels` of the object.
    pub(crate) fn labels(&self) -> Option<&serde_json::Map<String, Value>> {
        self.value.get("metadata")?.get("labels")?.as_object()
    }
}

/// Watch event types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as kept in the history.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) rv: u64,
    pub(crate) res: ResKey,
    pub(crate) namespace: String,
    pub(crate) kind: EventType,
    pub(crate) object: Arc<Stored>,
    /// The object before a modification, for selector filtering.
    pub(crate) prev: Option<Arc<Stored>>,
}

/// (namespace, name); namespace is empty for cluster-scoped objects.
pub(crate) type ObjKey = (String, String);

/// Everything behind the store lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) registry: Registry,
    pub(crate) objects: HashMap<ResKey, BTreeMap<ObjKey, Arc<Stored>>>,
    /// The last resourceVersion handed out.
    pub(crate) rv: u64,
    pub(crate) history: VecDeque<Arc<Event>>,
    /// How many events have ever left the front of `history`: `popped + i` is the
    /// position of `history[i]` for good, so a watch can resume at a position in O(1).
    pub(crate) popped: u64,
    pub(crate) window: usize,
    /// Watches (and list continuations) from a resourceVersion below this get 410 Expired.
    pub(crate) min_rv: u64,
    /// The newest resourceVersion of an event dropped from the history.
    pub(crate) evicted_rv: u64,
    /// `Warning` headers of the write in progress (unknown fields dropped); the HTTP layer
    /// takes them after each write.
    pub(crate) warnings: Vec<String>,
    /// Whether created claims and volumes get their protection finalizers, as the
    /// `StorageObjectInUseProtection` admission plugin adds them ([`Builder::protection_finalizers`](crate::Builder::protection_finalizers)).
    pub(crate) protection_finalizers: bool,
}

impl State {
    /// An empty store keeping `window` events.
    pub(crate) fn new(window: usize) -> Self {
        Self {
            registry: Registry::with_builtins(),
            objects: HashMap::new(),
            rv: 1,
            history: VecDeque::new(),
            popped: 0,
            window: window.max(1),
            min_rv: 1,
            evicted_rv: 0,
            warnings: Vec::new(),
            protection_finalizers: false,
        }
    }

    /// The objects of one resource.
    pub(crate) fn table(&self, res: &str) -> Option<&BTreeMap<ObjKey, Arc<Stored>>> {
        self.objects.get(res)
    }

    /// One object.
    pub(crate) fn get(&self, res: &str, ns: &str, name: &str) -> Option<Arc<Stored>> {
        self.objects
            .get(res)?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Hands out the next resourceVersion.
    pub(crate) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores `value` (whose `metadata.resourceVersion` is set here) and records the event.
    /// Returns the stored object. An Event is also stored, converted, for the other Event
    /// API, with the same resourceVersion.
    pub(crate) fn put(&mut self, res: &ResKey, ns: &str, name: &str, value: Value) -> Arc<Stored> {
        let rv = self.next_rv();
        if let Some((other, converted)) = events::counterpart(res, &value) {
            self.put_at(&other, ns, name, converted, rv);
        }
        self.put_at(res, ns, name, value, rv)
    }

    fn put_at(
        &mut self,
        res: &ResKey,
        ns: &str,
        name: &str,
        mut value: Value,
        rv: u64,
    ) -> Arc<Stored> {
        value["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let stored = Stored::new(value);
        let prev = self
            .objects
            .entry(res.clone())
            .or_default()
            .insert((ns.to_string(), name.to_string()), stored.clone());
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(Event {
            rv,
            res: res.clone(),
            namespace: ns.to_string(),
            kind,
            object: stored.clone(),
            prev,
        });
        stored
    }

    /// Removes an object (an Event from both Event APIs); the DELETED event carries a new
    /// resourceVersion.
    pub(crate) fn remove(&mut self, res: &ResKey, ns: &str, name: &str) -> Option<Arc<Stored>> {
        let key = (ns.to_string(), name.to_string());
        let old = self.objects.get_mut(res)?.remove(&key)?;
        let rv = self.next_rv();
        if let Some(other) = events::other_api(res)
            && let Some(mirror) = self.objects.get_mut(&other).and_then(|t| t.remove(&key))
        {
            self.record_removal(&other, ns, mirror, rv);
        }
        Some(self.record_removal(res, ns, old, rv))
    }

    fn record_removal(&mut self, res: &ResKey, ns: &str, old: Arc<Stored>, rv: u64) -> Arc<Stored> {
        let mut value = old.value.clone();
        value["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let stored = Stored::new(value);
        self.record(Event {
            rv,
            res: res.clone(),
            namespace: ns.to_string(),
            kind: EventType::Deleted,
            object: stored.clone(),
            prev: Some(old),
        });
        stored
    }

    fn record(&mut self, event: Event) {
        self.history.push_back(Arc::new(event));
        while self.history.len() > self.window {
            if let Some(old) = self.history.pop_front() {
                self.popped += 1;
                self.evicted_rv = old.rv;
                self.min_rv = self.min_rv.max(old.rv);
            }
        }
    }

    /// Drops the whole history: resuming from any earlier resourceVersion gets 410.
    pub(crate) fn compact(&mut self) {
        if let Some(last) = self.history.back() {
            self.evicted_rv = last.rv;
        }
        self.popped += self.history.len() as u64;
        self.history.clear();
        let rv = self.next_rv();
        self.min_rv = rv;
    }

    /// History events with a resourceVersion above `after`.
    pub(crate) fn events_after(&self, after: u64) -> impl Iterator<Item = &Arc<Event>> {
        let start = self.history.partition_point(|e| e.rv <= after);
        self.history.range(start..)
    }

    /// The position the next recorded event will have (see `popped`).
    pub(crate) fn end_pos(&self) -> u64 {
        self.popped + self.history.len() as u64
    }

    /// History events from position `pos` on (see `popped`), or `None` when events
    /// before `pos` have been dropped or `pos` lies ahead.
    pub(crate) fn events_from(&self, pos: u64) -> Option<impl Iterator<Item = &Arc<Event>>> {
        let start = usize::try_from(pos.checked_sub(self.popped)?).ok()?;
        (start <= self.history.len()).then(|| self.history.range(start..))
    }

    /// Number of stored objects over all resources (an Event counts once).
    pub(crate) fn object_count(&self) -> usize {
        self.objects
            .iter()
            .filter(|(res, _)| &***res != events::V1)
            .map(|(_, t)| t.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::res_key;
    use serde_json::json;

    #[test]
    fn history_window_evicts_and_raises_min_rv() {
        let mut state = State::new(2);
        let res = res_key("", "pods");
        for i in 0..4 {
            state.put(&res, "default", &format!("p{i}"), json!({"metadata": {}}));
        }
        assert_eq!(state.history.len(), 2);
        assert_eq!(state.rv, 5);
        assert_eq!(state.min_rv, 3);
        assert_eq!(state.events_after(3).count(), 2);
        assert_eq!(state.events_after(4).count(), 1);
        // Positions survive eviction: 2 events left the front, 2 remain.
        assert_eq!(state.popped, 2);
        assert_eq!(state.end_pos(), 4);
        assert!(state.events_from(1).is_none(), "evicted");
        assert_eq!(state.events_from(2).unwrap().count(), 2);
        assert_eq!(state.events_from(3).unwrap().next().unwrap().rv, 5);
        assert_eq!(state.events_from(4).unwrap().count(), 0);
        assert!(state.events_from(5).is_none(), "ahead");
    }

    #[test]
    fn remove_emits_deleted_with_new_version() {
        let mut state = State::new(10);
        let res = res_key("", "pods");
        state.put(&res, "default", "p", json!({"metadata": {}}));
        let gone = state.remove(&res, "default", "p").unwrap();
        assert_eq!(gone.value["metadata"]["resourceVersion"], "3");
        assert_eq!(state.history.back().unwrap().kind, EventType::Deleted);
        assert!(state.get(&res, "default", "p").is_none());
    }

    #[test]
    fn compact_expires_every_older_version() {
        let mut state = State::new(10);
        let res = res_key("", "pods");
        state.put(&res, "default", "p", json!({"metadata": {}}));
        state.compact();
        assert!(state.history.is_empty());
        assert_eq!(state.min_rv, state.rv);
        assert_eq!(state.evicted_rv, 2);
        assert_eq!(state.end_pos(), 1, "positions keep counting");
        assert!(state.events_from(0).is_none());
    }
}
