#![doc = include_str!("../README.md")]
//!
//! # The API, grouped
//!
//! | what | items |
//! |---|---|
//! | a driver implements | [`Provisioner`] (`provision`, `delete`, `supports_block`), with [`ProvisionOptions`], [`ProvisionError`], [`DeleteError`] |
//! | a driver may opt into | [`Qualifier`], [`DeletionGuard`], [`AssetLookup`], [`LateAssets`] (handed to the builder) |
//! | the binary runs | [`client`] (`infer`, `from_config`, `for_leader_election`), [`ProvisionController`] (`new`, builder methods, `run(shutdown)`), [`Config`], [`LeaderElection`], [`shutdown_signal`]; [`Error`] from `run` |
//! | options with more than one form | [`FailureBackoff`], [`PvSaveStrategy`], [`VolumeNamer`], [`SharedCache`]; [`ConfigError`] names a bad option ([`ConfigOption`]) |
//! | operators | [`manifests`] (the objects a driver needs in a cluster, as YAML), [`rbac`] (the permissions), [`annotations`] (the names on objects), [`Uninstall`] / [`UninstallReport`] / [`JournalRecord`] |
//! | tests (feature `testing`) | `testing::DriverTest`, `testing::conformance`, `testing::FakeProvisioner`, object builders |
//!
//! Every Go option and its Rust form, and every difference from the Go library, are listed
//! in the repository's `docs/porting-notes.md`; what crash-safe provisioning guarantees,
//! the metrics and the events, in `docs/production.md`.

pub mod annotations;
mod cache;
mod config;
mod controller;
mod error;
mod events;
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

pub use cache::SharedCache;
pub use config::{Config, VolumeNamer};
pub use controller::ProvisionController;
pub use error::{BoxError, ConfigError, ConfigOption, DeleteError, Error, ProvisionError, Result};
pub use journal::{JournalRecord, Uninstall, UninstallReport};
/// Builds the controller's `kube::Client`: one HTTP/2 connection for every request and
/// watch, and a second one for leader election (from kube-controller-kit).
pub use kube_controller_kit::client;
/// An error and its causes as one line (`what failed: why: ...`), each message once, with
/// the API server's answers and connection failures in words: what a binary prints (see
/// kube-controller-kit's `error::chain`).
pub use kube_controller_kit::error::chain as error_chain;
pub use kube_controller_kit::leader::LeaderElection;
/// Waits for SIGTERM or SIGINT: the `shutdown` future to pass to
/// [`ProvisionController::run`].
pub use kube_controller_kit::signal::shutdown_signal;
pub use provisioner::{
    AssetLookup, DeletionGuard, LateAssets, ProvisionOptions, Provisioner, Qualifier,
};
pub use retry::{FailureBackoff, PvSaveStrategy};
