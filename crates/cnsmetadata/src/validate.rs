//! Validation of a `CnsVolumeMetadata` spec, per entity type, with upstream's messages.
//!
//! Unlike the Go controller, which keeps only the last violation it finds, [`validate`]
//! reports every rule the spec breaks, each once, in a fixed order.

use std::fmt;

use crate::resource::{CnsVolumeMetadata, EntityType};

/// One broken rule. [`fmt::Display`] gives the upstream message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Violation {
    /// `entityname`, `entitytype` or `guestclusterid` is empty.
    MissingRequiredFields,
    /// `entitytype` is none of the three known types.
    InvalidEntityType(String),
    /// `namespace` is set on a PV entity.
    NamespaceForbidden,
    /// `namespace` is empty on a PVC or Pod entity.
    NamespaceRequired(EntityType),
    /// `labels` are set on a Pod entity.
    LabelsForbidden,
    /// A PV or PVC entity does not name exactly one volume and one reference.
    NotExactlyOne(EntityType),
    /// A Pod entity names no volume or no reference.
    NoneForPod,
    /// A Pod entity names a different number of volumes and references, so they cannot
    /// be paired (Go paired them by index and panicked on fewer references).
    LengthMismatchForPod {
        /// Number of `volumenames`.
        volume_names: usize,
        /// Number of `entityreferences`.
        entity_references: usize,
    },
    /// A reference has a type the entity type may not refer to.
    WrongReferenceType {
        /// The entity type of the object.
        entity_type: EntityType,
        /// The only type its references may have.
        allowed: EntityType,
    },
    /// A reference of a PV entity has a cluster ID.
    ClusterIdForbidden,
    /// A reference of a PVC or Pod entity has no cluster ID.
    ClusterIdRequired(EntityType),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingRequiredFields => {
                f.write_str("EntityName, EntityType and GuestClusterID are required parameters.")
            }
            Self::InvalidEntityType(value) => write!(f, "Invalid entity type {value:?}"),
            Self::NamespaceForbidden => {
                f.write_str("Namespace cannot be set for PERSISTENT_VOLUME instances")
            }
            Self::NamespaceRequired(entity_type) => {
                write!(f, "Namespace should be set for {entity_type} instances")
            }
            Self::LabelsForbidden => f.write_str("Labels cannot be set for POD instances"),
            Self::NotExactlyOne(entity_type) => write!(
                f,
                "VolumeNames and EntityReferences should have length 1 for {entity_type} instances"
            ),
            Self::NoneForPod => f.write_str(
                "VolumeNames and EntityReferences should have length greater than 0 for POD instances",
            ),
            Self::LengthMismatchForPod {
                volume_names,
                entity_references,
            } => write!(
                f,
                "VolumeNames and EntityReferences should have the same length for POD instances \
                 (got {volume_names} volume names and {entity_references} entity references)"
            ),
            Self::WrongReferenceType {
                entity_type,
                allowed,
            } => write!(f, "{entity_type} instances can only refer to {allowed} instances"),
            Self::ClusterIdForbidden => f.write_str(
                "EntityReferences.ClusterID should be empty for PERSISTENT_VOLUME instances",
            ),
            Self::ClusterIdRequired(entity_type) => write!(
                f,
                "EntityReferences.ClusterID should not be empty for {entity_type} instances"
            ),
        }
    }
}

/// Every rule a spec breaks; never empty.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid spec: {}", join(.violations))]
pub(crate) struct InvalidSpec {
    /// The broken rules, each once, in the order the checks run.
    pub(crate) violations: Vec<Violation>,
}

fn join(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks `object.spec` against the rules for its entity type.
///
/// The rules are upstream's (`validateReconileRequest`), plus one: a Pod entity must name
/// as many volumes as references, because the reconciler pairs them by position.
///
/// # Errors
/// [`InvalidSpec`] listing every violation.
#[doc(alias = "validateReconileRequest")]
pub(crate) fn validate(object: &CnsVolumeMetadata) -> Result<(), InvalidSpec> {
    let spec = &object.spec;
    let mut violations = Vec::new();
    let mut push = |violation: Violation| {
        if !violations.contains(&violation) {
            violations.push(violation);
        }
    };
    let entity_type_missing = spec.entity_type.as_str().is_empty();
    if spec.entity_name.is_empty() || entity_type_missing || spec.guest_cluster_id.is_empty() {
        push(Violation::MissingRequiredFields);
    }
    let volumes = spec.volume_names.len();
    let references = spec.entity_references.len();
    match &spec.entity_type {
        EntityType::PersistentVolume => {
            if !spec.namespace.is_empty() {
                push(Violation::NamespaceForbidden);
            }
            if volumes != 1 || references != 1 {
                push(Violation::NotExactlyOne(EntityType::PersistentVolume));
            }
            for reference in &spec.entity_references {
                if reference.entity_type != EntityType::PersistentVolumeClaim {
                    push(Violation::WrongReferenceType {
                        entity_type: EntityType::PersistentVolume,
                        allowed: EntityType::PersistentVolumeClaim,
                    });
                }
                if !reference.cluster_id.is_empty() {
                    push(Violation::ClusterIdForbidden);
                }
            }
        }
        EntityType::PersistentVolumeClaim => {
            if spec.namespace.is_empty() {
                push(Violation::NamespaceRequired(
                    EntityType::PersistentVolumeClaim,
                ));
            }
            if volumes != 1 || references != 1 {
                push(Violation::NotExactlyOne(EntityType::PersistentVolumeClaim));
            }
            for reference in &spec.entity_references {
                if reference.entity_type != EntityType::PersistentVolume {
                    push(Violation::WrongReferenceType {
                        entity_type: EntityType::PersistentVolumeClaim,
                        allowed: EntityType::PersistentVolume,
                    });
                }
                if reference.cluster_id.is_empty() {
                    push(Violation::ClusterIdRequired(
                        EntityType::PersistentVolumeClaim,
                    ));
                }
            }
        }
        EntityType::Pod => {
            if spec.namespace.is_empty() {
                push(Violation::NamespaceRequired(EntityType::Pod));
            }
            if !spec.labels.is_empty() {
                push(Violation::LabelsForbidden);
            }
            if volumes == 0 || references == 0 {
                push(Violation::NoneForPod);
            } else if volumes != references {
                push(Violation::LengthMismatchForPod {
                    volume_names: volumes,
                    entity_references: references,
                });
            }
            for reference in &spec.entity_references {
                if reference.entity_type != EntityType::PersistentVolumeClaim {
                    push(Violation::WrongReferenceType {
                        entity_type: EntityType::Pod,
                        allowed: EntityType::PersistentVolumeClaim,
                    });
                }
                if reference.cluster_id.is_empty() {
                    push(Violation::ClusterIdRequired(EntityType::Pod));
                }
            }
        }
        EntityType::Other(_) if entity_type_missing => {}
        EntityType::Other(value) => push(Violation::InvalidEntityType(value.clone())),
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(InvalidSpec { violations })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{CnsVolumeMetadata, CnsVolumeMetadataSpec, EntityReference};
    use crate::testing::{pod_spec, pv_spec, pvc_spec};

    use EntityType::{PersistentVolume as Pv, PersistentVolumeClaim as Pvc, Pod};

    fn object(spec: CnsVolumeMetadataSpec) -> CnsVolumeMetadata {
        CnsVolumeMetadata::new("gc-1-x", spec)
    }

    fn messages(spec: CnsVolumeMetadataSpec) -> Vec<String> {
        match validate(&object(spec)) {
            Ok(()) => Vec::new(),
            Err(invalid) => invalid.violations.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn valid_specs_of_every_entity_type_pass() {
        assert_eq!(validate(&object(pv_spec())), Ok(()));
        assert_eq!(validate(&object(pvc_spec())), Ok(()));
        assert_eq!(validate(&object(pod_spec())), Ok(()));
    }

    /// One case per rule: a valid spec, one change, the one upstream message expected.
    #[test]
    fn each_rule_reports_its_upstream_message() {
        type Case = (&'static str, CnsVolumeMetadataSpec, &'static str);
        let with = |base: fn() -> CnsVolumeMetadataSpec, change: fn(&mut CnsVolumeMetadataSpec)| {
            let mut spec = base();
            change(&mut spec);
            spec
        };
        let cases: Vec<Case> = vec![
            (
                "missing entity name",
                with(pvc_spec, |s| s.entity_name.clear()),
                "EntityName, EntityType and GuestClusterID are required parameters.",
            ),
            (
                "missing guest cluster id",
                with(pod_spec, |s| s.guest_cluster_id.clear()),
                "EntityName, EntityType and GuestClusterID are required parameters.",
            ),
            (
                "missing entity type",
                with(pv_spec, |s| s.entity_type = EntityType::default()),
                "EntityName, EntityType and GuestClusterID are required parameters.",
            ),
            (
                "unknown entity type",
                with(pv_spec, |s| {
                    s.entity_type = EntityType::Other("NODE".into())
                }),
                r#"Invalid entity type "NODE""#,
            ),
            (
                "pv with namespace",
                with(pv_spec, |s| s.namespace = "shop".into()),
                "Namespace cannot be set for PERSISTENT_VOLUME instances",
            ),
            (
                "pv with two volumes",
                with(pv_spec, |s| s.volume_names.push("gc-1-other".into())),
                "VolumeNames and EntityReferences should have length 1 for PERSISTENT_VOLUME instances",
            ),
            (
                "pv without references",
                with(pv_spec, |s| s.entity_references.clear()),
                "VolumeNames and EntityReferences should have length 1 for PERSISTENT_VOLUME instances",
            ),
            (
                "pv referring to a pod",
                with(pv_spec, |s| s.entity_references[0].entity_type = Pod),
                "PERSISTENT_VOLUME instances can only refer to PERSISTENT_VOLUME_CLAIM instances",
            ),
            (
                "pv reference with cluster id",
                with(pv_spec, |s| {
                    s.entity_references[0].cluster_id = "gc-1".into()
                }),
                "EntityReferences.ClusterID should be empty for PERSISTENT_VOLUME instances",
            ),
            (
                "pvc without namespace",
                with(pvc_spec, |s| s.namespace.clear()),
                "Namespace should be set for PERSISTENT_VOLUME_CLAIM instances",
            ),
            (
                "pvc without volumes",
                with(pvc_spec, |s| s.volume_names.clear()),
                "VolumeNames and EntityReferences should have length 1 for PERSISTENT_VOLUME_CLAIM instances",
            ),
            (
                "pvc referring to a pvc",
                with(pvc_spec, |s| s.entity_references[0].entity_type = Pvc),
                "PERSISTENT_VOLUME_CLAIM instances can only refer to PERSISTENT_VOLUME instances",
            ),
            (
                "pvc reference without cluster id",
                with(pvc_spec, |s| s.entity_references[0].cluster_id.clear()),
                "EntityReferences.ClusterID should not be empty for PERSISTENT_VOLUME_CLAIM instances",
            ),
            (
                "pod without namespace",
                with(pod_spec, |s| s.namespace.clear()),
                "Namespace should be set for POD instances",
            ),
            (
                "pod with labels",
                with(pod_spec, |s| {
                    s.labels.insert("app".into(), "web".into());
                }),
                "Labels cannot be set for POD instances",
            ),
            (
                "pod without volumes",
                with(pod_spec, |s| s.volume_names.clear()),
                "VolumeNames and EntityReferences should have length greater than 0 for POD instances",
            ),
            (
                "pod with more volumes than references",
                with(pod_spec, |s| s.volume_names.push("gc-1-extra".into())),
                "VolumeNames and EntityReferences should have the same length for POD instances \
                 (got 3 volume names and 2 entity references)",
            ),
            (
                "pod referring to a pv",
                with(pod_spec, |s| s.entity_references[1].entity_type = Pv),
                "POD instances can only refer to PERSISTENT_VOLUME_CLAIM instances",
            ),
            (
                "pod reference without cluster id",
                with(pod_spec, |s| s.entity_references[0].cluster_id.clear()),
                "EntityReferences.ClusterID should not be empty for POD instances",
            ),
        ];
        for (name, spec, expected) in cases {
            assert_eq!(messages(spec), vec![expected.to_owned()], "case: {name}");
        }
    }

    #[test]
    fn every_violation_is_reported_once_in_order() {
        let mut spec = pod_spec();
        spec.namespace.clear();
        spec.entity_name.clear();
        spec.labels.insert("app".into(), "web".into());
        spec.entity_references = vec![
            EntityReference::new(Pv, "a", "shop", ""),
            EntityReference::new(Pv, "b", "shop", ""),
        ];
        assert_eq!(
            messages(spec),
            [
                "EntityName, EntityType and GuestClusterID are required parameters.",
                "Namespace should be set for POD instances",
                "Labels cannot be set for POD instances",
                "POD instances can only refer to PERSISTENT_VOLUME_CLAIM instances",
                "EntityReferences.ClusterID should not be empty for POD instances",
            ]
        );
    }

    #[test]
    fn invalid_spec_message_joins_every_violation() {
        let mut spec = pv_spec();
        spec.namespace = "shop".into();
        spec.entity_references[0].cluster_id = "gc-1".into();
        let error = validate(&object(spec)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid spec: Namespace cannot be set for PERSISTENT_VOLUME instances; \
             EntityReferences.ClusterID should be empty for PERSISTENT_VOLUME instances"
        );
    }
}
