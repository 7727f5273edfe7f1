//! The bounded caches behind aggregation and the spam filter: an LRU map, the identity of
//! an event, and per-object token buckets.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::time::Instant;

use super::{Event, EventType};

/// A map that keeps at most `capacity` entries, forgetting the least recently used.
pub(super) struct Lru<V> {
    entries: HashMap<Arc<str>, (V, u64)>,
    /// Use tick to key, oldest first.
    order: BTreeMap<u64, Arc<str>>,
    tick: u64,
    capacity: usize,
}

impl<V> Lru<V> {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            capacity: capacity.max(1),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The value of `key`, now the most recently used.
    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        let (value, used) = self.entries.get_mut(key)?;
        if let Some(key) = self.order.remove(used) {
            self.order.insert(tick, key);
        }
        *used = tick;
        Some(value)
    }

    /// Inserts or replaces `key`, forgetting the least recently used entry when full.
    pub(super) fn insert(&mut self, key: &str, value: V) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((old, used)) = self.entries.get_mut(key) {
            *old = value;
            if let Some(key) = self.order.remove(used) {
                self.order.insert(tick, key);
            }
            *used = tick;
            return;
        }
        while self.entries.len() >= self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        let key: Arc<str> = Arc::from(key);
        self.order.insert(tick, Arc::clone(&key));
        self.entries.insert(key, (value, tick));
    }
}

/// Pushes `field` and a separator that no Kubernetes name, kind or reason contains.
fn push(key: &mut String, field: Option<&str>) {
    key.push_str(field.unwrap_or_default());
    key.push('\u{0}');
}

fn push_object(key: &mut String, object: &ObjectReference) {
    // Not the resourceVersion: it changes between two occurrences of one event.
    push(key, object.api_version.as_deref());
    push(key, object.kind.as_deref());
    push(key, object.namespace.as_deref());
    push(key, object.name.as_deref());
    push(key, object.uid.as_deref());
    push(key, object.field_path.as_deref());
}

/// The spam-filter key: the object an event is about.
pub(super) fn object_key(regarding: &ObjectReference) -> String {
    let mut key = String::new();
    push_object(&mut key, regarding);
    key
}

/// What makes two occurrences the same event: the object (and related object), type,
/// reason, action and note (the note as written, i.e. after the cut). The reporter is the
/// writer's own and so the same for all.
pub(super) fn event_key(event: &Event, note: Option<&str>, regarding: &ObjectReference) -> String {
    let mut key = object_key(regarding);
    push(
        &mut key,
        Some(match event.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }),
    );
    push(&mut key, Some(&event.reason));
    push(&mut key, Some(&event.action));
    push(&mut key, note);
    if let Some(related) = &event.secondary {
        push_object(&mut key, related);
    }
    key
}

/// Token bucket of one object: `burst` tokens, one more every `refill`.
pub(super) struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl Bucket {
    pub(super) fn full(burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            updated: now,
        }
    }

    /// Takes a token if there is one.
    pub(super) fn take(&mut self, burst: u32, refill: Duration, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.updated);
        if !refill.is_zero() {
            let gained = elapsed.as_secs_f64() / refill.as_secs_f64();
            self.tokens = (self.tokens + gained).min(f64::from(burst));
        } else {
            self.tokens = f64::from(burst);
        }
        self.updated = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lru_forgets_the_least_recently_used_and_stays_bounded() {
        let mut lru = Lru::new(3);
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            lru.insert(key, i);
        }
        assert_eq!(lru.get_mut("a").copied(), Some(0), "a is now the newest");
        lru.insert("d", 3);
        assert_eq!(lru.len(), 3);
        assert!(lru.get_mut("b").is_none(), "b was the least recently used");
        assert!(lru.get_mut("a").is_some());
        lru.insert("a", 10);
        assert_eq!(lru.len(), 3, "a replacement is no new entry");
        assert_eq!(lru.get_mut("a").copied(), Some(10));
        for i in 0..10_000 {
            lru.insert(&format!("k{i}"), i);
        }
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.order.len(), 3, "the order index is bounded too");
    }

    #[test]
    fn a_bucket_allows_a_burst_then_one_per_refill() {
        let start = Instant::now();
        let refill = Duration::from_secs(300);
        let mut bucket = Bucket::full(2, start);
        assert!(bucket.take(2, refill, start));
        assert!(bucket.take(2, refill, start));
        assert!(!bucket.take(2, refill, start), "the burst is spent");
        assert!(!bucket.take(2, refill, start + Duration::from_secs(299)));
        assert!(bucket.take(2, refill, start + Duration::from_secs(300)));
        assert!(!bucket.take(2, refill, start + Duration::from_secs(301)));
    }

    #[test]
    fn keys_ignore_the_resource_version_and_tell_notes_apart() {
        let object = ObjectReference {
            kind: Some("ConfigMap".into()),
            name: Some("c".into()),
            namespace: Some("default".into()),
            resource_version: Some("1".into()),
            ..ObjectReference::default()
        };
        let newer = ObjectReference {
            resource_version: Some("2".into()),
            ..object.clone()
        };
        let event = Event {
            type_: EventType::Normal,
            reason: "R".into(),
            note: None,
            action: "A".into(),
            secondary: None,
        };
        assert_eq!(
            event_key(&event, Some("n"), &object),
            event_key(&event, Some("n"), &newer)
        );
        assert_ne!(
            event_key(&event, Some("n"), &object),
            event_key(&event, Some("m"), &object)
        );
        let warning = Event {
            type_: EventType::Warning,
            reason: "R".into(),
            note: None,
            action: "A".into(),
            secondary: None,
        };
        assert_ne!(
            event_key(&event, Some("n"), &object),
            event_key(&warning, Some("n"), &object)
        );
    }
}
