#![doc = include_str!("../README.md")]

mod client;
pub mod config;
mod connection;
mod error;
mod metadata;
mod provisioner;
mod secret;
#[cfg(feature = "simulator")]
pub mod simulator;
mod soap;
mod tls;
pub mod wire;
mod xml;

pub use client::{CnsClient, SESSION_COOKIE};
pub use config::{ConfigError, VsphereConfig};
pub use connection::VirtualCenterConfig;
pub use error::{Error, Result};
pub use metadata::CnsMetadataBackend;
pub use provisioner::{
    CSI_DRIVER, CnsProvisioner, DEFAULT_FS_TYPE, PARAM_DATASTORE_MOREF, PARAM_DATASTORE_URL,
    PARAM_FS_TYPE, PARAM_FS_TYPE_DEPRECATED, PARAM_STORAGE_POLICY_ID, PARAM_STORAGE_POLICY_NAME,
    ProvisionerError,
};
pub use secret::Secret;
#[cfg(feature = "simulator")]
pub use simulator::CnsSimulator;
pub use tls::{Thumbprint, TlsMode};
pub use wire::{ClusterFlavor, CnsVolumeId, MoRef};

/// Locks `mutex`, using it as is when a panic poisoned it: every lock of this crate guards
/// plain values that a panic cannot leave half-updated.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
