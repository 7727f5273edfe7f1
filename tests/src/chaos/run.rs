//! One run: the schedule, then quiescence and the checks, then teardown and the strict
//! checks.

use std::collections::BTreeMap;
use std::time::Duration;

use kube_client::ResourceExt;
use kube_client::api::{DeleteParams, ListParams};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::actions::{global_action, run_chain};
use super::checks::{Findings, Phase, Snapshot, check};
use super::names;
use super::panics::PanicLog;
use super::report::SeedReport;
use super::schedule::{BAD_SIZE, Schedule, Step};
use super::world::{World, cns_methods, is_not_found, retry};

/// How long nothing may change before the checks run.
const QUIET: Duration = Duration::from_secs(2);
/// How long nothing may change before violations are final: longer than the resync,
/// and than kube-runtime's watch backoff (up to 30 s): a replica cut off for a while
/// may lead with caches that refresh only after its next watch attempt.
const LONG_QUIET: Duration = Duration::from_secs(35);
/// The most a phase waits for quiet (metadata retries back off for long).
const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// How often the harness looks.
const TICK: Duration = Duration::from_millis(50);
/// How often a snapshot is taken while settling.
const SAMPLE: Duration = Duration::from_millis(250);
/// Requests per second (API, not counting leases, lists and events; or CNS) above which
/// a quiet system counts as busy: a retry loop that changes nothing.
const BUSY: f64 = 10.0;
/// Events per second above which a quiet system counts as busy (higher: a resync
/// retries every failing claim at once, and each failure is an event).
const BUSY_EVENTS: f64 = 30.0;
/// How long a busy quiet system is watched before the rate counts: longer than the
/// resync period and the late-asset window, whose bursts then average out.
const BUSY_WINDOW: Duration = Duration::from_secs(8);
/// How long a quiet system busy only with requests that each name another object (none
/// asked for twice) is watched before the rate counts: a burst that touches many objects
/// once (the window-end sweeps of every PV deleted at teardown, a stale cache's one pass)
/// ends, and averages out over this; a retry loop repeats its requests, and counts after
/// [`BUSY_WINDOW`].
const BURST_WINDOW: Duration = Duration::from_secs(16);

/// Requests counted since the run began settling.
#[derive(Clone, Debug, Default)]
struct Activity {
    /// API requests but lists, watches and lease traffic, by `verb resource`, and CNS
    /// calls, by `cns <method>`.
    counts: BTreeMap<String, u64>,
    /// The same API requests, by `verb resource/name` (for those that name an object).
    objects: BTreeMap<String, u64>,
    /// CNS calls already counted.
    cns_seen: usize,
}

impl Activity {
    /// Adds the API requests logged since the last count (and forgets them), and the
    /// CNS calls since the last count.
    fn count(&mut self, world: &World) {
        let requests = world.kube.requests();
        world.kube.clear_requests();
        for r in requests
            .iter()
            .filter(|r| r.resource != "leases" && r.verb != "list" && r.verb != "watch")
        {
            *self
                .counts
                .entry(format!("{} {}", r.verb, r.resource))
                .or_default() += 1;
            if let Some(name) = &r.name {
                *self
                    .objects
                    .entry(format!("{} {}/{name}", r.verb, r.resource))
                    .or_default() += 1;
            }
        }
        let calls = world.shared.cns.requests();
        for call in calls.iter().skip(self.cns_seen) {
            *self
                .counts
                .entry(format!("cns {}", call.method))
                .or_default() += 1;
        }
        self.cns_seen = calls.len();
    }

    /// Per second since `earlier`, over `elapsed`: API requests but events, event
    /// writes, CNS calls; and the busiest kinds.
    ///
    /// Requests on the claims in `refused` (and their events) are left out: the driver
    /// refuses those claims, and retrying them at the backoff's maximum for as long as
    /// they exist is what the controller must do (Go too); the compressed backoff of the
    /// suite (1 s) makes a handful of them look like a loop.
    fn rates_since(&self, earlier: &Self, elapsed: Duration, refused: &[String]) -> Rates {
        let secs = elapsed.as_secs_f64().max(0.001);
        let refused_claim = |key: &str| {
            refused.iter().any(|name| {
                key.ends_with(&format!(" persistentvolumeclaims/{name}"))
                    || key.contains(&format!(" events/{name}."))
            })
        };
        let (mut expected_api, mut expected_events) = (0, 0);
        // API requests (not events) whose object was asked for only once.
        let mut once_api = 0;
        for (key, n) in &self.objects {
            let n = n - earlier.objects.get(key).copied().unwrap_or(0);
            let event = key.contains(" events/");
            if refused_claim(key) {
                if event {
                    expected_events += n;
                } else {
                    expected_api += n;
                }
            } else if !event && n == 1 {
                once_api += 1;
            }
        }
        let mut busiest: Vec<(u64, &str)> = self
            .counts
            .iter()
            .map(|(k, n)| (n - earlier.counts.get(k).copied().unwrap_or(0), k.as_str()))
            .filter(|(n, _)| *n > 0)
            .collect();
        busiest.sort_unstable_by(|a, b| b.cmp(a));
        let sum = |keep: &dyn Fn(&str) -> bool| -> u64 {
            busiest
                .iter()
                .filter(|(_, k)| keep(k))
                .map(|(n, _)| n)
                .sum()
        };
        let events = sum(&|k| k.ends_with(" events")).saturating_sub(expected_events);
        let cns = sum(&|k| k.starts_with("cns "));
        let api = sum(&|k| !k.ends_with(" events") && !k.starts_with("cns "))
            .saturating_sub(expected_api);
        let repeated = api.saturating_sub(once_api);
        let top: Vec<String> = busiest
            .iter()
            .take(4)
            .map(|(n, k)| format!("{n} {k}"))
            .collect();
        let mut objects: Vec<(u64, &str)> = self
            .objects
            .iter()
            .map(|(k, n)| (n - earlier.objects.get(k).copied().unwrap_or(0), k.as_str()))
            .filter(|(n, k)| *n > 1 && !refused_claim(k))
            .collect();
        objects.sort_unstable_by(|a, b| b.cmp(a));
        let objects: Vec<String> = objects
            .iter()
            .take(4)
            .map(|(n, k)| format!("{n} {k}"))
            .collect();
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        Rates {
            api: api as f64 / secs,
            repeated: repeated as f64 / secs,
            events: events as f64 / secs,
            cns: cns as f64 / secs,
            top: top.join(", "),
            objects: objects.join(", "),
        }
    }
}

/// Request rates over a quiet window.
struct Rates {
    api: f64,
    /// API requests that name an object requested more than once in the window, and
    /// those that name none: what a retry loop is made of.
    repeated: f64,
    events: f64,
    cns: f64,
    top: String,
    /// The objects requested most often (more than once), with their counts.
    objects: String,
}

impl Rates {
    /// Busy over any window: a retry loop.
    fn busy(&self) -> bool {
        self.repeated > BUSY || self.cns > BUSY || self.events > BUSY_EVENTS
    }

    /// Busy over [`BURST_WINDOW`]: also with requests that each name another object.
    fn busy_over_a_burst(&self) -> bool {
        self.busy() || self.api > BUSY
    }

    /// How long the system must stay unchanged before these rates count.
    fn window(&self) -> Duration {
        if self.busy() {
            BUSY_WINDOW
        } else if self.busy_over_a_burst() {
            BURST_WINDOW
        } else {
            Duration::ZERO
        }
    }
}

/// Runs seed `seed` with `claims` claims and reports what the checks found.
pub async fn run_seed(seed: u64, claims: usize) -> SeedReport {
    run_seed_watching(seed, claims, None).await
}

/// [`run_seed`], with the panics of the process counted against the seed.
pub async fn run_seed_watching(seed: u64, claims: usize, panics: Option<PanicLog>) -> SeedReport {
    let before = panics.as_ref().map_or(0, PanicLog::len);
    let mut report = run_schedule(seed, claims).await;
    if let Some(panics) = panics {
        let ours = format!("replica-s{seed}-");
        let seen: Vec<String> = panics
            .since(before)
            .into_iter()
            .filter(|p| p.starts_with(&ours) || !p.starts_with("replica-"))
            .collect();
        if !seen.is_empty() {
            let lines = seen
                .into_iter()
                .map(|p| format!("a thread panicked: {p}"))
                .collect();
            report.phases.push((
                Phase::Chaos,
                Findings {
                    violations: lines,
                    notes: Vec::new(),
                },
            ));
        }
    }
    report
}

async fn run_schedule(seed: u64, claims: usize) -> SeedReport {
    let schedule = Schedule::generate(seed, claims);
    let started = tokio::time::Instant::now();
    let mut report = SeedReport::new(seed, claims);
    match World::start(&schedule).await {
        Err(e) => report.error = Some(format!("{e:#}")),
        Ok(mut world) => {
            match drive(&mut world, &schedule).await {
                Ok(phases) => report.phases = phases,
                Err(e) => report.error = Some(format!("{e:#}")),
            }
            {
                let mut records = world.shared.records();
                report.log = std::mem::take(&mut records.log);
                report.claims_by_uid = records
                    .claims
                    .values()
                    .filter_map(|c| Some((c.uid.clone()?, c.name.clone())))
                    .collect();
            }
            world.shutdown().await;
        }
    }
    report.elapsed = started.elapsed();
    report
}

/// Looks at the replicas: restarts what exited, logs what happened.
fn poll_replicas(world: &mut World) -> anyhow::Result<()> {
    let now = Instant::now();
    for replica in &mut world.replicas {
        if let Some(line) = replica.poll(now)? {
            world.shared.log(format!("* {line}"));
        }
    }
    Ok(())
}

/// Sleeps until `until`, looking at the replicas meanwhile.
async fn wait_until(world: &mut World, until: Instant) -> anyhow::Result<()> {
    loop {
        poll_replicas(world)?;
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        tokio::time::sleep(TICK.min(until - now)).await;
    }
}

async fn drive(world: &mut World, schedule: &Schedule) -> anyhow::Result<Vec<(Phase, Findings)>> {
    let mut chains = JoinSet::new();
    for claim in 0..schedule.claims {
        let steps: Vec<Step> = schedule.chain(claim).cloned().collect();
        chains.spawn(run_chain(world.shared.clone(), claim, steps));
    }
    for step in schedule.global() {
        wait_until(world, world.shared.started + step.at).await?;
        global_action(world, &step.action)?;
    }
    while !chains.is_empty() {
        tokio::select! {
            joined = chains.join_next() => {
                if let Some(Err(e)) = joined {
                    world.shared.log(format!("a claim chain panicked: {e}"));
                }
            }
            () = tokio::time::sleep(TICK) => poll_replicas(world)?,
        }
    }
    calm(world)?;
    let mut phases = Vec::new();
    phases.push((Phase::Quiescent, settle(world, Phase::Quiescent).await?));

    let shared = world.shared.clone();
    let objects = retry(|| async { shared.metadata().list(&ListParams::default()).await }).await?;
    for object in objects.items {
        let name = object.name_any();
        let result = retry(|| async {
            shared
                .metadata()
                .delete(&name, &DeleteParams::default())
                .await
        })
        .await;
        if !is_not_found(&result) {
            result?;
        }
    }
    shared.log("teardown: every cnsvolumemetadata deleted");
    phases.push((
        Phase::MetadataDeleted,
        settle(world, Phase::MetadataDeleted).await?,
    ));

    let claims = retry(|| async { shared.claims().list(&ListParams::default()).await }).await?;
    for claim in claims.items {
        let name = claim.name_any();
        let result = retry(|| async {
            shared
                .claims()
                .delete(&name, &DeleteParams::default())
                .await
        })
        .await;
        if !is_not_found(&result) {
            result?;
        }
        if let Some(record) = shared
            .records()
            .claims
            .values_mut()
            .find(|c| c.name == name)
        {
            record.deleted = true;
        }
    }
    shared.log("teardown: every claim deleted");
    phases.push((Phase::Final, settle(world, Phase::Final).await?));
    Ok(phases)
}

/// Ends the chaos: no API faults, CNS at full speed, partitions healed, both replicas up.
fn calm(world: &mut World) -> anyhow::Result<()> {
    world.kube.clear_faults();
    // Queued CNS faults not used yet would fail the first calls after the chaos.
    world.shared.cns.clear_faults();
    for method in cns_methods() {
        world.shared.cns.delay(method, Duration::ZERO);
    }
    for replica in &mut world.replicas {
        replica.partition().heal();
        replica.start()?;
    }
    world
        .shared
        .log("chaos over: faults cleared, partitions healed, both replicas up");
    Ok(())
}

/// Waits until nothing changes for [`QUIET`] and the checks pass, or nothing changes for
/// [`LONG_QUIET`] (with a `CnsVolumeMetadata` violation, until [`PHASE_LIMIT`]: the
/// reconciler is not woken by claim or PV changes, and its retries back off for
/// minutes), then returns the checks' findings.
async fn settle(world: &mut World, phase: Phase) -> anyhow::Result<Findings> {
    let shared = world.shared.clone();
    let started = Instant::now();
    let mut last = None;
    let mut stable_since = started;
    // The longest the system stayed unchanged in this phase.
    let mut longest = Duration::ZERO;
    let mut activity = Activity::default();
    let mut activity_since = activity.clone();
    loop {
        wait_until(world, Instant::now() + SAMPLE).await?;
        activity.count(world);
        let now = Instant::now();
        let snapshot = match Snapshot::take(&shared).await {
            Ok(snapshot) => snapshot,
            Err(e) if now - started < PHASE_LIMIT => {
                shared.log(format!("settling: cannot take a snapshot: {e}"));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let fingerprint = snapshot.fingerprint();
        if last != Some(fingerprint) {
            last = Some(fingerprint);
            stable_since = now;
            activity_since = activity.clone();
        }
        let stable = now - stable_since;
        longest = longest.max(stable);
        let over = now - started >= PHASE_LIMIT;
        if stable < QUIET && !over {
            continue;
        }
        let mut findings = check(&snapshot, &shared.records(), phase);
        let metadata = findings
            .violations
            .iter()
            .any(|v| v.starts_with("cnsvolumemetadata") || v.starts_with("deleted cnsvolume"));
        // A burst (a resync, the end of a late-asset window) averages out over a longer
        // window; a retry loop does not.
        let refused = refused_claims(&snapshot);
        let window = activity
            .rates_since(&activity_since, stable, &refused)
            .window();
        let passed = findings.violations.is_empty() && stable >= window;
        let done = passed || over || (stable >= LONG_QUIET && !metadata);
        if done {
            if over && longest < QUIET {
                findings.notes.push(format!(
                    "{phase:?}: the system never stayed unchanged for {QUIET:?} within \
                     {PHASE_LIMIT:?}"
                ));
            } else if over && stable < LONG_QUIET && !findings.violations.is_empty() {
                // Quiet for a while, but never long enough for violations to be final:
                // something changed every so often (the resync retrying failing claims).
                findings.notes.push(format!(
                    "{phase:?}: the system never stayed unchanged for {LONG_QUIET:?} within \
                     {PHASE_LIMIT:?} (longest: {:.1}s); checked at the limit",
                    longest.as_secs_f64()
                ));
            }
            let rates = activity.rates_since(&activity_since, stable, &refused);
            let Rates {
                api,
                events,
                cns,
                top,
                objects,
                ..
            } = &rates;
            let counts = format!(
                "{api:.1} API requests/s (not counting leases, lists and events), {events:.1} \
                 events/s, {cns:.1} CNS calls/s over {:.1}s (most: {top})",
                stable.as_secs_f64()
            );
            if rates.busy() || (rates.busy_over_a_burst() && stable >= BURST_WINDOW) {
                findings.violation(format!(
                    "the controllers stay busy while nothing changes: {counts}; most \
                     requested: {objects}"
                ));
            }
            shared.log(format!(
                "{phase:?}: checked after {:.1}s ({} violations; quiet with {counts})",
                (now - started).as_secs_f64(),
                findings.violations.len(),
            ));
            return Ok(findings);
        }
    }
}

/// The unbound claims of the snapshot the driver refuses: of the class with a parameter it
/// does not know, or asking for more than CNS can give.
fn refused_claims(snapshot: &Snapshot) -> Vec<String> {
    snapshot
        .claims
        .iter()
        .filter(|(_, claim)| {
            let spec = claim.spec.as_ref();
            let bound = spec
                .and_then(|s| s.volume_name.as_deref())
                .is_some_and(|v| !v.is_empty());
            let bad_class = spec.and_then(|s| s.storage_class_name.as_deref())
                == Some(names::CLASS_BAD_PARAMETER);
            let bad_size = spec
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .is_some_and(|q| q.0 == BAD_SIZE);
            !bound && (bad_class || bad_size)
        })
        .map(|(name, _)| name.clone())
        .collect()
}
