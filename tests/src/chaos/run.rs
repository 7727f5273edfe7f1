//! One run: the schedule, then quiescence and the checks, then teardown and the strict
//! checks.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use kube_client::ResourceExt;
use kube_client::api::{DeleteParams, ListParams};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::actions::{global_action, run_chain};
use super::checks::{Findings, Phase, Snapshot, check};
use super::panics::PanicLog;
use super::report::SeedReport;
use super::schedule::{Schedule, Step};
use super::world::{World, cns_methods, is_not_found, retry};

/// The journal requests a second that the retries of one claim the driver refuses may
/// cost (intent written, removed, and a read after a conflict, at the suite's 1 s backoff
/// cap).
const JOURNAL_PER_REFUSED: f64 = 3.0;

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
    /// CNS calls since the last count; returns what it added.
    fn count(&mut self, world: &World) -> Activity {
        let mut added = Activity::default();
        let requests = world.kube.requests();
        world.kube.clear_requests();
        for r in requests
            .iter()
            .filter(|r| r.resource != "leases" && r.verb != "list" && r.verb != "watch")
        {
            *added
                .counts
                .entry(format!("{} {}", r.verb, r.resource))
                .or_default() += 1;
            if let Some(name) = &r.name {
                *added
                    .objects
                    .entry(format!("{} {}/{name}", r.verb, r.resource))
                    .or_default() += 1;
            }
        }
        let calls = world.shared.cns.requests();
        for call in calls.iter().skip(self.cns_seen) {
            *added
                .counts
                .entry(format!("cns {}", call.method))
                .or_default() += 1;
        }
        self.cns_seen = calls.len();
        self.add(&added);
        added
    }

    /// Adds the counts of `other`.
    fn add(&mut self, other: &Self) {
        for (key, n) in &other.counts {
            *self.counts.entry(key.clone()).or_default() += n;
        }
        for (key, n) in &other.objects {
            *self.objects.entry(key.clone()).or_default() += n;
        }
    }

    /// Per second since `earlier`, over `elapsed`: API requests but events, event
    /// writes, CNS calls; and the busiest kinds.
    ///
    /// Requests on the claims in `refused` (and their events) are left out: the driver
    /// refuses those claims, and retrying them at the backoff's maximum for as long as
    /// they exist is what the controller must do (Go too); the compressed backoff of the
    /// suite (1 s) makes a handful of them look like a loop. So are the journal requests
    /// their retries cost, up to [`JOURNAL_PER_REFUSED`] a second for each: every retry
    /// writes the claim's intent before the driver is asked and removes it once the
    /// driver refused, and a write that meets another's costs a read.
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
        let journal_key = |key: &str| key.contains(" configmaps/") && key.contains("-journal-");
        let journal: u64 = self
            .objects
            .iter()
            .filter(|(key, _)| journal_key(key))
            .map(|(key, n)| n - earlier.objects.get(key).copied().unwrap_or(0))
            .sum::<u64>()
            + self.counts.get("create configmaps").copied().unwrap_or(0)
            - earlier
                .counts
                .get("create configmaps")
                .copied()
                .unwrap_or(0);
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )] // small, non-negative counts
        let owed = (JOURNAL_PER_REFUSED * refused.len() as f64 * secs) as u64;
        expected_api += journal.min(owed);
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

/// The requests counted at each sample of a phase, kept for the last [`BURST_WINDOW`].
#[derive(Debug)]
struct History {
    /// Where the oldest sample kept begins.
    start: Instant,
    /// Each sample: when it was taken and what was counted since the one before.
    samples: VecDeque<(Instant, Activity)>,
}

impl History {
    /// An empty history of a phase starting at `start`.
    fn new(start: Instant) -> Self {
        Self {
            start,
            samples: VecDeque::new(),
        }
    }

    /// Records what was counted since the last sample, at `at`; forgets the samples
    /// that the last [`BURST_WINDOW`] does not need.
    fn record(&mut self, at: Instant, counted: Activity) {
        self.samples.push_back((at, counted));
        while self
            .samples
            .front()
            .is_some_and(|(end, _)| *end + BURST_WINDOW <= at)
        {
            if let Some((end, _)) = self.samples.pop_front() {
                self.start = end;
            }
        }
    }

    /// What was counted over the shortest span ending at `now` that lasts at least
    /// `wanted` (or over all the history when it is shorter), and the span.
    fn last(&self, now: Instant, wanted: Duration) -> (Duration, Activity) {
        let mut counted = Activity::default();
        let mut begins = now;
        for (i, (_, sample)) in self.samples.iter().enumerate().rev() {
            counted.add(sample);
            begins = match i.checked_sub(1) {
                Some(before) => self.samples[before].0,
                None => self.start,
            };
            if now.saturating_duration_since(begins) >= wanted {
                break;
            }
        }
        (now.saturating_duration_since(begins), counted)
    }
}

/// How busy the controllers are, and over what.
struct Verdict {
    rates: Rates,
    /// The span the rates are taken over.
    over: Duration,
    /// Whether that counts as a retry loop.
    busy: bool,
}

/// Judges the activity at `now`, the system unchanged for `stable` (since `unchanged` was
/// counted). The rates count over the time nothing changed when that is as long as they
/// need ([`Rates::window`]); otherwise (the phase limit came first: something changed
/// every so often) over the last span that long, changes and all. A burst (the retries of
/// many failing objects falling due together, a resync) then averages out, as it does in a
/// quiet system; a retry loop persists over any span and counts.
fn judge(
    activity: &Activity,
    unchanged: &Activity,
    stable: Duration,
    history: &History,
    now: Instant,
    refused: &[String],
) -> Verdict {
    let mut over = stable;
    let mut rates = activity.rates_since(unchanged, stable, refused);
    while over < rates.window() {
        let (span, counted) = history.last(now, rates.window());
        if span <= over {
            // The phase is no longer.
            break;
        }
        over = span;
        rates = counted.rates_since(&Activity::default(), span, refused);
    }
    let busy = rates.busy() || (rates.busy_over_a_burst() && over >= BURST_WINDOW);
    Verdict { rates, over, busy }
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
/// minutes), then returns the checks' findings, with a violation when the controllers
/// stay busy ([`judge`]).
async fn settle(world: &mut World, phase: Phase) -> anyhow::Result<Findings> {
    let shared = world.shared.clone();
    let started = Instant::now();
    let mut last = None;
    let mut stable_since = started;
    // The longest the system stayed unchanged in this phase.
    let mut longest = Duration::ZERO;
    let mut activity = Activity::default();
    let mut activity_since = activity.clone();
    let mut history = History::new(started);
    loop {
        wait_until(world, Instant::now() + SAMPLE).await?;
        let counted = activity.count(world);
        let now = Instant::now();
        history.record(now, counted);
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
        let refused = snapshot.refused_claims();
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
            let Verdict {
                rates,
                over: judged,
                busy,
            } = judge(&activity, &activity_since, stable, &history, now, &refused);
            let Rates {
                api,
                events,
                cns,
                top,
                objects,
                ..
            } = &rates;
            let span = if judged > stable {
                format!(
                    "the last {:.1}s (unchanged for {:.1}s only)",
                    judged.as_secs_f64(),
                    stable.as_secs_f64()
                )
            } else {
                format!("{:.1}s", judged.as_secs_f64())
            };
            let counts = format!(
                "{api:.1} API requests/s (not counting leases, lists and events), {events:.1} \
                 events/s, {cns:.1} CNS calls/s over {span} (most: {top})"
            );
            if busy {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` requests `verb resource/name` for each name.
    fn requests(activity: &mut Activity, verb_resource: &str, names: &[String], n: u64) {
        for name in names {
            *activity.counts.entry(verb_resource.to_owned()).or_default() += n;
            *activity
                .objects
                .entry(format!("{verb_resource}/{name}"))
                .or_default() += n;
        }
    }

    fn named(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
    }

    /// A phase of `samples` samples [`SAMPLE`] apart, each counting what `at` says (by
    /// sample index from 1), the system changing every `change_every` samples, the last
    /// time two samples before the end (never, when `None`); judged at the last sample.
    fn phase(
        samples: u32,
        change_every: Option<u32>,
        at: impl Fn(u32) -> Activity,
    ) -> (Verdict, Duration) {
        let started = Instant::now();
        let mut history = History::new(started);
        let mut activity = Activity::default();
        let mut unchanged = Activity::default();
        let mut stable_since = started;
        let mut now = started;
        for i in 1..=samples {
            now = started + SAMPLE * i;
            let counted = at(i);
            activity.add(&counted);
            history.record(now, counted);
            if change_every.is_some_and(|every| (samples - i) % every == 2) {
                stable_since = now;
                unchanged = activity.clone();
            }
        }
        let stable = now - stable_since;
        (
            judge(&activity, &unchanged, stable, &history, now, &[]),
            stable,
        )
    }

    /// 60 s in samples.
    const LIMIT: u32 = 240;

    #[test]
    fn a_burst_just_before_the_phase_limit_is_no_retry_loop() {
        // Seeds 39 and 688 under load: the phase never stayed unchanged for 2 s (a change
        // every second); in its last half second 20 failing objects fell due together,
        // each read once, with 28 event writes: 40 requests/s and 56 events/s over the
        // half second since the last change, 1.3 and 1.8 per second over 16 s.
        let burst = |i: u32| {
            let mut a = Activity::default();
            if i >= LIMIT - 1 {
                requests(&mut a, "get cnsvolumemetadatas", &named("meta", 10), 1);
                requests(&mut a, "patch events", &named("meta", 14), 1);
            }
            a
        };
        let (verdict, stable) = phase(LIMIT, Some(4), burst);
        assert!(stable < Duration::from_secs(1), "{stable:?}");
        assert!(
            activity_rates_over(stable, &burst).busy(),
            "over the time nothing changed alone, the burst looks busy"
        );
        assert!(
            !verdict.busy,
            "a burst is no loop: {:.1} API/s, {:.1} events/s over {:?}",
            verdict.rates.api, verdict.rates.events, verdict.over
        );
        assert!(verdict.over >= BUSY_WINDOW, "{:?}", verdict.over);
    }

    /// The rates of `at` over the last `stable` of a [`LIMIT`]-long phase.
    fn activity_rates_over(stable: Duration, at: &impl Fn(u32) -> Activity) -> Rates {
        let mut recent = Activity::default();
        let from = LIMIT - u32::try_from(stable.as_millis() / SAMPLE.as_millis()).unwrap_or(0);
        for i in from + 1..=LIMIT {
            recent.add(&at(i));
        }
        recent.rates_since(&Activity::default(), stable, &[])
    }

    #[test]
    fn a_retry_loop_is_caught_at_the_phase_limit_while_something_changes() {
        // One object read 5 times and its event written 10 times every sample (20/s and
        // 40/s), the system changing every second (the loop's own status writes).
        let looping = |_| {
            let mut a = Activity::default();
            requests(&mut a, "get cnsvolumemetadatas", &named("meta", 1), 5);
            requests(&mut a, "patch events", &named("meta", 1), 10);
            a
        };
        let (verdict, stable) = phase(LIMIT, Some(4), looping);
        assert!(stable < Duration::from_secs(1), "{stable:?}");
        assert!(verdict.busy, "a retry loop at the limit must count");
        assert!(verdict.over >= BUSY_WINDOW, "{:?}", verdict.over);
        assert!(
            verdict
                .rates
                .objects
                .contains("get cnsvolumemetadatas/meta-000"),
            "{}",
            verdict.rates.objects
        );
    }

    #[test]
    fn a_retry_loop_in_a_quiet_system_counts_over_the_busy_window() {
        // Nothing changes for 8 s while one object is read 20 times a second.
        let looping = |_| {
            let mut a = Activity::default();
            requests(&mut a, "get cnsvolumemetadatas", &named("meta", 1), 5);
            a
        };
        let (verdict, stable) = phase(32, None, looping);
        assert_eq!(stable, BUSY_WINDOW);
        assert!(verdict.busy);
        assert_eq!(verdict.over, stable, "judged over the quiet time itself");
    }

    #[test]
    fn requests_that_each_name_another_object_count_only_when_they_last_a_burst_window() {
        // 12 objects a second, each read once, for the whole phase: the window needed is
        // BURST_WINDOW, reached at the limit by looking back over the changes.
        let sweeping = |i: u32| {
            let mut a = Activity::default();
            requests(
                &mut a,
                "get persistentvolumes",
                &named(&format!("pv{i}"), 3),
                1,
            );
            a
        };
        let (verdict, _) = phase(LIMIT, Some(4), sweeping);
        assert!(verdict.busy, "{:.1} API/s", verdict.rates.api);
        assert!(verdict.over >= BURST_WINDOW, "{:?}", verdict.over);
        // The same for 2 s only, before the limit: averaged out over 16 s.
        let once = |i: u32| {
            if i + 8 > LIMIT {
                sweeping(i)
            } else {
                Activity::default()
            }
        };
        let (verdict, _) = phase(LIMIT, Some(4), once);
        assert!(!verdict.busy, "{:.1} API/s", verdict.rates.api);
    }

    #[test]
    fn journal_writes_of_refused_claims_retries_are_owed_but_no_more() {
        // 8 s of journal updates at 12.5 a second, and 5 refused claims retrying.
        let mut a = Activity::default();
        requests(
            &mut a,
            "update configmaps",
            &["p-journal-00000000".to_owned()],
            100,
        );
        let secs = Duration::from_secs(8);
        let refused = named("claim", 5);
        let rates = a.rates_since(&Activity::default(), secs, &refused);
        assert!(
            !rates.busy(),
            "{:.1} API/s owed to 5 refused claims",
            rates.api
        );
        // Without refused claims the same writes are a loop.
        let rates = a.rates_since(&Activity::default(), secs, &[]);
        assert!(rates.busy(), "{:.1} API/s", rates.api);
        // The allowance is per refused claim: 15 a second is more than one claim owes.
        let mut b = Activity::default();
        requests(
            &mut b,
            "update configmaps",
            &["p-journal-00000000".to_owned()],
            120,
        );
        let rates = b.rates_since(&Activity::default(), secs, &named("claim", 1));
        assert!(rates.busy(), "{:.1} API/s", rates.api);
    }

    #[test]
    fn the_history_keeps_what_the_longest_window_needs() {
        let started = Instant::now();
        let mut history = History::new(started);
        for i in 1..=LIMIT {
            let mut a = Activity::default();
            requests(&mut a, "get x", &named("o", 1), 1);
            history.record(started + SAMPLE * i, a);
        }
        let now = started + SAMPLE * LIMIT;
        let (span, counted) = history.last(now, BURST_WINDOW);
        assert_eq!(span, BURST_WINDOW);
        assert_eq!(counted.counts["get x"], 64);
        let (span, counted) = history.last(now, BUSY_WINDOW);
        assert_eq!(span, BUSY_WINDOW);
        assert_eq!(counted.counts["get x"], 32);
        // Longer than kept: all there is.
        let (span, _) = history.last(now, Duration::from_secs(30));
        assert_eq!(span, BURST_WINDOW);
        assert!(history.samples.len() <= 64, "{}", history.samples.len());
        // A phase younger than the window: from its start.
        let mut young = History::new(started);
        young.record(started + SAMPLE, Activity::default());
        assert_eq!(young.last(started + SAMPLE, BUSY_WINDOW).0, SAMPLE);
    }
}
