//! When each object reached each step, as seen by the driver (its send times and watches).

use std::{
    fmt::Debug,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures::StreamExt;
use kube_client::{Api, Resource};
use kube_runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::{task::JoinHandle, time::Instant};

/// A step in an object's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The driver sent the create request.
    Sent = 0,
    /// Claims: their PV appeared (metadata objects: unused).
    Created = 1,
    /// Claims: Bound. Metadata objects: every volume updated.
    Ready = 2,
    /// The driver sent the delete request.
    DeleteSent = 3,
    /// Claims: their PV is gone. Metadata objects: the object is gone.
    Gone = 4,
}

const STEPS: usize = 5;

#[derive(Debug)]
struct State {
    times: Vec<[Option<Instant>; STEPS]>,
    counts: [usize; STEPS],
    synced: usize,
}

/// Times of each step of objects `0..n`.
#[derive(Debug)]
pub(crate) struct Timeline {
    n: usize,
    state: Mutex<State>,
}

impl Timeline {
    /// An empty timeline of `n` objects.
    pub(crate) fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            n,
            state: Mutex::new(State {
                times: vec![[None; STEPS]; n],
                counts: [0; STEPS],
                synced: 0,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Number of objects.
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Records that object `i` reached `step` now, unless it already had.
    pub(crate) fn mark(&self, i: usize, step: Step) {
        self.mark_at(i, step, Instant::now());
    }

    /// Records that object `i` reached `step` at `now`, unless it already had.
    pub(crate) fn mark_at(&self, i: usize, step: Step, now: Instant) {
        let mut state = self.state();
        let slot = &mut state.times[i][step as usize];
        if slot.is_none() {
            *slot = Some(now);
            state.counts[step as usize] += 1;
        }
    }

    /// How many objects reached `step`.
    pub(crate) fn count(&self, step: Step) -> usize {
        self.state().counts[step as usize]
    }

    /// How many watches finished their initial list.
    pub(crate) fn synced(&self) -> usize {
        self.state().synced
    }

    fn add_synced(&self) {
        self.state().synced += 1;
    }

    /// `to - from` of every object that reached both.
    pub(crate) fn latencies(&self, from: Step, to: Step) -> Vec<Duration> {
        let state = self.state();
        let pairs = state
            .times
            .iter()
            .map(|t| (t[from as usize], t[to as usize]));
        pairs
            .filter_map(|(a, b)| Some(b?.saturating_duration_since(a?)))
            .collect()
    }

    /// From the first object at `from` to the last one at `to`.
    pub(crate) fn span(&self, from: Step, to: Step) -> Option<Duration> {
        let state = self.state();
        let first = state.times.iter().filter_map(|t| t[from as usize]).min()?;
        let last = state.times.iter().filter_map(|t| t[to as usize]).max()?;
        Some(last.saturating_duration_since(first))
    }
}

/// Watches `api` on the current runtime, calling `on_apply` for every object seen
/// (including the initial list) and `on_delete` for every deletion.
pub(crate) fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    timeline: Arc<Timeline>,
    on_apply: impl Fn(&K, &Timeline) + Send + 'static,
    on_delete: impl Fn(&K, &Timeline) + Send + 'static,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(stream.for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                on_apply(&object, &timeline);
            }
            Ok(watcher::Event::Delete(object)) => on_delete(&object, &timeline),
            Ok(watcher::Event::InitDone) => timeline.add_synced(),
            Ok(watcher::Event::Init) => {}
            Err(error) => eprintln!("driver watch failed (retrying): {error}"),
        }
        async {}
    }))
}
