//! Fault injection: fail or delay matching requests.

use std::time::Duration;

/// The API verb of a request, as in audit logs.
///
/// Writes to a `/status` subresource are [`Verb::Update`] or [`Verb::Patch`] with
/// subresource `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH (every patch type, and server-side apply).
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// The lowercase audit name: `get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many times a rule fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Times {
    Remaining(u32),
    Always,
}

/// A rule that fails or delays the requests it matches; added with
/// [`KubeSim::add_fault`](crate::KubeSim::add_fault).
///
/// A rule matches on verb and resource plural, and optionally on subresource, object name
/// and namespace. By default it fires once and answers `500 InternalError`. With
/// [`latency`](Self::latency) the response is delayed; a rule with latency and no
/// [`status`](Self::status) only delays, and the request is then served normally.
///
/// ```
/// use std::time::Duration;
/// use kube_sim::{FaultRule, Verb};
///
/// // The next two creates of PV "pv-1" fail with 500 after 50 ms.
/// let rule = FaultRule::new(Verb::Create, "persistentvolumes")
///     .name("pv-1")
///     .times(2)
///     .status(500, "InternalError")
///     .latency(Duration::from_millis(50));
/// // Every claim status update is slowed down, never failed.
/// let slow = FaultRule::new(Verb::Update, "persistentvolumeclaims")
///     .subresource("status")
///     .always()
///     .latency(Duration::from_millis(10))
///     .no_status();
/// # let _ = (rule, slow);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub(crate) verb: Verb,
    pub(crate) resource: String,
    pub(crate) subresource: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) namespace: Option<String>,
    times: Times,
    pub(crate) status: Option<(u16, String)>,
    pub(crate) message: Option<String>,
    pub(crate) latency: Duration,
}

impl FaultRule {
    /// A rule for `verb` on the resource `plural` (e.g. `"persistentvolumeclaims"`) that
    /// fails the next matching request with `500 InternalError`.
    #[must_use]
    pub fn new(verb: Verb, plural: impl Into<String>) -> Self {
        Self {
            verb,
            resource: plural.into(),
            subresource: None,
            name: None,
            namespace: None,
            times: Times::Remaining(1),
            status: Some((500, "InternalError".to_string())),
            message: None,
            latency: Duration::ZERO,
        }
    }

    /// Matches only requests to this subresource (e.g. `"status"`). Without it the rule
    /// matches only the main resource.
    #[must_use]
    pub fn subresource(mut self, subresource: impl Into<String>) -> Self {
        self.subresource = Some(subresource.into());
        self
    }

    /// Matches only the object with this name (for create: the name in the body's metadata).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Matches only requests in this namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Fires for the next `n` matching requests, then is removed. Default 1; 0 never fires.
    #[must_use]
    pub fn times(mut self, n: u32) -> Self {
        self.times = Times::Remaining(n);
        self
    }

    /// Fires for every matching request until [`KubeSim::clear_faults`](crate::KubeSim::clear_faults).
    #[must_use]
    pub fn always(mut self) -> Self {
        self.times = Times::Always;
        self
    }

    /// Answers with this HTTP code and `Status` reason (e.g. `409, "Conflict"`).
    #[must_use]
    pub fn status(mut self, code: u16, reason: impl Into<String>) -> Self {
        self.status = Some((code, reason.into()));
        self
    }

    /// The `Status` message; default `injected fault`.
    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Serves matching requests normally (use with [`latency`](Self::latency)).
    #[must_use]
    pub fn no_status(mut self) -> Self {
        self.status = None;
        self
    }

    /// Delays matching requests by `latency` before answering.
    #[must_use]
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Whether the rule matches a request.
    pub(crate) fn matches(&self, req: &RequestKey<'_>) -> bool {
        self.times != Times::Remaining(0)
            && self.verb == req.verb
            && self.resource == req.resource
            && self.subresource.as_deref() == req.subresource
            && self.name.as_deref().is_none_or(|n| Some(n) == req.name)
            && self
                .namespace
                .as_deref()
                .is_none_or(|n| Some(n) == req.namespace)
    }

    /// Counts one firing; returns whether the rule is used up.
    pub(crate) fn fire(&mut self) -> bool {
        match &mut self.times {
            Times::Always => false,
            Times::Remaining(n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
        }
    }
}

/// What a fault rule matches on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestKey<'a> {
    pub(crate) verb: Verb,
    pub(crate) resource: &'a str,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) name: Option<&'a str>,
    pub(crate) namespace: Option<&'a str>,
}

/// The action the first matching rule asks for.
#[derive(Clone, Debug, Default)]
pub(crate) struct FaultAction {
    pub(crate) latency: Duration,
    pub(crate) status: Option<(u16, String, String)>,
}

/// Finds the first matching rule, counts it, and returns what to do.
pub(crate) fn take(rules: &mut Vec<FaultRule>, req: &RequestKey<'_>) -> Option<FaultAction> {
    let i = rules.iter().position(|r| r.matches(req))?;
    let rule = &mut rules[i];
    let action = FaultAction {
        latency: rule.latency,
        status: rule.status.clone().map(|(code, reason)| {
            (
                code,
                reason,
                rule.message
                    .clone()
                    .unwrap_or_else(|| "injected fault".to_string()),
            )
        }),
    };
    if rule.fire() {
        rules.remove(i);
    }
    Some(action)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(verb: Verb, name: Option<&'a str>) -> RequestKey<'a> {
        RequestKey {
            verb,
            resource: "persistentvolumes",
            subresource: None,
            name,
            namespace: None,
        }
    }

    #[test]
    fn a_rule_fires_its_number_of_times() {
        let mut rules = vec![
            FaultRule::new(Verb::Create, "persistentvolumes")
                .times(2)
                .name("pv-1"),
        ];
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-2"))).is_none());
        assert!(take(&mut rules, &key(Verb::Get, Some("pv-1"))).is_none());
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-1"))).is_some());
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-1"))).is_some());
        assert!(take(&mut rules, &key(Verb::Create, Some("pv-1"))).is_none());
        assert!(rules.is_empty());
    }

    #[test]
    fn always_keeps_firing_and_status_subresource_must_match() {
        let mut rules = vec![
            FaultRule::new(Verb::Update, "persistentvolumes")
                .subresource("status")
                .always(),
        ];
        assert!(take(&mut rules, &key(Verb::Update, None)).is_none());
        let status = RequestKey {
            subresource: Some("status"),
            ..key(Verb::Update, None)
        };
        for _ in 0..5 {
            let action = take(&mut rules, &status).unwrap();
            assert_eq!(action.status.unwrap().0, 500);
        }
    }
}
