//! DELETE: finalizers and deletionTimestamp, preconditions, and the cascades a real
//! cluster's controllers would do (a namespace's objects, a CRD's custom resources).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta::{self, meta_str};
use crate::ops::Scope;
use crate::resources::ResKey;
use crate::status::{ApiError, ApiResult};
use crate::store::{State, Stored};

/// The fields of `DeleteOptions` the sim honours.
#[derive(Debug, Default)]
pub(crate) struct DeleteOptions {
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
}

impl DeleteOptions {
    /// Parses a DELETE body (empty means no options).
    ///
    /// # Errors
    /// 400 BadRequest for a malformed body.
    pub(crate) fn parse(body: &[u8]) -> ApiResult<Self> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        if !v.is_object() {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        }
        let pre = |f: &str| v.get("preconditions")?.get(f)?.as_str().map(str::to_string);
        Ok(Self {
            uid: pre("uid"),
            resource_version: pre("resourceVersion"),
        })
    }
}

impl State {
    /// Deletes one object: with finalizers it only gets a deletionTimestamp.
    ///
    /// # Errors
    /// 404 when missing, 409 when a precondition fails.
    pub(crate) fn delete(
        &mut self,
        scope: &Scope<'_>,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Arc<Stored>> {
        let def = scope.def;
        let old = self
            .get(&def.key, scope.ns, name)
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        // As the real server's `rest.BeforeDelete`: a 409 on the kind (not the resource).
        let conflict = |detail: String| ApiError::conflict(&def.group, &def.kind, name, &detail);
        if let Some(uid) = &opts.uid {
            let actual = meta_str(&old.value, "uid").unwrap_or_default();
            if uid != actual {
                return Err(conflict(format!(
                    "the UID in the precondition ({uid}) does not match the UID in record \
                     ({actual}). The object might have been deleted and then recreated"
                )));
            }
        }
        if let Some(rv) = &opts.resource_version {
            let actual = meta_str(&old.value, "resourceVersion").unwrap_or_default();
            if rv != actual {
                return Err(conflict(format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the \
                     ResourceVersion in record ({actual}). The object might have been modified"
                )));
            }
        }
        if scope.dry_run {
            return Ok(old);
        }
        if meta::has_finalizers(&old.value) {
            if meta_str(&old.value, "deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut new = old.value.clone();
            let m = meta::meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(meta::now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if def.tracks_generation() {
                let generation = m.get("generation").and_then(Value::as_i64).unwrap_or(1);
                m.insert("generation".into(), json!(generation + 1));
            }
            let key = def.key.clone();
            return Ok(self.put(&key, scope.ns, name, new));
        }
        let key = def.key.clone();
        Ok(self
            .remove_cascading(&key, scope.ns, name)
            .expect("the object was just read"))
    }

    /// Removes an object and what hangs off it: a namespace's objects, a CRD's custom
    /// resources (and the type itself).
    pub(crate) fn remove_cascading(
        &mut self,
        res: &ResKey,
        ns: &str,
        name: &str,
    ) -> Option<Arc<Stored>> {
        let removed = self.remove(res, ns, name)?;
        if &**res == "/namespaces" {
            self.purge_namespace(name);
        } else if &**res == "apiextensions.k8s.io/customresourcedefinitions" {
            let group = removed.value["spec"]["group"].as_str().unwrap_or_default();
            let plural = removed.value["spec"]["names"]["plural"]
                .as_str()
                .unwrap_or_default();
            let key = format!("{group}/{plural}");
            let names: Vec<(String, String)> = self
                .table(&key)
                .map(|t| t.keys().cloned().collect())
                .unwrap_or_default();
            if let Some(def) = self.registry.get(&key) {
                for (ns, n) in names {
                    self.remove(&def.key, &ns, &n);
                }
            }
            self.registry.remove(&key);
            self.objects.remove(key.as_str());
        }
        Some(removed)
    }

    /// Deletes every object in namespace `ns` (objects with finalizers get a
    /// deletionTimestamp instead).
    fn purge_namespace(&mut self, ns: &str) {
        let keys: Vec<ResKey> = self.objects.keys().cloned().collect();
        for res in keys {
            let names: Vec<String> = self
                .table(&res)
                .map(|t| {
                    t.keys()
                        .filter(|(n, _)| n == ns)
                        .map(|(_, name)| name.clone())
                        .collect()
                })
                .unwrap_or_default();
            for name in names {
                let Some(obj) = self.get(&res, ns, &name) else {
                    continue;
                };
                if meta::has_finalizers(&obj.value) {
                    if meta_str(&obj.value, "deletionTimestamp").is_none() {
                        let mut new = obj.value.clone();
                        meta::meta_mut(&mut new)
                            .insert("deletionTimestamp".into(), json!(meta::now_rfc3339()));
                        self.put(&res, ns, &name, new);
                    }
                } else {
                    self.remove(&res, ns, &name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_preconditions() {
        let opts = DeleteOptions::parse(br#"{"preconditions":{"uid":"u","resourceVersion":"5"}}"#)
            .unwrap();
        assert_eq!(opts.uid.as_deref(), Some("u"));
        assert_eq!(opts.resource_version.as_deref(), Some("5"));
        assert!(DeleteOptions::parse(b"").unwrap().uid.is_none());
        assert_eq!(DeleteOptions::parse(b"{nope").unwrap_err().code, 400);
    }
}
