//! Secret references from a class's parameters, with their templates, and reading a
//! secret's data for a CSI call (upstream's `getSecretReference`, `resolveTemplate`,
//! `getCredentials`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, SecretReference};
use kube_client::{Api, Client};

use crate::error::CsiError;

/// The prefix of the parameters the sidecar reads and the driver never sees.
pub(crate) const PREFIX: &str = "csi.storage.k8s.io/";

/// The class parameters of one kind of secret: its current keys and, for the four kinds
/// that had them, the deprecated `csi...SecretName` keys (passed on to the driver).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SecretParams {
    /// The infix in messages and keys: `provisioner`, `node-stage`, ...
    pub(crate) which: &'static str,
    /// `csi.storage.k8s.io/<which>-secret-name`.
    pub(crate) name_key: &'static str,
    /// `csi.storage.k8s.io/<which>-secret-namespace`.
    pub(crate) namespace_key: &'static str,
    /// The deprecated name key, if any.
    pub(crate) deprecated_name_key: Option<&'static str>,
    /// The deprecated namespace key, if any.
    pub(crate) deprecated_namespace_key: Option<&'static str>,
}

macro_rules! params {
    ($which:literal $(, $old_name:literal, $old_namespace:literal)?) => {
        SecretParams {
            which: $which,
            name_key: concat!("csi.storage.k8s.io/", $which, "-secret-name"),
            namespace_key: concat!("csi.storage.k8s.io/", $which, "-secret-namespace"),
            deprecated_name_key: params!(@opt $($old_name)?),
            deprecated_namespace_key: params!(@opt $($old_namespace)?),
        }
    };
    (@opt $key:literal) => { Some($key) };
    (@opt) => { None };
}

/// `csi.storage.k8s.io/secret-name`/`-namespace`: used for every kind not set itself.
pub(crate) const DEFAULT: SecretParams = SecretParams {
    which: "default",
    name_key: "csi.storage.k8s.io/secret-name",
    namespace_key: "csi.storage.k8s.io/secret-namespace",
    deprecated_name_key: None,
    deprecated_namespace_key: None,
};
/// The secrets of CreateVolume and DeleteVolume.
pub(crate) const PROVISIONER: SecretParams = params!(
    "provisioner",
    "csiProvisionerSecretName",
    "csiProvisionerSecretNamespace"
);
/// `spec.csi.controllerPublishSecretRef`.
pub(crate) const CONTROLLER_PUBLISH: SecretParams = params!(
    "controller-publish",
    "csiControllerPublishSecretName",
    "csiControllerPublishSecretNamespace"
);
/// `spec.csi.nodeStageSecretRef`.
pub(crate) const NODE_STAGE: SecretParams = params!(
    "node-stage",
    "csiNodeStageSecretName",
    "csiNodeStageSecretNamespace"
);
/// `spec.csi.nodePublishSecretRef`.
pub(crate) const NODE_PUBLISH: SecretParams = params!(
    "node-publish",
    "csiNodePublishSecretName",
    "csiNodePublishSecretNamespace"
);
/// `spec.csi.controllerExpandSecretRef`.
pub(crate) const CONTROLLER_EXPAND: SecretParams = params!("controller-expand");
/// `spec.csi.nodeExpandSecretRef`.
pub(crate) const NODE_EXPAND: SecretParams = params!("node-expand");
/// The external-resizer's ControllerModifyVolume secrets (PV annotations).
pub(crate) const CONTROLLER_MODIFY: SecretParams = params!("controller-modify");

/// Every `csi.storage.k8s.io/` key the sidecar knows (the others are an error).
pub(crate) fn known_prefixed_key(key: &str) -> bool {
    key == "csi.storage.k8s.io/fstype"
        || [
            DEFAULT,
            PROVISIONER,
            CONTROLLER_PUBLISH,
            NODE_STAGE,
            NODE_PUBLISH,
            CONTROLLER_EXPAND,
            NODE_EXPAND,
            CONTROLLER_MODIFY,
        ]
        .iter()
        .any(|p| key == p.name_key || key == p.namespace_key)
}

/// The name and namespace templates of `secret` in `parameters`, both or neither.
fn templates(
    secret: SecretParams,
    class: &str,
    parameters: &BTreeMap<String, String>,
) -> Result<Option<(String, String)>, CsiError> {
    let error = |reason: String| CsiError::SecretReference {
        class: class.to_owned(),
        which: secret.which,
        reason,
    };
    let pick = |keys: [Option<&'static str>; 2]| {
        let found: Vec<&String> = keys
            .into_iter()
            .flatten()
            .filter_map(|k| parameters.get(k))
            .collect();
        (found.len(), found.last().map(|v| (*v).clone()))
    };
    let (names, name) = pick([secret.deprecated_name_key, Some(secret.name_key)]);
    let (namespaces, namespace) =
        pick([secret.deprecated_namespace_key, Some(secret.namespace_key)]);
    if names > 1 || namespaces > 1 {
        return Err(error(format!(
            "specified in parameters with both the deprecated \"csi\" keys and the \"{PREFIX}\" keys"
        )));
    }
    if names != namespaces {
        return Err(error(format!(
            "only one of {} and {} is specified; both must be",
            secret.name_key, secret.namespace_key
        )));
    }
    match (name, namespace) {
        (Some(name), Some(namespace)) if name.is_empty() || namespace.is_empty() => Err(error(
            "specified in parameters, but the name or the namespace is empty".into(),
        )),
        (Some(name), Some(namespace)) => Ok(Some((name, namespace))),
        _ => Ok(None),
    }
}

/// The secret reference of `secret` for a claim, from `parameters` of `class` (falling
/// back on the default `csi.storage.k8s.io/secret-name`/`-namespace`), templates
/// resolved; `None` when the class names no such secret.
///
/// The namespace template may use `${pv.name}` and `${pvc.namespace}`; the name template
/// also `${pvc.name}` and `${pvc.annotations['KEY']}` (the claim's user controls those,
/// so they never choose the namespace). Without a claim (a deletion after the claim is
/// gone) only what `claim` gives is known.
pub(crate) fn secret_reference(
    secret: SecretParams,
    class: &str,
    parameters: &BTreeMap<String, String>,
    pv_name: &str,
    claim: Option<&PersistentVolumeClaim>,
) -> Result<Option<SecretReference>, CsiError> {
    let found = match templates(secret, class, parameters)? {
        Some(found) => Some(found),
        None => templates(DEFAULT, class, parameters).map_err(|e| match e {
            CsiError::SecretReference { class, reason, .. } => CsiError::SecretReference {
                class,
                which: secret.which,
                reason: format!("the default secret: {reason}"),
            },
            other => other,
        })?,
    };
    let Some((name_template, namespace_template)) = found else {
        return Ok(None);
    };
    let error = |reason: String| CsiError::SecretReference {
        class: class.to_owned(),
        which: secret.which,
        reason,
    };
    let claim_namespace = claim.and_then(|c| c.metadata.namespace.clone());
    let mut namespace_params: HashMap<String, String> =
        HashMap::from([("pv.name".to_owned(), pv_name.to_owned())]);
    if let Some(namespace) = &claim_namespace {
        namespace_params.insert("pvc.namespace".into(), namespace.clone());
    }
    let namespace = resolve_template(&namespace_template, &namespace_params)
        .map_err(|e| error(format!("resolving {namespace_template:?}: {e}")))?;
    if !is_dns1123_label(&namespace) {
        return Err(error(if namespace == namespace_template {
            format!("{namespace_template:?} is not a valid namespace name")
        } else {
            format!(
                "{namespace_template:?} resolved to {namespace:?}, which is not a valid namespace name"
            )
        }));
    }
    let mut name_params = namespace_params;
    if let Some(claim) = claim {
        name_params.insert(
            "pvc.name".into(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        for (key, value) in claim.metadata.annotations.iter().flatten() {
            name_params.insert(format!("pvc.annotations['{key}']"), value.clone());
        }
    }
    let name = resolve_template(&name_template, &name_params)
        .map_err(|e| error(format!("resolving {name_template:?}: {e}")))?;
    if !is_dns1123_subdomain(&name) {
        return Err(error(if name == name_template {
            format!("{name_template:?} is not a valid secret name")
        } else {
            format!("{name_template:?} resolved to {name:?}, which is not a valid secret name")
        }));
    }
    Ok(Some(SecretReference {
        name: Some(name),
        namespace: Some(namespace),
    }))
}

/// Expands `$name` and `${name}` from `params` as Go's `os.Expand` does; names not in
/// `params` are an error listing them.
pub(crate) fn resolve_template(
    template: &str,
    params: &HashMap<String, String>,
) -> Result<String, String> {
    let mut missing = BTreeSet::new();
    let resolved = expand(template, |name| match params.get(name) {
        Some(value) => value.clone(),
        None => {
            missing.insert(name.to_owned());
            String::new()
        }
    });
    if missing.is_empty() {
        Ok(resolved)
    } else {
        let tokens: Vec<String> = missing.iter().map(|m| format!("{m:?}")).collect();
        Err(format!("invalid tokens: [{}]", tokens.join(" ")))
    }
}

/// Go's `os.Expand`.
fn expand(s: &str, mut mapping: impl FnMut(&str) -> String) -> String {
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut start = 0;
    let mut j = 0;
    while j < bytes.len() {
        if bytes[j] == b'$' && j + 1 < bytes.len() {
            out.push_str(&s[start..j]);
            let (name, width) = shell_name(&s[j + 1..]);
            match name {
                None if width > 0 => {} // invalid syntax: eaten
                None => out.push('$'),
                Some(name) => out.push_str(&mapping(name)),
            }
            j += width;
            start = j + 1;
        }
        j += 1;
    }
    out.push_str(&s[start.min(s.len())..]);
    out
}

fn is_special(c: u8) -> bool {
    matches!(
        c,
        b'*' | b'#' | b'$' | b'@' | b'!' | b'?' | b'-' | b'0'..=b'9'
    )
}

/// Go's `getShellName`: the name after a `$` and how many bytes it takes; `None` with a
/// width for bad syntax, `None` with 0 for a `$` followed by no name.
fn shell_name(s: &str) -> (Option<&str>, usize) {
    let b = s.as_bytes();
    if b[0] == b'{' {
        if b.len() > 2 && is_special(b[1]) && b[2] == b'}' {
            return (Some(&s[1..2]), 3);
        }
        for i in 1..b.len() {
            if b[i] == b'}' {
                if i == 1 {
                    return (None, 2);
                }
                return (Some(&s[1..i]), i + 1);
            }
        }
        return (None, 1);
    }
    if is_special(b[0]) {
        return (Some(&s[0..1]), 1);
    }
    let end = b
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
        .unwrap_or(b.len());
    if end == 0 {
        (None, 0)
    } else {
        (Some(&s[..end]), end)
    }
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Reads the secret `reference` names: its data as strings (a CSI call's secrets).
pub(crate) async fn credentials(
    client: &Client,
    reference: &SecretReference,
) -> Result<HashMap<String, String>, CsiError> {
    let namespace = reference.namespace.clone().unwrap_or_default();
    let name = reference.name.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets
        .get(&name)
        .await
        .map_err(|source| CsiError::SecretRead {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| match String::from_utf8(value.0) {
            Ok(text) => Ok((key, text)),
            Err(_) => Err(CsiError::SecretNotText {
                namespace: namespace.clone(),
                name: name.clone(),
                key,
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn claim() -> PersistentVolumeClaim {
        let mut claim = PersistentVolumeClaim::default();
        claim.metadata.name = Some("data".into());
        claim.metadata.namespace = Some("apps".into());
        claim.metadata.annotations = Some(BTreeMap::from([(
            "example.com/secret".to_owned(),
            "from-annotation".to_owned(),
        )]));
        claim
    }

    fn reference(name: &str, namespace: &str) -> Option<SecretReference> {
        Some(SecretReference {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
        })
    }

    fn resolve(
        pairs: &[(&str, &str)],
        secret: SecretParams,
    ) -> Result<Option<SecretReference>, String> {
        secret_reference(secret, "fast", &params(pairs), "pvc-1", Some(&claim()))
            .map_err(|e| e.to_string())
    }

    const NAME: &str = "csi.storage.k8s.io/provisioner-secret-name";
    const NAMESPACE: &str = "csi.storage.k8s.io/provisioner-secret-namespace";

    #[test]
    fn every_template_resolves_where_upstream_allows_it() {
        let cases: &[(&str, &str, Option<SecretReference>)] = &[
            ("plain", "ns", reference("plain", "ns")),
            ("${pvc.name}", "ns", reference("data", "ns")),
            ("${pvc.namespace}-x", "ns", reference("apps-x", "ns")),
            ("${pv.name}", "ns", reference("pvc-1", "ns")),
            (
                "${pvc.annotations['example.com/secret']}",
                "ns",
                reference("from-annotation", "ns"),
            ),
            ("s", "${pvc.namespace}", reference("s", "apps")),
            ("s", "${pv.name}", reference("s", "pvc-1")),
            ("s", "$pv", None), // `$pv` is the token "pv": unknown
        ];
        for (name, namespace, expected) in cases {
            let got = resolve(&[(NAME, name), (NAMESPACE, namespace)], PROVISIONER);
            match expected {
                Some(_) => assert_eq!(got.as_ref(), Ok(expected), "{name} / {namespace}"),
                None => assert!(got.is_err(), "{name} / {namespace}: {got:?}"),
            }
        }
    }

    #[test]
    fn the_claims_name_and_annotations_never_choose_the_namespace() {
        for namespace in ["${pvc.name}", "${pvc.annotations['example.com/secret']}"] {
            let err = resolve(&[(NAME, "s"), (NAMESPACE, namespace)], PROVISIONER).unwrap_err();
            assert!(err.contains("invalid tokens"), "{err}");
            assert!(err.contains("storage class \"fast\""), "{err}");
            assert!(err.contains("provisioner secret"), "{err}");
        }
    }

    #[test]
    fn a_missing_annotation_is_an_invalid_token() {
        let err = resolve(
            &[(NAME, "${pvc.annotations['nope']}"), (NAMESPACE, "ns")],
            PROVISIONER,
        )
        .unwrap_err();
        assert!(
            err.contains(r#"invalid tokens: ["pvc.annotations['nope']"]"#),
            "{err}"
        );
    }

    #[test]
    fn names_are_validated_after_resolving() {
        let err = resolve(&[(NAME, "Bad_Name"), (NAMESPACE, "ns")], PROVISIONER).unwrap_err();
        assert!(
            err.contains("\"Bad_Name\" is not a valid secret name"),
            "{err}"
        );
        let err = resolve(&[(NAME, "s"), (NAMESPACE, "a.b")], PROVISIONER).unwrap_err();
        assert!(err.contains("not a valid namespace name"), "{err}");
        let mut odd = claim();
        odd.metadata.name = Some("UPPER".into());
        let err = secret_reference(
            PROVISIONER,
            "fast",
            &params(&[(NAME, "${pvc.name}"), (NAMESPACE, "ns")]),
            "pvc-1",
            Some(&odd),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("resolved to \"UPPER\""), "{err}");
        // A subdomain may have dots.
        assert_eq!(
            resolve(&[(NAME, "a.b-c"), (NAMESPACE, "ns")], PROVISIONER),
            Ok(reference("a.b-c", "ns"))
        );
    }

    #[test]
    fn name_and_namespace_come_together() {
        let err = resolve(&[(NAME, "s")], PROVISIONER).unwrap_err();
        assert!(err.contains("both must be"), "{err}");
        let err = resolve(&[(NAME, ""), (NAMESPACE, "ns")], PROVISIONER).unwrap_err();
        assert!(err.contains("empty"), "{err}");
        let err = resolve(
            &[
                (NAME, "s"),
                (NAMESPACE, "ns"),
                ("csiProvisionerSecretName", "t"),
                ("csiProvisionerSecretNamespace", "ns"),
            ],
            PROVISIONER,
        )
        .unwrap_err();
        assert!(err.contains("deprecated"), "{err}");
    }

    #[test]
    fn deprecated_keys_and_the_default_secret_are_read() {
        assert_eq!(
            resolve(
                &[
                    ("csiNodeStageSecretName", "old"),
                    ("csiNodeStageSecretNamespace", "ns")
                ],
                NODE_STAGE
            ),
            Ok(reference("old", "ns"))
        );
        let default = [
            ("csi.storage.k8s.io/secret-name", "all"),
            ("csi.storage.k8s.io/secret-namespace", "ns"),
        ];
        for secret in [
            PROVISIONER,
            CONTROLLER_PUBLISH,
            NODE_STAGE,
            NODE_PUBLISH,
            CONTROLLER_EXPAND,
            NODE_EXPAND,
            CONTROLLER_MODIFY,
        ] {
            assert_eq!(resolve(&default, secret), Ok(reference("all", "ns")));
        }
        // Its own keys win over the default.
        let mut own = default.to_vec();
        own.extend([(NAME, "own"), (NAMESPACE, "ns2")]);
        assert_eq!(resolve(&own, PROVISIONER), Ok(reference("own", "ns2")));
        assert_eq!(resolve(&[], PROVISIONER), Ok(None));
    }

    #[test]
    fn without_a_claim_only_the_pv_name_is_known() {
        let got = secret_reference(
            PROVISIONER,
            "fast",
            &params(&[(NAME, "${pvc.name}"), (NAMESPACE, "ns")]),
            "pvc-1",
            None,
        );
        assert!(got.is_err());
    }

    #[test]
    fn expand_follows_go() {
        let params = HashMap::from([("a".to_owned(), "A".to_owned())]);
        let cases = [
            ("$a", "A"),
            ("${a}", "A"),
            ("x$a-y", "xA-y"),
            ("$", "$"),
            ("a$", "a$"),
            ("$$", ""), // `$$` is the special variable "$": unknown, so an error below
            ("${}", ""),
            ("${a", "a"),
            ("no dollar", "no dollar"),
            ("$.", "$."),
        ];
        for (template, expected) in cases {
            let got = expand(template, |name| {
                params.get(name).cloned().unwrap_or_default()
            });
            assert_eq!(got, expected, "{template}");
        }
        assert!(resolve_template("$$", &params).is_err());
        assert_eq!(resolve_template("${a}", &params).as_deref(), Ok("A"));
    }
}
