//! SOAP dispatch and the behaviour of each simulated method.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::oneshot;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::volumes::{create, delete, update};
use super::wire;
use super::{FaultSite, Shared, SimFault, SimRequest, TaskRecord};
use crate::client::SESSION_COOKIE;
use crate::soap::decode;
use crate::soap::encode::VIM_NS;
use crate::wire::CnsVolume;
use crate::xml::Element;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Sdk,
    VsanHealth,
}

struct Reply {
    status: StatusCode,
    body: String,
    set_cookie: Option<String>,
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/xml; charset=utf-8"),
        );
        if let Some(cookie) = self.set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
            headers.insert(header::SET_COOKIE, cookie);
        }
        response
    }
}

fn ok(body: String) -> Reply {
    Reply {
        status: StatusCode::OK,
        body,
        set_cookie: None,
    }
}

fn fault(fault_type: &str, message: &str, detail: &str) -> Reply {
    Reply {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        body: wire::fault(fault_type, message, detail),
        set_cookie: None,
    }
}

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/sdk/vimServiceVersions.xml",
            get(|| async { ok(wire::service_versions("urn:vim25")) }),
        )
        .route(
            "/sdk/vsanServiceVersions.xml",
            get(|| async { ok(wire::service_versions("urn:vsan")) }),
        )
        .route(
            "/sdk",
            post(
                |State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes| async move {
                    dispatch(s, Endpoint::Sdk, headers, body).await
                },
            ),
        )
        .route(
            "/vsanHealth",
            post(
                |State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes| async move {
                    dispatch(s, Endpoint::VsanHealth, headers, body).await
                },
            ),
        )
        .with_state(shared)
}

/// Answers one SOAP request. The work runs in a task owned by the simulator, so a call
/// whose client disconnects (a client-side timeout) still completes, as a vCenter task
/// does; the answer then goes nowhere.
async fn dispatch(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let Ok(body) = String::from_utf8(body.to_vec()) else {
        return fault("InvalidRequest", "the request body is not UTF-8", "");
    };
    let (answer, answered) = oneshot::channel();
    let work = handle(Arc::clone(&shared), endpoint, headers, body);
    shared.spawn(async move {
        let _ = answer.send(work.await);
    });
    answered
        .await
        .unwrap_or_else(|_| fault("SystemError", "the simulator stopped before answering", ""))
}

/// The `vmware_soap_session=...` pair of the `Cookie` header.
fn session_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .find(|pair| pair.starts_with(&format!("{SESSION_COOKIE}=")))
        .map(str::to_owned)
}

async fn handle(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: String,
) -> Reply {
    let call = match Element::parse(&body) {
        Ok(root) => match root.child("Body").and_then(|b| b.children.first()) {
            Some(call) => call.clone(),
            None => return fault("InvalidRequest", "SOAP Body is missing or empty", ""),
        },
        Err(e) => return fault("InvalidRequest", &e.to_string(), ""),
    };
    let method = call.name.clone();
    let session = session_of(&headers);
    let delay = {
        let mut data = shared.data();
        let authenticated = session.as_ref().is_some_and(|s| data.sessions.contains(s));
        data.requests.push(SimRequest {
            path: match endpoint {
                Endpoint::Sdk => "/sdk".into(),
                Endpoint::VsanHealth => "/vsanHealth".into(),
            },
            method: method.clone(),
            soap_action: headers
                .get("soapaction")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            authenticated,
        });
        data.delays.get(&method).copied()
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    if method.starts_with("Cns") != (endpoint == Endpoint::VsanHealth) {
        return fault(
            "MethodNotFound",
            &format!("{method} is not served on this endpoint"),
            "",
        );
    }
    let injected = {
        let mut data = shared.data();
        let authenticated = session.as_ref().is_some_and(|s| data.sessions.contains(s));
        if !authenticated && !matches!(method.as_str(), "RetrieveServiceContent" | "Login") {
            let this = call
                .child("_this")
                .and_then(decode::moref)
                .unwrap_or_default();
            let detail = format!(
                "<object type=\"{}\">{}</object><privilegeId>System.View</privilegeId>",
                this.kind, this.value
            );
            return fault("NotAuthenticated", "", &detail);
        }
        data.faults.get_mut(&method).and_then(VecDeque::pop_front)
    };
    let mutating = matches!(
        method.as_str(),
        "CnsCreateVolume" | "CnsDeleteVolume" | "CnsUpdateVolumeMetadata"
    );
    if let Some(f) = &injected
        && (f.site == FaultSite::Call || !mutating)
    {
        return fault(&f.fault_type, &f.message, "");
    }
    match method.as_str() {
        "RetrieveServiceContent" => ok(wire::service_content()),
        "Login" => login(&shared, &call),
        "Logout" => {
            if let Some(session) = session {
                shared.data().sessions.remove(&session);
            }
            ok(wire::empty("Logout", VIM_NS))
        }
        "RetrievePropertiesEx" => task_info(&shared, &call),
        "FindByInventoryPath" => find_by_inventory_path(&shared, &call),
        "CnsQueryVolume" => query(&shared, &call),
        _ if mutating => run_task(&shared, &method, &call, injected),
        _ => fault(
            "MethodNotFound",
            &format!("{method} is not implemented by the simulator"),
            "",
        ),
    }
}

fn login(shared: &Shared, call: &Element) -> Reply {
    let user = call.child_text("userName").unwrap_or_default();
    let password = call.child_text("password").unwrap_or_default();
    if user != shared.user || password != shared.password {
        return fault("InvalidLogin", "Login failure", "");
    }
    let key = uuid::Uuid::new_v4().to_string();
    let pair = format!("{SESSION_COOKIE}=\"{key}\"");
    shared.data().sessions.insert(pair.clone());
    Reply {
        status: StatusCode::OK,
        body: wire::login(&key, user),
        set_cookie: Some(format!("{pair}; Path=/; HttpOnly; Secure;")),
    }
}

fn find_by_inventory_path(shared: &Shared, call: &Element) -> Reply {
    let path = call.child_text("inventoryPath").unwrap_or_default();
    let found = path.rsplit_once("/datastore/").and_then(|(_, name)| {
        shared
            .datastores
            .iter()
            .find(|(_, (n, _))| n == name)
            .map(|(id, _)| id.clone())
    });
    let mut w = crate::xml::XmlWriter::new();
    w.start_with("FindByInventoryPathResponse", &[("xmlns", VIM_NS)]);
    if let Some(id) = found {
        w.moref("returnval", "Datastore", &id);
    }
    w.end("FindByInventoryPathResponse");
    ok(wire::envelope(&w.finish()))
}

fn task_info(shared: &Shared, call: &Element) -> Reply {
    let task = call
        .child("specSet")
        .and_then(|s| s.child("objectSet"))
        .and_then(|o| o.child("obj"))
        .and_then(decode::moref)
        .unwrap_or_default();
    let record = shared.data().tasks.get(&task.value).cloned();
    match record {
        Some(record) => ok(wire::task_info(&task.value, &record, &shared.user)),
        None => fault(
            "ManagedObjectNotFound",
            "The object has already been deleted or has not been completely created",
            &format!("<obj type=\"Task\">{}</obj>", task.value),
        ),
    }
}

fn query(shared: &Shared, call: &Element) -> Reply {
    let Some(filter) = call.child("filter").filter(|f| f.xsi_type().is_some()) else {
        return fault(
            "InvalidArgument",
            "filter needs xsi:type",
            "<invalidProperty>filter</invalidProperty>",
        );
    };
    let ids: HashSet<&str> = filter
        .children_named("volumeIds")
        .filter_map(|v| v.child_text("id"))
        .collect();
    let names: HashSet<&str> = filter
        .children_named("names")
        .map(|n| n.text.as_str())
        .collect();
    let clusters: HashSet<&str> = filter
        .children_named("containerClusterIds")
        .map(|n| n.text.as_str())
        .collect();
    let data = shared.data();
    let volumes: Vec<CnsVolume> = data
        .volumes
        .values()
        .filter(|v| ids.is_empty() || ids.contains(v.id.as_str()))
        .filter(|v| names.is_empty() || names.contains(v.name.as_str()))
        .filter(|v| {
            clusters.is_empty()
                || clusters.contains(v.metadata.container_cluster.cluster_id.as_str())
                || v.metadata
                    .container_cluster_array
                    .iter()
                    .any(|c| clusters.contains(c.cluster_id.as_str()))
        })
        .map(|v| CnsVolume {
            volume_id: v.id.clone(),
            datastore_url: shared
                .datastores
                .get(&v.datastore.value)
                .map(|(_, url)| url.clone()),
            name: Some(v.name.clone()),
            volume_type: Some("BLOCK".into()),
            storage_policy_id: v.profile_id.clone(),
            metadata: Some(v.metadata.clone()),
            capacity_in_mb: Some(v.capacity_in_mb),
            backing_disk_id: Some(v.id.to_string()),
            compliance_status: Some("compliant".into()),
            health_status: Some("green".into()),
        })
        .collect();
    ok(wire::query(&volumes))
}

fn run_task(shared: &Shared, method: &str, call: &Element, injected: Option<SimFault>) -> Reply {
    let apply = || match method {
        "CnsCreateVolume" => create(shared, call),
        "CnsDeleteVolume" => delete(shared, call),
        _ => update(shared, call),
    };
    let outcome = match injected {
        Some(f) if f.site == FaultSite::Task => {
            Err(wire::localized_fault(&f.fault_type, &f.message, ""))
        }
        Some(f) if f.site == FaultSite::TaskAfterChange => {
            let _ = apply();
            Err(wire::localized_fault(&f.fault_type, &f.message, ""))
        }
        Some(f) => {
            let id = first_volume_id(call).unwrap_or_default();
            let fault = wire::localized_fault(&f.fault_type, &f.message, "");
            Ok(wire::volume_result(
                "CnsVolumeOperationResult",
                &id,
                "",
                Some(&fault),
            ))
        }
        None => apply(),
    };
    let mut data = shared.data();
    data.next_task += 1;
    let task_id = format!("task-{}", data.next_task);
    data.tasks.insert(
        task_id.clone(),
        TaskRecord {
            method: method.to_owned(),
            outcome,
        },
    );
    ok(wire::task(method, &task_id))
}

/// The first `volumeId/id` or `volumeIds/id` in a request, for injected result faults.
fn first_volume_id(element: &Element) -> Option<String> {
    for child in &element.children {
        if matches!(child.name.as_str(), "volumeId" | "volumeIds")
            && let Some(id) = child.child_text("id")
        {
            return Some(id.to_owned());
        }
        if let Some(id) = first_volume_id(child) {
            return Some(id);
        }
    }
    None
}
