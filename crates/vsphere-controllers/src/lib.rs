//! The vSphere application: the CNS provisioner ([`provision_controller`] driving
//! [`vsphere_cns::CnsProvisioner`]) and the `CnsVolumeMetadata` reconciler ([`cnsmetadata`]
//! driving [`vsphere_cns::CnsMetadataBackend`]), wired as one process.
//!
//! `cargo run --example vsphere` is a thin binary over this crate: it parses its flags
//! (`--datastore` with [`parse_datastore`]) into [`Options`] and calls [`run`] with a lookup
//! of its environment. [`run`] chooses the mode ([`select_mode`]), then runs
//! [`connect_real`] and [`start_controllers`] against a real cluster and vCenter, or
//! [`run_demo`] against kube-sim and the CNS simulator.
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
//! running.run_until(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```

mod app;
mod demo;
mod run;

pub use app::{
    DEFAULT_VSPHERE_CONFIG, DEMO_BANNER, Found, Mode, Real, RealOptions, Running, Settings,
    connect_real, exists, select_mode, start_controllers,
};
pub use demo::{CLASS, DemoOptions, DemoReport, Row, run_demo};
pub use run::{Options, RunError, parse_datastore, run};

/// The example of README.md, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
