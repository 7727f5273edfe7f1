//! Options of the `CnsVolumeMetadata` reconciler.

use std::{num::NonZeroU16, time::Duration};

use crate::backend::ClusterFlavor;

/// CSI driver whose volumes are pushed to CNS; PVs of other drivers are skipped.
pub const VSPHERE_CSI_DRIVER: &str = "csi.vsphere.vmware.com";

/// A feature state that may change while the reconciler runs: fixed, or following a
/// [`watch`](tokio::sync::watch) channel that its owner updates (the vSphere binary feeds
/// it from upstream's feature-state ConfigMap). Read where it is used, so each reconcile
/// sees the state of its time, as upstream reads `IsFSSEnabled` at every reconcile.
#[derive(Clone)]
pub struct FeatureState(State);

#[derive(Clone)]
enum State {
    Fixed(bool),
    Follow(tokio::sync::watch::Receiver<bool>),
}

impl FeatureState {
    /// A state that never changes.
    #[must_use]
    pub fn fixed(on: bool) -> Self {
        Self(State::Fixed(on))
    }

    /// A state that is whatever `receiver` holds now; its sender's owner changes it.
    #[must_use]
    pub fn follow(receiver: tokio::sync::watch::Receiver<bool>) -> Self {
        Self(State::Follow(receiver))
    }

    /// Whether the feature is on right now.
    #[must_use]
    pub fn is_on(&self) -> bool {
        match &self.0 {
            State::Fixed(on) => *on,
            State::Follow(receiver) => *receiver.borrow(),
        }
    }
}

impl From<bool> for FeatureState {
    fn from(on: bool) -> Self {
        Self::fixed(on)
    }
}

impl From<tokio::sync::watch::Receiver<bool>> for FeatureState {
    fn from(receiver: tokio::sync::watch::Receiver<bool>) -> Self {
        Self::follow(receiver)
    }
}

impl std::fmt::Debug for FeatureState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.0 {
            State::Fixed(_) => "fixed",
            State::Follow(_) => "followed",
        };
        write!(f, "FeatureState({kind}: {})", self.is_on())
    }
}

/// An option of [`Config`], as a [`ConfigError`] names it.
///
/// Displays as the Rust name (the `Config` field and builder method), followed by what the
/// Go driver calls it where it has a name (an environment variable, a key of
/// `csi-vsphere.conf`): `worker_threads (Go WORKER_THREADS_VOLUME_METADATA)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigOption {
    /// [`Config::cluster_flavor`](Config::cluster_flavor()).
    ClusterFlavor,
    /// [`Config::worker_threads`](Config::worker_threads()).
    WorkerThreads,
    /// [`Config::use_supervisor_id_for_pv`](Config::use_supervisor_id_for_pv()).
    UseSupervisorIdForPv,
    /// [`Config::supervisor_id`](Config::supervisor_id()).
    SupervisorId,
    /// [`Config::cluster_id`](Config::cluster_id()).
    ClusterId,
    /// [`Config::vsphere_user`](Config::vsphere_user()).
    VsphereUser,
    /// [`Config::csi_driver`](Config::csi_driver()).
    CsiDriver,
    /// [`Config::backend_timeout`](Config::backend_timeout()).
    BackendTimeout,
    /// [`Config::settle_margin`](Config::settle_margin()).
    SettleMargin,
    /// [`Config::reporting_instance`](Config::reporting_instance()).
    ReportingInstance,
}

impl ConfigOption {
    /// The `Config` field and builder method, e.g. `"worker_threads"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::ClusterFlavor => "cluster_flavor",
            Self::WorkerThreads => "worker_threads",
            Self::UseSupervisorIdForPv => "use_supervisor_id_for_pv",
            Self::SupervisorId => "supervisor_id",
            Self::ClusterId => "cluster_id",
            Self::VsphereUser => "vsphere_user",
            Self::CsiDriver => "csi_driver",
            Self::BackendTimeout => "backend_timeout",
            Self::SettleMargin => "settle_margin",
            Self::ReportingInstance => "reporting_instance",
        }
    }

    /// What the Go driver calls the option: the environment variable
    /// ([`Config::ENV_WORKER_THREADS`], [`Config::ENV_CLUSTER_FLAVOR`]), the `csi-vsphere.conf` key
    /// (`[Global] cluster-id`, `[Global] supervisor-id`) or the feature (`TKGsHA`); `None`
    /// for an option Go does not have.
    #[must_use]
    pub fn go_name(self) -> Option<&'static str> {
        match self {
            Self::ClusterFlavor => Some(Config::ENV_CLUSTER_FLAVOR),
            Self::WorkerThreads => Some(Config::ENV_WORKER_THREADS),
            Self::UseSupervisorIdForPv => Some("TKGsHA"),
            Self::SupervisorId => Some("[Global] supervisor-id"),
            Self::ClusterId => Some("[Global] cluster-id"),
            Self::VsphereUser => Some("[VirtualCenter] user"),
            Self::CsiDriver
            | Self::BackendTimeout
            | Self::SettleMargin
            | Self::ReportingInstance => None,
        }
    }
}

impl std::fmt::Display for ConfigOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        kube_controller_kit::write_option_name(f, self.name(), self.go_name())
    }
}

/// Why a [`Config`] cannot be used, naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable read by [`Config::from_lookup`] has a value that cannot be used.
    #[error(
        "environment variable {}={value:?} is invalid: expected {expected}",
        .option.go_name().unwrap_or(.option.name())
    )]
    InvalidVariable {
        /// The option the variable sets; its [`go_name`](ConfigOption::go_name) is the
        /// variable.
        option: ConfigOption,
        /// The value it had.
        value: String,
        /// What a valid value looks like.
        expected: &'static str,
    },
    /// One option has a value it cannot take (checked by [`Config::validate`]).
    #[error("invalid value for option {option}: {reason}")]
    Invalid {
        /// The option.
        option: ConfigOption,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigError {
    /// The option the error is about.
    #[must_use]
    pub fn option(&self) -> ConfigOption {
        match self {
            Self::InvalidVariable { option, .. } | Self::Invalid { option, .. } => *option,
        }
    }
}

/// Options of [`MetadataController::run`](crate::MetadataController::run); every option has a documented default.
///
/// Each option is a public field, read as `config.worker_threads`, and a builder
/// method of the same name, `.worker_threads(n)`. The library never reads the
/// environment: binaries call [`Config::from_lookup`] with `std::env::var`, tests
/// with a map.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Flavor of the cluster this process runs in. Only [`ClusterFlavor::Workload`] runs
    /// the reconciler. Default `WORKLOAD` for a `Config` built in code (building the
    /// reconciler means running it); [`Config::from_lookup`] reads
    /// [`Config::ENV_CLUSTER_FLAVOR`] as upstream does, unset meaning `VANILLA`.
    pub cluster_flavor: ClusterFlavor,
    /// Number of objects reconciled at once. Default 3 (environment:
    /// [`Config::ENV_WORKER_THREADS`]).
    pub worker_threads: NonZeroU16,
    /// Give entity references of PV entities the supervisor ID instead of the cluster ID
    /// (Go: the `TKGsHA` feature state, read at every reconcile). A `bool` for a fixed
    /// state, or a [`FeatureState::follow`] of a channel for one that changes while the
    /// reconciler runs. Default off.
    pub use_supervisor_id_for_pv: FeatureState,
    /// The supervisor ID (`[Global] supervisor-id` of `csi-vsphere.conf`). Default empty.
    pub supervisor_id: String,
    /// The cluster ID (`[Global] cluster-id` of `csi-vsphere.conf`). Default empty.
    pub cluster_id: String,
    /// The vCenter user sent in each update's container cluster. Default empty.
    pub vsphere_user: String,
    /// CSI driver whose volumes are pushed to CNS. Default `csi.vsphere.vmware.com`.
    pub csi_driver: String,
    /// Upper bound of one backend call; a call that takes longer fails that volume.
    /// Default 120 s.
    pub backend_timeout: Duration,
    /// Margin added to the [backend timeout](Self::backend_timeout()) to give the
    /// [settle period](Self::settle_period) of removed entries. Default 60 s.
    ///
    /// An update sent to CNS may still take effect after the call timed out, or after the
    /// replica that sent it lost its lease. So when a spec edit removes an entity from CNS,
    /// the record keeps it as a tombstone with the time of its removal; once the settle
    /// period has passed, the removal is sent once more (undoing an update that landed
    /// late) and the tombstone goes. Make the margin at least the leader election lease
    /// duration (15 s by default); a longer one only keeps tombstones longer.
    pub settle_margin: Duration,
    /// Reporting instance of published events (usually the pod name). Default none.
    pub reporting_instance: Option<String>,
}

// Each option's builder method, with the field's docs.
impl Config {
    /// Flavor of the cluster this process runs in. Only [`ClusterFlavor::Workload`] runs
    /// the reconciler. Default `WORKLOAD` for a `Config` built in code (building the
    /// reconciler means running it); [`Config::from_lookup`] reads
    /// [`Config::ENV_CLUSTER_FLAVOR`] as upstream does, unset meaning `VANILLA`.
    #[must_use]
    pub fn cluster_flavor(mut self, flavor: ClusterFlavor) -> Self {
        self.cluster_flavor = flavor;
        self
    }

    /// Number of objects reconciled at once. Default 3 (environment:
    /// [`Config::ENV_WORKER_THREADS`]).
    #[must_use]
    pub fn worker_threads(mut self, n: NonZeroU16) -> Self {
        self.worker_threads = n;
        self
    }

    /// Give entity references of PV entities the supervisor ID instead of the cluster ID
    /// (Go: the `TKGsHA` feature state, read at every reconcile). A `bool` for a fixed
    /// state, or a [`FeatureState::follow`] of a channel for one that changes while the
    /// reconciler runs. Default off.
    #[must_use]
    pub fn use_supervisor_id_for_pv(mut self, on: impl Into<FeatureState>) -> Self {
        self.use_supervisor_id_for_pv = on.into();
        self
    }

    /// The supervisor ID (`[Global] supervisor-id` of `csi-vsphere.conf`). Default empty.
    #[must_use]
    pub fn supervisor_id(mut self, id: impl Into<String>) -> Self {
        self.supervisor_id = id.into();
        self
    }

    /// The cluster ID (`[Global] cluster-id` of `csi-vsphere.conf`). Default empty.
    #[must_use]
    pub fn cluster_id(mut self, id: impl Into<String>) -> Self {
        self.cluster_id = id.into();
        self
    }

    /// The vCenter user sent in each update's container cluster. Default empty.
    #[must_use]
    pub fn vsphere_user(mut self, user: impl Into<String>) -> Self {
        self.vsphere_user = user.into();
        self
    }

    /// CSI driver whose volumes are pushed to CNS. Default `csi.vsphere.vmware.com`.
    #[must_use]
    pub fn csi_driver(mut self, driver: impl Into<String>) -> Self {
        self.csi_driver = driver.into();
        self
    }

    /// Upper bound of one backend call; a call that takes longer fails that volume.
    /// Default 120 s.
    #[must_use]
    pub fn backend_timeout(mut self, timeout: Duration) -> Self {
        self.backend_timeout = timeout;
        self
    }

    /// Margin added to the [backend timeout](Self::backend_timeout()) to give the
    /// [settle period](Self::settle_period) of removed entries. Default 60 s.
    ///
    /// An update sent to CNS may still take effect after the call timed out, or after the
    /// replica that sent it lost its lease. So when a spec edit removes an entity from CNS,
    /// the record keeps it as a tombstone with the time of its removal; once the settle
    /// period has passed, the removal is sent once more (undoing an update that landed
    /// late) and the tombstone goes. Make the margin at least the leader election lease
    /// duration (15 s by default); a longer one only keeps tombstones longer.
    #[must_use]
    pub fn settle_margin(mut self, margin: Duration) -> Self {
        self.settle_margin = margin;
        self
    }

    /// Reporting instance of published events (usually the pod name). Default none.
    #[must_use]
    pub fn reporting_instance(mut self, instance: impl Into<String>) -> Self {
        self.reporting_instance = Some(instance.into());
        self
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_flavor: ClusterFlavor::Workload,
            worker_threads: Self::DEFAULT_WORKER_THREADS,
            use_supervisor_id_for_pv: FeatureState::fixed(false),
            supervisor_id: String::new(),
            cluster_id: String::new(),
            vsphere_user: String::new(),
            csi_driver: VSPHERE_CSI_DRIVER.to_owned(),
            backend_timeout: Self::DEFAULT_BACKEND_TIMEOUT,
            settle_margin: Self::DEFAULT_SETTLE_MARGIN,
            reporting_instance: None,
        }
    }
}

impl Config {
    /// Environment variable [`Config::from_lookup`] reads the number of workers from
    /// (Go: `WORKER_THREADS_VOLUME_METADATA`).
    pub const ENV_WORKER_THREADS: &str = "WORKER_THREADS_VOLUME_METADATA";
    /// Environment variable [`Config::from_lookup`] reads the cluster flavor from (Go:
    /// `CLUSTER_FLAVOR`).
    pub const ENV_CLUSTER_FLAVOR: &str = "CLUSTER_FLAVOR";
    /// Default for [`Config::worker_threads`] (Go: `defaultMaxWorkerThreadsToProcessCnsVolumeMetadata`).
    pub const DEFAULT_WORKER_THREADS: NonZeroU16 = NonZeroU16::new(3).expect("3 is not zero");
    /// Largest worker count [`Config::from_lookup`] accepts: upstream HEAD takes any
    /// positive number (its reference copy capped it at 3), so does this reconciler, up to
    /// what a `u16` holds.
    pub const MAX_WORKER_THREADS: u16 = u16::MAX;
    /// Default for [`Config::backend_timeout`].
    pub const DEFAULT_BACKEND_TIMEOUT: Duration = Duration::from_secs(120);
    /// Default for [`Config::settle_margin`]: four default leader lease durations (15 s).
    pub const DEFAULT_SETTLE_MARGIN: Duration = Duration::from_secs(60);

    /// Reads the environment through `lookup` (`std::env::var(..).ok()` in a binary):
    ///
    /// - `WORKER_THREADS_VOLUME_METADATA`: workers, any whole number from 1 (upstream HEAD
    ///   takes any positive number; its older copy capped it at 3); unset or empty means 3.
    /// - `CLUSTER_FLAVOR`: `WORKLOAD`, `GUEST_CLUSTER` or `VANILLA`; unset or empty (or
    ///   blank) means `VANILLA`, as upstream's `GetClusterFlavor` (its vanilla manifest
    ///   leaves it unset), which turns this reconciler off: a supervisor's manifest sets
    ///   `WORKLOAD`.
    ///
    /// Every other option keeps its default; set it with the setters.
    ///
    /// # Errors
    /// [`ConfigError::InvalidVariable`] naming the variable and its value. Go logged a
    /// warning and used the default instead.
    #[doc(alias = "getMaxWorkerThreadsToReconcileCnsVolumeMetadata")]
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(value) = lookup(Config::ENV_WORKER_THREADS).filter(|v| !v.is_empty()) {
            config.worker_threads = value
                .trim()
                .parse::<u16>()
                .ok()
                .and_then(NonZeroU16::new)
                .ok_or(ConfigError::InvalidVariable {
                    option: ConfigOption::WorkerThreads,
                    value,
                    expected: "a whole number from 1 to 65535",
                })?;
        }
        config.cluster_flavor = ClusterFlavor::Vanilla;
        if let Some(value) = lookup(Config::ENV_CLUSTER_FLAVOR).filter(|v| !v.trim().is_empty()) {
            config.cluster_flavor =
                ClusterFlavor::parse(value.trim()).ok_or(ConfigError::InvalidVariable {
                    option: ConfigOption::ClusterFlavor,
                    value,
                    expected: "WORKLOAD, GUEST_CLUSTER or VANILLA",
                })?;
        }
        Ok(config)
    }

    /// Checks options that depend on each other. [`MetadataController::run`](crate::MetadataController::run) does not call it: as
    /// upstream, the reconciler runs with an empty ID, and only an object whose
    /// PERSISTENT_VOLUME references would get it fails (its reconcile returns
    /// an error naming this option, with a
    /// Warning event), since the feature state it depends on may change at any time.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming [`ConfigOption::ClusterId`] (or
    /// [`ConfigOption::SupervisorId`] with
    /// [`use_supervisor_id_for_pv`](Self::use_supervisor_id_for_pv())) when the ID that PV
    /// entity references get is empty.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pv_reference_cluster_id().is_empty() {
            let option = if self.use_supervisor_id_for_pv.is_on() {
                ConfigOption::SupervisorId
            } else {
                ConfigOption::ClusterId
            };
            return Err(ConfigError::Invalid {
                option,
                reason: "is empty, but PERSISTENT_VOLUME entity references get it as their \
                         cluster id"
                    .to_owned(),
            });
        }
        Ok(())
    }

    /// The cluster ID that entity references of PV entities get: the
    /// [supervisor ID](Self::supervisor_id()) with
    /// [`use_supervisor_id_for_pv`](Self::use_supervisor_id_for_pv()), else the
    /// [cluster ID](Self::cluster_id()).
    #[must_use]
    pub fn pv_reference_cluster_id(&self) -> &str {
        if self.use_supervisor_id_for_pv.is_on() {
            &self.supervisor_id
        } else {
            &self.cluster_id
        }
    }

    /// How long after removing an entity from CNS its removal is sent again: the
    /// [backend timeout](Self::backend_timeout()) plus the
    /// [settle margin](Self::settle_margin()) (3 min by default).
    #[must_use]
    pub fn settle_period(&self) -> Duration {
        self.backend_timeout.saturating_add(self.settle_margin)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn unset_variables_give_the_defaults() {
        let config = Config::from_lookup(lookup(&[])).unwrap();
        assert_eq!(config.worker_threads.get(), 3);
        assert_eq!(config.cluster_flavor, ClusterFlavor::Vanilla, "as upstream");
        for blank in ["", " "] {
            let config =
                Config::from_lookup(lookup(&[(Config::ENV_CLUSTER_FLAVOR, blank)])).unwrap();
            assert_eq!(config.cluster_flavor, ClusterFlavor::Vanilla, "{blank:?}");
        }
        assert_eq!(Config::default().cluster_flavor, ClusterFlavor::Workload);
        assert_eq!(config.csi_driver, "csi.vsphere.vmware.com");
        assert_eq!(config.settle_period(), Duration::from_secs(180));
        let short = config
            .backend_timeout(Duration::from_secs(5))
            .settle_margin(Duration::from_secs(15));
        assert_eq!(short.settle_margin, Duration::from_secs(15));
        assert_eq!(short.settle_period(), Duration::from_secs(20));
        let empty = Config::from_lookup(lookup(&[(Config::ENV_WORKER_THREADS, "")])).unwrap();
        assert_eq!(empty.worker_threads.get(), 3);
    }

    #[test]
    fn upstream_worker_thread_values_are_used() {
        // Upstream HEAD takes any positive number; an upstream manifest may set 10.
        for (value, expected) in [
            ("1", 1),
            ("2", 2),
            ("3", 3),
            (" 2 ", 2),
            ("4", 4),
            ("10", 10),
            ("65535", 65535),
        ] {
            let config =
                Config::from_lookup(lookup(&[(Config::ENV_WORKER_THREADS, value)])).unwrap();
            assert_eq!(config.worker_threads.get(), expected, "value {value:?}");
        }
    }

    #[test]
    fn bad_worker_threads_name_the_variable_and_value() {
        for value in ["0", "-1", "65536", "many", "2.5"] {
            let error =
                Config::from_lookup(lookup(&[(Config::ENV_WORKER_THREADS, value)])).unwrap_err();
            assert_eq!(error.option(), ConfigOption::WorkerThreads);
            assert_eq!(
                error.to_string(),
                format!(
                    "environment variable WORKER_THREADS_VOLUME_METADATA={value:?} is invalid: \
                     expected a whole number from 1 to 65535"
                )
            );
        }
    }

    #[test]
    fn cluster_flavor_is_read_and_checked() {
        let config =
            Config::from_lookup(lookup(&[(Config::ENV_CLUSTER_FLAVOR, "VANILLA")])).unwrap();
        assert_eq!(config.cluster_flavor, ClusterFlavor::Vanilla);
        let config =
            Config::from_lookup(lookup(&[(Config::ENV_CLUSTER_FLAVOR, "WORKLOAD")])).unwrap();
        assert_eq!(config.cluster_flavor, ClusterFlavor::Workload);
        let error =
            Config::from_lookup(lookup(&[(Config::ENV_CLUSTER_FLAVOR, "wcp")])).unwrap_err();
        assert_eq!(
            error,
            ConfigError::InvalidVariable {
                option: ConfigOption::ClusterFlavor,
                value: "wcp".into(),
                expected: "WORKLOAD, GUEST_CLUSTER or VANILLA",
            }
        );
    }

    #[test]
    fn pv_reference_cluster_id_follows_the_switch() {
        let config = Config::default().cluster_id("cl-1").supervisor_id("sv-1");
        assert_eq!(config.pv_reference_cluster_id(), "cl-1");
        assert_eq!(
            config
                .clone()
                .use_supervisor_id_for_pv(true)
                .pv_reference_cluster_id(),
            "sv-1"
        );
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn a_followed_feature_state_is_read_at_each_use() {
        let (switch, state) = tokio::sync::watch::channel(false);
        let config = Config::default()
            .cluster_id("cl-1")
            .supervisor_id("sv-1")
            .use_supervisor_id_for_pv(state);
        assert_eq!(config.pv_reference_cluster_id(), "cl-1");
        switch.send_replace(true);
        assert_eq!(config.pv_reference_cluster_id(), "sv-1");
        assert_eq!(
            format!("{:?}", config.use_supervisor_id_for_pv),
            "FeatureState(followed: true)"
        );
    }

    #[test]
    fn validate_rejects_an_empty_selected_id() {
        let config = Config::default()
            .cluster_id("cl-1")
            .use_supervisor_id_for_pv(true);
        let error = config.validate().unwrap_err();
        assert_eq!(error.option(), ConfigOption::SupervisorId);
        assert_eq!(
            error.to_string(),
            "invalid value for option supervisor_id (Go [Global] supervisor-id): is empty, \
             but PERSISTENT_VOLUME entity references get it as their cluster id"
        );
        assert_eq!(
            Config::default().validate().unwrap_err().option(),
            ConfigOption::ClusterId
        );
    }
}
