//! What a request costs: a latency model per verb class that grows with the requests in
//! flight, a bound on requests in flight answered with `429`, a delay on watch delivery,
//! and counters of the requests served (by verb, resource, code and client).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::status::ApiError;

/// The cost of one request class: a median latency that grows linearly with the number of
/// requests in flight, times a log-normal factor.
///
/// With `n` requests in flight (counting this one), the median latency is
/// `base + per_in_flight × (n − 1)`; a request's latency is that median times `e^(σ·z)` for a
/// standard normal `z` drawn from the sim's own seeded sequence (`σ` is
/// [`spread`](Self::spread); 0 makes the cost exact).
///
/// `per_in_flight` is the server's service cost: a server holding `n` requests answers them
/// at about `n / (base + per_in_flight × (n − 1))` per second, which approaches
/// `1 / per_in_flight` as it saturates, so a saturated server slows every request down
/// instead of serving more.
///
/// ```
/// use std::time::Duration;
/// use kube_sim::Cost;
///
/// // 3 ms alone, 0.4 ms more for each other request in flight, ±25 % (σ) log-normal.
/// let writes = Cost::new(Duration::from_millis(3), Duration::from_micros(400)).spread(0.25);
/// assert_eq!(writes.median(16), Duration::from_millis(9));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    base: Duration,
    per_in_flight: Duration,
    spread: f64,
}

impl Cost {
    /// Costs nothing: the request is served at once.
    pub const ZERO: Self = Self {
        base: Duration::ZERO,
        per_in_flight: Duration::ZERO,
        spread: 0.0,
    };

    /// `base` alone, plus `per_in_flight` for each other request in flight; no spread.
    #[must_use]
    pub const fn new(base: Duration, per_in_flight: Duration) -> Self {
        Self {
            base,
            per_in_flight,
            spread: 0.0,
        }
    }

    /// Exactly `latency`, whatever the load.
    #[must_use]
    pub const fn fixed(latency: Duration) -> Self {
        Self::new(latency, Duration::ZERO)
    }

    /// The `σ` of the log-normal factor around the median (0.25: about 80 % of requests
    /// within ±30 % of the median, the slowest 1 % at 1.8× it). Negative or NaN means 0.
    #[must_use]
    pub fn spread(mut self, sigma: f64) -> Self {
        self.spread = if sigma.is_nan() { 0.0 } else { sigma.max(0.0) };
        self
    }

    /// Whether the cost is zero at any load.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.base.is_zero() && self.per_in_flight.is_zero()
    }

    /// The median latency with `in_flight` requests in flight (counting this one; 0 is
    /// taken as 1).
    #[must_use]
    pub fn median(&self, in_flight: usize) -> Duration {
        self.median_loaded(in_flight, Duration::ZERO)
    }

    /// The median latency with `in_flight` requests in flight when each other request in
    /// flight costs `extra` more than `per_in_flight` (the cost of open connections).
    pub(crate) fn median_loaded(&self, in_flight: usize, extra: Duration) -> Duration {
        let others = u32::try_from(in_flight.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base.saturating_add(
            self.per_in_flight
                .saturating_add(extra)
                .saturating_mul(others),
        )
    }

    /// The latency for `in_flight` requests in flight and a standard normal draw `z`.
    #[cfg(test)]
    pub(crate) fn sample(&self, in_flight: usize, z: f64) -> Duration {
        self.sample_loaded(in_flight, Duration::ZERO, z)
    }

    /// As [`Cost::sample`], each other request in flight costing `extra` more.
    pub(crate) fn sample_loaded(&self, in_flight: usize, extra: Duration, z: f64) -> Duration {
        let median = self.median_loaded(in_flight, extra);
        if self.spread == 0.0 || median.is_zero() {
            return median;
        }
        // Bounded so one unlucky draw cannot stall a request for minutes.
        let factor = (self.spread * z.clamp(-4.0, 4.0)).exp();
        Duration::try_from_secs_f64(median.as_secs_f64() * factor).unwrap_or(median)
    }
}

/// The request classes of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// get, list, discovery: bounded by [`LoadModel::max_requests_inflight`].
    Read,
    /// create, update, delete, deletecollection: bounded by
    /// [`LoadModel::max_mutating_requests_inflight`].
    Write,
    /// patch (JSON, merge, strategic merge, apply): a write with a cost of its own.
    Patch,
}

/// How much the sim's requests cost, set with
/// [`Builder::load`](crate::Builder::load). The default, [`LoadModel::none`], costs nothing
/// and bounds nothing (tests see answers in microseconds).
///
/// Reads (get, list, discovery), patches and the other writes (create, update, delete) each
/// have a [`Cost`]; the number of requests in flight a cost grows with counts all of them
/// (watches excluded, as kube-apiserver excludes long-running requests). The latency is
/// drawn when the request is admitted and spent before the request is served, so a write is
/// visible (and its watch event sent) at the end of its latency. Each watch chunk (a batch
/// of events) is delivered after a [`watch_delivery`](Self::watch_delivery) delay, drawn
/// with the number of requests in flight then.
///
/// Open client connections cost too ([`per_connection`](Self::per_connection)): each one
/// beyond the first makes every other request in flight cost that much more to serve, so
/// a server holding many connections serves fewer requests per second, as a real
/// kube-apiserver does when a client opens an HTTP/1.1 connection per request in flight.
///
/// A client's share of the server follows its requests in flight: every request in flight
/// is served alike, so a client holding 100 requests in flight beside one holding 16 gets
/// about 100/116 of the server, and the other client's requests wait longer. Nothing else
/// is needed to model a competing client; the bench's `driver_creates_per_s` (16 claim
/// creators beside the controller) shows it.
///
/// Like kube-apiserver's `--max-requests-inflight` and `--max-mutating-requests-inflight`,
/// a read past [`max_requests_inflight`](Self::max_requests_inflight) or a write (patches
/// included) past [`max_mutating_requests_inflight`](Self::max_mutating_requests_inflight)
/// is answered at once with `429 TooManyRequests` and `Retry-After`
/// ([`retry_after`](Self::retry_after)).
///
/// The draws come from the sim's own sequence, seeded with [`seed`](Self::seed): no global
/// random state.
///
/// ```
/// use std::time::Duration;
/// use kube_sim::{Cost, KubeSim, LoadModel};
///
/// # async fn demo() -> kube_sim::Result<()> {
/// // What a real kube-apiserver + etcd on two cores costs (see `LoadModel::realistic`).
/// let sim = KubeSim::builder().load(LoadModel::realistic()).start().await?;
/// // Every write takes exactly 20 ms, a patch 50 ms; at most 2 writes in flight.
/// let slow = LoadModel::none()
///     .writes(Cost::fixed(Duration::from_millis(20)))
///     .patches(Cost::fixed(Duration::from_millis(50)))
///     .max_mutating_requests_inflight(2);
/// let other = KubeSim::builder().load(slow).start().await?;
/// # let _ = (sim, other);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct LoadModel {
    reads: Cost,
    writes: Cost,
    /// `None`: as `writes`.
    patches: Option<Cost>,
    watch_delivery: Cost,
    per_connection: Duration,
    max_requests_inflight: usize,
    max_mutating_requests_inflight: usize,
    retry_after: Duration,
    seed: u64,
}

impl Default for LoadModel {
    fn default() -> Self {
        Self::none()
    }
}

impl LoadModel {
    /// The names [`LoadModel::named`] knows: `none`, `realistic`.
    pub const PROFILES: &'static [&'static str] = &["none", "realistic"];

    /// Costs nothing, bounds nothing (the sim's default).
    pub fn none() -> Self {
        Self {
            reads: Cost::ZERO,
            writes: Cost::ZERO,
            patches: None,
            watch_delivery: Cost::ZERO,
            per_connection: Duration::ZERO,
            max_requests_inflight: 0,
            max_mutating_requests_inflight: 0,
            retry_after: Duration::from_secs(1),
            seed: 0,
        }
    }

    /// A kube-apiserver v1.36 + etcd 3.4 + kube-controller-manager sharing two cores with
    /// its clients, as measured on loopback (the figures and how well this profile predicts
    /// them are in the repository's `docs/performance.md`).
    ///
    /// Fitted (#22) so that the bench (1,000 pre-annotated claims, 16 claim creators, 4
    /// controller threads, crash safety on) reproduces what the real server showed for a
    /// controller on HTTP/1.1 with no bound on its requests in flight (~130 connections)
    /// against one bounded to 16 requests in flight: 2.4× the PVs/s and 5.6× the competing
    /// creators' creates/s for the bounded one (real server: 2.5× and 5.4×), at about the
    /// real server's absolute rates.
    ///
    /// - Writes (create, update, delete): 4.2 ms alone, +0.14 ms per other request in
    ///   flight, σ 0.25.
    /// - Patches: 5.6 ms alone, +0.175 ms per other request in flight, σ 0.25 (a third more
    ///   than a create: the server reads, merges and writes).
    /// - Reads: 0.7 ms alone, +0.07 ms per other request in flight, σ 0.25.
    /// - Each open connection beyond the first: +14 µs per other request in flight. 16
    ///   connections make a write with 40 in flight cost 4.2 + 39 × (0.14 + 15 × 0.014) =
    ///   17.85 ms; 130 connections make it 4.2 + 39 × (0.14 + 129 × 0.014) = 80.09 ms.
    /// - Watch delivery: 1 ms, +0.05 ms per request in flight, σ 0.5.
    /// - At most 400 reads and 200 writes in flight (kube-apiserver's defaults), `429` with
    ///   `Retry-After: 1` past them.
    /// - Seed 1.
    ///
    /// What it does not reproduce: every client of the sim speaks HTTP/1.1 (plain http
    /// offers no HTTP/2), so 16 claim creators hold 16 connections here where a client-go
    /// creator holds one, and the creators alone make about 2.5× their rate beside the
    /// bounded controller, where the real server showed 0.6-2.2×.
    pub fn realistic() -> Self {
        let us = Duration::from_micros;
        Self {
            reads: Cost::new(us(700), us(70)).spread(0.25),
            writes: Cost::new(us(4_200), us(140)).spread(0.25),
            patches: Some(Cost::new(us(5_600), us(175)).spread(0.25)),
            watch_delivery: Cost::new(Duration::from_millis(1), Duration::from_micros(50))
                .spread(0.5),
            per_connection: us(14),
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            retry_after: Duration::from_secs(1),
            seed: 1,
        }
    }

    /// The profile called `name` (one of [`LoadModel::PROFILES`]), or `None`.
    #[must_use]
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Self::none()),
            "realistic" => Some(Self::realistic()),
            _ => None,
        }
    }

    /// The cost of get, list and discovery requests.
    pub fn reads(mut self, cost: Cost) -> Self {
        self.reads = cost;
        self
    }

    /// The cost of create, update, delete and deletecollection requests, and of patches
    /// unless [`patches`](Self::patches) sets theirs.
    pub fn writes(mut self, cost: Cost) -> Self {
        self.writes = cost;
        self
    }

    /// The cost of patches (JSON, merge, strategic merge and apply), which a real server
    /// serves as a read, a merge and a write. Default: as [`writes`](Self::writes).
    pub fn patches(mut self, cost: Cost) -> Self {
        self.patches = Some(cost);
        self
    }

    /// The delay before each chunk of watch events is sent.
    pub fn watch_delivery(mut self, cost: Cost) -> Self {
        self.watch_delivery = cost;
        self
    }

    /// What each open client connection beyond the first adds to the cost of every other
    /// request in flight. With `c` connections open and `n` requests in flight, a request's
    /// median latency is `base + (per_in_flight + cost × (c − 1)) × (n − 1)`, so the
    /// server's throughput approaches `1 / (per_in_flight + cost × (c − 1))` as it
    /// saturates: the more connections, the fewer requests it serves per second. Requests
    /// of every class pay it, watch delivery does not. Connections are those on the socket
    /// ([`KubeSim::open_connections`](crate::KubeSim::open_connections)); the PV binder
    /// has none. Default 0.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kube_sim::{Cost, LoadModel};
    ///
    /// // 1 ms per other request in flight, 0.1 ms more for each connection beyond the first.
    /// let model = LoadModel::none()
    ///     .writes(Cost::new(Duration::ZERO, Duration::from_millis(1)))
    ///     .per_connection(Duration::from_micros(100));
    /// # let _ = model;
    /// // 11 writes in flight on 11 connections: 10 × (1 + 10 × 0.1) ms = 20 ms each;
    /// // on one HTTP/2 connection: 10 ms each.
    /// ```
    pub fn per_connection(mut self, cost: Duration) -> Self {
        self.per_connection = cost;
        self
    }

    /// At most this many reads in flight; more get `429`. 0 (the default) bounds nothing.
    pub fn max_requests_inflight(mut self, n: usize) -> Self {
        self.max_requests_inflight = n;
        self
    }

    /// At most this many writes (patches included) in flight; more get `429`. 0 (the
    /// default) bounds nothing.
    pub fn max_mutating_requests_inflight(mut self, n: usize) -> Self {
        self.max_mutating_requests_inflight = n;
        self
    }

    /// The `Retry-After` of a `429` past the bounds, in whole seconds (rounded up, at least
    /// 1). Default 1 s, kube-apiserver's.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// Seeds the sequence latencies are drawn from. Default 0 (`realistic`: 1).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    fn cost(&self, class: Class) -> &Cost {
        match class {
            Class::Read => &self.reads,
            Class::Write => &self.writes,
            Class::Patch => self.patches.as_ref().unwrap_or(&self.writes),
        }
    }

    fn bound(&self, class: Class) -> usize {
        match class {
            Class::Read => self.max_requests_inflight,
            Class::Write | Class::Patch => self.max_mutating_requests_inflight,
        }
    }
}

/// One step of SplitMix64.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform draw in (0, 1).
fn unit(state: &mut u64) -> f64 {
    // 53 random bits, shifted off zero.
    #[allow(clippy::cast_precision_loss)]
    let x = (splitmix64(state) >> 11) as f64;
    (x + 0.5) / (1u64 << 53) as f64
}

/// A standard normal draw (Box-Muller).
fn normal(state: &mut u64) -> f64 {
    let (u1, u2) = (unit(state), unit(state));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// What the request counters are keyed by.
pub(crate) type CountKey = (String, String, String, u16, &'static str);

/// How many requests of one kind the sim answered, from
/// [`KubeSim::request_counts`](crate::KubeSim::request_counts) (also served at `/metrics`
/// as `kube_sim_requests_total`). Kept whatever the
/// [`request_log_limit`](crate::Builder::request_log_limit).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestCount {
    /// Audit verb as in [`RequestRecord::verb`](crate::RequestRecord::verb); a request
    /// refused with `429` before it was parsed is counted as `get` (a read) or `write`.
    pub verb: String,
    /// The resource plural (empty for non-resource paths and refused requests).
    pub resource: String,
    /// The subresource, empty when none.
    pub subresource: String,
    /// The HTTP status code answered.
    pub code: u16,
    /// `pv-binder` for the sim's own PV binder, `client` for requests on the socket.
    pub client: &'static str,
    /// How many.
    pub count: u64,
}

impl RequestCount {
    /// Whether the verb is a write (create, update, patch, delete, deletecollection, or a
    /// refused write).
    #[must_use]
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection" | "write"
        )
    }

    /// Whether the verb is a read (get or list; watches and discovery are neither).
    #[must_use]
    pub fn is_read(&self) -> bool {
        matches!(self.verb.as_str(), "get" | "list")
    }
}

/// The running model: requests in flight, the random sequence, the counters.
#[derive(Debug)]
pub(crate) struct Gate {
    model: LoadModel,
    reads: AtomicUsize,
    writes: AtomicUsize,
    /// Open client connections, and the most open at once.
    connections: AtomicUsize,
    peak_connections: AtomicUsize,
    draws: Mutex<u64>,
    /// `(verb, resource, subresource, code, client)` → requests answered.
    counts: Mutex<BTreeMap<CountKey, u64>>,
}

/// A request admitted by [`Gate::admit`]; leaves the count of requests in flight when
/// dropped.
#[derive(Debug)]
pub(crate) struct Admitted<'a> {
    counter: &'a AtomicUsize,
    /// How long to wait before serving the request.
    pub(crate) latency: Duration,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::AcqRel);
    }
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Gate {
    /// A gate for `model`.
    pub(crate) fn new(model: LoadModel) -> Self {
        let seed = model.seed;
        Self {
            model,
            reads: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            peak_connections: AtomicUsize::new(0),
            draws: Mutex::new(seed),
            counts: Mutex::default(),
        }
    }

    fn counter(&self, class: Class) -> &AtomicUsize {
        match class {
            Class::Read => &self.reads,
            Class::Write | Class::Patch => &self.writes,
        }
    }

    /// A client connection was accepted.
    pub(crate) fn connection_opened(&self) {
        let now = self.connections.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak_connections.fetch_max(now, Ordering::AcqRel);
    }

    /// A client connection was closed.
    pub(crate) fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::AcqRel);
    }

    /// Open client connections.
    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// The most client connections open at once since the start.
    pub(crate) fn peak_connections(&self) -> usize {
        self.peak_connections.load(Ordering::Acquire)
    }

    /// What the open connections add to the cost of each other request in flight.
    fn connection_cost(&self) -> Duration {
        let beyond_first = u32::try_from(self.connections().saturating_sub(1)).unwrap_or(u32::MAX);
        self.model.per_connection.saturating_mul(beyond_first)
    }

    /// Requests in flight (reads and writes; watches are not counted).
    pub(crate) fn in_flight(&self) -> usize {
        self.reads.load(Ordering::Acquire) + self.writes.load(Ordering::Acquire)
    }

    fn draw(&self, cost: &Cost, in_flight: usize, extra: Duration) -> Duration {
        if cost.is_zero() && extra.is_zero() {
            return Duration::ZERO;
        }
        let z = if cost.spread == 0.0 {
            0.0
        } else {
            normal(&mut relock(&self.draws))
        };
        cost.sample_loaded(in_flight, extra, z)
    }

    /// Admits a request of `class`, or answers `429` when its bound is reached.
    pub(crate) fn admit(&self, class: Class) -> Result<Admitted<'_>, ApiError> {
        let counter = self.counter(class);
        let before = counter.fetch_add(1, Ordering::AcqRel);
        let bound = self.model.bound(class);
        if bound > 0 && before >= bound {
            counter.fetch_sub(1, Ordering::AcqRel);
            return Err(self.too_many());
        }
        let in_flight = self.in_flight();
        Ok(Admitted {
            counter,
            latency: self.draw(self.model.cost(class), in_flight, self.connection_cost()),
        })
    }

    fn too_many(&self) -> ApiError {
        let secs =
            self.model.retry_after.as_secs() + u64::from(self.model.retry_after.subsec_nanos() > 0);
        let mut err = ApiError::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        );
        err.details.retry_after_seconds = Some(secs.max(1));
        err
    }

    /// The delay before the next chunk of a watch is sent.
    pub(crate) fn watch_delay(&self) -> Duration {
        self.draw(&self.model.watch_delivery, self.in_flight(), Duration::ZERO)
    }

    /// Counts an answered request.
    pub(crate) fn count(
        &self,
        verb: &str,
        resource: &str,
        subresource: Option<&str>,
        code: u16,
        client: &'static str,
    ) {
        let key = (
            verb.to_string(),
            resource.to_string(),
            subresource.unwrap_or_default().to_string(),
            code,
            client,
        );
        *relock(&self.counts).entry(key).or_default() += 1;
    }

    /// A copy of the counters.
    pub(crate) fn counts(&self) -> BTreeMap<CountKey, u64> {
        relock(&self.counts).clone()
    }

    /// The counters as [`RequestCount`]s.
    pub(crate) fn request_counts(&self) -> Vec<RequestCount> {
        relock(&self.counts)
            .iter()
            .map(
                |((verb, resource, subresource, code, client), n)| RequestCount {
                    verb: verb.clone(),
                    resource: resource.clone(),
                    subresource: subresource.clone(),
                    code: *code,
                    client,
                    count: *n,
                },
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn latency_grows_with_the_requests_in_flight() {
        let cost = Cost::new(ms(3), Duration::from_micros(400));
        assert_eq!(cost.median(0), ms(3));
        assert_eq!(cost.median(1), ms(3));
        assert_eq!(cost.median(16), ms(9));
        assert_eq!(cost.median(41), ms(19));
        let mut last = Duration::ZERO;
        for n in 1..100 {
            let now = cost.sample(n, 0.0);
            assert!(now > last, "{n} in flight: {now:?} after {last:?}");
            last = now;
        }
    }

    #[test]
    fn spread_is_log_normal_around_the_median() {
        let cost = Cost::fixed(ms(10)).spread(0.5);
        assert_eq!(cost.sample(1, 0.0), ms(10));
        let up = cost.sample(1, 1.0).as_secs_f64();
        let down = cost.sample(1, -1.0).as_secs_f64();
        assert!((up - 0.010 * 0.5f64.exp()).abs() < 1e-9, "{up}");
        assert!((up * down - 0.0001).abs() < 1e-9, "{up} {down}");
        // A wild draw is clamped at 4 σ.
        assert_eq!(cost.sample(1, 100.0), cost.sample(1, 4.0));
    }

    /// Admits `n` requests of `class` and returns the last one's latency.
    fn nth_latency(gate: &Gate, class: Class, n: usize) -> Duration {
        let held: Vec<_> = (0..n).map(|_| gate.admit(class).unwrap()).collect();
        held.last().unwrap().latency
    }

    #[test]
    fn realistic_profile_charges_connections_and_patches() {
        let model = LoadModel::realistic();
        let gate = Gate::new(model.clone());
        // One connection costs nothing.
        gate.connection_opened();
        assert_eq!(gate.connection_cost(), Duration::ZERO);
        // 40 writes in flight on 16 connections, then on 130 (the documented figures).
        for _ in 1..16 {
            gate.connection_opened();
        }
        let few = model
            .cost(Class::Write)
            .median_loaded(40, gate.connection_cost());
        assert_eq!(few, Duration::from_micros(17_850));
        for _ in 16..130 {
            gate.connection_opened();
        }
        let many = model
            .cost(Class::Write)
            .median_loaded(40, gate.connection_cost());
        assert_eq!(many, Duration::from_micros(80_094));
        // A patch costs more than a create at any load.
        for n in [1, 16, 40, 200] {
            let (write, patch) = (model.cost(Class::Write), model.cost(Class::Patch));
            assert!(patch.median(n) > write.median(n), "{n} in flight");
        }
        // A competing client's share follows its requests in flight: 16 creators beside
        // 16 other requests on 37 connections make several times what they make beside
        // 100 others on 130 connections.
        let rate = |in_flight: usize, connections: usize| {
            let gate = Gate::new(model.clone());
            for _ in 0..connections {
                gate.connection_opened();
            }
            let median = model
                .cost(Class::Write)
                .median_loaded(in_flight, gate.connection_cost());
            16.0 / median.as_secs_f64()
        };
        let beside_bounded = rate(32, 37);
        let beside_unbounded = rate(116, 130);
        assert!(
            beside_bounded > 4.0 * beside_unbounded,
            "{beside_bounded} vs {beside_unbounded} creates/s"
        );
    }

    #[test]
    fn each_connection_beyond_the_first_raises_the_cost_of_every_request_in_flight() {
        let model = LoadModel::none()
            .writes(Cost::new(ms(1), ms(1)))
            .per_connection(Duration::from_micros(100));
        let gate = Gate::new(model);
        // No connection, or one: no extra cost.
        assert_eq!(nth_latency(&gate, Class::Write, 11), ms(11));
        gate.connection_opened();
        assert_eq!(nth_latency(&gate, Class::Write, 11), ms(11));
        // 11 connections: each of the 10 others in flight costs 1 + 10 × 0.1 ms.
        for _ in 1..11 {
            gate.connection_opened();
        }
        assert_eq!(gate.connections(), 11);
        assert_eq!(nth_latency(&gate, Class::Write, 11), ms(21));
        // Alone, a request pays nothing for the connections.
        assert_eq!(nth_latency(&gate, Class::Write, 1), ms(1));
        // Reads pay it even where their own cost is zero: 2 others × 10 × 0.1 ms.
        assert_eq!(nth_latency(&gate, Class::Read, 3), ms(2));
        // Patches (costing as writes here): 1 + 2 × (1 + 10 × 0.1) ms.
        assert_eq!(nth_latency(&gate, Class::Patch, 3), ms(5));
        // Closed connections stop costing; the peak stays.
        for _ in 0..10 {
            gate.connection_closed();
        }
        assert_eq!(nth_latency(&gate, Class::Write, 11), ms(11));
        assert_eq!((gate.connections(), gate.peak_connections()), (1, 11));
    }

    #[test]
    fn patches_have_a_cost_of_their_own_and_share_the_write_bound() {
        let model = LoadModel::none()
            .writes(Cost::fixed(ms(2)))
            .patches(Cost::fixed(ms(5)))
            .max_mutating_requests_inflight(2);
        let gate = Gate::new(model);
        let patch = gate.admit(Class::Patch).unwrap();
        let write = gate.admit(Class::Write).unwrap();
        assert_eq!((patch.latency, write.latency), (ms(5), ms(2)));
        assert_eq!(gate.admit(Class::Patch).unwrap_err().code, 429);
        drop((patch, write));
        // Without their own cost, patches cost as writes.
        let gate = Gate::new(LoadModel::none().writes(Cost::fixed(ms(2))));
        assert_eq!(gate.admit(Class::Patch).unwrap().latency, ms(2));
    }

    #[test]
    fn draws_repeat_with_the_seed() {
        let cost = Cost::fixed(ms(10)).spread(0.3);
        let seq = |seed| {
            let gate = Gate::new(LoadModel::none().writes(cost).seed(seed));
            (0..8)
                .map(|_| gate.draw(&cost, 1, Duration::ZERO))
                .collect::<Vec<_>>()
        };
        assert_eq!(seq(7), seq(7));
        assert_ne!(seq(7), seq(8));
        assert!(seq(7).windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn bound_rejects_past_it_and_frees_on_drop() {
        let gate = Gate::new(LoadModel::none().max_mutating_requests_inflight(2));
        let a = gate.admit(Class::Write).unwrap();
        let b = gate.admit(Class::Write).unwrap();
        let err = gate.admit(Class::Write).unwrap_err();
        assert_eq!(err.code, 429);
        assert_eq!(err.details.retry_after_seconds, Some(1));
        // Reads have their own bound (none here).
        let read = gate.admit(Class::Read).unwrap();
        assert_eq!(gate.in_flight(), 3);
        drop((a, read));
        assert_eq!(gate.in_flight(), 1);
        assert!(gate.admit(Class::Write).is_ok());
        drop(b);
    }

    #[test]
    fn in_flight_count_feeds_the_latency() {
        let model = LoadModel::none().writes(Cost::new(ms(2), ms(1)));
        let gate = Gate::new(model);
        let first = gate.admit(Class::Write).unwrap();
        let second = gate.admit(Class::Write).unwrap();
        assert_eq!(first.latency, ms(2));
        assert_eq!(second.latency, ms(3));
        drop((first, second));
        assert_eq!(gate.admit(Class::Write).unwrap().latency, ms(2));
    }

    #[test]
    fn retry_after_rounds_up() {
        let gate = Gate::new(
            LoadModel::none()
                .max_requests_inflight(1)
                .retry_after(Duration::from_millis(1_500)),
        );
        let _held = gate.admit(Class::Read).unwrap();
        let err = gate.admit(Class::Read).unwrap_err();
        assert_eq!(err.details.retry_after_seconds, Some(2));
    }

    #[test]
    fn profiles_by_name() {
        for name in LoadModel::PROFILES {
            assert!(LoadModel::named(name).is_some(), "{name}");
        }
        assert_eq!(LoadModel::named("realistic"), Some(LoadModel::realistic()));
        assert_eq!(LoadModel::named("fast"), None);
    }
}
