//! What upstream's syncer does around the `CnsVolumeMetadata` reconciler: it reads its
//! feature states from a ConfigMap (which one depends on the cluster flavor) before it
//! starts, and installs the CRD it serves at start.

use std::collections::BTreeMap;
use std::time::Duration;

use cnsmetadata::ClusterFlavor;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kube_controller_kit::backoff::{ItemExponentialLimiter, RateLimiter};
use kube_controller_kit::error::chain;
use kube_runtime::{WatchStreamExt, watcher};
use provision_controller::Health;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// Upstream's name of the supervisor's feature-state ConfigMap, which its syncer reads on a
/// supervisor (`WORKLOAD`; `--supervisor-fss-name`; Go `DefaultSupervisorFSSConfigMapName`).
/// The stock supervisor manifest ships it with `tkgs-ha`.
pub const DEFAULT_SUPERVISOR_FSS_NAME: &str = "csi-feature-states";
/// Upstream's name of the internal feature-state ConfigMap, which its syncer reads on
/// `VANILLA` and `GUEST_CLUSTER` clusters (`--fss-name`; Go
/// `DefaultInternalFSSConfigMapName`).
pub const DEFAULT_FSS_NAME: &str = "internal-feature-states.csi.vsphere.vmware.com";
/// Upstream's namespace of the CSI driver, where both feature-state ConfigMaps live
/// (`--supervisor-fss-namespace`, `--fss-namespace`; Go `DefaultCSINamespace`).
pub const DEFAULT_FSS_NAMESPACE: &str = "vmware-system-csi";
/// The feature-state key that gives PV entity references the supervisor ID (Go
/// `common.TKGsHA`).
pub const TKGS_HA: &str = "tkgs-ha";
/// The CRD manifest shipped with this repository, named in the line logged when the CRD
/// cannot be installed.
pub const CRD_MANIFEST: &str = "examples/deploy/cnsvolumemetadata-crd.yaml";
/// What `/readyz` says while the CRD is not installed.
pub const CRD_NOT_READY: &str = "the CnsVolumeMetadata CRD is not installed and this process \
     may not install it: apply examples/deploy/cnsvolumemetadata-crd.yaml \
     (cnsvolumemetadatas.cns.vmware.com)";
/// What `/readyz` says while the feature-state ConfigMap the reconciler needs is missing.
pub const FEATURE_STATES_NOT_READY: &str = "the feature-state ConfigMap \
     (--supervisor-fss-namespace/--supervisor-fss-name, by default \
     vmware-system-csi/csi-feature-states) does not exist: the CnsVolumeMetadata reconciler \
     starts once it does";
/// First delay before the CRD install is tried again.
pub const CRD_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest delay between two tries of the CRD install.
pub const CRD_RETRY_MAX: Duration = Duration::from_secs(300);
/// How long [`install_crd`] waits for a CRD it created or updated to be `Established`
/// before it tries again (upstream polls for a minute).
pub const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// Where feature states are read from: one ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureStates {
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

impl FeatureStates {
    /// The supervisor's feature states as upstream names them by default:
    /// `vmware-system-csi/csi-feature-states`.
    #[must_use]
    pub fn supervisor() -> Self {
        Self {
            namespace: DEFAULT_FSS_NAMESPACE.to_owned(),
            name: DEFAULT_SUPERVISOR_FSS_NAME.to_owned(),
        }
    }

    /// The internal feature states as upstream names them by default:
    /// `vmware-system-csi/internal-feature-states.csi.vsphere.vmware.com`.
    #[must_use]
    pub fn internal() -> Self {
        Self {
            namespace: DEFAULT_FSS_NAMESPACE.to_owned(),
            name: DEFAULT_FSS_NAME.to_owned(),
        }
    }

    /// The ConfigMap upstream's syncer reads its feature states (`TKGsHA` among them)
    /// from on a cluster of `flavor`: on a supervisor (`WORKLOAD`) the supervisor's
    /// (`supervisor`: `--supervisor-fss-name`, `--supervisor-fss-namespace`), elsewhere the
    /// internal one (`internal`: `--fss-name`, `--fss-namespace`). Only a supervisor runs
    /// the `CnsVolumeMetadata` reconciler, the one reader here.
    #[must_use]
    pub fn of_flavor(flavor: ClusterFlavor, supervisor: &Self, internal: &Self) -> Self {
        match flavor {
            ClusterFlavor::Workload => supervisor.clone(),
            _ => internal.clone(),
        }
    }
}

impl FeatureStates {
    /// Creates this ConfigMap with `data` (and its namespace, when missing), as a
    /// supervisor's install ships `csi-feature-states`: for the demo and for tests
    /// against kube-sim.
    ///
    /// # Errors
    /// The API server's answer when a create fails (an existing namespace is no error).
    pub async fn create(
        &self,
        client: &Client,
        data: &[(&str, &str)],
    ) -> Result<(), kube_client::Error> {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        match Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
        {
            Ok(_) => {}
            Err(kube_client::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error),
        }
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(client.clone(), &self.namespace)
            .create(&PostParams::default(), &map)
            .await
            .map(drop)
    }
}

impl Default for FeatureStates {
    /// [`FeatureStates::supervisor`]: what the reconciler reads on the one flavor it runs on.
    fn default() -> Self {
        Self::supervisor()
    }
}

impl std::fmt::Display for FeatureStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A feature state's value as upstream reads it (Go `strconv.ParseBool`): `1`, `t`, `T`,
/// `TRUE`, `true`, `True` are on; `0`, `f`, `F`, `FALSE`, `false`, `False` off; anything
/// else is an error (upstream then logs it and takes the feature as off).
pub fn parse_feature_state(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!(
            "{other:?} is not a boolean (expected true or false)"
        )),
    }
}

/// Whether `key` is on in the ConfigMap data `data`: a missing key is off, a value that is
/// no boolean is off with a warning naming the ConfigMap, the key and the value (as
/// upstream's `IsFSSEnabled`).
fn feature_on(data: Option<&BTreeMap<String, String>>, key: &str, source: &str) -> bool {
    match data.and_then(|d| d.get(key)) {
        None => false,
        Some(value) => parse_feature_state(value).unwrap_or_else(|problem| {
            warn!(configmap = source, key, %problem, "feature state is not a boolean; taken as off");
            false
        }),
    }
}

/// The `/readyz` condition [`watch_feature_states`] sets while the ConfigMap is missing.
const FEATURE_STATES_CONDITION: &str = "feature-states";

/// Reads the feature-state ConfigMap `states`, then follows it, keeping `tkgs_ha` equal to
/// its [`TKGS_HA`] key, as upstream's syncer reads its feature states before it starts its
/// controllers and then keeps them with a ConfigMap informer. Runs until dropped.
///
/// # Loading
/// Nothing is sent on `tkgs_ha` before the ConfigMap has been read, so a receiver's
/// [`changed`](watch::Receiver::changed) resolving means the states are loaded: the
/// caller starts what depends on them only then, never with a guessed value. When the
/// first list does not find the ConfigMap, one error line names it (upstream's syncer fails
/// its start and is restarted until it exists) and `health` reports
/// [`FEATURE_STATES_NOT_READY`] on `/readyz`; once it is created it is read, the
/// condition is cleared and one info line says so.
///
/// # Following
/// Every add and update replaces the states (a missing key is off, a value that is not a
/// boolean is off with a warning). A deleted ConfigMap is logged as one error line
/// (upstream's syncer exits) and its last states are kept until it is restored. A watch
/// that fails is retried with kube-runtime's default backoff.
pub async fn watch_feature_states(
    client: Client,
    states: FeatureStates,
    tkgs_ha: watch::Sender<bool>,
    health: Health,
) {
    let source = states.to_string();
    let api: Api<ConfigMap> = Api::namespaced(client, &states.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", states.name));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut loaded = false;
    let mut listed = false;
    let mut missing_reported = false;
    let mut deletion_reported = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)) => {
                listed = true;
                deletion_reported = false;
                let on = feature_on(map.data.as_ref(), TKGS_HA, &source);
                let before = tkgs_ha.send_replace(on);
                if !loaded {
                    loaded = true;
                    health.set_unmet(FEATURE_STATES_CONDITION, None);
                    info!(configmap = %source, key = TKGS_HA, on, "feature states loaded");
                } else if before != on {
                    info!(configmap = %source, key = TKGS_HA, on, "feature state changed");
                }
            }
            Ok(watcher::Event::InitDone) if !listed && !loaded && !missing_reported => {
                missing_reported = true;
                health.set_unmet(FEATURE_STATES_CONDITION, Some(FEATURE_STATES_NOT_READY));
                error!(
                    configmap = %source,
                    "the feature-state ConfigMap does not exist: the CnsVolumeMetadata \
                     reconciler starts once it does (create it, or name another with \
                     --supervisor-fss-name and --supervisor-fss-namespace)"
                );
            }
            // A relist without it: deleted while the watch was down.
            Ok(watcher::Event::InitDone) if !listed && loaded && !deletion_reported => {
                deletion_reported = true;
                deleted(&source);
            }
            Ok(watcher::Event::Delete(_)) if !deletion_reported => {
                deletion_reported = true;
                deleted(&source);
            }
            Ok(watcher::Event::InitDone | watcher::Event::Delete(_)) => {}
            Err(error) => {
                warn!(configmap = %source, error = %chain(&error), "feature-state watch failed; retrying");
            }
        }
    }
}

/// The one line about a deleted feature-state ConfigMap.
fn deleted(source: &str) {
    error!(
        configmap = %source,
        "the feature-state ConfigMap was deleted; keeping its last states until it is restored"
    );
}

/// Why [`install_crd`] could not install the CRD.
#[derive(Debug)]
enum InstallError {
    /// Not allowed: someone with the right must apply the manifest.
    Forbidden(kube_client::Error),
    /// Anything else (the API server unreachable, a conflict): tried again.
    Other(kube_client::Error),
    /// Installed, but not `Established` within [`CRD_ESTABLISHED_TIMEOUT`].
    NotEstablished,
}

/// Whether the CRD's `Established` condition is `True`.
fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// Installs the `CnsVolumeMetadata` CRD as upstream's syncer does at start
/// (`createCustomResourceDefinition`): created when missing; when it exists, the object
/// is kept (its labels, annotations and other metadata) and only its spec is set to the
/// shipped one (no write when it already is). Then waits until the CRD is `Established`.
async fn install_once(client: &Client) -> Result<&'static str, InstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let wanted = cnsmetadata::crd();
    let classify = |error: kube_client::Error| match &error {
        kube_client::Error::Api(status) if status.code == 403 => InstallError::Forbidden(error),
        _ => InstallError::Other(error),
    };
    let what = match api.get_opt(cnsmetadata::CRD_NAME).await.map_err(classify)? {
        None => {
            api.create(&PostParams::default(), &wanted)
                .await
                .map_err(classify)?;
            "created"
        }
        Some(existing) if existing.spec == wanted.spec => "up to date",
        Some(mut existing) => {
            existing.spec = wanted.spec;
            existing.status = None;
            api.replace(cnsmetadata::CRD_NAME, &PostParams::default(), &existing)
                .await
                .map_err(classify)?;
            "updated"
        }
    };
    let deadline = tokio::time::Instant::now() + CRD_ESTABLISHED_TIMEOUT;
    loop {
        let crd = api.get(cnsmetadata::CRD_NAME).await.map_err(classify)?;
        if established(&crd) {
            return Ok(what);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(InstallError::NotEstablished);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Installs the `CnsVolumeMetadata` CRD (created, or its spec set to the shipped one, its
/// metadata kept) and returns once it is installed and `Established`.
///
/// Where the process may not (403), one warning line names the manifest to apply
/// ([`CRD_MANIFEST`]), `health` reports [`CRD_NOT_READY`] on `/readyz`, and the install is
/// tried again after a delay that doubles from [`CRD_RETRY_FIRST`] to [`CRD_RETRY_MAX`]:
/// later failures log at debug level only, unless their error changes. Other failures
/// (the API server unreachable, not `Established` within [`CRD_ESTABLISHED_TIMEOUT`]) are
/// retried the same way. Once installed, the condition is cleared and one info line says
/// so.
pub async fn install_crd(client: &Client, health: &Health) {
    let delays = ItemExponentialLimiter::new(CRD_RETRY_FIRST, CRD_RETRY_MAX);
    let mut last: Option<String> = None;
    loop {
        let failure = match install_once(client).await {
            Ok(what) => {
                health.set_unmet("cnsvolumemetadata-crd", None);
                info!(
                    crd = cnsmetadata::CRD_NAME,
                    what, "CnsVolumeMetadata CRD installed"
                );
                return;
            }
            Err(InstallError::Forbidden(error)) => {
                health.set_unmet("cnsvolumemetadata-crd", Some(CRD_NOT_READY));
                (true, chain(&error))
            }
            Err(InstallError::Other(error)) => (false, chain(&error)),
            Err(InstallError::NotEstablished) => (
                false,
                format!("not Established within {CRD_ESTABLISHED_TIMEOUT:?}"),
            ),
        };
        let delay = delays.when("crd");
        let (forbidden, error) = failure;
        if last.as_deref() == Some(error.as_str()) {
            debug!(retry_in = ?delay, %error, "the CnsVolumeMetadata CRD is still not installed");
        } else if forbidden {
            warn!(
                retry_in = ?delay,
                %error,
                "cannot install the CnsVolumeMetadata CRD (no permission): apply {CRD_MANIFEST}; \
                 the CnsVolumeMetadata reconciler starts once it is installed"
            );
        } else {
            warn!(retry_in = ?delay, %error, "cannot install the CnsVolumeMetadata CRD; retrying");
        }
        last = Some(error);
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_states_parse_as_go_parse_bool() {
        for on in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_feature_state(on), Ok(true), "{on}");
        }
        for off in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_feature_state(off), Ok(false), "{off}");
        }
        assert_eq!(
            parse_feature_state("yes"),
            Err(r#""yes" is not a boolean (expected true or false)"#.to_owned())
        );
    }

    #[test]
    fn a_missing_or_bad_key_is_off() {
        let data = BTreeMap::from([
            (TKGS_HA.to_owned(), "true".to_owned()),
            ("other".to_owned(), "maybe".to_owned()),
        ]);
        assert!(feature_on(Some(&data), TKGS_HA, "ns/fss"));
        assert!(!feature_on(Some(&data), "other", "ns/fss"));
        assert!(!feature_on(Some(&data), "absent", "ns/fss"));
        assert!(!feature_on(None, TKGS_HA, "ns/fss"));
    }

    #[test]
    fn each_flavor_reads_the_feature_states_upstream_reads() {
        let supervisor = FeatureStates {
            namespace: "ns".into(),
            name: "sv".into(),
        };
        let internal = FeatureStates::internal();
        for (flavor, expected) in [
            (ClusterFlavor::Workload, &supervisor),
            (ClusterFlavor::Vanilla, &internal),
            (ClusterFlavor::GuestCluster, &internal),
        ] {
            assert_eq!(
                &FeatureStates::of_flavor(flavor, &supervisor, &internal),
                expected,
                "{flavor}"
            );
        }
        assert_eq!(
            FeatureStates::default().to_string(),
            "vmware-system-csi/csi-feature-states"
        );
    }

    #[test]
    fn only_an_established_true_condition_is_established() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
            CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
        };
        let with = |conditions: &[(&str, &str)]| CustomResourceDefinition {
            status: Some(CustomResourceDefinitionStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| CustomResourceDefinitionCondition {
                            type_: (*t).to_owned(),
                            status: (*s).to_owned(),
                            ..CustomResourceDefinitionCondition::default()
                        })
                        .collect(),
                ),
                ..CustomResourceDefinitionStatus::default()
            }),
            ..cnsmetadata::crd()
        };
        assert!(established(&with(&[
            ("NamesAccepted", "True"),
            ("Established", "True")
        ])));
        assert!(!established(&with(&[("NamesAccepted", "True")])));
        assert!(!established(&with(&[("Established", "False")])));
        assert!(!established(&cnsmetadata::crd()));
    }
}
