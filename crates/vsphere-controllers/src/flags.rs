//! Flags of the upstream Go binaries this process replaces: vsphere-csi-driver's syncer
//! (`cmd/syncer`) and the CSI external-provisioner (`csi-provisioner`, with its klog
//! flags). Manifests written for them pass these; a binary that does not take one says so
//! in one line, naming it, instead of clap's generic "unexpected argument".

/// Every flag of the upstream syncer and csi-provisioner, with what to do instead when
/// this binary has no such flag (empty: nothing to do, the behaviour is built in or
/// absent).
pub const UPSTREAM_FLAGS: &[(&str, &str)] = &[
    // vsphere-csi-driver cmd/syncer
    ("leader-election", ""),
    ("leader-election-namespace", "the Lease is in POD_NAMESPACE"),
    (
        "leader-election-lease-duration",
        "the lease timings are client-go's, 15 s / 10 s / 2 s",
    ),
    (
        "leader-election-renew-deadline",
        "the lease timings are client-go's, 15 s / 10 s / 2 s",
    ),
    (
        "leader-election-retry-period",
        "the lease timings are client-go's, 15 s / 10 s / 2 s",
    ),
    ("version", ""),
    (
        "operation-mode",
        "this binary is the METADATA_SYNC mode; there is no webhook server",
    ),
    ("supervisor-fss-name", ""),
    ("supervisor-fss-namespace", ""),
    ("fss-name", ""),
    ("fss-namespace", ""),
    ("storagequota-sync-interval", ""),
    (
        "webhook-client-cert-verification",
        "this binary is the METADATA_SYNC mode; there is no webhook server",
    ),
    (
        "enable-profile-server",
        "there is no profiling endpoint; metrics are served with --metrics-address",
    ),
    // csi-provisioner (external-provisioner)
    ("kubeconfig", ""),
    ("master", "give the server in a kubeconfig (--kubeconfig)"),
    (
        "csi-address",
        "this binary provisions through CNS itself, without a CSI socket",
    ),
    ("connection-timeout", ""),
    ("provisioner", "use --provisioner-name"),
    ("volume-name-prefix", "volumes are named pvc-<claim uid>"),
    (
        "volume-name-uuid-length",
        "volumes are named pvc-<claim uid>",
    ),
    ("retry-interval-start", ""),
    ("retry-interval-max", ""),
    ("worker-threads", ""),
    ("cloning-protection-threads", ""),
    ("capacity-threads", ""),
    ("timeout", ""),
    ("strict-topology", ""),
    ("immediate-topology", ""),
    ("extra-create-metadata", ""),
    ("metrics-address", ""),
    ("http-endpoint", "use --metrics-address"),
    ("metrics-path", "metrics are served at /metrics"),
    ("default-fstype", ""),
    ("kube-api-qps", ""),
    ("kube-api-burst", ""),
    ("enable-capacity", ""),
    ("capacity-for-immediate-binding", ""),
    ("capacity-poll-interval", ""),
    ("capacity-ownerref-level", ""),
    ("node-deployment", ""),
    ("node-deployment-immediate-binding", ""),
    ("node-deployment-base-delay", ""),
    ("node-deployment-max-delay", ""),
    ("feature-gates", ""),
    ("controller-publish-readonly", ""),
    ("prevent-volume-mode-conversion", ""),
    ("enable-pprof", ""),
    ("leader-election-labels", ""),
    // klog, which both binaries register
    ("v", "set RUST_LOG, e.g. RUST_LOG=debug"),
    (
        "vmodule",
        "set RUST_LOG, e.g. RUST_LOG=provision_controller=debug",
    ),
    ("logtostderr", "logs go to stderr"),
    ("alsologtostderr", "logs go to stderr"),
    ("stderrthreshold", "set RUST_LOG"),
    ("log_dir", "logs go to stderr"),
    ("log_file", "logs go to stderr"),
    ("add_dir_header", ""),
    ("skip_headers", ""),
];

/// The first argument of `args` (the program name excluded) that is a flag of the
/// upstream binaries and not one of `supported` (the long names this binary takes): a
/// one-line error that names it, and says what to do instead where there is something.
/// Go accepts `-name` as well as `--name`, and `=value` after either.
pub fn unsupported_upstream_flag<'a>(
    args: impl IntoIterator<Item = &'a str>,
    supported: &[&str],
) -> Option<String> {
    for arg in args {
        if arg == "--" {
            return None;
        }
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        let name = flag.split_once('=').map_or(flag, |(name, _)| name);
        if supported.contains(&name) {
            continue;
        }
        if let Some((name, instead)) = UPSTREAM_FLAGS.iter().find(|(n, _)| *n == name) {
            let instead = if instead.is_empty() {
                String::new()
            } else {
                format!(" ({instead})")
            };
            return Some(format!(
                "--{name} is a flag of the upstream vsphere-syncer or csi-provisioner that this binary does not support{instead}"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &[&str] = &[
        "kubeconfig",
        "leader-election",
        "metrics-address",
        "version",
    ];

    #[test]
    fn an_upstream_flag_this_binary_lacks_is_named_in_one_line() {
        let cases = [
            (
                vec!["--fss-name=csi-feature-states", "--leader-election"],
                "--fss-name is a flag of the upstream vsphere-syncer or csi-provisioner that this binary does not support",
            ),
            (
                vec!["-leader-election-namespace", "kube-system"],
                "--leader-election-namespace is a flag of the upstream vsphere-syncer or csi-provisioner that this binary does not support (the Lease is in POD_NAMESPACE)",
            ),
            (
                vec!["--v=4"],
                "--v is a flag of the upstream vsphere-syncer or csi-provisioner that this binary does not support (set RUST_LOG, e.g. RUST_LOG=debug)",
            ),
        ];
        for (args, message) in cases {
            let error = unsupported_upstream_flag(args.iter().copied(), OURS);
            assert_eq!(error.as_deref(), Some(message), "{args:?}");
            assert!(!message.contains('\n'));
        }
    }

    #[test]
    fn supported_and_unknown_flags_are_left_to_the_parser() {
        for args in [
            vec!["--leader-election", "--kubeconfig=/k"],
            vec!["--no-such-flag"],
            vec!["--", "--fss-name"],
            vec!["value"],
        ] {
            assert_eq!(
                unsupported_upstream_flag(args.iter().copied(), OURS),
                None,
                "{args:?}"
            );
        }
    }
}
