//! [`CsiProvisioner`]: provision-controller's [`Provisioner`] for a CSI driver, making
//! the CreateVolume and DeleteVolume calls and the PersistentVolumes as
//! kubernetes-csi/external-provisioner does.

mod request;
mod secrets;
mod volume;

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim, SecretReference},
    storage::v1::StorageClass,
};
use kube_client::{Api, Client};
use provision_controller::{
    DeleteError, ProvisionError, ProvisionOptions, Provisioner, VolumeNamer,
};

use crate::{
    csi::{
        CapacityRange, Code, ControllerGetCapabilitiesResponse, CreateVolumeRequest, CsiDriver,
        DeleteVolumeRequest, GetPluginCapabilitiesResponse, Status,
        controller_service_capability::{self, RpcType},
        plugin_capability::{self, ServiceType},
    },
    error::CsiError,
    guard::attached_node,
    topology::{self, TopologySettings},
};

use request::{DataSource, PV_NAME_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY, claim_key};
use secrets::SecretParams;
use volume::{ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, VolumeSecrets};

/// How many times a volume made too small is deleted again before giving up (upstream's
/// `deleteVolumeRetryCount`).
const CLEANUP_ATTEMPTS: usize = 5;

/// The driver capabilities the provisioner acts on, from `GetPluginCapabilities` and
/// `ControllerGetCapabilities`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverCapabilities {
    /// `SINGLE_NODE_MULTI_WRITER`: ReadWriteOnce is `SINGLE_NODE_MULTI_WRITER` and
    /// ReadWriteOncePod `SINGLE_NODE_SINGLE_WRITER` (else both `SINGLE_NODE_WRITER`).
    pub single_node_multi_writer: bool,
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`: with topology enabled, requests carry
    /// accessibility requirements and PVs node affinity.
    pub accessibility_constraints: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`: a volume still named by a VolumeAttachment is not
    /// deleted.
    pub publish_unpublish: bool,
}

impl DriverCapabilities {
    /// The capabilities a driver reported.
    #[must_use]
    pub fn from_responses(
        plugin: &GetPluginCapabilitiesResponse,
        controller: &ControllerGetCapabilitiesResponse,
    ) -> Self {
        let services: Vec<i32> = plugin
            .capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
                _ => None,
            })
            .collect();
        let rpcs: Vec<i32> = controller
            .capabilities
            .iter()
            .filter_map(|c| {
                c.r#type
                    .as_ref()
                    .map(|controller_service_capability::Type::Rpc(r)| r.r#type)
            })
            .collect();
        Self {
            single_node_multi_writer: rpcs.contains(&(RpcType::SingleNodeMultiWriter as i32)),
            accessibility_constraints: services
                .contains(&(ServiceType::VolumeAccessibilityConstraints as i32)),
            publish_unpublish: rpcs.contains(&(RpcType::PublishUnpublishVolume as i32)),
        }
    }

    /// Sets [`single_node_multi_writer`](Self::single_node_multi_writer).
    #[must_use]
    pub fn single_node_multi_writer(mut self, on: bool) -> Self {
        self.single_node_multi_writer = on;
        self
    }

    /// Sets [`accessibility_constraints`](Self::accessibility_constraints).
    #[must_use]
    pub fn accessibility_constraints(mut self, on: bool) -> Self {
        self.accessibility_constraints = on;
        self
    }

    /// Sets [`publish_unpublish`](Self::publish_unpublish).
    #[must_use]
    pub fn publish_unpublish(mut self, on: bool) -> Self {
        self.publish_unpublish = on;
        self
    }
}

/// The options of the sidecar that shape its requests and volumes: upstream's flags of
/// the same names, with their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CsiOptions {
    /// The prefix of volume names, `<prefix>-<claim uid>` (`--volume-name-prefix`).
    /// Default `pvc`; must not be empty.
    pub volume_name_prefix: String,
    /// How much of the claim's uid, without its dashes, is kept in the volume name
    /// (`--volume-name-uuid-length`); `None` (the default) keeps the uid whole, dashes
    /// included.
    pub volume_name_uuid_length: Option<usize>,
    /// Adds `csi.storage.k8s.io/pvc/name`, `/pvc/namespace` and `/pv/name` to the
    /// parameters of CreateVolume (`--extra-create-metadata`). Default `false`.
    pub extra_create_metadata: bool,
    /// The filesystem type of a mount volume whose class names none (`--default-fstype`).
    /// Default empty: the driver's choice.
    pub default_fstype: String,
    /// Topology (`--feature-gates Topology=...`, default on; `--strict-topology`, default
    /// off; `--immediate-topology`, default on). Used only for a driver that reports
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    pub topology: TopologySettings,
    /// The sidecar's identity, written to each PV's
    /// `storage.kubernetes.io/csiProvisionerIdentity` volume attribute. Empty (the
    /// default): [`provisioner_identity`] of the driver, made when the provisioner is.
    pub identity: String,
}

impl Default for CsiOptions {
    fn default() -> Self {
        Self {
            volume_name_prefix: "pvc".into(),
            volume_name_uuid_length: None,
            extra_create_metadata: false,
            default_fstype: String::new(),
            topology: TopologySettings {
                enabled: true,
                strict: false,
                immediate: true,
            },
            identity: String::new(),
        }
    }
}

/// An invalid [`CsiOptions`] value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    /// `volume_name_prefix` is empty.
    #[error("the volume name prefix must not be empty (--volume-name-prefix)")]
    EmptyPrefix,
}

impl CsiOptions {
    /// Sets [`volume_name_prefix`](Self::volume_name_prefix).
    #[must_use]
    pub fn volume_name_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.volume_name_prefix = prefix.into();
        self
    }
    /// Sets [`volume_name_uuid_length`](Self::volume_name_uuid_length).
    #[must_use]
    pub fn volume_name_uuid_length(mut self, length: Option<usize>) -> Self {
        self.volume_name_uuid_length = length;
        self
    }
    /// Sets [`extra_create_metadata`](Self::extra_create_metadata).
    #[must_use]
    pub fn extra_create_metadata(mut self, on: bool) -> Self {
        self.extra_create_metadata = on;
        self
    }
    /// Sets [`default_fstype`](Self::default_fstype).
    #[must_use]
    pub fn default_fstype(mut self, fs_type: impl Into<String>) -> Self {
        self.default_fstype = fs_type.into();
        self
    }
    /// Sets [`topology`](Self::topology).
    #[must_use]
    pub fn topology(mut self, topology: TopologySettings) -> Self {
        self.topology = topology;
        self
    }
    /// Sets [`identity`](Self::identity).
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`OptionsError::EmptyPrefix`] for an empty prefix.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.volume_name_prefix.is_empty() {
            return Err(OptionsError::EmptyPrefix);
        }
        Ok(())
    }

    /// The volume namer for provision-controller's [`Config::volume_namer`]: the PV
    /// name, also CreateVolume's name, `<prefix>-<uid>` (the uid without dashes and
    /// truncated to [`volume_name_uuid_length`](Self::volume_name_uuid_length) when set).
    ///
    /// ```
    /// use csi_provisioner::CsiOptions;
    /// use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    ///
    /// let mut claim = PersistentVolumeClaim::default();
    /// claim.metadata.uid = Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789".into());
    /// let short = CsiOptions::default().volume_name_prefix("vol").volume_name_uuid_length(Some(8));
    /// assert_eq!(short.volume_namer().name(&claim), "vol-0a1b2c3d");
    /// assert_eq!(
    ///     CsiOptions::default().volume_namer().name(&claim),
    ///     "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
    /// );
    /// ```
    ///
    /// [`Config::volume_namer`]: provision_controller::Config::volume_namer
    #[must_use]
    pub fn volume_namer(&self) -> VolumeNamer {
        let prefix = self.volume_name_prefix.clone();
        let length = self.volume_name_uuid_length;
        VolumeNamer::new(move |claim: &PersistentVolumeClaim| {
            let uid = claim.metadata.uid.as_deref().unwrap_or_default();
            volume_name(&prefix, uid, length)
        })
    }
}

/// Upstream's `makeVolumeName` (a length beyond the uid keeps the whole uid, where Go
/// would panic).
fn volume_name(prefix: &str, uid: &str, length: Option<usize>) -> String {
    match length {
        None => format!("{prefix}-{uid}"),
        Some(length) => {
            let compact: String = uid.chars().filter(|c| *c != '-').take(length).collect();
            format!("{prefix}-{compact}")
        }
    }
}

/// A new identity for a sidecar of `driver`, as upstream makes it:
/// `<milliseconds since the epoch>-<random below 10000>-<driver>`.
#[must_use]
pub fn provisioner_identity(driver: &str) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let random = RandomState::new().hash_one(millis) % 10_000;
    format!("{millis}-{random}-{driver}")
}

/// provision-controller's [`Provisioner`] for a CSI driver: CreateVolume and DeleteVolume
/// through a [`CsiDriver`], PVs as kubernetes-csi/external-provisioner makes them.
///
/// Register it with the [`volume_namer`](CsiOptions::volume_namer) of the same options:
///
/// ```no_run
/// use std::sync::Arc;
/// use csi_provisioner::{CsiOptions, CsiProvisioner, DriverCapabilities, csi::CsiDriver};
/// use provision_controller::{Config, ProvisionController};
///
/// # async fn run(driver: Arc<dyn CsiDriver>, client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let options = CsiOptions::default().extra_create_metadata(true);
/// let capabilities = DriverCapabilities::default().publish_unpublish(true);
/// let config = Config::default().volume_namer(options.volume_namer());
/// let provisioner = CsiProvisioner::new(driver, client.clone(), "hostpath.csi.k8s.io", capabilities, options)?;
/// ProvisionController::new(client, "hostpath.csi.k8s.io", provisioner)
///     .config(config)
///     .run(std::future::pending::<()>())
///     .await?;
/// # Ok(()) }
/// ```
///
/// # Errors it answers
/// - A claim with a snapshot or a claim as its data source, or a VolumeAttributesClass:
///   [`ProvisionError::Infeasible`] ("... not supported by this sidecar yet"): one
///   event, retried only after the controller's infeasible delay (5 minutes) or when the
///   class changes, and no CreateVolume (an empty volume would lose the data asked for).
///   A data source of another kind is a volume populator's: [`ProvisionError::Ignored`].
/// - CreateVolume's gRPC codes as upstream's `checkError`: `DeadlineExceeded`,
///   `Unavailable`, `Canceled`, `Aborted` are [`ProvisionError::InBackground`] (the
///   volume may still be made: the controller calls again, also once the claim is gone,
///   and the journal keeps the claim's intent, so the replayed CreateVolume finds the
///   volume by name and its PV is saved, released and deleted);
///   `InvalidArgument` is [`ProvisionError::Infeasible`]; `ResourceExhausted` is
///   [`ProvisionError::Reschedule`] when the driver has topology and a node was selected,
///   else [`ProvisionError::Failed`]; `AlreadyExists` (a volume of that name exists,
///   made with other parameters) is [`ProvisionError::NoChange`], not final as upstream
///   has it, because a final answer means that no volume exists; every other code is
///   [`ProvisionError::Failed`].
/// - A class or claim the request cannot be built from: [`ProvisionError::Failed`]; a
///   secret that cannot be read: [`ProvisionError::NoChange`] (retried), as upstream.
#[derive(Clone)]
pub struct CsiProvisioner {
    driver: Arc<dyn CsiDriver>,
    client: Client,
    name: String,
    capabilities: DriverCapabilities,
    options: CsiOptions,
}

impl std::fmt::Debug for CsiProvisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiProvisioner")
            .field("driver", &self.name)
            .field("capabilities", &self.capabilities)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What CreateVolume is asked, and what the PV takes from the class.
struct Prepared {
    request: CreateVolumeRequest,
    fs_type: String,
    secrets: VolumeSecrets,
}

impl CsiProvisioner {
    /// A provisioner for the driver `name` (its `GetPluginInfo` name, the classes'
    /// provisioner) reached through `driver`; `client` reads secrets, classes and
    /// VolumeAttachments.
    ///
    /// # Errors
    /// An invalid option.
    pub fn new(
        driver: Arc<dyn CsiDriver>,
        client: Client,
        name: impl Into<String>,
        capabilities: DriverCapabilities,
        mut options: CsiOptions,
    ) -> Result<Self, OptionsError> {
        options.validate()?;
        let name = name.into();
        if options.identity.is_empty() {
            options.identity = provisioner_identity(&name);
        }
        Ok(Self {
            driver,
            client,
            name,
            capabilities,
            options,
        })
    }

    /// The driver's name.
    #[must_use]
    pub fn driver_name(&self) -> &str {
        &self.name
    }

    /// The options in use (with the identity filled in).
    #[must_use]
    pub fn options(&self) -> &CsiOptions {
        &self.options
    }

    /// Whether requests carry accessibility requirements and PVs node affinity: topology
    /// is enabled and the driver has `VOLUME_ACCESSIBILITY_CONSTRAINTS` (upstream's
    /// `SupportsTopology`).
    #[must_use]
    pub fn supports_topology(&self) -> bool {
        self.options.topology.enabled && self.capabilities.accessibility_constraints
    }

    /// Builds CreateVolume's request (upstream's `prepareProvision`).
    async fn prepare(&self, options: &ProvisionOptions) -> Result<Prepared, ProvisionError> {
        let claim = &*options.claim;
        let class = &*options.storage_class;
        let class_name = class.metadata.name.clone().unwrap_or_default();
        match request::data_source(claim).map_err(ProvisionError::infeasible)? {
            DataSource::None => {}
            DataSource::Populator(kind) => {
                return Err(ProvisionError::Ignored {
                    reason: format!(
                        "claim {} has a data source of kind {kind}, which is not handled by the provisioner; assuming an external populator will provision it",
                        claim_key(claim)
                    ),
                });
            }
        }
        let spec = claim.spec.as_ref();
        if let Some(vac) = spec
            .and_then(|s| s.volume_attributes_class_name.as_deref())
            .filter(|v| !v.is_empty())
        {
            return Err(ProvisionError::infeasible(
                CsiError::VolumeAttributesClassUnsupported {
                    claim: claim_key(claim),
                    class: vac.to_owned(),
                },
            ));
        }
        if spec.and_then(|s| s.selector.as_ref()).is_some() {
            return Err(ProvisionError::failed(CsiError::Selector {
                claim: claim_key(claim),
            }));
        }
        let fs_type = request::fs_type(class, &self.options.default_fstype)
            .map_err(ProvisionError::failed)?;
        let required_bytes = request::requested_bytes(claim).map_err(ProvisionError::failed)?;
        let volume_capabilities = request::volume_capabilities(
            claim,
            class,
            &fs_type,
            self.capabilities.single_node_multi_writer,
        )
        .map_err(ProvisionError::failed)?;
        let accessibility_requirements = if self.supports_topology() {
            topology::accessibility_requirements_for_claim(
                &self.client,
                &self.name,
                class,
                claim.metadata.name.as_deref().unwrap_or_default(),
                options.selected_node_name.as_deref(),
                self.options.topology,
            )
            .await?
        } else {
            None
        };
        let parameters = class.parameters.clone().unwrap_or_default();
        let reference = |secret: SecretParams| {
            secrets::secret_reference(
                secret,
                &class_name,
                &parameters,
                &options.pv_name,
                Some(claim),
            )
            .map_err(|e| ProvisionError::NoChange(e.into()))
        };
        let volume_secrets = VolumeSecrets {
            provisioner: reference(secrets::PROVISIONER)?,
            controller_publish: reference(secrets::CONTROLLER_PUBLISH)?,
            node_stage: reference(secrets::NODE_STAGE)?,
            node_publish: reference(secrets::NODE_PUBLISH)?,
            controller_expand: reference(secrets::CONTROLLER_EXPAND)?,
            node_expand: reference(secrets::NODE_EXPAND)?,
            controller_modify: reference(secrets::CONTROLLER_MODIFY)?,
        };
        let credentials = match &volume_secrets.provisioner {
            Some(secret) => secrets::credentials(&self.client, secret)
                .await
                .map_err(|e| ProvisionError::NoChange(e.into()))?,
            None => HashMap::new(),
        };
        let mut driver_parameters =
            request::driver_parameters(&class_name, &parameters).map_err(ProvisionError::failed)?;
        if self.options.extra_create_metadata {
            driver_parameters.insert(
                PVC_NAME_KEY.into(),
                claim.metadata.name.clone().unwrap_or_default(),
            );
            driver_parameters.insert(
                PVC_NAMESPACE_KEY.into(),
                claim.metadata.namespace.clone().unwrap_or_default(),
            );
            driver_parameters.insert(PV_NAME_KEY.into(), options.pv_name.clone());
        }
        Ok(Prepared {
            request: CreateVolumeRequest {
                name: options.pv_name.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities,
                parameters: driver_parameters,
                secrets: credentials,
                volume_content_source: None,
                accessibility_requirements,
                mutable_parameters: HashMap::new(),
            },
            fs_type,
            secrets: volume_secrets,
        })
    }

    /// Deletes a volume made too small (upstream's `cleanupVolume`).
    async fn clean_up(
        &self,
        volume_id: &str,
        secrets: HashMap<String, String>,
    ) -> Result<(), Status> {
        let mut last = Ok(());
        for _ in 0..CLEANUP_ATTEMPTS {
            last = self
                .driver
                .delete_volume(DeleteVolumeRequest {
                    volume_id: volume_id.to_owned(),
                    secrets: secrets.clone(),
                })
                .await
                .map(|_| ());
            if last.is_ok() {
                break;
            }
        }
        last
    }

    /// The secrets of DeleteVolume (upstream's `handleSecretsForDeletion`): the secret the
    /// PV's deletion annotations name; without those annotations, the class's provisioner
    /// secret when the class still exists. A secret that cannot be read is left out (it
    /// may be gone already), as upstream does.
    async fn deletion_secrets(
        &self,
        volume: &PersistentVolume,
    ) -> Result<HashMap<String, String>, DeleteError> {
        let pv_name = volume.metadata.name.clone().unwrap_or_default();
        let annotations = volume.metadata.annotations.clone().unwrap_or_default();
        let reference = match (
            annotations.get(ANN_DELETION_SECRET_NAME),
            annotations.get(ANN_DELETION_SECRET_NAMESPACE),
        ) {
            (Some(name), Some(namespace)) => {
                if name.is_empty() || namespace.is_empty() {
                    tracing::debug!(pv = %pv_name, "the volume needs no deletion secrets");
                    None
                } else {
                    Some(SecretReference {
                        name: Some(name.clone()),
                        namespace: Some(namespace.clone()),
                    })
                }
            }
            _ => self.class_secret(volume, &pv_name).await?,
        };
        let Some(reference) = reference else {
            return Ok(HashMap::new());
        };
        match secrets::credentials(&self.client, &reference).await {
            Ok(credentials) => Ok(credentials),
            Err(error) => {
                tracing::warn!(pv = %pv_name, error = %chain(&error), "deleting the volume without its secrets");
                Ok(HashMap::new())
            }
        }
    }

    /// The provisioner secret the PV's class names (upstream's `getSecretsFromSC`).
    async fn class_secret(
        &self,
        volume: &PersistentVolume,
        pv_name: &str,
    ) -> Result<Option<SecretReference>, DeleteError> {
        let spec = volume.spec.as_ref();
        let Some(class_name) = spec
            .and_then(|s| s.storage_class_name.as_deref())
            .filter(|c| !c.is_empty())
        else {
            return Ok(None);
        };
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let class = match classes.get_opt(class_name).await {
            Ok(Some(class)) => class,
            Ok(None) => {
                tracing::warn!(pv = %pv_name, class = %class_name, "the volume's storage class is gone; deleting the volume without secrets");
                return Ok(None);
            }
            Err(error) => {
                return Err(DeleteError::Failed(
                    format!("reading storage class {class_name:?} of persistentvolume {pv_name} for its deletion secrets failed: {error}").into(),
                ));
            }
        };
        let Some(claim_ref) = spec.and_then(|s| s.claim_ref.as_ref()) else {
            tracing::warn!(pv = %pv_name, "the volume has no claim reference; deleting it without secrets");
            return Ok(None);
        };
        let mut claim = PersistentVolumeClaim::default();
        claim.metadata.name.clone_from(&claim_ref.name);
        claim.metadata.namespace.clone_from(&claim_ref.namespace);
        secrets::secret_reference(
            secrets::PROVISIONER,
            class_name,
            &class.parameters.unwrap_or_default(),
            pv_name,
            Some(&claim),
        )
        .map_err(|e| DeleteError::Failed(e.into()))
    }
}

/// The [`ProvisionError`] of a failed CreateVolume (upstream's `checkError` and the
/// library's `isInfeasibleError`). `may_reschedule`: the driver has topology and a node
/// was selected.
#[must_use]
pub fn create_error(error: CsiError, may_reschedule: bool) -> ProvisionError {
    match error.code() {
        Some(Code::InvalidArgument) => ProvisionError::infeasible(error),
        Some(Code::ResourceExhausted) if may_reschedule => ProvisionError::Reschedule(error.into()),
        Some(Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted) => {
            ProvisionError::in_background(error)
        }
        // A volume of this name exists (made with other parameters): not a final answer
        // here, whatever upstream says, since a final answer tells the controller that no
        // volume exists and it would forget the claim's intent (a leak when the claim is
        // gone and a replayed request differs from the first).
        Some(Code::AlreadyExists) => ProvisionError::NoChange(error.into()),
        _ => ProvisionError::failed(error),
    }
}

/// An error and its sources, `: `-joined, for logs.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        text.push_str(": ");
        text.push_str(&next.to_string());
        source = next.source();
    }
    text
}

#[async_trait]
impl Provisioner for CsiProvisioner {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        let prepared = self.prepare(options).await?;
        let requested = prepared
            .request
            .capacity_range
            .map_or(0, |r| r.required_bytes);
        let credentials = prepared.request.secrets.clone();
        let name = options.pv_name.clone();
        let answer = self.driver.create_volume(prepared.request).await;
        let response = match answer {
            Ok(response) => response,
            Err(status) => {
                let may_reschedule = self.supports_topology()
                    && options
                        .selected_node_name
                        .as_deref()
                        .is_some_and(|n| !n.is_empty());
                let error = CsiError::Call {
                    call: "CreateVolume",
                    target: format!("volume {name:?}"),
                    status,
                };
                return Err(create_error(error, may_reschedule));
            }
        };
        let Some(made) = response.volume.filter(|v| !v.volume_id.is_empty()) else {
            return Err(ProvisionError::failed(CsiError::NoVolume {
                driver: self.name.clone(),
                name,
            }));
        };
        let capacity_bytes = match made.capacity_bytes {
            // Unknown (NFS and the like): the request, as upstream.
            0 => requested,
            bytes if bytes < requested => {
                let cleanup = self.clean_up(&made.volume_id, credentials).await;
                let too_small = |cleanup: String| CsiError::TooSmall {
                    driver: self.name.clone(),
                    name: name.clone(),
                    made: bytes,
                    requested,
                    cleanup,
                };
                return Err(match cleanup {
                    Ok(()) => ProvisionError::failed(too_small(format!(
                        "volume {:?} was deleted again",
                        made.volume_id
                    ))),
                    // The volume is still there: asked again, as upstream.
                    Err(status) => ProvisionError::in_background(too_small(format!(
                        "deleting volume {:?} again failed ({:?}: {}), retried",
                        made.volume_id,
                        status.code(),
                        status.message()
                    ))),
                });
            }
            bytes => bytes,
        };
        let node_affinity = if self.supports_topology() {
            topology::node_affinity(&made.accessible_topology)
        } else {
            None
        };
        tracing::info!(pv = %name, volume_id = %made.volume_id, "CSI volume created");
        Ok(volume::build(volume::VolumeParts {
            pv_name: &name,
            driver: &self.name,
            identity: &self.options.identity,
            claim: &options.claim,
            class: &options.storage_class,
            fs_type: &prepared.fs_type,
            secrets: &prepared.secrets,
            volume_id: &made.volume_id,
            volume_context: &made.volume_context,
            capacity_bytes,
            node_affinity,
        }))
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let pv_name = volume.metadata.name.clone().unwrap_or_default();
        let Some(csi) = volume.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            return Err(DeleteError::Failed(
                CsiError::NotCsi { volume: pv_name }.into(),
            ));
        };
        if csi.driver != self.name {
            return Err(DeleteError::Ignored {
                reason: format!(
                    "persistentvolume {pv_name} is a volume of CSI driver {}, not of {}",
                    csi.driver, self.name
                ),
            });
        }
        let secrets = self.deletion_secrets(volume).await?;
        if self.capabilities.publish_unpublish {
            match attached_node(&self.client, &pv_name).await {
                Ok(None) => {}
                Ok(Some(node)) => {
                    return Err(DeleteError::Failed(
                        CsiError::Attached {
                            volume: pv_name,
                            node,
                        }
                        .into(),
                    ));
                }
                Err(source) => {
                    return Err(DeleteError::Failed(
                        CsiError::ListAttachments {
                            volume: pv_name,
                            source,
                        }
                        .into(),
                    ));
                }
            }
        }
        self.driver
            .delete_volume(DeleteVolumeRequest {
                volume_id: csi.volume_handle.clone(),
                secrets,
            })
            .await
            .map_err(|status| {
                DeleteError::Failed(
                    CsiError::Call {
                        call: "DeleteVolume",
                        target: format!(
                            "volume {:?} of persistentvolume {pv_name}",
                            csi.volume_handle
                        ),
                        status,
                    }
                    .into(),
                )
            })?;
        tracing::info!(pv = %pv_name, volume_id = %csi.volume_handle, "CSI volume deleted");
        Ok(())
    }

    /// Always: CSI has no capability for it; a driver without block support refuses the
    /// request (upstream's answer too).
    fn supports_block(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::{
        ControllerServiceCapability, PluginCapability, controller_service_capability::Rpc,
        plugin_capability::Service,
    };

    #[test]
    fn create_volume_codes_map_as_upstream() {
        let table = [
            (Code::DeadlineExceeded, false, "InBackground"),
            (Code::Unavailable, false, "InBackground"),
            (Code::Cancelled, false, "InBackground"),
            (Code::Aborted, false, "InBackground"),
            (Code::Aborted, true, "InBackground"),
            (Code::ResourceExhausted, false, "Failed"),
            (Code::ResourceExhausted, true, "Reschedule"),
            (Code::InvalidArgument, false, "Infeasible"),
            (Code::InvalidArgument, true, "Infeasible"),
            (Code::Internal, true, "Failed"),
            (Code::NotFound, false, "Failed"),
            (Code::AlreadyExists, false, "NoChange"),
            (Code::FailedPrecondition, false, "Failed"),
            (Code::OutOfRange, false, "Failed"),
            (Code::Unimplemented, false, "Failed"),
            (Code::Unknown, false, "Failed"),
        ];
        for (code, may_reschedule, expected) in table {
            let error = CsiError::Call {
                call: "CreateVolume",
                target: "volume \"pvc-1\"".into(),
                status: Status::new(code, "the driver says no"),
            };
            let mapped = create_error(error, may_reschedule);
            let variant = match &mapped {
                ProvisionError::InBackground(_) => "InBackground",
                ProvisionError::Failed(_) => "Failed",
                ProvisionError::Reschedule(_) => "Reschedule",
                ProvisionError::Infeasible(_) => "Infeasible",
                ProvisionError::NoChange(_) => "NoChange",
                _ => "other",
            };
            assert_eq!(
                variant, expected,
                "{code:?} may_reschedule={may_reschedule}"
            );
            let text = chain(&mapped);
            assert!(
                text.contains("CreateVolume of volume \"pvc-1\" failed")
                    && text.contains("the driver says no"),
                "{text}"
            );
        }
    }

    #[test]
    fn volume_names_as_upstream() {
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        assert_eq!(volume_name("pvc", uid, None), format!("pvc-{uid}"));
        assert_eq!(volume_name("vol", uid, Some(4)), "vol-0a1b");
        assert_eq!(volume_name("vol", uid, Some(0)), "vol-");
        assert_eq!(
            volume_name("vol", uid, Some(100)),
            "vol-0a1b2c3d4e5f6789abcdef0123456789"
        );
        assert_eq!(
            CsiOptions::default().volume_name_prefix("").validate(),
            Err(OptionsError::EmptyPrefix)
        );
    }

    #[test]
    fn identity_names_the_driver() {
        let identity = provisioner_identity("hostpath.csi.k8s.io");
        let parts: Vec<&str> = identity.splitn(3, '-').collect();
        assert_eq!(parts.len(), 3, "{identity}");
        assert!(parts[0].parse::<u128>().is_ok(), "{identity}");
        assert!(
            parts[1].parse::<u32>().is_ok_and(|r| r < 10_000),
            "{identity}"
        );
        assert_eq!(parts[2], "hostpath.csi.k8s.io");
    }

    #[test]
    fn capabilities_are_read_from_the_responses() {
        let plugin = GetPluginCapabilitiesResponse {
            capabilities: vec![PluginCapability {
                r#type: Some(plugin_capability::Type::Service(Service {
                    r#type: ServiceType::VolumeAccessibilityConstraints as i32,
                })),
            }],
        };
        let rpc = |t: RpcType| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(Rpc {
                r#type: t as i32,
            })),
        };
        let controller = ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(RpcType::CreateDeleteVolume),
                rpc(RpcType::PublishUnpublishVolume),
            ],
        };
        let caps = DriverCapabilities::from_responses(&plugin, &controller);
        assert_eq!(
            caps,
            DriverCapabilities::default()
                .accessibility_constraints(true)
                .publish_unpublish(true)
        );
        let controller = ControllerGetCapabilitiesResponse {
            capabilities: vec![rpc(RpcType::SingleNodeMultiWriter)],
        };
        let caps = DriverCapabilities::from_responses(
            &GetPluginCapabilitiesResponse::default(),
            &controller,
        );
        assert_eq!(
            caps,
            DriverCapabilities::default().single_node_multi_writer(true)
        );
    }
}
