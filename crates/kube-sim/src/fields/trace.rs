//! Reads a type's [`Shape`] by driving its `Deserialize` impl with a deserializer that
//! records what the impl asks for and feeds it sample values. k8s-openapi's generated impls
//! name every field of a struct (`deserialize_struct`), so the whole tree comes out.

use std::collections::HashMap;
use std::fmt;

use serde::de::value::StrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess};
use serde::forward_to_deserialize_any;

use super::Shape;

/// Traces `T`'s `Deserialize` impl; a type that cannot be traced accepts every field.
pub(super) fn shape_of<T: DeserializeOwned>() -> Shape {
    let mut shape = Shape::Leaf;
    let mut stack = Vec::new();
    let tracer = Tracer {
        shape: &mut shape,
        stack: &mut stack,
        top: true,
    };
    match T::deserialize(tracer) {
        Ok(_) => shape,
        Err(_) => Shape::Any,
    }
}

/// Why tracing a type failed.
#[derive(Debug)]
struct TraceError(String);

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

impl de::Error for TraceError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// A timestamp that `Time` and `MicroTime` accept.
const TIME_SAMPLE: &str = "1970-01-01T00:00:00Z";

/// A deserializer that records the shape the visitor asks for and feeds it a sample value.
struct Tracer<'a> {
    shape: &'a mut Shape,
    /// Struct names being traced, to stop at recursive types.
    stack: &'a mut Vec<&'static str>,
    /// The resource itself: its `apiVersion` and `kind` must not get sample values.
    top: bool,
}

impl<'de> de::Deserializer<'de> for Tracer<'_> {
    type Error = TraceError;

    fn deserialize_any<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        *self.shape = Shape::Any;
        visitor.visit_str("")
    }

    fn deserialize_bool<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_bool(false)
    }

    fn deserialize_i64<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_i64(0)
    }

    fn deserialize_i32<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_i32(0)
    }

    fn deserialize_u64<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_u64(0)
    }

    fn deserialize_f64<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_f64(0.0)
    }

    fn deserialize_str<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_str("")
    }

    fn deserialize_string<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_str("")
    }

    fn deserialize_bytes<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_bytes(&[])
    }

    fn deserialize_byte_buf<V: de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_bytes(&[])
    }

    fn deserialize_option<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_some(self)
    }

    fn deserialize_unit<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    fn deserialize_ignored_any<V: de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match name {
            "Time" | "MicroTime" => {
                let sample: StrDeserializer<'_, TraceError> = TIME_SAMPLE.into_deserializer();
                visitor.visit_newtype_struct(sample)
            }
            _ => visitor.visit_newtype_struct(self),
        }
    }

    fn deserialize_seq<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let mut inner = Shape::Leaf;
        let out = visitor.visit_seq(OneElement {
            shape: Some(&mut inner),
            stack: self.stack,
        })?;
        *self.shape = Shape::List(Box::new(inner));
        Ok(out)
    }

    fn deserialize_map<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let mut inner = Shape::Leaf;
        let out = visitor.visit_map(OneEntry {
            shape: Some(&mut inner),
            key_sent: false,
            stack: self.stack,
        })?;
        *self.shape = Shape::Map(Box::new(inner));
        Ok(out)
    }

    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        if name == "JSONSchemaProps" || self.stack.contains(&name) {
            // Recursive (or schema) types: free-form below this point.
            *self.shape = Shape::Any;
            return visitor.visit_map(OneEntry {
                shape: None,
                key_sent: true,
                stack: self.stack,
            });
        }
        let mut known: HashMap<&'static str, Shape> =
            fields.iter().map(|f| (*f, Shape::Leaf)).collect();
        self.stack.push(name);
        let skip_type_meta = self.top;
        let out = visitor.visit_map(StructFields {
            fields: fields.iter(),
            current: "",
            known: &mut known,
            stack: self.stack,
            skip_type_meta,
        });
        self.stack.pop();
        *self.shape = Shape::Struct(known);
        out
    }

    forward_to_deserialize_any! {
        i8 i16 u8 u16 u32 f32 char i128 u128
        unit_struct tuple tuple_struct enum identifier
    }
}

/// The fields of a struct, each with a traced value.
struct StructFields<'a> {
    fields: std::slice::Iter<'static, &'static str>,
    current: &'static str,
    known: &'a mut HashMap<&'static str, Shape>,
    stack: &'a mut Vec<&'static str>,
    skip_type_meta: bool,
}

impl<'de> MapAccess<'de> for StructFields<'_> {
    type Error = TraceError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let next = self
            .fields
            .by_ref()
            .find(|f| !(self.skip_type_meta && matches!(**f, "apiVersion" | "kind")));
        let Some(field) = next else {
            return Ok(None);
        };
        self.current = field;
        let key: StrDeserializer<'_, TraceError> = field.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        let shape = self.known.entry(self.current).or_default();
        seed.deserialize(Tracer {
            shape,
            stack: self.stack,
            top: false,
        })
    }
}

/// One map entry (key `k`) with a traced value; none when `shape` is `None`.
struct OneEntry<'a> {
    shape: Option<&'a mut Shape>,
    key_sent: bool,
    stack: &'a mut Vec<&'static str>,
}

impl<'de> MapAccess<'de> for OneEntry<'_> {
    type Error = TraceError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        if self.key_sent {
            return Ok(None);
        }
        self.key_sent = true;
        let key: StrDeserializer<'_, TraceError> = "k".into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        let shape = self
            .shape
            .take()
            .ok_or_else(|| TraceError("a map value without its key".into()))?;
        seed.deserialize(Tracer {
            shape,
            stack: self.stack,
            top: false,
        })
    }
}

/// A list of one traced element.
struct OneElement<'a> {
    shape: Option<&'a mut Shape>,
    stack: &'a mut Vec<&'static str>,
}

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = TraceError;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Self::Error> {
        let Some(shape) = self.shape.take() else {
            return Ok(None);
        };
        seed.deserialize(Tracer {
            shape,
            stack: self.stack,
            top: false,
        })
        .map(Some)
    }
}
