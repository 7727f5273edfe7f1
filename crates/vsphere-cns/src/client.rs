//! [`CnsClient`]: session handling, the four CNS calls and task waiting.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_controller_kit::backoff::{ItemExponentialLimiter, RateLimiter as _};
use tracing::{debug, instrument, warn};

use crate::connection::VirtualCenterConfig;
use crate::error::{Error, Result};
use crate::soap::decode::{self, ServiceContent, TaskInfo, TaskState, VolumeResult};
use crate::soap::encode;
use crate::wire::{
    CnsVolume, CnsVolumeId, MoRef, QueryFilter, VolumeCreateSpec, VolumeMetadataUpdateSpec,
};

/// Name of the session cookie vCenter sets on `Login`.
pub const SESSION_COOKIE: &str = "vmware_soap_session";
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(2);
const USER_AGENT: &str = concat!("vsphere-cns-rs/", env!("CARGO_PKG_VERSION"));

mod transport;

#[cfg(test)]
mod edge_tests;

use transport::fetch_version;
#[cfg(test)]
pub(crate) use transport::route;

/// Where a SOAP call goes and which `SOAPAction` it carries.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Endpoint {
    /// `/sdk` with `urn:vim25/<vim version>`.
    Vim,
    /// `/sdk` with `urn:vsan/<vsan version>`: task polling, as VMware asks.
    VimForTasks,
    /// `/vsanHealth` with `urn:vsan/<vsan version>`: the CnsVolumeManager.
    Cns,
}

/// A logged-in client for the CNS volume manager of one vCenter.
///
/// Cheap to clone; clones share the session. Every SOAP round trip is bounded by
/// [`VirtualCenterConfig::timeout`] and every task wait by [`VirtualCenterConfig::task_timeout`].
///
/// # Guarantees
/// - A call that fails with `NotAuthenticated` (expired session) logs in again and is
///   retried once.
/// - The password is sent only in the `Login` body; it is never logged and never part of an
///   error or of `Debug` output.
#[derive(Clone)]
pub struct CnsClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    base: String,
    config: VirtualCenterConfig,
    vim_version: String,
    vsan_version: String,
    content: ServiceContent,
    cookie: Mutex<Option<String>>,
    login_lock: tokio::sync::Mutex<()>,
}

impl fmt::Debug for CnsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CnsClient")
            .field("url", &self.inner.base)
            .field("user", &self.inner.config.user)
            .field("vim_version", &self.inner.vim_version)
            .field("vsan_version", &self.inner.vsan_version)
            .finish_non_exhaustive()
    }
}

impl CnsClient {
    /// Connects and logs in: reads the vim and vsan service versions, retrieves the service
    /// content, then logs in and keeps the `vmware_soap_session` cookie for `/sdk` and
    /// `/vsanHealth`.
    ///
    /// # Guarantees
    /// - Nothing is sent before [`VirtualCenterConfig::validate`] passes: `https://` for every TLS
    ///   mode, plain `http://` only to a loopback IP address.
    /// - Redirects are not followed; no response body is read past
    ///   [`VirtualCenterConfig::max_response_bytes`]; proxies from the environment are not used.
    ///
    /// # Errors
    /// [`Error::Settings`] for unusable settings (TLS, host, plain HTTP to a host that is
    /// not loopback); [`Error::Fault`] with [`Error::is_invalid_login`] for a refused user
    /// or password; [`Error::Redirect`] or [`Error::ResponseTooLarge`] for such answers;
    /// [`Error::Timeout`], [`Error::Transport`] or [`Error::Protocol`] when the server cannot
    /// be talked to.
    #[instrument(skip_all, fields(vc = %config.host))]
    pub async fn connect(config: &VirtualCenterConfig) -> Result<CnsClient> {
        config.validate()?;
        if config.tls == crate::tls::TlsMode::Insecure {
            warn!(vc = %config.host, "TLS certificate verification is disabled (insecure-flag)");
        }
        let mut builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .http1_only()
            // A 3xx is an error (Error::Redirect): the Login body holds the password.
            .redirect(reqwest::redirect::Policy::none())
            .https_only(config.tls != crate::tls::TlsMode::PlainHttp)
            // csi-vsphere.conf names the vCenter; an HTTP(S)_PROXY in the environment
            // must not silently route the password elsewhere.
            .no_proxy();
        if let Some(tls) = crate::tls::client_config(&config.tls)? {
            builder = builder.use_preconfigured_tls(tls);
        }
        let http = builder
            .build()
            .map_err(|e| Error::Settings(format!("cannot build the HTTP client: {e}")))?;
        let base = config.base_url();
        let vim_version =
            fetch_version(&http, config, &base, "vimServiceVersions.xml", "urn:vim25")
                .await?
                .unwrap_or_else(|| "8.0.3.0".to_owned());
        let vsan_version =
            fetch_version(&http, config, &base, "vsanServiceVersions.xml", "urn:vsan")
                .await?
                .unwrap_or_else(|| vim_version.clone());
        debug!(%vim_version, %vsan_version, "service versions");
        let mut client = Inner {
            http,
            base,
            config: config.clone(),
            vim_version,
            vsan_version,
            content: ServiceContent {
                session_manager: MoRef::new("SessionManager", "SessionManager"),
                property_collector: MoRef::new("PropertyCollector", "propertyCollector"),
                search_index: MoRef::new("SearchIndex", "SearchIndex"),
                api_version: String::new(),
                full_name: String::new(),
            },
            cookie: Mutex::new(None),
            login_lock: tokio::sync::Mutex::new(()),
        };
        let response = client
            .post(
                Endpoint::Vim,
                "RetrieveServiceContent",
                encode::retrieve_service_content(),
            )
            .await?;
        client.content = decode::service_content(&response)?;
        debug!(api_version = %client.content.api_version, server = %client.content.full_name, "connected");
        let client = CnsClient {
            inner: Arc::new(client),
        };
        client.inner.login().await?;
        Ok(client)
    }

    /// The user this client is logged in as (the `vSphereUser` of a container cluster).
    pub fn user(&self) -> &str {
        &self.inner.config.user
    }

    /// `about.apiVersion` of the server, for example `8.0.3.0`.
    pub fn api_version(&self) -> &str {
        &self.inner.content.api_version
    }

    /// The vsan service version used in `SOAPAction: urn:vsan/<version>`.
    pub fn vsan_version(&self) -> &str {
        &self.inner.vsan_version
    }

    /// The connection settings this client was made with (for its timeouts).
    pub(crate) fn config(&self) -> &VirtualCenterConfig {
        &self.inner.config
    }

    /// Creates one volume and waits for its task; returns the new volume's ID.
    ///
    /// A `CnsAlreadyRegisteredFault` in the result counts as success with the fault's
    /// volume ID, as vsphere-csi-driver does.
    ///
    /// # Errors
    /// [`Error::Fault`] when the call, the task or the volume result fails (for example
    /// `InvalidArgument` without datastores); timeouts and transport errors as for every call.
    #[instrument(skip_all, fields(volume = %spec.name))]
    pub async fn create_volume(&self, spec: &VolumeCreateSpec) -> Result<CnsVolumeId> {
        const OP: &str = "CnsCreateVolume";
        let result = self.run_task(OP, encode::cns_create_volume(spec)).await?;
        created_volume_id(result)
    }

    /// Deletes one volume (and its disk when `delete_disk`), waiting for the task.
    ///
    /// # Errors
    /// A volume that does not exist gives an error for which [`Error::is_not_found`] is true,
    /// whether the server says so on the call or in the task result; callers that delete
    /// idempotently treat that as done.
    #[instrument(skip_all, fields(volume_id = %id))]
    pub async fn delete_volume(&self, id: &CnsVolumeId, delete_disk: bool) -> Result<()> {
        const OP: &str = "CnsDeleteVolume";
        let result = self
            .run_task(OP, encode::cns_delete_volume(&[id.as_str()], delete_disk))
            .await?;
        match result.fault {
            Some(fault) => Err(fault.into_error(OP)),
            None => Ok(()),
        }
    }

    /// Replaces, adds or (with `delete`) removes entity metadata of one volume.
    ///
    /// # Errors
    /// [`Error::is_not_found`] when the volume does not exist (a real vCenter reports
    /// `NotFound`). vcsim instead answers with an empty result, which is an
    /// [`Error::Protocol`].
    #[instrument(skip_all, fields(volume_id = %spec.volume_id))]
    pub async fn update_volume_metadata(&self, spec: &VolumeMetadataUpdateSpec) -> Result<()> {
        const OP: &str = "CnsUpdateVolumeMetadata";
        let result = self
            .run_task(OP, encode::cns_update_volume_metadata(spec))
            .await?;
        match result.fault {
            Some(fault) => Err(fault.into_error(OP)),
            None => Ok(()),
        }
    }

    /// Lists the volumes that match `filter`; unknown IDs or names are simply absent.
    ///
    /// # Caveats
    /// Only the first page is read (a real vCenter returns up to 100 volumes by default);
    /// filter by IDs or names.
    ///
    /// # Errors
    /// As for every call: faults, timeouts, transport and protocol errors.
    #[instrument(skip_all)]
    pub async fn query_volume(&self, filter: &QueryFilter) -> Result<Vec<CnsVolume>> {
        let response = self
            .inner
            .call(
                Endpoint::Cns,
                "CnsQueryVolume",
                encode::cns_query_volume(filter),
            )
            .await?;
        Ok(decode::query_result(&response))
    }

    /// Looks an object up by inventory path, for example a datastore by
    /// `DC0/datastore/LocalDS_0`; `None` when nothing is there.
    ///
    /// # Errors
    /// As for every call: faults, timeouts, transport and protocol errors.
    #[doc(alias = "FindByInventoryPath")]
    #[instrument(skip_all, fields(path = %path))]
    pub async fn find_by_inventory_path(&self, path: &str) -> Result<Option<MoRef>> {
        let body = encode::find_by_inventory_path(&self.inner.content.search_index, path);
        let response = self
            .inner
            .call(Endpoint::Vim, "FindByInventoryPath", body)
            .await?;
        Ok(response.child("returnval").and_then(decode::moref))
    }

    /// Ends the session. Later calls log in again.
    ///
    /// # Errors
    /// As for every call.
    pub async fn logout(&self) -> Result<()> {
        let body = encode::logout(&self.inner.content.session_manager);
        let result = self.inner.post(Endpoint::Vim, "Logout", body).await;
        *self.inner.cookie_slot() = None;
        result.map(drop)
    }

    /// Sends a mutating CNS call, waits for its task and returns the first volume result.
    async fn run_task(&self, operation: &'static str, body: String) -> Result<VolumeResult> {
        let limit = self.inner.config.task_timeout;
        let work = async {
            let response = self.inner.call(Endpoint::Cns, operation, body).await?;
            let task = decode::returnval_moref(&response, operation)?;
            debug!(task = %task.value, "waiting for task");
            let info = self.wait_for_task(operation, &task).await?;
            first_result(operation, info)
        };
        tokio::time::timeout(limit, work)
            .await
            .map_err(|_| Error::Timeout {
                operation,
                after: limit,
            })?
    }

    /// Polls `RetrievePropertiesEx(Task.info)` until the task succeeds or fails.
    async fn wait_for_task(&self, operation: &'static str, task: &MoRef) -> Result<TaskInfo> {
        let first = self.inner.config.task_poll_interval;
        // Doubling up to 2 s (a longer first pause stays as it is).
        let pauses = ItemExponentialLimiter::new(first, MAX_POLL_INTERVAL.max(first));
        let body = encode::retrieve_task_info(&self.inner.content.property_collector, task);
        loop {
            let response = self
                .inner
                .call(Endpoint::VimForTasks, "RetrievePropertiesEx", body.clone())
                .await?;
            let info = decode::task_info(&response, operation)?;
            if matches!(info.state, TaskState::Success | TaskState::Error) {
                return Ok(info);
            }
            tokio::time::sleep(pauses.when(operation)).await;
        }
    }
}

/// The ID a create result names; `CnsAlreadyRegisteredFault` counts as success with the
/// fault's (or the result's) volume ID.
fn created_volume_id(result: VolumeResult) -> Result<CnsVolumeId> {
    const OP: &str = "CnsCreateVolume";
    if let Some(fault) = result.fault {
        if fault.fault_type == "CnsAlreadyRegisteredFault"
            && let Some(id) = fault.volume_id.clone().or(result.volume_id)
        {
            debug!(volume_id = %id, "volume already registered");
            return Ok(id);
        }
        return Err(fault.into_error(OP));
    }
    result.volume_id.ok_or_else(|| Error::Protocol {
        operation: OP,
        detail: "create result has no volumeId".into(),
    })
}

/// Reads a finished task: `error` fails the call; otherwise the first volume result.
fn first_result(operation: &'static str, info: TaskInfo) -> Result<VolumeResult> {
    if info.state == TaskState::Error {
        return Err(match info.error {
            Some(fault) => fault.into_error(operation),
            None => Error::Protocol {
                operation,
                detail: "task failed without a fault".into(),
            },
        });
    }
    info.results
        .into_iter()
        .next()
        .ok_or_else(|| Error::Protocol {
            operation,
            detail: "task result has no volume result (vcsim answers so for an unknown volume)"
                .into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: TaskState, results: Vec<VolumeResult>) -> TaskInfo {
        TaskInfo {
            state,
            error: None,
            results,
        }
    }

    #[test]
    fn a_finished_task_without_volume_results_is_a_protocol_error() {
        let err =
            first_result("CnsUpdateVolumeMetadata", info(TaskState::Success, vec![])).unwrap_err();
        assert!(matches!(err, Error::Protocol { .. }), "{err}");
        assert!(!err.is_not_found());
    }

    fn fault(fault_type: &str, volume_id: Option<&str>) -> decode::FaultInfo {
        decode::FaultInfo {
            fault_type: fault_type.into(),
            message: String::new(),
            volume_id: volume_id.map(CnsVolumeId::from),
        }
    }

    #[test]
    fn already_registered_counts_as_created_with_the_faults_volume_id() {
        let result = VolumeResult {
            fault: Some(fault("CnsAlreadyRegisteredFault", Some("vol-1"))),
            ..VolumeResult::default()
        };
        assert_eq!(
            created_volume_id(result).unwrap(),
            CnsVolumeId::from("vol-1")
        );
        let result = VolumeResult {
            fault: Some(fault("CnsAlreadyRegisteredFault", None)),
            ..VolumeResult::default()
        };
        assert_eq!(
            created_volume_id(result).unwrap_err().fault_type(),
            Some("CnsAlreadyRegisteredFault")
        );
        let result = VolumeResult {
            fault: Some(fault("CnsFault", Some("vol-1"))),
            ..VolumeResult::default()
        };
        assert!(created_volume_id(result).is_err());
        let result = VolumeResult {
            volume_id: Some("vol-2".into()),
            ..VolumeResult::default()
        };
        assert_eq!(
            created_volume_id(result).unwrap(),
            CnsVolumeId::from("vol-2")
        );
    }

    fn _client_is_send_and_sync(client: CnsClient) -> impl Send + Sync + Clone {
        client
    }

    fn _calls_are_send<'a>(client: &'a CnsClient, filter: &'a QueryFilter) -> impl Send + 'a {
        client.query_volume(filter)
    }

    #[test]
    fn a_failed_task_without_fault_is_still_an_error() {
        let err = first_result("CnsCreateVolume", info(TaskState::Error, vec![])).unwrap_err();
        assert!(err.to_string().contains("without a fault"), "{err}");
    }
}
