//! Watch streams: newline-delimited `{"type":..,"object":..}` events, replayed from the
//! history and then live, with bookmarks, timeouts, selectors and 410 Expired.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, header};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::http::read::Selectors;
use crate::http::table;
use crate::load::Gate;
use crate::resources::{ResKey, ResourceDef};
use crate::shared::Shared;
use crate::status::{ApiError, ApiResult};
use crate::store::{Event, EventType, Stored};

/// One open watch.
struct Watch {
    shared: Arc<Shared>,
    /// The cost model, for the delivery delay of each chunk.
    gate: Arc<Gate>,
    res: ResKey,
    ns: Option<String>,
    sel: Selectors,
    /// `"kind":..,"apiVersion":..` of bookmark objects.
    type_meta: String,
    last_rv: u64,
    /// The history position after the last pull (`State::popped`); `None` until the
    /// first pull, which then searches by `last_rv`.
    next_pos: Option<u64>,
    pending: BytesMut,
    done: bool,
    changed: watch::Receiver<u64>,
    cut: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
    deadline: Option<Instant>,
    bookmarks: bool,
    /// Send objects as one-row Tables (for `kubectl get -w`); `None` sends objects.
    table: Option<Arc<ResourceDef>>,
}

fn push_line(out: &mut BytesMut, kind: &str, object: &[u8]) {
    out.put_slice(b"{\"type\":\"");
    out.put_slice(kind.as_bytes());
    out.put_slice(b"\",\"object\":");
    out.put_slice(object);
    out.put_slice(b"}\n");
}

impl Watch {
    fn wants(&self, ns: &str) -> bool {
        self.ns.as_deref().is_none_or(|want| want == ns)
    }

    fn push_object(&mut self, kind: &str, object: &Stored) {
        match &self.table {
            Some(def) => {
                let rv = &object.value["metadata"]["resourceVersion"];
                let t = table::table(
                    def,
                    &[object],
                    serde_json::json!({"resourceVersion": rv}),
                    false,
                );
                push_line(
                    &mut self.pending,
                    kind,
                    &serde_json::to_vec(&t).unwrap_or_default(),
                );
            }
            None => push_line(&mut self.pending, kind, &object.bytes),
        }
    }

    fn push_error(&mut self, err: &ApiError) {
        let body = serde_json::to_vec(&err.to_json()).unwrap_or_default();
        push_line(&mut self.pending, "ERROR", &body);
        self.done = true;
    }

    fn push_bookmark(&mut self, initial_end: bool) {
        let annotations = if initial_end {
            ",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}"
        } else {
            ""
        };
        let object = format!(
            "{{{},\"metadata\":{{\"resourceVersion\":\"{}\"{annotations}}}}}",
            self.type_meta, self.last_rv
        );
        push_line(&mut self.pending, "BOOKMARK", object.as_bytes());
    }

    fn push_event(&mut self, event: &Event) {
        let matches = |o: &Stored| self.sel.matches(o);
        let kind = match event.kind {
            EventType::Added => matches(&event.object).then_some("ADDED"),
            EventType::Deleted => event
                .prev
                .as_deref()
                .is_none_or(matches)
                .then_some("DELETED"),
            EventType::Modified => {
                let now = matches(&event.object);
                let before = event.prev.as_deref().is_none_or(matches);
                match (before, now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
        };
        if let Some(kind) = kind {
            self.push_object(kind, &event.object);
        }
    }

    /// Takes the history events after `last_rv` for this watch.
    fn pull(&mut self) {
        let events: Vec<Arc<Event>> = {
            let state = self.shared.state();
            if self.last_rv < state.evicted_rv {
                let err = ApiError::expired(format!(
                    "too old resource version: {} ({})",
                    self.last_rv, state.min_rv
                ));
                drop(state);
                self.push_error(&err);
                return;
            }
            let after = self.last_rv;
            let wanted = |e: &&Arc<Event>| {
                e.rv > after
                    && (Arc::ptr_eq(&e.res, &self.res) || e.res == self.res)
                    && self.wants(&e.namespace)
            };
            // Resume where the last pull stopped; search by version only the first time
            // (or when the history moved past that position).
            let events = match self.next_pos.and_then(|pos| state.events_from(pos)) {
                Some(from) => from.filter(wanted).cloned().collect(),
                None => state.events_after(after).filter(wanted).cloned().collect(),
            };
            self.next_pos = Some(state.end_pos());
            self.last_rv = self.last_rv.max(state.rv);
            events
        };
        for event in &events {
            self.push_event(event);
        }
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if !self.pending.is_empty() {
                return Some(self.pending.split().freeze());
            }
            if self.done {
                return None;
            }
            self.changed.borrow_and_update();
            self.pull();
            if !self.pending.is_empty() && !self.done {
                // Delivery takes a while; events written meanwhile join this chunk.
                let delay = self.gate.watch_delay();
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                    self.changed.borrow_and_update();
                    self.pull();
                }
            }
            if !self.pending.is_empty() || self.done {
                continue;
            }
            let interval = self.shared.bookmark_interval;
            let deadline = self.deadline;
            tokio::select! {
                changed = self.changed.changed() => {
                    if changed.is_err() {
                        self.done = true;
                    }
                }
                _ = self.cut.changed() => self.done = true,
                _ = self.shutdown.changed() => self.done = true,
                () = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => self.done = true,
                () = tokio::time::sleep(interval), if self.bookmarks => self.push_bookmark(false),
            }
        }
    }
}

/// Starts a watch on `def` (in `ns`, or all namespaces).
///
/// # Errors
/// 400 for bad selectors or a malformed resourceVersion or timeout.
pub(crate) fn start(
    shared: Arc<Shared>,
    gate: Arc<Gate>,
    def: &ResourceDef,
    version: &str,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    as_table: bool,
) -> ApiResult<Response> {
    let sel = Selectors::from_query(q, def)?;
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
    let timeout = match q.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => None,
        Some(t) => Some(
            t.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t:?}")))?,
        ),
    };
    let rv = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    let send_initial = flag("sendInitialEvents");
    let type_meta = format!(
        "\"kind\":{},\"apiVersion\":{}",
        serde_json::Value::from(def.kind.as_str()),
        serde_json::Value::from(def.api_version(version))
    );
    let mut w = Watch {
        changed: shared.subscribe(&def.key),
        cut: shared.cut.subscribe(),
        shutdown: shared.shutdown.subscribe(),
        shared: shared.clone(),
        gate,
        res: def.key.clone(),
        ns: ns.map(str::to_string),
        sel,
        type_meta,
        last_rv: 0,
        next_pos: None,
        pending: BytesMut::new(),
        done: false,
        deadline: timeout.map(|t| Instant::now() + Duration::from_secs(t)),
        bookmarks: flag("allowWatchBookmarks"),
        table: as_table.then(|| Arc::new(def.clone())),
    };
    if *w.shutdown.borrow() {
        w.done = true;
    }
    match rv {
        Some(rv) if !send_initial => {
            let min = shared.state().min_rv;
            if rv < min {
                w.push_error(&ApiError::expired(format!(
                    "too old resource version: {rv} ({min})"
                )));
            }
            w.last_rv = rv;
        }
        _ => {
            let initial: Vec<Arc<Stored>> = {
                let state = shared.state();
                w.last_rv = state.rv;
                state
                    .table(&def.key)
                    .into_iter()
                    .flat_map(|t| t.iter())
                    .filter(|(k, o)| w.wants(&k.0) && w.sel.matches(o))
                    .map(|(_, o)| o.clone())
                    .collect()
            };
            for obj in &initial {
                w.push_object("ADDED", obj);
            }
            if send_initial && w.bookmarks {
                w.push_bookmark(true);
            }
        }
    }
    let stream = futures::stream::unfold(w, |mut w| async move {
        w.next_chunk()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), w))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
