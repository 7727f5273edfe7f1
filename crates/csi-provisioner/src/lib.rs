//! A CSI external-provisioner on provision-controller: the counterpart of
//! kubernetes-csi/external-provisioner, with provision-controller's guarantees (no volume
//! leaked on restart, timeout or concurrent deletion) for every CSI driver.

pub mod csi;
// The provisioner (another branch) calls the functions of `topology`; until it is merged
// only the tests do.
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "called by the provisioner, merged separately")
)]
mod topology;

pub use topology::TopologySettings;
