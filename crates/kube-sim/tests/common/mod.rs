//! Helpers shared by the kube-sim integration tests.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::Error;
use serde_json::json;

/// A claim named `name` asking for `size`.
pub fn claim(name: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        }
    }))
    .unwrap()
}

/// Code and reason of an API error; panics on anything else.
pub fn api_error<T: std::fmt::Debug>(result: Result<T, Error>) -> (u16, String, String) {
    match result {
        Err(Error::Api(status)) => (status.code, status.reason.clone(), status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `check` until it returns true; fails the test after 10 s (a hang guard, not a timing
/// assertion).
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}
