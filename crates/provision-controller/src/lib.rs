#![doc = include_str!("../README.md")]
//!
//! # Go options and their Rust form
//!
//! | Go (`sig-storage-lib-external-provisioner/controller`) | Rust |
//! |---|---|
//! | `NewProvisionController(client, name, provisioner, opts...)` | [`ProvisionController::new`] + builder methods |
//! | `Run(ctx)` | [`ProvisionController::run`]`(shutdown)`, consumes the controller |
//! | `Qualifier`, `DeletionGuard`, `BlockProvisioner` (type assertions) | [`ProvisionController::qualifier`], [`ProvisionController::deletion_guard`], [`Provisioner::supports_block`] |
//! | `ProvisioningState` + `error`, `IgnoredError` | [`ProvisionError`] variants, [`DeleteError::Ignored`] |
//! | `ResyncPeriod` (15 min) | [`Config::resync_period`] |
//! | `Threadiness` (4) | [`Config::threads`] (`NonZeroU16`): driver calls at once; the syncs around them are [`Config::sync_workers`] (128) |
//! | `ExponentialBackOffOnError` (true), `RateLimiter` | [`Config::failure_backoff`]: [`FailureBackoff::Exponential`] / [`FailureBackoff::Flat`] / [`FailureBackoff::Custom`] |
//! | `FailedProvisionThreshold`, `FailedDeleteThreshold` (15, 0 = forever) | [`Config::failed_provision_threshold`], [`Config::failed_delete_threshold`] |
//! | `CreateProvisionedPVRetryCount` (5), `CreateProvisionedPVInterval` (10 s) | [`Config::pv_save`]: [`PvSaveStrategy::Blocking`] |
//! | `CreateProvisionedPVBackoff` | [`PvSaveStrategy::Backoff`] |
//! | `CreateProvisionedPVLimiter` | [`PvSaveStrategy::Background`] |
//! | `LeaderElection` (true), `LeaderElectionNamespace`, `LeaseDuration` (15 s), `RenewDeadline` (10 s), `RetryPeriod` (2 s) | [`Config::leader_election`]`(Option<`[`LeaderElection`]`>)`; namespace: the client's (the service account's in a pod), or `POD_NAMESPACE` through [`Config::from_lookup`]; renewals on [`ProvisionController::leader_election_client`] |
//! | `AdditionalProvisionerNames` | [`Config::additional_provisioner_names`] |
//! | `AddFinalizer` (false) | [`Config::add_finalizer`] |
//! | `ProvisionTimeout`, `DeletionTimeout` (none) | [`Config::provision_timeout`], [`Config::deletion_timeout`] |
//! | `getProvisionedVolumeNameForClaim` (`pvc-<uid>`) | [`Config::volume_namer`] ([`VolumeNamer`]) |
//! | `MetricsAddress`, `MetricsPort` (0 = off), `MetricsPath` | [`Config::metrics_address`], [`Config::metrics_port`], [`Config::metrics_path`]; also serves `/healthz` and `/readyz` ([`http`]) |
//! | (none: process exit on shutdown) | [`Config::shutdown_grace`] (30 s) |
//! | (none: kubernetes-csi/external-provisioner#486) | [`Config::crash_safe_provisioning`] (on) |
//! | `MetricsInstance` | [`ProvisionController::metrics_registry`]: the controller's metrics on the caller's registry, which the endpoint serves |
//! | `ClaimsInformer`, `VolumesInformer`, `ClassesInformer` | [`ProvisionController::claims_cache`], [`ProvisionController::volumes_cache`], [`ProvisionController::classes_cache`] with a [`SharedCache`] |
//! | `NodesLister` | not offered: the selected node is read with a GET, as Go does without a lister |
//!
//! # Differences from Go
//!
//! - **No leaked volume when a claim gives up.** Go drops a claim from its "claims in
//!   progress" when the failure threshold is reached, even while the driver is still
//!   creating its volume in the background; the asset is then never saved nor deleted.
//!   Here such a claim keeps being retried (at the limiter's pace) until the driver
//!   returns a volume, which is saved and then reclaimed as usual, or a final answer;
//!   neither the qualifier nor a change of the claim or its class (deleted, naming
//!   another provisioner) nor a deleted selected node make it forget the claim.
//! - **Stop outcomes are not failures.** A PV that already exists, a claim the driver
//!   ignores, an unsupported block claim or a rescheduled claim count in
//!   `..._provision_stopped_total`, not in `..._provision_failed_total`; a deletion the
//!   driver ignores counts in `..._delete_stopped_total`, not as a deletion.
//! - **Timeouts bound every call.** [`Config::provision_timeout`] and
//!   [`Config::deletion_timeout`] limit each API and backend call of an operation,
//!   including PV saving and the cleanup after a failed save (Go's blocking save used an
//!   unbounded context). A provision call that times out is treated as running in the
//!   background, so its claim is driven to the end.
//! - **A panicking driver** fails that call only: an event, a retry, the claim keeps its
//!   remembered state ([`ProvisionError::NoChange`]). A panic anywhere else in a sync
//!   (the volume-name hook, a bug) fails that claim or volume only; the worker lives on.
//! - **Additional names delete too.** A released PV whose provisioned-by annotation holds
//!   one of [`Config::additional_provisioner_names`] is deleted; Go only matched the main name.
//! - **Deleting a PV that is already gone** counts as done instead of an error.
//! - **A new or changed StorageClass requeues its unbound claims**, so a claim that
//!   arrived before its class is provisioned at once instead of after its backoff.
//! - **The qualifier is asked only about claims that name this provisioner** (same
//!   decisions as Go, fewer calls).
//! - **Finalizers are written with a strategic-merge patch** that names only ours and
//!   carries no resourceVersion (Go v13), so a stale cache or another writer's finalizer
//!   never makes it conflict; the PV finalizer is put only on Bound PVs with reclaim
//!   policy Delete, and removed from a PV being deleted that will never be reclaimed (a
//!   Delete PV that names its claim by uid keeps it: it will be released).
//! - **Which volumes are ours** follows newer upstream (`isProvisionerForVolume`): with a
//!   provisioned-by annotation, that or migrated-to must name us; a statically
//!   provisioned CSI volume is ours when its driver is; a static in-tree one when
//!   migrated to us.
//! - **A nameless PV from the driver** is given `pv_name`; a claim with an empty UID is
//!   never provisioned (it would share the PV name `pvc-` with every other such claim).
//! - Events are written with the `events.k8s.io/v1` API, one `create` each, in the
//!   background (kube-controller-kit's `EventWriter`: kube-runtime's recorder without its
//!   cache of past events).
//! - **The lease is released on shutdown.** After a graceful stop (in-flight operations
//!   get [`Config::shutdown_grace`]) the leader writes a released Lease record, so a
//!   standby takes over at its next retry instead of after a whole lease duration.
//! - **Losing the lease never exits the process.** The workers are stopped at once and
//!   [`ProvisionController::run`] returns [`Error::LeadershipLost`]; the binary decides.
//! - **Lease renewals do not queue behind worker traffic** when a dedicated client is
//!   passed with [`ProvisionController::leader_election_client`].
//! - **Standbys are warm and observable.** Every replica syncs its caches and serves the
//!   metrics, `/healthz` and `/readyz`; Go starts informers and the metrics server only
//!   on the leader. A new leader queues its cached claims and volumes at once.
//! - **Crash-safe provisioning** ([`Config::crash_safe_provisioning`], default on): before
//!   the driver may create an asset, the controller's own [`journal`] (ConfigMaps in its
//!   namespace, written in groups) records it until a PV names it, so a restart between
//!   "asset created" and "PV saved" no longer leaks the asset
//!   (kubernetes-csi/external-provisioner#486); users' claims carry nothing of it. A
//!   claim that will not get its PV the normal way (deleted, bound elsewhere, renamed) is
//!   cleaned up by saving a PV for the asset, which is then released and reclaimed as
//!   usual; the PV name arbitrates between replicas, so no replica deletes an asset
//!   another one's PV names. A PV that cannot be saved keeps its asset (Go deletes it)
//!   and the claim is provisioned again. [`journal::Uninstall`] removes the journal.
//! - **Leader election uses a Lease** (Go's copy uses an Endpoints lock).

pub mod journal;
pub mod metrics;
pub(crate) mod queue;
pub mod ratelimit;
pub mod rbac;

pub mod annotations;
mod cache;
mod config;
mod controller;
mod error;
pub mod events;
mod provisioner;
mod retry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use cache::SharedCache;
pub use config::{Config, VolumeNamer};
pub use controller::ProvisionController;
pub use error::{BoxError, ConfigError, ConfigOption, DeleteError, Error, ProvisionError, Result};
// The metrics and probe server and leader election live in kube-controller-kit; they are
// re-exported under their old paths (`provision_controller::http`, `::leader`).
#[doc(inline)]
pub use kube_controller_kit::{client, http, leader, signal};
pub use leader::LeaderElection;
pub use metrics::ControllerMetrics;
pub use provisioner::{DeletionGuard, ProvisionOptions, Provisioner, Qualifier};
pub use retry::{FailureBackoff, PvSaveStrategy};
/// Waits for SIGTERM or SIGINT: the `shutdown` future to pass to
/// [`ProvisionController::run`] (see [`signal::shutdown_signal`]).
pub use signal::shutdown_signal;
