//! A CSI external-provisioner on provision-controller: the counterpart of
//! kubernetes-csi/external-provisioner, with provision-controller's guarantees (no volume
//! leaked on restart, timeout or concurrent deletion) for every CSI driver.
//!
//! [`CsiProvisioner`] is provision-controller's `Provisioner` for a CSI driver reached
//! through the [`csi::CsiDriver`] seam; [`CsiOptions`] holds upstream's flags that shape
//! requests and volumes; [`AttachedVolumeGuard`] keeps volumes still attached.

pub mod csi;
mod error;
mod guard;
mod provisioner;
pub mod rbac;
pub mod start;
mod topology;

#[cfg(feature = "testing")]
pub mod testing;

pub use error::CsiError;
pub use guard::AttachedVolumeGuard;
pub use provisioner::{
    CsiOptions, CsiProvisioner, DriverCapabilities, OptionsError, create_error,
    provisioner_identity,
};
pub use topology::TopologySettings;
