//! The HTTP front: one axum fallback handler that routes by path, applies fault rules,
//! dispatches to the verbs and logs every request.

pub(crate) mod auth;
pub(crate) mod discovery;
pub(crate) mod openapi;
pub(crate) mod protobuf;
pub(crate) mod read;
pub(crate) mod route;
pub(crate) mod table;
pub(crate) mod watch;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::Value;

use crate::delete::DeleteOptions;
use crate::fault::{self, RequestKey, Verb};
use crate::fields::FieldValidation;
use crate::load::{Class, Gate};
use crate::ops::Scope;
use crate::patch;
use crate::requests::RequestRecord;
use crate::resources::ResourceDef;
use crate::shared::Shared;
use crate::status::{ApiError, ApiResult};
use crate::store;

use self::route::{ResourcePath, Route};

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// What the handlers share: the store and the cost model, and who the requests come from.
#[derive(Debug)]
pub(crate) struct Front {
    pub(crate) shared: Arc<Shared>,
    pub(crate) gate: Arc<Gate>,
    /// The client label requests are counted under (`pv-binder` for the in-process binder,
    /// `client` for everyone on the socket).
    pub(crate) client: &'static str,
}

/// The router serving every path.
pub(crate) fn router(front: Front) -> Router {
    Router::new().fallback(handle).with_state(Arc::new(front))
}

fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut resp = (code, body.into()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn value_response(v: &Value) -> Response {
    json_response(StatusCode::OK, serde_json::to_vec(v).unwrap_or_default())
}

/// The class a request is admitted as, or `None` for requests outside the model (watches,
/// health checks, metrics), as kube-apiserver leaves long-running requests out of its bounds.
fn class_of(method: &Method, route: &Route, query: &str) -> Option<Class> {
    match route {
        Route::Health | Route::Metrics => None,
        Route::Resource(_) if *method == Method::GET => {
            let q = route::query(query);
            let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
            (!watch).then_some(Class::Read)
        }
        _ if *method == Method::GET || *method == Method::HEAD => Some(Class::Read),
        Route::Resource(_) if *method == Method::PATCH => Some(Class::Patch),
        _ => Some(Class::Write),
    }
}

async fn handle(State(front): State<Arc<Front>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let route = route::parse(&path);
    let admitted = match class_of(&parts.method, &route, &query) {
        Some(class) => match front.gate.admit(class) {
            Ok(admitted) => Some(admitted),
            Err(err) => {
                let resp = err.into_response();
                let verb = if class == Class::Read { "get" } else { "write" };
                front
                    .gate
                    .count(verb, "", None, resp.status().as_u16(), front.client);
                return resp;
            }
        },
        None => None,
    };
    if let Some(latency) = admitted.as_ref().map(|a| a.latency)
        && !latency.is_zero()
    {
        tokio::time::sleep(latency).await;
    }
    let resp = serve(&front, parts, body, path, query, route).await;
    drop(admitted);
    resp
}

async fn serve(
    front: &Arc<Front>,
    parts: http::request::Parts,
    body: Body,
    path: String,
    query: String,
    route: Route,
) -> Response {
    let shared = &front.shared;
    let mut record = RequestRecord {
        verb: "other".into(),
        path: path.clone(),
        query: query.clone(),
        status: 0,
        resource: String::new(),
        subresource: None,
        name: None,
        namespace: None,
        user: None,
    };
    let resp = match route {
        Route::Resource(rp) if auth::serves(&rp) => {
            record.verb = "create".into();
            record.resource = rp.plural.clone();
            match axum::body::to_bytes(body, MAX_BODY).await {
                Ok(bytes) => match auth::review(parts.method == Method::POST, &rp, &bytes) {
                    Ok(review) => json_response(
                        StatusCode::CREATED,
                        serde_json::to_vec(&review).unwrap_or_default(),
                    ),
                    Err(err) => err.into_response(),
                },
                Err(_) => too_large().into_response(),
            }
        }
        Route::Resource(rp) => {
            let q = route::query(&query);
            match resource(
                front,
                &parts.method,
                &parts.headers,
                rp,
                &q,
                body,
                &mut record,
            )
            .await
            {
                Ok(resp) => resp,
                Err(err) => err.into_response(),
            }
        }
        other if parts.method != Method::GET => {
            let _ = other;
            ApiError::method_not_allowed().into_response()
        }
        Route::Metrics => {
            record.verb = "metrics".into();
            metrics_response(&front.gate)
        }
        other => {
            record.verb = "discovery".into();
            discovery_response(shared, other)
        }
    };
    record.status = resp.status().as_u16();
    if record.verb == "metrics" {
        // Reading the counters does not count.
        shared.record(record);
        return resp;
    }
    front.gate.count(
        &record.verb,
        &record.resource,
        record.subresource.as_deref(),
        record.status,
        front.client,
    );
    shared.record(record);
    resp
}

/// `/metrics`: the request counters and the requests in flight, in the Prometheus text
/// format.
fn metrics_response(gate: &Gate) -> Response {
    use std::fmt::Write as _;
    let escape = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::from(
        "# HELP kube_sim_requests_total Requests answered, by audit verb, resource, subresource, code and client.\n\
         # TYPE kube_sim_requests_total counter\n",
    );
    for ((verb, resource, subresource, code, client), n) in gate.counts() {
        let _ = writeln!(
            out,
            "kube_sim_requests_total{{verb=\"{}\",resource=\"{}\",subresource=\"{}\",code=\"{code}\",client=\"{client}\"}} {n}",
            escape(&verb),
            escape(&resource),
            escape(&subresource),
        );
    }
    let _ = write!(
        out,
        "# HELP kube_sim_requests_in_flight Reads and writes in flight (watches not counted).\n\
         # TYPE kube_sim_requests_in_flight gauge\n\
         kube_sim_requests_in_flight {}\n\
         # HELP kube_sim_open_connections Open client connections.\n\
         # TYPE kube_sim_open_connections gauge\n\
         kube_sim_open_connections {}\n\
         # HELP kube_sim_open_connections_peak The most client connections open at once since the start.\n\
         # TYPE kube_sim_open_connections_peak gauge\n\
         kube_sim_open_connections_peak {}\n",
        gate.in_flight(),
        gate.connections(),
        gate.peak_connections(),
    );
    let mut resp = (StatusCode::OK, out).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

fn discovery_response(shared: &Shared, route: Route) -> Response {
    let reg = || shared.state();
    let doc = match route {
        Route::Version => Some(discovery::version()),
        Route::Health => {
            let mut resp = (StatusCode::OK, "ok").into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return resp;
        }
        Route::CoreVersions => Some(discovery::core_versions(&shared.address)),
        Route::Groups => Some(discovery::group_list(&reg().registry)),
        Route::Group(g) => discovery::group(&reg().registry, &g),
        Route::Resources { group, version } => {
            discovery::resource_list(&reg().registry, &group, &version)
        }
        Route::OpenApiRoot => Some(openapi::root(&reg().registry)),
        Route::OpenApi { group, version } => openapi::document(&reg().registry, &group, &version),
        Route::Resource(_) | Route::Metrics | Route::Unknown => None,
    };
    match doc {
        Some(doc) => value_response(&doc),
        None => ApiError::no_route().into_response(),
    }
}

/// Resolves the type and checks the path shape against its scope.
fn resolve(shared: &Shared, rp: &ResourcePath) -> ApiResult<Arc<ResourceDef>> {
    let def = shared
        .state()
        .registry
        .lookup(&rp.group, &rp.version, &rp.plural)
        .ok_or_else(ApiError::no_route)?;
    if !def.namespaced && rp.namespace.is_some() {
        return Err(ApiError::no_route());
    }
    if def.namespaced && rp.namespace.is_none() && rp.name.is_some() {
        return Err(ApiError::no_route());
    }
    match rp.subresource.as_deref() {
        None => {}
        Some("status") if def.has_status(&rp.version) => {}
        Some(_) => return Err(ApiError::no_route()),
    }
    Ok(def)
}

fn verb_of(method: &Method, rp: &ResourcePath, q: &HashMap<String, String>) -> ApiResult<Verb> {
    let named = rp.name.is_some();
    let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
    Ok(match (method.as_str(), named) {
        ("GET", true) => Verb::Get,
        ("GET", false) if watch => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) if rp.subresource.is_none() => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) if rp.subresource.is_none() => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed()),
    })
}

/// The user of the request's bearer token, when the sim minted it; `None` without a token
/// (an unrestricted client).
///
/// # Errors
/// With [`Builder::rbac`](crate::Builder::rbac) on, 401 for a token the sim did not mint
/// (ignored with it off).
fn user_of(shared: &Shared, headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Ok(None);
    };
    match shared.tokens().user(token.trim()) {
        Some(user) => Ok(Some(user.to_owned())),
        None if shared.rbac => Err(crate::rbac::unauthorized()),
        None => Ok(None),
    }
}

/// With [`Builder::rbac`](crate::Builder::rbac) on: whether the stored RBAC objects let
/// `user` make the request.
///
/// # Errors
/// 403 for a request no rule grants.
fn authorize(
    shared: &Shared,
    user: &str,
    rp: &ResourcePath,
    verb: Verb,
    q: &HashMap<String, String>,
) -> ApiResult<()> {
    // A list or watch of one object by its name is authorized for that name, as
    // kube-apiserver does; a create has no name yet.
    let selected = q.get("fieldSelector").and_then(|s| {
        s.split(',')
            .find_map(|term| term.trim().strip_prefix("metadata.name="))
    });
    let name = match verb {
        Verb::Create | Verb::DeleteCollection => None,
        Verb::List | Verb::Watch => selected,
        _ => rp.name.as_deref(),
    };
    let attrs = crate::rbac::Attributes {
        user,
        verb: verb.as_str(),
        group: &rp.group,
        resource: &rp.plural,
        subresource: rp.subresource.as_deref(),
        namespace: rp.namespace.as_deref(),
        name,
    };
    if crate::rbac::allowed(&shared.state(), &attrs) {
        Ok(())
    } else {
        Err(crate::rbac::forbidden(&attrs))
    }
}

/// Parses a create or update body: JSON, or YAML when the content type says so.
fn parse_body(headers: &HeaderMap, body: &[u8], def: &ResourceDef) -> ApiResult<Value> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let media = ct.split(';').next().unwrap_or_default().trim();
    let parsed = match media {
        "" | "application/json" | "*/*" => serde_json::from_slice::<Value>(body).map_err(|e| {
            ApiError::bad_request(format!(
                "{kind} in version \"v1\" cannot be handled as a {kind}: {e}",
                kind = def.kind
            ))
        })?,
        "application/yaml" => patch::parse_apply(body)?,
        protobuf::MEDIA_TYPE if protobuf::accepts(def) => protobuf::decode(def, body)?,
        _ => {
            let mut accepted = vec!["application/json", "application/yaml"];
            if protobuf::accepts(def) {
                accepted.push(protobuf::MEDIA_TYPE);
            }
            return Err(ApiError::unsupported_media_type(&accepted));
        }
    };
    Ok(parsed)
}

fn too_large() -> ApiError {
    ApiError::new(
        413,
        "RequestEntityTooLarge",
        "the request body is too large",
    )
}

/// Runs a write and takes the warnings it queued (dropped unknown fields).
fn with_warnings<T>(
    state: &mut store::State,
    f: impl FnOnce(&mut store::State) -> T,
) -> (T, Vec<String>) {
    state.warnings.clear();
    let out = f(state);
    (out, std::mem::take(&mut state.warnings))
}

/// A `Warning` header value as the real server writes it: `299 - "text"`, with `"` and
/// `\` escaped.
fn warning_header(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
}

async fn resource(
    front: &Arc<Front>,
    method: &Method,
    headers: &HeaderMap,
    rp: ResourcePath,
    q: &HashMap<String, String>,
    body: Body,
    record: &mut RequestRecord,
) -> ApiResult<Response> {
    let shared = &front.shared;
    record.resource = rp.plural.clone();
    record.subresource = rp.subresource.clone();
    record.name = rp.name.clone();
    record.namespace = rp.namespace.clone();
    let verb = verb_of(method, &rp, q);
    if let Ok(verb) = verb {
        record.verb = verb.as_str().into();
    }
    record.user = user_of(shared, headers)?;
    if shared.rbac
        && let (Ok(verb), Some(user)) = (&verb, record.user.as_deref())
    {
        authorize(shared, user, &rp, *verb, q)?;
    }
    let def = resolve(shared, &rp)?;
    let verb = verb?;
    if verb == Verb::Create && def.namespaced && rp.namespace.is_none() {
        return Err(ApiError::method_not_allowed());
    }
    let body: Bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| too_large())?;
    let create_name = (verb == Verb::Create)
        .then(|| serde_json::from_slice::<Value>(&body).ok())
        .flatten()
        .and_then(|v| v["metadata"]["name"].as_str().map(str::to_string));
    let key = RequestKey {
        verb,
        resource: &rp.plural,
        subresource: rp.subresource.as_deref(),
        name: rp.name.as_deref().or(create_name.as_deref()),
        namespace: rp.namespace.as_deref(),
    };
    inject_fault(shared, &key).await?;
    let (dry_run, validation) = write_options(verb, q)?;
    let ns = rp.namespace.as_deref().unwrap_or_default();
    let scope = Scope {
        def: &def,
        version: &rp.version,
        ns,
        dry_run,
        validation,
    };
    let name = rp.name.as_deref().unwrap_or_default();
    let status_only = rp.subresource.is_some();
    let ok = |code: StatusCode, b: Bytes| Ok(json_response(code, b));
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let as_table = table::wanted(accept);
    match verb {
        Verb::Get => ok(StatusCode::OK, read::get(shared, &def, ns, name, as_table)?),
        Verb::List => ok(
            StatusCode::OK,
            read::list(
                shared,
                &def,
                &rp.version,
                rp.namespace.as_deref(),
                q,
                as_table,
            )?,
        ),
        Verb::Watch => watch::start(
            shared.clone(),
            front.gate.clone(),
            &def,
            &rp.version,
            rp.namespace.as_deref(),
            q,
            as_table,
        ),
        Verb::Create => {
            let value = parse_body(headers, &body, &def)?;
            let (stored, warnings) =
                shared.write(|s| with_warnings(s, |s| s.create(&scope, value)));
            written(StatusCode::CREATED, stored?.bytes.clone(), warnings)
        }
        Verb::Update => {
            let value = parse_body(headers, &body, &def)?;
            let (result, warnings) =
                shared.write(|s| with_warnings(s, |s| s.update(&scope, name, value, status_only)));
            let (stored, created) = result?;
            written(created_or_ok(created), stored.bytes.clone(), warnings)
        }
        Verb::Patch => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = patch::kind_of(ct, &def)?;
            let manager = q.get("fieldManager").map(String::as_str);
            let (result, warnings) = shared.write(|s| {
                with_warnings(s, |s| {
                    s.patch(&scope, name, kind, &body, status_only, manager)
                })
            });
            let (stored, created) = result?;
            written(created_or_ok(created), stored.bytes.clone(), warnings)
        }
        Verb::Delete => {
            let opts = DeleteOptions::parse(&body)?;
            let stored = shared.write(|s| s.delete(&scope, name, &opts))?;
            ok(StatusCode::OK, stored.bytes.clone())
        }
        Verb::DeleteCollection => delete_collection(shared, &rp, q, &body, scope),
    }
}

/// The fault a test scheduled for this request, if any: its latency, then its error.
async fn inject_fault(shared: &Shared, key: &RequestKey<'_>) -> ApiResult<()> {
    let action = fault::take(&mut shared.faults(), key, tokio::time::Instant::now());
    if let Some(action) = action {
        if !action.latency.is_zero() {
            tokio::time::sleep(action.latency).await;
        }
        if let Some(status) = action.status {
            let mut err = ApiError::new(status.code, status.reason, status.message);
            err.details.retry_after_seconds = status.retry_after_seconds;
            return Err(err);
        }
    }
    Ok(())
}

/// A write's options from the query: whether it is a dry run, and its field validation.
fn write_options(verb: Verb, q: &HashMap<String, String>) -> ApiResult<(bool, FieldValidation)> {
    let dry_run = match q.get("dryRun").map(String::as_str) {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unsupported dry run option: {other:?}"
            )));
        }
    };
    let options_kind = match verb {
        Verb::Create => "CreateOptions",
        Verb::Update => "UpdateOptions",
        _ => "PatchOptions",
    };
    let validation = match verb {
        Verb::Create | Verb::Update | Verb::Patch => {
            FieldValidation::parse(q.get("fieldValidation").map(String::as_str), options_kind)?
        }
        _ => FieldValidation::default(),
    };
    Ok((dry_run, validation))
}

/// The answer to a write: the object, with the warnings it raised as `Warning` headers.
fn written(code: StatusCode, b: Bytes, warnings: Vec<String>) -> ApiResult<Response> {
    let mut resp = json_response(code, b);
    for warning in warnings {
        if let Ok(value) = HeaderValue::from_str(&warning_header(&warning)) {
            resp.headers_mut().append(header::WARNING, value);
        }
    }
    Ok(resp)
}

/// Deletes every object of `scope`'s type (in the path's namespace, when it names one)
/// that the query's selectors match.
fn delete_collection(
    shared: &Shared,
    rp: &ResourcePath,
    q: &HashMap<String, String>,
    body: &Bytes,
    scope: Scope<'_>,
) -> ApiResult<Response> {
    let def = scope.def;
    let opts = DeleteOptions::parse(body)?;
    let sel = read::Selectors::from_query(q, def)?;
    shared.write(|s| {
        let names: Vec<(String, String)> = s
            .table(&def.key)
            .into_iter()
            .flat_map(|t| t.iter())
            .filter(|(k, o)| rp.namespace.as_deref().is_none_or(|n| n == k.0) && sel.matches(o))
            .map(|(k, _)| k.clone())
            .collect();
        for (obj_ns, obj_name) in names {
            let scope = Scope {
                ns: &obj_ns,
                ..scope
            };
            s.delete(&scope, &obj_name, &opts)?;
        }
        Ok::<_, ApiError>(())
    })?;
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    Ok(value_response(&status))
}

/// 201 for a write that created its object, 200 for one that changed it.
fn created_or_ok(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}
