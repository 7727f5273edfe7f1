//! SOAP dispatch and the behaviour of each simulated method.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::wire;
use super::{FaultSite, Shared, SimFault, SimRequest, SimVolume, TaskRecord};
use crate::client::SESSION_COOKIE;
use crate::soap::decode;
use crate::soap::encode::VIM_NS;
use crate::types::{CnsVolume, CnsVolumeId, EntityMetadata, MoRef};
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
                |State(s): State<Arc<Shared>>, headers: HeaderMap, body: String| async move {
                    handle(s, Endpoint::Sdk, headers, body).await
                },
            ),
        )
        .route(
            "/vsanHealth",
            post(
                |State(s): State<Arc<Shared>>, headers: HeaderMap, body: String| async move {
                    handle(s, Endpoint::VsanHealth, headers, body).await
                },
            ),
        )
        .with_state(shared)
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

fn invalid_argument(property: &str) -> Result<String, String> {
    Err(wire::localized_fault(
        "InvalidArgument",
        &format!("A specified parameter was not correct: {property}"),
        &format!("<invalidProperty>{property}</invalidProperty>"),
    ))
}

fn not_found_result(volume_id: &str) -> Result<String, String> {
    let fault = wire::localized_fault(
        "NotFound",
        "The object or item referred to could not be found.",
        "",
    );
    Ok(wire::volume_result(
        "CnsVolumeOperationResult",
        volume_id,
        "",
        Some(&fault),
    ))
}

fn run_task(shared: &Shared, method: &str, call: &Element, injected: Option<SimFault>) -> Reply {
    let outcome = match injected {
        Some(f) if f.site == FaultSite::Task => {
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
        None => match method {
            "CnsCreateVolume" => create(shared, call),
            "CnsDeleteVolume" => delete(shared, call),
            _ => update(shared, call),
        },
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

fn create(shared: &Shared, call: &Element) -> Result<String, String> {
    let specs: Vec<&Element> = call.children_named("createSpecs").collect();
    let [spec] = specs.as_slice() else {
        return invalid_argument("InputSpec");
    };
    let backing = spec.child("backingObjectDetails");
    if backing.and_then(Element::xsi_type) != Some("CnsBlockBackingDetails") {
        return invalid_argument("createSpecs.backingObjectDetails");
    }
    let name = spec.child_text("name").unwrap_or_default().to_owned();
    if name.is_empty() {
        return invalid_argument("createSpecs.name");
    }
    let datastores: Vec<MoRef> = spec
        .children_named("datastores")
        .filter_map(decode::moref)
        .collect();
    let Some(datastore) = datastores
        .into_iter()
        .find(|d| shared.datastores.contains_key(&d.value))
    else {
        return invalid_argument("createSpecs.datastores");
    };
    let capacity_in_mb = backing
        .and_then(|b| b.child_text("capacityInMb"))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    let id = CnsVolumeId::new(uuid::Uuid::new_v4().to_string());
    let volume = SimVolume {
        id: id.clone(),
        name: name.clone(),
        capacity_in_mb,
        datastore: datastore.clone(),
        profile_id: spec
            .child("profile")
            .and_then(|p| p.child_text("profileId"))
            .map(str::to_owned),
        metadata: spec
            .child("metadata")
            .map(decode::metadata)
            .unwrap_or_default(),
    };
    shared.data().volumes.insert(id.to_string(), volume);
    let mut extra = String::new();
    crate::xml::escape(&name, &mut extra);
    let extra = format!(
        "<name>{extra}</name><placementResults><datastore type=\"Datastore\">{}</datastore></placementResults>",
        datastore.value
    );
    Ok(wire::volume_result(
        "CnsVolumeCreateResult",
        id.as_str(),
        &extra,
        None,
    ))
}

fn delete(shared: &Shared, call: &Element) -> Result<String, String> {
    let ids: Vec<&str> = call
        .children_named("volumeIds")
        .filter_map(|v| v.child_text("id"))
        .collect();
    let [id] = ids.as_slice() else {
        return invalid_argument("volumeIds");
    };
    if shared.data().volumes.remove(*id).is_none() {
        return not_found_result(id);
    }
    Ok(wire::volume_result(
        "CnsVolumeOperationResult",
        id,
        "",
        None,
    ))
}

fn same_entity(a: &EntityMetadata, b: &EntityMetadata) -> bool {
    a.entity_type == b.entity_type && a.entity_name == b.entity_name && a.namespace == b.namespace
}

fn update(shared: &Shared, call: &Element) -> Result<String, String> {
    let specs: Vec<&Element> = call.children_named("updateSpecs").collect();
    let [spec] = specs.as_slice() else {
        return invalid_argument("updateSpecs");
    };
    let id = spec
        .child("volumeId")
        .and_then(|v| v.child_text("id"))
        .unwrap_or_default();
    if id.is_empty() {
        return invalid_argument("updateSpecs.volumeId");
    }
    let metadata = spec
        .child("metadata")
        .map(decode::metadata)
        .unwrap_or_default();
    if metadata.container_cluster.cluster_id.is_empty() {
        return invalid_argument("updateSpecs.metadata.containerCluster");
    }
    let mut types = HashSet::new();
    if !metadata
        .entity_metadata
        .iter()
        .all(|e| types.insert(e.entity_type))
    {
        return invalid_argument("updateSpecs.metadata.entityMetadata");
    }
    let mut data = shared.data();
    let Some(volume) = data.volumes.get_mut(id) else {
        return not_found_result(id);
    };
    for entity in metadata.entity_metadata {
        volume
            .metadata
            .entity_metadata
            .retain(|e| !same_entity(e, &entity));
        if entity.delete != Some(true) {
            volume.metadata.entity_metadata.push(EntityMetadata {
                delete: None,
                ..entity
            });
        }
    }
    for cluster in metadata.container_cluster_array {
        volume
            .metadata
            .container_cluster_array
            .retain(|c| c.cluster_id != cluster.cluster_id);
        volume.metadata.container_cluster_array.push(cluster);
    }
    volume.metadata.container_cluster = metadata.container_cluster;
    Ok(wire::volume_result(
        "CnsVolumeOperationResult",
        id,
        "",
        None,
    ))
}
