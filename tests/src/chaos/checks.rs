//! The invariants, checked on a snapshot of the API objects, the provisioning journal and
//! the CNS volumes.
//!
//! Every violation names the objects involved. Some findings are notes, not violations:
//! a leftover duplicate of a live PV before teardown (deleting the PV removes it), a claim
//! whose volume exists while it is still being provisioned, and what is out of reach
//! (docs/production.md): an entry of a deleted `CnsVolumeMetadata` whose claim was deleted
//! first.
//!
//! A leftover duplicate of a PV after teardown is a violation, whatever happened to the
//! replicas: the journal holds the last sweep of every PV's late-asset window until it is
//! made, and every leader loads it.
//!
//! The journal is read in its stored form (ConfigMaps labelled [`JOURNAL_LABEL`], one key
//! `e.<claim uid>` per entry, a JSON value with `n` the claim, `v` the PV name and, once
//! settled, `d` the Unix second its last sweep is due): once the run is quiet it holds no
//! intent for a claim that is gone, and no settled entry long past its due time.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use cnsmetadata::{CnsVolumeMetadata, CnsVolumeMetadataSpec};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::ResourceExt;
use kube_client::api::ListParams;
use provision_controller::annotations::FINALIZER_PV;
use provision_controller::annotations::JOURNAL_LABEL;
use vsphere_cns::simulator::SimVolume;

use super::names;
use super::schedule::{BAD_SIZE, Entity};
use super::world::{RESYNC, Records, Shared};

/// The name domain of Go's provisioner library: the only key of it a controller may write
/// is [`FINALIZER_PV`], on PVs.
const GO_DOMAIN: &str = "external-provisioner.volume.kubernetes.io/";
/// The project's own name domain (the journal's label): never on users' objects.
const OWN_DOMAIN: &str = "rust-storage-controllers.github.io";
/// How long past its due time a settled journal entry may stay: its sweep is queued for
/// the due time, reloaded at every resync, and its removal is written lazily.
const OVERDUE: Duration = RESYNC.saturating_mul(3);

/// Which invariants apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// During the chaos (panics, replicas that failed for another reason than the lease).
    Chaos,
    /// After the chaos, everything quiet.
    Quiescent,
    /// After every `CnsVolumeMetadata` object was deleted.
    MetadataDeleted,
    /// After every claim was deleted too: strict.
    Final,
}

/// What the API server and CNS hold at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Claims by name.
    pub claims: BTreeMap<String, PersistentVolumeClaim>,
    /// PVs by name.
    pub volumes: BTreeMap<String, PersistentVolume>,
    /// `CnsVolumeMetadata` objects by name.
    pub metadata: BTreeMap<String, CnsVolumeMetadata>,
    /// CNS volumes by ID.
    pub cns: BTreeMap<String, SimVolume>,
    /// The provisioning journal.
    pub journal: Journal,
}

/// One entry of the provisioning journal, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct JournalEntry {
    /// The object that holds it.
    pub object: String,
    /// The claim's `namespace/name`.
    pub claim: String,
    /// The PV name.
    pub pv: String,
    /// Settled: the Unix second its last sweep is due; `None`: an intent (the driver may
    /// be creating an asset no PV records).
    pub due: Option<i64>,
}

/// The provisioning journal, as stored.
#[derive(Clone, Debug, Default)]
pub struct Journal {
    /// Journal objects by name, with their resourceVersions.
    pub objects: BTreeMap<String, String>,
    /// Entries by claim UID.
    pub entries: BTreeMap<String, JournalEntry>,
    /// Keys that hold no entry the checks can read, with their object.
    pub unreadable: Vec<String>,
}

impl Journal {
    /// Reads the entries of journal objects (ConfigMaps).
    #[must_use]
    pub fn parse(objects: &[k8s_openapi::api::core::v1::ConfigMap]) -> Self {
        let mut journal = Self::default();
        for cm in objects {
            let object = cm.name_any();
            journal
                .objects
                .insert(object.clone(), cm.resource_version().unwrap_or_default());
            for (key, value) in cm.data.iter().flatten() {
                let Some(uid) = key.strip_prefix("e.") else {
                    continue;
                };
                let parsed: Option<JournalEntry> =
                    serde_json::from_str(value)
                        .ok()
                        .and_then(|v: serde_json::Value| {
                            Some(JournalEntry {
                                object: object.clone(),
                                claim: v.get("n")?.as_str()?.to_owned(),
                                pv: v.get("v")?.as_str()?.to_owned(),
                                due: match v.get("d") {
                                    None => None,
                                    Some(d) => Some(d.as_i64()?),
                                },
                            })
                        });
                match parsed {
                    Some(entry) => {
                        journal.entries.insert(uid.to_owned(), entry);
                    }
                    None => journal.unreadable.push(format!("{object}: {key}: {value}")),
                }
            }
        }
        journal
    }
}

/// Reads the provisioning journal of the controllers (in the Lease's namespace).
///
/// # Errors
/// When the list fails.
pub async fn read_journal(shared: &Shared) -> kube_client::Result<Journal> {
    let objects = shared
        .configmaps()
        .list(&ListParams::default().labels(JOURNAL_LABEL))
        .await?;
    Ok(Journal::parse(&objects.items))
}

impl Snapshot {
    /// Reads everything.
    ///
    /// # Errors
    /// When a list fails.
    pub async fn take(shared: &Shared) -> kube_client::Result<Self> {
        let params = ListParams::default();
        let by_name = |items: Vec<_>| -> BTreeMap<String, _> {
            items
                .into_iter()
                .map(|o: PersistentVolumeClaim| (o.name_any(), o))
                .collect()
        };
        let claims = by_name(shared.claims().list(&params).await?.items);
        let volumes = shared
            .volumes()
            .list(&params)
            .await?
            .items
            .into_iter()
            .map(|o| (o.name_any(), o))
            .collect();
        let metadata = shared
            .metadata()
            .list(&params)
            .await?
            .items
            .into_iter()
            .map(|o| (o.name_any(), o))
            .collect();
        let cns = shared
            .cns
            .volumes()
            .into_iter()
            .map(|v| (v.id.to_string(), v))
            .collect();
        let journal = read_journal(shared).await?;
        Ok(Self {
            claims,
            volumes,
            metadata,
            cns,
            journal,
        })
    }

    /// A hash of everything the controllers change (not Leases nor Events), as state: the
    /// journal by its entries, not by its objects' versions, and without the intents of
    /// the claims the driver refuses ([`refused_claims`](Self::refused_claims)). Each retry
    /// of such a claim writes its intent, then removes it once the driver refused (the
    /// journal object, holding nothing else, is created and deleted again): with the
    /// suite's 1 s backoff cap, every 2-3 s for as long as the claim exists. That is the
    /// retry the controller owes the claim, not a change; counted as one, it kept a run
    /// with such a claim from ever being quiet (the busy rates leave its requests out for
    /// the same reason).
    #[must_use]
    pub fn fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for (name, o) in &self.claims {
            (name, o.metadata.uid.as_deref(), o.resource_version()).hash(&mut h);
        }
        for (name, o) in &self.volumes {
            (name, o.resource_version()).hash(&mut h);
        }
        for (name, o) in &self.metadata {
            (name, o.resource_version()).hash(&mut h);
        }
        for (id, v) in &self.cns {
            id.hash(&mut h);
            format!("{v:?}").hash(&mut h);
        }
        let refused: BTreeSet<&str> = self
            .refused()
            .filter_map(|(_, claim)| claim.metadata.uid.as_deref())
            .collect();
        for (uid, entry) in &self.journal.entries {
            if entry.due.is_none() && refused.contains(uid.as_str()) {
                continue;
            }
            (uid, entry).hash(&mut h);
        }
        self.journal.unreadable.hash(&mut h);
        h.finish()
    }

    /// The names of the unbound claims the driver refuses: of the class with a parameter
    /// it does not know, or asking for more than CNS can give. The controller retries them
    /// at its backoff's maximum for as long as they exist (Go too).
    #[must_use]
    pub fn refused_claims(&self) -> Vec<String> {
        self.refused().map(|(name, _)| name.clone()).collect()
    }

    fn refused(&self) -> impl Iterator<Item = (&String, &PersistentVolumeClaim)> {
        self.claims.iter().filter(|(_, claim)| {
            let spec = claim.spec.as_ref();
            let bad_class = spec.and_then(|s| s.storage_class_name.as_deref())
                == Some(names::CLASS_BAD_PARAMETER);
            let bad_size = spec
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .is_some_and(|q| q.0 == BAD_SIZE);
            bound_to(claim).is_none() && (bad_class || bad_size)
        })
    }
}

/// What the checks found.
#[derive(Clone, Debug, Default)]
pub struct Findings {
    /// Broken invariants, one line each.
    pub violations: Vec<String>,
    /// Worth knowing, not a failure.
    pub notes: Vec<String>,
}

impl Findings {
    pub(crate) fn violation(&mut self, line: String) {
        self.violations.push(line);
    }
    fn note(&mut self, line: String) {
        self.notes.push(line);
    }
}

fn is_ours(pv: &PersistentVolume) -> Option<&str> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    (csi.driver == names::PROVISIONER).then_some(csi.volume_handle.as_str())
}

fn of_cluster(v: &SimVolume) -> bool {
    v.metadata.container_cluster.cluster_id == names::CLUSTER_ID
        || v.metadata
            .container_cluster_array
            .iter()
            .any(|c| c.cluster_id == names::CLUSTER_ID)
}

fn bound_to(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()?
        .volume_name
        .as_deref()
        .filter(|v| !v.is_empty())
}

/// The claim a PV's claimRef names, or `-`.
fn claim_of(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.name.as_deref())
        .unwrap_or("-")
}

fn reclaim(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Delete")
}

fn pv_phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Checks every invariant of `phase`.
#[must_use]
pub fn check(snapshot: &Snapshot, records: &Records, phase: Phase) -> Findings {
    let mut findings = Findings::default();
    terminating(snapshot, &mut findings);
    foreign_keys(snapshot, &mut findings);
    if phase != Phase::Chaos {
        journal(snapshot, jiff_now(), &mut findings);
    }
    volumes(snapshot, records, phase, &mut findings);
    metadata(snapshot, records, phase, &mut findings);
    if phase != Phase::Quiescent {
        for name in snapshot.metadata.keys() {
            findings.violation(format!(
                "cnsvolumemetadata {name} still exists after it was deleted"
            ));
        }
    }
    if phase == Phase::Final {
        teardown(snapshot, &mut findings);
    }
    findings
}

/// Whether a key (annotation, label or finalizer) is one a controller of ours may have
/// written: under Go's provisioner domain or the project's.
fn of_ours(key: &str) -> bool {
    key.starts_with(GO_DOMAIN) || key.contains(OWN_DOMAIN)
}

/// Nothing stays Terminating because of our finalizers (on claims, none of ours is
/// allowed at all: see [`foreign_keys`]).
fn terminating(snapshot: &Snapshot, findings: &mut Findings) {
    let stuck = |meta: &ObjectMeta, ours: &dyn Fn(&str) -> bool| {
        meta.deletion_timestamp.as_ref()?;
        let held: Vec<&str> = meta
            .finalizers
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|f| ours(f))
            .collect();
        (!held.is_empty()).then(|| held.join(", "))
    };
    for (name, claim) in &snapshot.claims {
        if let Some(held) = stuck(&claim.metadata, &of_ours) {
            findings.violation(format!(
                "claim {name} stays Terminating, held by our finalizer {held}"
            ));
        }
    }
    for (name, pv) in &snapshot.volumes {
        if let Some(held) = stuck(&pv.metadata, &|f| f == FINALIZER_PV || of_ours(f)) {
            findings.violation(format!(
                "PV {name} ({}, {}) stays Terminating, held by our finalizer {held}",
                pv_phase(pv),
                reclaim(pv)
            ));
        }
    }
    for (name, object) in &snapshot.metadata {
        if let Some(held) = stuck(&object.metadata, &|f| f == cnsmetadata::FINALIZER) {
            findings.violation(format!(
                "cnsvolumemetadata {name} stays Terminating, held by our finalizer {held}"
            ));
        }
    }
}

/// Users' claims and PVs carry only what Go's library writes: on claims no key of ours, on
/// PVs only Go's finalizer (and `pv.kubernetes.io/provisioned-by`, outside these domains).
fn foreign_keys(snapshot: &Snapshot, findings: &mut Findings) {
    let keys = |meta: &ObjectMeta, allowed: &dyn Fn(&str) -> bool| -> Vec<String> {
        let annotations = meta
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| ("annotation", k));
        let labels = meta.labels.iter().flatten().map(|(k, _)| ("label", k));
        let finalizers = meta.finalizers.iter().flatten().map(|f| ("finalizer", f));
        annotations
            .chain(labels)
            .chain(finalizers)
            .filter(|(_, k)| of_ours(k) && !allowed(k))
            .map(|(what, k)| format!("{what} {k}"))
            .collect()
    };
    for (name, claim) in &snapshot.claims {
        let found = keys(&claim.metadata, &|_| false);
        if !found.is_empty() {
            findings.violation(format!(
                "claim {name} carries {}, which Go's library never writes on a claim",
                found.join(", ")
            ));
        }
    }
    for (name, pv) in &snapshot.volumes {
        let found = keys(&pv.metadata, &|k| k == FINALIZER_PV);
        if !found.is_empty() {
            findings.violation(format!(
                "PV {name} carries {}, which Go's library never writes",
                found.join(", ")
            ));
        }
    }
}

/// Now, in Unix seconds.
fn jiff_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// The journal holds no intent for a claim that is gone (its cleanup removes the intent),
/// no settled entry long past its due time (the last sweep removes it), and nothing
/// unreadable.
fn journal(snapshot: &Snapshot, now: i64, findings: &mut Findings) {
    let live: BTreeSet<&str> = snapshot
        .claims
        .values()
        .filter_map(|c| c.metadata.uid.as_deref())
        .collect();
    let overdue = i64::try_from(OVERDUE.as_secs()).unwrap_or(i64::MAX);
    for (uid, entry) in &snapshot.journal.entries {
        let JournalEntry {
            object, claim, pv, ..
        } = entry;
        match entry.due {
            None if !live.contains(uid.as_str()) => findings.violation(format!(
                "journal {object} holds an intent for claim {claim} (uid {uid}, PV {pv}),                  which is gone: its cleanup did not end"
            )),
            Some(due) if now - due > overdue => findings.violation(format!(
                "journal {object} holds the entry of claim {claim} (uid {uid}, PV {pv})                  {}s after its last sweep was due",
                now - due
            )),
            _ => {}
        }
    }
    for unreadable in &snapshot.journal.unreadable {
        findings.violation(format!("journal entry that is no entry: {unreadable}"));
    }
}

/// The claim record with `uid`.
fn claim_by_uid<'a>(records: &'a Records, uid: &str) -> Option<&'a super::world::ClaimRecord> {
    records
        .claims
        .values()
        .find(|c| c.uid.as_deref() == Some(uid))
}

/// PVs name existing volumes, handles are unique, every volume is named by a PV.
fn volumes(snapshot: &Snapshot, records: &Records, phase: Phase, findings: &mut Findings) {
    let mut by_handle: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, pv) in &snapshot.volumes {
        let Some(handle) = is_ours(pv) else { continue };
        by_handle.entry(handle).or_default().push(name);
        if !snapshot.cns.contains_key(handle) {
            let claim = claim_of(pv);
            findings.violation(format!(
                "PV {name} ({}, {}, claim {claim}) names CNS volume {handle}, which does not exist",
                pv_phase(pv),
                reclaim(pv)
            ));
        }
    }
    for (handle, pvs) in &by_handle {
        if pvs.len() > 1 {
            findings.violation(format!("PVs {} share CNS volume {handle}", pvs.join(", ")));
        }
    }
    for (name, claim) in &snapshot.claims {
        let Some(pv) = bound_to(claim) else { continue };
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            continue;
        }
        match snapshot.volumes.get(pv) {
            None => findings.violation(format!(
                "claim {name} is Bound to PV {pv}, which does not exist"
            )),
            Some(volume) => {
                let ref_uid = volume
                    .spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .and_then(|r| r.uid.as_deref());
                if ref_uid.is_some() && ref_uid != claim.metadata.uid.as_deref() {
                    findings.violation(format!(
                        "claim {name} is Bound to PV {pv}, whose claimRef names another claim"
                    ));
                }
            }
        }
    }
    for claim in records.claims.values() {
        if let Some(pv) = &claim.retained_pv
            && claim.deleted
            && !snapshot.volumes.contains_key(pv)
        {
            findings.violation(format!(
                "PV {pv} was switched to Retain before claim {} was deleted, yet it was deleted",
                claim.name
            ));
        }
    }
    let named: BTreeSet<&str> = by_handle.keys().copied().collect();
    for (id, volume) in &snapshot.cns {
        if !of_cluster(volume) || named.contains(id.as_str()) {
            continue;
        }
        unexplained(snapshot, records, phase, id, volume, findings);
    }
}

/// Classifies a CNS volume of the cluster that no PV names.
fn unexplained(
    snapshot: &Snapshot,
    records: &Records,
    phase: Phase,
    id: &str,
    volume: &SimVolume,
    findings: &mut Findings,
) {
    let name = &volume.name;
    let why = records.inserted.get(id);
    if let Some(why) = why.filter(|why| why.starts_with(super::actions::UNUSED)) {
        findings.note(format!(
            "CNS volume {id} ({name}) is {why}: the harness's own leftover"
        ));
        return;
    }
    let inserted = why
        .map(|why| format!(" (inserted by the harness as {why})"))
        .unwrap_or_default();
    if let Some(pv) = snapshot.volumes.get(name) {
        let line = format!(
            "CNS volume {id} is a leftover duplicate of PV {name} (which names {}){inserted}",
            is_ours(pv).unwrap_or("no CNS volume")
        );
        if phase == Phase::Final {
            findings.violation(format!("{line}; reclaim policy {}", reclaim(pv)));
        } else {
            findings.note(line);
        }
        return;
    }
    let Some(record) = name
        .strip_prefix("pvc-")
        .and_then(|uid| claim_by_uid(records, uid))
    else {
        findings.violation(format!(
            "CNS volume {id} named {name} is named by no PV: leaked{inserted}"
        ));
        return;
    };
    let claim = &record.name;
    let live = snapshot
        .claims
        .get(claim)
        .filter(|c| c.metadata.uid == record.uid);
    match live {
        Some(live) => match bound_to(live) {
            Some(other) => findings.violation(format!(
                "claim {claim} is bound to PV {other}, but its own CNS volume {id} ({name}) \
                 was left behind{inserted}"
            )),
            None => findings.note(format!(
                "claim {claim} (class {}) is not bound, but its CNS volume {id} exists \
                 (provisioning still in progress){inserted}",
                record.class
            )),
        },
        None => {
            let stripped = if record.stripped_at.is_some() {
                ", its pvc-protection finalizer stripped by hand"
            } else {
                ""
            };
            findings.violation(format!(
                "CNS volume {id} of deleted claim {claim} (class {}{stripped}) was left \
                 behind{inserted}",
                record.class
            ));
        }
    }
}

/// An entity as the checks compare it: type, name, namespace, cluster, labels, references.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct EntityView {
    key: (String, String, Option<String>),
    cluster: Option<String>,
    labels: BTreeSet<(String, String)>,
    references: Vec<(String, String, Option<String>, Option<String>)>,
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn expected(spec: &CnsVolumeMetadataSpec, reference: usize) -> Option<EntityView> {
    let config = cnsmetadata::Config::default().cluster_id(names::CLUSTER_ID);
    let reference = cnsmetadata::testing::referred_entities(spec, &config)
        .into_iter()
        .nth(reference)?;
    Some(EntityView {
        key: (
            spec.entity_type.as_str().to_owned(),
            spec.entity_name.clone(),
            non_empty(&spec.namespace),
        ),
        cluster: non_empty(&spec.guest_cluster_id),
        labels: spec
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        references: vec![(
            reference.entity_type.as_str().to_owned(),
            reference.entity_name,
            non_empty(&reference.namespace),
            non_empty(&reference.cluster_id),
        )],
    })
}

fn actual(entity: &vsphere_cns::wire::EntityMetadata) -> EntityView {
    EntityView {
        key: (
            entity.entity_type.as_str().to_owned(),
            entity.entity_name.clone(),
            entity.namespace.clone(),
        ),
        cluster: entity.cluster_id.clone(),
        labels: entity
            .labels
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect(),
        references: entity
            .referred_entity
            .iter()
            .map(|r| {
                (
                    r.entity_type.as_str().to_owned(),
                    r.entity_name.clone(),
                    r.namespace.clone(),
                    r.cluster_id.clone(),
                )
            })
            .collect(),
    }
}

/// The key of the entity object `object` describes (the harness never changes it).
fn key_of(object: &str, entity: Entity) -> (String, String, Option<String>) {
    let spec = super::objects::metadata_spec(object, "", entity, 0, true);
    (
        spec.entity_type.as_str().to_owned(),
        spec.entity_name,
        non_empty(&spec.namespace),
    )
}

/// Every object's CNS entries equal its spec; deleted objects left no entries.
fn metadata(snapshot: &Snapshot, records: &Records, phase: Phase, findings: &mut Findings) {
    for (name, object) in &snapshot.metadata {
        if object.metadata.deletion_timestamp.is_some() || !cnsmetadata::testing::is_valid(object) {
            continue;
        }
        for (i, claim_name) in object.spec.volume_names.iter().enumerate() {
            let Some(claim) = snapshot.claims.get(claim_name) else {
                findings.note(format!(
                    "cnsvolumemetadata {name} cannot be synced: claim {claim_name} does not exist"
                ));
                continue;
            };
            let Some(pv_name) = bound_to(claim) else {
                findings.note(format!(
                    "cnsvolumemetadata {name} cannot be synced: claim {claim_name} is not bound"
                ));
                continue;
            };
            let Some(handle) = snapshot.volumes.get(pv_name).and_then(is_ours) else {
                continue;
            };
            let Some(volume) = snapshot.cns.get(handle) else {
                continue;
            };
            let Some(want) = expected(&object.spec, i) else {
                continue;
            };
            let found: Vec<EntityView> = volume
                .metadata
                .entity_metadata
                .iter()
                .map(actual)
                .filter(|e| e.key == want.key)
                .collect();
            let status = object
                .status
                .volume_status
                .iter()
                .find(|v| &v.volume_name == claim_name)
                .map_or_else(
                    || "no status".to_owned(),
                    |v| {
                        if v.updated {
                            "status: updated".to_owned()
                        } else {
                            format!("status: {}", v.error_message)
                        }
                    },
                );
            match found.as_slice() {
                [] => findings.violation(format!(
                    "cnsvolumemetadata {name}: CNS volume {handle} (claim {claim_name}, PV \
                     {pv_name}) has no entry for {} {} ({status})",
                    want.key.0, want.key.1
                )),
                [one] if *one == want => {}
                other => findings.violation(format!(
                    "cnsvolumemetadata {name}: CNS volume {handle} (claim {claim_name}) holds \
                     {other:?}, the spec says {want:?} ({status})"
                )),
            }
        }
    }
    for (object, record) in &records.metadata {
        let gone = !snapshot.metadata.contains_key(object);
        if !(gone && (record.deleted || phase != Phase::Quiescent)) {
            continue;
        }
        let key = key_of(object, record.entity);
        let claim = records
            .claims
            .get(&record.claim)
            .map(|c| c.name.clone())
            .unwrap_or_default();
        for (id, volume) in &snapshot.cns {
            if !volume
                .metadata
                .entity_metadata
                .iter()
                .any(|e| actual(e).key == key)
            {
                continue;
            }
            let claim_gone = !snapshot.claims.contains_key(&claim);
            let line = format!(
                "deleted cnsvolumemetadata {object} left its entry {} {} on CNS volume {id} \
                 ({}; claim {claim}{})",
                key.0,
                key.1,
                volume.name,
                if record.valid {
                    ""
                } else {
                    ", its last spec was invalid"
                }
            );
            if claim_gone {
                findings.note(format!(
                    "out of reach: {line}, deleted before the object, so the reconciler \
                     cannot find the volume"
                ));
            } else {
                findings.violation(line);
            }
        }
    }
}

/// After teardown: no claim remains, and every PV left is a Retain PV.
fn teardown(snapshot: &Snapshot, findings: &mut Findings) {
    for (name, claim) in &snapshot.claims {
        findings.violation(format!(
            "claim {name} still exists after it was deleted (finalizers {:?}, phase {:?})",
            claim.metadata.finalizers.clone().unwrap_or_default(),
            claim.status.as_ref().and_then(|s| s.phase.clone())
        ));
    }
    for (name, pv) in &snapshot.volumes {
        if reclaim(pv) != "Retain" {
            findings.violation(format!(
                "PV {name} ({}, reclaim {}) outlived its claim {}",
                pv_phase(pv),
                reclaim(pv),
                claim_of(pv)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, ObjectReference, PersistentVolumeSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use vsphere_cns::{
        ClusterFlavor, CnsVolumeId, MoRef,
        wire::{ContainerCluster, VolumeMetadata},
    };

    use super::*;
    use crate::chaos::world::ClaimRecord;

    fn volume(id: &str, name: &str) -> SimVolume {
        SimVolume {
            id: CnsVolumeId::new(id),
            name: name.to_owned(),
            capacity_in_mb: 1024,
            datastore: MoRef::datastore("datastore-1"),
            profile_id: None,
            metadata: VolumeMetadata::for_cluster(
                ContainerCluster::kubernetes(names::CLUSTER_ID, "u", ClusterFlavor::Workload),
                Vec::new(),
            ),
        }
    }

    fn pv(name: &str, handle: &str, reclaim: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: Some(reclaim.to_owned()),
                claim_ref: Some(ObjectReference {
                    name: Some("claim-001".to_owned()),
                    ..ObjectReference::default()
                }),
                csi: Some(CSIPersistentVolumeSource {
                    driver: names::PROVISIONER.to_owned(),
                    volume_handle: handle.to_owned(),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        }
    }

    fn snapshot(volumes: Vec<PersistentVolume>, cns: Vec<SimVolume>) -> Snapshot {
        Snapshot {
            volumes: volumes.into_iter().map(|v| (v.name_any(), v)).collect(),
            cns: cns.into_iter().map(|v| (v.id.to_string(), v)).collect(),
            ..Snapshot::default()
        }
    }

    fn records_with_claim(uid: &str, deleted: bool) -> Records {
        let mut records = Records::default();
        records.claims.insert(
            1,
            ClaimRecord {
                name: "claim-001".to_owned(),
                class: names::CLASS_IMMEDIATE.to_owned(),
                uid: Some(uid.to_owned()),
                created_at: Some(Duration::from_secs(1)),
                deleted,
                ..ClaimRecord::default()
            },
        );
        records
    }

    #[test]
    fn a_consistent_world_has_no_findings() {
        let s = snapshot(
            vec![pv("pvc-u1", "v1", "Delete")],
            vec![volume("v1", "pvc-u1")],
        );
        let found = check(&s, &records_with_claim("u1", false), Phase::Quiescent);
        assert!(found.violations.is_empty(), "{:?}", found.violations);
        // After teardown only Retain PVs may remain.
        let found = check(&s, &records_with_claim("u1", true), Phase::Final);
        assert_eq!(found.violations.len(), 1, "{:?}", found.violations);
        let s = snapshot(
            vec![pv("pvc-u1", "v1", "Retain")],
            vec![volume("v1", "pvc-u1")],
        );
        let found = check(&s, &records_with_claim("u1", true), Phase::Final);
        assert!(found.violations.is_empty(), "{:?}", found.violations);
    }

    #[test]
    fn a_pv_naming_a_missing_volume_and_shared_handles_are_violations() {
        let s = snapshot(
            vec![
                pv("pvc-a", "gone", "Retain"),
                pv("pvc-b", "v1", "Retain"),
                pv("pvc-c", "v1", "Retain"),
            ],
            vec![volume("v1", "pvc-b")],
        );
        let found = check(&s, &Records::default(), Phase::Quiescent);
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.contains("PV pvc-a") && v.contains("does not exist"))
        );
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.contains("PVs pvc-b, pvc-c share CNS volume v1"))
        );
    }

    #[test]
    fn a_volume_of_a_deleted_claim_is_a_leak() {
        let s = snapshot(Vec::new(), vec![volume("v9", "pvc-u1")]);
        let found = check(&s, &records_with_claim("u1", true), Phase::Quiescent);
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.contains("of deleted claim claim-001")),
            "{found:?}"
        );
    }

    #[test]
    fn a_stripped_claims_leak_is_a_violation() {
        let s = snapshot(Vec::new(), vec![volume("v9", "pvc-u1")]);
        let mut records = records_with_claim("u1", true);
        records.claims.get_mut(&1).unwrap().stripped_at = Some(Duration::from_secs(2));
        let found = check(&s, &records, Phase::Quiescent);
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.contains("of deleted claim claim-001")
                    && v.contains("stripped by hand")),
            "{found:?}"
        );
    }

    #[test]
    fn a_leftover_duplicate_is_a_note_until_teardown_and_a_violation_after_it() {
        let s = snapshot(
            vec![pv("pvc-u1", "v1", "Retain")],
            vec![volume("v1", "pvc-u1"), volume("v2", "pvc-u1")],
        );
        let records = records_with_claim("u1", true);
        let quiet = check(&s, &records, Phase::Quiescent);
        assert!(quiet.violations.is_empty() && quiet.notes.iter().any(|n| n.contains("leftover")));
        let fin = check(&s, &records, Phase::Final);
        assert!(
            fin.violations
                .iter()
                .any(|v| v.contains("leftover duplicate of PV pvc-u1")
                    && v.ends_with("reclaim policy Retain")),
            "{:?}",
            fin.violations
        );
        assert!(
            !fin.notes.iter().any(|n| n.contains("leftover")),
            "{:?}",
            fin.notes
        );
    }

    #[test]
    fn our_finalizer_on_a_deleted_object_is_a_violation() {
        let mut s = snapshot(Vec::new(), Vec::new());
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("claim-002".to_owned()),
                deletion_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                finalizers: Some(vec![format!("{GO_DOMAIN}provisioning")]),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        };
        s.claims.insert("claim-002".to_owned(), claim);
        let found = check(&s, &Records::default(), Phase::Quiescent);
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.contains("claim claim-002 stays Terminating"))
        );
    }

    fn claim(name: &str, uid: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        }
    }

    fn journal_object(name: &str, data: &[(&str, &str)]) -> k8s_openapi::api::core::v1::ConfigMap {
        k8s_openapi::api::core::v1::ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                resource_version: Some("7".to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..k8s_openapi::api::core::v1::ConfigMap::default()
        }
    }

    #[test]
    fn an_intent_for_a_gone_claim_and_an_overdue_entry_are_violations() {
        let now = jiff_now();
        let fresh = now - 1;
        let stale = now - 1_000;
        let due = |t: i64| format!(r#"{{"n":"default/claim-003","v":"pvc-u3","t":1,"d":{t}}}"#);
        let (fresh_due, stale_due) = (due(fresh), due(stale));
        let journal = Journal::parse(&[journal_object(
            "csi.vsphere.vmware.com-journal-00000000",
            &[
                (
                    "e.u1",
                    r#"{"n":"default/claim-001","v":"pvc-u1","t":1,"w":"ab"}"#,
                ),
                ("e.u2", r#"{"n":"default/claim-002","v":"pvc-u2","t":1}"#),
                ("e.u3", &fresh_due),
                ("k.0123456789abcdef", "{}"),
            ],
        )]);
        assert_eq!(journal.entries.len(), 3);
        assert_eq!(journal.entries["u3"].due, Some(fresh));
        let mut s = snapshot(Vec::new(), Vec::new());
        s.claims
            .insert("claim-001".to_owned(), claim("claim-001", "u1"));
        s.journal = journal.clone();
        let found = check(&s, &Records::default(), Phase::Quiescent);
        assert_eq!(found.violations.len(), 1, "{:?}", found.violations);
        assert!(
            found.violations[0].contains("intent for claim default/claim-002"),
            "{:?}",
            found.violations
        );
        // The live claim's intent is no violation; a settled entry long past due is.
        s.claims
            .insert("claim-002".to_owned(), claim("claim-002", "u2"));
        s.journal = Journal::parse(&[journal_object(
            "csi.vsphere.vmware.com-journal-00000000",
            &[("e.u3", &stale_due), ("e.u4", "not json")],
        )]);
        let found = check(&s, &Records::default(), Phase::Final);
        assert!(
            found.violations.iter().any(
                |v| v.contains("claim default/claim-003") && v.contains("after its last sweep")
            ),
            "{:?}",
            found.violations
        );
        assert!(
            found.violations.iter().any(|v| v.contains("e.u4")),
            "{:?}",
            found.violations
        );
    }

    #[test]
    fn keys_of_ours_on_claims_and_pvs_are_violations_but_gos_pv_finalizer() {
        let mut s = snapshot(
            vec![pv("pvc-u1", "v1", "Delete")],
            vec![volume("v1", "pvc-u1")],
        );
        let pv = s.volumes.get_mut("pvc-u1").unwrap();
        pv.metadata.finalizers = Some(vec![FINALIZER_PV.to_owned()]);
        pv.metadata.annotations = Some(
            [(
                "pv.kubernetes.io/provisioned-by".to_owned(),
                names::PROVISIONER.to_owned(),
            )]
            .into(),
        );
        let records = records_with_claim("u1", false);
        let found = check(&s, &records, Phase::Quiescent);
        assert!(found.violations.is_empty(), "{:?}", found.violations);
        let mut c = claim("claim-001", "u1");
        c.metadata.annotations =
            Some([(format!("{GO_DOMAIN}provisioning-owner"), "x".to_owned())].into());
        c.metadata.labels = Some([(format!("example.{OWN_DOMAIN}/held"), "x".to_owned())].into());
        s.claims.insert("claim-001".to_owned(), c);
        s.volumes.get_mut("pvc-u1").unwrap().metadata.annotations =
            Some([(format!("{GO_DOMAIN}late-asset-sweep"), "1".to_owned())].into());
        let found = check(&s, &records, Phase::Quiescent);
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.starts_with("claim claim-001 carries")
                    && v.contains("provisioning-owner")
                    && v.contains("example.rust-storage-controllers.github.io/held")),
            "{:?}",
            found.violations
        );
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.starts_with("PV pvc-u1 carries") && v.contains("late-asset-sweep")),
            "{:?}",
            found.violations
        );
    }

    fn claim_of(name: &str, uid: &str, class: &str, size: &str) -> PersistentVolumeClaim {
        use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
                resource_version: Some("7".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some(class.to_owned()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(
                        [("storage".to_owned(), Quantity(size.to_owned()))]
                            .into_iter()
                            .collect(),
                    ),
                    ..VolumeResourceRequirements::default()
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        }
    }

    fn intent(claim: &str) -> JournalEntry {
        JournalEntry {
            object: "journal-0".to_owned(),
            claim: format!("{}/{claim}", names::NAMESPACE),
            pv: format!("pvc-{claim}"),
            due: None,
        }
    }

    #[test]
    fn a_refused_claims_intent_coming_and_going_is_no_change() {
        let mut s = Snapshot::default();
        for c in [
            claim_of("claim-001", "u1", names::CLASS_BAD_PARAMETER, "1Gi"),
            claim_of("claim-002", "u2", names::CLASS_IMMEDIATE, BAD_SIZE),
            claim_of("claim-003", "u3", names::CLASS_IMMEDIATE, "1Gi"),
        ] {
            s.claims.insert(c.name_any(), c);
        }
        assert_eq!(s.refused_claims(), ["claim-001", "claim-002"]);
        let quiet = s.fingerprint();

        // Each retry of a refused claim writes its intent (creating the journal object)
        // and removes it (deleting the object).
        let mut retrying = s.clone();
        retrying
            .journal
            .entries
            .insert("u1".to_owned(), intent("claim-001"));
        retrying
            .journal
            .entries
            .insert("u2".to_owned(), intent("claim-002"));
        retrying
            .journal
            .objects
            .insert("journal-0".to_owned(), "41".to_owned());
        assert_eq!(retrying.fingerprint(), quiet);

        // Another claim's intent is a change; so is a refused claim's settled entry.
        let mut provisioning = s.clone();
        provisioning
            .journal
            .entries
            .insert("u3".to_owned(), intent("claim-003"));
        assert_ne!(provisioning.fingerprint(), quiet);
        let mut settled = s.clone();
        settled.journal.entries.insert(
            "u1".to_owned(),
            JournalEntry {
                due: Some(1),
                ..intent("claim-001")
            },
        );
        assert_ne!(settled.fingerprint(), quiet);

        // Once bound, a claim is no longer refused: its intent is a change.
        let mut bound = retrying.clone();
        if let Some(spec) = bound
            .claims
            .get_mut("claim-002")
            .and_then(|c| c.spec.as_mut())
        {
            spec.volume_name = Some("pvc-u2".to_owned());
        }
        assert_eq!(bound.refused_claims(), ["claim-001"]);
        let mut bound_quiet = bound.clone();
        bound_quiet.journal.entries.remove("u2");
        assert_ne!(bound.fingerprint(), bound_quiet.fingerprint());
    }
}
