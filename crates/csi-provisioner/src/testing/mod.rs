//! Test support (feature `testing`): [`MockCsiDriver`], a CSI driver served over gRPC on a
//! unix socket, with injectable delays, errors, late landings and crashes.
//!
//! Enable the feature in `[dev-dependencies]` only:
//!
//! ```toml
//! [dev-dependencies]
//! csi-provisioner = { path = "...", features = ["testing"] }
//! ```

mod mock;

pub use mock::{AccessibleTopology, Answer, CsiMethod, MockCsiDriver, MockVolume, VolumeContext};
