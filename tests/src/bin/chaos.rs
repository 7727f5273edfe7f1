//! Long chaos campaigns: `cargo run --release -p integration-tests --bin chaos -- --seeds
//! 1..1001 --claims 200 --jobs 2`. Prints a line per seed and a total; a failed seed prints
//! its violations and the command that replays it. Exits 1 when a seed failed.

use std::process::ExitCode;

use clap::Parser;
use integration_tests::chaos::{self, Schedule};
use tracing_subscriber::EnvFilter;

/// Runs the seeded chaos suite.
#[derive(Debug, Parser)]
#[command(name = "chaos")]
struct Args {
    /// A range of seeds: `A..B` (B excluded) or `A..=B`.
    #[arg(long, value_parser = parse_range, conflicts_with = "seed")]
    seeds: Option<(u64, u64)>,
    /// One seed (repeatable).
    #[arg(long)]
    seed: Vec<u64>,
    /// Claims per seed.
    #[arg(long, default_value_t = 30)]
    claims: usize,
    /// Seeds run at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Print each schedule before its run, and the whole log after it.
    #[arg(long)]
    verbose: bool,
}

fn parse_range(value: &str) -> Result<(u64, u64), String> {
    let (from, to, inclusive) = if let Some((a, b)) = value.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = value.split_once("..") {
        (a, b, false)
    } else {
        return Err(format!("{value:?} is not a range like 1..101 or 1..=100"));
    };
    let from: u64 = from
        .parse()
        .map_err(|e| format!("{from:?} is not a seed: {e}"))?;
    let to: u64 = to
        .parse()
        .map_err(|e| format!("{to:?} is not a seed: {e}"))?;
    let end = if inclusive {
        to.checked_add(1)
    } else {
        Some(to)
    }
    .ok_or_else(|| format!("{value:?} ends past the last seed"))?;
    if end <= from {
        return Err(format!("{value:?} holds no seed"));
    }
    Ok((from, end))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_thread_names(true)
        .init();
    let seeds: Vec<u64> = match (args.seeds, args.seed.is_empty()) {
        (Some((from, end)), _) => (from..end).collect(),
        (None, false) => args.seed.clone(),
        (None, true) => vec![1],
    };
    if args.verbose {
        for seed in &seeds {
            print!("{}", Schedule::generate(*seed, args.claims));
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let verbose = args.verbose;
    let panics = chaos::PanicLog::install();
    let summary = runtime.block_on(chaos::run_seeds(
        seeds,
        args.claims,
        args.jobs,
        Some(panics),
        |report| {
            println!("{}", report.summary());
            if verbose || !report.passed() {
                print!("{}", report.details(verbose));
            }
        },
    ));
    println!("{}", summary.line(args.claims));
    if summary.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
