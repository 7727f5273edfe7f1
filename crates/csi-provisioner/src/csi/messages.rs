//! The CSI v1 messages the sidecar sends and reads, written from the field numbers of the
//! CSI specification (`csi.proto`, package `csi.v1`). Only the fields this sidecar uses
//! are declared: protobuf skips unknown fields, so a driver that speaks a newer CSI
//! version is read correctly.

use std::collections::HashMap;

/// `GetPluginInfoRequest`: no fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoRequest {}

/// `GetPluginInfoResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    /// The driver's name (`hostpath.csi.k8s.io`): the provisioner name of the classes.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The driver's version, for logs.
    #[prost(string, tag = "2")]
    pub vendor_version: String,
    /// Opaque driver metadata.
    #[prost(map = "string, string", tag = "3")]
    pub manifest: HashMap<String, String>,
}

/// `GetPluginCapabilitiesRequest`: no fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesRequest {}

/// `GetPluginCapabilitiesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {
    /// What the plugin offers.
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<PluginCapability>,
}

/// `PluginCapability`: a oneof of a service or a volume-expansion capability.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapability {
    /// The capability.
    #[prost(oneof = "plugin_capability::Type", tags = "1, 2")]
    pub r#type: Option<plugin_capability::Type>,
}

/// The parts of [`PluginCapability`].
pub mod plugin_capability {
    /// `PluginCapability.type`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        /// `service = 1`.
        #[prost(message, tag = "1")]
        Service(Service),
        /// `volume_expansion = 2`.
        #[prost(message, tag = "2")]
        VolumeExpansion(VolumeExpansion),
    }

    /// `PluginCapability.Service`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Service {
        /// A [`ServiceType`].
        #[prost(enumeration = "ServiceType", tag = "1")]
        pub r#type: i32,
    }

    /// `PluginCapability.Service.Type`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum ServiceType {
        /// `UNKNOWN`.
        Unknown = 0,
        /// `CONTROLLER_SERVICE`: the plugin serves the Controller service.
        ControllerService = 1,
        /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`: volumes may not be equally reachable from
        /// every node (topology).
        VolumeAccessibilityConstraints = 2,
        /// `GROUP_CONTROLLER_SERVICE`.
        GroupControllerService = 3,
    }

    /// `PluginCapability.VolumeExpansion`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VolumeExpansion {
        /// `ONLINE = 1`, `OFFLINE = 2`.
        #[prost(int32, tag = "1")]
        pub r#type: i32,
    }
}

/// `ProbeRequest`: no fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeRequest {}

/// `ProbeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    /// `google.protobuf.BoolValue ready = 1`: absent means ready.
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

/// `google.protobuf.BoolValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    /// The value.
    #[prost(bool, tag = "1")]
    pub value: bool,
}

/// `ControllerGetCapabilitiesRequest`: no fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ControllerGetCapabilitiesRequest {}

/// `ControllerGetCapabilitiesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ControllerGetCapabilitiesResponse {
    /// What the Controller service offers.
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<ControllerServiceCapability>,
}

/// `ControllerServiceCapability`: a oneof holding one RPC capability.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ControllerServiceCapability {
    /// The capability.
    #[prost(oneof = "controller_service_capability::Type", tags = "1")]
    pub r#type: Option<controller_service_capability::Type>,
}

/// The parts of [`ControllerServiceCapability`].
pub mod controller_service_capability {
    /// `ControllerServiceCapability.type`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        /// `rpc = 1`.
        #[prost(message, tag = "1")]
        Rpc(Rpc),
    }

    /// `ControllerServiceCapability.RPC`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Rpc {
        /// An [`RpcType`].
        #[prost(enumeration = "RpcType", tag = "1")]
        pub r#type: i32,
    }

    /// `ControllerServiceCapability.RPC.Type`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum RpcType {
        /// `UNKNOWN`.
        Unknown = 0,
        /// `CREATE_DELETE_VOLUME`: the one the sidecar needs.
        CreateDeleteVolume = 1,
        /// `PUBLISH_UNPUBLISH_VOLUME`.
        PublishUnpublishVolume = 2,
        /// `LIST_VOLUMES`.
        ListVolumes = 3,
        /// `GET_CAPACITY`.
        GetCapacity = 4,
        /// `CREATE_DELETE_SNAPSHOT`.
        CreateDeleteSnapshot = 5,
        /// `LIST_SNAPSHOTS`.
        ListSnapshots = 6,
        /// `CLONE_VOLUME`.
        CloneVolume = 7,
        /// `PUBLISH_READONLY`.
        PublishReadonly = 8,
        /// `EXPAND_VOLUME`.
        ExpandVolume = 9,
        /// `LIST_VOLUMES_PUBLISHED_NODES`.
        ListVolumesPublishedNodes = 10,
        /// `VOLUME_CONDITION`.
        VolumeCondition = 11,
        /// `GET_VOLUME`.
        GetVolume = 12,
        /// `SINGLE_NODE_MULTI_WRITER`: the driver distinguishes single-writer from
        /// multi-writer access on one node (ReadWriteOncePod).
        SingleNodeMultiWriter = 13,
        /// `MODIFY_VOLUME`.
        ModifyVolume = 14,
    }
}

/// `CreateVolumeRequest`. Its `Debug` form leaves the secrets out.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct CreateVolumeRequest {
    /// The idempotency key: a second create with the same name returns the same volume.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The size asked for.
    #[prost(message, optional, tag = "2")]
    pub capacity_range: Option<CapacityRange>,
    /// How the volume will be used (one per access mode of the claim).
    #[prost(message, repeated, tag = "3")]
    pub volume_capabilities: Vec<VolumeCapability>,
    /// The class's parameters, without the `csi.storage.k8s.io/` keys.
    #[prost(map = "string, string", tag = "4")]
    pub parameters: HashMap<String, String>,
    /// The provisioner secret's data. Never logged.
    #[prost(map = "string, string", tag = "5")]
    pub secrets: HashMap<String, String>,
    /// A snapshot or volume to copy from (not sent by this sidecar).
    #[prost(message, optional, tag = "6")]
    pub volume_content_source: Option<VolumeContentSource>,
    /// Where the volume must (requisite) or should (preferred) be reachable from.
    #[prost(message, optional, tag = "7")]
    pub accessibility_requirements: Option<TopologyRequirement>,
    /// VolumeAttributesClass parameters (not sent by this sidecar).
    #[prost(map = "string, string", tag = "8")]
    pub mutable_parameters: HashMap<String, String>,
}

impl std::fmt::Debug for CreateVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut secret_keys: Vec<&String> = self.secrets.keys().collect();
        secret_keys.sort();
        f.debug_struct("CreateVolumeRequest")
            .field("name", &self.name)
            .field("capacity_range", &self.capacity_range)
            .field("volume_capabilities", &self.volume_capabilities)
            .field("parameters", &self.parameters)
            .field(
                "secrets",
                &format_args!("<{} keys redacted>", secret_keys.len()),
            )
            .field("volume_content_source", &self.volume_content_source)
            .field(
                "accessibility_requirements",
                &self.accessibility_requirements,
            )
            .field("mutable_parameters", &self.mutable_parameters)
            .finish()
    }
}

/// `CreateVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateVolumeResponse {
    /// The volume made (or found by name).
    #[prost(message, optional, tag = "1")]
    pub volume: Option<Volume>,
}

/// `CapacityRange`: both 0 means "the driver's choice".
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct CapacityRange {
    /// At least this many bytes.
    #[prost(int64, tag = "1")]
    pub required_bytes: i64,
    /// At most this many bytes (0: no limit).
    #[prost(int64, tag = "2")]
    pub limit_bytes: i64,
}

/// `VolumeCapability`: an access type (block or mount) and an access mode.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    /// Block or mount.
    #[prost(oneof = "volume_capability::AccessType", tags = "1, 2")]
    pub access_type: Option<volume_capability::AccessType>,
    /// How many nodes may read or write.
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<volume_capability::AccessMode>,
}

/// The parts of [`VolumeCapability`].
pub mod volume_capability {
    /// `VolumeCapability.access_type`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum AccessType {
        /// `block = 1`: a raw block device.
        #[prost(message, tag = "1")]
        Block(BlockVolume),
        /// `mount = 2`: a filesystem.
        #[prost(message, tag = "2")]
        Mount(MountVolume),
    }

    /// `VolumeCapability.BlockVolume`: no fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BlockVolume {}

    /// `VolumeCapability.MountVolume`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MountVolume {
        /// The filesystem type (`ext4`); empty: the driver's default.
        #[prost(string, tag = "1")]
        pub fs_type: String,
        /// The class's mount options.
        #[prost(string, repeated, tag = "2")]
        pub mount_flags: Vec<String>,
        /// The group the volume is mounted for.
        #[prost(string, tag = "3")]
        pub volume_mount_group: String,
    }

    /// `VolumeCapability.AccessMode`.
    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct AccessMode {
        /// A [`Mode`].
        #[prost(enumeration = "Mode", tag = "1")]
        pub mode: i32,
    }

    /// `VolumeCapability.AccessMode.Mode`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Mode {
        /// `UNKNOWN`.
        Unknown = 0,
        /// `SINGLE_NODE_WRITER`: ReadWriteOnce (and ReadWriteOncePod on a driver without
        /// `SINGLE_NODE_MULTI_WRITER`).
        SingleNodeWriter = 1,
        /// `SINGLE_NODE_READER_ONLY`.
        SingleNodeReaderOnly = 2,
        /// `MULTI_NODE_READER_ONLY`: ReadOnlyMany.
        MultiNodeReaderOnly = 3,
        /// `MULTI_NODE_SINGLE_WRITER`.
        MultiNodeSingleWriter = 4,
        /// `MULTI_NODE_MULTI_WRITER`: ReadWriteMany.
        MultiNodeMultiWriter = 5,
        /// `SINGLE_NODE_SINGLE_WRITER`: ReadWriteOncePod.
        SingleNodeSingleWriter = 6,
        /// `SINGLE_NODE_MULTI_WRITER`: ReadWriteOnce on a driver with that capability.
        SingleNodeMultiWriter = 7,
    }
}

/// `VolumeContentSource`: a snapshot or a volume to copy from.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeContentSource {
    /// The source.
    #[prost(oneof = "volume_content_source::Type", tags = "1, 2")]
    pub r#type: Option<volume_content_source::Type>,
}

/// The parts of [`VolumeContentSource`].
pub mod volume_content_source {
    /// `VolumeContentSource.type`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        /// `snapshot = 1`.
        #[prost(message, tag = "1")]
        Snapshot(SnapshotSource),
        /// `volume = 2`.
        #[prost(message, tag = "2")]
        Volume(VolumeSource),
    }

    /// `VolumeContentSource.SnapshotSource`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SnapshotSource {
        /// The snapshot's id.
        #[prost(string, tag = "1")]
        pub snapshot_id: String,
    }

    /// `VolumeContentSource.VolumeSource`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VolumeSource {
        /// The volume's id.
        #[prost(string, tag = "1")]
        pub volume_id: String,
    }
}

/// `Volume`: what `CreateVolume` made.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Volume {
    /// The size made; 0: unknown (the claim's request is used).
    #[prost(int64, tag = "1")]
    pub capacity_bytes: i64,
    /// The driver's id of the volume: the PV's `volumeHandle`, what `DeleteVolume` takes.
    #[prost(string, tag = "2")]
    pub volume_id: String,
    /// The PV's `volumeAttributes`.
    #[prost(map = "string, string", tag = "3")]
    pub volume_context: HashMap<String, String>,
    /// What the volume was copied from.
    #[prost(message, optional, tag = "4")]
    pub content_source: Option<VolumeContentSource>,
    /// Where the volume is reachable from: the PV's node affinity.
    #[prost(message, repeated, tag = "5")]
    pub accessible_topology: Vec<Topology>,
}

/// `TopologyRequirement`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyRequirement {
    /// The volume must be reachable from at least one of these.
    #[prost(message, repeated, tag = "1")]
    pub requisite: Vec<Topology>,
    /// In this order of preference.
    #[prost(message, repeated, tag = "2")]
    pub preferred: Vec<Topology>,
}

/// `Topology`: topology key -> value (`topology.hostpath.csi/node` -> `node-1`).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Topology {
    /// The segments.
    #[prost(btree_map = "string, string", tag = "1")]
    pub segments: std::collections::BTreeMap<String, String>,
}

/// `DeleteVolumeRequest`. Its `Debug` form leaves the secrets out.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct DeleteVolumeRequest {
    /// The PV's `volumeHandle`.
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// The provisioner secret's data. Never logged.
    #[prost(map = "string, string", tag = "2")]
    pub secrets: HashMap<String, String>,
}

impl std::fmt::Debug for DeleteVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeleteVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field(
                "secrets",
                &format_args!("<{} keys redacted>", self.secrets.len()),
            )
            .finish()
    }
}

/// `DeleteVolumeResponse`: no fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteVolumeResponse {}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes written by hand from the spec's field numbers and wire types: a message
    /// that encodes to these is what a Go driver decodes.
    #[test]
    fn create_volume_request_encodes_with_the_spec_field_numbers() {
        let request = CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1024,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![VolumeCapability {
                access_type: Some(volume_capability::AccessType::Block(
                    volume_capability::BlockVolume {},
                )),
                access_mode: Some(volume_capability::AccessMode {
                    mode: volume_capability::Mode::SingleNodeWriter as i32,
                }),
            }],
            ..CreateVolumeRequest::default()
        };
        let expected: Vec<u8> = vec![
            0x0a, 5, b'p', b'v', b'c', b'-', b'1', // 1: name, length-delimited
            0x12, 3, 0x08, 0x80, 0x08, // 2: capacity_range { 1: required_bytes = 1024 }
            0x1a, 6, // 3: volume_capabilities
            0x0a, 0, // 1: block {}
            0x1a, 2, 0x08, 1, // 3: access_mode { 1: mode = SINGLE_NODE_WRITER }
        ];
        assert_eq!(request.encode_to_vec(), expected);
    }

    #[test]
    fn volume_decodes_from_the_spec_field_numbers() {
        let bytes: Vec<u8> = vec![
            0x0a, 17, // 1: volume
            0x08, 0x80, 0x10, // 1: capacity_bytes = 2048
            0x12, 3, b'v', b'o', b'l', // 2: volume_id
            0x2a, 7, 0x0a, 5, 0x0a, 1, b'k', 0x12, 0, // 5: accessible_topology { k: "" }
        ];
        let response = CreateVolumeResponse::decode(bytes.as_slice()).unwrap();
        let volume = response.volume.unwrap();
        assert_eq!(volume.capacity_bytes, 2048);
        assert_eq!(volume.volume_id, "vol");
        assert_eq!(volume.accessible_topology[0].segments["k"], "");
    }

    #[test]
    fn secrets_are_redacted_in_debug_output() {
        let request = DeleteVolumeRequest {
            volume_id: "vol".into(),
            secrets: HashMap::from([("password".into(), "hunter2".into())]),
        };
        let shown = format!("{request:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("1 keys redacted"), "{shown}");
    }
}
