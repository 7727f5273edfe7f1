//! GET of one object and of collections (selectors, `limit` and `continue`).

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::json;

use crate::http::table;

use crate::resources::ResourceDef;
use crate::selector::{FieldSelector, FieldSet, LabelSelector};
use crate::shared::Shared;
use crate::status::{ApiError, ApiResult};
use crate::store::{ObjKey, State, Stored};

/// Label and field selectors of a list or watch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Selectors {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Selectors {
    /// Parses `labelSelector` and `fieldSelector`.
    ///
    /// # Errors
    /// 400 BadRequest for a malformed selector.
    pub(crate) fn from_query(q: &HashMap<String, String>, def: &ResourceDef) -> ApiResult<Self> {
        let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(
            q.get("fieldSelector").map_or("", String::as_str),
            FieldSet::of(def),
        )
        .map_err(ApiError::bad_request)?;
        Ok(Self { labels, fields })
    }

    /// Whether an object matches both selectors.
    pub(crate) fn matches(&self, obj: &Stored) -> bool {
        if !self.fields.is_empty() && !self.fields.matches(&obj.value) {
            return false;
        }
        self.labels.is_empty() || self.labels.matches(obj.labels())
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// A continue token: the list's resourceVersion and the last key returned.
fn encode_continue(rv: u64, key: &ObjKey) -> String {
    hex(&format!("{rv}\n{}\n{}", key.0, key.1))
}

fn decode_continue(token: &str) -> ApiResult<(u64, ObjKey)> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let text = unhex(token).ok_or_else(bad)?;
    let mut parts = text.splitn(3, '\n');
    let rv = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let ns = parts.next().ok_or_else(bad)?.to_string();
    let name = parts.next().ok_or_else(bad)?.to_string();
    Ok((rv, (ns, name)))
}

/// One page of a list, gathered under the lock.
struct Page {
    rv: u64,
    items: Vec<Arc<Stored>>,
    next: Option<String>,
    remaining: usize,
}

fn collect(
    state: &State,
    def: &ResourceDef,
    ns: Option<&str>,
    sel: &Selectors,
    limit: usize,
    token: Option<&str>,
) -> ApiResult<Page> {
    let (rv, after) = match token {
        Some(t) => {
            let (rv, key) = decode_continue(t)?;
            if rv < state.min_rv {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some(key))
        }
        None => (state.rv, None),
    };
    let mut page = Page {
        rv,
        items: Vec::new(),
        next: None,
        remaining: 0,
    };
    let Some(table) = state.table(&def.key) else {
        return Ok(page);
    };
    let start = match (&after, ns) {
        (Some(key), _) => Bound::Excluded(key.clone()),
        (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
        (None, None) => Bound::Unbounded,
    };
    let mut last: Option<&ObjKey> = None;
    for (key, obj) in table.range((start, Bound::Unbounded)) {
        if ns.is_some_and(|ns| key.0 != ns) {
            break;
        }
        if !sel.matches(obj) {
            continue;
        }
        if page.items.len() < limit {
            page.items.push(obj.clone());
            last = Some(key);
        } else {
            page.remaining += 1;
        }
    }
    if page.remaining > 0 {
        page.next = last.map(|k| encode_continue(rv, k));
    }
    Ok(page)
}

/// Serves a list as `{kind: XList, ...}` JSON, or as a Table when `as_table`.
///
/// # Errors
/// 400 for bad selectors, limit or continue token; 410 for an expired continue token.
pub(crate) fn list(
    shared: &Shared,
    def: &ResourceDef,
    version: &str,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    as_table: bool,
) -> ApiResult<Bytes> {
    let sel = Selectors::from_query(q, def)?;
    let limit = match q.get("limit").map(String::as_str) {
        None | Some("") | Some("0") => usize::MAX,
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?,
    };
    let token = q
        .get("continue")
        .map(String::as_str)
        .filter(|t| !t.is_empty());
    let page = collect(&shared.state(), def, ns, &sel, limit, token)?;
    if as_table {
        let mut meta = json!({"resourceVersion": page.rv.to_string()});
        if let Some(next) = &page.next {
            meta["continue"] = json!(next);
        }
        let objects: Vec<&Stored> = page.items.iter().map(|o| &**o).collect();
        let include = q.get("includeObject").is_some_and(|v| v == "Object");
        let t = table::table(def, &objects, meta, include);
        return Ok(Bytes::from(serde_json::to_vec(&t).unwrap_or_default()));
    }
    let size: usize = page.items.iter().map(|b| b.bytes.len() + 1).sum();
    let mut out = BytesMut::with_capacity(size + 256);
    out.put_slice(b"{\"kind\":");
    out.put_slice(
        serde_json::to_string(&def.list_kind)
            .unwrap_or_default()
            .as_bytes(),
    );
    out.put_slice(b",\"apiVersion\":");
    out.put_slice(
        serde_json::to_string(&def.api_version(version))
            .unwrap_or_default()
            .as_bytes(),
    );
    out.put_slice(format!(",\"metadata\":{{\"resourceVersion\":\"{}\"", page.rv).as_bytes());
    if let Some(next) = &page.next {
        out.put_slice(
            format!(
                ",\"continue\":\"{next}\",\"remainingItemCount\":{}",
                page.remaining
            )
            .as_bytes(),
        );
    }
    out.put_slice(b"},\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(&item.bytes);
    }
    out.put_slice(b"]}");
    Ok(out.freeze())
}

/// Serves one object, or a Table of it when `as_table`.
///
/// # Errors
/// 404 when missing.
pub(crate) fn get(
    shared: &Shared,
    def: &ResourceDef,
    ns: &str,
    name: &str,
    as_table: bool,
) -> ApiResult<Bytes> {
    let obj = shared
        .state()
        .get(&def.key, ns, name)
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    if as_table {
        let meta = json!({"resourceVersion": obj.value["metadata"]["resourceVersion"]});
        let t = table::table(def, &[&obj], meta, false);
        return Ok(Bytes::from(serde_json::to_vec(&t).unwrap_or_default()));
    }
    Ok(obj.bytes.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let token = encode_continue(42, &("default".into(), "claim-9".into()));
        assert_eq!(
            decode_continue(&token).unwrap(),
            (42, ("default".into(), "claim-9".into()))
        );
        assert_eq!(decode_continue("zz").unwrap_err().code, 400);
        assert_eq!(decode_continue(&hex("nope")).unwrap_err().code, 400);
    }
}
