//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch
//! and server-side apply.

use serde_json::Value;

use crate::resources::ResourceDef;
use crate::status::{ApiError, ApiResult};
use crate::strategic;

/// The patch types the server accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

/// Media types accepted for a type (strategic merge only for built-in types).
pub(crate) fn accepted(def: &ResourceDef) -> Vec<&'static str> {
    let mut types = vec![
        "application/json-patch+json",
        "application/merge-patch+json",
    ];
    if def.builtin {
        types.push("application/strategic-merge-patch+json");
    }
    types.push("application/apply-patch+yaml");
    types
}

/// The patch type of a `Content-Type`, if the type accepts it.
///
/// # Errors
/// 415 UnsupportedMediaType.
pub(crate) fn kind_of(content_type: &str, def: &ResourceDef) -> ApiResult<PatchKind> {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let kind = match media {
        "application/merge-patch+json" => Some(PatchKind::Merge),
        "application/json-patch+json" => Some(PatchKind::Json),
        "application/strategic-merge-patch+json" if def.builtin => Some(PatchKind::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchKind::Apply),
        _ => None,
    };
    kind.ok_or_else(|| ApiError::unsupported_media_type(&accepted(def)))
}

/// Parses a JSON body.
///
/// # Errors
/// 400 BadRequest naming the JSON problem.
pub(crate) fn parse_json(body: &[u8]) -> ApiResult<Value> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// Parses an apply body: YAML (JSON is YAML too).
///
/// # Errors
/// 400 BadRequest when it is neither, or not a mapping.
pub(crate) fn parse_apply(body: &[u8]) -> ApiResult<Value> {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("error decoding YAML: body is not UTF-8"))?;
            serde_saphyr::from_str(text)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
        }
    };
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::bad_request(
            "error decoding YAML: the apply configuration must be an object",
        ))
    }
}

/// The 422 kube-apiserver answers when a JSON patch cannot be applied (e.g. a failed
/// `test`): reason `Invalid`, its generic message, and no causes. The real server drops
/// the patch library's text (`detail`) from the answer; the sim only logs it.
fn rejected(detail: &str) -> ApiError {
    tracing::debug!(detail, "JSON patch rejected");
    ApiError::new(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
    )
}

/// Whether `path` names a missing member of an object that exists: the real server's
/// patch library reads such a member as `null` in a `test` (kube-runtime's finalizer
/// helper relies on it), but fails the test when the parent itself is missing.
fn missing_member(doc: &Value, path: &str) -> bool {
    let Some((parent, _)) = path.rsplit_once('/') else {
        return false;
    };
    doc.pointer(path).is_none() && doc.pointer(parent).is_some_and(Value::is_object)
}

/// Applies RFC 6902 operations all-or-nothing, with the real server's reading of `test`
/// (see [`missing_member`]).
fn apply_json_patch(target: &mut Value, ops: json_patch::Patch) -> ApiResult<()> {
    let mut doc = target.clone();
    for op in ops.0 {
        if let json_patch::PatchOperation::Test(test) = &op
            && test.value.is_null()
            && missing_member(&doc, test.path.as_str())
        {
            continue;
        }
        json_patch::patch(&mut doc, std::slice::from_ref(&op))
            .map_err(|e| rejected(&e.to_string()))?;
    }
    *target = doc;
    Ok(())
}

/// Applies a merge, JSON or strategic patch (not apply) to `target`.
///
/// # Errors
/// 400 for a malformed body, 422 when a JSON patch operation fails.
pub(crate) fn apply(kind: PatchKind, target: &mut Value, body: &[u8]) -> ApiResult<()> {
    match kind {
        PatchKind::Merge => {
            let patch = parse_json(body)?;
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "error decoding patch: a merge patch must be a JSON object",
                ));
            }
            json_patch::merge(target, &patch);
        }
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            apply_json_patch(target, ops)?;
        }
        PatchKind::Strategic => {
            let patch = parse_json(body)?;
            strategic::apply(target, &patch).map_err(ApiError::bad_request)?;
        }
        PatchKind::Apply => {
            let patch = parse_apply(body)?;
            json_patch::merge(target, &patch);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    #[test]
    fn strategic_is_refused_for_custom_resources() {
        let reg = Registry::with_builtins();
        let pvc = reg.lookup("", "v1", "persistentvolumeclaims").unwrap();
        assert_eq!(
            kind_of("application/strategic-merge-patch+json", &pvc).unwrap(),
            PatchKind::Strategic
        );
        let mut custom = (*pvc).clone();
        custom.builtin = false;
        let err = kind_of("application/strategic-merge-patch+json", &custom).unwrap_err();
        assert_eq!(err.code, 415);
        assert_eq!(
            kind_of("text/plain", &pvc).unwrap_err().reason,
            "UnsupportedMediaType"
        );
    }

    #[test]
    fn failed_json_patch_test_is_422() {
        let mut doc = json!({"a": 1});
        let body =
            br#"[{"op":"test","path":"/a","value":2},{"op":"replace","path":"/a","value":3}]"#;
        let err = apply(PatchKind::Json, &mut doc, body).unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
        assert_eq!(
            err.message,
            "the server rejected our request due to an error in our request"
        );
        assert!(
            err.details.causes.is_empty(),
            "the real server gives no causes"
        );
        assert_eq!(doc, json!({"a": 1}));
    }

    #[test]
    fn json_patch_test_of_a_member_of_a_missing_object_fails() {
        let mut doc = json!({"metadata": {}});
        let body = br#"[{"op":"test","path":"/spec/x","value":null}]"#;
        let err = apply(PatchKind::Json, &mut doc, body).unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
        let body = br#"[{"op":"test","path":"/metadata/x","value":null}]"#;
        apply(PatchKind::Json, &mut doc, body).unwrap();
    }

    #[test]
    fn json_patch_test_of_a_missing_path_equals_null() {
        let mut doc = json!({"metadata": {}});
        let body = br#"[{"op":"test","path":"/metadata/finalizers","value":null},
                        {"op":"add","path":"/metadata/finalizers","value":["f"]}]"#;
        apply(PatchKind::Json, &mut doc, body).unwrap();
        assert_eq!(doc, json!({"metadata": {"finalizers": ["f"]}}));
        let again = apply(PatchKind::Json, &mut doc, body).unwrap_err();
        assert_eq!(again.code, 422);
    }

    #[test]
    fn apply_accepts_yaml() {
        let v = parse_apply(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n").unwrap();
        assert_eq!(v["metadata"]["name"], "x");
        assert_eq!(parse_apply(b"- 1").unwrap_err().code, 400);
    }
}
