//! Pure decisions of a deletion: which entries to remove from CNS ([`deletion`]), what the
//! answers come to ([`DeletionPlan::conclude`]), and the write that lets the object go
//! ([`Release::apply`]). No I/O: the reconciler removes, then writes what the plan says.

use std::time::{Duration, SystemTime};

use super::{Failed, Resolved, Target, sooner};
use crate::{
    record::{self, Edit, PushedEntry, Settle},
    resource::{CnsVolumeMetadata, FINALIZER, VolumeStatus},
};

/// What a deletion decides from.
pub(crate) struct DeletionObserved<'a> {
    /// Whether the object carries [`FINALIZER`].
    pub(crate) finalized: bool,
    /// `spec.volumenames`.
    pub(crate) volume_names: &'a [String],
    /// The record; `None` when the object has none (or it cannot be read).
    pub(crate) recorded: Option<&'a [PushedEntry]>,
    /// Pushes without answer this replica remembers.
    pub(crate) remembered: &'a [PushedEntry],
    /// The volume names of a valid spec, resolved; `None` when the spec is invalid.
    pub(crate) targets: Option<&'a [Target]>,
    /// For an invalid spec without a record: the entries it plausibly stands for.
    pub(crate) best_effort: &'a [PushedEntry],
    /// [`Config::settle_period`](crate::Config::settle_period).
    pub(crate) settle: Duration,
}

/// The removals of a deletion, in this order: `removals`, then `guessed`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct DeletionPlan {
    /// Entries that may be on CNS: recorded (tombstones too), remembered, or, without a
    /// record, what a valid spec describes. Only their removal holds the finalizer.
    pub(crate) removals: Vec<PushedEntry>,
    /// Entries removed once, best effort (a failure is a warning): what a valid spec
    /// describes and the record lacks (never pushed), or what an invalid spec without a
    /// record plausibly stands for.
    pub(crate) guessed: Vec<PushedEntry>,
    volume_names: Vec<String>,
    settle: Duration,
}

/// What a deletion comes to once its removals are answered.
#[derive(Debug)]
pub(crate) enum DeletionOutcome {
    /// CNS refused to remove recorded entries: the finalizer stays; write `status` and
    /// `edit` (what was removed leaves the record), then retry.
    Hold {
        status: Vec<VolumeStatus>,
        edit: Edit,
        /// Each entry CNS refused to remove, with why.
        failures: Vec<(PushedEntry, String)>,
        /// Entries whose removal was tried.
        total: usize,
    },
    /// Every entry is removed: let the object go.
    Release(Release),
}

/// The write that lets a deleted object go: the record loses what was removed, the
/// finalizer goes once the record is empty, the status is written.
#[derive(Debug)]
pub(crate) struct Release {
    pub(crate) status: Vec<VolumeStatus>,
    pub(crate) edit: Edit,
    /// Removed entries a push without answer may still land on: kept in the record (and
    /// the finalizer with them), removed once more after `wait`.
    pub(crate) pending: Vec<PushedEntry>,
    /// When the first of `pending` can no longer be landed on.
    pub(crate) wait: Option<Duration>,
}

/// What a deletion removes; `None` when there is nothing to do (neither our finalizer
/// nor a record).
///
/// Every recorded entry is removed (tombstones too), and every push this replica
/// remembers without answer. Without a record (last written by a version that kept
/// none), what a valid spec describes is removed as if recorded. Entries a valid spec
/// describes and the record lacks were never pushed (every push is recorded first): they
/// are removed once, best effort, as are the entries an invalid spec without a record
/// plausibly stands for. A volume whose claim or PV is gone, or whose claim is unbound,
/// has nothing on CNS that the record does not list.
pub(crate) fn deletion(observed: &DeletionObserved<'_>) -> Option<DeletionPlan> {
    let DeletionObserved {
        finalized,
        volume_names,
        recorded,
        remembered,
        targets,
        best_effort,
        settle,
    } = *observed;
    if !finalized && recorded.is_none_or(<[PushedEntry]>::is_empty) {
        return None;
    }
    let mut removals = record::union(recorded.unwrap_or_default(), remembered);
    let mut guessed = Vec::new();
    match targets {
        Some(targets) => {
            for entry in targets.iter().filter_map(|t| t.entry.as_ref()) {
                if recorded.is_none() {
                    removals = record::union(&removals, std::slice::from_ref(entry));
                } else if !removals.iter().any(|r| r.key() == entry.key()) {
                    guessed.push(entry.clone());
                }
            }
        }
        None if recorded.is_none() => guessed = best_effort.to_vec(),
        None => {}
    }
    Some(DeletionPlan {
        removals,
        guessed,
        volume_names: volume_names.to_vec(),
        settle,
    })
}

/// The volume names of `targets` that resolve to no CNS volume, with why (the reconciler
/// logs them: nothing to remove there).
pub(crate) fn unresolved(targets: &[Target]) -> impl Iterator<Item = (&str, &str)> {
    targets
        .iter()
        .filter_map(|t| match (&t.entry, &t.resolved) {
            (None, Resolved::Missing(reason)) => Some((t.volume_name.as_str(), reason.as_str())),
            _ => None,
        })
}

impl DeletionPlan {
    /// What the deletion comes to with the answers to `removals` (in order), answered by
    /// `now`: held while CNS refuses a removal; otherwise released, keeping in the record
    /// the entries a push without answer may still land on until the settle period after
    /// that push.
    pub(crate) fn conclude(
        &self,
        answers: Vec<Result<(), Failed>>,
        now: SystemTime,
    ) -> DeletionOutcome {
        let mut removed = Vec::new();
        let mut failures = Vec::new();
        for (entry, answer) in self.removals.iter().zip(answers) {
            match answer {
                Ok(()) => removed.push(entry.clone()),
                Err(Failed { message, .. }) => failures.push((entry.clone(), message)),
            }
        }
        let (mut pending, mut wait) = (Vec::new(), None);
        for entry in &removed {
            if let Settle::Wait(left) = entry.landing(now, self.settle) {
                wait = sooner(wait, left);
                pending.push(entry.clone());
            }
        }
        let edit = Edit {
            drop: record::without(&removed, &pending),
            mark: pending.clone(),
            ..Edit::default()
        };
        let status = self
            .volume_names
            .iter()
            .map(
                |volume| match failures.iter().find(|(e, _)| &e.volume_name == volume) {
                    Some((_, message)) => VolumeStatus::failed(volume, message.clone()),
                    None => VolumeStatus::updated(volume),
                },
            )
            .collect();
        if failures.is_empty() {
            DeletionOutcome::Release(Release {
                status,
                edit,
                pending,
                wait,
            })
        } else {
            DeletionOutcome::Hold {
                status,
                edit,
                failures,
                total: self.removals.len(),
            }
        }
    }
}

impl Release {
    /// Applies the release to `object` as the API server has it now: entries recorded
    /// meanwhile (by another replica), or whose push may still land, keep the finalizer.
    pub(crate) fn apply(&self, object: &mut CnsVolumeMetadata) {
        let fresh = record::read(object).ok().flatten().unwrap_or_default();
        let remaining = self.edit.apply(&fresh);
        if remaining.is_empty() {
            object
                .metadata
                .finalizers
                .get_or_insert_default()
                .retain(|f| f != FINALIZER);
        }
        record::store(object, remaining);
        object.status.volume_status.clone_from(&self.status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        plan::Resolved,
        testing::{pod_spec, pvc_spec},
    };

    const SETTLE: Duration = Duration::from_secs(180);

    fn entry(volume: &str) -> PushedEntry {
        PushedEntry::new(&pvc_spec(), volume, &format!("fcd-{volume}"), None)
    }

    fn target(volume: &str) -> Target {
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

    fn observed<'a>(
        volume_names: &'a [String],
        recorded: Option<&'a [PushedEntry]>,
        targets: Option<&'a [Target]>,
    ) -> DeletionObserved<'a> {
        DeletionObserved {
            finalized: true,
            volume_names,
            recorded,
            remembered: &[],
            targets,
            best_effort: &[],
            settle: SETTLE,
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn volumes(entries: &[PushedEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.volume_name.as_str()).collect()
    }

    #[test]
    fn nothing_to_do_without_our_finalizer_or_a_record() {
        let volume_names = names(&["a"]);
        let targets = [target("a")];
        let mut seen = observed(&volume_names, None, Some(&targets));
        seen.finalized = false;
        assert_eq!(deletion(&seen), None);
        seen.recorded = Some(&[]);
        assert_eq!(deletion(&seen), None);
        let recorded = [entry("a")];
        seen.recorded = Some(&recorded);
        let plan = deletion(&seen).expect("a record is removed without our finalizer too");
        assert_eq!(volumes(&plan.removals), ["a"]);
    }

    #[test]
    fn the_record_and_remembered_pushes_are_removed_and_unrecorded_targets_guessed() {
        let volume_names = names(&["a", "b", "c"]);
        let recorded = [entry("a")];
        let remembered = [entry("old").unanswered_since(SystemTime::UNIX_EPOCH)];
        let targets = [target("a"), target("b"), missing("c")];
        let mut seen = observed(&volume_names, Some(&recorded), Some(&targets));
        seen.remembered = &remembered;
        let plan = deletion(&seen).unwrap();
        assert_eq!(volumes(&plan.removals), ["a", "old"]);
        assert_eq!(
            volumes(&plan.guessed),
            ["b"],
            "b was never pushed: best effort"
        );
        assert_eq!(
            unresolved(&targets).collect::<Vec<_>>(),
            [("c", "persistentvolumeclaims \"c\" not found")]
        );
    }

    #[test]
    fn without_a_record_a_valid_spec_is_removed_and_an_invalid_one_guessed() {
        let volume_names = names(&["a", "b"]);
        let targets = [target("a"), target("b")];
        let plan = deletion(&observed(&volume_names, None, Some(&targets))).unwrap();
        assert_eq!(volumes(&plan.removals), ["a", "b"]);
        assert!(plan.guessed.is_empty());

        let best_effort = [entry("a")];
        let mut invalid = observed(&volume_names, None, None);
        invalid.best_effort = &best_effort;
        let plan = deletion(&invalid).unwrap();
        assert!(plan.removals.is_empty());
        assert_eq!(volumes(&plan.guessed), ["a"]);

        // An invalid spec with a record: the record is all that is removed.
        let recorded = [entry("b")];
        let mut recorded_invalid = observed(&volume_names, Some(&recorded), None);
        recorded_invalid.best_effort = &best_effort;
        let plan = deletion(&recorded_invalid).unwrap();
        assert_eq!(volumes(&plan.removals), ["b"]);
        assert!(plan.guessed.is_empty());
    }

    #[test]
    fn a_refused_removal_holds_the_finalizer_and_fails_its_volume() {
        let volume_names = names(&["a", "b"]);
        let recorded = [entry("a"), entry("b")];
        let plan = deletion(&observed(&volume_names, Some(&recorded), None)).unwrap();
        let refused = Failed {
            message: "cns is down".into(),
            unanswered: None,
        };
        let outcome = plan.conclude(vec![Ok(()), Err(refused)], SystemTime::UNIX_EPOCH);
        let DeletionOutcome::Hold {
            status,
            edit,
            failures,
            total,
        } = outcome
        else {
            panic!("held: {outcome:?}");
        };
        assert_eq!(
            status,
            [
                VolumeStatus::updated("a"),
                VolumeStatus::failed("b", "cns is down")
            ]
        );
        assert_eq!(
            volumes(&edit.drop),
            ["a"],
            "what was removed leaves the record"
        );
        assert_eq!(
            volumes(&failures.iter().map(|(e, _)| e.clone()).collect::<Vec<_>>()),
            ["b"]
        );
        assert_eq!(total, 2);
    }

    #[test]
    fn a_push_that_may_still_land_keeps_its_entry_until_it_settled() {
        let sent = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let volume_names = names(&["a", "b"]);
        let recorded = [entry("a").unanswered_since(sent), entry("b")];
        let plan = deletion(&observed(&volume_names, Some(&recorded), None)).unwrap();
        let now = sent + Duration::from_secs(60);
        let DeletionOutcome::Release(release) = plan.conclude(vec![Ok(()), Ok(())], now) else {
            panic!("released");
        };
        assert_eq!(volumes(&release.pending), ["a"]);
        assert_eq!(release.wait, Some(SETTLE - Duration::from_secs(60)));
        assert_eq!(volumes(&release.edit.drop), ["b"]);
        assert_eq!(volumes(&release.edit.mark), ["a"]);

        // Applied: the pending entry keeps the finalizer.
        let mut object = CnsVolumeMetadata::new("gc-1-data", pod_spec());
        object.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        record::store(&mut object, recorded.to_vec());
        release.apply(&mut object);
        assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
        let left = record::read(&object).unwrap().unwrap();
        assert_eq!(volumes(&left), ["a"]);
        assert_eq!(object.status.volume_status.len(), 2);

        // Once it settled, everything goes, the finalizer too.
        let later = sent + SETTLE + Duration::from_secs(1);
        let plan = deletion(&observed(&volume_names, Some(&left), None)).unwrap();
        let DeletionOutcome::Release(release) = plan.conclude(vec![Ok(())], later) else {
            panic!("released");
        };
        assert_eq!(release.wait, None);
        release.apply(&mut object);
        assert_eq!(object.metadata.finalizers, Some(vec![]));
        assert_eq!(record::read(&object).unwrap(), None);
    }

    #[test]
    fn entries_recorded_meanwhile_keep_the_finalizer() {
        let volume_names = names(&["a"]);
        let recorded = [entry("a")];
        let plan = deletion(&observed(&volume_names, Some(&recorded), None)).unwrap();
        let DeletionOutcome::Release(release) = plan.conclude(vec![Ok(())], SystemTime::UNIX_EPOCH)
        else {
            panic!("released");
        };
        // Another replica recorded a push since the record was read.
        let mut object = CnsVolumeMetadata::new("gc-1-data", pvc_spec());
        object.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        record::store(&mut object, vec![entry("a"), entry("z")]);
        release.apply(&mut object);
        assert_eq!(object.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
        assert_eq!(volumes(&record::read(&object).unwrap().unwrap()), ["z"]);
    }
}
