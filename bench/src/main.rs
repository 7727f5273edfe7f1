//! Benchmarks of the provisioning controller and the CnsVolumeMetadata reconciler.
//!
//! ```text
//! cargo run --release -p bench -- provision --n 10000 --workers 4
//! cargo run --release -p bench -- steady --n 10000 --idle-secs 60
//! cargo run --release -p bench -- metadata --n 1000 --json
//! cargo run --release -p bench -- matrix --sim-profile realistic --matrix-n 1000,10000
//! ```
//!
//! By default kube-sim (with its PV binder) runs in a child process (this binary started
//! again with `--serve-sim`), so this process's CPU time and memory are those of the
//! controller plus a small driver. The driver (watches, measurements, deletions) runs on
//! its own thread and its CPU time is subtracted; the claims of `provision` and `create`
//! are created by a third process (`--creators process`, this binary again) unless
//! `--creators thread` puts the creators on the driver's thread; the controller's API requests
//! are counted by a tower layer on its client. With `--kubeconfig` the bench uses that
//! cluster instead, in a fresh namespace `bench-<id>` with its own StorageClass and
//! provisioner name `bench.example.com/<id>`, and deletes all of it at the end.

mod counting;
mod create;
mod creators;
mod env;
mod matrix;
mod metadata;
mod objects;
mod procfs;
mod provision;
mod report;
mod scenario;
mod serve;
mod sim;
mod steady;
mod timing;
mod track;

use std::{num::NonZeroU16, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use tracing_subscriber::{
    EnvFilter, Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _,
};

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// Provision N claims at once, then delete them all.
    Provision,
    /// N bound claims and PVs cached, idle: memory and CPU.
    Steady,
    /// N CnsVolumeMetadata objects through the reconciler, then deleted.
    Metadata,
    /// No controller: create N claims of a class nobody provisions (`--in-flight` creators
    /// at once, beside the driver's watches of claims and PVs as in `provision`), then
    /// delete them. The creators' rate alone, to compare with `provision`'s
    /// `driver_creates_per_s` (the same creators beside the controller).
    Create,
    /// `provision` for every combination of `--matrix-workers`, `--matrix-crash-safe` and
    /// `--matrix-n`, each in a process of its own, then one table.
    Matrix,
    /// The controller alone with the no-op provisioner named `--provisioner`, on the client
    /// `provision_controller::client::infer` gives (or `--kubeconfig`'s), until SIGTERM or
    /// Ctrl-C: for an external load generator that measures this process by its PID.
    Serve,
}

/// How a bench client is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ClientKind {
    /// HTTP/2 where the server offers it (the kit's client builder).
    H2,
    /// kube's own builder: HTTP/1.1.
    H1,
}

/// Where the claim creators of `provision` and `create` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CreatorsKind {
    /// In a process of their own (this binary again), on an HTTP/2 connection of their own:
    /// a separate load generator, as on a real cluster.
    Process,
    /// On the driver's thread, beside its watches of claims and PVs (how the bench ran
    /// them before: decoding those watches slows the creators down).
    Thread,
}

impl CreatorsKind {
    /// The name `--creators` takes, for the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Thread => "thread",
        }
    }
}

/// Command-line options.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "bench",
    about = "Benchmarks of provision-controller and cnsmetadata"
)]
pub(crate) struct Args {
    /// The scenario to run.
    #[arg(value_enum, required_unless_present_any = ["serve_sim", "populate", "create_claims"])]
    pub(crate) scenario: Option<Scenario>,
    /// Number of claims (or metadata objects).
    #[arg(long, default_value_t = 1000)]
    pub(crate) n: usize,
    /// Controller workers (default 4 claim + 4 volume workers; 3 for metadata).
    #[arg(long)]
    pub(crate) workers: Option<NonZeroU16>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Use this cluster instead of kube-sim.
    #[arg(long, value_name = "PATH")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// `steady`: how long to stay idle, measured.
    #[arg(long, default_value_t = 60)]
    pub(crate) idle_secs: u64,
    /// Requests the driver keeps in flight while creating and deleting.
    #[arg(long, default_value_t = 32)]
    pub(crate) in_flight: usize,
    /// Longest wait for one phase (all Bound, all gone), in seconds.
    #[arg(long, default_value_t = 1800)]
    pub(crate) timeout_secs: u64,
    /// Controller resync period in seconds (default: the library's, 15 minutes).
    #[arg(long)]
    pub(crate) resync_secs: Option<u64>,
    /// How the controller's client talks to the API server (the driver, the claim
    /// creators and watches, always uses `h2`, as a client-go load generator would): `h2`
    /// (`kube_controller_kit::client::from_config`: one HTTP/2 connection where the server
    /// offers it) or `h1` (`kube_client::Client::try_from`: HTTP/1.1, a connection per
    /// request in flight).
    #[arg(long, value_enum, default_value_t = ClientKind::H2)]
    pub(crate) client: ClientKind,
    /// `provision`, `create`: where the `--in-flight` claim creators run.
    #[arg(long, value_enum, default_value_t = CreatorsKind::Process)]
    pub(crate) creators: CreatorsKind,
    /// `provision`: the controller's bound on requests in flight
    /// (`Config::max_requests_in_flight`); 0 = unbounded; default: the library's.
    #[arg(long, value_name = "N")]
    pub(crate) max_in_flight: Option<usize>,
    /// `provision`: whether the bound on requests in flight adapts to the server
    /// (`Config::adapt_requests_in_flight`); default: the library's.
    #[arg(long, value_name = "BOOL")]
    pub(crate) adapt: Option<bool>,
    /// `provision`, `steady`: turn the controller's crash-safe provisioning (its journal
    /// entry written before each driver call) on or off; default: the library's.
    #[arg(long, value_name = "BOOL")]
    pub(crate) crash_safe: Option<bool>,
    /// Watch events kube-sim keeps for resuming watches (larger than its default, so a busy
    /// watcher is not cut off with 410 Gone in the middle of a burst; no watcher lagged this
    /// far at 50,000 claims). Each kept event holds a version of its object in the sim.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) sim_history: usize,
    /// What kube-sim's requests cost (its `LoadModel`): `none` answers at once;
    /// `realistic` costs what a real kube-apiserver + etcd on two cores does (latency that
    /// grows with the requests in flight and the open connections, patches dearer than
    /// creates, at most 400 reads / 200 writes in flight).
    #[arg(long, value_name = "NAME", default_value = "none",
          value_parser = clap::builder::PossibleValuesParser::new(kube_sim::LoadModel::PROFILES))]
    pub(crate) sim_profile: String,
    /// `matrix`: the worker counts to run.
    #[arg(long, value_delimiter = ',', default_value = "4,16")]
    pub(crate) matrix_workers: Vec<NonZeroU16>,
    /// `matrix`: crash-safe provisioning on and off.
    #[arg(long, value_delimiter = ',', default_value = "true,false")]
    pub(crate) matrix_crash_safe: Vec<bool>,
    /// `matrix`: the claim counts (10000 takes minutes per run on the realistic profile).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    pub(crate) matrix_n: Vec<usize>,
    /// `serve`: the provisioner name the controller serves.
    #[arg(long, value_name = "NAME")]
    pub(crate) provisioner: Option<String>,
    /// `serve`: record where the claims' time goes (the controller's spans: queue waits,
    /// journal writes, waits for a slot of the in-flight bound, PV creates) and print it
    /// on stderr when stopping.
    #[arg(long)]
    pub(crate) timings: bool,
    /// Internal: serve kube-sim, writing its kubeconfig here.
    #[arg(long, hide = true, value_name = "PATH")]
    pub(crate) serve_sim: Option<PathBuf>,
    /// Internal: create pre-bound claim/PV pairs in the cluster of this kubeconfig.
    #[arg(long, hide = true, value_name = "PATH")]
    pub(crate) populate: Option<PathBuf>,
    /// Internal: create the run's claims in the cluster of this kubeconfig (the creators'
    /// process), printing when each was sent.
    #[arg(long, hide = true, value_name = "PATH")]
    pub(crate) create_claims: Option<PathBuf>,
    /// Internal (`--populate`, `--create-claims`): the run id.
    #[arg(long, hide = true, default_value = "")]
    pub(crate) run_id: String,
    /// Internal (`--populate`): CSI driver of the PVs.
    #[arg(long, hide = true, default_value = "")]
    pub(crate) csi_driver: String,
}

impl Args {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

/// Errors as one line: what failed and each cause, `: `-separated (anyhow's `{:#}`).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let timings =
        (args.scenario == Some(Scenario::Serve) && args.timings).then(timing::Timings::default);
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "error".into()));
    // The timings see the controller's debug spans, whatever the log filter says.
    let timing_filter = tracing_subscriber::filter::Targets::new()
        .with_target("provision_controller", tracing::Level::DEBUG)
        .with_target("kube_controller_kit", tracing::Level::DEBUG);
    tracing_subscriber::registry()
        .with(logs)
        .with(timings.clone().map(|t| t.with_filter(timing_filter)))
        .init();
    if let Some(path) = args.serve_sim.clone() {
        let rt = tokio::runtime::Runtime::new().context("cannot start a runtime")?;
        return rt.block_on(sim::serve(&path, args.sim_history, &args.sim_profile));
    }
    if args.scenario == Some(Scenario::Matrix) {
        return matrix::run(&args);
    }
    if args.scenario == Some(Scenario::Serve) {
        // As a controller binary runs: one runtime, a worker thread per core.
        let rt = tokio::runtime::Runtime::new().context("cannot start a runtime")?;
        let served = rt.block_on(serve::run(&args));
        if let Some(timings) = timings {
            eprint!("{}", timings.report());
        }
        return served;
    }
    if let Some(path) = args.populate.clone() {
        let rt = tokio::runtime::Runtime::new().context("cannot start a runtime")?;
        return rt.block_on(env::populate_main(&path, &args));
    }
    if let Some(path) = args.create_claims.clone() {
        // A load generator uses every core, as client-go's goroutines would.
        let rt = tokio::runtime::Runtime::new().context("cannot start a runtime")?;
        return rt.block_on(creators::create_claims_main(&path, &args));
    }
    // The controller's runtime: as a controller binary would have it (one worker per core).
    let controller_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("controller")
        .build()
        .context("cannot start the controller runtime")?;
    let controller = controller_rt.handle().clone();
    // The driver: one thread, whose CPU time is measured and subtracted.
    let driver = std::thread::Builder::new()
        .name("driver".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the driver runtime")?;
            rt.block_on(scenario::run(args, controller))
        })
        .context("cannot start the driver thread")?;
    let outcome = driver
        .join()
        .map_err(|_| anyhow::anyhow!("the driver thread panicked"))?;
    controller_rt.shutdown_timeout(Duration::from_secs(5));
    outcome
}
