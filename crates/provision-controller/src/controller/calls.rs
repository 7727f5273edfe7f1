//! What every operation shares: how a sync ended ([`Outcome`]), its error type
//! ([`OpError`]), and calls bounded by a timeout with panics caught ([`call`], [`api`], [`get_volume`]). A ground-floor file:
//! every step of a claim's or a volume's way calls through it, and it calls none of them.

use std::{future::Future, panic::AssertUnwindSafe, time::Duration};

use futures::FutureExt;

use crate::error::{BoxError, ProvisionError};

/// How a claim's sync ended without failing: done (forgotten), or to be looked at
/// again after a wait that is no failure (not counted, no backoff).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing more to do until the claim changes.
    Done,
    /// The worker queues the claim again after `wait`.
    RequeueAfter { wait: Duration, why: Why },
}

/// Why a claim's sync asks to be queued again later ([`Outcome::RequeueAfter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Why {
    /// The claim waits after an infeasible answer of the driver (Go:
    /// `delayProvisioningIfRecentlyInfeasible`); queued again once the wait is over (or
    /// at once when the claim's class is re-created).
    Infeasible,
    /// The qualifier refuses to let this controller clean up the claim (another
    /// controller may own it): asked again after the wait.
    CleanupRefused { claim: String },
    /// A cleanup found no asset for the claim, but a create sent for it before it was
    /// deleted or bound elsewhere (by this or another replica) may still land within the
    /// driver's late-asset window: looked at again once it can no longer.
    CreatesMayLand { claim: String },
}

impl Why {
    /// The reason and the wait in words, as the worker logs them.
    pub(crate) fn with_wait(&self, wait: Duration) -> Waiting<'_> {
        Waiting { why: self, wait }
    }
}

/// A [`Why`] with its wait, for logs ([`Why::with_wait`]).
pub(crate) struct Waiting<'a> {
    why: &'a Why,
    wait: Duration,
}

impl std::fmt::Display for Waiting<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wait = self.wait;
        match self.why {
            Why::Infeasible => write!(
                f,
                "provisioning previously failed with infeasible error; waiting {wait:?}"
            ),
            Why::CleanupRefused { claim } => write!(
                f,
                "the qualifier refuses the cleanup of claim {claim}; asking again in {wait:?}"
            ),
            Why::CreatesMayLand { claim } => write!(
                f,
                "no asset of claim {claim} found yet, and a create sent before may still land; looking again in {wait:?}"
            ),
        }
    }
}

/// Why one claim or volume operation failed (the claim or volume is retried).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpError {
    #[error("{what} failed")]
    Api {
        what: String,
        #[source]
        source: kube_client::Error,
    },
    #[error("{what} timed out after {limit:?}")]
    Timeout { what: String, limit: Duration },
    #[error("{what} panicked: {message}")]
    Panicked { what: String, message: String },
    #[error("storageclass {name:?} not found")]
    ClassNotFound { name: String },
    /// The provisioning journal could not record the claim's intent: the driver is not
    /// called, and the claim is retried.
    #[error("recording the provisioning of claim {claim} in the journal failed: {message}")]
    Journal { claim: String, message: String },
    /// The driver failed the last late-asset sweep of a PV: retried.
    #[error("the driver failed the last late-asset sweep of persistentvolume {pv}")]
    Sweep { pv: String },
    #[error("claim {claim} has no uid")]
    NoUid { claim: String },
    #[error("failed to provision volume with StorageClass {class:?}")]
    Provision {
        class: String,
        #[source]
        source: ProvisionError,
    },
    #[error("deleting the volume failed")]
    Delete(#[source] BoxError),
    #[error("persistentvolume {name} already existed and is gone now")]
    VolumeGone { name: String },
}

/// The error and its sources, joined by ": " (for events and logs).
pub(crate) use kube_controller_kit::error::chain;

/// How a bounded call ended without its own result.
#[derive(Debug)]
pub(crate) enum CallError {
    Timeout(Duration),
    Panicked(String),
}

impl CallError {
    pub(crate) fn into_op(self, what: impl Into<String>) -> OpError {
        match self {
            Self::Timeout(limit) => OpError::Timeout {
                what: what.into(),
                limit,
            },
            Self::Panicked(message) => OpError::Panicked {
                what: what.into(),
                message,
            },
        }
    }
}

/// Runs `fut` within `limit` (if any), turning a panic inside it into an error.
pub(crate) async fn call<T>(
    limit: Option<Duration>,
    fut: impl Future<Output = T>,
) -> Result<T, CallError> {
    let guarded = AssertUnwindSafe(fut).catch_unwind();
    let outcome = match limit {
        Some(limit) => tokio::time::timeout(limit, guarded)
            .await
            .map_err(|_| CallError::Timeout(limit))?,
        None => guarded.await,
    };
    outcome.map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic payload".into());
        CallError::Panicked(message)
    })
}

/// An API call within `limit`.
pub(crate) async fn api<T>(
    limit: Option<Duration>,
    what: impl FnOnce() -> String,
    fut: impl Future<Output = Result<T, kube_client::Error>>,
) -> Result<T, OpError> {
    match call(limit, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(OpError::Api {
            what: what(),
            source,
        }),
        Err(err) => Err(err.into_op(what())),
    }
}

/// Whether `err` is an API error with this HTTP status or reason test.
pub(crate) fn is_api(
    err: &kube_client::Error,
    test: impl Fn(&kube_client::core::Status) -> bool,
) -> bool {
    matches!(err, kube_client::Error::Api(status) if test(status))
}

/// Whether an answer to a patch that carried the object's `metadata.uid` says the object
/// under that name is another one. A real kube-apiserver answers such a patch 422 Invalid
/// (`metadata.uid: Invalid value: "...": field is immutable`), for merge and
/// strategic-merge patches alike: the uid of a patch is no precondition (a PUT's is, with a
/// 409, which the callers treat as before).
pub(crate) fn is_other_uid(status: &kube_client::core::Status) -> bool {
    status.code == 422
        && status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
}

/// The PV named `name` as the API server has it now (`None`: it does not exist), without
/// its managed fields.
pub(crate) async fn get_volume(
    client: &kube_client::Client,
    limit: Option<Duration>,
    name: &str,
) -> Result<Option<k8s_openapi::api::core::v1::PersistentVolume>, OpError> {
    let volumes: kube_client::Api<k8s_openapi::api::core::v1::PersistentVolume> =
        kube_client::Api::all(client.clone());
    let mut found = api(
        limit,
        || format!("get persistentvolume {name}"),
        volumes.get_opt(name),
    )
    .await?;
    if let Some(volume) = found.as_mut() {
        volume.metadata.managed_fields = None;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_limit_times_out() {
        let slow = tokio::time::sleep(Duration::from_secs(60));
        let got = call(Some(Duration::from_secs(5)), slow).await;
        assert!(matches!(got, Err(CallError::Timeout(d)) if d == Duration::from_secs(5)));
    }

    #[tokio::test]
    async fn a_panicking_call_is_an_error_with_its_message() {
        let got = call(None, async { panic!("boom") }).await;
        assert!(matches!(got, Err(CallError::Panicked(m)) if m == "boom"));
    }
}

#[cfg(test)]
mod uid_tests {
    use super::is_other_uid;

    fn status(json: serde_json::Value) -> kube_client::core::Status {
        serde_json::from_value(json).unwrap()
    }

    /// What a real kube-apiserver (v1.36) answers a merge or strategic-merge patch whose
    /// `metadata.uid` is not the object's.
    #[test]
    fn the_real_servers_answer_to_another_uid_is_recognised() {
        let other = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "PersistentVolumeClaim \"c\" is invalid: metadata.uid: Invalid value: \"u2\": field is immutable",
            "reason": "Invalid",
            "details": {"name": "c", "kind": "PersistentVolumeClaim", "causes": [
                {"reason": "FieldValueInvalid", "message": "Invalid value: \"u2\": field is immutable", "field": "metadata.uid"}
            ]},
            "code": 422
        }));
        assert!(is_other_uid(&other));
        let finalizers = status(serde_json::json!({
            "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "PersistentVolumeClaim \"c\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
            "details": {"name": "c", "kind": "PersistentVolumeClaim", "causes": [
                {"reason": "FieldValueForbidden", "message": "Forbidden: no new finalizers can be added if the object is being deleted", "field": "metadata.finalizers"}
            ]}
        }));
        assert!(!is_other_uid(&finalizers));
        let conflict = status(
            serde_json::json!({"status": "Failure", "reason": "Conflict", "code": 409, "message": "x"}),
        );
        assert!(!is_other_uid(&conflict));
    }
}
