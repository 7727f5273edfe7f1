//! The changes of a claim's entry (put, settle for the last sweep, remove) and how each
//! applies to the object holding it: what a group write sends, and what a lookup sees
//! before it is written.

use super::format::{Entry, Shard};

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
pub(super) fn removable(
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
pub(super) fn later_due(entry: &Entry, due: i64, window: i64) -> i64 {
    entry
        .attempt
        .map_or(due, |a| due.max(a.saturating_add(window)))
}

/// `entry` settled for a last sweep at `due`: the node goes, and of the spec what
/// describes the volume stays (the last sweep of a claim that is gone asks the driver
/// about the claim as the entry describes it: the class name, when no snapshot was kept,
/// and what a PV for the asset is made of).
pub(super) fn settle_entry(entry: &mut Entry, due: i64) {
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
    pub(super) fn uid(&self) -> &str {
        match self {
            Self::Put { uid, .. } | Self::Settle { uid, .. } | Self::Remove { uid, .. } => uid,
        }
    }

    /// Applies the change to `shard`; whether it changed anything.
    pub(super) fn apply(&self, shard: &mut Shard) -> bool {
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

/// The fields of a claim's spec a settled entry keeps: what a PV for its asset is made of.
const SETTLED_SPEC: [&str; 4] = ["storageClassName", "accessModes", "volumeMode", "resources"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::format::tests::entry;

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
}
