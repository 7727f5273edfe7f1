//! [`Leading`]: whether this replica leads, for the controllers that follow one election.

use futures::future::BoxFuture;
use tokio::sync::watch;

/// Whether this replica leads, as it changes: what a controller that runs "while leading"
/// follows, whoever runs the election.
///
/// One election, several controllers: one of them (or the application) runs the
/// [`LeaderElector`](super::LeaderElector); every other controller takes a `Leading` from
/// it ([`LeaderElector::leading`](super::LeaderElector::leading), or
/// [`Health::leading`](crate::http::Health::leading) of the controller that drives the
/// elector) and works only while [`is_leading`](Self::is_leading) holds. A source that is
/// gone (the elector or health handle dropped) means "not leading", for good.
///
/// Cheap to clone; each clone waits on its own.
///
/// ```
/// use kube_controller_kit::leader::Leading;
/// use tokio::sync::watch;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (elected, follower) = watch::channel(false);
/// let mut leading = Leading::from(follower);
/// assert!(!leading.is_leading());
/// elected.send(true).unwrap();
/// assert!(leading.wait_leading().await);
/// drop(elected); // the election is gone: never leading again
/// leading.wait_not_leading().await;
/// assert!(!leading.wait_leading().await);
/// # }
/// ```
pub struct Leading {
    /// `None`: always leading.
    source: Option<Box<dyn Source>>,
}

impl Leading {
    /// A replica that always leads (no election: every replica works).
    #[must_use]
    pub fn always() -> Self {
        Self { source: None }
    }

    /// Follows `watch`, leading while `leads` says so of its value.
    #[must_use]
    pub fn from_watch<T>(watch: watch::Receiver<T>, leads: fn(&T) -> bool) -> Self
    where
        T: Send + Sync + 'static,
    {
        Self {
            source: Some(Box::new(Watched { watch, leads })),
        }
    }

    /// Whether this replica leads now (`false` once the source is gone).
    #[must_use]
    pub fn is_leading(&self) -> bool {
        self.source.as_ref().is_none_or(|s| s.now() == Some(true))
    }

    /// Waits until this replica leads: `true` then, `false` when the source is gone (it
    /// will never lead again).
    pub async fn wait_leading(&mut self) -> bool {
        let Some(source) = &mut self.source else {
            return true;
        };
        loop {
            match source.seen() {
                None => return false,
                Some(true) => return true,
                Some(false) => {}
            }
            if !source.changed().await {
                return false;
            }
        }
    }

    /// Waits until this replica does not lead (or the source is gone); never returns for
    /// [`Leading::always`].
    pub async fn wait_not_leading(&mut self) {
        let Some(source) = &mut self.source else {
            return std::future::pending().await;
        };
        loop {
            if source.seen() != Some(true) {
                return;
            }
            if !source.changed().await {
                return;
            }
        }
    }
}

impl Clone for Leading {
    fn clone(&self) -> Self {
        Self {
            source: self.source.as_ref().map(|s| s.boxed_clone()),
        }
    }
}

impl std::fmt::Debug for Leading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leading")
            .field("always", &self.source.is_none())
            .field("leading", &self.is_leading())
            .finish()
    }
}

impl From<watch::Receiver<bool>> for Leading {
    /// Leading while the value is `true`; the sender is the election.
    fn from(watch: watch::Receiver<bool>) -> Self {
        Self::from_watch(watch, |leads| *leads)
    }
}

/// A watched value that says whether this replica leads.
trait Source: Send + Sync {
    /// The current value (`None` when the sender is gone), without marking it seen.
    fn now(&self) -> Option<bool>;
    /// The current value (`None` when the sender is gone), marked seen.
    fn seen(&mut self) -> Option<bool>;
    /// Waits for a value not yet seen; `false` when the sender is gone.
    fn changed(&mut self) -> BoxFuture<'_, bool>;
    fn boxed_clone(&self) -> Box<dyn Source>;
}

struct Watched<T> {
    watch: watch::Receiver<T>,
    leads: fn(&T) -> bool,
}

impl<T: Send + Sync + 'static> Source for Watched<T> {
    fn now(&self) -> Option<bool> {
        (!self.watch.is_closed()).then(|| (self.leads)(&self.watch.borrow()))
    }

    fn seen(&mut self) -> Option<bool> {
        (!self.watch.is_closed()).then(|| (self.leads)(&self.watch.borrow_and_update()))
    }

    fn changed(&mut self) -> BoxFuture<'_, bool> {
        Box::pin(async move { self.watch.changed().await.is_ok() })
    }

    fn boxed_clone(&self) -> Box<dyn Source> {
        Box::new(Self {
            watch: self.watch.clone(),
            leads: self.leads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn follows_the_flag_and_a_gone_sender_means_never_again() {
        let (elected, follower) = watch::channel(false);
        let mut leading = Leading::from(follower);
        let mut other = leading.clone();
        let waiting = tokio::spawn(async move { other.wait_leading().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "waits while not leading");
        elected.send_replace(true);
        assert!(waiting.await.unwrap());
        assert!(leading.is_leading());
        let mut stepping_down = leading.clone();
        let stepped = tokio::spawn(async move { stepping_down.wait_not_leading().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!stepped.is_finished(), "waits while leading");
        elected.send_replace(false);
        stepped.await.unwrap();
        drop(elected);
        assert!(!leading.is_leading());
        assert!(!leading.wait_leading().await, "gone: never leading again");
    }

    #[tokio::test(start_paused = true)]
    async fn always_leads_and_never_steps_down() {
        let mut leading = Leading::always();
        assert!(leading.is_leading());
        assert!(leading.wait_leading().await);
        let step_down = tokio::time::timeout(Duration::from_secs(3600), leading.wait_not_leading());
        assert!(step_down.await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn any_watched_value_can_say_who_leads() {
        let (sender, receiver) = watch::channel(0_u8);
        let mut leading = Leading::from_watch(receiver, |v| *v == 2);
        sender.send_replace(1);
        assert!(!leading.is_leading());
        sender.send_replace(2);
        assert!(leading.wait_leading().await);
    }
}
