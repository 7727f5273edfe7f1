//! Pure decisions of one reconcile: the backend update of each volume, and [`plan`], what
//! an update of a valid, finalized object does (remove, record, push) and what its answers
//! make of the status and the record ([`UpdatePlan::conclude`]). No I/O: the reconciler
//! reads, then writes and pushes what the plan says.

use std::{
    fmt::Write as _,
    time::{Duration, SystemTime},
};

mod deletion;

pub(crate) use deletion::{DeletionObserved, DeletionOutcome, deletion, unresolved};

use crate::{
    config::Config,
    record::{self, Edit, PushedEntry, Settle, later},
    resource::{CnsVolumeMetadataSpec, EntityReference, EntityType, VolumeStatus},
};

/// The entity references of `spec` as sent to CNS, one per volume name, in order.
///
/// References of a PV entity get [`Config::pv_reference_cluster_id`] (the supervisor ID or
/// the cluster ID), as they point at a supervisor PVC; other references keep their own.
#[must_use]
pub(crate) fn referred_entities(
    spec: &CnsVolumeMetadataSpec,
    config: &Config,
) -> Vec<EntityReference> {
    spec.entity_references
        .iter()
        .map(|reference| {
            let mut reference = reference.clone();
            if spec.entity_type == EntityType::PersistentVolume {
                config
                    .pv_reference_cluster_id()
                    .clone_into(&mut reference.cluster_id);
            }
            reference
        })
        .collect()
}

#[cfg(test)]
/// The update for volume `volume_id` that pairs the entity with `reference` (Go builds it
/// inline in `updateCnsMetadata`).
#[must_use]
pub(crate) fn plan_update(
    spec: &CnsVolumeMetadataSpec,
    volume_id: &str,
    reference: EntityReference,
    delete: bool,
    config: &Config,
) -> crate::backend::VolumeMetadataUpdate {
    use crate::backend::{
        ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata, VolumeMetadataUpdate,
    };
    VolumeMetadataUpdate {
        volume_id: volume_id.to_owned(),
        entity_metadata: EntityMetadata {
            entity_type: spec.entity_type.clone(),
            entity_name: spec.entity_name.clone(),
            namespace: spec.namespace.clone(),
            labels: spec.labels.clone(),
            delete,
            cluster_id: spec.guest_cluster_id.clone(),
            referred_entities: vec![reference],
        },
        container_cluster: ContainerCluster {
            cluster_type: ClusterType::Kubernetes,
            cluster_id: spec.guest_cluster_id.clone(),
            vsphere_user: config.vsphere_user.clone(),
            cluster_flavor: ClusterFlavor::GuestCluster,
            cluster_distribution: spec.cluster_distribution.clone(),
        },
    }
}

/// What a name of `spec.volumenames` stands for right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// The CNS volume ID (the CSI volume handle of the bound supervisor PV).
    Volume(String),
    /// A volume of another CSI driver: nothing goes to CNS.
    OtherDriver,
    /// No CNS volume can be found: the claim or its PV is missing, or the claim is unbound.
    Missing(String),
}

/// One volume name of the spec, resolved, with the entry to push when there is one.
pub(crate) struct Target {
    pub(crate) volume_name: String,
    pub(crate) resolved: Resolved,
    pub(crate) entry: Option<PushedEntry>,
}

/// Why a push failed.
#[derive(Debug)]
pub(crate) struct Failed {
    /// The message to put in the volume's status.
    pub(crate) message: String,
    /// When the push was sent, if it got no answer (it timed out): CNS may still carry it
    /// out. `None` when CNS answered.
    pub(crate) unanswered: Option<SystemTime>,
}

/// What [`plan`] decides from: the object's spec and record, its volumes resolved, and the
/// pushes without answer this replica remembers.
pub(crate) struct Observed<'a> {
    pub(crate) spec: &'a CnsVolumeMetadataSpec,
    pub(crate) recorded: &'a [PushedEntry],
    pub(crate) targets: &'a [Target],
    pub(crate) remembered: &'a [PushedEntry],
    pub(crate) now: SystemTime,
    /// [`Config::settle_period`].
    pub(crate) settle: Duration,
}

/// What one update of a valid, finalized object does, in this order: warn about `odd`
/// tombstones, record `intent`, remove `stale` and `due` entries, push `volumes`.
#[derive(Debug)]
pub(crate) struct UpdatePlan {
    /// Tombstones whose time cannot be trusted, and why: a warning each (they are in
    /// `due`).
    pub(crate) odd: Vec<(PushedEntry, String)>,
    /// The entries to record, marked as sent and not yet answered, before anything is
    /// pushed; `None` when the record holds them already.
    pub(crate) intent: Option<Vec<PushedEntry>>,
    /// Live recorded entries this spec no longer describes: removed, then tombstones.
    pub(crate) stale: Vec<PushedEntry>,
    /// Tombstones whose settle period is over: removed once more, then forgotten.
    pub(crate) due: Vec<PushedEntry>,
    /// One per volume name of the spec.
    pub(crate) volumes: Vec<VolumePlan>,
    /// When tombstones still settling are due.
    pub(crate) wake: Option<Duration>,
    settle: Duration,
}

/// What an update does for one volume name of the spec.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum VolumePlan {
    /// Push an entry.
    Push(Box<Push>),
    /// No CNS volume can be found: the volume fails with `message`.
    Missing { volume: String, message: String },
    /// A volume of another driver: nothing to push, the volume is fine.
    Skip { volume: String },
}

/// The push of one entry to the volume of one volume name.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Push {
    pub(crate) volume: String,
    pub(crate) entry: PushedEntry,
    /// `entry` with the latest mark of a push without answer (of the record or this
    /// replica's memory).
    pub(crate) earlier: PushedEntry,
    /// `entry` with the mark the record holds once the intent is written, which goes once
    /// the push is answered.
    pub(crate) answered: PushedEntry,
}

/// The answers to the pushes of an [`UpdatePlan`], in its order.
#[derive(Debug)]
pub(crate) struct Answers {
    pub(crate) stale: Vec<Result<(), Failed>>,
    pub(crate) due: Vec<Result<(), Failed>>,
    /// When the removals (`stale`, `due`) were answered: the removal time of new tombstones.
    pub(crate) removed_at: SystemTime,
    /// One per [`VolumePlan::Push`]: the answer and when it came.
    pub(crate) pushes: Vec<(Result<(), Failed>, SystemTime)>,
}

/// What an update comes to once its pushes are answered.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The per-volume status to write.
    pub(crate) status: Vec<VolumeStatus>,
    /// The change of the record to write with it.
    pub(crate) edit: Edit,
    /// Volumes and removals that failed.
    pub(crate) failed: usize,
    /// Volumes and removals tried.
    pub(crate) total: usize,
    /// Why removals failed, for the event (each part starts with a space).
    pub(crate) errors: String,
    /// When to reconcile again: tombstones or pushes without answer settle then.
    pub(crate) wake: Option<Duration>,
}

/// The entry of `list` with the key of `entry`.
fn find<'a>(list: &'a [PushedEntry], entry: &PushedEntry) -> Option<&'a PushedEntry> {
    list.iter().find(|e| e.key() == entry.key())
}

/// The shorter of two optional waits.
fn sooner(wake: Option<Duration>, wait: Duration) -> Option<Duration> {
    Some(wake.map_or(wait, |w| w.min(wait)))
}

/// What an update of a valid, finalized object does: remove what an earlier spec pushed
/// and this one no longer describes (except entries on a volume that cannot be resolved
/// now: they may still be right), remove once more the tombstones that settled (and no
/// push without answer may still land on), record every push before it goes out, then
/// push every volume that resolves.
pub(crate) fn plan(observed: &Observed<'_>) -> UpdatePlan {
    let Observed {
        spec,
        recorded,
        targets,
        remembered,
        now,
        settle,
    } = *observed;
    let desired: Vec<&PushedEntry> = targets.iter().filter_map(|t| t.entry.as_ref()).collect();
    let wanted = |e: &PushedEntry| desired.iter().any(|d| d.key() == e.key());
    let unresolved: Vec<&str> = targets
        .iter()
        .filter(|t| matches!(t.resolved, Resolved::Missing(_)))
        .map(|t| t.volume_name.as_str())
        .collect();
    let stale = recorded
        .iter()
        .filter(|e| !e.is_tombstone() && !wanted(e))
        .filter(|e| !(e.is_entity_of(spec) && unresolved.contains(&e.volume_name.as_str())))
        .cloned()
        .collect();
    // The entry with the latest mark of a push without answer, of the record and memory.
    let marked = |e: &PushedEntry| PushedEntry {
        unanswered: later(
            find(recorded, e).and_then(|r| r.unanswered.as_ref()),
            find(remembered, e).and_then(|r| r.unanswered.as_ref()),
        ),
        ..e.clone()
    };
    let (mut odd, mut due, mut wake) = (Vec::new(), Vec::new(), None);
    // Tombstones of entities pushed again now are revived by the intent.
    for entry in recorded.iter().filter(|e| e.is_tombstone() && !wanted(e)) {
        match (
            entry.settle(now, settle),
            marked(entry).landing(now, settle),
        ) {
            (Settle::Wait(left), _) | (Settle::Due, Settle::Wait(left)) => {
                wake = sooner(wake, left);
            }
            (Settle::Due, _) => due.push(entry.clone()),
            (Settle::Odd(why), _) => {
                odd.push((entry.clone(), why));
                due.push(entry.clone());
            }
        }
    }
    let sending: Vec<PushedEntry> = desired.iter().map(|e| e.unanswered_since(now)).collect();
    let intent = record::union(recorded, &sending);
    let sent = record::timestamp(now);
    let volumes = targets
        .iter()
        .map(|target| {
            let volume = target.volume_name.clone();
            match (&target.entry, &target.resolved) {
                (Some(entry), _) => VolumePlan::Push(Box::new(Push {
                    volume,
                    earlier: marked(entry),
                    answered: PushedEntry {
                        unanswered: later(
                            find(recorded, entry).and_then(|r| r.unanswered.as_ref()),
                            Some(&sent),
                        ),
                        ..entry.clone()
                    },
                    entry: entry.clone(),
                })),
                (None, Resolved::Missing(message)) => VolumePlan::Missing {
                    volume,
                    message: message.clone(),
                },
                (None, _) => VolumePlan::Skip { volume },
            }
        })
        .collect();
    UpdatePlan {
        odd,
        intent: (!record::same(&intent, recorded)).then_some(sending),
        stale,
        due,
        volumes,
        wake,
        settle,
    }
}

impl UpdatePlan {
    /// What the update comes to with `answers`: each volume's status; the record's edit
    /// (removed stale entries become tombstones, removed tombstones go, a push without
    /// answer keeps its mark, an answered one drops it unless an earlier push may still
    /// land); and when to wake up for what still settles.
    pub(crate) fn conclude(&self, answers: Answers) -> Outcome {
        let mut edit = Edit::default();
        let mut errors = String::new();
        for (entry, answer) in self.stale.iter().zip(answers.stale) {
            match answer {
                Ok(()) => edit.entomb.push(entry.clone()),
                Err(Failed { message, .. }) => {
                    let _ = write!(
                        errors,
                        " stale entity {:?} on volume {:?} ({}): {message}.",
                        entry.entity_name, entry.volume_id, entry.volume_name
                    );
                }
            }
        }
        for (entry, answer) in self.due.iter().zip(answers.due) {
            match answer {
                Ok(()) => edit.forget.push(entry.clone()),
                Err(Failed { message, .. }) => {
                    let _ = write!(
                        errors,
                        " entity {:?} removed earlier from volume {:?} ({}), removing it again: {message}.",
                        entry.entity_name, entry.volume_id, entry.volume_name
                    );
                }
            }
        }
        let mut wake = self.wake;
        if !edit.entomb.is_empty() {
            // Counted from CNS's confirmation: any push that could still land was sent before.
            edit.at = record::timestamp(answers.removed_at);
            wake = sooner(wake, self.settle);
        }
        let mut pushes = answers.pushes.into_iter();
        let mut status = Vec::with_capacity(self.volumes.len());
        for volume in &self.volumes {
            status.push(match volume {
                VolumePlan::Push(push) => {
                    let Push {
                        volume,
                        entry,
                        earlier,
                        answered,
                    } = &**push;
                    // The reconciler answers every push; one without an answer was not sent.
                    let (answer, at) = pushes.next().unwrap_or_else(|| {
                        let message = "not pushed".to_owned();
                        (
                            Err(Failed {
                                message,
                                unanswered: None,
                            }),
                            answers.removed_at,
                        )
                    });
                    match (&answer, earlier.landing(at, self.settle)) {
                        // No answer: the record keeps the mark (the later send time).
                        (
                            Err(Failed {
                                unanswered: Some(sent),
                                ..
                            }),
                            _,
                        ) => edit.mark.push(entry.unanswered_since(*sent)),
                        // An earlier push may still land, maybe with an older spec: this
                        // one is sent again then. The record goes back to that push's mark.
                        (_, Settle::Wait(left)) => {
                            wake = sooner(wake, left);
                            edit.answered.push(answered.clone());
                            edit.mark.push(earlier.clone());
                        }
                        // Answered, and no earlier push can land anymore: the mark goes.
                        _ => edit.answered.push(answered.clone()),
                    }
                    match answer {
                        Ok(()) => VolumeStatus::updated(volume),
                        Err(Failed { message, .. }) => VolumeStatus::failed(volume, message),
                    }
                }
                VolumePlan::Missing { volume, message } => {
                    VolumeStatus::failed(volume, message.clone())
                }
                VolumePlan::Skip { volume } => VolumeStatus::updated(volume),
            });
        }
        let removals = self.stale.len() + self.due.len();
        let failed_volumes = status.iter().filter(|s| !s.updated).count();
        Outcome {
            failed: failed_volumes + removals - edit.entomb.len() - edit.forget.len(),
            total: self.volumes.len() + removals,
            status,
            edit,
            errors,
            wake,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        backend::{
            ClusterFlavor, ClusterType, ContainerCluster, EntityMetadata, VolumeMetadataUpdate,
        },
        testing::{pod_spec, pv_spec, pvc_spec},
    };

    fn config() -> Config {
        Config::default()
            .cluster_id("cluster-7")
            .supervisor_id("supervisor-9")
            .vsphere_user("cns-user@vsphere.local")
    }

    #[test]
    fn pv_references_get_the_cluster_id_or_the_supervisor_id() {
        let by_cluster = referred_entities(&pv_spec(), &config());
        assert_eq!(
            by_cluster,
            vec![EntityReference::new(
                EntityType::PersistentVolumeClaim,
                "gc-1-vol-a",
                "tenant",
                "cluster-7"
            )]
        );
        let by_supervisor = referred_entities(&pv_spec(), &config().use_supervisor_id_for_pv(true));
        assert_eq!(by_supervisor[0].cluster_id, "supervisor-9");
    }

    #[test]
    fn pvc_and_pod_references_keep_their_cluster_id() {
        let config = config().use_supervisor_id_for_pv(true);
        assert_eq!(
            referred_entities(&pvc_spec(), &config),
            pvc_spec().entity_references
        );
        assert_eq!(
            referred_entities(&pod_spec(), &config),
            pod_spec().entity_references
        );
    }

    #[test]
    fn pvc_update_carries_the_whole_entity() {
        let spec = pvc_spec();
        let reference = referred_entities(&spec, &config()).remove(0);
        let update = plan_update(&spec, "fcd-1", reference, false, &config());
        assert_eq!(
            update,
            VolumeMetadataUpdate {
                volume_id: "fcd-1".into(),
                entity_metadata: EntityMetadata {
                    entity_type: EntityType::PersistentVolumeClaim,
                    entity_name: "data".into(),
                    namespace: "shop".into(),
                    labels: BTreeMap::from([("app".into(), "db".into())]),
                    delete: false,
                    cluster_id: "gc-1".into(),
                    referred_entities: vec![EntityReference::new(
                        EntityType::PersistentVolume,
                        "pvc-guest-a",
                        "",
                        "gc-1"
                    )],
                },
                container_cluster: ContainerCluster {
                    cluster_type: ClusterType::Kubernetes,
                    cluster_id: "gc-1".into(),
                    vsphere_user: "cns-user@vsphere.local".into(),
                    cluster_flavor: ClusterFlavor::GuestCluster,
                    cluster_distribution: "TKGService".into(),
                },
            }
        );
    }

    #[test]
    fn delete_flag_is_passed_through() {
        let spec = pod_spec();
        let reference = referred_entities(&spec, &config()).remove(1);
        let update = plan_update(&spec, "fcd-2", reference.clone(), true, &config());
        assert!(update.entity_metadata.delete);
        assert_eq!(update.entity_metadata.referred_entities, vec![reference]);
        assert!(update.entity_metadata.labels.is_empty());
    }

    /// The table of [`plan`] and [`UpdatePlan::conclude`]: one row per situation an update
    /// meets, named by what it must do. Volume `x` resolves to CNS volume `fcd-x`; every
    /// answer comes at `NOW`.
    mod update {
        use std::time::{Duration, SystemTime};

        use super::super::*;
        use crate::{record::timestamp, testing::pvc_spec};

        const SETTLE: Duration = Duration::from_secs(180);
        const NOW: u64 = 1_000_000;

        fn at(seconds: u64) -> SystemTime {
            SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
        }

        fn entry(volume: &str) -> PushedEntry {
            PushedEntry::new(&pvc_spec(), volume, &format!("fcd-{volume}"), None)
        }

        fn tombstone(volume: &str, removed: &str) -> PushedEntry {
            PushedEntry {
                removed: Some(removed.to_owned()),
                ..entry(volume)
            }
        }

        fn marked(volume: &str, sent: u64) -> PushedEntry {
            entry(volume).unanswered_since(at(sent))
        }

        /// `volume@mark`, as the expectations write an entry of the edit.
        fn mark(volume: &str, sent: u64) -> String {
            format!("{volume}@{}", timestamp(at(sent)))
        }

        fn resolved(volume: &str) -> Target {
            Target {
                volume_name: volume.to_owned(),
                resolved: Resolved::Volume(format!("fcd-{volume}")),
                entry: Some(entry(volume)),
            }
        }

        fn missing(volume: &str) -> Target {
            Target {
                volume_name: volume.to_owned(),
                resolved: Resolved::Missing(format!("persistentvolumeclaims {volume:?} not found")),
                entry: None,
            }
        }

        fn other_driver(volume: &str) -> Target {
            Target {
                volume_name: volume.to_owned(),
                resolved: Resolved::OtherDriver,
                entry: None,
            }
        }

        #[derive(Clone, Copy, Debug)]
        enum Answer {
            Done,
            Refused,
            /// No answer to a push sent at this time.
            Unanswered(u64),
        }

        impl Answer {
            fn result(self) -> Result<(), Failed> {
                match self {
                    Self::Done => Ok(()),
                    Self::Refused => Err(Failed {
                        message: "refused".into(),
                        unanswered: None,
                    }),
                    Self::Unanswered(sent) => Err(Failed {
                        message: "timed out".into(),
                        unanswered: Some(at(sent)),
                    }),
                }
            }
        }

        #[derive(Default)]
        struct Case {
            name: &'static str,
            recorded: Vec<PushedEntry>,
            targets: Vec<Target>,
            remembered: Vec<PushedEntry>,
            /// Answers to the removals, stale entries first, then due tombstones.
            removals: Vec<Answer>,
            pushes: Vec<Answer>,
            // What the plan says.
            odd: usize,
            records: bool,
            stale: Vec<&'static str>,
            due: Vec<&'static str>,
            // What the answers come to.
            status: Vec<(&'static str, bool)>,
            entomb: Vec<&'static str>,
            forget: Vec<&'static str>,
            mark: Vec<String>,
            answered: Vec<String>,
            failed: usize,
            wake: Option<u64>,
        }

        fn names(entries: &[PushedEntry]) -> Vec<&str> {
            entries.iter().map(|e| e.volume_name.as_str()).collect()
        }

        fn marks(entries: &[PushedEntry]) -> Vec<String> {
            entries
                .iter()
                .map(|e| {
                    format!(
                        "{}@{}",
                        e.volume_name,
                        e.unanswered.as_deref().unwrap_or("-")
                    )
                })
                .collect()
        }

        #[test]
        fn an_update_plans_and_concludes_as_the_table_says() {
            let cases = [
                Case {
                    name: "a first push records the intent, then pushes the volume and clears its mark",
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Done],
                    records: true,
                    status: vec![("a", true)],
                    answered: vec![mark("a", NOW)],
                    ..Case::default()
                },
                Case {
                    name: "an entry recorded with a mark of this very moment is not recorded again, and is pushed again once that mark settles",
                    recorded: vec![marked("a", NOW)],
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Done],
                    status: vec![("a", true)],
                    mark: vec![mark("a", NOW)],
                    answered: vec![mark("a", NOW)],
                    wake: Some(180),
                    ..Case::default()
                },
                Case {
                    name: "a recorded entity the spec no longer names is removed first and becomes a tombstone that wakes the object when it settles",
                    recorded: vec![entry("b")],
                    targets: vec![resolved("a")],
                    removals: vec![Answer::Done],
                    pushes: vec![Answer::Done],
                    records: true,
                    stale: vec!["b"],
                    status: vec![("a", true)],
                    entomb: vec!["b"],
                    answered: vec![mark("a", NOW)],
                    wake: Some(180),
                    ..Case::default()
                },
                Case {
                    name: "a stale entity CNS refuses to remove stays live and fails the update",
                    recorded: vec![entry("b")],
                    targets: vec![resolved("a")],
                    removals: vec![Answer::Refused],
                    pushes: vec![Answer::Done],
                    records: true,
                    stale: vec!["b"],
                    status: vec![("a", true)],
                    answered: vec![mark("a", NOW)],
                    failed: 1,
                    ..Case::default()
                },
                Case {
                    name: "a recorded entry on a volume that cannot be resolved now is neither removed nor pushed, and fails its volume",
                    recorded: vec![entry("a")],
                    targets: vec![missing("a")],
                    status: vec![("a", false)],
                    failed: 1,
                    ..Case::default()
                },
                Case {
                    name: "a tombstone whose settle period is over is removed again and forgotten",
                    recorded: vec![tombstone("b", &timestamp(at(NOW - 200)))],
                    targets: vec![resolved("a")],
                    removals: vec![Answer::Done],
                    pushes: vec![Answer::Done],
                    records: true,
                    due: vec!["b"],
                    status: vec![("a", true)],
                    forget: vec!["b"],
                    answered: vec![mark("a", NOW)],
                    ..Case::default()
                },
                Case {
                    name: "a tombstone CNS refuses to remove again stays and fails the update",
                    recorded: vec![tombstone("b", &timestamp(at(NOW - 200)))],
                    targets: vec![resolved("a")],
                    removals: vec![Answer::Refused],
                    pushes: vec![Answer::Done],
                    records: true,
                    due: vec!["b"],
                    status: vec![("a", true)],
                    answered: vec![mark("a", NOW)],
                    failed: 1,
                    ..Case::default()
                },
                Case {
                    name: "a tombstone still settling is left alone and wakes the object when it settles",
                    recorded: vec![tombstone("b", &timestamp(at(NOW - 30)))],
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Done],
                    records: true,
                    status: vec![("a", true)],
                    answered: vec![mark("a", NOW)],
                    wake: Some(150),
                    ..Case::default()
                },
                Case {
                    name: "a settled tombstone waits while a push of it this replica remembers may still land",
                    recorded: vec![tombstone("b", &timestamp(at(NOW - 200)))],
                    remembered: vec![marked("b", NOW - 100)],
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Done],
                    records: true,
                    status: vec![("a", true)],
                    answered: vec![mark("a", NOW)],
                    wake: Some(80),
                    ..Case::default()
                },
                Case {
                    name: "a tombstone with an unreadable removal time is reported and removed again at once",
                    recorded: vec![tombstone("b", "yesterday")],
                    targets: vec![resolved("a")],
                    removals: vec![Answer::Done],
                    pushes: vec![Answer::Done],
                    odd: 1,
                    records: true,
                    due: vec!["b"],
                    status: vec![("a", true)],
                    forget: vec!["b"],
                    answered: vec![mark("a", NOW)],
                    ..Case::default()
                },
                Case {
                    name: "a tombstone of an entity the spec names again is revived by the intent, not removed",
                    recorded: vec![tombstone("a", &timestamp(at(NOW - 200)))],
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Done],
                    records: true,
                    status: vec![("a", true)],
                    answered: vec![mark("a", NOW)],
                    ..Case::default()
                },
                Case {
                    name: "a push that gets no answer keeps its mark and fails its volume",
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Unanswered(NOW - 5)],
                    records: true,
                    status: vec![("a", false)],
                    mark: vec![mark("a", NOW - 5)],
                    failed: 1,
                    ..Case::default()
                },
                Case {
                    name: "an answered push whose earlier push may still land keeps that push's mark until it settles",
                    recorded: vec![marked("a", NOW - 60)],
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Done],
                    records: true,
                    status: vec![("a", true)],
                    mark: vec![mark("a", NOW - 60)],
                    answered: vec![mark("a", NOW)],
                    wake: Some(120),
                    ..Case::default()
                },
                Case {
                    name: "a push CNS refuses with an answer clears the mark and fails its volume",
                    targets: vec![resolved("a")],
                    pushes: vec![Answer::Refused],
                    records: true,
                    status: vec![("a", false)],
                    answered: vec![mark("a", NOW)],
                    failed: 1,
                    ..Case::default()
                },
                Case {
                    name: "a volume of another driver is fine and gets no push",
                    targets: vec![other_driver("a")],
                    status: vec![("a", true)],
                    ..Case::default()
                },
            ];
            for case in cases {
                let name = case.name;
                let plan = plan(&Observed {
                    spec: &pvc_spec(),
                    recorded: &case.recorded,
                    targets: &case.targets,
                    remembered: &case.remembered,
                    now: at(NOW),
                    settle: SETTLE,
                });
                assert_eq!(plan.odd.len(), case.odd, "{name}: odd");
                assert_eq!(plan.intent.is_some(), case.records, "{name}: records");
                assert_eq!(names(&plan.stale), case.stale, "{name}: stale");
                assert_eq!(names(&plan.due), case.due, "{name}: due");
                let mut removals = case.removals.iter().map(|a| a.result());
                let answers = Answers {
                    stale: removals.by_ref().take(plan.stale.len()).collect(),
                    due: removals.collect(),
                    removed_at: at(NOW),
                    pushes: case.pushes.iter().map(|a| (a.result(), at(NOW))).collect(),
                };
                let outcome = plan.conclude(answers);
                let status: Vec<(&str, bool)> = outcome
                    .status
                    .iter()
                    .map(|s| (s.volume_name.as_str(), s.updated))
                    .collect();
                assert_eq!(status, case.status, "{name}: status");
                assert_eq!(names(&outcome.edit.entomb), case.entomb, "{name}: entomb");
                assert_eq!(names(&outcome.edit.forget), case.forget, "{name}: forget");
                assert_eq!(marks(&outcome.edit.mark), case.mark, "{name}: mark");
                assert_eq!(
                    marks(&outcome.edit.answered),
                    case.answered,
                    "{name}: answered"
                );
                assert_eq!(outcome.failed, case.failed, "{name}: failed");
                assert_eq!(
                    outcome.wake,
                    case.wake.map(Duration::from_secs),
                    "{name}: wake"
                );
                if !case.entomb.is_empty() {
                    assert_eq!(outcome.edit.at, timestamp(at(NOW)), "{name}: removal time");
                }
            }
        }
    }
}
