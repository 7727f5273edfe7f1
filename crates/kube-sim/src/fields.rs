//! Unknown fields of built-in types, found the way the real server's strict decoding finds
//! them, and dropped so they are never stored.
//!
//! Each built-in type's field tree ([`Shape`]) is read once from its k8s-openapi type by
//! driving the type's `Deserialize` impl with a tracing deserializer (the generated impls
//! name every field they know); checking a write is then one walk over the object's keys.

mod trace;

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;

use self::trace::shape_of;

use crate::status::{ApiError, ApiResult, Cause};

/// What `fieldValidation` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and answer with a `Warning` header for each (the default).
    #[default]
    Warn,
    /// Refuse the write with 400 BadRequest.
    Strict,
}

impl FieldValidation {
    /// Parses the `fieldValidation` query value of a request whose options are
    /// `options_kind` (`CreateOptions`, `UpdateOptions`, `PatchOptions`).
    ///
    /// # Errors
    /// 422 Invalid for a value other than `Ignore`, `Warn` or `Strict`, as the real server.
    pub(crate) fn parse(value: Option<&str>, options_kind: &str) -> ApiResult<Self> {
        match value {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Ignore") => Ok(Self::Ignore),
            Some("Strict") => Ok(Self::Strict),
            Some(other) => Err(ApiError::invalid(
                "meta.k8s.io",
                &format!("{options_kind}.meta.k8s.io"),
                "",
                vec![Cause::not_supported(
                    "fieldValidation",
                    &Value::from(other),
                    &["Ignore", "Strict", "Warn"],
                )],
            )),
        }
    }
}

/// The shape of a type's JSON, as far as field names go.
#[derive(Debug, Default)]
pub(crate) enum Shape {
    /// A scalar.
    #[default]
    Leaf,
    /// Free-form JSON: every field is known.
    Any,
    /// An object with these fields.
    Struct(HashMap<&'static str, Shape>),
    /// An object with any keys and values of one shape.
    Map(Box<Shape>),
    /// A list of one shape.
    List(Box<Shape>),
}

impl Shape {
    /// Whether values of this shape can hold unknown fields.
    fn nested(&self) -> bool {
        match self {
            Self::Leaf | Self::Any => false,
            Self::Struct(_) => true,
            Self::Map(inner) | Self::List(inner) => inner.nested(),
        }
    }

    /// The shape of a field path, for tests and diagnostics.
    #[cfg(test)]
    fn at(&self, path: &[&str]) -> Option<&Shape> {
        let mut cur = self;
        for key in path {
            cur = match (cur, *key) {
                (Self::Struct(fields), k) => fields.get(k)?,
                (Self::Map(inner) | Self::List(inner), "*") => inner,
                _ => return None,
            };
        }
        Some(cur)
    }
}

/// Removes from `value` every field `shape` does not know and returns their paths
/// (`spec.bogus`, `spec.containers[0].bogus`).
pub(crate) fn prune(shape: &Shape, value: &mut Value) -> Vec<String> {
    let mut unknown = Vec::new();
    let mut path = String::new();
    walk(shape, value, &mut path, &mut unknown);
    unknown
}

fn walk(shape: &Shape, value: &mut Value, path: &mut String, unknown: &mut Vec<String>) {
    match (shape, value) {
        (Shape::Struct(fields), Value::Object(map)) => map.retain(|key, v| {
            let Some(sub) = fields.get(key.as_str()) else {
                let sep = if path.is_empty() { "" } else { "." };
                unknown.push(format!("{path}{sep}{key}"));
                return false;
            };
            if sub.nested() {
                let len = path.len();
                if len > 0 {
                    path.push('.');
                }
                path.push_str(key);
                walk(sub, v, path, unknown);
                path.truncate(len);
            }
            true
        }),
        (Shape::Map(inner), Value::Object(map)) if inner.nested() => {
            for (key, v) in map.iter_mut() {
                let len = path.len();
                path.push('.');
                path.push_str(key);
                walk(inner, v, path, unknown);
                path.truncate(len);
            }
        }
        (Shape::List(inner), Value::Array(items)) if inner.nested() => {
            for (i, v) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(inner, v, path, unknown);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// The field tree of a built-in type by its store key (`"{group}/{plural}"`).
pub(crate) fn shape(res: &str) -> Option<&'static Shape> {
    SHAPES.get(res)
}

static SHAPES: LazyLock<HashMap<&'static str, Shape>> = LazyLock::new(|| {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    HashMap::from([
        ("/namespaces", shape_of::<core::Namespace>()),
        (
            "/persistentvolumeclaims",
            shape_of::<core::PersistentVolumeClaim>(),
        ),
        ("/persistentvolumes", shape_of::<core::PersistentVolume>()),
        ("/nodes", shape_of::<core::Node>()),
        ("/pods", shape_of::<core::Pod>()),
        ("/events", shape_of::<core::Event>()),
        ("storage.k8s.io/storageclasses", shape_of::<StorageClass>()),
        ("storage.k8s.io/csinodes", shape_of::<CSINode>()),
        ("coordination.k8s.io/leases", shape_of::<Lease>()),
        ("events.k8s.io/events", shape_of::<Event>()),
        (
            "apiextensions.k8s.io/customresourcedefinitions",
            shape_of::<CustomResourceDefinition>(),
        ),
    ])
});

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_builtin_type_is_traced() {
        for (res, shape) in SHAPES.iter() {
            let Shape::Struct(fields) = shape else {
                panic!("{res} was not traced: {shape:?}");
            };
            for field in ["apiVersion", "kind", "metadata"] {
                assert!(fields.contains_key(field), "{res} lacks {field}");
            }
        }
        let pvc = shape("/persistentvolumeclaims").unwrap();
        assert!(matches!(
            pvc.at(&["spec", "resources", "requests"]),
            Some(Shape::Map(_))
        ));
        assert!(
            pvc.at(&["metadata", "ownerReferences", "*", "uid"])
                .is_some()
        );
        let pod = shape("/pods").unwrap();
        assert!(
            pod.at(&[
                "spec",
                "containers",
                "*",
                "livenessProbe",
                "httpGet",
                "port"
            ])
            .is_some()
        );
        let crd = shape("apiextensions.k8s.io/customresourcedefinitions").unwrap();
        assert!(matches!(
            crd.at(&["spec", "versions", "*", "schema", "openAPIV3Schema"]),
            Some(Shape::Any)
        ));
        let lease = shape("coordination.k8s.io/leases").unwrap();
        assert!(lease.at(&["spec", "renewTime"]).is_some());
    }

    #[test]
    fn prune_drops_unknown_fields_and_names_their_paths() {
        let pod = shape("/pods").unwrap();
        let mut obj = json!({
            "apiVersion": "v1", "kind": "Pod", "bogusTop": 1,
            "metadata": {"name": "p", "labels": {"any": "label"}, "nope": null},
            "spec": {"containers": [{"name": "c", "image": "i", "bogus": true},
                                    {"name": "d", "image": "i"}], "bogus": {"x": 1}},
        });
        let unknown = prune(pod, &mut obj);
        assert_eq!(
            unknown,
            [
                "bogusTop",
                "metadata.nope",
                "spec.bogus",
                "spec.containers[0].bogus"
            ]
        );
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "labels": {"any": "label"}},
                   "spec": {"containers": [{"name": "c", "image": "i"},
                                           {"name": "d", "image": "i"}]}})
        );
        let crd = shape("apiextensions.k8s.io/customresourcedefinitions").unwrap();
        let mut schema = json!({"spec": {"versions": [{"name": "v1", "schema": {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
        assert!(prune(crd, &mut schema).is_empty());
    }

    #[test]
    fn field_validation_values() {
        assert_eq!(
            FieldValidation::parse(None, "CreateOptions").unwrap(),
            FieldValidation::Warn
        );
        assert_eq!(
            FieldValidation::parse(Some("Strict"), "CreateOptions").unwrap(),
            FieldValidation::Strict
        );
        let err = FieldValidation::parse(Some("strict"), "PatchOptions").unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \
             \"strict\": supported values: \"Ignore\", \"Strict\", \"Warn\""
        );
    }
}
