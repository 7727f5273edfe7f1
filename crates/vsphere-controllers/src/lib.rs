//! The vSphere application: the CNS provisioner ([`provision_controller`] driving
//! [`vsphere_cns::CnsProvisioner`]) and the `CnsVolumeMetadata` reconciler ([`cnsmetadata`]
//! driving [`vsphere_cns::CnsMetadataBackend`]), wired as one process.
//!
//! [`run`] chooses the mode ([`select_mode`]), then runs [`connect_real`] and
//! [`start_controllers`] against a real cluster and vCenter, or (feature `demo`) `run_demo`
//! against kube-sim and the CNS simulator, until its shutdown future completes (a binary
//! passes [`shutdown_signal`]: SIGTERM and SIGINT both start the graceful stop, bounded by
//! [`Settings::stop_deadline`]). [`uninstall`] removes what the provision controller leaves
//! in the cluster once it no longer runs; [`rbac`] lists the API permissions both
//! controllers use. With feature `cli`, `cli::Cli` is the whole command line of
//! `cargo run --example vsphere` (which turns on `demo` and `cli`).
//!
//! # Features
//! - `demo`: `run_demo`, and [`run`] without configuration runs it (else that is a usage
//!   error); pulls kube-sim and vsphere-cns's `simulator`.
//! - `cli`: the `cli` module (clap).
//!
//! # One leader
//! With [`Settings::leader_election`] on (the binary's default), the provision controller
//! elects a leader on a Lease, and the `CnsVolumeMetadata` reconciler reconciles only while
//! this replica leads, as upstream runs it; standbys keep their caches warm, so a failover
//! starts from full caches.
//!
//! ```no_run
//! # async fn doc(kube: kube_client::Client, cns: vsphere_cns::CnsClient, settings: vsphere_controllers::Settings) -> anyhow::Result<()> {
//! use vsphere_cns::{ClusterFlavor, CnsMetadataBackend, CnsProvisioner};
//!
//! let provisioner = CnsProvisioner::new(cns.clone(), "cluster-1", ClusterFlavor::Workload)?;
//! let backend = CnsMetadataBackend::new(cns);
//! let running = vsphere_controllers::start_controllers(kube, provisioner, backend, &settings);
//! let signal = vsphere_controllers::shutdown_signal()?;
//! running.run_until(async { signal.await; }).await?;
//! # Ok(()) }
//! ```

mod app;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "demo")]
mod demo;
pub mod flags;
pub mod rbac;
mod run;
mod uninstall;
mod upstream;

pub use app::{
    DEFAULT_VSPHERE_CONFIG, DEMO_BANNER, Found, LOGOUT_TIMEOUT, Mode, Real, RealOptions, Running,
    STOP_MARGIN, Settings, connect_real, exists, kube_config, reachable, select_mode,
    start_controllers,
};
#[cfg(feature = "demo")]
pub use demo::{CLASS, DemoOptions, DemoReport, Row, run_demo};
pub use kube_controller_kit::signal::{Signal, shutdown_signal};
pub use run::{Options, RunError, parse_datastore, run};
pub use uninstall::{UninstallOptions, uninstall};
pub use upstream::{
    CRD_ESTABLISHED_TIMEOUT, CRD_MANIFEST, CRD_NOT_READY, CRD_RETRY_FIRST, CRD_RETRY_MAX,
    DEFAULT_FSS_NAME, DEFAULT_FSS_NAMESPACE, DEFAULT_SUPERVISOR_FSS_NAME, FEATURE_STATES_NOT_READY,
    FeatureStates, TKGS_HA, install_crd, parse_feature_state, watch_feature_states,
};

/// The example of README.md, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
