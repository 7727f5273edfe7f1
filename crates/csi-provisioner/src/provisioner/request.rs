//! The pure parts of a CreateVolume request: the claim's data source and size, the volume
//! capabilities, the filesystem type and the parameters (upstream's `prepareProvision`,
//! `getVolumeCapabilities`, `removePrefixedParameters`).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
use kube_controller_kit::quantity::Quantity;

use crate::{
    csi::{
        VolumeCapability,
        volume_capability::{AccessMode, AccessType, BlockVolume, Mode, MountVolume},
    },
    error::CsiError,
    provisioner::secrets::{PREFIX, known_prefixed_key},
};

/// The filesystem type parameter.
pub(crate) const FSTYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// Extra create metadata: the claim's name.
pub(crate) const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
/// Extra create metadata: the claim's namespace.
pub(crate) const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
/// Extra create metadata: the PV's name.
pub(crate) const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// `namespace/name` of a claim, for messages.
pub(crate) fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// What to do with a claim's data source (upstream's `dataSource` and the kind switch of
/// `prepareProvision`).
#[derive(Debug)]
pub(crate) enum DataSource {
    /// No data source: an empty volume is what is asked for.
    None,
    /// Another kind than a snapshot or a claim: a volume populator provisions it
    /// (upstream ignores the claim, as this sidecar does).
    Populator(String),
}

/// Checks the claim's data source: clones and snapshots are refused (this sidecar does
/// not make them yet), a populator's kind is left to the populator.
pub(crate) fn data_source(claim: &PersistentVolumeClaim) -> Result<DataSource, CsiError> {
    let key = || claim_key(claim);
    let Some(spec) = &claim.spec else {
        return Ok(DataSource::None);
    };
    let (kind, name) = if let Some(source) = &spec.data_source {
        (&source.kind, &source.name)
    } else if let Some(source) = &spec.data_source_ref {
        if let Some(namespace) = source.namespace.as_deref().filter(|n| !n.is_empty()) {
            return Err(CsiError::CrossNamespaceDataSource {
                claim: key(),
                namespace: namespace.to_owned(),
            });
        }
        (&source.kind, &source.name)
    } else {
        return Ok(DataSource::None);
    };
    if name.is_empty() {
        return Err(CsiError::DataSourceWithoutName {
            claim: key(),
            kind: kind.clone(),
        });
    }
    // Upstream: VolumeSnapshot (of any API group: a wrong one is an error there too) and
    // PersistentVolumeClaim are its own to make; every other kind is a populator's.
    match kind.as_str() {
        "VolumeSnapshot" | "PersistentVolumeClaim" => Err(CsiError::DataSourceUnsupported {
            claim: key(),
            kind: kind.clone(),
            name: name.clone(),
        }),
        _ => Ok(DataSource::Populator(kind.clone())),
    }
}

/// The claim's storage request in bytes, rounded up (Go `Quantity.Value()`); 0 without one.
pub(crate) fn requested_bytes(claim: &PersistentVolumeClaim) -> Result<i64, CsiError> {
    let Some(request) = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
    else {
        return Ok(0);
    };
    let bad = || CsiError::BadRequest {
        claim: claim_key(claim),
        value: request.0.clone(),
    };
    let quantity = Quantity::parse(&request.0).map_err(|_| bad())?;
    i64::try_from(quantity.units_rounded_up(1)).map_err(|_| bad())
}

/// Whether the claim asks for `volumeMode: Block`.
pub(crate) fn is_block(claim: &PersistentVolumeClaim) -> bool {
    claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

/// The filesystem type: the class's `csi.storage.k8s.io/fstype` (or the deprecated
/// `fstype`, any case), else `default`. Both set is an error.
pub(crate) fn fs_type(class: &StorageClass, default: &str) -> Result<String, CsiError> {
    let found: Vec<&String> = class
        .parameters
        .iter()
        .flatten()
        .filter(|(k, _)| k.eq_ignore_ascii_case("fstype") || *k == FSTYPE_KEY)
        .map(|(_, v)| v)
        .collect();
    if found.len() > 1 {
        return Err(CsiError::FsTypeTwice {
            class: class.metadata.name.clone().unwrap_or_default(),
        });
    }
    if let Some(name) = class
        .parameters
        .iter()
        .flatten()
        .find(|(k, _)| k.eq_ignore_ascii_case("fstype"))
        .map(|(k, _)| k)
    {
        tracing::warn!(
            class = class.metadata.name.as_deref().unwrap_or_default(),
            "the parameter {name:?} is deprecated and will be removed in a future release, please use {FSTYPE_KEY:?} instead"
        );
    }
    Ok(match found.first() {
        Some(fs) if !fs.is_empty() => (*fs).clone(),
        _ => default.to_owned(),
    })
}

/// The CSI access mode of one Kubernetes access mode (csi-lib-utils' `ToCSIAccessMode`
/// for a single mode).
pub(crate) fn access_mode(mode: &str, single_node_multi_writer: bool) -> Option<Mode> {
    Some(match (mode, single_node_multi_writer) {
        ("ReadWriteOnce", false) | ("ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        _ => return None,
    })
}

/// One capability per access mode of the claim, block or mount (with `fs_type` and the
/// class's mount options).
pub(crate) fn volume_capabilities(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    fs_type: &str,
    single_node_multi_writer: bool,
) -> Result<Vec<VolumeCapability>, CsiError> {
    let block = is_block(claim);
    let modes = claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default();
    modes
        .iter()
        .map(|mode| {
            let csi_mode = access_mode(mode, single_node_multi_writer).ok_or_else(|| {
                CsiError::AccessMode {
                    claim: claim_key(claim),
                    mode: mode.clone(),
                }
            })?;
            let access_type = if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: fs_type.to_owned(),
                    mount_flags: class.mount_options.clone().unwrap_or_default(),
                    volume_mount_group: String::new(),
                })
            };
            Ok(VolumeCapability {
                access_type: Some(access_type),
                access_mode: Some(AccessMode {
                    mode: csi_mode as i32,
                }),
            })
        })
        .collect()
}

/// The class's parameters without the `csi.storage.k8s.io/` ones; an unknown key with
/// that prefix is an error. The deprecated `csi...SecretName` keys stay (as upstream).
pub(crate) fn driver_parameters(
    class: &str,
    parameters: &BTreeMap<String, String>,
) -> Result<HashMap<String, String>, CsiError> {
    let mut kept = HashMap::new();
    for (key, value) in parameters {
        if key.starts_with(PREFIX) {
            if !known_prefixed_key(key) {
                return Err(CsiError::UnknownPrefixedParameter {
                    class: class.to_owned(),
                    key: key.clone(),
                });
            }
        } else {
            kept.insert(key.clone(), value.clone());
        }
    }
    Ok(kept)
}

/// A byte count as the API server writes a quantity Go made with
/// `resource.NewQuantity(bytes, BinarySI)`: `1Gi`, `1536Mi`, `1000000000`, `512`.
pub(crate) fn bytes_to_quantity(bytes: i64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes.unsigned_abs() < 1024 {
        return bytes.to_string();
    }
    let mut value = bytes;
    let mut exponent = 0;
    while exponent < SUFFIXES.len() - 1 && value % 1024 == 0 {
        value /= 1024;
        exponent += 1;
    }
    format!("{value}{}", SUFFIXES[exponent])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::TypedLocalObjectReference;
    use provision_controller::testing::{class, pvc};

    #[test]
    fn access_modes_map_as_csi_lib_utils() {
        let table = [
            ("ReadWriteOnce", false, Some(Mode::SingleNodeWriter)),
            ("ReadWriteOnce", true, Some(Mode::SingleNodeMultiWriter)),
            ("ReadWriteOncePod", false, Some(Mode::SingleNodeWriter)),
            ("ReadWriteOncePod", true, Some(Mode::SingleNodeSingleWriter)),
            ("ReadOnlyMany", false, Some(Mode::MultiNodeReaderOnly)),
            ("ReadOnlyMany", true, Some(Mode::MultiNodeReaderOnly)),
            ("ReadWriteMany", false, Some(Mode::MultiNodeMultiWriter)),
            ("ReadWriteMany", true, Some(Mode::MultiNodeMultiWriter)),
            ("ReadWriteSometimes", false, None),
        ];
        for (mode, multi, expected) in table {
            assert_eq!(access_mode(mode, multi), expected, "{mode} {multi}");
        }
    }

    #[test]
    fn one_capability_per_access_mode_mount_or_block() {
        let mut claim = pvc("data").build();
        claim.spec.as_mut().unwrap().access_modes =
            Some(vec!["ReadWriteOnce".into(), "ReadOnlyMany".into()]);
        let mut fast = class("fast").build();
        fast.mount_options = Some(vec!["noatime".into()]);
        let caps = volume_capabilities(&claim, &fast, "xfs", false).unwrap();
        assert_eq!(caps.len(), 2);
        for (cap, mode) in caps
            .iter()
            .zip([Mode::SingleNodeWriter, Mode::MultiNodeReaderOnly])
        {
            assert_eq!(cap.access_mode.unwrap().mode, mode as i32);
            let Some(AccessType::Mount(mount)) = &cap.access_type else {
                panic!("not mount: {cap:?}");
            };
            assert_eq!(mount.fs_type, "xfs");
            assert_eq!(mount.mount_flags, ["noatime"]);
        }
        let block = pvc("data").block().build();
        let caps = volume_capabilities(&block, &fast, "xfs", true).unwrap();
        assert_eq!(caps.len(), 1);
        assert_eq!(caps[0].access_type, Some(AccessType::Block(BlockVolume {})));
        assert_eq!(
            caps[0].access_mode.unwrap().mode,
            Mode::SingleNodeMultiWriter as i32
        );
        let mut odd = pvc("odd").build();
        odd.spec.as_mut().unwrap().access_modes = Some(vec!["Sometimes".into()]);
        let err = volume_capabilities(&odd, &fast, "", false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("default/odd") && err.contains("\"Sometimes\""),
            "{err}"
        );
    }

    #[test]
    fn fs_type_from_the_class_else_the_default() {
        // (class parameters, default, the fsType or Err for a refused class)
        type Row<'a> = (&'a [(&'a str, &'a str)], &'a str, Result<&'a str, ()>);
        let table: &[Row<'_>] = &[
            (&[], "", Ok("")),
            (&[], "ext4", Ok("ext4")),
            (&[(FSTYPE_KEY, "xfs")], "ext4", Ok("xfs")),
            (&[("fstype", "btrfs")], "ext4", Ok("btrfs")),
            (&[("FSType", "btrfs")], "", Ok("btrfs")),
            (&[(FSTYPE_KEY, "")], "ext4", Ok("ext4")),
            (&[(FSTYPE_KEY, "xfs"), ("fstype", "ext3")], "", Err(())),
        ];
        for (parameters, default, expected) in table {
            let mut c = class("fast");
            for (k, v) in *parameters {
                c = c.parameter(k, v);
            }
            let got = fs_type(&c.build(), default).map_err(|e| {
                assert!(e.to_string().contains("\"fast\""), "{e}");
            });
            assert_eq!(got.as_deref(), expected.as_deref(), "{parameters:?}");
        }
    }

    #[test]
    fn prefixed_parameters_are_stripped_and_unknown_ones_refused() {
        let parameters = BTreeMap::from([
            ("pool".to_owned(), "a".to_owned()),
            (FSTYPE_KEY.to_owned(), "xfs".to_owned()),
            (
                "csi.storage.k8s.io/provisioner-secret-name".to_owned(),
                "s".to_owned(),
            ),
            (
                "csi.storage.k8s.io/node-expand-secret-namespace".to_owned(),
                "s".to_owned(),
            ),
            (
                "csi.storage.k8s.io/secret-namespace".to_owned(),
                "s".to_owned(),
            ),
            (
                "csi.storage.k8s.io/controller-modify-secret-name".to_owned(),
                "s".to_owned(),
            ),
            ("csiProvisionerSecretName".to_owned(), "old".to_owned()),
            ("fstype".to_owned(), "kept".to_owned()),
        ]);
        let kept = driver_parameters("fast", &parameters).unwrap();
        assert_eq!(
            kept,
            HashMap::from([
                ("pool".to_owned(), "a".to_owned()),
                ("csiProvisionerSecretName".to_owned(), "old".to_owned()),
                ("fstype".to_owned(), "kept".to_owned()),
            ])
        );
        let unknown = BTreeMap::from([("csi.storage.k8s.io/pvc/name".to_owned(), "x".to_owned())]);
        let err = driver_parameters("fast", &unknown).unwrap_err().to_string();
        assert!(
            err.contains("\"fast\"") && err.contains("csi.storage.k8s.io/pvc/name"),
            "{err}"
        );
    }

    #[test]
    fn quantities_are_written_as_go_writes_binary_si() {
        let table = [
            (0, "0"),
            (512, "512"),
            (1024, "1Ki"),
            (1 << 30, "1Gi"),
            (1536 << 20, "1536Mi"),
            (1_000_000_000, "1000000000"),
            (5 << 40, "5Ti"),
            (3 << 60, "3Ei"),
        ];
        for (bytes, text) in table {
            assert_eq!(bytes_to_quantity(bytes), text);
        }
    }

    #[test]
    fn requests_round_up_to_bytes() {
        assert_eq!(
            requested_bytes(&pvc("a").request("1Gi").build()).unwrap(),
            1 << 30
        );
        assert_eq!(
            requested_bytes(&pvc("a").request("1.5k").build()).unwrap(),
            1500
        );
        assert_eq!(requested_bytes(&pvc("a").request("1m").build()).unwrap(), 1);
        let mut none = pvc("a").build();
        none.spec.as_mut().unwrap().resources = None;
        assert_eq!(requested_bytes(&none).unwrap(), 0);
        let err = requested_bytes(&pvc("a").request("lots").build())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("default/a") && err.contains("\"lots\""),
            "{err}"
        );
    }

    #[test]
    fn data_sources_are_refused_or_left_to_populators() {
        let with = |kind: &str, name: &str| {
            let mut claim = pvc("copy").build();
            claim.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
                kind: kind.into(),
                name: name.into(),
                api_group: None,
            });
            claim
        };
        assert!(matches!(
            data_source(&pvc("a").build()),
            Ok(DataSource::None)
        ));
        for kind in ["VolumeSnapshot", "PersistentVolumeClaim"] {
            let err = data_source(&with(kind, "src")).unwrap_err().to_string();
            assert!(
                err.contains("default/copy")
                    && err.contains(kind)
                    && err.contains("clones and snapshots are not supported by this sidecar yet"),
                "{err}"
            );
        }
        assert!(matches!(
            data_source(&with("Image", "src")),
            Ok(DataSource::Populator(kind)) if kind == "Image"
        ));
        assert!(matches!(
            data_source(&with("VolumeSnapshot", "")),
            Err(CsiError::DataSourceWithoutName { .. })
        ));
        let mut cross = pvc("copy").build();
        cross.spec.as_mut().unwrap().data_source_ref =
            Some(k8s_openapi::api::core::v1::TypedObjectReference {
                kind: "VolumeSnapshot".into(),
                name: "s".into(),
                namespace: Some("other".into()),
                api_group: Some("snapshot.storage.k8s.io".into()),
            });
        assert!(matches!(
            data_source(&cross),
            Err(CsiError::CrossNamespaceDataSource { .. })
        ));
        cross
            .spec
            .as_mut()
            .unwrap()
            .data_source_ref
            .as_mut()
            .unwrap()
            .namespace = None;
        assert!(matches!(
            data_source(&cross),
            Err(CsiError::DataSourceUnsupported { .. })
        ));
    }
}
