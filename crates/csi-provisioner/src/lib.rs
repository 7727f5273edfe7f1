//! A CSI external-provisioner on provision-controller: the counterpart of
//! kubernetes-csi/external-provisioner, with provision-controller's guarantees (no volume
//! leaked on restart, timeout or concurrent deletion) for every CSI driver.

pub mod csi;
pub mod start;

#[cfg(feature = "testing")]
pub mod testing;
