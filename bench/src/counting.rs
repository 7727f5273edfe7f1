//! A tower layer that counts the requests a kube `Client` sends, by verb and resource.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
};

use futures::{FutureExt, future::BoxFuture};
use http::{Method, Request, Response};
use tower::{Layer, Service};

/// Request counts keyed by `(verb, resource)`, e.g. `("create", "persistentvolumes")`.
pub(crate) type Counts = BTreeMap<(String, String), u64>;

#[derive(Debug, Default)]
struct Tally {
    requests: Counts,
    /// Responses that were not 2xx, keyed by `(verb resource, status)`.
    failures: BTreeMap<(String, u16), u64>,
    /// Request body bytes of writes (create, update, patch), by resource.
    written: BTreeMap<String, u64>,
}

/// Shared counters; clones count into the same tally.
#[derive(Clone, Debug, Default)]
pub(crate) struct ApiCounter(Arc<Mutex<Tally>>);

impl ApiCounter {
    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The requests so far.
    pub(crate) fn snapshot(&self) -> Counts {
        self.tally().requests.clone()
    }

    /// The non-2xx responses so far, keyed by `"verb resource"` and status code.
    pub(crate) fn failures(&self) -> BTreeMap<(String, u16), u64> {
        self.tally().failures.clone()
    }

    /// Request body bytes of writes (create, update, patch) so far, by resource.
    pub(crate) fn written_bytes(&self) -> BTreeMap<String, u64> {
        self.tally().written.clone()
    }

    /// Watch requests sent so far (a kube watcher sends one after its initial list).
    pub(crate) fn watches(&self) -> u64 {
        let tally = self.tally();
        let watches = tally
            .requests
            .iter()
            .filter(|((verb, _), _)| verb == "watch");
        watches.map(|(_, n)| n).sum()
    }
}

/// Wraps a service so every request is counted in an [`ApiCounter`].
#[derive(Clone, Debug)]
pub(crate) struct CountLayer(pub(crate) ApiCounter);

impl<S> Layer<S> for CountLayer {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counter: self.0.clone(),
        }
    }
}

/// The counting service.
#[derive(Clone, Debug)]
pub(crate) struct Counted<S> {
    inner: S,
    counter: ApiCounter,
}

impl<S, B, RB> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: http_body::Body,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let uri = request.uri();
        let (verb, resource) = classify(request.method(), uri.path(), uri.query().unwrap_or(""));
        let body = request.body().size_hint().exact().unwrap_or(0);
        {
            let mut tally = self.counter.tally();
            *tally
                .requests
                .entry((verb.to_owned(), resource.clone()))
                .or_default() += 1;
            if matches!(verb, "create" | "update" | "patch") {
                *tally.written.entry(resource.clone()).or_default() += body;
            }
        }
        let counter = self.counter.clone();
        self.inner
            .call(request)
            .map(move |result| {
                if let Ok(response) = &result
                    && !response.status().is_success()
                {
                    let key = (format!("{verb} {resource}"), response.status().as_u16());
                    *counter.tally().failures.entry(key).or_default() += 1;
                }
                result
            })
            .boxed()
    }
}

/// A built `Client` as a tower service, so a layer can be put in front of it.
#[derive(Clone)]
pub(crate) struct ClientService(pub(crate) kube_client::Client);

impl Service<Request<kube_client::client::Body>> for ClientService {
    type Response = Response<kube_client::client::Body>;
    type Error = kube_client::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube_client::client::Body>) -> Self::Future {
        let client = self.0.clone();
        async move { client.send(request).await }.boxed()
    }
}

/// The Kubernetes verb and resource (`plural` or `plural/subresource`) of a request.
pub(crate) fn classify(method: &Method, path: &str, query: &str) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let skip = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => segments.len(),
    };
    let mut rest = &segments[skip.min(segments.len())..];
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        rest = &rest[2..];
    }
    let collection = rest.len() <= 1;
    let resource = match rest {
        [] => path.to_owned(),
        [plural] | [plural, _] => (*plural).to_owned(),
        [plural, _, sub, ..] => format!("{plural}/{sub}"),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if collection => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_kubernetes_requests() {
        let cases = [
            (
                Method::GET,
                "/api/v1/persistentvolumes",
                "",
                "list",
                "persistentvolumes",
            ),
            (
                Method::GET,
                "/api/v1/persistentvolumes",
                "watch=true&resourceVersion=5",
                "watch",
                "persistentvolumes",
            ),
            (Method::GET, "/api/v1/nodes/n1", "", "get", "nodes"),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                "",
                "create",
                "events",
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/persistentvolumeclaims/c/status",
                "",
                "patch",
                "persistentvolumeclaims/status",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns",
                "",
                "get",
                "namespaces",
            ),
            (
                Method::DELETE,
                "/api/v1/persistentvolumes/pv",
                "",
                "delete",
                "persistentvolumes",
            ),
        ];
        for (method, path, query, verb, resource) in cases {
            assert_eq!(
                classify(&method, path, query),
                (verb, resource.to_owned()),
                "{path}"
            );
        }
    }
}
