//! What one run found, printed as a summary line and, on failure, the details and the
//! command that replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::checks::{Findings, Phase};

/// The command that replays one seed.
#[must_use]
pub fn replay_command(seed: u64, claims: usize) -> String {
    format!(
        "cargo run --release -p integration-tests --bin chaos -- --seed {seed} --claims {claims}"
    )
}

/// The outcome of one seed.
#[derive(Clone, Debug)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// How many claims.
    pub claims: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// The findings of each phase that ran.
    pub phases: Vec<(Phase, Findings)>,
    /// Why the run could not finish (a simulator did not start, a teardown write failed).
    pub error: Option<String>,
    /// What happened, with times from the start.
    pub log: Vec<(Duration, String)>,
    /// Claim names by UID, to name the claim behind a `pvc-<uid>` in a violation.
    pub claims_by_uid: BTreeMap<String, String>,
}

impl SeedReport {
    /// An empty report.
    #[must_use]
    pub fn new(seed: u64, claims: usize) -> Self {
        Self {
            seed,
            claims,
            elapsed: Duration::ZERO,
            phases: Vec::new(),
            error: None,
            log: Vec::new(),
            claims_by_uid: BTreeMap::new(),
        }
    }

    /// Every violation, with its phase.
    pub fn violations(&self) -> impl Iterator<Item = (Phase, &str)> {
        self.phases
            .iter()
            .flat_map(|(phase, f)| f.violations.iter().map(move |v| (*phase, v.as_str())))
    }

    /// Whether the run finished without violations.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.violations().next().is_none()
    }

    /// One line: seed, verdict, counts, time.
    #[must_use]
    pub fn summary(&self) -> String {
        let violations = self.violations().count();
        let notes: usize = self.phases.iter().map(|(_, f)| f.notes.len()).sum();
        let verdict = if self.passed() { "ok  " } else { "FAIL" };
        let mut line = format!(
            "seed {:>6}: {verdict} {} claims, {:>5.1}s, {violations} violations, {notes} notes",
            self.seed,
            self.claims,
            self.elapsed.as_secs_f64()
        );
        if let Some(error) = &self.error {
            let _ = write!(line, ", error: {error}");
        }
        if !self.passed() {
            let _ = write!(
                line,
                "  (replay: {})",
                replay_command(self.seed, self.claims)
            );
        }
        line
    }

    /// The violations and notes of every phase, and, for a failure, the log lines about
    /// the objects the violations name (all of them with `full_log`).
    #[must_use]
    pub fn details(&self, full_log: bool) -> String {
        let mut text = String::new();
        for (phase, findings) in &self.phases {
            for v in &findings.violations {
                let _ = writeln!(text, "  violation [{phase:?}]: {v}");
            }
            for n in &findings.notes {
                let _ = writeln!(text, "  note [{phase:?}]: {n}");
            }
        }
        if let Some(error) = &self.error {
            let _ = writeln!(text, "  error: {error}");
        }
        let named: BTreeSet<String> = self
            .violations()
            .flat_map(|(_, v)| claim_names(v, &self.claims_by_uid))
            .collect();
        if full_log || !named.is_empty() {
            let _ = writeln!(
                text,
                "  log{}:",
                if full_log {
                    String::new()
                } else {
                    format!(" of {} and the replicas", join(&named))
                }
            );
            for (at, line) in &self.log {
                let relevant = full_log
                    || line.starts_with("* ")
                    || named.iter().any(|n| line.starts_with(n.as_str()));
                if relevant {
                    let _ = writeln!(text, "    {:>7.3}s {line}", at.as_secs_f64());
                }
            }
        }
        if !self.passed() {
            let _ = writeln!(text, "  replay: {}", replay_command(self.seed, self.claims));
        }
        text
    }
}

fn join(names: &BTreeSet<String>) -> String {
    names.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// The claims a line is about: `claim-NNN`, `meta-NNN`, `static-NNN`,
/// `static-volume-NNN` (made for claim `NNN`), and `pvc-<uid>` of a known claim.
fn claim_names(line: &str, by_uid: &BTreeMap<String, String>) -> Vec<String> {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter_map(|w| {
            if let Some(claim) = w.strip_prefix("pvc-").and_then(|uid| by_uid.get(uid)) {
                return Some(claim.clone());
            }
            ["claim-", "meta-", "static-volume-", "static-"]
                .iter()
                .find_map(|prefix| w.strip_prefix(prefix))
                .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
                .map(|n| format!("claim-{n}"))
        })
        .collect()
}

/// The outcome of many seeds.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: usize,
    /// Seeds that failed.
    pub failed: Vec<u64>,
    /// Violations in all.
    pub violations: usize,
    /// Wall time.
    pub elapsed: Duration,
}

impl Summary {
    /// Counts one report in.
    pub fn add(&mut self, report: &SeedReport) {
        self.seeds += 1;
        self.violations += report.violations().count();
        if !report.passed() {
            self.failed.push(report.seed);
        }
    }

    /// The total line.
    #[must_use]
    pub fn line(&self, claims: usize) -> String {
        let mut line = format!(
            "total: {} seeds of {claims} claims in {:.1}s, {} failed, {} violations",
            self.seeds,
            self.elapsed.as_secs_f64(),
            self.failed.len(),
            self.violations
        );
        if !self.failed.is_empty() {
            let mut failed = self.failed.clone();
            failed.sort_unstable();
            let seeds: Vec<String> = failed.iter().map(u64::to_string).collect();
            let _ = write!(line, " (seeds {})", seeds.join(", "));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_are_found_in_violation_lines() {
        let by_uid = BTreeMap::from([("u-1".to_owned(), "claim-009".to_owned())]);
        assert_eq!(
            claim_names(
                "claim claim-007 is Bound to PV pvc-u-1 (claim-012)",
                &by_uid
            ),
            ["claim-007", "claim-009", "claim-012"]
        );
        assert_eq!(
            claim_names(
                "cnsvolumemetadata meta-003, static-volume-004 of static-005",
                &by_uid
            ),
            ["claim-003", "claim-004", "claim-005"]
        );
        assert!(claim_names("claim-x and claim- are not names, nor pvc-u-2", &by_uid).is_empty());
    }

    #[test]
    fn a_failed_seed_prints_its_replay_command() {
        let mut report = SeedReport::new(17, 30);
        report.phases.push((
            Phase::Final,
            Findings {
                violations: vec!["claim claim-001 still exists".into()],
                notes: Vec::new(),
            },
        ));
        report.log.push((
            Duration::from_millis(5),
            "claim-001: create claim: ok".into(),
        ));
        report.log.push((
            Duration::from_millis(6),
            "claim-002: create claim: ok".into(),
        ));
        assert!(!report.passed());
        let summary = report.summary();
        assert!(summary.contains("FAIL"), "{summary}");
        assert!(summary.contains("--seed 17 --claims 30"), "{summary}");
        let details = report.details(false);
        assert!(details.contains("claim-001: create claim"), "{details}");
        assert!(!details.contains("claim-002"), "{details}");
    }
}
