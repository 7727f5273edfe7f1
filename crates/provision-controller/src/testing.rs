//! Test kit (feature `testing`, which brings kube-sim): [`DriverTest`], a driver's
//! controller against an in-process API server; the driver [`conformance`] suite; a
//! recording [`FakeProvisioner`] with scripted results; chainable builders [`pvc`],
//! [`pv`], [`class`].
//!
//! A driver's test, whole (a claim of the [`TEST_CLASS`] provisioned, bound, deleted):
//!
//! ```
//! use provision_controller::testing::{DriverTest, FakeProvisioner, pvc};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> { a_claim_binds().await }
//! // In a test file, under `#[tokio::test]`:
//! async fn a_claim_binds() -> Result<(), Box<dyn std::error::Error>> {
//!     let my_driver = FakeProvisioner::new(); // your Provisioner
//!     let test = DriverTest::start("example.com/my-driver", my_driver).await?;
//!     let volume = test.provision(pvc("data").request("5Gi")).await?;
//!     let spec = volume.spec.unwrap_or_default();
//!     assert_eq!(spec.capacity.unwrap_or_default()["storage"].0, "5Gi");
//!     test.delete(&pvc("data").build()).await?;
//!     Ok(test.stop().await?)
//! }
//! ```
//!
//! ```
//! use provision_controller::testing::{class, pvc, FakeProvisioner, ProvisionStep};
//!
//! let claim = pvc("data").namespace("apps").storage_class("fast").build();
//! let fast = class("fast").provisioner("example.com/fake").wait_for_first_consumer().build();
//! let fake = FakeProvisioner::new().script_provision([ProvisionStep::InBackground]);
//! # let _ = (claim, fast, fake);
//! ```

mod builders;
pub mod conformance;
mod harness;

pub use builders::{ClassBuilder, PvBuilder, PvcBuilder, class, pv, pvc};
pub use harness::{DEFAULT_LIMIT, DriverTest, HarnessError, TEST_CLASS};

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use async_trait::async_trait;
use k8s_openapi::{
    api::core::v1::{HostPathVolumeSource, PersistentVolume, PersistentVolumeSpec},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use tokio::sync::watch;

use crate::{AssetLookup, DeleteError, LateAssets, ProvisionError, ProvisionOptions, Provisioner};

/// What the next [`FakeProvisioner::provision`] call does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProvisionStep {
    /// Create the asset and return its PV (also what happens when the script is empty).
    /// For a lookup ([`AssetLookup::find`]) only an asset that exists (or that an earlier
    /// [`InBackground`](Self::InBackground) answer said is being made) is returned; with
    /// none, the lookup answers `None` and creates nothing, as the contract asks.
    Succeed,
    /// Return [`ProvisionError::InBackground`].
    InBackground,
    /// Return [`ProvisionError::Failed`].
    Failed,
    /// Return [`ProvisionError::NoChange`].
    NoChange,
    /// Return [`ProvisionError::Reschedule`].
    Reschedule,
    /// Return [`ProvisionError::Ignored`].
    Ignored,
    /// Return [`ProvisionError::Infeasible`].
    Infeasible,
    /// Panic.
    Panic,
    /// Never return (to exercise timeouts).
    Hang,
    /// Create the asset, then wait until [`FakeProvisioner::unblock`] before returning its
    /// PV: a backend call in flight, for crash and shutdown tests.
    Block,
}

/// What the next [`FakeProvisioner::delete`] (or, with
/// [`FakeProvisioner::script_volume_saved`], `volume_saved`) call does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeleteStep {
    /// Delete the asset (also what happens when the script is empty).
    Succeed,
    /// Return [`DeleteError::Failed`].
    Fail,
    /// Return [`DeleteError::Ignored`].
    Ignored,
}

#[derive(Default)]
struct State {
    provision_script: VecDeque<ProvisionStep>,
    delete_script: VecDeque<DeleteStep>,
    provision_calls: Vec<ProvisionOptions>,
    delete_calls: Vec<String>,
    saved_script: VecDeque<DeleteStep>,
    saved_calls: Vec<PersistentVolume>,
    assets: BTreeSet<String>,
    /// Assets an [`ProvisionStep::InBackground`] answer said are being made: a cleanup's
    /// lookup finds them (the backend finishes them).
    in_background: BTreeSet<String>,
}

/// The gate of [`ProvisionStep::Block`] calls.
struct Gate {
    open: watch::Sender<bool>,
    blocked: watch::Sender<usize>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            open: watch::Sender::new(false),
            blocked: watch::Sender::new(0),
        }
    }
}

/// A [`Provisioner`] that records its calls, keeps a set of "assets" (PV names) and
/// follows scripts. Clones share their state.
#[derive(Clone, Default)]
pub struct FakeProvisioner {
    state: Arc<Mutex<State>>,
    gate: Arc<Gate>,
    block: bool,
    late_window: Option<std::time::Duration>,
}

impl FakeProvisioner {
    /// A provisioner that succeeds at everything and does not support block volumes.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// Claims `supports_block() == true`.
    #[must_use]
    pub fn with_block_support(mut self) -> Self {
        self.block = true;
        self
    }
    /// Answers [`LateAssets::window`] `== Some(window)` (default `None`), so a controller
    /// given this fake as its [`late_assets`](crate::ProvisionController::late_assets)
    /// keeps its journal entries until the window has passed and calls `volume_saved`
    /// again then.
    #[must_use]
    pub fn with_late_asset_window(mut self, window: std::time::Duration) -> Self {
        self.late_window = Some(window);
        self
    }
    /// Appends steps for the next `provision` calls.
    #[must_use]
    pub fn script_provision(self, steps: impl IntoIterator<Item = ProvisionStep>) -> Self {
        self.lock().provision_script.extend(steps);
        self
    }
    /// Appends steps for the next `delete` calls.
    #[must_use]
    pub fn script_delete(self, steps: impl IntoIterator<Item = DeleteStep>) -> Self {
        self.lock().delete_script.extend(steps);
        self
    }
    /// Appends steps for the next `volume_saved` calls (`Succeed` and `Ignored` change
    /// nothing: the fake holds one asset per PV name).
    #[must_use]
    pub fn script_volume_saved(self, steps: impl IntoIterator<Item = DeleteStep>) -> Self {
        self.lock().saved_script.extend(steps);
        self
    }
    /// Every `volume_saved` call so far, in order: the saved PV as the controller passed it.
    #[must_use]
    pub fn volume_saved_calls(&self) -> Vec<PersistentVolume> {
        self.lock().saved_calls.clone()
    }
    /// Every `provision` call so far, in order.
    #[must_use]
    pub fn provision_calls(&self) -> Vec<ProvisionOptions> {
        self.lock().provision_calls.clone()
    }
    /// The volume names of every `delete` call so far, in order.
    #[must_use]
    pub fn delete_calls(&self) -> Vec<String> {
        self.lock().delete_calls.clone()
    }
    /// The assets that exist now (created and not deleted).
    #[must_use]
    pub fn assets(&self) -> BTreeSet<String> {
        self.lock().assets.clone()
    }
    /// Waits until at least `n` [`ProvisionStep::Block`] calls are blocked right now.
    pub async fn wait_blocked(&self, n: usize) {
        let mut rx = self.gate.blocked.subscribe();
        // The sender lives in `self`, so the wait cannot fail.
        let _ = rx.wait_for(|blocked| *blocked >= n).await;
    }
    /// Lets every blocked call return, and every later [`ProvisionStep::Block`] pass at once.
    pub fn unblock(&self) {
        self.gate.open.send_replace(true);
    }
    /// Adds an asset, as if an earlier run had created it.
    pub fn add_asset(&self, name: &str) {
        self.lock().assets.insert(name.to_owned());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is impossible: the scripted panic happens after.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl Provisioner for FakeProvisioner {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        self.answer(options, false)
            .await?
            .ok_or_else(|| ProvisionError::Ignored {
                reason: format!("fake: no asset {}", options.pv_name),
            })
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        let mut state = self.lock();
        state.delete_calls.push(name.clone());
        match state
            .delete_script
            .pop_front()
            .unwrap_or(DeleteStep::Succeed)
        {
            DeleteStep::Succeed => {
                state.assets.remove(&name);
                Ok(())
            }
            DeleteStep::Fail => Err(DeleteError::Failed("fake: delete failed".into())),
            DeleteStep::Ignored => Err(DeleteError::Ignored {
                reason: "fake: not mine".into(),
            }),
        }
    }

    fn supports_block(&self) -> bool {
        self.block
    }
}

/// A lookup follows the provision script as a `provision` call does (it is recorded in
/// [`FakeProvisioner::provision_calls`] and takes the next step), but a step that would
/// create an asset finds none instead.
#[async_trait]
impl AssetLookup for FakeProvisioner {
    async fn find(
        &self,
        options: &ProvisionOptions,
    ) -> Result<Option<PersistentVolume>, ProvisionError> {
        self.answer(options, true).await
    }
}

#[async_trait]
impl LateAssets for FakeProvisioner {
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), DeleteError> {
        let mut state = self.lock();
        state.saved_calls.push(saved.clone());
        match state
            .saved_script
            .pop_front()
            .unwrap_or(DeleteStep::Succeed)
        {
            DeleteStep::Succeed => Ok(()),
            DeleteStep::Fail => Err(DeleteError::Failed(
                "fake: releasing other assets failed".into(),
            )),
            DeleteStep::Ignored => Err(DeleteError::Ignored {
                reason: "fake: not mine".into(),
            }),
        }
    }

    fn window(&self) -> Option<std::time::Duration> {
        self.late_window
    }
}

impl FakeProvisioner {
    /// A `provision` call, or a lookup (`lookup`: creates nothing, `None` when no asset
    /// exists).
    async fn answer(
        &self,
        options: &ProvisionOptions,
        lookup: bool,
    ) -> Result<Option<PersistentVolume>, ProvisionError> {
        let step = {
            let mut state = self.lock();
            state.provision_calls.push(options.clone());
            let step = state
                .provision_script
                .pop_front()
                .unwrap_or(ProvisionStep::Succeed);
            if step == ProvisionStep::InBackground {
                state.in_background.insert(options.pv_name.clone());
            }
            // A lookup finds the asset and creates none.
            if lookup
                && step == ProvisionStep::Succeed
                && !state.assets.contains(&options.pv_name)
                && !state.in_background.contains(&options.pv_name)
            {
                return Ok(None);
            }
            if matches!(step, ProvisionStep::Succeed | ProvisionStep::Block) {
                state.in_background.remove(&options.pv_name);
                state.assets.insert(options.pv_name.clone());
            }
            step
        };
        let err = |msg: &str| -> crate::error::BoxError { msg.into() };
        match step {
            ProvisionStep::Succeed => Ok(Some(volume_for(options))),
            ProvisionStep::InBackground => Err(ProvisionError::InBackground(err(
                "fake: still provisioning",
            ))),
            ProvisionStep::Failed => Err(ProvisionError::Failed(err("fake: provisioning failed"))),
            ProvisionStep::NoChange => Err(ProvisionError::NoChange(err("fake: no change"))),
            ProvisionStep::Reschedule => Err(ProvisionError::Reschedule(err(
                "fake: node cannot host the volume",
            ))),
            ProvisionStep::Ignored => Err(ProvisionError::Ignored {
                reason: "fake: not mine".into(),
            }),
            ProvisionStep::Infeasible => Err(ProvisionError::Infeasible(err(
                "fake: the request cannot be served",
            ))),
            ProvisionStep::Panic => panic!("fake provisioner panicked as scripted"),
            ProvisionStep::Hang => std::future::pending().await,
            ProvisionStep::Block => {
                let mut open = self.gate.open.subscribe();
                self.gate.blocked.send_modify(|n| *n += 1);
                // Counted down also when the call is dropped (a controller stopped mid-call).
                let _blocked = scopeguard(&self.gate.blocked);
                let _ = open.wait_for(|open| *open).await;
                Ok(Some(volume_for(options)))
            }
        }
    }
}

/// Decrements the blocked-call count when dropped.
struct Blocked<'a>(&'a watch::Sender<usize>);

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn scopeguard(blocked: &watch::Sender<usize>) -> Blocked<'_> {
    Blocked(blocked)
}

/// The PV a simple driver would return: capacity, access modes and volume mode from the
/// claim, reclaim policy and mount options from the class, a host-path source.
#[must_use]
pub fn volume_for(options: &ProvisionOptions) -> PersistentVolume {
    let claim_spec = options.claim.spec.clone().unwrap_or_default();
    let capacity = claim_spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage").cloned())
        .unwrap_or_else(|| Quantity("1Gi".into()));
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(options.pv_name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_owned(), capacity)])),
            access_modes: claim_spec
                .access_modes
                .or_else(|| Some(vec!["ReadWriteOnce".into()])),
            volume_mode: claim_spec.volume_mode,
            persistent_volume_reclaim_policy: Some(
                options
                    .storage_class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".into()),
            ),
            mount_options: options.storage_class.mount_options.clone(),
            host_path: Some(HostPathVolumeSource {
                path: format!("/fake/{}", options.pv_name),
                type_: None,
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}
