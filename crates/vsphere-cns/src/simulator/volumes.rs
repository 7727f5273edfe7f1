//! What the mutating CNS calls do to the simulator's volumes: each returns the inner XML
//! of the task's result (`Ok`) or of its error (`Err`).

use std::collections::HashSet;

use super::wire;
use super::{Shared, SimVolume};
use crate::soap::decode;
use crate::wire::{EntityMetadata, MoRef};
use crate::xml::Element;

pub(super) fn invalid_argument(property: &str) -> Result<String, String> {
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

pub(super) fn create(shared: &Shared, call: &Element) -> Result<String, String> {
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
    let mut data = shared.data();
    let id = data.volume_ids.next();
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
    data.volumes.insert(id.to_string(), volume);
    drop(data);
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

pub(super) fn delete(shared: &Shared, call: &Element) -> Result<String, String> {
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

pub(super) fn update(shared: &Shared, call: &Element) -> Result<String, String> {
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
