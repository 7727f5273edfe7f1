//! Lenient reading of `entityreferences` items, which the upstream CRD leaves untyped.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::{EntityReference, EntityType};

/// A string field as written: text as is, `null` as empty, anything else as its JSON text.
fn text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

impl<'de> Deserialize<'de> for EntityReference {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = Option::<BTreeMap<String, Value>>::deserialize(deserializer)?;
        let fields = fields.unwrap_or_default();
        let cluster_id = fields.get("ClusterID").or_else(|| fields.get("ClusterId"));
        Ok(Self {
            entity_type: EntityType::parse(&text(fields.get("EntityType"))),
            entity_name: text(fields.get("EntityName")),
            namespace: text(fields.get("Namespace")),
            cluster_id: text(cluster_id),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{CnsVolumeMetadata, CnsVolumeMetadataSpec};

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
        ]);
        let objects: Vec<CnsVolumeMetadata> = serde_json::from_value(list).unwrap();
        assert_eq!(objects.len(), 2);
        assert!(crate::validate(&objects[0]).is_ok());
        assert_eq!(objects[1].spec.entity_references[0].cluster_id, "7");
        assert!(crate::validate(&objects[1]).is_err());
    }
}
