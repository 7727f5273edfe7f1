//! Lenient reading of `CnsVolumeMetadata` specs and statuses: never an error, so that one
//! malformed object cannot fail the decoding of a whole list or watch.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::{
    CnsVolumeMetadataSpec, CnsVolumeMetadataStatus, EntityReference, EntityType, VolumeStatus,
};

/// A string field as written: text as is, `null` as empty, anything else as its JSON text.
fn text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// A string field of a typed schema: anything but a string reads as empty.
fn string(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) => text.clone(),
        _ => String::new(),
    }
}

/// The items of an array field; anything but an array has none.
fn items(value: Option<&Value>) -> &[Value] {
    match value {
        Some(Value::Array(items)) => items,
        _ => &[],
    }
}

/// The fields of an object; anything but an object has none.
fn fields(value: &Value) -> Option<&Map<String, Value>> {
    match value {
        Value::Object(fields) => Some(fields),
        _ => None,
    }
}

fn reference(value: &Value) -> EntityReference {
    let Some(fields) = fields(value) else {
        return EntityReference::default();
    };
    let cluster_id = fields.get("ClusterID").or_else(|| fields.get("ClusterId"));
    EntityReference {
        entity_type: EntityType::parse(&text(fields.get("EntityType"))),
        entity_name: text(fields.get("EntityName")),
        namespace: text(fields.get("Namespace")),
        cluster_id: text(cluster_id),
    }
}

impl<'de> Deserialize<'de> for EntityReference {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(reference(&Value::deserialize(deserializer)?))
    }
}

impl<'de> Deserialize<'de> for EntityType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::parse(&text(Some(&Value::deserialize(deserializer)?))))
    }
}

impl<'de> Deserialize<'de> for CnsVolumeMetadataSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let Some(spec) = fields(&value) else {
            return Ok(Self::default());
        };
        let labels = match spec.get("labels") {
            Some(Value::Object(labels)) => labels
                .iter()
                .map(|(key, value)| (key.clone(), text(Some(value))))
                .collect(),
            _ => BTreeMap::new(),
        };
        Ok(Self {
            volume_names: items(spec.get("volumenames"))
                .iter()
                .map(|name| string(Some(name)))
                .collect(),
            guest_cluster_id: string(spec.get("guestclusterid")),
            entity_type: EntityType::parse(&text(spec.get("entitytype"))),
            entity_name: string(spec.get("entityname")),
            entity_references: items(spec.get("entityreferences"))
                .iter()
                .map(reference)
                .collect(),
            labels,
            namespace: string(spec.get("namespace")),
            cluster_distribution: string(spec.get("clusterdistribution")),
        })
    }
}

impl<'de> Deserialize<'de> for CnsVolumeMetadataStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let status = fields(&value).and_then(|f| f.get("volumestatus"));
        Ok(Self {
            volume_status: items(status).iter().map(volume_status).collect(),
        })
    }
}

fn volume_status(value: &Value) -> VolumeStatus {
    let Some(fields) = fields(value) else {
        return VolumeStatus::default();
    };
    VolumeStatus {
        volume_name: string(fields.get("volumename")),
        updated: fields
            .get("updated")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        error_message: string(fields.get("errormessage")),
    }
}

impl<'de> Deserialize<'de> for VolumeStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(volume_status(&Value::deserialize(deserializer)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::CnsVolumeMetadata;
    use serde_json::json;

    #[test]
    fn malformed_references_read_as_values_that_validation_rejects() {
        let reference: EntityReference = serde_json::from_str(
            r#"{"EntityType":5,"EntityName":null,"Namespace":"n","ClusterId":"old","ClusterID":"new","Extra":[1]}"#,
        )
        .unwrap();
        assert_eq!(
            reference,
            EntityReference::new(EntityType::Other("5".into()), "", "n", "new")
        );
        let spec: CnsVolumeMetadataSpec = serde_json::from_str(
            r#"{"volumenames":["a"],"guestclusterid":"g","entitytype":"POD","entityname":"p","entityreferences":[null,{"EntityType":true}]}"#,
        )
        .unwrap();
        assert_eq!(
            spec.entity_references,
            vec![
                EntityReference::default(),
                EntityReference::new(EntityType::Other("true".into()), "", "", ""),
            ]
        );
    }

    #[test]
    fn specs_of_the_wrong_shape_read_as_values_that_validation_rejects() {
        let read = |json: serde_json::Value| -> CnsVolumeMetadataSpec {
            serde_json::from_value(json).unwrap()
        };
        assert_eq!(read(json!("a string")), CnsVolumeMetadataSpec::default());
        assert_eq!(read(json!([1, 2])), CnsVolumeMetadataSpec::default());
        let spec = read(json!({
            "volumenames": "gc-1-a", "guestclusterid": 7, "entitytype": 5,
            "entityname": {"n": 1}, "entityreferences": ["x", 3],
            "labels": {"app": 1, "tier": "gold"}, "namespace": ["shop"],
            "clusterdistribution": false,
        }));
        assert_eq!(
            spec,
            CnsVolumeMetadataSpec {
                entity_type: EntityType::Other("5".into()),
                entity_references: vec![EntityReference::default(); 2],
                labels: BTreeMap::from([
                    ("app".to_owned(), "1".to_owned()),
                    ("tier".to_owned(), "gold".to_owned()),
                ]),
                ..CnsVolumeMetadataSpec::default()
            }
        );
        let messages: Vec<String> = crate::validate::validate(&CnsVolumeMetadata::new("x", spec))
            .unwrap_err()
            .violations
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            messages,
            [
                "EntityName, EntityType and GuestClusterID are required parameters.",
                "Invalid entity type \"5\"",
            ]
        );
        assert_eq!(
            read(json!({"volumenames": ["a", 5, null]})).volume_names,
            ["a", "", ""]
        );
    }

    #[test]
    fn statuses_of_the_wrong_shape_read_as_empty() {
        let read = |json: serde_json::Value| -> CnsVolumeMetadataStatus {
            serde_json::from_value(json).unwrap()
        };
        assert_eq!(read(json!(3)), CnsVolumeMetadataStatus::default());
        assert_eq!(
            read(json!({"volumestatus": {"a": 1}})),
            CnsVolumeMetadataStatus::default()
        );
        assert_eq!(
            read(json!({"volumestatus": [
                {"volumename": "a", "updated": "yes", "errormessage": 4}, 7
            ]}))
            .volume_status,
            vec![VolumeStatus::failed("a", ""), VolumeStatus::default()]
        );
    }

    #[test]
    fn one_malformed_object_does_not_break_reading_a_list() {
        let list = serde_json::json!([
            { "metadata": { "name": "good" }, "spec": {
                "volumenames": ["a"], "guestclusterid": "g", "entitytype": "PERSISTENT_VOLUME_CLAIM",
                "entityname": "c", "namespace": "n",
                "entityreferences": [{ "EntityType": "PERSISTENT_VOLUME", "EntityName": "pv",
                                       "Namespace": "", "ClusterID": "g" }] } },
            { "metadata": { "name": "bad" }, "spec": {
                "volumenames": ["a"], "guestclusterid": "g", "entitytype": "POD",
                "entityname": "p", "namespace": "n",
                "entityreferences": [{ "EntityType": { "nested": 1 }, "ClusterID": 7 }] } },
            { "metadata": { "name": "worse" }, "spec": {
                "volumenames": "a", "entitytype": 5, "entityreferences": "none",
                "labels": [] }, "status": "broken" },
        ]);
        let objects: Vec<CnsVolumeMetadata> = serde_json::from_value(list).unwrap();
        assert_eq!(objects.len(), 3);
        assert!(crate::validate::validate(&objects[2]).is_err());
        assert!(crate::validate::validate(&objects[0]).is_ok());
        assert_eq!(objects[1].spec.entity_references[0].cluster_id, "7");
        assert!(crate::validate::validate(&objects[1]).is_err());
    }
}
