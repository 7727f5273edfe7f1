//! What upstream's syncer does around the `CnsVolumeMetadata` reconciler: it reads its
//! feature states from a ConfigMap, and installs the CRD it serves at start.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::api::{Api, PostParams};
use kube_client::{Client, ResourceExt};
use kube_controller_kit::backoff::{ItemExponentialLimiter, RateLimiter};
use kube_controller_kit::error::chain;
use kube_controller_kit::http::Health;
use kube_runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// Upstream's name of the feature-state ConfigMap (`--fss-name`; Go
/// `DefaultInternalFSSConfigMapName`).
pub const DEFAULT_FSS_NAME: &str = "internal-feature-states.csi.vsphere.vmware.com";
/// Upstream's namespace of the CSI driver, where the feature-state ConfigMap lives
/// (`--fss-namespace`; Go `DefaultCSINamespace`).
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
/// First delay before the CRD install is tried again.
pub const CRD_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest delay between two tries of the CRD install.
pub const CRD_RETRY_MAX: Duration = Duration::from_secs(300);

/// Where the feature states are read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureStates {
    /// The ConfigMap's namespace (`--fss-namespace`).
    pub namespace: String,
    /// The ConfigMap's name (`--fss-name`).
    pub name: String,
}

impl Default for FeatureStates {
    fn default() -> Self {
        Self {
            namespace: DEFAULT_FSS_NAMESPACE.to_owned(),
            name: DEFAULT_FSS_NAME.to_owned(),
        }
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

/// Watches the feature-state ConfigMap `states` and keeps `tkgs_ha` equal to its
/// [`TKGS_HA`] key, as upstream's informer keeps its map (every add and update replaces
/// the states). Runs until dropped.
///
/// A ConfigMap that does not exist (yet) leaves the state off, as upstream; a deleted one
/// is logged as an error (upstream exits the process) and its last states are kept until
/// it comes back. A watch that fails is retried with kube-runtime's default backoff.
pub async fn watch_feature_states(
    client: Client,
    states: FeatureStates,
    tkgs_ha: watch::Sender<bool>,
) {
    let source = format!("{}/{}", states.namespace, states.name);
    let api: Api<ConfigMap> = Api::namespaced(client, &states.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", states.name));
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)) => {
                let on = feature_on(map.data.as_ref(), TKGS_HA, &source);
                if tkgs_ha.send_replace(on) != on {
                    info!(configmap = %source, key = TKGS_HA, on, "feature state changed");
                }
            }
            Ok(watcher::Event::Delete(map)) => {
                error!(
                    configmap = %source,
                    name = %map.name_any(),
                    "the feature-state ConfigMap was deleted; keeping its last states until it is restored"
                );
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(error) => {
                warn!(configmap = %source, error = %chain(&error), "feature-state watch failed; retrying");
            }
        }
    }
}

/// Why [`install_crd`] could not install the CRD.
#[derive(Debug)]
enum InstallError {
    /// Not allowed: someone with the right must apply the manifest.
    Forbidden(kube_client::Error),
    /// Anything else (the API server unreachable, a conflict): tried again.
    Other(kube_client::Error),
}

/// Creates the `CnsVolumeMetadata` CRD, or updates it to the shipped manifest when it
/// exists and differs, as upstream's syncer does at start
/// (`createCustomResourceDefinitionFromManifest`).
async fn install_once(client: &Client) -> Result<&'static str, InstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let wanted = cnsmetadata::crd();
    let classify = |error: kube_client::Error| match &error {
        kube_client::Error::Api(status) if status.code == 403 => InstallError::Forbidden(error),
        _ => InstallError::Other(error),
    };
    match api.create(&PostParams::default(), &wanted).await {
        Ok(_) => return Ok("created"),
        Err(kube_client::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(classify(error)),
    }
    let existing = api.get(cnsmetadata::CRD_NAME).await.map_err(classify)?;
    if existing.spec == wanted.spec {
        return Ok("up to date");
    }
    let mut updated = wanted;
    updated.metadata.resource_version = existing.metadata.resource_version.clone();
    api.replace(cnsmetadata::CRD_NAME, &PostParams::default(), &updated)
        .await
        .map_err(classify)?;
    Ok("updated")
}

/// Installs the `CnsVolumeMetadata` CRD (create, or update to the shipped manifest), and
/// returns once it is installed.
///
/// Where the process may not (403), one warning line names the manifest to apply
/// ([`CRD_MANIFEST`]), `health` reports [`CRD_NOT_READY`] on `/readyz`, and the install is
/// tried again after a delay that doubles from [`CRD_RETRY_FIRST`] to [`CRD_RETRY_MAX`]:
/// later failures log at debug level only, unless their error changes. Other failures
/// (the API server unreachable) are retried the same way. Once installed, the condition is
/// cleared and one info line says so.
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
}
