//! The seeded chaos suite as CI runs it (debug build): a fixed set of seeds, two at a
//! time. Every seed prints its summary line; a failure prints its violations and the
//! command that replays it. Long campaigns: `cargo run --release -p integration-tests
//! --bin chaos -- --seeds 1..1001 --claims 200`.

use integration_tests::chaos;

/// Seeds CI runs, and claims per seed: sized to finish in about three minutes on two cores.
const SEEDS: std::ops::Range<u64> = 1..13;
const CLAIMS: usize = 16;
const JOBS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_chaos_keeps_every_volume_safe() {
    let mut failures = String::new();
    let panics = chaos::PanicLog::install();
    let summary = chaos::run_seeds(SEEDS, CLAIMS, JOBS, Some(panics), |report| {
        println!("{}", report.summary());
        if !report.passed() {
            let details = report.details(false);
            print!("{details}");
            failures.push_str(&report.summary());
            failures.push('\n');
            failures.push_str(&details);
        }
    })
    .await;
    println!("{}", summary.line(CLAIMS));
    assert!(
        summary.failed.is_empty(),
        "{}\n{failures}",
        summary.line(CLAIMS)
    );
    assert_eq!(summary.seeds, SEEDS.count(), "every seed ran");
}
