//! Response parsing: namespace-aware, by local name, unknown elements ignored.

use crate::error::{Error, Result};
use crate::wire::{
    CnsVolume, CnsVolumeId, ContainerCluster, EntityMetadata, EntityReference, EntityType,
    KeyValue, MoRef, VolumeMetadata,
};
use crate::xml::{Element, SOAP_ENV_NS};

/// The parts of `ServiceContent` the client uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceContent {
    pub(crate) session_manager: MoRef,
    pub(crate) property_collector: MoRef,
    pub(crate) search_index: MoRef,
    pub(crate) api_version: String,
    pub(crate) full_name: String,
}

/// A `LocalizedMethodFault` or SOAP fault, flattened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FaultInfo {
    pub(crate) fault_type: String,
    pub(crate) message: String,
    /// `volumeId/id` inside the fault (`CnsAlreadyRegisteredFault`, `CnsVolumeNotFoundFault`).
    pub(crate) volume_id: Option<CnsVolumeId>,
}

impl FaultInfo {
    pub(crate) fn into_error(self, operation: &'static str) -> Error {
        Error::Fault {
            operation,
            fault_type: self.fault_type,
            message: self.message,
        }
    }
}

/// `TaskInfo.state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskState {
    Queued,
    Running,
    Success,
    Error,
}

/// One `CnsVolumeOperationResult` (or `CnsVolumeCreateResult`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct VolumeResult {
    pub(crate) volume_id: Option<CnsVolumeId>,
    pub(crate) name: Option<String>,
    pub(crate) fault: Option<FaultInfo>,
}

/// The parts of `TaskInfo` the client uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskInfo {
    pub(crate) state: TaskState,
    pub(crate) error: Option<FaultInfo>,
    /// `result/volumeResults`, when the result is a `CnsVolumeOperationBatchResult`.
    pub(crate) results: Vec<VolumeResult>,
}

fn protocol(operation: &'static str, detail: impl Into<String>) -> Error {
    Error::Protocol {
        operation,
        detail: detail.into(),
    }
}

/// Parses an envelope and returns the element inside `Body`, or the fault as an error.
///
/// The element is moved out of the parsed tree, not cloned.
pub(crate) fn body(xml: &str, operation: &'static str) -> Result<Element> {
    let mut root = Element::parse(xml).map_err(|e| protocol(operation, e.to_string()))?;
    if root.name != "Envelope" {
        return Err(protocol(
            operation,
            format!("root element is <{}>, not a SOAP Envelope", root.name),
        ));
    }
    let mut body = root
        .take_child("Body")
        .ok_or_else(|| protocol(operation, "SOAP Envelope has no Body"))?;
    drop(root);
    if body.children.is_empty() {
        return Err(protocol(operation, "SOAP Body is empty"));
    }
    let content = body.children.swap_remove(0);
    if content.name == "Fault" && content.ns.as_deref() == Some(SOAP_ENV_NS) {
        return Err(soap_fault(&content).into_error(operation));
    }
    Ok(content)
}

/// `soapenv:Fault`: the class is the `xsi:type` of the first element in `detail`
/// (or its name without the `Fault` suffix); the message is `faultstring`.
pub(crate) fn soap_fault(fault: &Element) -> FaultInfo {
    let detail = fault.child("detail").and_then(|d| d.children.first());
    let fault_type = detail
        .map(|d| {
            d.xsi_type()
                .map(str::to_owned)
                .unwrap_or_else(|| d.name.strip_suffix("Fault").unwrap_or(&d.name).to_owned())
        })
        .or_else(|| fault.child_text("faultcode").map(str::to_owned))
        .unwrap_or_else(|| "UnknownFault".to_owned());
    let message = with_details(fault.child_text("faultstring").unwrap_or_default(), detail);
    FaultInfo {
        fault_type,
        message,
        volume_id: detail.and_then(fault_volume_id),
    }
}

/// A `LocalizedMethodFault`: `<fault xsi:type=T>...</fault><localizedMessage>..`.
pub(crate) fn localized_fault(element: &Element) -> FaultInfo {
    let inner = element.child("fault");
    let fault_type = inner
        .and_then(Element::xsi_type)
        .unwrap_or("UnknownFault")
        .to_owned();
    let message = with_details(
        element.child_text("localizedMessage").unwrap_or_default(),
        inner,
    );
    FaultInfo {
        fault_type,
        message,
        volume_id: inner.and_then(fault_volume_id),
    }
}

fn fault_volume_id(fault: &Element) -> Option<CnsVolumeId> {
    volume_id(fault)
}

/// `volumeId/id`, when present and not empty.
fn volume_id(element: &Element) -> Option<CnsVolumeId> {
    element
        .child("volumeId")
        .and_then(|v| v.child_text("id"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(CnsVolumeId::from)
}

/// Appends the fault's simple fields (`invalidProperty`, `privilegeId`, `reason`, ...).
fn with_details(message: &str, fault: Option<&Element>) -> String {
    let details: Vec<String> = fault
        .map(|f| {
            f.children
                .iter()
                .filter(|c| c.children.is_empty() && !c.text.is_empty())
                .map(|c| format!("{}: {}", c.name, c.text))
                .collect()
        })
        .unwrap_or_default();
    match (message.is_empty(), details.is_empty()) {
        (_, true) => message.to_owned(),
        (true, false) => details.join(", "),
        (false, false) => format!("{message} ({})", details.join(", ")),
    }
}

/// Reads `namespaces/namespace/version` for `namespace` from a `*ServiceVersions.xml` file.
pub(crate) fn service_version(xml: &str, namespace: &str) -> Option<String> {
    let root = Element::parse(xml).ok()?;
    root.children_named("namespace")
        .find(|ns| ns.child_text("name") == Some(namespace))
        .and_then(|ns| ns.child_text("version"))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A MoRef element (`type` attribute plus text).
pub(crate) fn moref(element: &Element) -> Option<MoRef> {
    Some(MoRef::new(element.attr("type")?, element.text.trim()))
}

/// The `returnval` MoRef of a response, for example the Task of `CnsCreateVolume`.
pub(crate) fn returnval_moref(response: &Element, operation: &'static str) -> Result<MoRef> {
    response.child("returnval").and_then(moref).ok_or_else(|| {
        protocol(
            operation,
            "response has no returnval managed object reference",
        )
    })
}

/// `RetrieveServiceContentResponse`.
pub(crate) fn service_content(response: &Element) -> Result<ServiceContent> {
    const OP: &str = "RetrieveServiceContent";
    let rv = response
        .child("returnval")
        .ok_or_else(|| protocol(OP, "response has no returnval"))?;
    let get = |name: &str| {
        rv.child(name)
            .and_then(moref)
            .ok_or_else(|| protocol(OP, format!("ServiceContent has no {name}")))
    };
    let about = rv.child("about");
    let about_text = |name: &str| {
        about
            .and_then(|a| a.child_text(name))
            .unwrap_or_default()
            .to_owned()
    };
    Ok(ServiceContent {
        session_manager: get("sessionManager")?,
        property_collector: get("propertyCollector")?,
        search_index: rv
            .child("searchIndex")
            .and_then(moref)
            .unwrap_or_else(|| MoRef::new("SearchIndex", "SearchIndex")),
        api_version: about_text("apiVersion"),
        full_name: about_text("fullName"),
    })
}

/// `RetrievePropertiesExResponse` for a task's `info`.
pub(crate) fn task_info(response: &Element, operation: &'static str) -> Result<TaskInfo> {
    let val = response
        .child("returnval")
        .into_iter()
        .flat_map(|rv| rv.children_named("objects"))
        .flat_map(|o| o.children_named("propSet"))
        .find(|p| p.child_text("name") == Some("info"))
        .and_then(|p| p.child("val"))
        .ok_or_else(|| {
            protocol(
                operation,
                "task info missing from RetrievePropertiesEx response",
            )
        })?;
    let state = match val.child_text("state") {
        Some("queued") => TaskState::Queued,
        Some("running") => TaskState::Running,
        Some("success") => TaskState::Success,
        Some("error") => TaskState::Error,
        other => return Err(protocol(operation, format!("unknown task state {other:?}"))),
    };
    let results = val
        .child("result")
        .map(|r| {
            r.children_named("volumeResults")
                .map(volume_result)
                .collect()
        })
        .unwrap_or_default();
    Ok(TaskInfo {
        state,
        error: val.child("error").map(localized_fault),
        results,
    })
}

fn volume_result(element: &Element) -> VolumeResult {
    VolumeResult {
        volume_id: volume_id(element),
        name: element.child_text("name").map(str::to_owned),
        fault: element.child("fault").map(localized_fault),
    }
}

/// `CnsQueryVolumeResponse`: the volumes (an empty result has none).
pub(crate) fn query_result(response: &Element) -> Vec<CnsVolume> {
    response
        .child("returnval")
        .map(|rv| rv.children_named("volumes").map(volume).collect())
        .unwrap_or_default()
}

fn opt_text(element: &Element, name: &str) -> Option<String> {
    element.child_text(name).map(str::to_owned)
}

fn volume(element: &Element) -> CnsVolume {
    let backing = element.child("backingObjectDetails");
    CnsVolume {
        volume_id: element
            .child("volumeId")
            .and_then(|v| v.child_text("id"))
            .map(CnsVolumeId::from)
            .unwrap_or_default(),
        datastore_url: opt_text(element, "datastoreUrl"),
        name: opt_text(element, "name"),
        volume_type: opt_text(element, "volumeType"),
        storage_policy_id: opt_text(element, "storagePolicyId"),
        metadata: element.child("metadata").map(metadata),
        capacity_in_mb: backing
            .and_then(|b| b.child_text("capacityInMb"))
            .and_then(|c| c.trim().parse().ok()),
        backing_disk_id: backing.and_then(|b| opt_text(b, "backingDiskId")),
        compliance_status: opt_text(element, "complianceStatus"),
        health_status: opt_text(element, "healthStatus"),
    }
}

fn parse_bool(element: &Element, name: &str) -> Option<bool> {
    match element.child_text(name)?.trim() {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

fn cluster(element: &Element) -> ContainerCluster {
    ContainerCluster {
        cluster_type: opt_text(element, "clusterType").unwrap_or_default(),
        cluster_id: opt_text(element, "clusterId").unwrap_or_default(),
        vsphere_user: opt_text(element, "vSphereUser").unwrap_or_default(),
        cluster_flavor: element
            .child_text("clusterFlavor")
            .and_then(crate::wire::ClusterFlavor::parse),
        cluster_distribution: opt_text(element, "clusterDistribution"),
        delete: parse_bool(element, "delete"),
    }
}

fn entity(element: &Element) -> Option<EntityMetadata> {
    let entity_type = element
        .child_text("entityType")
        .and_then(EntityType::from_wire)?;
    Some(EntityMetadata {
        entity_name: opt_text(element, "entityName").unwrap_or_default(),
        labels: element
            .children_named("labels")
            .map(|l| KeyValue {
                key: opt_text(l, "key").unwrap_or_default(),
                value: opt_text(l, "value").unwrap_or_default(),
            })
            .collect(),
        delete: parse_bool(element, "delete"),
        cluster_id: opt_text(element, "clusterId"),
        entity_type,
        namespace: opt_text(element, "namespace"),
        referred_entity: element
            .children_named("referredEntity")
            .filter_map(|r| {
                Some(EntityReference {
                    entity_type: r.child_text("entityType").and_then(EntityType::from_wire)?,
                    entity_name: opt_text(r, "entityName").unwrap_or_default(),
                    namespace: opt_text(r, "namespace"),
                    cluster_id: opt_text(r, "clusterId"),
                })
            })
            .collect(),
    })
}

/// A `CnsVolumeMetadata` element. Entities of unknown types are skipped.
pub(crate) fn metadata(element: &Element) -> VolumeMetadata {
    VolumeMetadata {
        container_cluster: element
            .child("containerCluster")
            .map(cluster)
            .unwrap_or_default(),
        entity_metadata: element
            .children_named("entityMetadata")
            .filter_map(entity)
            .collect(),
        container_cluster_array: element
            .children_named("containerClusterArray")
            .map(cluster)
            .collect(),
    }
}
