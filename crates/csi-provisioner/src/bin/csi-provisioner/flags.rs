//! The sidecar's command line: kubernetes-csi/external-provisioner's flag names and
//! defaults, so that the container args of an existing deployment work unchanged.
//!
//! Flags of features this sidecar does not have are parsed (so that each is named in the
//! error) and refused at start when they turn the feature on; flags that only tune such a
//! feature while it is off are accepted and have no effect.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use clap::Parser;

/// A CSI external-provisioner on provision-controller: the container args of
/// kubernetes-csi/external-provisioner work unchanged.
#[derive(Debug, Parser)]
#[command(name = "csi-provisioner", version, about, long_about = None)]
pub(crate) struct Flags {
    /// Address of the CSI driver socket (unix:///path or /path).
    #[arg(long, default_value = "/run/csi/socket")]
    pub(crate) csi_address: String,
    /// Absolute path to the kubeconfig file; required only when running out of cluster
    /// (KUBECONFIG, when set, wins as upstream).
    #[arg(long, default_value = "")]
    pub(crate) kubeconfig: String,
    /// Master URL: not supported (give a kubeconfig).
    #[arg(long, default_value = "")]
    pub(crate) master: String,
    /// Prefix of the names of created volumes (and their PVs).
    #[arg(long, default_value = "pvc")]
    pub(crate) volume_name_prefix: String,
    /// Truncates the claim's UID in volume names to this length; -1: whole.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub(crate) volume_name_uuid_length: i64,
    /// First retry interval of a failed provisioning or deletion; doubles up to
    /// --retry-interval-max.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) retry_interval_start: Duration,
    /// Longest retry interval of a failed provisioning or deletion.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) retry_interval_max: Duration,
    /// Number of CSI calls at once (provisions, and as many deletions).
    #[arg(long, default_value_t = 100)]
    pub(crate) worker_threads: u32,
    /// Timeout of each CSI call (CreateVolume, DeleteVolume, probes).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// Late binding: pass only the selected node's topology to CreateVolume.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) strict_topology: bool,
    /// Immediate binding: pass the topologies of every node with the driver (true) or
    /// none (false).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) immediate_topology: bool,
    /// Add csi.storage.k8s.io/pvc/name, /pvc/namespace and /pv/name to CreateVolume's
    /// parameters.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) extra_create_metadata: bool,
    /// Filesystem type when the StorageClass names none; empty: none.
    #[arg(long, default_value = "")]
    pub(crate) default_fstype: String,
    /// Feature gates, key=value pairs separated by commas: Topology (default true),
    /// VolumeAttributesClass, CrossNamespaceVolumeDataSource, ReleaseLeaderElectionOnExit.
    #[arg(long, default_value = "", value_parser = parse_feature_gates)]
    pub(crate) feature_gates: FeatureGates,
    /// Enable leader election (a Lease named after the driver).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) leader_election: bool,
    /// Namespace of the leader-election Lease (and the journal); default: the pod's
    /// (POD_NAMESPACE).
    #[arg(long, default_value = "")]
    pub(crate) leader_election_namespace: String,
    /// Leader election: how long a lease is valid.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub(crate) leader_election_lease_duration: Duration,
    /// Leader election: how long the leader retries renewing before giving up.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) leader_election_renew_deadline: Duration,
    /// Leader election: pause between tries.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) leader_election_retry_period: Duration,
    /// Labels put on the Lease: key:value pairs separated by commas. Not supported.
    #[arg(long, default_value = "")]
    pub(crate) leader_election_labels: String,
    /// Address of the HTTP server for metrics and probes (`:8080`); empty: off.
    #[arg(long, default_value = "")]
    pub(crate) http_endpoint: String,
    /// Deprecated form of --http-endpoint.
    #[arg(long, default_value = "")]
    pub(crate) metrics_address: String,
    /// Path of the metrics endpoint.
    #[arg(long, default_value = "/metrics")]
    pub(crate) metrics_path: String,
    /// Client-go's request rate; this sidecar bounds requests in flight instead, so the
    /// value is accepted and not used.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) kube_api_qps: f64,
    /// Client-go's burst; accepted and not used (see --kube-api-qps).
    #[arg(long, default_value_t = 10)]
    pub(crate) kube_api_burst: u32,
    /// Log verbosity as klog's: 0-1 info, 2-4 debug, 5 and more trace (RUST_LOG wins).
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub(crate) verbosity: u8,
    /// pprof on the HTTP endpoint: not supported.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) enable_pprof: bool,
    /// Storage capacity tracking: not supported.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) enable_capacity: bool,
    /// Capacity tracking: threads (no effect while --enable-capacity is off).
    #[arg(long, default_value_t = 1)]
    pub(crate) capacity_threads: u32,
    /// Capacity tracking: poll interval (no effect while --enable-capacity is off).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub(crate) capacity_poll_interval: Duration,
    /// Capacity tracking: owner level (no effect while --enable-capacity is off).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub(crate) capacity_ownerref_level: i64,
    /// Capacity tracking for immediate binding (no effect while --enable-capacity is off).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) capacity_for_immediate_binding: bool,
    /// Capacity tracking: client rate (no effect while --enable-capacity is off).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) kube_api_capacity_qps: f64,
    /// Capacity tracking: client burst (no effect while --enable-capacity is off).
    #[arg(long, default_value_t = 5)]
    pub(crate) kube_api_capacity_burst: u32,
    /// Deployment on every node with a node-local driver: not supported.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) node_deployment: bool,
    /// Node deployment: immediate binding (no effect while --node-deployment is off).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) node_deployment_immediate_binding: bool,
    /// Node deployment: base delay (no effect while --node-deployment is off).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub(crate) node_deployment_base_delay: Duration,
    /// Node deployment: max delay (no effect while --node-deployment is off).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(crate) node_deployment_max_delay: Duration,
    /// Cloning protection threads: claims with a data source are refused by this sidecar,
    /// so there is nothing to protect; accepted, no effect.
    #[arg(long, default_value_t = 1)]
    pub(crate) cloning_protection_threads: u32,
    /// Snapshot source protection sweep: snapshots are refused by this sidecar; accepted,
    /// no effect.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) snapshot_orphan_sweep_interval: Duration,
    /// Mark ReadOnlyMany volumes read-only at ControllerPublish: not supported.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) controller_publish_readonly: bool,
    /// Volume mode conversion from snapshots: snapshots are refused by this sidecar;
    /// accepted, no effect.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) prevent_volume_mode_conversion: bool,
}

/// The feature gates upstream knows, as given (absent: upstream's default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FeatureGates(BTreeMap<String, bool>);

impl FeatureGates {
    /// Upstream's gates and their defaults at the version this sidecar follows.
    const KNOWN: [(&'static str, bool); 4] = [
        ("Topology", true),
        ("VolumeAttributesClass", true),
        ("CrossNamespaceVolumeDataSource", false),
        ("ReleaseLeaderElectionOnExit", false),
    ];

    /// Whether `gate` is on (its default when not given).
    pub(crate) fn enabled(&self, gate: &str) -> bool {
        self.0.get(gate).copied().unwrap_or_else(|| {
            Self::KNOWN
                .iter()
                .find(|(name, _)| *name == gate)
                .is_some_and(|(_, default)| *default)
        })
    }
}

/// Parses `Topology=true,VolumeAttributesClass=false`, as Go's `MapStringBool`.
fn parse_feature_gates(value: &str) -> Result<FeatureGates, String> {
    let mut gates = BTreeMap::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, on) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        let key = key.trim();
        if !FeatureGates::KNOWN.iter().any(|(name, _)| *name == key) {
            let known: Vec<&str> = FeatureGates::KNOWN.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown feature gate {key:?} (known: {})",
                known.join(", ")
            ));
        }
        let on = match on.trim() {
            "true" | "True" | "TRUE" | "1" | "t" | "T" => true,
            "false" | "False" | "FALSE" | "0" | "f" | "F" => false,
            other => return Err(format!("{key}: {other:?} is not true or false")),
        };
        gates.insert(key.to_owned(), on);
    }
    Ok(FeatureGates(gates))
}

/// Parses a Go duration (`10s`, `5m`, `1m30s`, `300ms`, `1.5h`).
fn parse_duration(value: &str) -> Result<Duration, String> {
    let parsed: jiff::SignedDuration = value
        .parse()
        .map_err(|e| format!("{value:?} is not a duration such as 10s, 5m or 1m30s: {e}"))?;
    Duration::try_from(parsed).map_err(|_| format!("{value:?} is negative"))
}

/// A flag given that this sidecar cannot honour.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {why}")]
pub(crate) struct Refused {
    /// The flag, as written on the command line.
    pub(crate) flag: &'static str,
    /// What the flag asks for and why it cannot be done.
    pub(crate) why: &'static str,
}

impl Flags {
    /// Refuses the flags that turn on a feature this sidecar does not have, naming the
    /// first one.
    pub(crate) fn refuse_unsupported(&self) -> Result<(), Refused> {
        let refused = [
            (
                self.enable_capacity,
                "--enable-capacity",
                "storage capacity tracking (CSIStorageCapacity objects) is not supported by this sidecar; remove the flag and run upstream's sidecar for capacity",
            ),
            (
                self.node_deployment,
                "--node-deployment",
                "deployment on every node for node-local volumes is not supported by this sidecar; run it as one Deployment next to the controller service",
            ),
            (
                self.controller_publish_readonly,
                "--controller-publish-readonly",
                "marking ReadOnlyMany volumes read-only at ControllerPublish is not supported by this sidecar",
            ),
            (
                self.enable_pprof,
                "--enable-pprof",
                "Go's pprof has no counterpart in this sidecar",
            ),
            (
                !self.master.is_empty(),
                "--master",
                "a bare API server URL is not supported; give --kubeconfig (or run in the cluster)",
            ),
            (
                !self.leader_election_labels.is_empty(),
                "--leader-election-labels",
                "labels on the leader-election Lease are not supported by this sidecar",
            ),
            (
                !self.metrics_address.is_empty() && !self.http_endpoint.is_empty(),
                "--metrics-address",
                "only one of --metrics-address and --http-endpoint can be set",
            ),
            (
                self.feature_gates.enabled("CrossNamespaceVolumeDataSource"),
                "--feature-gates CrossNamespaceVolumeDataSource=true",
                "data sources are not supported by this sidecar yet",
            ),
            (
                self.worker_threads == 0,
                "--worker-threads",
                "must be at least 1",
            ),
        ];
        match refused.into_iter().find(|(given, _, _)| *given) {
            Some((_, flag, why)) => Err(Refused { flag, why }),
            None => Ok(()),
        }
    }

    /// The address of the metrics and probe server: `--http-endpoint`, else the deprecated
    /// `--metrics-address`; `None` when both are empty. `:8080` binds every interface.
    pub(crate) fn http_address(&self) -> Result<Option<SocketAddr>, String> {
        let given = if self.http_endpoint.is_empty() {
            &self.metrics_address
        } else {
            &self.http_endpoint
        };
        if given.is_empty() {
            return Ok(None);
        }
        let full = if given.starts_with(':') {
            format!("0.0.0.0{given}")
        } else {
            given.clone()
        };
        full.parse().map(Some).map_err(|_| {
            format!("--http-endpoint: {given:?} is not host:port (e.g. :8080 or 127.0.0.1:8080)")
        })
    }

    /// The volume-name UUID length: `None` for the whole UID (-1, upstream's default).
    pub(crate) fn uuid_length(&self) -> Option<usize> {
        usize::try_from(self.volume_name_uuid_length).ok()
    }

    /// The log filter klog's `--v` stands for.
    pub(crate) fn log_level(&self) -> &'static str {
        match self.verbosity {
            0 | 1 => "info",
            2..=4 => "debug",
            _ => "trace",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        let mut all = vec!["csi-provisioner"];
        all.extend_from_slice(args);
        Flags::try_parse_from(all).unwrap()
    }

    #[test]
    fn defaults_are_upstreams() {
        let f = parse(&[]);
        assert_eq!(f.csi_address, "/run/csi/socket");
        assert_eq!(f.volume_name_prefix, "pvc");
        assert_eq!(f.uuid_length(), None);
        assert_eq!(f.retry_interval_start, Duration::from_secs(1));
        assert_eq!(f.retry_interval_max, Duration::from_secs(300));
        assert_eq!(f.worker_threads, 100);
        assert_eq!(f.timeout, Duration::from_secs(10));
        assert!(!f.strict_topology);
        assert!(f.immediate_topology);
        assert!(!f.extra_create_metadata);
        assert_eq!(f.default_fstype, "");
        assert!(!f.leader_election);
        assert_eq!(f.leader_election_lease_duration, Duration::from_secs(15));
        assert_eq!(f.leader_election_renew_deadline, Duration::from_secs(10));
        assert_eq!(f.leader_election_retry_period, Duration::from_secs(5));
        assert_eq!(f.http_address().unwrap(), None);
        assert_eq!(f.metrics_path, "/metrics");
        assert!(f.feature_gates.enabled("Topology"));
        assert!(!f.feature_gates.enabled("CrossNamespaceVolumeDataSource"));
        f.refuse_unsupported().unwrap();
    }

    /// The args of a typical upstream deployment (csi-driver-host-path's, trimmed).
    #[test]
    fn an_upstream_deployments_args_parse() {
        let f = parse(&[
            "-v=5",
            "--csi-address=/csi/csi.sock",
            "--feature-gates=Topology=true",
            "--extra-create-metadata",
            "--leader-election",
            "--leader-election-namespace=kube-system",
            "--http-endpoint=:8080",
            "--timeout=60s",
            "--worker-threads=10",
            "--volume-name-uuid-length=8",
            "--strict-topology=true",
            "--default-fstype=ext4",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
            "--retry-interval-max=1m30s",
        ]);
        assert_eq!(f.csi_address, "/csi/csi.sock");
        assert_eq!(f.log_level(), "trace");
        assert!(f.extra_create_metadata && f.leader_election && f.strict_topology);
        assert_eq!(
            f.http_address().unwrap(),
            Some("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(f.timeout, Duration::from_secs(60));
        assert_eq!(f.uuid_length(), Some(8));
        assert_eq!(f.retry_interval_max, Duration::from_secs(90));
        f.refuse_unsupported().unwrap();
    }

    #[test]
    fn flags_of_features_it_lacks_are_refused_by_name() {
        for (args, flag) in [
            (&["--enable-capacity"][..], "--enable-capacity"),
            (&["--node-deployment=true"][..], "--node-deployment"),
            (
                &["--controller-publish-readonly"][..],
                "--controller-publish-readonly",
            ),
            (&["--master=https://x"][..], "--master"),
            (
                &["--http-endpoint=:8080", "--metrics-address=:8081"][..],
                "--metrics-address",
            ),
            (
                &["--feature-gates=CrossNamespaceVolumeDataSource=true"][..],
                "--feature-gates CrossNamespaceVolumeDataSource=true",
            ),
        ] {
            let refused = parse(args).refuse_unsupported().unwrap_err();
            assert_eq!(refused.flag, flag);
            assert!(refused.to_string().starts_with(flag), "{refused}");
            assert!(!refused.to_string().contains('\n'), "one line: {refused}");
        }
        // Tuning a feature that is off is accepted.
        parse(&["--capacity-threads=4", "--node-deployment-base-delay=30s"])
            .refuse_unsupported()
            .unwrap();
    }

    #[test]
    fn bad_values_are_errors_naming_the_value() {
        let all = |a: &str| {
            Flags::try_parse_from(["csi-provisioner", a])
                .unwrap_err()
                .to_string()
        };
        assert!(all("--timeout=ten").contains("\"ten\" is not a duration"));
        assert!(all("--feature-gates=Bogus=true").contains("unknown feature gate \"Bogus\""));
        assert!(all("--feature-gates=Topology=maybe").contains("Topology: \"maybe\""));
        let f = parse(&["--http-endpoint=8080"]);
        assert!(f.http_address().unwrap_err().contains("not host:port"));
    }
}
