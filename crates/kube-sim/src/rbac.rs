//! Opt-in RBAC ([`Builder::rbac`](crate::Builder::rbac)): requests that carry a bearer
//! token minted by [`KubeSim::service_account_config`](crate::KubeSim::service_account_config)
//! act as that ServiceAccount and are checked against the stored Roles, ClusterRoles and
//! their bindings, as kube-apiserver's RBAC authorizer checks them; requests without a
//! token (the sim's own client, the PV binder) stay unrestricted.
//!
//! What is evaluated: `verbs`, `apiGroups`, `resources` (`res`, `res/sub`, `*`, `*/sub`)
//! and `resourceNames` of each rule; RoleBindings (to a Role or a ClusterRole) in the
//! request's namespace and ClusterRoleBindings; subjects of kind ServiceAccount, User
//! (`system:serviceaccount:<ns>:<name>`) and Group (`system:serviceaccounts`,
//! `system:serviceaccounts:<ns>`, `system:authenticated`). As on a real server a `create`
//! has no name to match `resourceNames`, and a list or watch has the name of its
//! `metadata.name=` field selector. Not evaluated: aggregated ClusterRoles and
//! non-resource URLs (discovery, `/version`, the self reviews are open to every user, as
//! the default `system:discovery` and `system:basic-user` roles make them).

use std::collections::HashMap;

use serde_json::Value;

use crate::resources::res_key;
use crate::status::{ApiError, qualified};
use crate::store::State;

/// The tokens minted so far: token → user name.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    users: HashMap<String, String>,
}

impl Tokens {
    /// The token of `user`, minted on first use.
    pub(crate) fn mint(&mut self, user: &str) -> String {
        if let Some((token, _)) = self.users.iter().find(|(_, u)| *u == user) {
            return token.clone();
        }
        let token = format!("kube-sim-token-{}", self.users.len() + 1);
        self.users.insert(token.clone(), user.to_owned());
        token
    }

    /// The user a token stands for.
    pub(crate) fn user(&self, token: &str) -> Option<&str> {
        self.users.get(token).map(String::as_str)
    }
}

/// The user name of a ServiceAccount.
pub(crate) fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// What a request asks to do, in RBAC's terms.
#[derive(Debug)]
pub(crate) struct Attributes<'a> {
    pub(crate) user: &'a str,
    pub(crate) verb: &'a str,
    pub(crate) group: &'a str,
    pub(crate) resource: &'a str,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) namespace: Option<&'a str>,
    /// The object's name (`None` for a create, or a list without a name selector).
    pub(crate) name: Option<&'a str>,
}

/// Whether some binding of `attrs.user` grants the request.
pub(crate) fn allowed(state: &State, attrs: &Attributes<'_>) -> bool {
    let rbac = "rbac.authorization.k8s.io";
    let objects = |plural: &str| {
        state
            .table(&res_key(rbac, plural))
            .into_iter()
            .flat_map(|t| t.values())
            .map(|stored| &stored.value)
    };
    let role_rules = |kind: &str, name: &str, namespace: &str| -> Vec<Value> {
        let stored = match kind {
            "ClusterRole" => state.get(&res_key(rbac, "clusterroles"), "", name),
            "Role" => state.get(&res_key(rbac, "roles"), namespace, name),
            _ => None,
        };
        stored
            .and_then(|s| s.value.get("rules").and_then(Value::as_array).cloned())
            .unwrap_or_default()
    };
    let grants = |binding: &Value, namespace: &str| {
        if !binds(binding, attrs.user) {
            return false;
        }
        let role_ref = &binding["roleRef"];
        let kind = role_ref["kind"].as_str().unwrap_or_default();
        let name = role_ref["name"].as_str().unwrap_or_default();
        role_rules(kind, name, namespace)
            .iter()
            .any(|rule| rule_allows(rule, attrs))
    };
    let cluster = objects("clusterrolebindings").any(|b| grants(b, ""));
    cluster
        || attrs.namespace.is_some_and(|ns| {
            objects("rolebindings")
                .filter(|b| b["metadata"]["namespace"].as_str() == Some(ns))
                .any(|b| grants(b, ns))
        })
}

/// Whether a binding's subjects include `user` (a ServiceAccount's user name).
fn binds(binding: &Value, user: &str) -> bool {
    let sa = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'));
    let groups: Vec<String> = match sa {
        Some((ns, _)) => vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ],
        None => vec!["system:authenticated".into()],
    };
    let subjects = binding["subjects"].as_array().into_iter().flatten();
    subjects.into_iter().any(|subject| {
        let name = subject["name"].as_str().unwrap_or_default();
        match subject["kind"].as_str() {
            Some("ServiceAccount") => sa.is_some_and(|(ns, sa_name)| {
                subject["namespace"].as_str() == Some(ns) && name == sa_name
            }),
            Some("User") => name == user,
            Some("Group") => groups.iter().any(|g| g == name),
            _ => false,
        }
    })
}

/// Whether one PolicyRule covers the request.
fn rule_allows(rule: &Value, attrs: &Attributes<'_>) -> bool {
    let list = |field: &str| -> Vec<&str> {
        rule[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let verbs = list("verbs");
    let groups = list("apiGroups");
    let resources = list("resources");
    let names = list("resourceNames");
    let verb_ok = verbs.iter().any(|v| *v == "*" || *v == attrs.verb);
    let group_ok = groups.iter().any(|g| *g == "*" || *g == attrs.group);
    let resource_ok = resources.iter().any(|r| match attrs.subresource {
        None => *r == "*" || *r == attrs.resource,
        Some(sub) => {
            *r == "*"
                || r.split_once('/')
                    .is_some_and(|(res, s)| s == sub && (res == "*" || res == attrs.resource))
        }
    });
    let name_ok = names.is_empty() || attrs.name.is_some_and(|n| names.contains(&n));
    verb_ok && group_ok && resource_ok && name_ok
}

/// The 403 kube-apiserver answers a denied request with:
/// `leases.coordination.k8s.io "x" is forbidden: User "system:serviceaccount:ns:sa" cannot
/// update resource "leases" in API group "coordination.k8s.io" in the namespace "ns"`.
pub(crate) fn forbidden(attrs: &Attributes<'_>) -> ApiError {
    let resource = match attrs.subresource {
        Some(sub) => format!("{}/{sub}", attrs.resource),
        None => attrs.resource.to_owned(),
    };
    let scope = match attrs.namespace {
        Some(ns) => format!("in the namespace {ns:?}"),
        None => "at the cluster scope".to_owned(),
    };
    let what = qualified(attrs.group, attrs.resource);
    let object = match attrs.name {
        Some(name) => format!("{what} {name:?}"),
        None => what,
    };
    let mut err = ApiError::new(
        403,
        "Forbidden",
        format!(
            "{object} is forbidden: User {user:?} cannot {verb} resource {resource:?} in API \
             group {group:?} {scope}",
            user = attrs.user,
            verb = attrs.verb,
            group = attrs.group,
        ),
    );
    err.details.group = (!attrs.group.is_empty()).then(|| attrs.group.to_owned());
    err.details.kind = Some(attrs.resource.to_owned());
    err.details.name = attrs.name.map(str::to_owned);
    err
}

/// The 401 for a bearer token the sim did not mint.
pub(crate) fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs<'a>(verb: &'a str, name: Option<&'a str>) -> Attributes<'a> {
        Attributes {
            user: "system:serviceaccount:storage:provisioner",
            verb,
            group: "",
            resource: "configmaps",
            subresource: None,
            namespace: Some("storage"),
            name,
        }
    }

    #[test]
    fn a_rule_matches_verb_group_resource_subresource_and_name() {
        let rule = json!({"apiGroups": [""], "resources": ["configmaps"],
                          "verbs": ["get", "update"], "resourceNames": ["journal"]});
        assert!(rule_allows(&rule, &attrs("get", Some("journal"))));
        assert!(!rule_allows(&rule, &attrs("get", Some("other"))));
        assert!(!rule_allows(&rule, &attrs("list", None)));
        assert!(!rule_allows(&rule, &attrs("create", None)));
        let status = Attributes {
            subresource: Some("status"),
            ..attrs("update", Some("journal"))
        };
        assert!(!rule_allows(&rule, &status));
        let sub = json!({"apiGroups": [""], "resources": ["configmaps/status"], "verbs": ["*"]});
        assert!(rule_allows(&sub, &status));
        assert!(!rule_allows(&sub, &attrs("update", Some("journal"))));
        let any = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(&any, &status));
        let other_group = json!({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]});
        assert!(!rule_allows(&other_group, &attrs("get", None)));
    }

    #[test]
    fn subjects_match_the_service_account_its_user_and_its_groups() {
        let user = "system:serviceaccount:storage:provisioner";
        let sa = json!({"subjects": [{"kind": "ServiceAccount", "name": "provisioner",
                                       "namespace": "storage"}]});
        assert!(binds(&sa, user));
        assert!(!binds(&sa, "system:serviceaccount:other:provisioner"));
        let as_user = json!({"subjects": [{"kind": "User", "name": user}]});
        assert!(binds(&as_user, user));
        let group =
            json!({"subjects": [{"kind": "Group", "name": "system:serviceaccounts:storage"}]});
        assert!(binds(&group, user));
        assert!(!binds(&group, "system:serviceaccount:other:x"));
        assert!(!binds(&json!({}), user));
    }

    #[test]
    fn the_forbidden_message_is_kube_apiservers() {
        let err = forbidden(&Attributes {
            group: "coordination.k8s.io",
            resource: "leases",
            ..attrs("update", Some("example.com-nfs"))
        });
        assert_eq!(err.code, 403);
        assert_eq!(
            err.message,
            "leases.coordination.k8s.io \"example.com-nfs\" is forbidden: User \
             \"system:serviceaccount:storage:provisioner\" cannot update resource \"leases\" \
             in API group \"coordination.k8s.io\" in the namespace \"storage\""
        );
        let list = forbidden(&Attributes {
            namespace: None,
            resource: "persistentvolumes",
            ..attrs("list", None)
        });
        assert_eq!(
            list.message,
            "persistentvolumes is forbidden: User \"system:serviceaccount:storage:provisioner\" \
             cannot list resource \"persistentvolumes\" in API group \"\" at the cluster scope"
        );
    }

    #[test]
    fn a_token_is_minted_once_per_user() {
        let mut tokens = Tokens::default();
        let a = tokens.mint("system:serviceaccount:a:b");
        assert_eq!(tokens.mint("system:serviceaccount:a:b"), a);
        let c = tokens.mint("system:serviceaccount:a:c");
        assert_ne!(a, c);
        assert_eq!(tokens.user(&c), Some("system:serviceaccount:a:c"));
        assert_eq!(tokens.user("guess"), None);
    }
}
