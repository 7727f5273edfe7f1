//! [`InFlightLimit`]: a bound on the requests a controller keeps in flight, fixed or
//! adapting to how long the API server takes to answer.

use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use kube_client::Client;
use kube_client::client::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// An answer is late when it took longer than this many times the quickest recent answer
/// to a request of its kind, plus [`LATE_SLACK`]: the server queued it behind other work.
const LATE_FACTOR: u32 = 3;
/// See [`LATE_FACTOR`]: the margin that keeps a server's ordinary jitter from counting.
const LATE_SLACK: Duration = Duration::from_millis(5);
/// The quickest answer is that of this window or the one before it, so a server that
/// became slower for good (more objects, a busier cluster) sets a new norm within two.
const NORM_WINDOW: Duration = Duration::from_secs(30);

/// A bound on the requests a controller keeps in flight to the API server, shared by
/// every client it [wraps](Self::wrap).
///
/// A request waits for a slot before it is sent and holds it until its response body has
/// been read (or dropped). Watches are not counted: they stay open for minutes and would
/// hold their slot all that time. Slots are handed out in the order they were asked for.
/// A throttling server (429 with `Retry-After`) is retried by the client's retry policy
/// while the request keeps its slot, so the whole controller slows down with the server.
///
/// A bound made by [`adaptive`](Self::adaptive) also gives way to the server's other
/// clients: the requests are counted in rounds (as many answers as the bound), and a round
/// in which most answers were late (the server queued them behind other work) takes a
/// quarter of the slots away, a round with a 429 or 503 answer half of them (down to one);
/// a round of answers mostly on time gives one slot back, up to the maximum. So while
/// another client keeps the server busy, the controller keeps a few requests in flight and
/// the other client gets the server; when it is done, the bound grows back.
///
/// ```no_run
/// # async fn doc(client: kube_client::Client) {
/// use std::num::NonZeroUsize;
/// use kube_controller_kit::client::InFlightLimit;
/// let limit = InFlightLimit::adaptive(NonZeroUsize::new(16).unwrap());
/// let client = limit.wrap(client); // every clone shares the (at most) 16 slots
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct InFlightLimit {
    gate: Arc<Gate>,
}

impl InFlightLimit {
    /// A fixed bound of `max` requests in flight.
    pub fn new(max: NonZeroUsize) -> Self {
        Self::build(max, false)
    }

    /// A bound of at most `max` requests in flight that adapts to the server's answers:
    /// fewer while the server queues them, `max` again once it does not.
    pub fn adaptive(max: NonZeroUsize) -> Self {
        Self::build(max, true)
    }

    fn build(max: NonZeroUsize, adaptive: bool) -> Self {
        let max = max.get();
        Self {
            gate: Arc::new(Gate {
                slots: Arc::new(Semaphore::new(max)),
                max,
                adapt: adaptive.then(|| Mutex::new(Adapt::new(max))),
            }),
        }
    }

    /// The largest bound.
    pub fn max(&self) -> usize {
        self.gate.max
    }

    /// The bound now: [`max`](Self::max) for a fixed bound, between 1 and it for an
    /// adaptive one.
    pub fn limit(&self) -> usize {
        self.gate.adapt().map_or(self.gate.max, |adapt| adapt.limit)
    }

    /// Requests in flight now (watches not counted).
    pub fn in_flight(&self) -> usize {
        let permits = match self.gate.adapt() {
            // Slots being taken away are still held by their requests.
            Some(adapt) => adapt.limit + adapt.debt,
            None => self.gate.max,
        };
        permits.saturating_sub(self.gate.slots.available_permits())
    }

    /// A client that sends through `client` and counts its requests against this bound.
    /// Errors and responses are those of `client`.
    ///
    /// # Panics
    /// Outside a Tokio runtime: the client spawns its buffer task.
    pub fn wrap(&self, client: Client) -> Client {
        let namespace = client.default_namespace().to_owned();
        Client::new(
            Limited {
                client,
                gate: self.gate.clone(),
            },
            namespace,
        )
    }
}

/// The slots, and for an adaptive bound, what it learned.
#[derive(Debug)]
struct Gate {
    slots: Arc<Semaphore>,
    max: usize,
    adapt: Option<Mutex<Adapt>>,
}

impl Gate {
    fn adapt(&self) -> Option<MutexGuard<'_, Adapt>> {
        self.adapt
            .as_ref()
            .map(|adapt| adapt.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Learns from an answer that took `took` to a request of `kind`.
    fn answered(&self, kind: Kind, took: Duration, status: StatusCode) {
        let Some(mut adapt) = self.adapt() else {
            return;
        };
        let throttled = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        );
        if let Some(limit) = adapt.answered(kind, took, throttled, Instant::now()) {
            adapt.set(limit, &self.slots);
        }
    }

    /// Gives `permit` back, or lets it go if the bound shrank while it was held.
    fn release(&self, permit: OwnedSemaphorePermit) {
        if let Some(mut adapt) = self.adapt()
            && adapt.debt > 0
        {
            adapt.debt -= 1;
            permit.forget();
        }
    }
}

/// Kinds of request whose answers take comparable times.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Read = 0,
    Delete = 1,
    Write = 2,
}

impl Kind {
    fn of(method: &Method) -> Self {
        match *method {
            Method::GET | Method::HEAD => Self::Read,
            Method::DELETE => Self::Delete,
            _ => Self::Write,
        }
    }
}

/// The quickest answer to one kind of request lately.
#[derive(Clone, Copy, Debug)]
struct Norm {
    since: Instant,
    this: Option<Duration>,
    last: Option<Duration>,
}

impl Norm {
    /// Takes in an answer that took `took`; returns the quickest of the two windows.
    fn learn(&mut self, took: Duration, now: Instant) -> Duration {
        if now.saturating_duration_since(self.since) >= NORM_WINDOW {
            self.last = self.this.take();
            self.since = now;
        }
        let this = self.this.map_or(took, |quickest| quickest.min(took));
        self.this = Some(this);
        self.last.map_or(this, |last| last.min(this))
    }
}

/// What an adaptive bound knows.
#[derive(Debug)]
struct Adapt {
    max: usize,
    /// The bound now.
    limit: usize,
    /// Slots taken away while their requests held them: let go as they come back.
    debt: usize,
    norms: [Norm; 3],
    /// Answers left in this round, and of the round so far: answers, late ones, throttled.
    left: usize,
    answers: usize,
    late: usize,
    throttled: bool,
}

impl Adapt {
    fn new(max: usize) -> Self {
        let norm = Norm {
            since: Instant::now(),
            this: None,
            last: None,
        };
        Self {
            max,
            limit: max,
            debt: 0,
            norms: [norm; 3],
            left: max,
            answers: 0,
            late: 0,
            throttled: false,
        }
    }

    /// Counts an answer; at the end of a round, returns the next bound.
    fn answered(
        &mut self,
        kind: Kind,
        took: Duration,
        throttled: bool,
        now: Instant,
    ) -> Option<usize> {
        let norm = self.norms[kind as usize].learn(took, now);
        let late = took > norm * LATE_FACTOR + LATE_SLACK;
        self.answers += 1;
        self.late += usize::from(late);
        self.throttled |= throttled;
        self.left = self.left.saturating_sub(1);
        if self.left > 0 {
            return None;
        }
        let limit = if self.throttled {
            self.limit / 2
        } else if self.late * 2 > self.answers {
            (self.limit * 3 / 4).min(self.limit - 1)
        } else if self.late * 4 <= self.answers {
            self.limit + 1
        } else {
            self.limit
        };
        let limit = limit.clamp(1, self.max);
        (self.left, self.answers, self.late, self.throttled) = (limit, 0, 0, false);
        Some(limit)
    }

    /// Moves the bound to `limit`, taking free slots away at once and held ones as they
    /// come back.
    fn set(&mut self, limit: usize, slots: &Semaphore) {
        if limit < self.limit {
            let cut = self.limit - limit;
            self.debt += cut - slots.forget_permits(cut);
        } else if limit > self.limit {
            let more = limit - self.limit;
            let repaid = more.min(self.debt);
            self.debt -= repaid;
            slots.add_permits(more - repaid);
        }
        if limit != self.limit {
            tracing::debug!(from = self.limit, to = limit, "requests in flight bound");
        }
        self.limit = limit;
    }
}

/// The service behind [`InFlightLimit::wrap`].
#[derive(Clone)]
struct Limited {
    client: Client,
    gate: Arc<Gate>,
}

impl tower::Service<Request<Body>> for Limited {
    type Response = Response<SlotBody>;
    type Error = kube_client::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let gate = (!is_watch(&request)).then(|| self.gate.clone());
        let kind = Kind::of(request.method());
        Box::pin(async move {
            let slot = match &gate {
                // The semaphore is never closed.
                Some(gate) => gate
                    .slots
                    .clone()
                    .acquire_owned()
                    .await
                    .ok()
                    .map(|permit| Slot {
                        permit: Some(permit),
                        gate: gate.clone(),
                    }),
                None => None,
            };
            let sent = Instant::now();
            let response = client.send(request).await?;
            if let Some(gate) = gate {
                gate.answered(kind, sent.elapsed(), response.status());
            }
            Ok(response.map(|body| SlotBody { body, slot }))
        })
    }
}

/// A held slot: given back (or let go, see [`Gate::release`]) when dropped.
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    gate: Arc<Gate>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.gate.release(permit);
        }
    }
}

/// A response body that holds its request's slot until it is read or dropped.
struct SlotBody {
    body: Body,
    #[expect(dead_code, reason = "held for its Drop: gives the slot back")]
    slot: Option<Slot>,
}

impl http_body::Body for SlotBody {
    type Data = bytes::Bytes;
    type Error = kube_client::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Whether `request` is a watch (`?watch=true` or `?watch=1`), which is not counted.
fn is_watch(request: &Request<Body>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};

    use super::*;

    /// A server stand-in that answers after a delay the test sets, with a status it sets,
    /// and counts the requests it holds at once.
    #[derive(Clone, Default)]
    struct Server {
        delay_ms: Arc<AtomicU64>,
        status: Arc<AtomicU16>,
        holding: Arc<AtomicUsize>,
        busiest: Arc<AtomicUsize>,
    }

    impl Server {
        fn client(&self) -> Client {
            let server = self.clone();
            let service = tower::service_fn(move |_request: Request<Body>| {
                let server = server.clone();
                async move {
                    let now = server.holding.fetch_add(1, SeqCst) + 1;
                    server.busiest.fetch_max(now, SeqCst);
                    let delay = server.delay_ms.load(SeqCst);
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    server.holding.fetch_sub(1, SeqCst);
                    let status = match server.status.load(SeqCst) {
                        0 => StatusCode::OK,
                        code => StatusCode::from_u16(code).expect("a status code"),
                    };
                    let mut response = Response::new(Body::from(b"{}".to_vec()));
                    *response.status_mut() = status;
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            Client::new(service, "default")
        }

        /// Sends `batches` batches of `width` requests at once through `client`; returns
        /// the most requests the server held at once.
        async fn load(&self, client: &Client, batches: usize, width: usize) -> usize {
            self.busiest.store(0, SeqCst);
            for _ in 0..batches {
                let requests = (0..width).map(|_| {
                    let client = client.clone();
                    async move {
                        let request = Request::post("/api/v1/persistentvolumes")
                            .body(Body::from(b"{}".to_vec()))
                            .unwrap();
                        let response = client.send(request).await.expect("an answer");
                        // Read the body, as kube's request methods do.
                        let _ = http_body_util::BodyExt::collect(response.into_body()).await;
                    }
                });
                futures::future::join_all(requests).await;
            }
            self.busiest.load(SeqCst)
        }
    }

    fn limit(max: usize, adaptive: bool) -> InFlightLimit {
        InFlightLimit::build(NonZeroUsize::new(max).unwrap(), adaptive)
    }

    #[tokio::test(start_paused = true)]
    async fn late_answers_shrink_an_adaptive_bound_and_quick_ones_grow_it_back() {
        let server = Server::default();
        let limit = limit(16, true);
        let client = limit.wrap(server.client());

        // Answers in 2 ms at 16 in flight: on time, the bound stays at 16.
        server.delay_ms.store(2, SeqCst);
        assert_eq!(server.load(&client, 10, 16).await, 16);
        assert_eq!(limit.limit(), 16);

        // The server gets busy (another client): 40 ms answers are late, the bound shrinks
        // to 1 and the server then holds no more than the bound.
        server.delay_ms.store(40, SeqCst);
        server.load(&client, 20, 16).await;
        assert_eq!(limit.limit(), 1, "most answers late: down to one slot");
        assert_eq!(server.load(&client, 2, 16).await, 1);

        // Quiet again: one slot back per round of quick answers, up to 16, never above.
        server.delay_ms.store(2, SeqCst);
        server.load(&client, 40, 16).await;
        assert_eq!(limit.limit(), 16);
        assert_eq!(server.load(&client, 5, 32).await, 16);
        assert_eq!(limit.in_flight(), 0, "every slot is given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_bound_does_not_move() {
        let server = Server::default();
        let limit = limit(16, false);
        let client = limit.wrap(server.client());
        server.delay_ms.store(2, SeqCst);
        server.load(&client, 5, 16).await;
        server.delay_ms.store(40, SeqCst);
        assert_eq!(server.load(&client, 20, 32).await, 16);
        assert_eq!(limit.limit(), 16);
        server.status.store(429, SeqCst);
        assert_eq!(server.load(&client, 5, 32).await, 16);
        assert_eq!(limit.limit(), 16);
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_round_halves_the_bound() {
        let server = Server::default();
        let limit = limit(16, true);
        let client = limit.wrap(server.client());
        server.delay_ms.store(2, SeqCst);
        server.load(&client, 3, 16).await;
        assert_eq!(limit.limit(), 16);
        // Quick answers, but 429: each round halves the bound.
        server.status.store(429, SeqCst);
        server.load(&client, 1, 16).await;
        assert_eq!(limit.limit(), 8);
        server.load(&client, 1, 8).await;
        assert_eq!(limit.limit(), 4);
    }

    #[tokio::test]
    async fn slots_taken_away_while_held_are_let_go_as_they_come_back() {
        let limit = limit(16, true);
        let gate = &limit.gate;
        let held: Vec<_> = (0..16)
            .map(|_| gate.slots.clone().try_acquire_owned().unwrap())
            .collect();
        // Every slot is held when the bound falls to 4: the 12 cut are owed.
        gate.adapt().unwrap().set(4, &gate.slots);
        assert_eq!(gate.adapt().unwrap().debt, 12);
        assert_eq!(limit.in_flight(), 16);
        for permit in held {
            gate.release(permit);
        }
        assert_eq!(gate.adapt().unwrap().debt, 0);
        assert_eq!(gate.slots.available_permits(), 4);
        assert_eq!(limit.in_flight(), 0);

        // Growing gives slots back; shrinking while they are free takes them at once.
        gate.adapt().unwrap().set(6, &gate.slots);
        assert_eq!(gate.slots.available_permits(), 6);
        gate.adapt().unwrap().set(2, &gate.slots);
        assert_eq!(gate.slots.available_permits(), 2);
        assert_eq!(gate.adapt().unwrap().debt, 0);
    }

    /// Feeds `adapt` one answer of `kind` per entry of `ms` (how long it took), at `at`,
    /// moving the bound as a gate does; returns the bound set by the last answer, if any.
    fn answers(adapt: &mut Adapt, kind: Kind, ms: &[u64], at: Instant) -> Option<usize> {
        let slots = Semaphore::new(adapt.limit);
        let mut next = None;
        for &ms in ms {
            next = adapt.answered(kind, Duration::from_millis(ms), false, at);
            if let Some(limit) = next {
                adapt.set(limit, &slots);
            }
        }
        next
    }

    #[test]
    fn answers_are_late_against_the_quickest_of_their_kind() {
        let now = Instant::now();
        let mut adapt = Adapt::new(4);
        assert_eq!(answers(&mut adapt, Kind::Read, &[1, 1, 1], now), None);
        assert_eq!(answers(&mut adapt, Kind::Read, &[1], now), Some(4));
        // Writes are not late against quick reads: each kind has its own norm.
        assert_eq!(
            answers(&mut adapt, Kind::Write, &[10, 11, 10, 12], now),
            Some(4)
        );
        assert_eq!(
            answers(&mut adapt, Kind::Write, &[80, 80, 80, 80], now),
            Some(3),
            "80 ms against a 10 ms norm is late"
        );
        // The norm is the quickest of this window and the last: in the next window the
        // 10 ms answers still count, in the one after they are forgotten.
        let next = now + NORM_WINDOW + Duration::from_secs(1);
        assert_eq!(
            answers(&mut adapt, Kind::Write, &[80, 80, 80], next),
            Some(2)
        );
        let after = next + NORM_WINDOW + Duration::from_secs(1);
        assert_eq!(answers(&mut adapt, Kind::Write, &[80, 80], after), Some(3));
        // Half late holds the bound; a throttled answer halves it whatever the times.
        assert_eq!(
            answers(&mut adapt, Kind::Write, &[80, 80, 400], after),
            Some(3)
        );
        adapt.answered(Kind::Write, Duration::from_millis(80), true, after);
        assert_eq!(answers(&mut adapt, Kind::Write, &[80, 80], after), Some(1));
    }

    fn request(uri: &str) -> Request<Body> {
        Request::get(uri).body(Body::empty()).unwrap()
    }

    #[test]
    fn only_watch_requests_are_watches() {
        let cases = [
            (
                "/api/v1/persistentvolumeclaims?watch=true&resourceVersion=5",
                true,
            ),
            (
                "/api/v1/persistentvolumeclaims?resourceVersion=5&watch=1",
                true,
            ),
            ("/api/v1/persistentvolumeclaims?watch=false", false),
            (
                "/api/v1/persistentvolumeclaims?allowWatchBookmarks=true",
                false,
            ),
            ("/api/v1/persistentvolumeclaims", false),
            (
                "/api/v1/namespaces/watch/persistentvolumeclaims/watch",
                false,
            ),
        ];
        for (uri, watch) in cases {
            assert_eq!(is_watch(&request(uri)), watch, "{uri}");
        }
    }
}
