//! [`CnsProvisioner`]: a [`Provisioner`] that backs each claim with one CNS block volume.

mod params;
mod pending;
mod quantity;
mod volume;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube_controller_kit::error::chain;
use provision_controller::annotations::ANN_PROVISIONED_BY;
use provision_controller::{
    AssetLookup, DeleteError, LateAssets, ProvisionError, ProvisionOptions, Provisioner,
};
use tracing::{debug, info, instrument, warn};

use crate::client::CnsClient;
use crate::error::Error;
use crate::wire::{
    ClusterFlavor, CnsVolume, CnsVolumeId, ContainerCluster, MoRef, QueryFilter, VolumeCreateSpec,
    VolumeMetadata, VolumeType,
};

use params::ClassParams;
pub use params::{
    DEFAULT_FS_TYPE, PARAM_DATASTORE_MOREF, PARAM_DATASTORE_URL, PARAM_FS_TYPE,
    PARAM_FS_TYPE_DEPRECATED, PARAM_STORAGE_POLICY_ID, PARAM_STORAGE_POLICY_NAME,
};
use pending::PendingCreates;
use volume::VolumeRequest;

/// The CSI driver name of vSphere volumes (`spec.csi.driver` of the PVs this crate makes).
pub const CSI_DRIVER: &str = "csi.vsphere.vmware.com";
/// The `type` volume attribute vsphere-csi-driver puts on block volumes.
const BLOCK_VOLUME_TYPE: &str = "vSphere CNS Block Volume";
/// The `type` volume attribute vsphere-csi-driver puts on file volumes (only ever on a
/// PV of an adopted volume: this provisioner creates block volumes).
const FILE_VOLUME_TYPE: &str = "vSphere CNS File Volume";

/// Why [`CnsProvisioner`] refused a claim or a CNS call failed; wrapped in
/// [`ProvisionError`] / [`DeleteError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProvisionerError {
    /// The claim has no `spec.resources.requests.storage`.
    #[error("persistentvolumeclaim {claim} has no storage request")]
    MissingCapacity {
        /// `namespace/name` of the claim.
        claim: String,
    },
    /// The claim's storage request is not a usable quantity.
    #[error("persistentvolumeclaim {claim}: storage request {quantity:?} is invalid: {reason}")]
    InvalidCapacity {
        /// `namespace/name` of the claim.
        claim: String,
        /// The quantity as written.
        quantity: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The claim asks for something a CNS block volume cannot give.
    #[error("persistentvolumeclaim {claim}: {reason}")]
    UnsupportedClaim {
        /// `namespace/name` of the claim.
        claim: String,
        /// What is not supported.
        reason: String,
    },
    /// The StorageClass has a parameter vsphere-csi-driver does not know.
    #[error("storageclass {class:?}: unknown parameter {parameter:?}")]
    UnknownParameter {
        /// The class name.
        class: String,
        /// The parameter as written.
        parameter: String,
    },
    /// A StorageClass parameter has a value that cannot be used.
    #[error("storageclass {class:?}: parameter {parameter:?} {reason}")]
    InvalidParameter {
        /// The class name.
        class: String,
        /// The parameter as written.
        parameter: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither the class nor the provisioner names a datastore.
    #[error(
        "storageclass {class:?} names no datastore (parameter datastoreurl or datastoremoref) \
         and the provisioner has no default datastore"
    )]
    NoDatastore {
        /// The class name.
        class: String,
    },
    /// [`CnsProvisioner::new`] was given an empty cluster ID: every volume would be
    /// created without an owner, and lookups by name would span all clusters.
    #[error(
        "the cluster id is empty: set [Global] cluster-id (or [Global] supervisor-id for \
         a workload cluster) in csi-vsphere.conf"
    )]
    EmptyClusterId,
    /// A create of this name was sent earlier and its outcome is unknown (it timed out or
    /// its connection broke after sending): the volume may still appear, so no other is
    /// created until a lookup finds it or the settle window
    /// ([`CnsProvisioner::create_settle`]) has passed since it was sent. Returned as
    /// [`ProvisionError::InBackground`].
    #[error(
        "a create of cns volume {volume:?} sent {sent_ago:?} ago may still land; no other is \
         created until a lookup finds it or {settle:?} have passed since it was sent"
    )]
    CreatePending {
        /// The volume name.
        volume: String,
        /// How long ago that create was sent.
        sent_ago: Duration,
        /// The settle window.
        settle: Duration,
    },
    /// The PV's volume and the other volumes of its name were deleted, but a create of
    /// that name this provisioner sent earlier, whose outcome is unknown, may still land
    /// (see [`ProvisionerError::CreatePending`]): `delete` fails until the settle window
    /// has passed since it was sent, so that the controller keeps the PV and deletes
    /// again, and the late volume goes too. Returned as [`DeleteError::Failed`].
    #[error(
        "deleted the volumes named {volume:?}, but a create of that name sent {sent_ago:?} \
         ago may still land; the PV is kept and deleted again until {settle:?} have passed \
         since it was sent"
    )]
    DeletePending {
        /// The volume name (the PV's name).
        volume: String,
        /// How long ago that create was sent.
        sent_ago: Duration,
        /// The settle window.
        settle: Duration,
    },
    /// A CNS call failed.
    #[error("{action} cns volume {volume:?} failed")]
    Cns {
        /// What was being done: `creating`, `looking up`, `deleting`.
        action: &'static str,
        /// The volume name or ID.
        volume: String,
        /// The client error.
        #[source]
        source: Error,
    },
}

/// A [`Provisioner`] for vSphere Cloud Native Storage: one `BLOCK` volume per claim.
///
/// - The volume is named after the PV (`options.pv_name`), its size is the claim's storage
///   request rounded up to MiB, its datastore comes from the class parameter `datastoreurl`
///   (through the URL map given with [`CnsProvisioner::datastore_url`]) or `datastoremoref`,
///   else from [`CnsProvisioner::default_datastores`], and its storage policy from
///   `storagepolicyid`. Unknown parameters are refused, as vsphere-csi-driver does.
/// - The PV it returns is a CSI PV of driver `csi.vsphere.vmware.com` whose volume handle is
///   the CNS volume ID, with `fsType` from `csi.storage.k8s.io/fstype` (default `ext4`), the
///   class's reclaim policy (default `Delete`) and mount options, and the claim's access
///   modes and volume mode.
///
/// # Guarantees
/// - **One volume per claim, the same for every replica.** Before creating, the volume is
///   looked up by name in this provisioner's container cluster, so a create repeated
///   after a restart (or after a timeout whose create went through) reuses the volume made
///   earlier; a `CnsAlreadyRegisteredFault` counts as success. Should several volumes of
///   that name exist (replicas whose creates raced, a timed-out create that landed after
///   the retry's lookup), the **lowest volume ID** wins, on the lookup before a create and
///   on the lookup right after it alike, so replicas that race converge on one volume.
///   Volumes of other clusters sharing the vCenter are never reused nor deleted.
/// - **`provision` never deletes a volume**, as a PV saved by another replica may name any
///   of them. The other volumes of that name (leftovers) are released later, never the one
///   a PV names:
///   - by [`LateAssets::volume_saved`], once a PV of that name is saved (by any replica):
///     the other volumes of this cluster with the PV's name are deleted;
///   - by `delete`, when the PV is deleted: the PV's volume and every other one of its name,
///     and again until a create of that name this provisioner sent can no longer land
///     (see below).
///
///   A create that lands after all of these (sent by a replica cut off from everything,
///   answered after the PV was saved and the sweep ran) stays until the PV is deleted with
///   reclaim policy `Delete`; under `Retain` it stays, as the PV's own volume does. One
///   sent by another replica (or by an earlier life of this one) that lands after the PV
///   was deleted, but within the settle window, goes with the controller's last sweep when
///   the window ends (see [`LateAssets::window`]): its journal keeps the
///   claim until then, and whichever replica leads makes a cleanup `provision` call that
///   finds the late volume and saves a PV for it, which is reclaimed.
/// - **Errors say what runs in the background.** A timeout or a broken connection after the
///   create was sent is [`ProvisionError::InBackground`] (the controller keeps retrying,
///   and the lookup then finds the volume); a failure before anything was sent is
///   [`ProvisionError::NoChange`]; a rejected claim, class or spec is
///   [`ProvisionError::Failed`].
/// - **A create that may still land is waited for, not repeated.** When a create of a name
///   was sent and its outcome is unknown (a timeout, on the call or on its task, or a
///   connection broken after sending), a later `provision` of that name whose lookup finds
///   no volume answers [`ProvisionError::InBackground`]
///   ([`ProvisionerError::CreatePending`]) instead of creating a second volume, until a
///   lookup finds a volume of that name (it is returned, as any found volume is) or the
///   settle window ([`CnsProvisioner::create_settle`]; default: the client's task timeout
///   plus its request timeout) has passed since that create was sent; then it creates
///   again, so a create that never lands blocks a claim for one window at most. A volume
///   found meanwhile does not end the wait for the create (it may be another replica's):
///   until the window has passed, `delete` of a PV of that name deletes what exists, then
///   fails ([`ProvisionerError::DeletePending`]), so the controller keeps the PV and
///   deletes again, and a volume that lands after the PV's own was deleted goes too. The
///   controller's crash-safe cleanup of a deleted claim looks for the asset through
///   `provision` too, so it keeps retrying and finds the late volume instead of
///   concluding that none exists. This memory is per provisioner (its clones share it)
///   and in memory only: another replica, or this one after a restart, does not know of
///   the pending create, and relies on the lowest-ID rule and the leftover sweeps above.
/// - **`Failed` means no volume of that name exists** (nor may one still land from a
///   create this provisioner sent), as crash-safe provisioning relies on: a claim or class
///   refused while a volume of that name exists is adopted (below), while none exists but
///   a create of that name may still land it is `InBackground`, and when the lookup fails
///   it is `NoChange`; a create that failed in vCenter is `Failed` only when no volume of
///   that name exists afterwards, else (or when the lookup fails) `InBackground`, and the
///   retry adopts the volume; a `CnsAlreadyRegisteredFault` whose volume cannot be found
///   is `InBackground`.
/// - **A refused claim or class hands over the volume of its name that exists.** When
///   the claim's request (say `4Ei`, or none) or its class (an unknown or bad parameter,
///   no datastore) is refused but a volume of the claim's name exists in this cluster
///   (made by an earlier attempt before the class or claim changed, by another replica,
///   or landed late from a timed-out create), `provision` returns a PV for it, the lowest
///   ID winning as on every lookup, with a warning saying why. That PV describes the
///   volume as CNS reports it, not the refused request: the volume's own capacity (`0`
///   when CNS reports none), block or file as CNS says, the claim's access modes (a block
///   volume never offers `ReadWriteMany` to a file system) and volume mode, the class's
///   reclaim policy and mount options, and the file system the class names (else
///   `ext4`). A live claim thus gets the disk made for it (the PV controller binds it only
///   if it satisfies the claim; else the PV is reclaimed once the claim goes), and the
///   crash-safe cleanup of a deleted claim saves a PV that the volume flow reclaims
///   (deleted, or kept under `Retain`), so its journal entry goes. While a create of that
///   name may still land, the volume found is handed over all the same (as a reused one
///   is), and `delete` of its PV waits for that create as described above.
/// - **`delete` deletes the PV's own volume** (handle) and its disk; a volume that is
///   already gone counts as deleted. For a PV we provisioned (it has the
///   `pv.kubernetes.io/provisioned-by` annotation) the other volumes of this cluster named
///   like the PV are deleted too, and while a create of that name this provisioner sent
///   may still land, `delete` fails after deleting them ([`DeleteError::Failed`] with
///   [`ProvisionerError::DeletePending`]) and is to be called again; a static PV only
///   loses its handle's volume. A PV with an
///   empty handle is an error and deletes nothing; PVs of other drivers are
///   [`DeleteError::Ignored`].
/// - **[`CnsProvisioner::delete_duplicate`] deletes only the duplicate PV's volume** (a
///   tool's call; the controller does not make it), and only when it is a
///   `csi.vsphere.vmware.com` handle other than the saved PV's; it never deletes by name.
/// - **`volume_saved` deletes only leftovers of a PV we provisioned**: for a
///   `csi.vsphere.vmware.com` PV with a non-empty handle and the
///   `pv.kubernetes.io/provisioned-by` annotation, the volumes of this cluster named like
///   the PV whose ID is not the handle (already gone counts as deleted). It never deletes
///   the saved PV's volume; a static PV or another driver's deletes nothing. Every leftover
///   is tried; a failed CNS call is [`DeleteError::Failed`] naming the volume.
///
/// ```no_run
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// use vsphere_cns::{ClusterFlavor, CnsClient, CnsProvisioner, MoRef, VirtualCenterConfig};
///
/// let client = CnsClient::connect(&VirtualCenterConfig::new("vc.example.com", "user", "password")).await?;
/// let provisioner = CnsProvisioner::new(client, "cluster-1", ClusterFlavor::Vanilla)?
///     .datastore_url("ds:///vmfs/volumes/vsan:52e1/", MoRef::datastore("datastore-59"));
/// # let _ = provisioner;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct CnsProvisioner {
    client: CnsClient,
    cluster: ContainerCluster,
    datastore_urls: BTreeMap<String, MoRef>,
    default_datastores: Vec<MoRef>,
    /// How long a create whose outcome is unknown may still land.
    create_settle: Duration,
    /// Creates whose outcome is unknown, by volume name; shared by clones.
    pending: PendingCreates,
}

impl CnsProvisioner {
    /// A provisioner creating volumes owned by Kubernetes cluster `cluster_id` of `flavor`
    /// (`[Global] cluster-id`, or the supervisor ID), with the client's user as the
    /// cluster's vSphere user.
    ///
    /// # Errors
    /// [`ProvisionerError::EmptyClusterId`] when `cluster_id` is empty or blank: the
    /// cluster ID scopes every lookup by name, so volumes of other clusters are never
    /// reused nor deleted.
    pub fn new(
        client: CnsClient,
        cluster_id: impl Into<String>,
        flavor: ClusterFlavor,
    ) -> Result<Self, ProvisionerError> {
        let cluster_id = cluster_id.into();
        if cluster_id.trim().is_empty() {
            return Err(ProvisionerError::EmptyClusterId);
        }
        let cluster = ContainerCluster::kubernetes(cluster_id, client.user(), flavor);
        let config = client.config();
        let create_settle = config.task_timeout.saturating_add(config.timeout);
        Ok(Self {
            client,
            cluster,
            datastore_urls: BTreeMap::new(),
            default_datastores: Vec::new(),
            create_settle,
            pending: PendingCreates::default(),
        })
    }

    /// Sets how long after a create whose outcome is unknown was sent (it timed out, on
    /// the call or on its task, or its connection broke after sending) no other volume of
    /// that name is created while lookups find none: `provision` answers
    /// [`ProvisionError::InBackground`] meanwhile, so the late volume is adopted rather
    /// than duplicated. It should cover the longest a create can take to finish in
    /// vCenter once sent.
    ///
    /// Default: the client's [`VirtualCenterConfig::task_timeout`](crate::VirtualCenterConfig::task_timeout)
    /// (the longest the client waits for a create, call and task) plus its
    /// [`VirtualCenterConfig::timeout`](crate::VirtualCenterConfig::timeout) (one more request's time as a margin
    /// for a task vCenter finishes after the client gave up): 6 minutes with the defaults.
    /// `Duration::ZERO` turns the wait off (every retry creates again, as before).
    #[must_use]
    pub fn create_settle(mut self, window: Duration) -> Self {
        self.create_settle = window;
        self
    }

    /// Sets the cluster distribution sent with each volume (`[Global]
    /// cluster-distribution`, for example `OpenShift`).
    #[must_use]
    pub fn cluster_distribution(mut self, distribution: impl Into<String>) -> Self {
        self.cluster.cluster_distribution = Some(distribution.into()).filter(|d| !d.is_empty());
        self
    }

    /// Maps a datastore URL (the `datastoreurl` class parameter) to its managed object.
    /// URLs are compared exactly, after trimming.
    #[must_use]
    pub fn datastore_url(mut self, url: impl Into<String>, datastore: MoRef) -> Self {
        self.datastore_urls
            .insert(url.into().trim().to_owned(), datastore);
        self
    }

    /// Datastores offered to CNS when the class names none. Default none: such classes
    /// are refused.
    #[must_use]
    pub fn default_datastores(mut self, datastores: Vec<MoRef>) -> Self {
        self.default_datastores = datastores;
        self
    }

    /// The container cluster sent with every created volume.
    pub fn container_cluster(&self) -> &ContainerCluster {
        &self.cluster
    }

    /// The datastores for `class`, from its parameters or the defaults.
    fn datastores(
        &self,
        class: &str,
        params: &ClassParams,
    ) -> Result<Vec<MoRef>, ProvisionerError> {
        if let Some(url) = &params.datastore_url {
            return self
                .datastore_urls
                .get(url)
                .map(|moref| vec![moref.clone()])
                .ok_or_else(|| ProvisionerError::InvalidParameter {
                    class: class.to_owned(),
                    parameter: PARAM_DATASTORE_URL.to_owned(),
                    reason: format!("names {url:?}, which is not a known datastore"),
                });
        }
        if let Some(moref) = &params.datastore_moref {
            return Ok(vec![MoRef::datastore(moref.clone())]);
        }
        if self.default_datastores.is_empty() {
            return Err(ProvisionerError::NoDatastore {
                class: class.to_owned(),
            });
        }
        Ok(self.default_datastores.clone())
    }

    /// The volumes of this provisioner's container cluster named `name`, ordered by ID.
    /// Volumes of other clusters sharing the vCenter are never reused nor removed.
    async fn find_by_name(&self, name: &str) -> Result<Vec<CnsVolume>, ProvisionerError> {
        let mut filter = QueryFilter::by_names([name]);
        filter.container_cluster_ids = vec![self.cluster.cluster_id.clone()];
        let mut volumes =
            self.client
                .query_volume(&filter)
                .await
                .map_err(|source| ProvisionerError::Cns {
                    action: "looking up",
                    volume: name.to_owned(),
                    source,
                })?;
        volumes.retain(|v| v.name.as_deref() == Some(name));
        volumes.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok(volumes)
    }

    /// The volume of `name` every replica settles on: the lowest ID among the volumes of
    /// that name. Nothing is deleted: a PV saved by another replica may name any of them.
    async fn existing(&self, name: &str) -> Result<Option<CnsVolumeId>, ProvisionerError> {
        let volumes = self.find_by_name(name).await?;
        if volumes.len() > 1 {
            info!(volume = name, count = volumes.len(), winner = %volumes[0].volume_id,
                "several cns volumes have this name; the lowest id is used, the others are released once the PV is saved");
        }
        Ok(volumes.into_iter().next().map(|v| v.volume_id))
    }

    /// The volume to return after creating `created`: the lowest ID among `created` and
    /// the volumes of that name found now, so that replicas whose creates raced return
    /// the same volume. When the lookup fails, `created` (should another replica's PV be
    /// saved first, its [`LateAssets::volume_saved`] releases this one).
    async fn winner_after_create(&self, name: &str, created: CnsVolumeId) -> CnsVolumeId {
        match self.find_by_name(name).await {
            Ok(volumes) => match volumes.into_iter().next() {
                Some(lowest) if lowest.volume_id < created => {
                    info!(volume = name, volume_id = %lowest.volume_id, created = %created,
                        "another cns volume of this name has a lower id; using it, the created one is released once the PV is saved");
                    lowest.volume_id
                }
                _ => created,
            },
            Err(e) => {
                warn!(volume = name, error = %chain(&e), "could not look for other cns volumes of this name");
                created
            }
        }
    }

    /// Deletes every volume of this cluster named `name` except `keep` (leftovers of
    /// timed-out or racing creates). Every leftover is tried; the first failure is
    /// returned, the others are logged.
    async fn delete_leftovers(
        &self,
        name: &str,
        keep: &CnsVolumeId,
    ) -> Result<(), ProvisionerError> {
        let mut failed = None;
        for volume in self.find_by_name(name).await? {
            if &volume.volume_id == keep {
                continue;
            }
            warn!(volume = name, volume_id = %volume.volume_id, kept = %keep,
                "deleting a leftover cns volume of this name");
            if let Err(e) = self.delete_id(&volume.volume_id).await {
                match failed {
                    None => failed = Some(e),
                    Some(_) => {
                        warn!(error = %chain(&e), "could not delete a leftover cns volume")
                    }
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Deletes volume `id` and its disk; a volume already gone counts as deleted.
    async fn delete_id(&self, id: &CnsVolumeId) -> Result<(), ProvisionerError> {
        match self.client.delete_volume(id, true).await {
            Ok(()) => info!(volume_id = %id, "cns volume deleted"),
            Err(e) if e.is_not_found() => info!(volume_id = %id, "cns volume already gone"),
            Err(source) => {
                return Err(ProvisionerError::Cns {
                    action: "deleting",
                    volume: id.to_string(),
                    source,
                });
            }
        }
        Ok(())
    }

    /// Answers a claim or class refused now (`refused`). [`ProvisionError::Failed`] only
    /// when no volume of the claim's name exists (nor may one still land from a create this
    /// provisioner sent: then [`ProvisionError::InBackground`]). When one exists (made by
    /// an earlier attempt before the class or request changed, by another replica, or left
    /// by a create that landed late), it is **adopted**: the PV returned describes it as
    /// CNS reports it (its own capacity, see [`volume::adopted`]), the lowest ID winning
    /// when several have the name, so that the controller saves a PV for it: a live claim
    /// gets the disk made for it (bound only if it satisfies the claim), and a deleted
    /// claim's volume is reclaimed through its PV (deleted, or kept under `Retain`).
    /// Answering `NoChange` instead would keep a deleted claim's crash-safety journal
    /// entry forever, as its cleanup asks `provision` for the asset until it gets a PV or
    /// a final answer. A failed lookup is [`ProvisionError::NoChange`] (nothing known).
    async fn refused(
        &self,
        options: &ProvisionOptions,
        refused: ProvisionerError,
    ) -> Result<PersistentVolume, ProvisionError> {
        let name = &options.pv_name;
        let volumes = match self.find_by_name(name).await {
            Ok(volumes) => volumes,
            Err(lookup) => {
                warn!(volume = name, error = %chain(&lookup), refused = %chain(&refused),
                    "cannot tell whether a cns volume exists for a refused claim");
                return Err(ProvisionError::NoChange(Box::new(refused)));
            }
        };
        let count = volumes.len();
        let Some(lowest) = volumes.into_iter().next() else {
            return Err(match self.unresolved_create(name) {
                None => ProvisionError::failed(refused),
                Some(pending) => {
                    warn!(volume = name, error = %chain(&refused), pending = %pending,
                        "refusing a claim whose cns volume may still be created; asked again until it lands or the settle window passes");
                    ProvisionError::InBackground(Box::new(refused))
                }
            });
        };
        warn!(volume = name, volume_id = %lowest.volume_id, capacity_in_mb = lowest.capacity_in_mb,
            count, error = %chain(&refused),
            "the claim's request or class is refused, but a cns volume of its name exists; handing that volume over as it is (the lowest id when several)");
        Ok(volume::adopted(options, &lowest))
    }

    /// The error telling that a create of `name` sent less than the settle window ago may
    /// still land; `None` when there is none (an expired one is forgotten).
    fn unresolved_create(&self, name: &str) -> Option<ProvisionerError> {
        let pending = self.pending.unresolved(name, self.create_settle)?;
        Some(ProvisionerError::CreatePending {
            volume: name.to_owned(),
            sent_ago: millis(pending.age),
            settle: self.create_settle,
        })
    }

    /// Maps a failed create. A fault means the create ran and failed; a vCenter may still
    /// have left a volume behind (a task that failed after creating the disk). Nothing is
    /// deleted (another replica's PV may name a volume of that name): the failure is
    /// [`ProvisionError::Failed`] only when no volume of that name exists, else (or when
    /// that cannot be told) [`ProvisionError::InBackground`], and the retry's lookup
    /// adopts the volume. A create whose outcome is unknown (sent at `sent_at`) is
    /// remembered, so that retries wait for it rather than create another volume.
    async fn failed_create(
        &self,
        name: &str,
        sent_at: tokio::time::Instant,
        error: Error,
    ) -> ProvisionError {
        let outcome = create_error(name, error);
        let source = match outcome {
            ProvisionError::Failed(source) => source,
            ProvisionError::InBackground(source) => {
                self.pending.record(name, sent_at, self.create_settle);
                warn!(volume = name, error = %chain(&*source), settle = ?self.create_settle,
                    "the cns create may still land; retries wait for it instead of creating another volume");
                return ProvisionError::InBackground(source);
            }
            other => return other,
        };
        match self.find_by_name(name).await {
            Ok(volumes) if volumes.is_empty() => ProvisionError::Failed(source),
            Ok(volumes) => {
                warn!(volume = name, volume_id = %volumes[0].volume_id,
                    "a cns volume of this name exists after the failed create; the retry uses it");
                ProvisionError::InBackground(source)
            }
            Err(lookup) => {
                warn!(volume = name, error = %chain(&lookup), "cannot look for a volume left by the failed create");
                ProvisionError::InBackground(source)
            }
        }
    }
}

/// `age` rounded down to whole milliseconds (for messages).
fn millis(age: Duration) -> Duration {
    Duration::from_millis(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
}

/// A failed CNS create of `name`.
fn cns(name: &str, source: Error) -> ProvisionerError {
    ProvisionerError::Cns {
        action: "creating",
        volume: name.to_owned(),
        source,
    }
}

impl CnsProvisioner {
    #[instrument(skip_all, fields(pv = duplicate.metadata.name.as_deref().unwrap_or_default()))]
    /// Deletes the CNS volume `duplicate` names when it is not the one `saved` names
    /// (a replica's PV that lost the race to be saved). The controller no longer calls
    /// this (its `volume_saved` sweep of the saved PV releases every other volume of the
    /// name); kept for tools that clean up by hand.
    ///
    /// # Errors
    /// The CNS delete failed.
    pub async fn delete_duplicate(
        &self,
        duplicate: &PersistentVolume,
        saved: &PersistentVolume,
    ) -> Result<(), DeleteError> {
        let Some(id) = our_handle(duplicate).filter(|id| !id.as_str().is_empty()) else {
            debug!("the duplicate PV names no cns volume; nothing to release");
            return Ok(());
        };
        let saved_handle = saved
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.as_str());
        if saved_handle == Some(id.as_str()) {
            debug!(volume_id = %id, "the saved PV names the same cns volume; nothing to release");
            return Ok(());
        }
        warn!(volume_id = %id, saved = saved_handle.unwrap_or_default(),
            "another PV of this name was saved first; deleting the cns volume only the duplicate names");
        self.delete_id(&id)
            .await
            .map_err(|e| DeleteError::Failed(Box::new(e)))
    }
}

/// The volume handle of `volume` when it is a CSI PV of [`CSI_DRIVER`].
fn our_handle(volume: &PersistentVolume) -> Option<CnsVolumeId> {
    let csi = volume.spec.as_ref().and_then(|s| s.csi.as_ref())?;
    (csi.driver == CSI_DRIVER).then(|| CnsVolumeId::new(csi.volume_handle.clone()))
}

/// The name of `volume` when a provisioner made it (it carries
/// `pv.kubernetes.io/provisioned-by`), so that its CNS volume is named after it; `None`
/// for a static PV, whose name says nothing about CNS names.
fn provisioned_name(volume: &PersistentVolume) -> Option<&str> {
    let provisioned = volume
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANN_PROVISIONED_BY));
    volume
        .metadata
        .name
        .as_deref()
        .filter(|name| provisioned && !name.is_empty())
}

impl CnsProvisioner {
    /// A `provision` call, or with `cleanup` a lookup that creates nothing
    /// ([`AssetLookup::find`]; `Ignored` when no volume exists).
    async fn answer(
        &self,
        options: &ProvisionOptions,
        cleanup: bool,
    ) -> Result<PersistentVolume, ProvisionError> {
        let name = &options.pv_name;
        let checked = VolumeRequest::new(options)
            .and_then(|request| Ok((self.datastores(&request.class, &request.params)?, request)));
        let (datastores, request) = match checked {
            Ok(checked) => checked,
            Err(refused) => return self.refused(options, refused).await,
        };
        // Nothing was sent yet, so a failed lookup changes nothing.
        if let Some(id) = self
            .existing(name)
            .await
            .map_err(|e| ProvisionError::NoChange(Box::new(e)))?
        {
            info!(volume_id = %id, "reusing the cns volume made earlier");
            return Ok(request.volume(name, &id));
        }
        // An earlier create may still land: wait for it rather than make a second volume.
        if let Some(pending) = self.unresolved_create(name) {
            info!(error = %pending, "not creating: an earlier create may still land");
            return Err(ProvisionError::InBackground(Box::new(pending)));
        }
        // A cleanup records a volume that exists; it never creates one.
        if cleanup {
            info!("cleanup: no cns volume of this name exists, and none is created");
            return Err(ProvisionError::Ignored {
                reason: format!("no cns volume named {name:?} exists to clean up"),
            });
        }
        let spec = VolumeCreateSpec {
            name: name.clone(),
            volume_type: VolumeType::Block,
            datastores,
            metadata: VolumeMetadata::for_cluster(self.cluster.clone(), Vec::new()),
            capacity_in_mb: i64::try_from(request.mib).expect("capacity is capped at 2^40 MiB"),
            backing_disk_id: None,
            profile_id: request.params.storage_policy_id.clone(),
        };
        debug!(capacity_in_mb = spec.capacity_in_mb, "creating cns volume");
        let sent_at = tokio::time::Instant::now();
        let id = match self.client.create_volume(&spec).await {
            Ok(id) => id,
            Err(e) if e.fault_type() == Some("CnsAlreadyRegisteredFault") => {
                match self.existing(name).await {
                    Ok(Some(id)) => id,
                    // A volume exists (CNS says so) but cannot be found by name yet.
                    _ => return Err(ProvisionError::InBackground(Box::new(cns(name, e)))),
                }
            }
            Err(e) => return Err(self.failed_create(name, sent_at, e).await),
        };
        info!(volume_id = %id, capacity_in_mb = spec.capacity_in_mb, "cns volume created");
        let id = self.winner_after_create(name, id).await;
        Ok(request.volume(name, &id))
    }
}

#[async_trait]
impl Provisioner for CnsProvisioner {
    #[instrument(skip_all, fields(pv = %options.pv_name))]
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        self.answer(options, false).await
    }

    #[instrument(skip_all, fields(pv = volume.metadata.name.as_deref().unwrap_or_default()))]
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let Some(id) = our_handle(volume) else {
            return Err(DeleteError::Ignored {
                reason: format!("not a {CSI_DRIVER} volume"),
            });
        };
        if id.as_str().is_empty() {
            return Err(DeleteError::Failed(
                format!(
                    "persistentvolume {:?} has an empty volume handle",
                    volume.metadata.name.as_deref().unwrap_or_default()
                )
                .into(),
            ));
        }
        let failed = |e| DeleteError::Failed(Box::new(e));
        self.delete_id(&id).await.map_err(failed)?;
        // Volumes of the same name are leftovers of timed-out or racing creates, released
        // with the PV we provisioned.
        if let Some(name) = provisioned_name(volume) {
            self.delete_leftovers(name, &id).await.map_err(failed)?;
            // A create of this name that may still land would leave a volume no PV names
            // once this PV is gone: keep the PV (the controller deletes again) until it
            // can no longer land.
            if let Some(pending) = self.pending.unresolved(name, self.create_settle) {
                let error = ProvisionerError::DeletePending {
                    volume: name.to_owned(),
                    sent_ago: millis(pending.age),
                    settle: self.create_settle,
                };
                warn!(volume_id = %id, error = %error, "a create of this name may still land; the PV is deleted again later");
                return Err(failed(error));
            }
        }
        Ok(())
    }

    fn supports_block(&self) -> bool {
        true
    }
}

/// A cleanup looks for the CNS volume of the PV name and creates none.
#[async_trait]
impl AssetLookup for CnsProvisioner {
    #[instrument(skip_all, fields(pv = %options.pv_name))]
    async fn find(
        &self,
        options: &ProvisionOptions,
    ) -> Result<Option<PersistentVolume>, ProvisionError> {
        self.answer(options, true).await.map(Some)
    }
}

/// CNS names are not unique and a create can land after its client gave up: leftovers of
/// a saved PV's name are released, again when the settle window has passed.
#[async_trait]
impl LateAssets for CnsProvisioner {
    #[instrument(skip_all, fields(pv = saved.metadata.name.as_deref().unwrap_or_default()))]
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), DeleteError> {
        let Some(id) = our_handle(saved).filter(|id| !id.as_str().is_empty()) else {
            debug!("the saved PV names no cns volume; nothing to release");
            return Ok(());
        };
        let Some(name) = provisioned_name(saved) else {
            debug!(volume_id = %id, "a static PV; cns names say nothing about it, nothing to release");
            return Ok(());
        };
        // The saved PV is the one record of the claim's volume: no PV can name another
        // volume of its name any more.
        self.delete_leftovers(name, &id)
            .await
            .map_err(|e| DeleteError::Failed(Box::new(e)))
    }

    /// The settle window ([`CnsProvisioner::create_settle`]): a create sent by any replica
    /// lands within it, so the controller sweeps a saved PV's leftovers once more when it
    /// has passed (and at a restarted replica's first sync). `None` when the window is 0.
    fn window(&self) -> Option<std::time::Duration> {
        (!self.create_settle.is_zero()).then_some(self.create_settle)
    }
}

/// Maps a failed create: may the create still be running in vCenter?
fn create_error(name: &str, source: Error) -> ProvisionError {
    let sent = match &source {
        // The create call itself was answered with a fault, or its task ended in error,
        // or its volume result has a fault: nothing runs any more.
        Error::Fault { operation, .. } if *operation == "CnsCreateVolume" => Some(false),
        // Nothing reached the server.
        Error::Transport {
            operation, source, ..
        } if *operation == "CnsCreateVolume" && source.is_connect() => None,
        Error::Settings(_) => Some(false),
        // Timeouts, broken connections, faults while waiting for the task, odd answers:
        // the create may have been received and may complete.
        _ => Some(true),
    };
    let error = Box::new(cns(name, source));
    match sent {
        Some(true) => ProvisionError::InBackground(error),
        Some(false) => ProvisionError::Failed(error),
        None => ProvisionError::NoChange(error),
    }
}

#[cfg(test)]
mod tests;
