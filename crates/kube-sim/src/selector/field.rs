//! Field selectors: `=`, `==`, `!=` on `metadata.name`, `metadata.namespace` and the labels
//! each type adds (e.g. `involvedObject.name` for events, `spec.nodeName` for pods), with the
//! real server's message for a label the type does not have.

use serde_json::Value;

use crate::resources::ResourceDef;

/// A field label a type supports beyond `metadata.name` and `metadata.namespace`: its
/// label, where its value lives in the object, and the value when that is absent.
type FieldDef = (&'static str, &'static [&'static str], &'static str);

const CORE_EVENT_FIELDS: &[FieldDef] = &[
    ("involvedObject.kind", &["involvedObject", "kind"], ""),
    (
        "involvedObject.namespace",
        &["involvedObject", "namespace"],
        "",
    ),
    ("involvedObject.name", &["involvedObject", "name"], ""),
    ("involvedObject.uid", &["involvedObject", "uid"], ""),
    (
        "involvedObject.apiVersion",
        &["involvedObject", "apiVersion"],
        "",
    ),
    (
        "involvedObject.resourceVersion",
        &["involvedObject", "resourceVersion"],
        "",
    ),
    (
        "involvedObject.fieldPath",
        &["involvedObject", "fieldPath"],
        "",
    ),
    ("reason", &["reason"], ""),
    ("reportingComponent", &["reportingComponent"], ""),
    ("source", &["source", "component"], ""),
    ("type", &["type"], ""),
];

const EVENTS_V1_FIELDS: &[FieldDef] = &[
    ("regarding.kind", &["regarding", "kind"], ""),
    ("regarding.namespace", &["regarding", "namespace"], ""),
    ("regarding.name", &["regarding", "name"], ""),
    ("regarding.uid", &["regarding", "uid"], ""),
    ("regarding.apiVersion", &["regarding", "apiVersion"], ""),
    (
        "regarding.resourceVersion",
        &["regarding", "resourceVersion"],
        "",
    ),
    ("regarding.fieldPath", &["regarding", "fieldPath"], ""),
    ("reason", &["reason"], ""),
    ("reportingController", &["reportingController"], ""),
    ("type", &["type"], ""),
];

const POD_FIELDS: &[FieldDef] = &[
    ("spec.nodeName", &["spec", "nodeName"], ""),
    ("spec.restartPolicy", &["spec", "restartPolicy"], ""),
    ("spec.schedulerName", &["spec", "schedulerName"], ""),
    (
        "spec.serviceAccountName",
        &["spec", "serviceAccountName"],
        "",
    ),
    ("spec.hostNetwork", &["spec", "hostNetwork"], "false"),
    ("status.phase", &["status", "phase"], ""),
    ("status.podIP", &["status", "podIP"], ""),
    (
        "status.nominatedNodeName",
        &["status", "nominatedNodeName"],
        "",
    ),
];

const NAMESPACE_FIELDS: &[FieldDef] = &[("status.phase", &["status", "phase"], "")];

const NODE_FIELDS: &[FieldDef] = &[("spec.unschedulable", &["spec", "unschedulable"], "false")];

/// The type a field selector is parsed for: which labels it has and how the real server
/// words a rejection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FieldSet {
    extra: &'static [FieldDef],
    /// Cluster-scoped custom resources have no `metadata.namespace` label.
    namespace: bool,
    rejection: Rejection,
}

/// The three ways the real server words an unsupported field label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rejection {
    /// Types with their own label conversion (pods, events, ...) and custom resources.
    Converted,
    /// Types registered with the metadata-only conversion (claims).
    ForKind(&'static str),
    /// Types without a conversion: the apimachinery default.
    Default,
}

impl FieldSet {
    /// Only `metadata.name` and `metadata.namespace`, rejected with the default message.
    pub(crate) const METADATA: Self = Self {
        extra: &[],
        namespace: true,
        rejection: Rejection::Default,
    };

    /// The field labels of a type, as the real server supports them.
    pub(crate) fn of(def: &ResourceDef) -> Self {
        let with = |extra: &'static [FieldDef]| Self {
            extra,
            namespace: true,
            rejection: Rejection::Converted,
        };
        if !def.builtin {
            return Self {
                extra: &[],
                namespace: def.namespaced,
                rejection: Rejection::Converted,
            };
        }
        match (def.group.as_str(), def.plural.as_str()) {
            ("", "events") => with(CORE_EVENT_FIELDS),
            ("events.k8s.io", "events") => with(EVENTS_V1_FIELDS),
            ("", "pods") => with(POD_FIELDS),
            ("", "namespaces") => with(NAMESPACE_FIELDS),
            ("", "nodes") => with(NODE_FIELDS),
            ("", "persistentvolumeclaims") => Self {
                rejection: Rejection::ForKind("PersistentVolumeClaim"),
                ..Self::METADATA
            },
            _ => Self::METADATA,
        }
    }

    fn lookup(&self, label: &str) -> Result<Field, String> {
        match label {
            "metadata.name" => return Ok(Field::Name),
            "metadata.namespace" if self.namespace => return Ok(Field::Namespace),
            _ => {}
        }
        if let Some((_, path, absent)) = self.extra.iter().find(|(l, _, _)| *l == label) {
            return Ok(Field::Path(path, absent));
        }
        Err(match self.rejection {
            Rejection::Converted => format!("field label not supported: {label}"),
            Rejection::ForKind(kind) => {
                format!("field label {label:?} not supported for {kind:?}")
            }
            Rejection::Default => format!(
                "{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            ),
        })
    }
}

/// Where a field label reads its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
    /// A path into the object and the value when it is absent.
    Path(&'static [&'static str], &'static str),
}

/// One requirement of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldReq {
    field: Field,
    value: String,
    negate: bool,
}

/// A parsed field selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<FieldReq>);

/// The text of a selectable field: strings as they are, booleans and numbers printed.
fn field_text<'a>(obj: &'a Value, path: &[&str], absent: &'a str) -> std::borrow::Cow<'a, str> {
    let mut cur = obj;
    for key in path {
        match cur.get(key) {
            Some(next) => cur = next,
            None => return absent.into(),
        }
    }
    match cur {
        Value::String(s) => s.as_str().into(),
        Value::Null => absent.into(),
        Value::Bool(b) => b.to_string().into(),
        other => other.to_string().into(),
    }
}

impl FieldSelector {
    /// Parses the `fieldSelector` query value for a type with the labels `fields`.
    pub(crate) fn parse(s: &str, fields: FieldSet) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in s.split(',') {
            let part = part.trim();
            let (label, value, negate) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            reqs.push(FieldReq {
                field: fields.lookup(label.trim())?,
                value: value.trim().to_string(),
                negate,
            });
        }
        Ok(Self(reqs))
    }

    /// Whether `obj` satisfies every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|req| {
            let actual = match req.field {
                Field::Name => field_text(obj, &["metadata", "name"], ""),
                Field::Namespace => field_text(obj, &["metadata", "namespace"], ""),
                Field::Path(path, absent) => field_text(obj, path, absent),
            };
            (actual == req.value.as_str()) != req.negate
        })
    }

    /// Whether the selector has no requirements.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    #[test]
    fn a_requirement_needs_an_operator() {
        assert!(FieldSelector::parse("metadata.name", FieldSet::METADATA).is_err());
    }

    fn fields_of(group: &str, plural: &str) -> FieldSet {
        let reg = Registry::with_builtins();
        FieldSet::of(&reg.lookup(group, "v1", plural).unwrap())
    }

    #[test]
    fn field_selector_matches_name_and_namespace() {
        let sel = FieldSelector::parse(
            "metadata.name=a,metadata.namespace!=kube-system",
            FieldSet::METADATA,
        )
        .unwrap();
        let obj = |ns: &str, name: &str| json!({"metadata": {"namespace": ns, "name": name}});
        assert!(sel.matches(&obj("default", "a")));
        assert!(!sel.matches(&obj("kube-system", "a")));
        assert!(!sel.matches(&obj("default", "b")));
    }

    #[test]
    fn unsupported_labels_get_the_real_messages() {
        let err = |fields: FieldSet, s: &str| FieldSelector::parse(s, fields).unwrap_err();
        assert_eq!(
            err(fields_of("", "pods"), "spec.bogus=x"),
            "field label not supported: spec.bogus"
        );
        assert_eq!(
            err(fields_of("", "persistentvolumeclaims"), "spec.volumeName=x"),
            "field label \"spec.volumeName\" not supported for \"PersistentVolumeClaim\""
        );
        assert_eq!(
            err(
                fields_of("storage.k8s.io", "storageclasses"),
                "provisioner=x"
            ),
            "\"provisioner\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
        assert!(
            FieldSelector::parse(
                "involvedObject.name=x",
                fields_of("events.k8s.io", "events")
            )
            .is_err()
        );
    }

    #[test]
    fn event_fields_select_by_the_object_they_are_about() {
        let core = fields_of("", "events");
        let event = json!({
            "metadata": {"name": "e", "namespace": "default"},
            "involvedObject": {"kind": "PersistentVolumeClaim", "name": "claim-1",
                               "namespace": "default", "uid": "u-1"},
            "reason": "ProvisioningFailed", "type": "Warning",
            "source": {"component": "csi"},
        });
        let m = |s: &str| FieldSelector::parse(s, core).unwrap().matches(&event);
        assert!(m(
            "involvedObject.name=claim-1,involvedObject.namespace=default,\
             involvedObject.kind=PersistentVolumeClaim,involvedObject.uid=u-1"
        ));
        assert!(m("reason=ProvisioningFailed,type!=Normal,source=csi"));
        assert!(m("involvedObject.fieldPath="));
        assert!(!m("involvedObject.name=other"));
        let v1 = fields_of("events.k8s.io", "events");
        let event = json!({"regarding": {"name": "claim-1"}, "reportingController": "csi"});
        let m = |s: &str| FieldSelector::parse(s, v1).unwrap().matches(&event);
        assert!(m("regarding.name=claim-1,reportingController=csi"));
        assert!(!m("regarding.name=claim-2"));
    }

    #[test]
    fn pod_and_node_fields_print_booleans() {
        let pod = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let m = |s: &str| {
            FieldSelector::parse(s, fields_of("", "pods"))
                .unwrap()
                .matches(&pod)
        };
        assert!(m(
            "spec.nodeName=n1,status.phase=Running,spec.hostNetwork=false"
        ));
        assert!(!m("spec.nodeName!=n1"));
        let node = json!({"spec": {"unschedulable": true}});
        let sel = FieldSelector::parse("spec.unschedulable=true", fields_of("", "nodes")).unwrap();
        assert!(sel.matches(&node));
        let ns = json!({"status": {"phase": "Active"}});
        let sel = FieldSelector::parse("status.phase=Active", fields_of("", "namespaces")).unwrap();
        assert!(sel.matches(&ns));
    }
}
