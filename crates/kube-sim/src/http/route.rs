//! Request paths and query strings.

use std::collections::HashMap;

/// A path into a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResourcePath {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) namespace: Option<String>,
    pub(crate) plural: String,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

/// What a path addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/version`.
    Version,
    /// `/healthz`, `/readyz`, `/livez` (and their sub-checks).
    Health,
    /// `/metrics`: the request counters.
    Metrics,
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/{group}`.
    Group(String),
    /// `/api/v1` or `/apis/{group}/{version}`.
    Resources { group: String, version: String },
    /// Anything under a group version.
    Resource(ResourcePath),
    /// `/openapi/v3`.
    OpenApiRoot,
    /// `/openapi/v3/api/v1` or `/openapi/v3/apis/{group}/{version}`.
    OpenApi { group: String, version: String },
    /// Not served (including `/openapi/v2` and `/openapi/v3`).
    Unknown,
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Route {
    let core = group.is_empty();
    let (namespace, rest) = match rest {
        // `/api/v1/namespaces/{name}/status` is the namespace's own subresource.
        ["namespaces", _, "status" | "finalize"] if core => (None, rest),
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (plural, None, None),
        [plural, name] => (plural, Some(name.to_string()), None),
        [plural, name, sub] => (plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return Route::Unknown,
    };
    if plural.is_empty() || name.as_deref() == Some("") {
        return Route::Unknown;
    }
    Route::Resource(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        plural: plural.to_string(),
        name,
        subresource,
    })
}

/// Parses a URL path (already percent-decoded per segment).
pub(crate) fn parse(path: &str) -> Route {
    let segs: Vec<String> = path
        .trim_end_matches('/')
        .split('/')
        .skip(1)
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["openapi", "v3"] => Route::OpenApiRoot,
        ["openapi", "v3", "api", version] => Route::OpenApi {
            group: String::new(),
            version: version.to_string(),
        },
        ["openapi", "v3", "apis", group, version] => Route::OpenApi {
            group: group.to_string(),
            version: version.to_string(),
        },
        ["healthz" | "readyz" | "livez", ..] => Route::Health,
        ["metrics"] => Route::Metrics,
        ["api"] => Route::CoreVersions,
        ["api", "v1"] => Route::Resources {
            group: String::new(),
            version: "v1".into(),
        },
        ["api", "v1", rest @ ..] => resource("", "v1", rest),
        ["apis"] => Route::Groups,
        ["apis", group] => Route::Group(group.to_string()),
        ["apis", group, version] => Route::Resources {
            group: group.to_string(),
            version: version.to_string(),
        },
        ["apis", group, version, rest @ ..] => resource(group, version, rest),
        _ => Route::Unknown,
    }
}

/// Decodes `%XX` escapes (and `+` as space when `plus` is set).
fn decode(s: &str, plus: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes a path segment.
pub(crate) fn percent_decode(s: &str) -> String {
    decode(s, false)
}

/// Parses a query string into its (last-wins) parameters.
pub(crate) fn query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k, true), decode(v, true))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn namespaced_and_cluster_paths() {
        let r = res("/api/v1/namespaces/default/persistentvolumeclaims/a/status");
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(
            (
                r.plural.as_str(),
                r.name.as_deref(),
                r.subresource.as_deref()
            ),
            ("persistentvolumeclaims", Some("a"), Some("status"))
        );
        let ns = res("/api/v1/namespaces/default");
        assert_eq!(
            (ns.plural.as_str(), ns.name.as_deref(), ns.namespace),
            ("namespaces", Some("default"), None)
        );
        let nss = res("/api/v1/namespaces/kube-system/status");
        assert_eq!(nss.subresource.as_deref(), Some("status"));
        let sc = res("/apis/storage.k8s.io/v1/storageclasses/fast");
        assert_eq!(
            (sc.group.as_str(), sc.name.as_deref()),
            ("storage.k8s.io", Some("fast"))
        );
        let crs = res("/apis/cns.vmware.com/v1alpha1/namespaces/ns/cnsvolumemetadatas");
        assert_eq!((crs.namespace.as_deref(), crs.name), (Some("ns"), None));
    }

    #[test]
    fn discovery_and_unknown_paths() {
        assert_eq!(parse("/api"), Route::CoreVersions);
        assert_eq!(
            parse("/apis/storage.k8s.io"),
            Route::Group("storage.k8s.io".into())
        );
        assert_eq!(parse("/openapi/v2"), Route::Unknown);
        assert_eq!(parse("/openapi/v3"), Route::OpenApiRoot);
        assert_eq!(
            parse("/openapi/v3/api/v1"),
            Route::OpenApi {
                group: String::new(),
                version: "v1".into()
            }
        );
        assert_eq!(parse("/api/v1/a/b/c/d"), Route::Unknown);
        assert_eq!(parse("/readyz"), Route::Health);
        assert_eq!(parse("/metrics"), Route::Metrics);
    }

    #[test]
    fn query_decoding() {
        let q = query("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&x");
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["x"], "");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
