//! The seeded chaos suite: two replicas of the vSphere application against kube-sim (with
//! its PV binder) and the CNS simulator, driven by a schedule generated from one seed,
//! then checked at quiescence and after teardown.
//!
//! - [`schedule`]: the pure function `(seed, claims)` → every timed action.
//! - [`world`], [`replica`], [`partition`]: the simulators, the replicas (each on its own
//!   runtime, killable mid-call), the partition layer on each replica's kube client.
//! - [`actions`], [`faults`], [`objects`]: carrying the schedule out.
//! - [`checks`], [`run`], [`report`]: quiescence, the invariants, the verdict.
//!
//! ```no_run
//! # async fn doc() {
//! let report = integration_tests::chaos::run_seed(7, 20).await;
//! println!("{}", report.summary());
//! # }
//! ```

pub mod actions;
pub mod checks;
pub mod faults;
pub mod names;
pub mod objects;
pub mod panics;
pub mod partition;
pub mod replica;
pub mod report;
pub mod run;
pub mod schedule;
pub mod world;

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

pub use panics::PanicLog;
pub use report::{SeedReport, Summary, replay_command};
pub use run::run_seed;
pub use schedule::Schedule;

/// Runs `seeds` with `claims` claims each, `jobs` at a time, calling `each` with every
/// report as it finishes; returns the summary. With `panics`, a panic on a thread of a
/// seed's replicas, or on another thread while the seed ran, is a violation of that seed.
pub async fn run_seeds(
    seeds: impl IntoIterator<Item = u64>,
    claims: usize,
    jobs: usize,
    panics: Option<PanicLog>,
    mut each: impl FnMut(&SeedReport),
) -> Summary {
    let started = tokio::time::Instant::now();
    let permits = Arc::new(Semaphore::new(jobs.max(1)));
    let mut runs = JoinSet::new();
    for seed in seeds {
        let permits = permits.clone();
        let panics = panics.clone();
        runs.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let run = tokio::spawn(run::run_seed_watching(seed, claims, panics)).await;
            run.unwrap_or_else(|e| {
                let mut report = SeedReport::new(seed, claims);
                report.error = Some(format!("the run panicked: {e}"));
                report
            })
        });
    }
    let mut summary = Summary::default();
    while let Some(joined) = runs.join_next().await {
        let Ok(report) = joined else {
            continue;
        };
        summary.add(&report);
        each(&report);
    }
    summary.elapsed = started.elapsed();
    summary
}
