//! [`InFlightLimit`]: a bound on the requests a controller keeps in flight, fixed or
//! giving way when the API server throttles (429, 503).

use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use kube_client::Client;
use kube_client::client::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument as _;

/// A bound on the requests a controller keeps in flight to the API server, shared by
/// every client it [wraps](Self::wrap).
///
/// A request waits for a slot before it is sent and holds it until its response body has
/// been read (or dropped). Watches are not counted: they stay open for minutes and would
/// hold their slot all that time. Slots are handed out in the order they were asked for.
/// A throttling server (429 with `Retry-After`) is retried by the client's retry policy
/// while the request keeps its slot, so the whole controller slows down with the server.
///
/// A bound made by [`adaptive`](Self::adaptive) also gives way when the server says it is
/// overloaded: the requests are counted in rounds (as many answers as the bound), and a
/// round with a 429 or 503 answer (API Priority and Fairness rejecting the request, or a
/// server that cannot take it) takes half of the slots away, down to one; a round without
/// one gives one slot back, up to the maximum. How long answers take is no signal: a
/// server that answers slowly because it is busy with this controller's own requests and
/// everyone else's is still serving them, and API Priority and Fairness already shares it
/// among its clients, so shrinking on latency would only give up throughput. (Answers the
/// client retried as the server asked are seen as their last answer.)
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
    /// fewer after 429 and 503 answers, `max` again once they stop.
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

    /// Learns from an answer with `status`.
    fn answered(&self, status: StatusCode) {
        let Some(mut adapt) = self.adapt() else {
            return;
        };
        let throttled = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        );
        if let Some(limit) = adapt.answered(throttled) {
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

/// What an adaptive bound knows.
#[derive(Debug)]
struct Adapt {
    max: usize,
    /// The bound now.
    limit: usize,
    /// Slots taken away while their requests held them: let go as they come back.
    debt: usize,
    /// Answers left in this round, and whether one of the round was a 429 or 503.
    left: usize,
    throttled: bool,
}

impl Adapt {
    fn new(max: usize) -> Self {
        Self {
            max,
            limit: max,
            debt: 0,
            left: max,
            throttled: false,
        }
    }

    /// Counts an answer (`throttled`: a 429 or 503); at the end of a round, returns the
    /// next bound.
    fn answered(&mut self, throttled: bool) -> Option<usize> {
        self.throttled |= throttled;
        self.left = self.left.saturating_sub(1);
        if self.left > 0 {
            return None;
        }
        let limit = if self.throttled {
            self.limit / 2
        } else {
            self.limit + 1
        };
        let limit = limit.clamp(1, self.max);
        (self.left, self.throttled) = (limit, false);
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
        // The wait for a slot, for whoever measures where a request's time goes (the
        // fields are computed only when the span is enabled).
        let waiting = gate
            .as_ref()
            .map(|_| tracing::debug_span!("slot_wait", what = %RequestKind(&request)));
        Box::pin(async move {
            let slot = match &gate {
                // The semaphore is never closed.
                Some(gate) => gate
                    .slots
                    .clone()
                    .acquire_owned()
                    .instrument(waiting.unwrap_or_else(tracing::Span::none))
                    .await
                    .ok()
                    .map(|permit| Slot {
                        permit: Some(permit),
                        gate: gate.clone(),
                    }),
                None => None,
            };
            let response = client.send(request).await?;
            if let Some(gate) = gate {
                gate.answered(response.status());
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

/// A request's method and resource (`POST persistentvolumes`, `PUT configmaps`), for the
/// `slot_wait` span.
struct RequestKind<'a>(&'a Request<Body>);

impl std::fmt::Display for RequestKind<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // /api/v1/[namespaces/NS/]RESOURCE[/NAME...], /apis/GROUP/VERSION/[namespaces/NS/]RESOURCE...
        let mut segments = self.0.uri().path().split('/').filter(|s| !s.is_empty());
        let skip = match segments.next() {
            Some("apis") => 2,
            _ => 1,
        };
        let mut rest = segments.skip(skip);
        let mut resource = rest.next().unwrap_or_default();
        if resource == "namespaces"
            && let (Some(_), Some(inner)) = (rest.next(), rest.next())
        {
            resource = inner;
        }
        write!(f, "{} {resource}", self.0.method())
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
    use std::time::Duration;

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
    async fn an_adaptive_bound_gives_way_to_throttling_not_to_slow_answers() {
        let server = Server::default();
        let limit = limit(16, true);
        let client = limit.wrap(server.client());

        // Answers in 2 ms at 16 in flight, then in 200 ms (a busy server): the bound
        // stays at 16, latency alone is no signal.
        server.delay_ms.store(2, SeqCst);
        assert_eq!(server.load(&client, 10, 16).await, 16);
        server.delay_ms.store(200, SeqCst);
        assert_eq!(server.load(&client, 20, 16).await, 16);
        assert_eq!(limit.limit(), 16, "slow answers keep the bound");

        // 429s: half the slots per round, down to one, and the server then holds no more.
        server.status.store(429, SeqCst);
        server.load(&client, 10, 16).await;
        assert_eq!(limit.limit(), 1, "throttled rounds halve the bound");
        assert_eq!(server.load(&client, 2, 16).await, 1);

        // Answered again: one slot back per round, up to 16, never above.
        server.status.store(0, SeqCst);
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
