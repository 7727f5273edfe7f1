//! Kubernetes `Status` error responses (`metav1.Status`) with the real codes and reasons.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

/// One entry of `details.causes` of an `Invalid` status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub(crate) reason: &'static str,
    /// Field path, e.g. `metadata.name`.
    pub(crate) field: String,
    /// Human readable message without the field path.
    pub(crate) message: String,
}

impl Cause {
    /// `field: Invalid value: "value": detail`.
    pub(crate) fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        let message = if detail.is_empty() {
            format!("Invalid value: {shown}")
        } else {
            format!("Invalid value: {shown}: {detail}")
        };
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message,
        }
    }

    /// `field: Required value[: detail]`.
    pub(crate) fn required(field: impl Into<String>, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message,
        }
    }

    /// `field: Forbidden: detail`.
    pub(crate) fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    /// `field: Unsupported value: "value": supported values: "a", "b"`.
    pub(crate) fn not_supported(
        field: impl Into<String>,
        value: &Value,
        supported: &[&str],
    ) -> Self {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {shown}: supported values: {}",
                list.join(", ")
            ),
        }
    }
}

/// `details` of a `Status`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Details {
    pub(crate) name: Option<String>,
    pub(crate) group: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) causes: Vec<Cause>,
    /// `details.retryAfterSeconds`, also sent as the `Retry-After` header.
    pub(crate) retry_after_seconds: Option<u64>,
}

/// An API error, rendered as a `Status` object.
#[derive(Clone, Debug)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: String,
    pub(crate) message: String,
    pub(crate) details: Box<Details>,
}

/// The group-qualified resource as the real server prints it: `persistentvolumeclaims` or
/// `storageclasses.storage.k8s.io`.
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    /// An error with code, reason and message and no details.
    pub(crate) fn new(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: Box::default(),
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details.group = (!group.is_empty()).then(|| group.to_string());
        self.details.kind = Some(kind.to_string());
        self.details.name = (!name.is_empty()).then(|| name.to_string());
        self
    }

    /// 404 `persistentvolumeclaims "x" not found`.
    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// 404 for a path the server does not serve.
    pub(crate) fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 `persistentvolumeclaims "x" already exists`.
    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// 409 Conflict, `Operation cannot be fulfilled on ...: detail`.
    pub(crate) fn conflict(group: &str, plural: &str, name: &str, detail: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {detail}",
                qualified(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    /// 409 Conflict for a stale resourceVersion.
    pub(crate) fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid: `Kind "name" is invalid: field: message` (several causes in brackets).
    pub(crate) fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let parts: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("[{}]", parts.join(", "))
        };
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{kind} {name:?} is invalid: {joined}"),
        )
        .with_details(group, kind, name);
        err.details.name = Some(name.to_string());
        err.details.causes = causes;
        err
    }

    /// 400 BadRequest.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 MethodNotAllowed.
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 415 UnsupportedMediaType.
    pub(crate) fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 410 Expired, as sent for a too old watch resourceVersion.
    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The `Status` JSON object.
    pub(crate) fn to_json(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        let d = &self.details;
        if let Some(name) = &d.name {
            details.insert("name".into(), json!(name));
        }
        if let Some(group) = &d.group {
            details.insert("group".into(), json!(group));
        }
        if let Some(kind) = &d.kind {
            details.insert("kind".into(), json!(kind));
        }
        if !d.causes.is_empty() {
            let causes: Vec<Value> = d
                .causes
                .iter()
                .map(|c| {
                    let mut cause = json!({"reason": c.reason, "message": c.message});
                    if !c.field.is_empty() {
                        cause["field"] = json!(c.field);
                    }
                    cause
                })
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(seconds) = d.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(seconds));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.to_json()).unwrap_or_default();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = self.details.retry_after_seconds {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        resp
    }
}

/// Result alias for request handling.
pub(crate) type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_names_the_group_qualified_resource() {
        let err = ApiError::not_found("storage.k8s.io", "storageclasses", "fast");
        let v = err.to_json();
        assert_eq!(
            v["message"],
            "storageclasses.storage.k8s.io \"fast\" not found"
        );
        assert_eq!(v["details"]["group"], "storage.k8s.io");
        assert_eq!(v["code"], 404);
    }

    #[test]
    fn invalid_with_two_causes_uses_brackets() {
        let err = ApiError::invalid(
            "",
            "PersistentVolumeClaim",
            "a",
            vec![
                Cause::required("spec.accessModes", ""),
                Cause::required("spec.resources[storage]", ""),
            ],
        );
        assert_eq!(
            err.message,
            "PersistentVolumeClaim \"a\" is invalid: [spec.accessModes: Required value, \
             spec.resources[storage]: Required value]"
        );
        assert_eq!(
            err.to_json()["details"]["causes"][0]["reason"],
            "FieldValueRequired"
        );
    }
}
