//! [`Health`]: the replica's readiness as `/readyz` serves it, shared with the rest of the
//! process.

use crate::Leading;

/// The replica's readiness and role as the controller's probes serve them (`/readyz`),
/// shared with the rest of the process: cheap to clone, every clone is the same state.
///
/// Hand one to [`ProvisionController::health`](crate::ProvisionController::health) when
/// another part of the process must follow this controller's election
/// ([`leading`](Self::leading)) or hold `/readyz` back until a condition of its own is met
/// ([`set_unmet`](Self::set_unmet)).
///
/// ```
/// use provision_controller::Health;
///
/// let health = Health::new();
/// let leading = health.leading(); // for a controller that runs under this election
/// assert!(!leading.is_leading());
/// health.set_unmet("crd", Some("the CRD is not installed"));
/// assert!(health.readiness().is_err()); // starting, then the unmet condition
/// ```
#[derive(Clone, Debug, Default)]
pub struct Health(kube_controller_kit::http::Health);

impl Health {
    /// Starting, caches not synced, no condition unmet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether this replica leads now.
    #[must_use]
    pub fn is_leading(&self) -> bool {
        self.0.role() == kube_controller_kit::http::Role::Leading
    }

    /// Follows the controller's election: leading while this replica holds the lease (or
    /// runs without leader election), never again once every clone of this handle is
    /// dropped.
    #[must_use]
    pub fn leading(&self) -> Leading {
        self.0.leading()
    }

    /// Records that the condition `name` of another part of the process is unmet, with the
    /// text `/readyz` reports (`Some`), or met again (`None`).
    pub fn set_unmet(&self, name: &'static str, unmet: Option<&'static str>) {
        self.0.set_unmet(name, unmet);
    }

    /// What `/readyz` reports.
    ///
    /// # Errors
    /// The reason `/readyz` answers 503, in words: starting or stopping, caches not
    /// synced, a blocked leader election (what to do), or the first unmet condition.
    pub fn readiness(&self) -> Result<(), String> {
        self.0
            .readiness()
            .map_err(|not_ready| not_ready.to_string())
    }

    pub(crate) fn into_inner(self) -> kube_controller_kit::http::Health {
        self.0
    }
}
