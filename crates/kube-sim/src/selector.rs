//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`) and field selectors
//! (`=`, `==`, `!=` on `metadata.name`, `metadata.namespace` and the labels each type adds,
//! e.g. `involvedObject.name` for events and `spec.nodeName` for pods).

use serde_json::{Map, Value};

mod field;

pub(crate) use self::field::{FieldSelector, FieldSet};

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 316
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn parse_set(key: &str, rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unable to parse requirement: found '{rest}', expected: '('"))?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if let Some(bad) = values.iter().find(|v| !valid_value(v)) {
        return Err(format!("invalid label value: {bad:?} for key {key:?}"));
    }
    Ok(values)
}

impl LabelSelector {
    /// Parses the `labelSelector` query value.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!(
                    "unable to parse requirement: empty requirement in {s:?}"
                ));
            }
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().to_string(), parse_set(k, rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelReq::In(k.trim().to_string(), parse_set(k, rest)?)
            } else {
                LabelReq::Exists(part.to_string())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => (k, None),
            };
            if !valid_key(key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key {key:?}"
                ));
            }
            if let Some(v) = value.filter(|v| !valid_value(v)) {
                return Err(format!("invalid label value: {v:?} for key {key:?}"));
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub(crate) fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
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
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn parses_every_operator() {
        let sel = LabelSelector::parse("a=1,b==2,c!=3,d in (x, y),e notin (z),f,!g").unwrap();
        assert_eq!(sel.0.len(), 7);
        assert_eq!(
            sel.0[3],
            LabelReq::In("d".into(), vec!["x".into(), "y".into()])
        );
        assert_eq!(sel.0[6], LabelReq::NotExists("g".into()));
    }

    #[test]
    fn matches_like_the_real_server() {
        let l = labels(json!({"app": "web", "tier": "front"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&l));
        assert!(m("app=web"));
        assert!(m("app in (db,web)"));
        assert!(!m("app notin (web)"));
        assert!(m("missing notin (x)"));
        assert!(m("missing!=x"));
        assert!(m("tier"));
        assert!(!m("!tier"));
        assert!(!m("app=web,tier=back"));
        assert!(LabelSelector::parse("").unwrap().matches(None));
    }

    #[test]
    fn rejects_malformed_selectors() {
        assert!(LabelSelector::parse("a in x").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
    }
}
