//! Creates whose outcome is unknown: sent, then timed out or cut off on the client, so the
//! volume may still appear in vCenter later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// When a create of each volume name was sent whose outcome is unknown. Shared by the
/// clones of one [`CnsProvisioner`](super::CnsProvisioner); never global.
///
/// An entry lives until the settle window has passed since the create was sent, even
/// once a lookup finds a volume of its name: that volume may be another one (made by a
/// replica that raced, or left by an earlier create), so the create may still land.
/// Expired entries are dropped when looked at and on every [`PendingCreates::record`],
/// so the map holds at most the creates sent within one window.
#[derive(Clone, Debug, Default)]
pub(super) struct PendingCreates {
    sent: Arc<Mutex<HashMap<String, Instant>>>,
}

/// An unresolved create of a volume name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Unresolved {
    /// How long ago the create was sent.
    pub(super) age: Duration,
}

impl PendingCreates {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        crate::lock(&self.sent)
    }

    /// Remembers that a create of `name` sent at `sent_at` may still land, and drops
    /// every entry older than `settle`.
    pub(super) fn record(&self, name: &str, sent_at: Instant, settle: Duration) {
        let now = Instant::now();
        let mut entries = self.entries();
        entries.retain(|_, sent| now.saturating_duration_since(*sent) < settle);
        if now.saturating_duration_since(sent_at) < settle {
            // A later create of the same name replaces an earlier one (none is sent while
            // an earlier one is unresolved, except by concurrent calls on one name).
            let latest = entries.get(name).map_or(sent_at, |&t| t.max(sent_at));
            entries.insert(name.to_owned(), latest);
        }
    }

    /// The create of `name` that may still land, if one was sent less than `settle` ago;
    /// an older one is dropped.
    pub(super) fn unresolved(&self, name: &str, settle: Duration) -> Option<Unresolved> {
        let mut entries = self.entries();
        let sent = *entries.get(name)?;
        let age = Instant::now().saturating_duration_since(sent);
        if age < settle {
            return Some(Unresolved { age });
        }
        entries.remove(name);
        None
    }

    /// How many entries the map holds (expired or not).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn an_entry_is_unresolved_until_the_window_passed() {
        let pending = PendingCreates::default();
        assert_eq!(pending.unresolved("pvc-a", SETTLE), None);
        pending.record("pvc-a", Instant::now(), SETTLE);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            pending.unresolved("pvc-a", SETTLE),
            Some(Unresolved {
                age: Duration::from_secs(4)
            })
        );
        assert_eq!(pending.unresolved("pvc-b", SETTLE), None);
        // Clones share the entries.
        let clone = pending.clone();
        clone.record("pvc-b", Instant::now(), SETTLE);
        assert!(pending.unresolved("pvc-b", SETTLE).is_some());
        assert_eq!(pending.len(), 2);

        tokio::time::advance(SETTLE - Duration::from_secs(4)).await;
        assert_eq!(
            pending.unresolved("pvc-a", SETTLE),
            None,
            "the window passed"
        );
        assert_eq!(
            pending.len(),
            1,
            "an expired entry is dropped when looked at; pvc-b is younger"
        );
        assert!(pending.unresolved("pvc-b", SETTLE).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_entries_are_pruned_on_every_record() {
        let pending = PendingCreates::default();
        for i in 0..100 {
            pending.record(&format!("pvc-{i}"), Instant::now(), SETTLE);
        }
        assert_eq!(pending.len(), 100);
        tokio::time::advance(Duration::from_secs(6)).await;
        pending.record("pvc-late", Instant::now(), SETTLE);
        assert_eq!(pending.len(), 101, "nothing expired yet");
        tokio::time::advance(Duration::from_secs(5)).await;
        pending.record("pvc-new", Instant::now(), SETTLE);
        assert_eq!(
            pending.len(),
            2,
            "only pvc-late and pvc-new are younger than the window"
        );
        assert!(pending.unresolved("pvc-late", SETTLE).is_some());
        assert!(pending.unresolved("pvc-0", SETTLE).is_none());
        // A create sent longer ago than the window is not recorded at all, and a zero
        // window records nothing.
        let long_ago = Instant::now() - SETTLE;
        pending.record("pvc-old", long_ago, SETTLE);
        assert!(pending.unresolved("pvc-old", SETTLE).is_none());
        pending.record("pvc-zero", Instant::now(), Duration::ZERO);
        assert_eq!(pending.len(), 0, "a zero window keeps nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn the_latest_send_of_a_name_counts() {
        let pending = PendingCreates::default();
        let first = Instant::now();
        tokio::time::advance(Duration::from_secs(3)).await;
        let second = Instant::now();
        pending.record("pvc-a", second, SETTLE);
        pending.record("pvc-a", first, SETTLE);
        assert_eq!(
            pending.unresolved("pvc-a", SETTLE),
            Some(Unresolved {
                age: Duration::ZERO
            })
        );
    }
}
