//! Fault injection: fail or delay matching requests.

use std::time::Duration;

use tokio::time::Instant;

/// The API verb of a request, as in audit logs.
///
/// Writes to a `/status` subresource are [`Verb::Update`] or [`Verb::Patch`] with
/// subresource `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH (every patch type, and server-side apply).
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// The lowercase audit name: `get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many times a rule fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Times {
    Remaining(u32),
    Always,
}

/// A rule that fails or delays the requests it matches; added with
/// [`KubeSim::add_fault`](crate::KubeSim::add_fault).
///
/// A rule matches on verb and resource plural, and optionally on subresource, object name
/// and namespace. By default it fires once and answers `500 InternalError`. With
/// [`latency`](Self::latency) the response is delayed; a rule with latency and no
/// [`status`](Self::status) only delays, and the request is then served normally.
///
/// A `429 TooManyRequests` answer carries a `Retry-After` header and
/// `details.retryAfterSeconds`, as the real server's priority-and-fairness rejections do:
/// 1 s unless [`retry_after`](Self::retry_after) says otherwise. A rule can also be limited
/// in time ([`lasting`](Self::lasting)) and fire on only a share of the requests it matches
/// ([`probability`](Self::probability), drawn from a sequence seeded per rule, so the
/// same requests in the same order meet the same failures).
///
/// ```
/// use std::time::Duration;
/// use kube_sim::{FaultRule, Verb};
///
/// // The next two creates of PV "pv-1" fail with 500 after 50 ms.
/// let rule = FaultRule::new(Verb::Create, "persistentvolumes")
///     .name("pv-1")
///     .times(2)
///     .status(500, "InternalError")
///     .latency(Duration::from_millis(50));
/// // Every claim status update is slowed down, never failed.
/// let slow = FaultRule::new(Verb::Update, "persistentvolumeclaims")
///     .subresource("status")
///     .always()
///     .latency(Duration::from_millis(10))
///     .no_status();
/// // For the next 2 s, a third of the PV patches are throttled with `Retry-After: 2`.
/// let throttled = FaultRule::new(Verb::Patch, "persistentvolumes")
///     .always()
///     .lasting(Duration::from_secs(2))
///     .probability(1.0 / 3.0)
///     .status(429, "TooManyRequests")
///     .retry_after(Duration::from_secs(2));
/// # let _ = (rule, slow, throttled);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub(crate) verb: Verb,
    pub(crate) resource: String,
    pub(crate) subresource: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) namespace: Option<String>,
    times: Times,
    pub(crate) status: Option<(u16, String)>,
    pub(crate) message: Option<String>,
    pub(crate) latency: Duration,
    retry_after: Option<Duration>,
    lasting: Option<Duration>,
    /// When a [`lasting`](Self::lasting) rule stops firing; set when the rule is added.
    expires: Option<Instant>,
    /// The share of matching requests the rule fires on, in parts per million.
    probability_ppm: u32,
    /// The state of the rule's random sequence (SplitMix64).
    draw: u64,
    /// Matching requests still to let through before the rule starts firing.
    after: u32,
}

impl FaultRule {
    /// A rule for `verb` on the resource `plural` (e.g. `"persistentvolumeclaims"`) that
    /// fails the next matching request with `500 InternalError`.
    #[must_use]
    pub fn new(verb: Verb, plural: impl Into<String>) -> Self {
        Self {
            verb,
            resource: plural.into(),
            subresource: None,
            name: None,
            namespace: None,
            times: Times::Remaining(1),
            after: 0,
            status: Some((500, "InternalError".to_string())),
            message: None,
            latency: Duration::ZERO,
            retry_after: None,
            lasting: None,
            expires: None,
            probability_ppm: PPM,
            draw: 0,
        }
    }

    /// Matches only requests to this subresource (e.g. `"status"`). Without it the rule
    /// matches only the main resource.
    #[must_use]
    pub fn subresource(mut self, subresource: impl Into<String>) -> Self {
        self.subresource = Some(subresource.into());
        self
    }

    /// Matches only the object with this name (for create: the name in the body's metadata).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Matches only requests in this namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Fires for the next `n` matching requests, then is removed. Default 1; 0 never fires.
    #[must_use]
    pub fn times(mut self, n: u32) -> Self {
        self.times = Times::Remaining(n);
        self
    }

    /// Lets the first `n` matching requests through untouched; the rule fires from the
    /// next one on (e.g. the second write of an object, when the first must succeed).
    /// Default 0.
    #[must_use]
    pub fn after(mut self, n: u32) -> Self {
        self.after = n;
        self
    }

    /// Fires for every matching request until [`KubeSim::clear_faults`](crate::KubeSim::clear_faults).
    #[must_use]
    pub fn always(mut self) -> Self {
        self.times = Times::Always;
        self
    }

    /// Answers with this HTTP code and `Status` reason (e.g. `409, "Conflict"`).
    #[must_use]
    pub fn status(mut self, code: u16, reason: impl Into<String>) -> Self {
        self.status = Some((code, reason.into()));
        self
    }

    /// The `Status` message; default `injected fault`.
    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Serves matching requests normally (use with [`latency`](Self::latency)).
    #[must_use]
    pub fn no_status(mut self) -> Self {
        self.status = None;
        self
    }

    /// Delays matching requests by `latency` before answering.
    #[must_use]
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// The `Retry-After` of a `429` answer, sent in whole seconds (rounded up, at least 1)
    /// as the header and as `details.retryAfterSeconds`. Default 1 s, the real server's.
    /// Ignored for other codes.
    #[must_use]
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Fires only during `duration` from the moment the rule is added with
    /// [`KubeSim::add_fault`](crate::KubeSim::add_fault); then it is removed. Combine with
    /// [`always`](Self::always) for "every matching request for 2 s".
    #[must_use]
    pub fn lasting(mut self, duration: Duration) -> Self {
        self.lasting = Some(duration);
        self
    }

    /// Fires on a share `p` (0.0 to 1.0) of the matching requests; the others pass through
    /// as if the rule did not exist and do not count towards [`times`](Self::times).
    /// The draws come from a sequence seeded with [`seed`](Self::seed). Default 1.0.
    #[must_use]
    pub fn probability(mut self, p: f64) -> Self {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        // In range by the clamp: 0 ..= 1_000_000.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ppm = (p * f64::from(PPM)).round() as u32;
        self.probability_ppm = ppm;
        self
    }

    /// Seeds the sequence [`probability`](Self::probability) draws from. Default 0.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.draw = seed;
        self
    }

    /// Starts the clock of a [`lasting`](Self::lasting) rule.
    pub(crate) fn start(&mut self, now: Instant) {
        self.expires = self.lasting.map(|d| now + d);
    }

    /// Whether a [`lasting`](Self::lasting) rule is over at `now`.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|end| now >= end)
    }

    /// Draws whether the rule fires for one matching request.
    fn draw(&mut self) -> bool {
        if self.after > 0 {
            self.after -= 1;
            return false;
        }
        if self.probability_ppm >= PPM {
            return true;
        }
        let roll = splitmix64(&mut self.draw) % u64::from(PPM);
        roll < u64::from(self.probability_ppm)
    }

    /// Whether the rule matches a request.
    pub(crate) fn matches(&self, req: &RequestKey<'_>) -> bool {
        self.times != Times::Remaining(0)
            && self.verb == req.verb
            && self.resource == req.resource
            && self.subresource.as_deref() == req.subresource
            && self.name.as_deref().is_none_or(|n| Some(n) == req.name)
            && self
                .namespace
                .as_deref()
                .is_none_or(|n| Some(n) == req.namespace)
    }

    /// Counts one firing; returns whether the rule is used up.
    pub(crate) fn fire(&mut self) -> bool {
        match &mut self.times {
            Times::Always => false,
            Times::Remaining(n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
        }
    }
}

/// One million: probabilities are kept in parts per million.
const PPM: u32 = 1_000_000;

/// One step of SplitMix64.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a fault rule matches on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestKey<'a> {
    pub(crate) verb: Verb,
    pub(crate) resource: &'a str,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) name: Option<&'a str>,
    pub(crate) namespace: Option<&'a str>,
}

/// The error answer of a firing rule.
#[derive(Clone, Debug)]
pub(crate) struct FaultStatus {
    pub(crate) code: u16,
    pub(crate) reason: String,
    pub(crate) message: String,
    /// `Retry-After` in whole seconds (429 answers only).
    pub(crate) retry_after_seconds: Option<u64>,
}

/// The action the first matching rule asks for.
#[derive(Clone, Debug, Default)]
pub(crate) struct FaultAction {
    pub(crate) latency: Duration,
    pub(crate) status: Option<FaultStatus>,
}

/// Whole seconds, rounded up, at least 1.
fn whole_seconds(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

/// Drops expired rules, finds the first matching rule that fires (its probability drawn),
/// counts it, and returns what to do.
pub(crate) fn take(
    rules: &mut Vec<FaultRule>,
    req: &RequestKey<'_>,
    now: Instant,
) -> Option<FaultAction> {
    rules.retain(|r| !r.expired(now));
    let i = rules.iter_mut().position(|r| r.matches(req) && r.draw())?;
    let rule = &mut rules[i];
    let action = FaultAction {
        latency: rule.latency,
        status: rule.status.clone().map(|(code, reason)| FaultStatus {
            code,
            reason,
            message: rule
                .message
                .clone()
                .unwrap_or_else(|| "injected fault".to_string()),
            retry_after_seconds: (code == 429)
                .then(|| whole_seconds(rule.retry_after.unwrap_or(Duration::from_secs(1)))),
        }),
    };
    if rule.fire() {
        rules.remove(i);
    }
    Some(action)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(verb: Verb, name: Option<&'a str>) -> RequestKey<'a> {
        RequestKey {
            verb,
            resource: "persistentvolumes",
            subresource: None,
            name,
            namespace: None,
        }
    }

    #[test]
    fn a_rule_fires_its_number_of_times() {
        let mut rules = vec![
            FaultRule::new(Verb::Create, "persistentvolumes")
                .times(2)
                .name("pv-1"),
        ];
        let now = Instant::now();
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-2")), now).is_none());
        assert!(take(&mut rules, &key(Verb::Get, Some("pv-1")), now).is_none());
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-1")), now).is_some());
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-1")), now).is_some());
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-1")), now).is_none());
        assert!(rules.is_empty());
    }

    #[test]
    fn a_rule_with_after_lets_the_first_matches_through() {
        let mut rules = vec![
            FaultRule::new(Verb::Create, "persistentvolumes")
                .after(2)
                .times(1),
        ];
        let now = Instant::now();
        assert!(take(&mut rules, &key(Verb::Get, None), now).is_none());
        assert!(take(&mut rules, &key(Verb::Create, None), now).is_none());
        assert!(take(&mut rules, &key(Verb::Create, None), now).is_none());
        assert!(take(&mut rules, &key(Verb::Create, None), now).is_some());
        assert!(rules.is_empty());
    }

    #[test]
    fn always_keeps_firing_and_status_subresource_must_match() {
        let mut rules = vec![
            FaultRule::new(Verb::Update, "persistentvolumes")
                .subresource("status")
                .always(),
        ];
        let now = Instant::now();
        assert!(take(&mut rules, &key(Verb::Update, None), now).is_none());
        let status = RequestKey {
            subresource: Some("status"),
            ..key(Verb::Update, None)
        };
        for _ in 0..5 {
            let action = take(&mut rules, &status, now).unwrap();
            let status = action.status.unwrap();
            assert_eq!((status.code, status.retry_after_seconds), (500, None));
        }
    }

    #[test]
    fn a_429_carries_retry_after_in_whole_seconds() {
        let now = Instant::now();
        let req = key(Verb::Create, None);
        let mut rules = vec![
            FaultRule::new(Verb::Create, "persistentvolumes").status(429, "TooManyRequests"),
            FaultRule::new(Verb::Create, "persistentvolumes")
                .status(429, "TooManyRequests")
                .retry_after(Duration::from_millis(2500)),
        ];
        let first = take(&mut rules, &req, now).unwrap().status.unwrap();
        assert_eq!(first.retry_after_seconds, Some(1));
        let second = take(&mut rules, &req, now).unwrap().status.unwrap();
        assert_eq!(second.retry_after_seconds, Some(3));
    }

    #[test]
    fn a_lasting_rule_is_dropped_once_over() {
        let now = Instant::now();
        let mut rule = FaultRule::new(Verb::Create, "persistentvolumes")
            .always()
            .lasting(Duration::from_secs(2));
        rule.start(now);
        let mut rules = vec![rule];
        let req = key(Verb::Create, None);
        assert!(take(&mut rules, &req, now + Duration::from_millis(1999)).is_some());
        assert!(take(&mut rules, &req, now + Duration::from_secs(2)).is_none());
        assert!(rules.is_empty());
    }

    #[test]
    fn probability_fires_on_a_seeded_share_of_requests() {
        let now = Instant::now();
        let req = key(Verb::Create, None);
        let fired = |seed: u64| -> Vec<bool> {
            let mut rules = vec![
                FaultRule::new(Verb::Create, "persistentvolumes")
                    .always()
                    .probability(0.25)
                    .seed(seed),
            ];
            (0..2000)
                .map(|_| take(&mut rules, &req, now).is_some())
                .collect()
        };
        let a = fired(7);
        assert_eq!(a, fired(7), "same seed, same draws");
        assert_ne!(a, fired(8), "another seed, other draws");
        let share = a.iter().filter(|f| **f).count();
        assert!((400..600).contains(&share), "fired {share} of 2000");
        let mut never = vec![
            FaultRule::new(Verb::Create, "persistentvolumes")
                .always()
                .probability(0.0),
        ];
        assert!(take(&mut never, &req, now).is_none());
    }

    #[test]
    fn a_probability_miss_does_not_count_towards_times() {
        let now = Instant::now();
        let req = key(Verb::Create, None);
        let mut rules = vec![
            FaultRule::new(Verb::Create, "persistentvolumes")
                .times(3)
                .probability(0.5)
                .seed(1),
        ];
        let fired = (0..200)
            .filter(|_| take(&mut rules, &req, now).is_some())
            .count();
        assert_eq!(fired, 3);
    }
}
