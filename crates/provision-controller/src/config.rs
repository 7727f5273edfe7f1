//! [`Config`]: every option of the Go controller, with its default.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr},
    num::{NonZeroU16, NonZeroUsize},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::{
    LeaderElection,
    error::{ConfigError, ConfigOption},
    retry::{self, FailureBackoff, PvSaveStrategy},
};

/// Computes the PV name for a claim (Go `getProvisionedVolumeNameForClaim`, `VolumeNameHook`).
#[doc(alias = "VolumeNameHook")]
#[derive(Clone)]
pub struct VolumeNamer(Arc<dyn Fn(&PersistentVolumeClaim) -> String + Send + Sync>);

impl VolumeNamer {
    /// A hook from a closure; the name must be unique per claim and stable across calls.
    #[must_use]
    pub fn new(f: impl Fn(&PersistentVolumeClaim) -> String + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
    /// The name for `claim`.
    #[must_use]
    pub fn name(&self, claim: &PersistentVolumeClaim) -> String {
        (self.0)(claim)
    }
}

impl Default for VolumeNamer {
    /// `pvc-<claim uid>`.
    fn default() -> Self {
        Self::new(|claim| format!("pvc-{}", claim.metadata.uid.as_deref().unwrap_or_default()))
    }
}

impl fmt::Debug for VolumeNamer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("VolumeNamer(..)")
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            resync_period: Self::DEFAULT_RESYNC_PERIOD,
            threads: Self::DEFAULT_THREADS,
            sync_workers: Self::DEFAULT_SYNC_WORKERS,
            max_requests_in_flight: Some(Self::DEFAULT_MAX_REQUESTS_IN_FLIGHT),
            adapt_requests_in_flight: true,
            failure_backoff: FailureBackoff::Exponential,
            failed_provision_threshold: Self::DEFAULT_FAILED_THRESHOLD,
            failed_delete_threshold: Self::DEFAULT_FAILED_THRESHOLD,
            pv_save: PvSaveStrategy::default(),
            leader_election: Some(LeaderElection::default()),
            additional_provisioner_names: Vec::new(),
            add_finalizer: false,
            provision_timeout: None,
            deletion_timeout: None,
            volume_namer: VolumeNamer::default(),
            metrics_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            metrics_port: 0,
            metrics_path: "/metrics".into(),
            shutdown_grace: Self::DEFAULT_SHUTDOWN_GRACE,
            crash_safe_provisioning: true,
            journal_namespace: None,
            journal_commit_delay: Self::DEFAULT_JOURNAL_COMMIT_DELAY,
            journal_capacity: Self::DEFAULT_JOURNAL_CAPACITY,
            provisioning_held_warning: Self::DEFAULT_PROVISIONING_HELD_WARNING,
            infeasible_retry_delay: Self::DEFAULT_INFEASIBLE_RETRY_DELAY,
        }
    }
}

impl Config {
    /// Default resync period (Go `DefaultResyncPeriod`).
    pub const DEFAULT_RESYNC_PERIOD: Duration = Duration::from_secs(15 * 60);
    /// Default number of driver calls at once per flow (Go `DefaultThreadiness`).
    pub const DEFAULT_THREADS: NonZeroU16 = NonZeroU16::new(4).expect("4 is not zero");
    /// Default for [`Config::sync_workers`]: 128 claims, and 128 volumes, synced at once.
    pub const DEFAULT_SYNC_WORKERS: NonZeroU16 = NonZeroU16::new(128).expect("128 is not zero");
    /// Default for [`Config::max_requests_in_flight`]: 16 requests to the API server at once.
    pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: NonZeroUsize =
        NonZeroUsize::new(16).expect("16 is not zero");
    /// Default failure thresholds (Go `DefaultFailedProvisionThreshold`/`DefaultFailedDeleteThreshold`).
    pub const DEFAULT_FAILED_THRESHOLD: u32 = 15;
    /// Default PV create attempts (Go `DefaultCreateProvisionedPVRetryCount`).
    pub const DEFAULT_CREATE_PV_RETRIES: u32 = retry::DEFAULT_CREATE_PV_RETRIES;
    /// Default pause between PV create attempts (Go `DefaultCreateProvisionedPVInterval`).
    pub const DEFAULT_CREATE_PV_INTERVAL: Duration = retry::DEFAULT_CREATE_PV_INTERVAL;
    /// Default for [`Config::shutdown_grace`]: 30 s, Kubernetes' default
    /// `terminationGracePeriodSeconds`, so a pod's in-flight work gets all the time the
    /// kubelet gives it before SIGKILL.
    pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// Default for [`Config::journal_commit_delay`]: zero (an intent is written as soon as
    /// no write of its object is in flight; the writes group what arrives meanwhile).
    pub const DEFAULT_JOURNAL_COMMIT_DELAY: Duration = Duration::ZERO;
    /// Default for [`Config::journal_capacity`]: a million entries.
    pub const DEFAULT_JOURNAL_CAPACITY: NonZeroUsize =
        NonZeroUsize::new(1_000_000).expect("not zero");
    /// Default for [`Config::provisioning_held_warning`]: 10 minutes.
    pub const DEFAULT_PROVISIONING_HELD_WARNING: Duration = Duration::from_secs(10 * 60);
    /// Default for [`Config::infeasible_retry_delay`]: 5 minutes (Go `DefaultRetryIntervalMax`).
    pub const DEFAULT_INFEASIBLE_RETRY_DELAY: Duration = Duration::from_secs(5 * 60);

    /// The default config, with the leader-election namespace from `POD_NAMESPACE` when
    /// it is set and not blank.
    ///
    /// Unset, the namespace stays empty and the elector takes the client's
    /// (`kube_client::Client::default_namespace`: the service account's namespace in a
    /// pod, the kubeconfig context's outside one; see [`LeaderElection::namespace`]).
    ///
    /// The journal's namespace ([`Config::journal_namespace`]) comes from `JOURNAL_NAMESPACE`
    /// the same way (unset or blank: the controller's).
    ///
    /// `lookup` is asked for `"POD_NAMESPACE"` and `"JOURNAL_NAMESPACE"` (environment
    /// variables); the library
    /// itself never reads the environment. A binary passes `|k| std::env::var(k).ok()`.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for more variables.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let namespace = lookup("POD_NAMESPACE")
            .map(|ns| ns.trim().to_owned())
            .unwrap_or_default();
        let election = LeaderElection::default().namespace(namespace);
        let journal_namespace = lookup("JOURNAL_NAMESPACE")
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty());
        Ok(Self::default()
            .leader_election(Some(election))
            .journal_namespace(journal_namespace))
    }

    /// Checks the options together.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first invalid option.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.resync_period.is_zero() {
            return Err(ConfigError::invalid(
                ConfigOption::ResyncPeriod,
                "must be greater than zero",
            ));
        }
        match self.pv_save {
            PvSaveStrategy::Blocking { retries: 0, .. } => {
                return Err(ConfigError::invalid(
                    ConfigOption::PvSave,
                    "retries must be at least 1",
                ));
            }
            PvSaveStrategy::Backoff { steps, factor, .. } => {
                if steps == 0 {
                    return Err(ConfigError::invalid(
                        ConfigOption::PvSave,
                        "steps must be at least 1",
                    ));
                }
                if !factor.is_finite() || factor < 1.0 {
                    return Err(ConfigError::invalid(
                        ConfigOption::PvSave,
                        format!("factor must be a finite number >= 1, got {factor}"),
                    ));
                }
            }
            _ => {}
        }
        if let Some(le) = &self.leader_election {
            // The lease name and identity are filled in by `run`; check the rest.
            le.clone().resolved_for("provisioner").validate()?;
        }
        if self
            .additional_provisioner_names
            .iter()
            .any(String::is_empty)
        {
            return Err(ConfigError::invalid(
                ConfigOption::AdditionalProvisionerNames,
                "contains an empty name",
            ));
        }
        for (option, timeout) in [
            (ConfigOption::ProvisionTimeout, self.provision_timeout),
            (ConfigOption::DeletionTimeout, self.deletion_timeout),
        ] {
            if timeout.is_some_and(|t| t.is_zero()) {
                return Err(ConfigError::invalid(
                    option,
                    "must be greater than zero (None = no limit)",
                ));
            }
        }
        if !self.metrics_path.starts_with('/') {
            return Err(ConfigError::invalid(
                ConfigOption::MetricsPath,
                format!("{:?} must start with '/'", self.metrics_path),
            ));
        }
        Ok(())
    }
}

/// Options for [`ProvisionController`](crate::ProvisionController); every option
/// has a documented default (the Go one).
///
/// Each option is a public field, read as `config.resync_period`, and a builder
/// method of the same name, `.resync_period(Duration::from_secs(60))`. Setting
/// never fails: the types carry the invariants. Checks across options are in
/// [`Config::validate`], which `run` calls first.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// How often every claim and volume is processed again even without a change
    /// (Go `ResyncPeriod`). Default 15 minutes.
    #[doc(alias = "ResyncPeriod")]
    pub resync_period: Duration,
    /// How many driver calls run at once: `provision` calls of the claim flow, and as
    /// many `delete` calls of the volume flow (Go `Threadiness`, its number of claim
    /// workers and of volume workers). Default 4.
    ///
    /// Unlike Go's workers, a slot is held only for the driver call itself: the API writes
    /// before and after it (the journal's intent, the PV, events) run in one of the
    /// [`sync_workers`](Self::sync_workers()), so a slow API server does not leave the
    /// driver idle.
    #[doc(alias = "Threadiness")]
    pub threads: NonZeroU16,
    /// How many claims, and how many volumes, are synced at once (each key by one worker
    /// at a time). A sync waits for one of the [`threads`](Self::threads()) slots only
    /// around its driver call; the rest of it is API round trips, so this bounds the
    /// requests the controller has in flight. Used as at least `threads`. Default
    /// [`Config::DEFAULT_SYNC_WORKERS`] (128: a claim's sync waits for its journal intent
    /// and its PV save, about 100 ms on a loaded API server, so 128 keep up with 1,000
    /// claims/s); no Go counterpart (Go syncs `Threadiness` keys at once).
    pub sync_workers: NonZeroU16,
    /// How many requests the claim and volume syncs keep in flight to the API server at
    /// most; watches and the leader election's lease renewals are not counted, the
    /// crash-safety journal's group writes have 2 slots of their own (each lets a whole
    /// group of claims go on, so it does not queue behind their PV writes), and event
    /// writes an eighth of this bound (at least one) of their own (no claim waits for an event, so an
    /// event never takes a PV create's slot). `None` leaves it unbounded (every sync worker may
    /// have a request in flight). Default [`Config::DEFAULT_MAX_REQUESTS_IN_FLIGHT`] (16).
    /// No Go counterpart (client-go bounds a client by QPS and burst instead).
    pub max_requests_in_flight: Option<NonZeroUsize>,
    /// Whether the bound of [`max_requests_in_flight`](Self::max_requests_in_flight())
    /// adapts to the API server ([`InFlightLimit::adaptive`]): after 429 and 503 answers
    /// (API Priority and Fairness rejecting requests, an overloaded server) the
    /// controller keeps fewer in flight (down to one); once they stop, the bound grows
    /// back to the maximum. Slow answers alone never shrink it (a busy server still
    /// serves them, and APF already shares it among its clients). `false` keeps it
    /// fixed. Default `true`. No Go counterpart.
    ///
    /// [`InFlightLimit::adaptive`]: kube_controller_kit::client::InFlightLimit::adaptive
    pub adapt_requests_in_flight: bool,
    /// Delay of failed claims and volumes (Go `ExponentialBackOffOnError`, `RateLimiter`).
    /// Default [`FailureBackoff::Exponential`].
    pub failure_backoff: FailureBackoff,
    /// Attempts at a claim before giving up until its next change or resync; 0 retries
    /// forever (Go `FailedProvisionThreshold`). Default 15.
    ///
    /// A claim whose provisioning runs in the background is never given up (see the
    /// crate docs: this avoids leaking its volume).
    #[doc(alias = "FailedProvisionThreshold")]
    pub failed_provision_threshold: u32,
    /// Attempts at deleting a volume before giving up until its next change or resync;
    /// 0 retries forever (Go `FailedDeleteThreshold`). Default 15.
    #[doc(alias = "FailedDeleteThreshold")]
    pub failed_delete_threshold: u32,
    /// How provisioned PVs are saved. Default [`PvSaveStrategy::Blocking`], 5 tries 10 s apart.
    pub pv_save: PvSaveStrategy,
    /// Leader election, or `None` to run without (Go `LeaderElection`, default on with
    /// [`LeaderElection::default`]: the client's namespace (the service account's in a
    /// pod; [`Config::from_lookup`] takes `POD_NAMESPACE` instead when set), 15 s / 10 s /
    /// 2 s, the lease named after the provisioner, identity `<hostname>_<random>`).
    #[doc(alias = "LeaderElectionNamespace")]
    #[doc(alias = "LeaseDuration")]
    #[doc(alias = "RenewDeadline")]
    #[doc(alias = "RetryPeriod")]
    pub leader_election: Option<LeaderElection>,
    /// Further names this controller answers to in claims' storage-provisioner annotation
    /// and classes' provisioner field (Go `AdditionalProvisionerNames`). Default none.
    #[doc(alias = "AdditionalProvisionerNames")]
    pub additional_provisioner_names: Vec<String>,
    /// Put [`FINALIZER_PV`](crate::annotations::FINALIZER_PV) on provisioned PVs with reclaim
    /// policy Delete, so they stay until their asset is deleted (Go `AddFinalizer`). Default off.
    #[doc(alias = "AddFinalizer")]
    pub add_finalizer: bool,
    /// Limit of each API and backend call while provisioning (Go `ProvisionTimeout`).
    /// Default none.
    #[doc(alias = "ProvisionTimeout")]
    pub provision_timeout: Option<Duration>,
    /// Limit of each API and backend call while deleting (Go `DeletionTimeout`). Default none.
    #[doc(alias = "DeletionTimeout")]
    pub deletion_timeout: Option<Duration>,
    /// The PV name for a claim (Go `VolumeNameHook`). Default `pvc-<claim uid>`.
    #[doc(alias = "VolumeNameHook")]
    pub volume_namer: VolumeNamer,
    /// Address the metrics and probe server binds (Go `MetricsAddress`). Default `0.0.0.0`,
    /// every interface, so the kubelet can probe the pod IP; restrict who may connect with
    /// a NetworkPolicy (see docs/production.md), or bind `127.0.0.1` when nothing outside
    /// the pod scrapes or probes it. The server closes connections that do not send
    /// their request headers within 10 s and serves at most 64 connections at once.
    #[doc(alias = "MetricsAddress")]
    pub metrics_address: IpAddr,
    /// Port of the metrics server, 0 = off (Go `MetricsPort`). Default 0.
    #[doc(alias = "MetricsPort")]
    pub metrics_port: u16,
    /// Path of the metrics endpoint (Go `MetricsPath`). Default `/metrics`.
    #[doc(alias = "MetricsPath")]
    pub metrics_path: String,
    /// On shutdown, how long the operations in flight may take to finish before they are
    /// abandoned (and, when leading, the lease is released). Default
    /// [`Config::DEFAULT_SHUTDOWN_GRACE`] (30 s); keep it below the pod's
    /// `terminationGracePeriodSeconds`. Go has no such bound: it exits at once.
    pub shutdown_grace: Duration,
    /// Crash-safe provisioning. Default on.
    ///
    /// Before the driver is asked for an asset, the controller records the claim in its
    /// provisioning journal (ConfigMaps in its own namespace, the Lease's), and waits until that record is durable; the record is settled once a
    /// PV records the asset, or removed once the driver answered that none exists. A
    /// controller that restarts at any point therefore finds every claim whose asset may
    /// exist without a PV, and finishes it, saving a PV for the asset also when the claim
    /// was deleted or bound elsewhere meanwhile (that PV is then released and reclaimed as
    /// usual). Go leaks the asset (kubernetes-csi/external-provisioner#486). A PV that
    /// cannot be saved keeps its asset: the claim is provisioned and saved again (Go deletes
    /// the asset, which can destroy one that another replica's PV names). With
    /// a [`LateAssets::window`](crate::LateAssets::window) the record
    /// stays until the window has passed and the driver made its last sweep. Users' claims
    /// and PVs carry nothing of it. Requires `configmaps` access in the controller's
    /// namespace (see [`rbac`](crate::rbac)) and a driver whose `provision` is idempotent
    /// by `pv_name` (see [`Provisioner`](crate::Provisioner)).
    ///
    /// Turning it off writes no journal (Go's behaviour), and a PV that cannot be saved has
    /// its asset deleted (after a read right before each attempt shows no PV of its name);
    /// a journal left from before is not read.
    pub crash_safe_provisioning: bool,
    /// The namespace of the provisioning journal's ConfigMaps; `None` (the default): the
    /// controller's namespace, the Lease's.
    ///
    /// The journal's RBAC role covers every ConfigMap of its namespace (its objects'
    /// names are not known in advance: they are numbered as the journal grows, and it
    /// lists them by label), so a namespace that holds other ConfigMaps (a driver's
    /// configuration, a feature-state map) would let the controller read and rewrite
    /// them. A namespace of the journal's own keeps them out of reach: the manifests of
    /// [`manifests`](crate::manifests) create `<namespace>-journal`.
    /// [`Config::from_lookup`] takes `JOURNAL_NAMESPACE` when set. No Go counterpart.
    pub journal_namespace: Option<String>,
    /// How long an intent waits for company before the journal write that makes it durable
    /// (every claim that reaches that point meanwhile shares the write), unless 8 intents
    /// (or half the [`sync_workers`](Self::sync_workers()), when fewer) wait already:
    /// then they are written at once. Zero (the default) writes an intent as soon as no
    /// write of its journal object is in flight: the intents that arrive during a write
    /// share the next one, so the groups grow with the load and a lone claim never
    /// waits for company. Settles and removals wait ten times as long, at least 1 s.
    /// Longer: fewer writes, later driver calls. Default
    /// [`Config::DEFAULT_JOURNAL_COMMIT_DELAY`] (zero). No Go counterpart.
    pub journal_commit_delay: Duration,
    /// How many entries the journal holds at most: an intent that would exceed it waits
    /// until settles and removals make room (provisioning is held back, nothing is
    /// dropped). Default [`Config::DEFAULT_JOURNAL_CAPACITY`]. No Go counterpart.
    pub journal_capacity: NonZeroUsize,
    /// A claim whose journal intent is older than this gets a `ProvisioningHeld` Warning
    /// event (once per controller process), so that a provisioning the driver keeps
    /// answering with `InBackground` or `NoChange` is visible on the claim. Default
    /// [`Config::DEFAULT_PROVISIONING_HELD_WARNING`] (10 minutes). No Go counterpart.
    pub provisioning_held_warning: Duration,
    /// How long a claim the driver called infeasible
    /// ([`ProvisionError::Infeasible`](crate::ProvisionError::Infeasible)) waits before it
    /// is provisioned again; re-creating its class ends the wait at once (Go
    /// `RetryIntervalMax`, which Go uses only for this). The wait is not counted as a
    /// failure. Default [`Config::DEFAULT_INFEASIBLE_RETRY_DELAY`] (5 minutes); zero
    /// retries with the normal backoff.
    #[doc(alias = "RetryIntervalMax")]
    pub infeasible_retry_delay: Duration,
}

// Each option's builder method, with the field's docs.
impl Config {
    /// How often every claim and volume is processed again even without a change
    /// (Go `ResyncPeriod`). Default 15 minutes.
    #[doc(alias = "ResyncPeriod")]
    #[must_use]
    pub fn resync_period(mut self, value: Duration) -> Self {
        self.resync_period = value;
        self
    }

    /// How many driver calls run at once: `provision` calls of the claim flow, and as
    /// many `delete` calls of the volume flow (Go `Threadiness`, its number of claim
    /// workers and of volume workers). Default 4.
    ///
    /// Unlike Go's workers, a slot is held only for the driver call itself: the API writes
    /// before and after it (the journal's intent, the PV, events) run in one of the
    /// [`sync_workers`](Self::sync_workers()), so a slow API server does not leave the
    /// driver idle.
    #[doc(alias = "Threadiness")]
    #[must_use]
    pub fn threads(mut self, value: NonZeroU16) -> Self {
        self.threads = value;
        self
    }

    /// How many claims, and how many volumes, are synced at once (each key by one worker
    /// at a time). A sync waits for one of the [`threads`](Self::threads()) slots only
    /// around its driver call; the rest of it is API round trips, so this bounds the
    /// requests the controller has in flight. Used as at least `threads`. Default
    /// [`Config::DEFAULT_SYNC_WORKERS`] (128: a claim's sync waits for its journal intent
    /// and its PV save, about 100 ms on a loaded API server, so 128 keep up with 1,000
    /// claims/s); no Go counterpart (Go syncs `Threadiness` keys at once).
    #[must_use]
    pub fn sync_workers(mut self, value: NonZeroU16) -> Self {
        self.sync_workers = value;
        self
    }

    /// How many requests the claim and volume syncs keep in flight to the API server at
    /// most; watches and the leader election's lease renewals are not counted, the
    /// crash-safety journal's group writes have 2 slots of their own (each lets a whole
    /// group of claims go on, so it does not queue behind their PV writes), and event
    /// writes an eighth of this bound (at least one) of their own (no claim waits for an event, so an
    /// event never takes a PV create's slot). `None` leaves it unbounded (every sync worker may
    /// have a request in flight). Default [`Config::DEFAULT_MAX_REQUESTS_IN_FLIGHT`] (16).
    /// No Go counterpart (client-go bounds a client by QPS and burst instead).
    #[must_use]
    pub fn max_requests_in_flight(mut self, value: Option<NonZeroUsize>) -> Self {
        self.max_requests_in_flight = value;
        self
    }

    /// Whether the bound of [`max_requests_in_flight`](Self::max_requests_in_flight())
    /// adapts to the API server ([`InFlightLimit::adaptive`]): after 429 and 503 answers
    /// (API Priority and Fairness rejecting requests, an overloaded server) the
    /// controller keeps fewer in flight (down to one); once they stop, the bound grows
    /// back to the maximum. Slow answers alone never shrink it (a busy server still
    /// serves them, and APF already shares it among its clients). `false` keeps it
    /// fixed. Default `true`. No Go counterpart.
    ///
    /// [`InFlightLimit::adaptive`]: kube_controller_kit::client::InFlightLimit::adaptive
    #[must_use]
    pub fn adapt_requests_in_flight(mut self, value: bool) -> Self {
        self.adapt_requests_in_flight = value;
        self
    }

    /// Delay of failed claims and volumes (Go `ExponentialBackOffOnError`, `RateLimiter`).
    /// Default [`FailureBackoff::Exponential`].
    #[must_use]
    pub fn failure_backoff(mut self, value: FailureBackoff) -> Self {
        self.failure_backoff = value;
        self
    }

    /// Attempts at a claim before giving up until its next change or resync; 0 retries
    /// forever (Go `FailedProvisionThreshold`). Default 15.
    ///
    /// A claim whose provisioning runs in the background is never given up (see the
    /// crate docs: this avoids leaking its volume).
    #[doc(alias = "FailedProvisionThreshold")]
    #[must_use]
    pub fn failed_provision_threshold(mut self, value: u32) -> Self {
        self.failed_provision_threshold = value;
        self
    }

    /// Attempts at deleting a volume before giving up until its next change or resync;
    /// 0 retries forever (Go `FailedDeleteThreshold`). Default 15.
    #[doc(alias = "FailedDeleteThreshold")]
    #[must_use]
    pub fn failed_delete_threshold(mut self, value: u32) -> Self {
        self.failed_delete_threshold = value;
        self
    }

    /// How provisioned PVs are saved. Default [`PvSaveStrategy::Blocking`], 5 tries 10 s apart.
    #[must_use]
    pub fn pv_save(mut self, value: PvSaveStrategy) -> Self {
        self.pv_save = value;
        self
    }

    /// Leader election, or `None` to run without (Go `LeaderElection`, default on with
    /// [`LeaderElection::default`]: the client's namespace (the service account's in a
    /// pod; [`Config::from_lookup`] takes `POD_NAMESPACE` instead when set), 15 s / 10 s /
    /// 2 s, the lease named after the provisioner, identity `<hostname>_<random>`).
    #[doc(alias = "LeaderElectionNamespace")]
    #[doc(alias = "LeaseDuration")]
    #[doc(alias = "RenewDeadline")]
    #[doc(alias = "RetryPeriod")]
    #[must_use]
    pub fn leader_election(mut self, value: Option<LeaderElection>) -> Self {
        self.leader_election = value;
        self
    }

    /// Further names this controller answers to in claims' storage-provisioner annotation
    /// and classes' provisioner field (Go `AdditionalProvisionerNames`). Default none.
    #[doc(alias = "AdditionalProvisionerNames")]
    #[must_use]
    pub fn additional_provisioner_names(mut self, value: Vec<String>) -> Self {
        self.additional_provisioner_names = value;
        self
    }

    /// Put [`FINALIZER_PV`](crate::annotations::FINALIZER_PV) on provisioned PVs with reclaim
    /// policy Delete, so they stay until their asset is deleted (Go `AddFinalizer`). Default off.
    #[doc(alias = "AddFinalizer")]
    #[must_use]
    pub fn add_finalizer(mut self, value: bool) -> Self {
        self.add_finalizer = value;
        self
    }

    /// Limit of each API and backend call while provisioning (Go `ProvisionTimeout`).
    /// Default none.
    #[doc(alias = "ProvisionTimeout")]
    #[must_use]
    pub fn provision_timeout(mut self, value: Option<Duration>) -> Self {
        self.provision_timeout = value;
        self
    }

    /// Limit of each API and backend call while deleting (Go `DeletionTimeout`). Default none.
    #[doc(alias = "DeletionTimeout")]
    #[must_use]
    pub fn deletion_timeout(mut self, value: Option<Duration>) -> Self {
        self.deletion_timeout = value;
        self
    }

    /// The PV name for a claim (Go `VolumeNameHook`). Default `pvc-<claim uid>`.
    #[doc(alias = "VolumeNameHook")]
    #[must_use]
    pub fn volume_namer(mut self, value: VolumeNamer) -> Self {
        self.volume_namer = value;
        self
    }

    /// Address the metrics and probe server binds (Go `MetricsAddress`). Default `0.0.0.0`,
    /// every interface, so the kubelet can probe the pod IP; restrict who may connect with
    /// a NetworkPolicy (see docs/production.md), or bind `127.0.0.1` when nothing outside
    /// the pod scrapes or probes it. The server closes connections that do not send
    /// their request headers within 10 s and serves at most 64 connections at once.
    #[doc(alias = "MetricsAddress")]
    #[must_use]
    pub fn metrics_address(mut self, value: IpAddr) -> Self {
        self.metrics_address = value;
        self
    }

    /// Port of the metrics server, 0 = off (Go `MetricsPort`). Default 0.
    #[doc(alias = "MetricsPort")]
    #[must_use]
    pub fn metrics_port(mut self, value: u16) -> Self {
        self.metrics_port = value;
        self
    }

    /// Path of the metrics endpoint (Go `MetricsPath`). Default `/metrics`.
    #[doc(alias = "MetricsPath")]
    #[must_use]
    pub fn metrics_path(mut self, value: String) -> Self {
        self.metrics_path = value;
        self
    }

    /// On shutdown, how long the operations in flight may take to finish before they are
    /// abandoned (and, when leading, the lease is released). Default
    /// [`Config::DEFAULT_SHUTDOWN_GRACE`] (30 s); keep it below the pod's
    /// `terminationGracePeriodSeconds`. Go has no such bound: it exits at once.
    #[must_use]
    pub fn shutdown_grace(mut self, value: Duration) -> Self {
        self.shutdown_grace = value;
        self
    }

    /// Crash-safe provisioning. Default on.
    ///
    /// Before the driver is asked for an asset, the controller records the claim in its
    /// provisioning journal (ConfigMaps in its own namespace, the Lease's), and waits until that record is durable; the record is settled once a
    /// PV records the asset, or removed once the driver answered that none exists. A
    /// controller that restarts at any point therefore finds every claim whose asset may
    /// exist without a PV, and finishes it, saving a PV for the asset also when the claim
    /// was deleted or bound elsewhere meanwhile (that PV is then released and reclaimed as
    /// usual). Go leaks the asset (kubernetes-csi/external-provisioner#486). A PV that
    /// cannot be saved keeps its asset: the claim is provisioned and saved again (Go deletes
    /// the asset, which can destroy one that another replica's PV names). With
    /// a [`LateAssets::window`](crate::LateAssets::window) the record
    /// stays until the window has passed and the driver made its last sweep. Users' claims
    /// and PVs carry nothing of it. Requires `configmaps` access in the controller's
    /// namespace (see [`rbac`](crate::rbac)) and a driver whose `provision` is idempotent
    /// by `pv_name` (see [`Provisioner`](crate::Provisioner)).
    ///
    /// Turning it off writes no journal (Go's behaviour), and a PV that cannot be saved has
    /// its asset deleted (after a read right before each attempt shows no PV of its name);
    /// a journal left from before is not read.
    #[must_use]
    pub fn crash_safe_provisioning(mut self, value: bool) -> Self {
        self.crash_safe_provisioning = value;
        self
    }

    /// The namespace of the provisioning journal's ConfigMaps; `None` (the default): the
    /// controller's namespace, the Lease's.
    ///
    /// The journal's RBAC role covers every ConfigMap of its namespace (its objects'
    /// names are not known in advance: they are numbered as the journal grows, and it
    /// lists them by label), so a namespace that holds other ConfigMaps (a driver's
    /// configuration, a feature-state map) would let the controller read and rewrite
    /// them. A namespace of the journal's own keeps them out of reach: the manifests of
    /// [`manifests`](crate::manifests) create `<namespace>-journal`.
    /// [`Config::from_lookup`] takes `JOURNAL_NAMESPACE` when set. No Go counterpart.
    #[must_use]
    pub fn journal_namespace(mut self, value: Option<String>) -> Self {
        self.journal_namespace = value;
        self
    }

    /// How long an intent waits for company before the journal write that makes it durable
    /// (every claim that reaches that point meanwhile shares the write), unless 8 intents
    /// (or half the [`sync_workers`](Self::sync_workers()), when fewer) wait already:
    /// then they are written at once. Zero (the default) writes an intent as soon as no
    /// write of its journal object is in flight: the intents that arrive during a write
    /// share the next one, so the groups grow with the load and a lone claim never
    /// waits for company. Settles and removals wait ten times as long, at least 1 s.
    /// Longer: fewer writes, later driver calls. Default
    /// [`Config::DEFAULT_JOURNAL_COMMIT_DELAY`] (zero). No Go counterpart.
    #[must_use]
    pub fn journal_commit_delay(mut self, value: Duration) -> Self {
        self.journal_commit_delay = value;
        self
    }

    /// How many entries the journal holds at most: an intent that would exceed it waits
    /// until settles and removals make room (provisioning is held back, nothing is
    /// dropped). Default [`Config::DEFAULT_JOURNAL_CAPACITY`]. No Go counterpart.
    #[must_use]
    pub fn journal_capacity(mut self, value: NonZeroUsize) -> Self {
        self.journal_capacity = value;
        self
    }

    /// A claim whose journal intent is older than this gets a `ProvisioningHeld` Warning
    /// event (once per controller process), so that a provisioning the driver keeps
    /// answering with `InBackground` or `NoChange` is visible on the claim. Default
    /// [`Config::DEFAULT_PROVISIONING_HELD_WARNING`] (10 minutes). No Go counterpart.
    #[must_use]
    pub fn provisioning_held_warning(mut self, value: Duration) -> Self {
        self.provisioning_held_warning = value;
        self
    }

    /// How long a claim the driver called infeasible
    /// ([`ProvisionError::Infeasible`](crate::ProvisionError::Infeasible)) waits before it
    /// is provisioned again; re-creating its class ends the wait at once (Go
    /// `RetryIntervalMax`, which Go uses only for this). The wait is not counted as a
    /// failure. Default [`Config::DEFAULT_INFEASIBLE_RETRY_DELAY`] (5 minutes); zero
    /// retries with the normal backoff.
    #[doc(alias = "RetryIntervalMax")]
    #[must_use]
    pub fn infeasible_retry_delay(mut self, value: Duration) -> Self {
        self.infeasible_retry_delay = value;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn election(lease: u64, renew: u64, retry: u64) -> Option<LeaderElection> {
        Some(
            LeaderElection::default()
                .namespace("ns")
                .lease_duration(Duration::from_secs(lease))
                .renew_deadline(Duration::from_secs(renew))
                .retry_period(Duration::from_secs(retry)),
        )
    }

    #[test]
    fn defaults_are_the_go_defaults() {
        let c = Config::default();
        assert!(
            c.adapt_requests_in_flight,
            "a good citizen by default (#22)"
        );
        assert_eq!(c.resync_period, Duration::from_secs(900));
        assert_eq!(c.threads.get(), 4);
        assert!(matches!(c.failure_backoff, FailureBackoff::Exponential));
        assert_eq!(
            (c.failed_provision_threshold, c.failed_delete_threshold),
            (15, 15)
        );
        assert_eq!(c.pv_save.pauses(), Some(vec![Duration::from_secs(10); 4]));
        assert_eq!(c.leader_election, Some(LeaderElection::default()));
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert!(c.crash_safe_provisioning);
        assert_eq!(c.infeasible_retry_delay, Duration::from_secs(300));
        assert!(!c.add_finalizer);
        assert_eq!((c.provision_timeout, c.deletion_timeout), (None, None));
        assert_eq!((c.metrics_port, c.metrics_path.as_str()), (0, "/metrics"));
        assert_eq!(c.metrics_address.to_string(), "0.0.0.0");
        let claim = crate::testing::pvc("c").uid("1234").build();
        assert_eq!(c.volume_namer.name(&claim), "pvc-1234");
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn validation_names_the_invalid_option() {
        let cases: Vec<(&str, Config, Option<ConfigOption>)> = vec![
            ("defaults are valid", Config::default(), None),
            (
                "zero resync",
                Config::default().resync_period(Duration::ZERO),
                Some(ConfigOption::ResyncPeriod),
            ),
            (
                "renew deadline not shorter than lease",
                Config::default().leader_election(election(10, 10, 2)),
                Some(ConfigOption::RenewDeadline),
            ),
            (
                "renew deadline not above the jittered retry period",
                Config::default().leader_election(election(15, 10, 10)),
                Some(ConfigOption::RenewDeadline),
            ),
            (
                "zero retry period",
                Config::default().leader_election(election(15, 10, 0)),
                Some(ConfigOption::RetryPeriod),
            ),
            (
                "empty namespace: the client's",
                Config::default().leader_election(Some(LeaderElection::default().namespace(""))),
                None,
            ),
            (
                "namespace with whitespace",
                Config::default().leader_election(Some(LeaderElection::default().namespace(" n"))),
                Some(ConfigOption::LeaseNamespace),
            ),
            (
                "election off skips its checks",
                Config::default().leader_election(None),
                None,
            ),
            (
                "zero save retries",
                Config::default().pv_save(PvSaveStrategy::Blocking {
                    retries: 0,
                    interval: Duration::ZERO,
                }),
                Some(ConfigOption::PvSave),
            ),
            (
                "backoff factor below one",
                Config::default().pv_save(PvSaveStrategy::Backoff {
                    initial: Duration::from_secs(1),
                    factor: 0.5,
                    steps: 3,
                    cap: None,
                }),
                Some(ConfigOption::PvSave),
            ),
            (
                "empty additional name",
                Config::default().additional_provisioner_names(vec![String::new()]),
                Some(ConfigOption::AdditionalProvisionerNames),
            ),
            (
                "zero provision timeout",
                Config::default().provision_timeout(Some(Duration::ZERO)),
                Some(ConfigOption::ProvisionTimeout),
            ),
            (
                "zero deletion timeout",
                Config::default().deletion_timeout(Some(Duration::ZERO)),
                Some(ConfigOption::DeletionTimeout),
            ),
            (
                "relative metrics path",
                Config::default().metrics_path("m".into()),
                Some(ConfigOption::MetricsPath),
            ),
        ];
        for (name, config, want) in cases {
            let got = config.validate().err().map(|e| e.option());
            assert_eq!(got, want, "case: {name}");
        }
    }

    #[test]
    fn errors_name_the_option_by_its_rust_and_go_names() {
        let zero_resync = Config::default().resync_period(Duration::ZERO);
        assert_eq!(
            zero_resync.validate().unwrap_err().to_string(),
            "invalid value for option resync_period (Go ResyncPeriod): must be greater than zero"
        );
        let short_lease = Config::default().leader_election(election(10, 10, 2));
        let err = short_lease.validate().unwrap_err();
        assert!(
            err.to_string().starts_with(
                "invalid value for option leader_election.renew_deadline (Go RenewDeadline): "
            ),
            "{err}"
        );
        let no_go_name = ConfigError::invalid(ConfigOption::ShutdownGrace, "x");
        assert_eq!(
            no_go_name.to_string(),
            "invalid value for option shutdown_grace: x"
        );
    }

    #[test]
    fn leader_election_namespace_is_pod_namespace_else_left_to_the_client() {
        let ns = |vars: &[(&str, &str)]| {
            let vars: std::collections::HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect();
            Config::from_lookup(|k| vars.get(k).cloned())
                .unwrap()
                .leader_election
                .unwrap()
                .namespace
        };
        assert_eq!(ns(&[("POD_NAMESPACE", "pods")]), "pods");
        assert_eq!(ns(&[("POD_NAMESPACE", " pods\n")]), "pods");
        // Unset or blank: empty, so the elector takes the client's namespace.
        assert_eq!(ns(&[("POD_NAMESPACE", "  ")]), "");
        assert_eq!(ns(&[]), "");
    }
}
