//! The binder's cache of watched objects and its pure decisions: given the cache and one
//! changed key, which single write (if any) brings that object closer to its desired state.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::ResourceExt;
use kube_controller_kit::quantity::Quantity;
use serde_json::{Value, json};
use tracing::debug;

/// Claim annotation naming the provisioner that should provision it.
pub(super) const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The beta spelling of [`ANN_STORAGE_PROVISIONER`], still read by older provisioners.
pub(super) const ANN_BETA_STORAGE_PROVISIONER: &str =
    "volume.beta.kubernetes.io/storage-provisioner";
/// Claim annotation the scheduler sets for `WaitForFirstConsumer` classes.
pub(super) const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Claim annotation marking a finished bind.
pub(super) const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Claim annotation marking that the controller (not a user) set `spec.volumeName`.
pub(super) const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Volume annotation naming the provisioner that created it: a dynamically provisioned volume.
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The finalizer that keeps a claim while a pod uses it (kube-controller-manager's
/// pvc-protection controller removes it).
pub(super) const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The finalizer that keeps a volume while it is bound (kube-controller-manager's
/// pv-protection controller removes it).
pub(super) const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
/// Provisioner name of classes for statically created volumes; never annotated.
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// Namespace and name of a claim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ClaimKey {
    pub(super) namespace: String,
    pub(super) name: String,
}

impl ClaimKey {
    fn of(claim: &PersistentVolumeClaim) -> Self {
        Self {
            namespace: claim.namespace().unwrap_or_default(),
            name: claim.name_any(),
        }
    }

    /// The claim a volume's `spec.claimRef` names, when it names one.
    fn referenced_by(volume: &PersistentVolume) -> Option<Self> {
        let claim_ref = volume.spec.as_ref()?.claim_ref.as_ref()?;
        let namespace = claim_ref.namespace.as_deref().filter(|n| !n.is_empty())?;
        let name = claim_ref.name.as_deref().filter(|n| !n.is_empty())?;
        Some(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One unit of work: everything about one claim or one volume is decided under its key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Key {
    Claim(ClaimKey),
    Volume(String),
}

/// What the binder keeps of a StorageClass.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClassInfo {
    provisioner: String,
    wait_for_first_consumer: bool,
}

impl From<&StorageClass> for ClassInfo {
    fn from(class: &StorageClass) -> Self {
        Self {
            provisioner: class.provisioner.clone(),
            wait_for_first_consumer: class.volume_binding_mode.as_deref()
                == Some("WaitForFirstConsumer"),
        }
    }
}

/// One write (or check) the binder performs for a key.
#[derive(Debug, PartialEq)]
pub(super) enum Action {
    /// Set both storage-provisioner annotations on the claim.
    AnnotateClaim {
        claim: ClaimKey,
        provisioner: String,
    },
    /// Set the volume's `status.phase`.
    SetVolumePhase { volume: String, phase: &'static str },
    /// The volume's claim is not in the cache: get it from the server, and release the volume
    /// when it is gone or has another uid.
    ReleaseIfGone {
        volume: String,
        claim: ClaimKey,
        uid: String,
    },
    /// Bind the volume and its claim.
    Bind(Box<BindPlan>),
    /// The volume's claim is bound to another volume: make the volume `Available` again,
    /// removing its claimRef (`clear_claim_ref`, when the controller had set it) or only the
    /// claimRef's uid (a volume pre-bound by its creator stays reserved for the claim).
    Unbind {
        volume: String,
        clear_claim_ref: bool,
    },
    /// Remove a protection finalizer: the claim's once it is being deleted (no pod uses it:
    /// the sim has none), the volume's once it is being deleted and not `Bound`.
    RemoveProtection(Box<Unprotect>),
    /// Put a protection finalizer back on an object that is not being deleted, as
    /// kube-controller-manager's pvc-protection and pv-protection controllers do when
    /// someone removed it ([`Modes::protect`]).
    AddProtection(Box<Unprotect>),
}

/// A protection finalizer to remove or add, with the version it was planned on (a
/// precondition: another writer's finalizers are never dropped).
#[derive(Debug, PartialEq)]
pub(super) struct Unprotect {
    pub(super) key: Key,
    /// The finalizers the object gets.
    pub(super) finalizers: Vec<String>,
    pub(super) resource_version: Option<String>,
}

/// What the binder plays of kube-controller-manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Modes {
    /// The persistent-volume controller: annotations, binding, phases, release.
    pub(crate) bind: bool,
    /// The protection controllers put a missing protection finalizer back on an object that
    /// is not being deleted. (They remove it, when due, in any mode: only the sim's
    /// admission adds it.)
    pub(crate) protect: bool,
}

impl Default for Modes {
    /// The binder alone: binding, no re-adding.
    fn default() -> Self {
        Self {
            bind: true,
            protect: false,
        }
    }
}

/// The [`Action::AddProtection`] of an object that is not being deleted and lacks
/// `finalizer`.
fn protect(key: Key, meta: &ObjectMeta, finalizer: &str) -> Option<Action> {
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    finalizers.push(finalizer.to_owned());
    Some(Action::AddProtection(Box::new(Unprotect {
        key,
        finalizers,
        resource_version: meta.resource_version.clone(),
    })))
}

/// The [`Action::RemoveProtection`] of an object being deleted that still has
/// `finalizer`.
fn unprotect(key: Key, meta: &ObjectMeta, finalizer: &str) -> Option<Action> {
    meta.deletion_timestamp.as_ref()?;
    let finalizers = meta.finalizers.as_deref().unwrap_or_default();
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    Some(Action::RemoveProtection(Box::new(Unprotect {
        key,
        finalizers: finalizers
            .iter()
            .filter(|f| *f != finalizer)
            .cloned()
            .collect(),
        resource_version: meta.resource_version.clone(),
    })))
}

/// The writes that finish binding a volume to its claim; `None` fields are already done.
#[derive(Debug, PartialEq)]
pub(super) struct BindPlan {
    pub(super) volume: String,
    pub(super) claim: ClaimKey,
    /// The claim's uid, to be written into the volume's claimRef.
    pub(super) claim_uid_for_volume: Option<String>,
    /// Whether the volume's phase must become `Bound`.
    pub(super) volume_phase: bool,
    /// Merge patch of the claim's annotations and `spec.volumeName`.
    pub(super) claim_patch: Option<Value>,
    /// Merge patch of the claim's status.
    pub(super) claim_status_patch: Option<Value>,
}

/// The watched objects, with an index from claims to the volumes whose claimRef names them.
#[derive(Default)]
pub(super) struct Cache {
    /// What is planned.
    pub(super) modes: Modes,
    classes: HashMap<String, ClassInfo>,
    claims: HashMap<ClaimKey, PersistentVolumeClaim>,
    /// UIDs of claims seen deleted (by a delete event or a relist without them). A
    /// write's answer or a GET that raced with the deletion carries the claim as it was
    /// before; folded in after the delete event it would bring the claim back for good
    /// (chaos seed 10231 claim-061: its PV was bound to the ghost and never released).
    /// Kept for the binder's life: one UID per deleted claim (a few MB after the bench's
    /// 50,000 claims).
    deleted_claims: HashSet<String>,
    volumes: HashMap<String, PersistentVolume>,
    volumes_by_claim: HashMap<ClaimKey, BTreeSet<String>>,
    staged_classes: HashMap<String, ClassInfo>,
    staged_claims: HashMap<ClaimKey, PersistentVolumeClaim>,
    staged_volumes: HashMap<String, PersistentVolume>,
}

/// Whether `new` is a later version than `old`. Resource versions are opaque to clients, but
/// the sim's are increasing integers; anything else counts as newer.
fn is_newer(old: Option<&str>, new: Option<&str>) -> bool {
    match (
        old.and_then(|v| v.parse::<u64>().ok()),
        new.and_then(|v| v.parse::<u64>().ok()),
    ) {
        (Some(old), Some(new)) => new > old,
        _ => true,
    }
}

impl Cache {
    /// An empty cache planning what `modes` asks.
    pub(super) fn new(modes: Modes) -> Self {
        Self {
            modes,
            ..Self::default()
        }
    }

    fn claims_of_class(&self, class: &str) -> Vec<Key> {
        self.claims
            .iter()
            .filter(|(_, claim)| {
                claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.as_deref())
                    == Some(class)
            })
            .map(|(key, _)| Key::Claim(key.clone()))
            .collect()
    }

    fn claim_and_volumes(&self, key: &ClaimKey) -> Vec<Key> {
        let volumes = self.volumes_by_claim.get(key).into_iter().flatten();
        std::iter::once(Key::Claim(key.clone()))
            .chain(volumes.map(|name| Key::Volume(name.clone())))
            .collect()
    }

    fn everything(&self) -> Vec<Key> {
        let claims = self.claims.keys().map(|k| Key::Claim(k.clone()));
        claims
            .chain(self.volumes.keys().map(|n| Key::Volume(n.clone())))
            .collect()
    }

    pub(super) fn apply_class(&mut self, class: &StorageClass) -> Vec<Key> {
        let name = class.name_any();
        let info = ClassInfo::from(class);
        if self.classes.get(&name) == Some(&info) {
            return Vec::new();
        }
        self.classes.insert(name.clone(), info);
        self.claims_of_class(&name)
    }

    pub(super) fn delete_class(&mut self, name: &str) -> Vec<Key> {
        self.classes.remove(name);
        Vec::new()
    }

    pub(super) fn begin_classes(&mut self) -> Vec<Key> {
        self.staged_classes.clear();
        Vec::new()
    }

    pub(super) fn stage_class(&mut self, class: &StorageClass) -> Vec<Key> {
        self.staged_classes
            .insert(class.name_any(), ClassInfo::from(class));
        Vec::new()
    }

    pub(super) fn finish_classes(&mut self) -> Vec<Key> {
        self.classes = std::mem::take(&mut self.staged_classes);
        self.everything()
    }

    pub(super) fn apply_claim(&mut self, mut claim: PersistentVolumeClaim) -> Vec<Key> {
        let key = ClaimKey::of(&claim);
        if claim
            .uid()
            .is_some_and(|uid| self.deleted_claims.contains(&uid))
        {
            return Vec::new();
        }
        if let Some(old) = self.claims.get(&key)
            && old.uid() == claim.uid()
            && !is_newer(
                old.resource_version().as_deref(),
                claim.resource_version().as_deref(),
            )
        {
            return Vec::new();
        }
        claim.metadata.managed_fields = None;
        self.claims.insert(key.clone(), claim);
        self.claim_and_volumes(&key)
    }

    pub(super) fn delete_claim(&mut self, claim: &PersistentVolumeClaim) -> Vec<Key> {
        let key = ClaimKey::of(claim);
        self.deleted_claims.extend(claim.uid());
        if let Some(cached) = self.claims.remove(&key)
            && cached.uid() != claim.uid()
        {
            self.deleted_claims.extend(cached.uid());
        }
        self.claim_and_volumes(&key)
    }

    pub(super) fn begin_claims(&mut self) -> Vec<Key> {
        self.staged_claims.clear();
        Vec::new()
    }

    pub(super) fn stage_claim(&mut self, mut claim: PersistentVolumeClaim) -> Vec<Key> {
        claim.metadata.managed_fields = None;
        self.staged_claims.insert(ClaimKey::of(&claim), claim);
        Vec::new()
    }

    pub(super) fn finish_claims(&mut self) -> Vec<Key> {
        let mut dirty = self.everything();
        let claims = std::mem::take(&mut self.staged_claims);
        let listed: HashSet<String> = claims.values().filter_map(ResourceExt::uid).collect();
        for (_, old) in std::mem::replace(&mut self.claims, claims) {
            self.deleted_claims
                .extend(old.uid().filter(|uid| !listed.contains(uid)));
        }
        dirty.extend(self.everything());
        dirty
    }

    fn unindex(&mut self, volume: &PersistentVolume) -> Option<ClaimKey> {
        let key = ClaimKey::referenced_by(volume)?;
        if let Some(names) = self.volumes_by_claim.get_mut(&key) {
            names.remove(&volume.name_any());
            if names.is_empty() {
                self.volumes_by_claim.remove(&key);
            }
        }
        Some(key)
    }

    fn index(&mut self, volume: &PersistentVolume) -> Option<ClaimKey> {
        let key = ClaimKey::referenced_by(volume)?;
        self.volumes_by_claim
            .entry(key.clone())
            .or_default()
            .insert(volume.name_any());
        Some(key)
    }

    pub(super) fn apply_volume(&mut self, mut volume: PersistentVolume) -> Vec<Key> {
        let name = volume.name_any();
        let mut dirty = vec![Key::Volume(name.clone())];
        if let Some(old) = self.volumes.remove(&name) {
            if old.uid() == volume.uid()
                && !is_newer(
                    old.resource_version().as_deref(),
                    volume.resource_version().as_deref(),
                )
            {
                self.volumes.insert(name, old);
                return Vec::new();
            }
            dirty.extend(self.unindex(&old).map(Key::Claim));
        }
        volume.metadata.managed_fields = None;
        dirty.extend(self.index(&volume).map(Key::Claim));
        self.volumes.insert(name, volume);
        dirty
    }

    pub(super) fn delete_volume(&mut self, volume: &PersistentVolume) -> Vec<Key> {
        let Some(old) = self.volumes.remove(&volume.name_any()) else {
            return Vec::new();
        };
        self.unindex(&old).map(Key::Claim).into_iter().collect()
    }

    pub(super) fn begin_volumes(&mut self) -> Vec<Key> {
        self.staged_volumes.clear();
        Vec::new()
    }

    pub(super) fn stage_volume(&mut self, mut volume: PersistentVolume) -> Vec<Key> {
        volume.metadata.managed_fields = None;
        self.staged_volumes.insert(volume.name_any(), volume);
        Vec::new()
    }

    pub(super) fn finish_volumes(&mut self) -> Vec<Key> {
        let mut dirty = self.everything();
        self.volumes = std::mem::take(&mut self.staged_volumes);
        self.volumes_by_claim.clear();
        let volumes: Vec<PersistentVolume> = self.volumes.values().cloned().collect();
        for volume in &volumes {
            self.index(volume);
        }
        dirty.extend(self.everything());
        dirty
    }

    /// The single next write for `key`, or `None` when it is where it should be.
    pub(super) fn plan(&self, key: &Key) -> Option<Action> {
        match key {
            Key::Claim(claim) => self.plan_claim(claim),
            Key::Volume(volume) => self.plan_volume(volume),
        }
    }

    fn plan_claim(&self, key: &ClaimKey) -> Option<Action> {
        let claim = self.claims.get(key)?;
        if let Some(action) = unprotect(Key::Claim(key.clone()), &claim.metadata, PVC_PROTECTION) {
            return Some(action);
        }
        if self.modes.protect
            && let Some(action) = protect(Key::Claim(key.clone()), &claim.metadata, PVC_PROTECTION)
        {
            return Some(action);
        }
        if !self.modes.bind {
            return None;
        }
        let spec = claim.spec.as_ref()?;
        if claim.metadata.deletion_timestamp.is_some()
            || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
        {
            return None;
        }
        // A volume already names this claim: binding, not provisioning, is due.
        let named_by_volume = self
            .volumes_by_claim
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|name| self.volumes.get(name))
            .any(|volume| {
                let uid = claim_ref_uid(volume);
                (uid.is_none() || uid.as_deref() == claim.uid().as_deref())
                    && mismatch(volume, claim).is_none()
            });
        if named_by_volume {
            return None;
        }
        let class = self.classes.get(spec.storage_class_name.as_deref()?)?;
        if class.provisioner.is_empty() || class.provisioner == NO_PROVISIONER {
            return None;
        }
        let annotations = claim.annotations();
        if class.wait_for_first_consumer && !annotations.contains_key(ANN_SELECTED_NODE) {
            return None;
        }
        let has = |name: &str| annotations.get(name) == Some(&class.provisioner);
        if has(ANN_STORAGE_PROVISIONER) && has(ANN_BETA_STORAGE_PROVISIONER) {
            return None;
        }
        Some(Action::AnnotateClaim {
            claim: key.clone(),
            provisioner: class.provisioner.clone(),
        })
    }

    /// A volume being deleted is only ever released (kube-controller-manager keeps syncing
    /// it, so a volume whose deletion waits for a provisioner's finalizer gets reclaimed);
    /// it is never bound, unbound or made `Available`.
    fn plan_volume(&self, name: &str) -> Option<Action> {
        let volume = self.volumes.get(name)?;
        let deleting = volume.metadata.deletion_timestamp.is_some();
        let phase = volume
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        if phase != "Bound"
            && let Some(action) = unprotect(
                Key::Volume(name.to_owned()),
                &volume.metadata,
                PV_PROTECTION,
            )
        {
            return Some(action);
        }
        if self.modes.protect
            && let Some(action) = protect(
                Key::Volume(name.to_owned()),
                &volume.metadata,
                PV_PROTECTION,
            )
        {
            return Some(action);
        }
        if !self.modes.bind {
            return None;
        }
        let available = || Action::SetVolumePhase {
            volume: name.to_owned(),
            phase: "Available",
        };
        let Some(claim_key) = ClaimKey::referenced_by(volume) else {
            return (!deleting && !matches!(phase, "Available" | "Failed")).then(available);
        };
        let ref_uid = claim_ref_uid(volume);
        let claim = self
            .claims
            .get(&claim_key)
            .filter(|claim| ref_uid.is_none() || claim.uid().as_deref() == ref_uid.as_deref());
        match (claim, ref_uid) {
            (Some(claim), ref_uid) if bound_elsewhere(claim, name) => {
                plan_bound_elsewhere(name, volume, phase, ref_uid.is_some(), deleting)
            }
            (Some(_), _) if deleting => None,
            (Some(claim), _) if !bind_completed(claim) && mismatch(volume, claim).is_some() => {
                // kube-controller-manager leaves both as they are (and the claim to its
                // provisioner, when its class has one).
                let reason = mismatch(volume, claim);
                debug!(pv = name, claim = %claim_key, ?reason, "volume does not fit its claim");
                None
            }
            (Some(claim), ref_uid) => plan_bind(name, volume, phase, claim_key, claim, ref_uid),
            // Pre-bound to a claim that does not exist yet.
            (None, None) => {
                (!deleting && !matches!(phase, "Available" | "Released" | "Failed")).then(available)
            }
            (None, Some(uid)) => {
                (!matches!(phase, "Released" | "Failed")).then(|| Action::ReleaseIfGone {
                    volume: name.to_owned(),
                    claim: claim_key,
                    uid,
                })
            }
        }
    }
}

/// Whether the claim is bound (kube-controller-manager checks a volume against a claim only
/// before that; a bound claim keeps its volume).
fn bind_completed(claim: &PersistentVolumeClaim) -> bool {
    claim.annotations().contains_key(ANN_BIND_COMPLETED)
}

/// Why `volume`, which names `claim` in its claimRef, cannot be bound to it
/// (kube-controller-manager's `checkVolumeSatisfyClaim` and `FindMatchingVolume`): a
/// capacity smaller than the claim's storage request, another volume mode, missing access
/// modes, or, when the claim names the volume in `spec.volumeName`, another storage class.
/// `None` when it fits.
fn mismatch(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> Option<&'static str> {
    let volume_spec = volume.spec.as_ref();
    let claim_spec = claim.spec.as_ref();
    let size = |quantity: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        quantity.map_or(Ok(Quantity::ZERO), |q| q.0.parse::<Quantity>())
    };
    let capacity = size(
        volume_spec
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    );
    let request = size(
        claim_spec
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    );
    match (capacity, request) {
        (Ok(capacity), Ok(request)) if capacity < request => {
            return Some("requested PV is too small");
        }
        (Ok(_), Ok(_)) => {}
        // The API server refuses such objects; a volume that cannot be measured never fits.
        _ => return Some("unreadable storage quantity"),
    }
    let volume_mode = volume_spec.and_then(|s| s.volume_mode.as_deref());
    let claim_mode = claim_spec.and_then(|s| s.volume_mode.as_deref());
    if volume_mode.unwrap_or("Filesystem") != claim_mode.unwrap_or("Filesystem") {
        return Some("incompatible volumeMode");
    }
    let volume_modes = volume_spec
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default();
    let claim_modes = claim_spec
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default();
    if !claim_modes.iter().all(|m| volume_modes.contains(m)) {
        return Some("incompatible accessMode");
    }
    let names_volume = claim_spec
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| Some(v) == volume.metadata.name.as_deref());
    let volume_class = volume_spec.and_then(|s| s.storage_class_name.as_deref());
    let claim_class = claim_spec.and_then(|s| s.storage_class_name.as_deref());
    if names_volume && volume_class.unwrap_or_default() != claim_class.unwrap_or_default() {
        return Some("storageClassName does not match");
    }
    None
}

fn claim_ref_uid(volume: &PersistentVolume) -> Option<String> {
    let claim_ref = volume.spec.as_ref()?.claim_ref.as_ref()?;
    claim_ref.uid.clone().filter(|uid| !uid.is_empty())
}

/// Whether the claim's `spec.volumeName` names another volume than `name`.
fn bound_elsewhere(claim: &PersistentVolumeClaim, name: &str) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty() && v != name)
}

/// The volume names a claim that is bound to another volume (kube-controller-manager's
/// `syncVolume`): a dynamically provisioned volume with reclaim policy `Delete` is not
/// needed and becomes `Released` (then its provisioner reclaims it); any other one is
/// unbound and becomes `Available`. A volume pre-bound without the claim's uid only
/// becomes `Available`.
fn plan_bound_elsewhere(
    name: &str,
    volume: &PersistentVolume,
    phase: &str,
    has_uid: bool,
    deleting: bool,
) -> Option<Action> {
    let dynamic = volume.annotations().contains_key(ANN_PROVISIONED_BY);
    let delete = volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        == Some("Delete");
    if has_uid && dynamic && delete {
        return (!matches!(phase, "Released" | "Failed")).then(|| Action::SetVolumePhase {
            volume: name.to_owned(),
            phase: "Released",
        });
    }
    if deleting {
        return None;
    }
    if !has_uid {
        return (!matches!(phase, "Available" | "Released" | "Failed")).then(|| {
            Action::SetVolumePhase {
                volume: name.to_owned(),
                phase: "Available",
            }
        });
    }
    Some(Action::Unbind {
        volume: name.to_owned(),
        clear_claim_ref: volume.annotations().contains_key(ANN_BOUND_BY_CONTROLLER),
    })
}

fn plan_bind(
    name: &str,
    volume: &PersistentVolume,
    phase: &str,
    claim_key: ClaimKey,
    claim: &PersistentVolumeClaim,
    ref_uid: Option<String>,
) -> Option<Action> {
    let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    let volume_name = volume_name.filter(|v| !v.is_empty());
    let set_volume_name = volume_name.is_none();
    let annotations = claim.annotations();
    let claim_patch = (set_volume_name
        || annotations.get(ANN_BIND_COMPLETED).map(String::as_str) != Some("yes"))
    .then(|| {
        let mut added = serde_json::Map::new();
        added.insert(ANN_BIND_COMPLETED.to_owned(), json!("yes"));
        if set_volume_name {
            added.insert(ANN_BOUND_BY_CONTROLLER.to_owned(), json!("yes"));
            json!({"metadata": {"annotations": added}, "spec": {"volumeName": name}})
        } else {
            json!({"metadata": {"annotations": added}})
        }
    });
    let spec = volume.spec.as_ref();
    let capacity = spec.and_then(|s| s.capacity.as_ref());
    let access_modes = spec.and_then(|s| s.access_modes.as_ref());
    let status = claim.status.as_ref();
    let claim_status_done = status.and_then(|s| s.phase.as_deref()) == Some("Bound")
        && status.and_then(|s| s.capacity.as_ref()) == capacity
        && status.and_then(|s| s.access_modes.as_ref()) == access_modes;
    let claim_status_patch = (!claim_status_done).then(|| {
        let capacity: Option<BTreeMap<_, _>> = capacity.cloned();
        json!({"status": {"phase": "Bound", "capacity": capacity, "accessModes": access_modes}})
    });
    let plan = BindPlan {
        volume: name.to_owned(),
        claim: claim_key,
        claim_uid_for_volume: if ref_uid.is_none() { claim.uid() } else { None },
        volume_phase: phase != "Bound",
        claim_patch,
        claim_status_patch,
    };
    let nothing_to_do = plan.claim_uid_for_volume.is_none()
        && !plan.volume_phase
        && plan.claim_patch.is_none()
        && plan.claim_status_patch.is_none();
    (!nothing_to_do).then(|| Action::Bind(Box::new(plan)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeSpec, PersistentVolumeStatus, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn class(name: &str, provisioner: &str, wffc: bool) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            provisioner: provisioner.into(),
            volume_binding_mode: wffc.then(|| "WaitForFirstConsumer".into()),
            ..StorageClass::default()
        }
    }

    fn claim(name: &str, class: &str, rv: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some(class.into()),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some("Pending".into()),
                ..PersistentVolumeClaimStatus::default()
            }),
        }
    }

    fn volume(name: &str, claim: Option<(&str, Option<&str>)>, phase: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                claim_ref: claim.map(|(name, uid)| ObjectReference {
                    namespace: Some("ns".into()),
                    name: Some(name.into()),
                    uid: uid.map(Into::into),
                    ..ObjectReference::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..PersistentVolumeStatus::default()
            }),
        }
    }

    fn key(name: &str) -> ClaimKey {
        ClaimKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn annotates_claim_of_class_with_provisioner() {
        let mut cache = Cache::default();
        cache.apply_class(&class("fast", "csi.example.com", false));
        cache.apply_claim(claim("c", "fast", "1"));
        assert_eq!(
            cache.plan(&Key::Claim(key("c"))),
            Some(Action::AnnotateClaim {
                claim: key("c"),
                provisioner: "csi.example.com".into()
            })
        );
    }

    #[test]
    fn a_removed_protection_finalizer_is_put_back_unless_the_object_is_being_deleted() {
        let protection_only = Modes {
            bind: false,
            protect: true,
        };
        let mut cache = Cache::new(protection_only);
        cache.apply_class(&class("fast", "csi.example.com", false));
        let mut held = claim("c", "fast", "7");
        held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        cache.apply_claim(held);
        assert_eq!(
            cache.plan(&Key::Claim(key("c"))),
            Some(Action::AddProtection(Box::new(Unprotect {
                key: Key::Claim(key("c")),
                finalizers: vec!["example.com/hold".into(), PVC_PROTECTION.into()],
                resource_version: Some("7".into()),
            })))
        );
        let mut protected = claim("c", "fast", "8");
        protected.metadata.finalizers = Some(vec![PVC_PROTECTION.into()]);
        cache.apply_claim(protected);
        assert_eq!(
            cache.plan(&Key::Claim(key("c"))),
            None,
            "without the binder, no annotation"
        );
        cache.apply_volume(volume("pv", None, "Available"));
        let Some(Action::AddProtection(add)) = cache.plan(&Key::Volume("pv".into())) else {
            panic!("the volume's finalizer is put back");
        };
        assert_eq!(add.finalizers, [PV_PROTECTION]);
        let mut gone = deleting(volume("pv", None, "Available"));
        gone.metadata.resource_version = Some("2".into());
        cache.apply_volume(gone);
        assert_eq!(cache.plan(&Key::Volume("pv".into())), None, "being deleted");
        // The binder alone (protection finalizers off) never adds one.
        let mut binder = Cache::default();
        binder.apply_volume(volume("pv", None, "Available"));
        assert_eq!(binder.plan(&Key::Volume("pv".into())), None);
    }

    #[test]
    fn does_not_annotate_without_class_or_provisioner() {
        let mut cache = Cache::default();
        cache.apply_claim(claim("c", "missing", "1"));
        cache.apply_class(&class("static", NO_PROVISIONER, false));
        cache.apply_claim(claim("d", "static", "1"));
        assert_eq!(cache.plan(&Key::Claim(key("c"))), None);
        assert_eq!(cache.plan(&Key::Claim(key("d"))), None);
    }

    #[test]
    fn waits_for_selected_node_with_wait_for_first_consumer() {
        let mut cache = Cache::default();
        cache.apply_class(&class("late", "p", true));
        let mut c = claim("c", "late", "1");
        cache.apply_claim(c.clone());
        assert_eq!(cache.plan(&Key::Claim(key("c"))), None);
        c.metadata.resource_version = Some("2".into());
        c.annotations_mut()
            .insert(ANN_SELECTED_NODE.into(), "node-1".into());
        assert_eq!(cache.apply_claim(c), vec![Key::Claim(key("c"))]);
        assert!(matches!(
            cache.plan(&Key::Claim(key("c"))),
            Some(Action::AnnotateClaim { .. })
        ));
    }

    #[test]
    fn ignores_stale_claim_versions() {
        let mut cache = Cache::default();
        assert_eq!(cache.apply_claim(claim("c", "x", "5")).len(), 1);
        assert!(cache.apply_claim(claim("c", "x", "4")).is_empty());
        assert!(cache.apply_claim(claim("c", "x", "5")).is_empty());
    }

    #[test]
    fn binds_volume_naming_existing_claim() {
        let mut cache = Cache::default();
        cache.apply_claim(claim("c", "fast", "1"));
        let dirty = cache.apply_volume(volume("pv", Some(("c", None)), "Pending"));
        assert_eq!(dirty, vec![Key::Volume("pv".into()), Key::Claim(key("c"))]);
        assert_eq!(
            cache.plan(&Key::Claim(key("c"))),
            None,
            "binding, not provisioning"
        );
        let Some(Action::Bind(plan)) = cache.plan(&Key::Volume("pv".into())) else {
            panic!("expected a bind");
        };
        assert_eq!(plan.claim_uid_for_volume.as_deref(), Some("uid-c"));
        assert!(plan.volume_phase);
        let patch = plan.claim_patch.unwrap();
        assert_eq!(patch["spec"]["volumeName"], "pv");
        assert_eq!(
            patch["metadata"]["annotations"][ANN_BOUND_BY_CONTROLLER],
            "yes"
        );
        let status = plan.claim_status_patch.unwrap();
        assert_eq!(status["status"]["capacity"]["storage"], "1Gi");
        assert_eq!(status["status"]["accessModes"][0], "ReadWriteOnce");
    }

    fn requesting(mut c: PersistentVolumeClaim, storage: &str) -> PersistentVolumeClaim {
        c.spec.as_mut().unwrap().resources = Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".into(),
                Quantity(storage.into()),
            )])),
            ..VolumeResourceRequirements::default()
        });
        c
    }

    #[test]
    fn a_volume_smaller_than_the_claims_request_is_not_bound() {
        let mut cache = Cache::default();
        cache.apply_class(&class("fast", "csi.example.com", false));
        // The volume holds 1Gi; 1025Mi is one MiB more.
        cache.apply_claim(requesting(claim("c", "fast", "1"), "1025Mi"));
        cache.apply_volume(volume("pv", Some(("c", None)), "Pending"));
        assert_eq!(
            cache.plan(&Key::Volume("pv".into())),
            None,
            "a 1Gi volume is too small for 1025Mi"
        );
        assert!(
            matches!(
                cache.plan(&Key::Claim(key("c"))),
                Some(Action::AnnotateClaim { .. })
            ),
            "the claim is left to its provisioner"
        );
        // Exactly the capacity, written another way, fits.
        cache.apply_claim(requesting(claim("c", "fast", "2"), "1073741824"));
        assert!(matches!(
            cache.plan(&Key::Volume("pv".into())),
            Some(Action::Bind(_))
        ));
        assert_eq!(cache.plan(&Key::Claim(key("c"))), None);
        cache.apply_claim(requesting(claim("c", "fast", "3"), "1G"));
        assert!(matches!(
            cache.plan(&Key::Volume("pv".into())),
            Some(Action::Bind(_))
        ));
    }

    #[test]
    fn a_volume_of_another_mode_access_or_named_class_is_not_bound() {
        let mut cache = Cache::default();
        let mut block = claim("c", "fast", "1");
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        cache.apply_claim(block);
        cache.apply_volume(volume("pv", Some(("c", None)), "Pending"));
        assert_eq!(cache.plan(&Key::Volume("pv".into())), None, "volume mode");

        let mut rwx = claim("c", "fast", "2");
        rwx.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
        cache.apply_claim(rwx);
        assert_eq!(cache.plan(&Key::Volume("pv".into())), None, "access modes");

        // The class is checked when the claim names the volume, not for a claimRef alone.
        let mut rwo = claim("c", "fast", "3");
        rwo.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOnce".into()]);
        cache.apply_claim(rwo.clone());
        assert!(matches!(
            cache.plan(&Key::Volume("pv".into())),
            Some(Action::Bind(_))
        ));
        rwo.metadata.resource_version = Some("4".into());
        rwo.spec.as_mut().unwrap().volume_name = Some("pv".into());
        cache.apply_claim(rwo);
        assert_eq!(cache.plan(&Key::Volume("pv".into())), None, "storage class");
    }

    #[test]
    fn a_bound_claim_keeps_a_volume_smaller_than_its_request() {
        // A claim bound before its request grew (an expansion in progress) stays bound.
        let mut cache = Cache::default();
        let mut c = requesting(claim("c", "fast", "1"), "2Gi");
        c.spec.as_mut().unwrap().volume_name = Some("pv".into());
        c.annotations_mut()
            .insert(ANN_BIND_COMPLETED.into(), "yes".into());
        cache.apply_claim(c);
        cache.apply_volume(volume("pv", Some(("c", Some("uid-c"))), "Pending"));
        let Some(Action::Bind(plan)) = cache.plan(&Key::Volume("pv".into())) else {
            panic!("expected the bind to be completed");
        };
        assert!(plan.volume_phase);
    }

    #[test]
    fn bound_pair_needs_nothing() {
        let mut cache = Cache::default();
        let mut c = claim("c", "fast", "1");
        c.spec.as_mut().unwrap().volume_name = Some("pv".into());
        c.annotations_mut()
            .insert(ANN_BIND_COMPLETED.into(), "yes".into());
        let v = volume("pv", Some(("c", Some("uid-c"))), "Bound");
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: v.spec.as_ref().unwrap().capacity.clone(),
            access_modes: v.spec.as_ref().unwrap().access_modes.clone(),
            ..PersistentVolumeClaimStatus::default()
        });
        cache.apply_claim(c);
        cache.apply_volume(v);
        assert_eq!(cache.plan(&Key::Volume("pv".into())), None);
        assert_eq!(cache.plan(&Key::Claim(key("c"))), None);
    }

    #[test]
    fn volume_without_claim_ref_becomes_available() {
        let mut cache = Cache::default();
        cache.apply_volume(volume("pv", None, "Pending"));
        assert_eq!(
            cache.plan(&Key::Volume("pv".into())),
            Some(Action::SetVolumePhase {
                volume: "pv".into(),
                phase: "Available"
            })
        );
        cache.apply_volume(volume("pv2", None, "Available"));
        assert_eq!(cache.plan(&Key::Volume("pv2".into())), None);
    }

    #[test]
    fn volume_of_missing_claim_is_released_after_a_check() {
        let mut cache = Cache::default();
        cache.apply_volume(volume("pv", Some(("c", Some("uid-c"))), "Bound"));
        assert_eq!(
            cache.plan(&Key::Volume("pv".into())),
            Some(Action::ReleaseIfGone {
                volume: "pv".into(),
                claim: key("c"),
                uid: "uid-c".into()
            })
        );
        cache.apply_volume(volume("pv2", Some(("c", Some("uid-c"))), "Released"));
        assert_eq!(cache.plan(&Key::Volume("pv2".into())), None);
    }

    #[test]
    fn recreated_claim_is_provisioned_despite_old_released_volume() {
        let mut cache = Cache::default();
        cache.apply_class(&class("fast", "p", false));
        cache.apply_volume(volume("pv", Some(("c", Some("old-uid"))), "Released"));
        cache.apply_claim(claim("c", "fast", "3"));
        assert!(matches!(
            cache.plan(&Key::Claim(key("c"))),
            Some(Action::AnnotateClaim { .. })
        ));
        assert!(cache.plan(&Key::Volume("pv".into())).is_none());
    }

    /// A claim `c` bound to the volume `other`.
    fn claim_bound_to_other() -> PersistentVolumeClaim {
        let mut c = claim("c", "fast", "1");
        c.spec.as_mut().unwrap().volume_name = Some("other".into());
        c
    }

    fn with_annotation(mut v: PersistentVolume, key: &str) -> PersistentVolume {
        v.annotations_mut().insert(key.into(), "yes".into());
        v
    }

    fn deleting(mut v: PersistentVolume) -> PersistentVolume {
        v.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        v
    }

    fn with_policy(mut v: PersistentVolume, policy: &str) -> PersistentVolume {
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some(policy.into());
        v
    }

    #[test]
    fn volume_of_a_claim_bound_elsewhere_is_released_or_unbound() {
        let named = || volume("pv", Some(("c", Some("uid-c"))), "Bound");
        let phase = |phase| {
            Some(Action::SetVolumePhase {
                volume: "pv".into(),
                phase,
            })
        };
        let unbind = |clear_claim_ref| {
            Some(Action::Unbind {
                volume: "pv".into(),
                clear_claim_ref,
            })
        };
        let dynamic = |v| with_policy(with_annotation(v, ANN_PROVISIONED_BY), "Delete");
        let cases = [
            (
                "a dynamically provisioned Delete volume is released",
                dynamic(named()),
                phase("Released"),
            ),
            (
                "also while it is being deleted",
                deleting(dynamic(named())),
                phase("Released"),
            ),
            (
                "a released one needs nothing",
                dynamic(volume("pv", Some(("c", Some("uid-c"))), "Released")),
                None,
            ),
            (
                "a dynamically provisioned Retain volume is unbound",
                with_policy(with_annotation(named(), ANN_PROVISIONED_BY), "Retain"),
                unbind(false),
            ),
            (
                "a static Delete volume is unbound, keeping its claimRef",
                with_policy(named(), "Delete"),
                unbind(false),
            ),
            (
                "a volume the controller bound loses its claimRef",
                with_annotation(named(), ANN_BOUND_BY_CONTROLLER),
                unbind(true),
            ),
            (
                "a volume pre-bound without uid only becomes available",
                dynamic(volume("pv", Some(("c", None)), "Pending")),
                phase("Available"),
            ),
            (
                "and then needs nothing",
                dynamic(volume("pv", Some(("c", None)), "Available")),
                None,
            ),
        ];
        for (case, v, want) in cases {
            let mut cache = Cache::default();
            cache.apply_claim(claim_bound_to_other());
            cache.apply_volume(v);
            assert_eq!(cache.plan(&Key::Volume("pv".into())), want, "case: {case}");
        }
    }

    #[test]
    fn a_volume_being_deleted_is_released_but_never_bound() {
        let mut cache = Cache::default();
        cache.apply_claim(claim("c", "fast", "1"));
        cache.apply_volume(deleting(volume("pv", Some(("c", None)), "Pending")));
        cache.apply_volume(deleting(volume(
            "gone",
            Some(("x", Some("uid-x"))),
            "Available",
        )));
        cache.apply_volume(deleting(volume("free", None, "Pending")));
        assert_eq!(cache.plan(&Key::Volume("pv".into())), None, "not bound");
        assert_eq!(cache.plan(&Key::Volume("free".into())), None);
        assert_eq!(
            cache.plan(&Key::Volume("gone".into())),
            Some(Action::ReleaseIfGone {
                volume: "gone".into(),
                claim: key("x"),
                uid: "uid-x".into()
            })
        );
    }

    #[test]
    fn relist_replaces_claims_and_marks_removed_ones_dirty() {
        let mut cache = Cache::default();
        cache.apply_claim(claim("gone", "x", "1"));
        cache.begin_claims();
        cache.stage_claim(claim("new", "x", "2"));
        let dirty = cache.finish_claims();
        assert!(dirty.contains(&Key::Claim(key("gone"))));
        assert!(dirty.contains(&Key::Claim(key("new"))));
        assert!(cache.claims.contains_key(&key("new")) && !cache.claims.contains_key(&key("gone")));
        // A late answer carrying the claim as it was before the relist brings nothing back.
        assert!(cache.apply_claim(claim("gone", "x", "1")).is_empty());
        assert!(!cache.claims.contains_key(&key("gone")));
    }

    /// Chaos seed 10231, claim-061: the release check's GET found the claim just before it
    /// was deleted; its answer was folded in after the delete event, and the PV was bound
    /// to that ghost and never released.
    #[test]
    fn a_stale_copy_of_a_deleted_claim_does_not_bring_it_back() {
        let mut cache = Cache::default();
        cache.apply_class(&class("fast", "p", false));
        cache.apply_volume(volume("pv", Some(("c", Some("uid-c"))), "Pending"));
        let before = claim("c", "fast", "3");
        cache.apply_claim(before.clone());
        let mut deleted = before.clone();
        deleted.metadata.resource_version = Some("4".into());
        cache.delete_claim(&deleted);
        assert!(cache.apply_claim(before).is_empty());
        assert!(!cache.claims.contains_key(&key("c")));
        assert!(matches!(
            cache.plan(&Key::Volume("pv".into())),
            Some(Action::ReleaseIfGone { .. })
        ));
        // A claim of the same name created again (a new uid) is seen.
        let mut again = claim("c", "fast", "5");
        again.metadata.uid = Some("uid-c-2".into());
        cache.apply_claim(again);
        assert!(cache.claims.contains_key(&key("c")));
    }
}
