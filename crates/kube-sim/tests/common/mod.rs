//! Helpers shared by the kube-sim integration tests.
#![allow(dead_code, unreachable_pub)]

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube_client::Error;
use serde_json::json;

/// The shared poll (20 s limit, a hang guard, not a timing assertion), re-exported so the
/// targets that share this module import it from one place.
#[allow(unused_imports)] // not every target waits
pub use kube_sim::wait::eventually;

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
