//! Just enough of the Kubernetes protobuf encoding for `kubectl create namespace`: kubectl's
//! typed commands send protobuf bodies and never fall back to JSON. A body is the magic
//! `k8s\0` and a `runtime.Unknown` (type meta, then the object's own protobuf bytes); only a
//! core/v1 Namespace is decoded (name, generateName, labels, annotations, finalizers and
//! `spec.finalizers`). Every other type stays JSON or YAML only.

use serde_json::{Map, Value, json};

use crate::resources::ResourceDef;
use crate::status::{ApiError, ApiResult};

/// The protobuf media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// Whether protobuf bodies of this type are decoded.
pub(crate) fn accepts(def: &ResourceDef) -> bool {
    def.builtin && def.group.is_empty() && def.plural == "namespaces"
}

/// The value of one field of a protobuf message: length-delimited bytes (strings,
/// messages, map entries) or a number, which no decoded field needs.
enum Wire<'a> {
    Bytes(&'a [u8]),
    Number,
}

/// Reads the fields of one message.
struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.buf.split_first()?;
            self.buf = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn skip(&mut self, n: usize) -> Option<()> {
        self.buf = self.buf.get(n..)?;
        Some(())
    }

    /// The next field, `Ok(None)` at the end, `Err(())` when the bytes are malformed.
    fn next_field(&mut self) -> Result<Option<(u64, Wire<'a>)>, ()> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint().ok_or(())?;
        let wire = match key & 7 {
            0 => {
                self.varint().ok_or(())?;
                Wire::Number
            }
            1 => {
                self.skip(8).ok_or(())?;
                Wire::Number
            }
            2 => {
                let len = usize::try_from(self.varint().ok_or(())?).map_err(|_| ())?;
                let bytes = self.buf.get(..len).ok_or(())?;
                self.buf = &self.buf[len..];
                Wire::Bytes(bytes)
            }
            5 => {
                self.skip(4).ok_or(())?;
                Wire::Number
            }
            _ => return Err(()),
        };
        Ok(Some((key >> 3, wire)))
    }
}

/// Calls `f` with each length-delimited field of `msg`.
fn each_bytes<'a>(
    msg: &'a [u8],
    mut f: impl FnMut(u64, &'a [u8]) -> Result<(), ()>,
) -> Result<(), ()> {
    let mut fields = Fields { buf: msg };
    while let Some((number, wire)) = fields.next_field()? {
        match wire {
            Wire::Bytes(bytes) => f(number, bytes)?,
            Wire::Number => {}
        }
    }
    Ok(())
}

fn text(bytes: &[u8]) -> Result<String, ()> {
    String::from_utf8(bytes.to_vec()).map_err(|_| ())
}

/// A `map<string, string>` entry: key 1, value 2.
fn map_entry(entry: &[u8], into: &mut Map<String, Value>) -> Result<(), ()> {
    let (mut key, mut value) = (String::new(), String::new());
    each_bytes(entry, |number, bytes| {
        match number {
            1 => key = text(bytes)?,
            2 => value = text(bytes)?,
            _ => {}
        }
        Ok(())
    })?;
    into.insert(key, Value::String(value));
    Ok(())
}

fn object_meta(msg: &[u8]) -> Result<Value, ()> {
    let mut meta = Map::new();
    let (mut labels, mut annotations, mut finalizers) = (Map::new(), Map::new(), Vec::new());
    each_bytes(msg, |number, bytes| {
        let field = match number {
            1 => "name",
            2 => "generateName",
            3 => "namespace",
            5 => "uid",
            6 => "resourceVersion",
            11 => return map_entry(bytes, &mut labels),
            12 => return map_entry(bytes, &mut annotations),
            14 => {
                finalizers.push(Value::String(text(bytes)?));
                return Ok(());
            }
            _ => return Ok(()),
        };
        // Go's encoder writes every string field, empty or not.
        if !bytes.is_empty() {
            meta.insert(field.into(), Value::String(text(bytes)?));
        }
        Ok(())
    })?;
    for (field, map) in [("labels", labels), ("annotations", annotations)] {
        if !map.is_empty() {
            meta.insert(field.into(), Value::Object(map));
        }
    }
    if !finalizers.is_empty() {
        meta.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(meta))
}

fn namespace(raw: &[u8]) -> Result<Value, ()> {
    let mut obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {}});
    each_bytes(raw, |number, bytes| {
        match number {
            1 => obj["metadata"] = object_meta(bytes)?,
            2 => {
                let mut finalizers = Vec::new();
                each_bytes(bytes, |n, b| {
                    if n == 1 {
                        finalizers.push(Value::String(text(b)?));
                    }
                    Ok(())
                })?;
                if !finalizers.is_empty() {
                    obj["spec"] = json!({"finalizers": finalizers});
                }
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(obj)
}

/// Decodes a protobuf body of `def` (see [`accepts`]) into its JSON form.
///
/// # Errors
/// 400 BadRequest for a body that is not a protobuf `Namespace`.
pub(crate) fn decode(def: &ResourceDef, body: &[u8]) -> ApiResult<Value> {
    let bad = |detail: &str| {
        ApiError::bad_request(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: {detail}",
            kind = def.kind
        ))
    };
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("provided data does not appear to be a protobuf message"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    each_bytes(unknown, |number, bytes| {
        match number {
            1 => each_bytes(bytes, |n, b| {
                match n {
                    1 => api_version = text(b)?,
                    2 => kind = text(b)?,
                    _ => {}
                }
                Ok(())
            })?,
            2 => raw = Some(bytes),
            _ => {}
        }
        Ok(())
    })
    .map_err(|()| bad("malformed protobuf envelope"))?;
    if api_version != "v1" || kind != def.kind {
        return Err(bad(&format!(
            "protobuf body is {api_version}/{kind}, not v1/{}",
            def.kind
        )));
    }
    namespace(raw.unwrap_or_default()).map_err(|()| bad("malformed protobuf object"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    fn field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from(number << 3 | 2).unwrap()];
        let mut len = bytes.len();
        loop {
            let byte = u8::try_from(len & 0x7f).unwrap();
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(bytes);
        out
    }

    /// A body as kubectl's typed client encodes `kubectl create namespace demo`.
    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
        let mut body = MAGIC.to_vec();
        body.extend(field(1, &type_meta));
        body.extend(field(2, raw));
        body.extend(field(3, b""));
        body.extend(field(4, b""));
        body
    }

    #[test]
    fn decodes_a_namespace_like_kubectl_create_sends() {
        let reg = Registry::with_builtins();
        let ns = reg.lookup("", "v1", "namespaces").unwrap();
        assert!(accepts(&ns));
        let labels = [field(1, b"team"), field(2, b"storage")].concat();
        let meta = [
            field(1, b"demo"),
            field(2, b""),
            field(11, &labels),
            // generation = 7: a varint field that is skipped.
            vec![7 << 3, 7],
            field(14, b"example.com/keep"),
        ]
        .concat();
        let raw = [
            field(1, &meta),
            field(2, &field(1, b"kubernetes")),
            field(3, b""),
        ]
        .concat();
        let decoded = decode(&ns, &envelope("v1", "Namespace", &raw)).unwrap();
        assert_eq!(
            decoded,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "demo", "labels": {"team": "storage"},
                                "finalizers": ["example.com/keep"]},
                   "spec": {"finalizers": ["kubernetes"]}})
        );
    }

    #[test]
    fn refuses_other_bodies_with_400() {
        let reg = Registry::with_builtins();
        let ns = reg.lookup("", "v1", "namespaces").unwrap();
        assert!(!accepts(&reg.lookup("", "v1", "pods").unwrap()));
        assert_eq!(decode(&ns, b"{}").unwrap_err().code, 400);
        let pod = envelope("v1", "Pod", &field(1, &field(1, b"p")));
        assert_eq!(decode(&ns, &pod).unwrap_err().code, 400);
        let mut cut = envelope("v1", "Namespace", &field(1, &field(1, b"demo")));
        cut.truncate(cut.len() - 6);
        assert_eq!(decode(&ns, &cut).unwrap_err().code, 400);
        assert_eq!(decode(&ns, b"k8s\0\xff\xff\xff").unwrap_err().code, 400);
    }
}
