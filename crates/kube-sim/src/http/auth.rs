//! `authorization.k8s.io/v1` self reviews: every `SelfSubjectAccessReview` is allowed and
//! every `SelfSubjectRulesReview` lists `*`, with or without RBAC (`crate::rbac`, which
//! does not answer reviews).
//! That keeps `kubectl auth can-i` and RBAC-checking tools working.

use serde_json::{Value, json};

use crate::http::route::ResourcePath;
use crate::status::{ApiError, ApiResult};

/// The group served here.
pub(crate) const GROUP: &str = "authorization.k8s.io";

const ACCESS: &str = "selfsubjectaccessreviews";
const RULES: &str = "selfsubjectrulesreviews";

/// Whether `rp` is one of the review resources.
pub(crate) fn serves(rp: &ResourcePath) -> bool {
    rp.group == GROUP
        && rp.version == "v1"
        && rp.namespace.is_none()
        && rp.name.is_none()
        && matches!(rp.plural.as_str(), ACCESS | RULES)
}

/// The discovery entries of the group.
pub(crate) fn resources() -> Vec<Value> {
    [
        (ACCESS, "selfsubjectaccessreview", "SelfSubjectAccessReview"),
        (RULES, "selfsubjectrulesreview", "SelfSubjectRulesReview"),
    ]
    .into_iter()
    .map(|(plural, singular, kind)| {
        json!({"name": plural, "singularName": singular, "namespaced": false,
               "kind": kind, "verbs": ["create"]})
    })
    .collect()
}

/// Answers a POST of a review. The spec is echoed when the body is JSON (kubectl's typed
/// clients send protobuf, which is not decoded: the answer does not depend on it).
///
/// # Errors
/// 405 for another verb.
pub(crate) fn review(post: bool, rp: &ResourcePath, body: &[u8]) -> ApiResult<Value> {
    if !post {
        return Err(ApiError::method_not_allowed());
    }
    let spec = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("spec").cloned())
        .unwrap_or_else(|| json!({}));
    let (kind, status) = if rp.plural == ACCESS {
        (
            "SelfSubjectAccessReview",
            json!({"allowed": true, "reason": "kube-sim has no authorization"}),
        )
    } else {
        (
            "SelfSubjectRulesReview",
            json!({
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                "incomplete": false,
            }),
        )
    };
    Ok(json!({
        "kind": kind,
        "apiVersion": format!("{GROUP}/v1"),
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::route::{self, Route};

    fn path(p: &str) -> ResourcePath {
        match route::parse(p) {
            Route::Resource(rp) => rp,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn access_reviews_are_allowed_and_echo_the_spec() {
        let rp = path("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews");
        assert!(serves(&rp));
        let body = br#"{"spec":{"resourceAttributes":{"verb":"create","resource":"pods"}}}"#;
        let out = review(true, &rp, body).unwrap();
        assert_eq!(out["status"]["allowed"], true);
        assert_eq!(out["spec"]["resourceAttributes"]["verb"], "create");
        assert_eq!(
            review(true, &rp, b"\x6b\x38\x73\x00").unwrap()["spec"],
            json!({})
        );
        assert_eq!(review(false, &rp, b"").unwrap_err().code, 405);
        let rules = path("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews");
        assert_eq!(
            review(true, &rules, b"{}").unwrap()["status"]["resourceRules"][0]["verbs"],
            json!(["*"])
        );
        assert!(!serves(&path(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        )));
    }
}
