//! Request bodies, byte for byte as govmomi writes them: struct field order, default
//! namespace on the method element, unprefixed descendants, and
//! `_XMLSchema-instance:type` on polymorphic fields.

use crate::wire::{
    CnsVolume, ContainerCluster, EntityMetadata, MoRef, QueryFilter, VolumeCreateSpec,
    VolumeMetadata, VolumeMetadataUpdateSpec,
};
use crate::xml::XmlWriter;

/// `urn:vim25`: body namespace of vim methods (session, property collector).
pub(crate) const VIM_NS: &str = "urn:vim25";
/// `urn:vsan`: body namespace of CNS methods.
pub(crate) const VSAN_NS: &str = "urn:vsan";
/// The well-known CnsVolumeManager MoRef value.
pub(crate) const CNS_VOLUME_MANAGER: &str = "cns-volume-manager";

/// Wraps a method element in govmomi's envelope.
pub(crate) fn envelope(method_xml: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Envelope xmlns=\"{}\"><Body>{method_xml}</Body></Envelope>",
        crate::xml::SOAP_ENV_NS
    )
}

fn method(name: &str, ns: &str, this: &MoRef, body: impl FnOnce(&mut XmlWriter)) -> String {
    let mut w = XmlWriter::new();
    w.start_with(name, &[("xmlns", ns)]);
    w.moref("_this", &this.kind, &this.value);
    body(&mut w);
    w.end(name);
    envelope(&w.finish())
}

fn cns_manager() -> MoRef {
    MoRef::new("CnsVolumeManager", CNS_VOLUME_MANAGER)
}

/// `RetrieveServiceContent` on `ServiceInstance`.
pub(crate) fn retrieve_service_content() -> String {
    method(
        "RetrieveServiceContent",
        VIM_NS,
        &MoRef::new("ServiceInstance", "ServiceInstance"),
        |_| {},
    )
}

/// `SessionManager.Login` (`_this, userName, password, locale`).
pub(crate) fn login(session_manager: &MoRef, user: &str, password: &str, locale: &str) -> String {
    method("Login", VIM_NS, session_manager, |w| {
        w.text("userName", user)
            .text("password", password)
            .text("locale", locale);
    })
}

/// `SessionManager.Logout`.
pub(crate) fn logout(session_manager: &MoRef) -> String {
    method("Logout", VIM_NS, session_manager, |_| {})
}

/// `SearchIndex.FindByInventoryPath`, for example `DC0/datastore/LocalDS_0`.
pub(crate) fn find_by_inventory_path(search_index: &MoRef, path: &str) -> String {
    method("FindByInventoryPath", VIM_NS, search_index, |w| {
        w.text("inventoryPath", path);
    })
}

/// `PropertyCollector.RetrievePropertiesEx` of a task's `info`.
pub(crate) fn retrieve_task_info(property_collector: &MoRef, task: &MoRef) -> String {
    method("RetrievePropertiesEx", VIM_NS, property_collector, |w| {
        w.start("specSet").start("propSet");
        w.text("type", "Task")
            .text("all", "false")
            .text("pathSet", "info");
        w.end("propSet").start("objectSet");
        w.moref("obj", &task.kind, &task.value)
            .text("skip", "false");
        w.end("objectSet").end("specSet");
        w.start("options").end("options");
    })
}

/// `CnsCreateVolume` with one spec.
pub(crate) fn cns_create_volume(spec: &VolumeCreateSpec) -> String {
    method("CnsCreateVolume", VSAN_NS, &cns_manager(), |w| {
        w.start("createSpecs");
        w.text("name", &spec.name)
            .text("volumeType", spec.volume_type.as_str());
        for datastore in &spec.datastores {
            w.moref("datastores", &datastore.kind, &datastore.value);
        }
        write_metadata(w, "metadata", &spec.metadata);
        w.start_typed("backingObjectDetails", "CnsBlockBackingDetails");
        if spec.capacity_in_mb != 0 {
            w.text("capacityInMb", &spec.capacity_in_mb.to_string());
        }
        w.opt_text("backingDiskId", spec.backing_disk_id.as_deref());
        w.end("backingObjectDetails");
        if let Some(profile_id) = &spec.profile_id {
            w.start_typed("profile", "VirtualMachineDefinedProfileSpec");
            w.text("profileId", profile_id).end("profile");
        }
        w.end("createSpecs");
    })
}

/// `CnsUpdateVolumeMetadata` with one spec.
pub(crate) fn cns_update_volume_metadata(spec: &VolumeMetadataUpdateSpec) -> String {
    method("CnsUpdateVolumeMetadata", VSAN_NS, &cns_manager(), |w| {
        w.start("updateSpecs");
        w.start("volumeId")
            .text("id", spec.volume_id.as_str())
            .end("volumeId");
        write_metadata(w, "metadata", &spec.metadata);
        w.end("updateSpecs");
    })
}

/// `CnsDeleteVolume` (`_this, volumeIds+, deleteDisk`).
pub(crate) fn cns_delete_volume(ids: &[&str], delete_disk: bool) -> String {
    method("CnsDeleteVolume", VSAN_NS, &cns_manager(), |w| {
        for id in ids {
            w.start("volumeIds").text("id", id).end("volumeIds");
        }
        w.text("deleteDisk", if delete_disk { "true" } else { "false" });
    })
}

/// `CnsQueryVolume` with a `CnsQueryFilter` (always typed: vcsim hangs without it).
pub(crate) fn cns_query_volume(filter: &QueryFilter) -> String {
    method("CnsQueryVolume", VSAN_NS, &cns_manager(), |w| {
        w.start_typed("filter", "CnsQueryFilter");
        for id in &filter.volume_ids {
            w.start("volumeIds")
                .text("id", id.as_str())
                .end("volumeIds");
        }
        for name in &filter.names {
            w.text("names", name);
        }
        for cluster in &filter.container_cluster_ids {
            w.text("containerClusterIds", cluster);
        }
        w.end("filter");
    })
}

fn write_bool(w: &mut XmlWriter, name: &str, value: Option<bool>) {
    if let Some(value) = value {
        w.text(name, if value { "true" } else { "false" });
    }
}

fn write_cluster(w: &mut XmlWriter, tag: &str, cluster: &ContainerCluster) {
    w.start(tag);
    w.text("clusterType", &cluster.cluster_type)
        .text("clusterId", &cluster.cluster_id)
        .text("vSphereUser", &cluster.vsphere_user)
        .opt_text("clusterFlavor", cluster.cluster_flavor.map(|f| f.as_str()))
        .opt_text(
            "clusterDistribution",
            cluster.cluster_distribution.as_deref(),
        );
    write_bool(w, "delete", cluster.delete);
    w.end(tag);
}

fn write_entity(w: &mut XmlWriter, entity: &EntityMetadata) {
    w.start_typed("entityMetadata", "CnsKubernetesEntityMetadata");
    w.text("entityName", &entity.entity_name);
    for label in &entity.labels {
        w.start("labels")
            .text("key", &label.key)
            .text("value", &label.value)
            .end("labels");
    }
    write_bool(w, "delete", entity.delete);
    w.opt_text("clusterId", entity.cluster_id.as_deref())
        .text("entityType", entity.entity_type.as_str())
        .opt_text("namespace", entity.namespace.as_deref());
    for reference in &entity.referred_entity {
        w.start("referredEntity")
            .text("entityType", reference.entity_type.as_str())
            .text("entityName", &reference.entity_name)
            .opt_text("namespace", reference.namespace.as_deref())
            .opt_text("clusterId", reference.cluster_id.as_deref())
            .end("referredEntity");
    }
    w.end("entityMetadata");
}

/// Writes a `CnsVolumeMetadata` under `tag`.
pub(crate) fn write_metadata(w: &mut XmlWriter, tag: &str, metadata: &VolumeMetadata) {
    w.start(tag);
    write_cluster(w, "containerCluster", &metadata.container_cluster);
    for entity in &metadata.entity_metadata {
        write_entity(w, entity);
    }
    for cluster in &metadata.container_cluster_array {
        write_cluster(w, "containerClusterArray", cluster);
    }
    w.end(tag);
}

/// Writes a `CnsVolume` the way vcsim does (no `xsi:type` on `backingObjectDetails`).
#[cfg_attr(not(any(test, feature = "simulator")), allow(dead_code))]
pub(crate) fn write_volume(w: &mut XmlWriter, volume: &CnsVolume) {
    w.start("volumes");
    w.start("volumeId")
        .text("id", volume.volume_id.as_str())
        .end("volumeId");
    w.opt_text("datastoreUrl", volume.datastore_url.as_deref())
        .opt_text("name", volume.name.as_deref())
        .opt_text("volumeType", volume.volume_type.as_deref())
        .opt_text("storagePolicyId", volume.storage_policy_id.as_deref());
    if let Some(metadata) = &volume.metadata {
        write_metadata(w, "metadata", metadata);
    }
    w.start("backingObjectDetails");
    if let Some(capacity) = volume.capacity_in_mb {
        w.text("capacityInMb", &capacity.to_string());
    }
    w.opt_text("backingDiskId", volume.backing_disk_id.as_deref());
    w.end("backingObjectDetails");
    w.opt_text("complianceStatus", volume.compliance_status.as_deref())
        .opt_text("healthStatus", volume.health_status.as_deref());
    w.end("volumes");
}
