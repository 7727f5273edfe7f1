//! The seeded chaos test of the sidecar: the CSI driver in place of the library's
//! in-process one (tests/src/chaos in the workspace). A [`MockCsiDriver`] over real gRPC,
//! kube-sim with its PV binder, and the sidecar on a runtime of its own; each seed makes a
//! schedule of claim creates and deletes, sidecar kills (mid-call) and graceful stops,
//! driver crashes, non-final CreateVolume errors (some after the volume was made), late
//! landings, slow calls past the timeout, failed DeleteVolume calls and failed PV
//! creates, all while CreateVolume runs. Then the faults stop, the sidecar and the driver
//! run: every claim still wanted is bound, every volume on the driver has its PV and every
//! PV its volume. Then every claim is deleted: no claim is stuck, no PV and no volume is
//! left.
//!
//! A failure names its seed and prints the schedule as it was carried out; the seeds are a
//! fixed list, so a failure replays with `cargo test --test chaos seed_<n>`.

mod sidecar;

use std::{fmt::Write as _, time::Duration};

use csi_provisioner::{
    csi::Code,
    testing::{Answer, CsiMethod, MockCsiDriver},
};
use kube_client::Client;
use kube_sim::{FaultRule, KubeSim, Verb};
use sidecar::{
    Leaks, Sidecar, SidecarSpec, claim_bound, create_claim, delete_claim, leaks, until_clean, world,
};
use tokio::time::Instant;

/// Claims per seed.
const CLAIMS: usize = 30;
/// How long the schedule of one seed runs.
const WINDOW_MS: u64 = 3_000;
/// How long the system may take to settle after the schedule, and after the teardown.
const SETTLE: Duration = Duration::from_secs(40);

/// SplitMix64: a small seeded generator (the schedule is a pure function of the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In `low..high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low).max(1)
    }

    /// True with probability `percent`%.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        let len = u64::try_from(items.len()).expect("a short list");
        items[usize::try_from(self.next() % len).expect("an index")]
    }
}

/// One thing the schedule does.
#[derive(Clone, Copy, Debug)]
enum Action {
    CreateClaim(usize),
    DeleteClaim(usize),
    /// SIGKILL: the sidecar's runtime goes mid-call.
    KillSidecar,
    /// SIGTERM: operations in flight finish, then it exits.
    StopSidecar,
    StartSidecar,
    CrashDriver,
    RestartDriver,
    /// The next CreateVolume answers this.
    ScriptCreate(Answer),
    /// The next DeleteVolume answers this error.
    FailDelete(Code),
    /// Every CreateVolume waits this long first (past the call timeout: cancelled).
    DelayCreates(Duration),
    /// The next PV create gets `500` from the API server.
    FailPvCreate,
}

/// The schedule of a seed: actions at milliseconds from the start, in order.
fn schedule(seed: u64) -> Vec<(u64, Action)> {
    let mut rng = Rng(seed);
    let mut steps = Vec::new();
    for claim in 0..CLAIMS {
        let at = rng.range(0, WINDOW_MS);
        steps.push((at, Action::CreateClaim(claim)));
        if rng.chance(60) {
            steps.push((at + rng.range(0, 1_500), Action::DeleteClaim(claim)));
        }
    }
    for _ in 0..rng.range(2, 5) {
        let at = rng.range(100, WINDOW_MS);
        let stop = if rng.chance(25) {
            Action::StopSidecar
        } else {
            Action::KillSidecar
        };
        steps.push((at, stop));
        steps.push((at + rng.range(0, 400), Action::StartSidecar));
    }
    for _ in 0..rng.range(1, 4) {
        let at = rng.range(100, WINDOW_MS);
        steps.push((at, Action::CrashDriver));
        steps.push((at + rng.range(50, 500), Action::RestartDriver));
    }
    let answers = [
        Answer::Error(Code::Unavailable),
        Answer::Error(Code::Aborted),
        Answer::Error(Code::DeadlineExceeded),
        Answer::Error(Code::ResourceExhausted),
        Answer::Error(Code::Internal),
        Answer::ErrorAfterWork(Code::DeadlineExceeded),
        Answer::ErrorAfterWork(Code::Aborted),
        Answer::ErrorAfterWork(Code::Unavailable),
        Answer::ErrorAfterWork(Code::Cancelled),
    ];
    for _ in 0..rng.range(6, 12) {
        let at = rng.range(0, WINDOW_MS);
        let action = match rng.range(0, 10) {
            0..=4 => Action::ScriptCreate(rng.pick(&answers)),
            5 | 6 => Action::ScriptCreate(Answer::LandsAfter(Duration::from_millis(
                rng.range(100, 1_500),
            ))),
            7 => Action::DelayCreates(Duration::from_millis(rng.pick(&[0, 0, 200, 700]))),
            8 => Action::FailDelete(rng.pick(&[Code::Unavailable, Code::Internal])),
            _ => Action::FailPvCreate,
        };
        steps.push((at, action));
    }
    steps.sort_by_key(|(at, _)| *at);
    steps
}

/// One seed's run: the world, the sidecar, and the log of what was done.
struct Run {
    seed: u64,
    sim: KubeSim,
    client: Client,
    mock: MockCsiDriver,
    spec: SidecarSpec,
    sidecar: Option<Sidecar>,
    started: Instant,
    log: String,
}

impl Run {
    fn note(&mut self, what: impl std::fmt::Display) {
        let ms = self.started.elapsed().as_millis();
        let _ = writeln!(self.log, "  {ms:>6} ms  {what}");
    }

    /// A sidecar that exited by itself is restarted (as a kubelet would).
    fn restart_if_exited(&mut self) {
        if let Some(sidecar) = self.sidecar.as_mut()
            && let Some(result) = sidecar.exited()
        {
            self.note(format!(
                "the sidecar exited by itself: {result:?}; restarted"
            ));
            self.sidecar = Some(Sidecar::start(&self.spec));
        }
    }

    async fn act(&mut self, action: Action) {
        match action {
            Action::CreateClaim(i) => {
                let name = create_claim(&self.client, &format!("c-{i}")).await;
                self.note(format!("  c-{i}: volume {name}"));
            }
            Action::DeleteClaim(i) => delete_claim(&self.client, &format!("c-{i}")).await,
            Action::KillSidecar => {
                if let Some(sidecar) = self.sidecar.take() {
                    sidecar.kill();
                }
            }
            Action::StopSidecar => {
                if let Some(sidecar) = self.sidecar.take() {
                    let stopped = sidecar.stop().await;
                    self.note(format!("  stopped: {stopped:?}"));
                }
            }
            Action::StartSidecar => {
                if self.sidecar.is_none() {
                    self.sidecar = Some(Sidecar::start(&self.spec));
                }
            }
            Action::CrashDriver => self.mock.crash(),
            Action::RestartDriver => self.mock.restart().expect("the mock driver restarts"),
            Action::ScriptCreate(answer) => self.mock.script(CsiMethod::CreateVolume, [answer]),
            Action::FailDelete(code) => {
                self.mock
                    .script(CsiMethod::DeleteVolume, [Answer::Error(code)]);
            }
            Action::DelayCreates(delay) => self.mock.set_delay(CsiMethod::CreateVolume, delay),
            Action::FailPvCreate => self.sim.add_fault(
                FaultRule::new(Verb::Create, "persistentvolumes")
                    .status(500, "InternalError")
                    .message("injected by the chaos test"),
            ),
        }
    }

    /// The verdict's context: the seed, the counts, the schedule as carried out.
    fn context(&self, found: &Leaks) -> String {
        let calls: Vec<String> = CsiMethod::ALL
            .iter()
            .map(|m| format!("{m} {}", self.mock.calls(*m)))
            .collect();
        format!(
            "seed {}: {found:?}\ndriver calls: {}\nschedule as carried out:\n{}",
            self.seed,
            calls.join(", "),
            self.log
        )
    }
}

/// Whether every claim that exists is bound and the driver's volumes match the PVs.
async fn settled(client: &Client, mock: &MockCsiDriver) -> (bool, Leaks) {
    let found = leaks(client, mock).await;
    if !found.is_consistent() {
        return (false, found);
    }
    for claim in &found.claims {
        let name = claim.trim_start_matches("default/");
        if name.contains("terminating") || !claim_bound(client, name).await {
            return (false, found);
        }
    }
    (true, found)
}

async fn run_seed(seed: u64) {
    let (sim, mock) = world(KubeSim::builder()).await;
    let client = sim.client();
    let spec = SidecarSpec::new(sim.url(), &mock).call_timeout(Duration::from_millis(500));
    let mut run = Run {
        seed,
        client,
        spec: spec.clone(),
        sidecar: Some(Sidecar::start(&spec)),
        sim,
        mock,
        started: Instant::now(),
        log: String::new(),
    };
    for (at, action) in schedule(seed) {
        tokio::time::sleep_until(run.started + Duration::from_millis(at)).await;
        run.restart_if_exited();
        run.note(format!("{action:?}"));
        run.act(action).await;
    }

    // Quiet: no more faults, the driver and the sidecar up.
    run.note("faults end; the driver and the sidecar run");
    run.mock.clear_faults();
    run.sim.clear_faults();
    run.mock.restart().expect("the mock driver restarts");
    run.restart_if_exited();
    if run.sidecar.is_none() {
        run.sidecar = Some(Sidecar::start(&run.spec));
    }
    let deadline = Instant::now() + SETTLE;
    let found = loop {
        run.restart_if_exited();
        let (done, found) = settled(&run.client, &run.mock).await;
        if done || Instant::now() >= deadline {
            break (done, found);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        found.0,
        "the claims still wanted are not all bound with their volumes: {}",
        run.context(&found.1)
    );
    run.note(format!(
        "settled: {} claims bound, {} volumes",
        found.1.claims.len(),
        run.mock.volume_count()
    ));

    // Teardown: every claim goes, and with it every PV and every volume.
    for i in 0..CLAIMS {
        delete_claim(&run.client, &format!("c-{i}")).await;
    }
    let found = until_clean(&run.client, &run.mock, SETTLE).await;
    assert!(
        found.is_clean(),
        "left after every claim was deleted: {}",
        run.context(&found)
    );
    let sidecar = run.sidecar.take().expect("running");
    sidecar.stop().await.expect("the sidecar stops cleanly");
}

#[test]
fn schedules_are_a_function_of_the_seed() {
    let text = |seed| format!("{:?}", schedule(seed));
    assert_eq!(text(7), text(7));
    assert_ne!(text(7), text(8));
    let steps = schedule(7);
    let creates = steps
        .iter()
        .filter(|(_, a)| matches!(a, Action::CreateClaim(_)))
        .count();
    assert_eq!(creates, CLAIMS);
    assert!(
        steps
            .iter()
            .any(|(_, a)| matches!(a, Action::KillSidecar | Action::StopSidecar))
    );
    assert!(steps.iter().any(|(_, a)| matches!(a, Action::CrashDriver)));
}

macro_rules! seeds {
    ($($name:ident = $seed:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run_seed($seed).await;
        }
    )*};
}

seeds! {
    seed_1 = 1;
    seed_2 = 2;
    seed_3 = 3;
    seed_4 = 4;
    seed_5 = 5;
    seed_6 = 6;
    seed_7 = 7;
    seed_8 = 8;
}
