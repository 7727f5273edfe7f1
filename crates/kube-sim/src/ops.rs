//! Write verbs on the store: create, update (main and `/status`), patch and apply.
//!
//! Every function runs under the store lock, so a write is atomic and stale
//! resourceVersions are caught exactly.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::crd;
use crate::fields::{self, FieldValidation};
use crate::meta::{self, meta_str};
use crate::patch::{self, PatchKind};
use crate::resources::ResourceDef;
use crate::status::{ApiError, ApiResult, Cause};
use crate::store::{State, Stored};
use crate::validation;

/// Where a write goes: the type, the version in the URL and the namespace.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope<'a> {
    pub(crate) def: &'a Arc<ResourceDef>,
    pub(crate) version: &'a str,
    /// Empty for cluster-scoped types.
    pub(crate) ns: &'a str,
    /// `dryRun=All`: validate and answer, but store nothing.
    pub(crate) dry_run: bool,
    /// What to do with fields a built-in type does not have.
    pub(crate) validation: FieldValidation,
}

/// What carried a write, for the wording of a strict field validation error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteKind {
    /// A create or update body.
    Body,
    /// A merge, JSON or strategic patch.
    Patch,
    /// A server-side apply configuration.
    Apply,
}

/// The result of a write: the object and whether it was created.
pub(crate) type Written = (Arc<Stored>, bool);

/// Checks kind, apiVersion, namespace and name of a body against the URL and fills in what
/// is missing.
fn check_body(scope: &Scope<'_>, path_name: Option<&str>, body: &mut Value) -> ApiResult<()> {
    let def = scope.def;
    if !body.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body of the request for {} must be a JSON object",
            def.kind
        )));
    }
    let expected = def.api_version(scope.version);
    match body.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => body["apiVersion"] = json!(expected),
        Some(given) if given != expected => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({given}) does not match the expected API version ({expected})"
            )));
        }
        Some(_) => {}
    }
    match body.get("kind").and_then(Value::as_str) {
        None | Some("") => body["kind"] = json!(def.kind),
        Some(given) if given != def.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({given}) does not match the expected kind ({})",
                def.kind
            )));
        }
        Some(_) => {}
    }
    let meta = meta::meta_mut(body);
    if def.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            None | Some("") => {
                meta.insert("namespace".into(), json!(scope.ns));
            }
            Some(given) if given != scope.ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            Some(_) => {}
        }
    } else {
        meta.remove("namespace");
    }
    if let Some(path_name) = path_name {
        match meta.get("name").and_then(Value::as_str) {
            None | Some("") => {
                meta.insert("name".into(), json!(path_name));
            }
            Some(given) if given != path_name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({path_name})"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

impl State {
    /// Drops the fields a built-in type does not have, as the real server's decoding does:
    /// `Strict` refuses the write instead, `Warn` queues one warning per field in
    /// `State::warnings`. Custom resources are stored as sent.
    ///
    /// # Errors
    /// 400 BadRequest for unknown fields under `Strict`, worded as the real server words
    /// it for a body, a patch or an apply configuration.
    fn check_fields(
        &mut self,
        scope: &Scope<'_>,
        obj: &mut Value,
        write: WriteKind,
    ) -> ApiResult<()> {
        let def = scope.def;
        let Some(shape) = def.builtin.then(|| fields::shape(&def.key)).flatten() else {
            return Ok(());
        };
        let unknown = fields::prune(shape, obj);
        if unknown.is_empty() {
            return Ok(());
        }
        let messages = unknown.iter().map(|p| format!("unknown field {p:?}"));
        match scope.validation {
            FieldValidation::Ignore => Ok(()),
            FieldValidation::Warn => {
                self.warnings.extend(messages);
                Ok(())
            }
            FieldValidation::Strict => {
                let detail = format!(
                    "strict decoding error: {}",
                    messages.collect::<Vec<_>>().join(", ")
                );
                Err(ApiError::bad_request(match write {
                    WriteKind::Body => format!(
                        "{kind} in version {version:?} cannot be handled as a {kind}: {detail}",
                        kind = def.kind,
                        version = scope.version
                    ),
                    WriteKind::Patch => detail,
                    WriteKind::Apply => {
                        let fields: Vec<String> = unknown
                            .iter()
                            .map(|p| format!(".{p}: field not declared in schema"))
                            .collect();
                        format!(
                            "failed to create typed patch object ({}/{}, Kind={}) {}/{}: {}",
                            def.group,
                            scope.version,
                            def.kind,
                            scope.ns,
                            meta_str(obj, "name").unwrap_or_default(),
                            fields.join(", ")
                        )
                    }
                }))
            }
        }
    }

    fn namespace_exists(&self, scope: &Scope<'_>) -> ApiResult<()> {
        if scope.def.namespaced && self.get("/namespaces", "", scope.ns).is_none() {
            return Err(ApiError::not_found("", "namespaces", scope.ns));
        }
        Ok(())
    }

    fn store(&mut self, scope: &Scope<'_>, name: &str, value: Value) -> Arc<Stored> {
        if scope.dry_run {
            return Stored::new(value);
        }
        let def = scope.def;
        if def.builtin && def.plural == "customresourcedefinitions" {
            self.registry.insert(crd::resource_def(&value));
        }
        let key = def.key.clone();
        self.put(&key, scope.ns, name, value)
    }

    /// POST: creates an object.
    ///
    /// # Errors
    /// 400 for a body that does not match the URL, 404 for a missing namespace, 409 when the
    /// name is taken, 422 when invalid.
    pub(crate) fn create(&mut self, scope: &Scope<'_>, mut body: Value) -> ApiResult<Arc<Stored>> {
        check_body(scope, None, &mut body)?;
        self.check_fields(scope, &mut body, WriteKind::Body)?;
        self.namespace_exists(scope)?;
        let def = scope.def;
        let name = meta_str(&body, "name").unwrap_or_default().to_string();
        let name = match meta_str(&body, "generateName") {
            Some(prefix) if name.is_empty() && !prefix.is_empty() => {
                let mut candidate = format!("{prefix}{}", meta::name_suffix());
                while self.get(&def.key, scope.ns, &candidate).is_some() {
                    candidate = format!("{prefix}{}", meta::name_suffix());
                }
                meta::meta_mut(&mut body).insert("name".into(), json!(candidate));
                candidate
            }
            _ => name,
        };
        meta::apply_create_defaults(def, &mut body);
        if def.builtin
            && def.plural == "customresourcedefinitions"
            && crd::validate(&body).is_empty()
        {
            crd::establish(&mut body);
        }
        validation::validate(def, &body)?;
        if self.get(&def.key, scope.ns, &name).is_some() {
            return Err(ApiError::already_exists(&def.group, &def.plural, &name));
        }
        meta::init_meta(def, &mut body);
        if self.protection_finalizers {
            meta::add_protection_finalizer(def, &mut body);
        }
        Ok(self.store(scope, &name, body))
    }

    fn existing(&self, scope: &Scope<'_>, name: &str) -> ApiResult<Arc<Stored>> {
        let def = scope.def;
        self.get(&def.key, scope.ns, name)
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
    }

    /// Finishes an update of `old` to `new`: server-owned metadata, validation, the
    /// finalizer check, and the no-op shortcut.
    fn commit_update(
        &mut self,
        scope: &Scope<'_>,
        old: &Arc<Stored>,
        mut new: Value,
        first: Vec<Cause>,
    ) -> ApiResult<Arc<Stored>> {
        let def = scope.def;
        let name = meta_str(&old.value, "name").unwrap_or_default().to_string();
        meta::carry_meta(def, &old.value, &mut new);
        if def.builtin
            && def.plural == "customresourcedefinitions"
            && crd::validate(&new).is_empty()
        {
            let status = old.value.get("status").cloned();
            crd::establish(&mut new);
            if let Some(status) =
                status.filter(|_| new["spec"]["names"] == old.value["spec"]["names"])
            {
                new["status"] = status;
            }
        }
        validation::validate_update_all(def, &old.value, &new, first)?;
        new["metadata"]["resourceVersion"] = old.value["metadata"]["resourceVersion"].clone();
        if new == old.value {
            return Ok(old.clone());
        }
        let deleting = meta_str(&new, "deletionTimestamp").is_some();
        let stored = self.store(scope, &name, new);
        if deleting && !meta::has_finalizers(&stored.value) && !scope.dry_run {
            let key = def.key.clone();
            return Ok(self
                .remove_cascading(&key, scope.ns, &name)
                .unwrap_or(stored));
        }
        Ok(stored)
    }

    /// A uid in the body of a PUT is a precondition, as on the real server (a patch that
    /// changes the uid is invalid instead: [`validation::meta_update_causes`]).
    fn check_uid(def: &ResourceDef, old: &Stored, new: &Value, name: &str) -> ApiResult<()> {
        let actual = meta_str(&old.value, "uid").unwrap_or_default();
        match meta_str(new, "uid") {
            Some(uid) if !uid.is_empty() && uid != actual => Err(ApiError::conflict(
                &def.group,
                &def.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                ),
            )),
            _ => Ok(()),
        }
    }

    fn check_rv(def: &ResourceDef, old: &Stored, given: Option<&str>, name: &str) -> ApiResult<()> {
        match given {
            None | Some("") => Ok(()),
            Some(rv) if Some(rv) == meta_str(&old.value, "resourceVersion") => Ok(()),
            Some(_) => Err(ApiError::stale(&def.group, &def.plural, name)),
        }
    }

    /// PUT: replaces an object (or only its status when `status_only`).
    ///
    /// # Errors
    /// 400 for a body that does not match the URL, 404 when missing, 409 on a stale
    /// resourceVersion, 422 when invalid.
    pub(crate) fn update(
        &mut self,
        scope: &Scope<'_>,
        name: &str,
        mut body: Value,
        status_only: bool,
    ) -> ApiResult<Written> {
        check_body(scope, Some(name), &mut body)?;
        self.check_fields(scope, &mut body, WriteKind::Body)?;
        let def = scope.def;
        let Some(old) = self.get(&def.key, scope.ns, name) else {
            if def.create_on_update() && !status_only {
                return Ok((self.create(scope, body)?, true));
            }
            return Err(ApiError::not_found(&def.group, &def.plural, name));
        };
        let given = meta_str(&body, "resourceVersion").map(str::to_string);
        if given.as_deref().is_none_or(str::is_empty) && !def.builtin {
            let cause = Cause::invalid(
                "metadata.resourceVersion",
                &json!(0),
                "must be specified for an update",
            );
            return Err(ApiError::invalid(&def.group, &def.kind, name, vec![cause]));
        }
        Self::check_rv(def, &old, given.as_deref(), name)?;
        Self::check_uid(def, &old, &body, name)?;
        let first = validation::meta_update_causes(&old.value, &body);
        let new = self.merge_part(scope, &old, body, status_only);
        Ok((self.commit_update(scope, &old, new, first)?, false))
    }

    /// PATCH: merge, JSON or strategic patch, or server-side apply (which creates a missing
    /// object).
    ///
    /// # Errors
    /// 400 for a malformed patch, 404 when missing, 409 when the patch carries a stale
    /// resourceVersion, 422 when the result is invalid or a JSON patch op fails. A
    /// `metadata.uid` other than the object's is no precondition in a patch: the real
    /// server answers 422 (`metadata.uid: Invalid value: "...": field is immutable`), for
    /// merge and strategic-merge patches alike.
    pub(crate) fn patch(
        &mut self,
        scope: &Scope<'_>,
        name: &str,
        kind: PatchKind,
        body: &[u8],
        status_only: bool,
        field_manager: Option<&str>,
    ) -> ApiResult<Written> {
        let def = scope.def;
        if kind == PatchKind::Apply {
            return self.apply(scope, name, body, status_only, field_manager);
        }
        let old = self.existing(scope, name)?;
        let mut patched = old.value.clone();
        patch::apply(kind, &mut patched, body)?;
        if !patched.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        let given = meta_str(&patched, "resourceVersion").map(str::to_string);
        Self::check_rv(def, &old, given.as_deref(), name)?;
        check_body(scope, Some(name), &mut patched)?;
        self.check_fields(scope, &mut patched, WriteKind::Patch)?;
        let first = validation::meta_update_causes(&old.value, &patched);
        let new = self.merge_part(scope, &old, patched, status_only);
        Ok((self.commit_update(scope, &old, new, first)?, false))
    }

    /// Keeps only the part a write may change: status for `/status`, everything but status
    /// for the main resource of a type with a status subresource.
    fn merge_part(
        &self,
        scope: &Scope<'_>,
        old: &Stored,
        mut patched: Value,
        status_only: bool,
    ) -> Value {
        if status_only {
            let mut new = old.value.clone();
            match patched.get("status") {
                Some(status) => new["status"] = status.clone(),
                None => {
                    new.as_object_mut().map(|m| m.remove("status"));
                }
            }
            new
        } else {
            if scope.def.any_status() {
                match old.value.get("status") {
                    Some(status) => patched["status"] = status.clone(),
                    None => {
                        patched.as_object_mut().map(|m| m.remove("status"));
                    }
                }
            }
            patched
        }
    }

    fn apply(
        &mut self,
        scope: &Scope<'_>,
        name: &str,
        body: &[u8],
        status_only: bool,
        field_manager: Option<&str>,
    ) -> ApiResult<Written> {
        let def = scope.def;
        let manager = field_manager.filter(|m| !m.is_empty()).ok_or_else(|| {
            ApiError::bad_request(
                "PATCH requests with apply content type must have fieldManager query param",
            )
        })?;
        let mut applied = patch::parse_apply(body)?;
        for field in ["apiVersion", "kind"] {
            if applied
                .get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err(ApiError::bad_request(format!(
                    "invalid object type: {field} must be set"
                )));
            }
        }
        check_body(scope, Some(name), &mut applied)?;
        self.check_fields(scope, &mut applied, WriteKind::Apply)?;
        let entry = json!({
            "manager": manager,
            "operation": "Apply",
            "apiVersion": def.api_version(scope.version),
            "time": meta::now_rfc3339(),
            "fieldsType": "FieldsV1",
            "fieldsV1": {},
        });
        let Some(old) = self.get(&def.key, scope.ns, name) else {
            if status_only {
                return Err(ApiError::not_found(&def.group, &def.plural, name));
            }
            meta::meta_mut(&mut applied).insert("managedFields".into(), json!([entry]));
            return Ok((self.create(scope, applied)?, true));
        };
        let given = meta_str(&applied, "resourceVersion").map(str::to_string);
        Self::check_rv(def, &old, given.as_deref(), name)?;
        let mut merged = old.value.clone();
        json_patch::merge(&mut merged, &applied);
        let first = validation::meta_update_causes(&old.value, &merged);
        let mut new = self.merge_part(scope, &old, merged, status_only);
        let mut fields: Vec<Value> = old.value["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| !(e["manager"] == manager && e["operation"] == "Apply"))
            .collect();
        fields.push(entry);
        // Only record the apply when something else changed, so a repeated apply is a no-op.
        let mut probe = new.clone();
        meta::carry_meta(def, &old.value, &mut probe);
        probe["metadata"]["resourceVersion"] = old.value["metadata"]["resourceVersion"].clone();
        let unchanged = probe == old.value
            && old.value["metadata"]["managedFields"]
                .as_array()
                .is_some_and(|f| {
                    f.iter()
                        .any(|e| e["manager"] == manager && e["operation"] == "Apply")
                });
        if unchanged {
            return Ok((old, false));
        }
        meta::meta_mut(&mut new).insert("managedFields".into(), Value::Array(fields));
        Ok((self.commit_update(scope, &old, new, first)?, false))
    }
}
