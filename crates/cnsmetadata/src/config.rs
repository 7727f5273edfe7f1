//! Options of the `CnsVolumeMetadata` reconciler.

use std::{num::NonZeroU16, time::Duration};

use crate::backend::ClusterFlavor;

/// Environment variable with the number of workers (Go: `WORKER_THREADS_VOLUME_METADATA`).
pub const ENV_WORKER_THREADS: &str = "WORKER_THREADS_VOLUME_METADATA";
/// Environment variable with the cluster flavor (Go: `CLUSTER_FLAVOR`).
pub const ENV_CLUSTER_FLAVOR: &str = "CLUSTER_FLAVOR";
/// CSI driver whose volumes are pushed to CNS; PVs of other drivers are skipped.
pub const VSPHERE_CSI_DRIVER: &str = "csi.vsphere.vmware.com";

/// Why a [`Config`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable read by [`Config::from_lookup`] has a value that cannot be used.
    #[error("environment variable {variable}={value:?} is invalid: expected {expected}")]
    InvalidVariable {
        /// The variable name.
        variable: &'static str,
        /// The value it had.
        value: String,
        /// What a valid value looks like.
        expected: &'static str,
    },
    /// The cluster ID that PV entity references would get is empty.
    #[error(
        "the {which} is empty, but PERSISTENT_VOLUME entity references get it as their cluster id"
    )]
    MissingClusterId {
        /// `"supervisor id"` or `"cluster id"`.
        which: &'static str,
    },
}

/// Options of [`run`](crate::run); every field has a documented default.
///
/// The library never reads the environment: binaries call [`Config::from_lookup`] with
/// `std::env::var`, tests with a map.
#[derive(Clone, Debug)]
pub struct Config {
    cluster_flavor: ClusterFlavor,
    worker_threads: NonZeroU16,
    use_supervisor_id_for_pv: bool,
    supervisor_id: String,
    cluster_id: String,
    vsphere_user: String,
    csi_driver: String,
    backend_timeout: Duration,
    settle_margin: Duration,
    reporting_instance: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_flavor: ClusterFlavor::Workload,
            worker_threads: Self::DEFAULT_WORKER_THREADS,
            use_supervisor_id_for_pv: false,
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
    /// Default for [`Config::worker_threads`] (Go: `defaultMaxWorkerThreadsToProcessCnsVolumeMetadata`).
    pub const DEFAULT_WORKER_THREADS: NonZeroU16 = NonZeroU16::new(3).expect("3 is not zero");
    /// Largest worker count [`Config::from_lookup`] accepts (upstream caps it at the default).
    pub const MAX_WORKER_THREADS: u16 = 3;
    /// Default for [`Config::backend_timeout`].
    pub const DEFAULT_BACKEND_TIMEOUT: Duration = Duration::from_secs(120);
    /// Default for [`Config::settle_margin`]: four default leader lease durations (15 s).
    pub const DEFAULT_SETTLE_MARGIN: Duration = Duration::from_secs(60);

    /// Reads the environment through `lookup` (`std::env::var(..).ok()` in a binary):
    ///
    /// - `WORKER_THREADS_VOLUME_METADATA`: workers, 1 to 3; unset or empty means 3.
    /// - `CLUSTER_FLAVOR`: `WORKLOAD`, `GUEST_CLUSTER` or `VANILLA`; unset or empty keeps
    ///   the default `WORKLOAD` (upstream's CSI driver treats unset as `VANILLA`, which would
    ///   turn this reconciler off).
    ///
    /// Every other option keeps its default; set it with the setters.
    ///
    /// # Errors
    /// [`ConfigError::InvalidVariable`] naming the variable and its value. Go logged a
    /// warning and used the default instead.
    #[doc(alias = "getMaxWorkerThreadsToReconcileCnsVolumeMetadata")]
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(value) = lookup(ENV_WORKER_THREADS).filter(|v| !v.is_empty()) {
            config.worker_threads = value
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|n| *n <= Self::MAX_WORKER_THREADS)
                .and_then(NonZeroU16::new)
                .ok_or(ConfigError::InvalidVariable {
                    variable: ENV_WORKER_THREADS,
                    value,
                    expected: "a whole number from 1 to 3",
                })?;
        }
        if let Some(value) = lookup(ENV_CLUSTER_FLAVOR).filter(|v| !v.is_empty()) {
            config.cluster_flavor =
                ClusterFlavor::parse(value.trim()).ok_or(ConfigError::InvalidVariable {
                    variable: ENV_CLUSTER_FLAVOR,
                    value,
                    expected: "WORKLOAD, GUEST_CLUSTER or VANILLA",
                })?;
        }
        Ok(config)
    }

    /// Checks options that depend on each other; [`run`](crate::run) calls it first.
    ///
    /// # Errors
    /// [`ConfigError::MissingClusterId`] when the ID that PV entity references get is empty.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pv_reference_cluster_id().is_empty() {
            let which = if self.use_supervisor_id_for_pv {
                "supervisor id"
            } else {
                "cluster id"
            };
            return Err(ConfigError::MissingClusterId { which });
        }
        Ok(())
    }

    /// Flavor of the cluster this process runs in. Only [`ClusterFlavor::Workload`] runs
    /// the reconciler. Default `WORKLOAD`.
    #[must_use]
    pub fn cluster_flavor(mut self, flavor: ClusterFlavor) -> Self {
        self.cluster_flavor = flavor;
        self
    }

    /// Number of objects reconciled at once. Default 3.
    #[must_use]
    pub fn worker_threads(mut self, n: NonZeroU16) -> Self {
        self.worker_threads = n;
        self
    }

    /// Give entity references of PV entities the supervisor ID instead of the cluster ID
    /// (Go: the `TKGsHA` feature state). Default off.
    #[must_use]
    pub fn use_supervisor_id_for_pv(mut self, on: bool) -> Self {
        self.use_supervisor_id_for_pv = on;
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

    /// Margin added to [`backend_timeout`](Self::backend_timeout()) to give the
    /// [settle period](Self::get_settle_period) of removed entries. Default 60 s.
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

    /// See [`Config::cluster_flavor`](Self::cluster_flavor()).
    #[must_use]
    pub fn get_cluster_flavor(&self) -> ClusterFlavor {
        self.cluster_flavor
    }

    /// See [`Config::worker_threads`](Self::worker_threads()).
    #[must_use]
    pub fn get_worker_threads(&self) -> NonZeroU16 {
        self.worker_threads
    }

    /// The cluster ID that entity references of PV entities get.
    #[must_use]
    pub fn pv_reference_cluster_id(&self) -> &str {
        if self.use_supervisor_id_for_pv {
            &self.supervisor_id
        } else {
            &self.cluster_id
        }
    }

    /// See [`Config::vsphere_user`](Self::vsphere_user()).
    #[must_use]
    pub fn get_vsphere_user(&self) -> &str {
        &self.vsphere_user
    }

    /// See [`Config::csi_driver`](Self::csi_driver()).
    #[must_use]
    pub fn get_csi_driver(&self) -> &str {
        &self.csi_driver
    }

    /// See [`Config::backend_timeout`](Self::backend_timeout()).
    #[must_use]
    pub fn get_backend_timeout(&self) -> Duration {
        self.backend_timeout
    }

    /// See [`Config::settle_margin`](Self::settle_margin()).
    #[must_use]
    pub fn get_settle_margin(&self) -> Duration {
        self.settle_margin
    }

    /// How long after removing an entity from CNS its removal is sent again: the
    /// [backend timeout](Self::backend_timeout()) plus the
    /// [settle margin](Self::settle_margin()) (3 min by default).
    #[must_use]
    pub fn get_settle_period(&self) -> Duration {
        self.backend_timeout.saturating_add(self.settle_margin)
    }

    /// See [`Config::reporting_instance`](Self::reporting_instance()).
    #[must_use]
    pub fn get_reporting_instance(&self) -> Option<&str> {
        self.reporting_instance.as_deref()
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
        assert_eq!(config.get_worker_threads().get(), 3);
        assert_eq!(config.get_cluster_flavor(), ClusterFlavor::Workload);
        assert_eq!(config.get_csi_driver(), "csi.vsphere.vmware.com");
        assert_eq!(config.get_settle_period(), Duration::from_secs(180));
        let short = config
            .backend_timeout(Duration::from_secs(5))
            .settle_margin(Duration::from_secs(15));
        assert_eq!(short.get_settle_margin(), Duration::from_secs(15));
        assert_eq!(short.get_settle_period(), Duration::from_secs(20));
        let empty = Config::from_lookup(lookup(&[(ENV_WORKER_THREADS, "")])).unwrap();
        assert_eq!(empty.get_worker_threads().get(), 3);
    }

    #[test]
    fn worker_threads_from_one_to_three_are_used() {
        for (value, expected) in [("1", 1), ("2", 2), ("3", 3), (" 2 ", 2)] {
            let config = Config::from_lookup(lookup(&[(ENV_WORKER_THREADS, value)])).unwrap();
            assert_eq!(
                config.get_worker_threads().get(),
                expected,
                "value {value:?}"
            );
        }
    }

    #[test]
    fn bad_worker_threads_name_the_variable_and_value() {
        for value in ["0", "-1", "4", "many", "2.5"] {
            let error = Config::from_lookup(lookup(&[(ENV_WORKER_THREADS, value)])).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "environment variable WORKER_THREADS_VOLUME_METADATA={value:?} is invalid: \
                     expected a whole number from 1 to 3"
                )
            );
        }
    }

    #[test]
    fn cluster_flavor_is_read_and_checked() {
        let config = Config::from_lookup(lookup(&[(ENV_CLUSTER_FLAVOR, "VANILLA")])).unwrap();
        assert_eq!(config.get_cluster_flavor(), ClusterFlavor::Vanilla);
        let error = Config::from_lookup(lookup(&[(ENV_CLUSTER_FLAVOR, "wcp")])).unwrap_err();
        assert_eq!(
            error,
            ConfigError::InvalidVariable {
                variable: "CLUSTER_FLAVOR",
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
    fn validate_rejects_an_empty_selected_id() {
        let config = Config::default()
            .cluster_id("cl-1")
            .use_supervisor_id_for_pv(true);
        assert_eq!(
            config.validate(),
            Err(ConfigError::MissingClusterId {
                which: "supervisor id"
            })
        );
        assert!(Config::default().validate().is_err());
    }
}
