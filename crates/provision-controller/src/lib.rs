#![doc = include_str!("../README.md")]
//!
//! # The API, grouped
//!
//! | what | items |
//! |---|---|
//! | a driver implements | [`Provisioner`] (`provision`, `delete`, `supports_block`), with [`ProvisionOptions`], [`ProvisionError`], [`DeleteError`] |
//! | a driver may opt into | [`Qualifier`], [`DeletionGuard`], [`AssetLookup`], [`LateAssets`] (handed to the builder) |
//! | the binary runs | [`client`] (`infer`, `check`, `from_config`, `for_leader_election`), [`ProvisionController`] (`new`, builder methods, `run(shutdown)`), [`Config`], [`LeaderElection`], [`shutdown_signal`]; [`Error`] from `run`, printed with [`error_chain`] |
//! | options with more than one form | [`FailureBackoff`] and [`PvSaveStrategy`] (a caller's [`RateLimiter`]), [`VolumeNamer`], [`SharedCache`]; [`ConfigError`] names a bad option ([`ConfigOption`]) |
//! | one election for several controllers | [`Health`] (`/readyz` and the role, shared), [`Leading`] (what another controller follows) |
//! | operators | [`manifests`] (the objects a driver needs in a cluster, as YAML), [`rbac`] (the permissions), [`annotations`] (the names on objects), [`Uninstall`] / [`UninstallReport`] / [`JournalRecord`] |
//! | tests (feature `testing`) | `testing::DriverTest`, `testing::conformance`, `testing::FakeProvisioner`, object builders |
//!
//! Types of other crates in the API come from the crates re-exported here: [`k8s_openapi`]
//! (the objects), [`kube_client`] (the client), [`kube_runtime`] (a caller's reflector
//! store for [`SharedCache`]), [`futures`] (its stream), [`prometheus_client`] (the metrics
//! registry) and [`tokio`] (the watch behind [`Leading`]). The repository's
//! `crates/provision-controller/api.txt` lists the whole API; CI checks it.
//!
//! Every Go option and its Rust form, and every difference from the Go library, are listed
//! in the repository's `docs/porting-notes.md`; what crash-safe provisioning guarantees,
//! the metrics and the events, in `docs/production.md`.

pub mod annotations;
mod cache;
pub mod client;
mod config;
mod controller;
mod election;
mod error;
mod events;
mod health;
mod journal;
pub mod manifests;
mod metrics;
mod provisioner;
mod queue;
mod ratelimit;
pub mod rbac;
mod retry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

// The crates whose types this crate's API names (objects, the client, a caller's caches
// and metrics registry, the watch `Leading` follows), so a driver names the very versions
// the controller uses.
pub use futures;
pub use k8s_openapi;
pub use kube_client;
pub use kube_runtime;
pub use prometheus_client;
pub use tokio;

pub use cache::SharedCache;
pub use config::{Config, VolumeNamer};
pub use controller::ProvisionController;
pub use election::LeaderElection;
pub use error::{ConfigError, ConfigOption, DeleteError, Error, ProvisionError};
pub use health::Health;
pub use journal::{JournalRecord, Uninstall, UninstallReport};
/// An error and its causes as one line (`what failed: why: ...`), each message once, with
/// the API server's answers and connection failures in words: what a binary prints (see
/// kube-controller-kit's `error::chain`).
pub use kube_controller_kit::error::chain as error_chain;
pub use kube_controller_kit::{backoff::RateLimiter, leader::Leading};
pub use provisioner::{
    AssetLookup, DeletionGuard, LateAssets, ProvisionOptions, Provisioner, Qualifier,
};
pub use retry::{FailureBackoff, PvSaveStrategy};

/// Waits for SIGTERM or SIGINT (and logs which): the `shutdown` future to pass to
/// [`ProvisionController::run`].
///
/// # Errors
/// When the signal handlers cannot be installed.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static>
{
    let signal = kube_controller_kit::signal::shutdown_signal()?;
    Ok(async move {
        let signal = signal.await;
        tracing::info!(%signal, "shutdown signal received");
    })
}
