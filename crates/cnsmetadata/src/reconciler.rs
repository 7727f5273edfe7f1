//! `reconcile` and `error_policy` for `CnsVolumeMetadata` (Go: `ReconcileCnsVolumeMetadata`).

use std::{fmt::Write as _, sync::Arc, time::Duration};

use kube_client::{Resource, ResourceExt};
use kube_controller_kit::{error::chain, events::EventType};
use kube_runtime::{controller::Action, reflector::ObjectRef};
use tracing::{debug, info, warn};

use crate::{
    context::{Context, ReconcileError, describe},
    plan::{
        self, Answers, DeletionObserved, DeletionOutcome, Failed, Observed, Target, UpdatePlan,
        VolumePlan,
    },
    record::{self, PUSHED_ANNOTATION, PushedEntry},
    resource::{CnsVolumeMetadata, EntityType, FINALIZER, VolumeStatus},
    sync::{best_effort_entries, push, targets},
    trigger::trigger_hash,
    validate::{InvalidSpec, validate},
    write::{Written, write, write_status},
};

/// Retry delay of a deletion that found entries recorded while it ran.
const RECORDED_MEANWHILE_RETRY: Duration = Duration::from_secs(1);
/// Longest requeue of an object waiting for tombstones to settle; it checks again then.
const MAX_SETTLE_WAIT: Duration = Duration::from_secs(3600);

/// Reconciles one object: validate, add the finalizer, push metadata to CNS (or remove it
/// when the object is being deleted, then drop the finalizer), and persist the per-volume
/// status. Resets the object's retry delay on success.
///
/// Every entity pushed is first recorded in the annotation [`PUSHED_ANNOTATION`], marked
/// as sent and not yet answered (the status write after the push clears the mark), so
/// that a replica deleting the object meanwhile waits until the push can no longer land
/// and removes the entity once more; entities
/// an earlier spec pushed and the current one no longer describes are removed, and a
/// deletion removes every recorded entity, whatever the spec has become. A deletion never
/// waits on the spec (valid or not) or on supervisor claims and volumes (missing,
/// unbound): only on CNS failing to remove a recorded entry.
///
/// An entity removed because the spec changed stays in the record as a tombstone: after
/// the [settle period](crate::Config::settle_period) its removal is sent once more (a push
/// that timed out, or that a replica which lost its lease sent, may land on CNS after the
/// removal), then it leaves the record. The returned [`Action`] requeues the object for
/// that; a deletion removes tombstoned entities again without waiting.
///
/// # Errors
/// [`ReconcileError`]; every failure has also been published as an `UpdateFailed` event.
#[doc(alias = "Reconcile")]
pub(crate) async fn reconcile(
    object: Arc<CnsVolumeMetadata>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let key = ObjectRef::from_obj(&*object);
    let action = apply(&object, &ctx).await?;
    ctx.backoff.reset(&key);
    Ok(action)
}

/// Schedules the retry of a failed object after its next backoff delay. The delay starts
/// over when the object's spec or finalizers changed or its deletion started since its
/// last failure: a deletion never inherits the delay of earlier failures.
#[must_use]
pub(crate) fn error_policy(
    object: Arc<CnsVolumeMetadata>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx
        .backoff
        .next_delay_in(&ObjectRef::from_obj(&*object), trigger_hash(&object));
    warn!(error = %chain(error), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn has_finalizer(object: &CnsVolumeMetadata) -> bool {
    object.finalizers().iter().any(|f| f == FINALIZER)
}

/// `with name "x" and entity type "Y" in the guest cluster "z"`, as Go's event notes.
fn what(object: &CnsVolumeMetadata) -> String {
    let spec = &object.spec;
    format!(
        "with name {:?} and entity type {:?} in the guest cluster {:?}",
        spec.entity_name,
        spec.entity_type.as_str(),
        spec.guest_cluster_id
    )
}

async fn apply(object: &CnsVolumeMetadata, ctx: &Context) -> Result<Action, ReconcileError> {
    apply_read(object, ctx, false).await
}

/// The object as the API server has it now.
enum Latest {
    /// The same version as the copy at hand.
    Same,
    /// A newer version of the same object.
    Changed(Box<CnsVolumeMetadata>),
    /// Gone, or replaced by another object of the same name.
    Gone,
}

/// Reads `object` from the API server (not the cache).
async fn latest(object: &CnsVolumeMetadata, ctx: &Context) -> Result<Latest, ReconcileError> {
    let namespace = object.namespace().unwrap_or_default();
    let api: kube_client::Api<CnsVolumeMetadata> =
        kube_client::Api::namespaced(ctx.client.clone(), &namespace);
    let fresh = api
        .get_opt(&object.name_any())
        .await
        .map_err(|source| ReconcileError::Write {
            object: describe(object),
            action: "read the latest version",
            source: Box::new(source),
        })?;
    Ok(match fresh {
        None => Latest::Gone,
        Some(fresh) if fresh.metadata.uid != object.metadata.uid => Latest::Gone,
        Some(fresh) if fresh.metadata.resource_version == object.metadata.resource_version => {
            Latest::Same
        }
        Some(fresh) => Latest::Changed(Box::new(fresh)),
    })
}

/// [`apply`]; `read` says whether `object` was just read from the API server.
async fn apply_read(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    read: bool,
) -> Result<Action, ReconcileError> {
    let spec = &object.spec;
    info!(entity_type = %spec.entity_type, entity = %spec.entity_name, "reconciling");
    let valid = validate(object);
    if object.meta().deletion_timestamp.is_some() {
        // Validation never blocks a deletion: what was pushed is in the record.
        if let Err(invalid) = &valid {
            info!(problems = %join_violations(invalid), "deleting an object with an invalid spec");
        }
        return finish_deletion(object, ctx, valid.is_ok()).await;
    }
    if let Err(invalid) = valid {
        let note = format!(
            "Failed to validate reconcile request with error: {}",
            join_violations(&invalid)
        );
        ctx.publish(object, EventType::Warning, "Validate", note)
            .await;
        return Err(ReconcileError::InvalidSpec {
            object: describe(object),
            source: invalid,
        });
    }
    if spec.entity_type == EntityType::PersistentVolume
        && let Err(error) = ctx.config.validate()
    {
        // Upstream would send the empty ID to CNS; this object fails alone instead.
        ctx.publish(
            object,
            EventType::Warning,
            "Validate",
            format!("Failed to build the entity references: {error}"),
        )
        .await;
        return Err(ReconcileError::Config {
            object: describe(object),
            source: error,
        });
    }
    let recorded = recorded(object, ctx).await.unwrap_or_default();
    let targets = targets(object, ctx);
    let desired: Vec<PushedEntry> = targets.iter().filter_map(|t| t.entry.clone()).collect();
    if !has_finalizer(object) {
        // The finalizer goes on with the record of what the next reconcile will push.
        let added = write(object, ctx, "add finalizer", |o| {
            let finalizers = o.metadata.finalizers.get_or_insert_default();
            if !finalizers.iter().any(|f| f == FINALIZER) {
                finalizers.push(FINALIZER.to_owned());
            }
            let fresh = record::read(o).ok().flatten().unwrap_or_default();
            record::store(o, record::union(&fresh, &desired));
        })
        .await;
        warn_finalizer_failure(object, ctx, "add", &added).await;
        added?;
        // The finalizer change triggers the next reconcile, which pushes the metadata.
        return Ok(Action::await_change());
    }
    if !read {
        // The cache may be behind (a watch cut, a partition, two replicas at once without
        // leader election): a push from a stale copy would bring back the entity of an
        // object another replica deleted meanwhile, for good, or an older spec. Pushes
        // start from the object as the API server has it.
        match latest(object, ctx).await? {
            Latest::Same => {}
            Latest::Gone => {
                info!("the object is gone (the cache is behind); nothing to push");
                return Ok(Action::await_change());
            }
            Latest::Changed(fresh) => {
                debug!("the cache is behind; reconciling the object as the API server has it");
                return Box::pin(apply_read(&fresh, ctx, true)).await;
            }
        }
    }
    update(object, ctx, &recorded, &targets).await
}

/// The record of `object`; an unreadable one is reported and read as none.
async fn recorded(object: &CnsVolumeMetadata, ctx: &Context) -> Option<Vec<PushedEntry>> {
    match record::read(object) {
        Ok(recorded) => recorded,
        Err(error) => {
            let note = format!(
                "Ignoring the unreadable annotation {PUSHED_ANNOTATION:?} of {:?}: {error}",
                object.name_any()
            );
            ctx.publish(object, EventType::Warning, "ReadRecord", note)
                .await;
            None
        }
    }
}

/// Pushes the entity of a valid, finalized object to every volume it names, after
/// removing what an earlier spec pushed and this one no longer describes (and, once their
/// settle period passed, removing again the entities removed earlier): carries out the
/// [`plan`](crate::plan::plan), then writes what its answers come to.
async fn update(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    recorded: &[PushedEntry],
    targets: &[Target],
) -> Result<Action, ReconcileError> {
    let key = ObjectRef::from_obj(object);
    let remembered = ctx.remembered_unanswered(&key);
    let plan = plan::plan(&Observed {
        spec: &object.spec,
        recorded,
        targets,
        remembered: &remembered,
        now: ctx.now(),
        settle: ctx.config.settle_period(),
    });
    for (entry, why) in &plan.odd {
        let note = format!(
            "Removing entity {:?} from volume {:?} ({}) again now, as recorded in \
             the annotation {PUSHED_ANNOTATION:?} of {:?}: {why}.",
            entry.entity_name,
            entry.volume_id,
            entry.volume_name,
            object.name_any()
        );
        ctx.publish(object, EventType::Warning, "ReadRecord", note)
            .await;
    }
    // Every push is recorded, marked as sent and not yet answered, before it goes out: a
    // replica that deletes the object meanwhile (the other one, without leader election,
    // or the next leader while this one, cut off from the API server, still sends) keeps
    // the finalizer until the push can no longer land, then removes the entity once more.
    // The status write below clears the mark of each push answered.
    let written;
    let mut current = object;
    if let Some(sending) = &plan.intent {
        let result = write(object, ctx, "record pushed entities", |o| {
            let fresh = record::read(o).ok().flatten().unwrap_or_default();
            record::store(o, record::union(&fresh, sending));
        })
        .await?;
        match result {
            Written::Updated(fresh) => written = fresh,
            Written::Abandoned => return Ok(Action::await_change()),
        }
        if written.metadata.deletion_timestamp.is_some() {
            // Deleted meanwhile: the deletion's reconcile removes what is recorded
            // (waiting out the marks just written); nothing is pushed now.
            debug!("the object is being deleted; nothing to push");
            return Ok(Action::await_change());
        }
        current = &written;
    }
    let outcome = plan.conclude(send(&plan, ctx, &key).await);
    if outcome.failed > 0 {
        let note = format!(
            "Failed to update entry in CNS for instance {}. Requeueing request.{}{}",
            what(object),
            volume_errors(&outcome.status),
            outcome.errors
        );
        ctx.publish(object, EventType::Warning, "UpdateVolumeMetadata", note)
            .await;
        write_status(current, ctx, outcome.status, &outcome.edit).await?;
        return Err(volumes_failed(object, outcome.failed, outcome.total));
    }
    let note = format!(
        "Successfully updated entry in CNS for instance {}.",
        what(object)
    );
    ctx.publish(object, EventType::Normal, "UpdateVolumeMetadata", note)
        .await;
    write_status(current, ctx, outcome.status, &outcome.edit).await?;
    Ok(match outcome.wake {
        Some(wait) => {
            debug!(
                ?wait,
                "removed entities or pushes without answer settling; removing or pushing them again then"
            );
            Action::requeue(wait.min(MAX_SETTLE_WAIT))
        }
        None => Action::await_change(),
    })
}

/// Sends the removals and pushes of `plan`, in its order, and collects the answers; a
/// push without answer is remembered for `key` (in case the status write fails).
async fn send(plan: &UpdatePlan, ctx: &Context, key: &ObjectRef<CnsVolumeMetadata>) -> Answers {
    // Stale entries go first: CNS may identify an entity by fewer fields than the record
    // does, and must not lose the one pushed next. The same holds for settled tombstones.
    let mut stale = Vec::with_capacity(plan.stale.len());
    for entry in &plan.stale {
        stale.push(push(ctx, entry, true).await);
    }
    let mut due = Vec::with_capacity(plan.due.len());
    for entry in &plan.due {
        let answer = push(ctx, entry, true).await;
        if answer.is_ok() {
            debug!(entity = %entry.entity_name, volume_id = %entry.volume_id, "removed again after settling");
        }
        due.push(answer);
    }
    let removed_at = ctx.now();
    let mut pushes = Vec::with_capacity(plan.volumes.len());
    for volume in &plan.volumes {
        if let VolumePlan::Push(planned) = volume {
            let entry = &planned.entry;
            let answer = push(ctx, entry, false).await;
            if let Err(Failed {
                unanswered: Some(sent),
                ..
            }) = &answer
            {
                ctx.remember_unanswered(key, entry.unanswered_since(*sent));
            }
            pushes.push((answer, ctx.now()));
        }
    }
    Answers {
        stale,
        due,
        removed_at,
        pushes,
    }
}

/// Removes from CNS everything the object may have put there, then lets it go.
///
/// What is removed: every recorded entry (tombstones too); for an object without a record
/// (last written by a version that kept none), what its spec describes when it is valid.
/// Only the removal of those entries holds the finalizer, and only while CNS refuses it.
/// Entries the spec describes now but the record lacks were never pushed (every push is
/// recorded first): they are removed once, best effort. A volume whose claim or PV is
/// gone, or whose claim is unbound, has nothing on CNS that the record does not list. For
/// an invalid spec without a record, the entries it plausibly stands for are removed once,
/// best effort, without holding the finalizer.
///
/// An entry with a push that got no answer (marked in the record, or remembered by this
/// replica) is removed at once, but stays in the record, and the finalizer with it, until
/// that push can no longer land (the settle period after it was sent); then it is removed
/// once more and the object goes.
async fn finish_deletion(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    spec_valid: bool,
) -> Result<Action, ReconcileError> {
    let finalized = has_finalizer(object);
    let recorded = recorded(object, ctx).await;
    let key = ObjectRef::from_obj(object);
    let remembered = ctx.remembered_unanswered(&key);
    let targets = spec_valid.then(|| targets(object, ctx));
    let best_effort = if spec_valid || recorded.is_some() {
        Vec::new()
    } else {
        best_effort_entries(object, ctx)
    };
    let Some(plan) = plan::deletion(&DeletionObserved {
        finalized,
        volume_names: &object.spec.volume_names,
        recorded: recorded.as_deref(),
        remembered: &remembered,
        targets: targets.as_deref(),
        best_effort: &best_effort,
        settle: ctx.config.settle_period(),
    }) else {
        debug!("being deleted without our finalizer or record; nothing to do");
        return Ok(Action::await_change());
    };
    for (volume, reason) in targets.iter().flat_map(|t| plan::unresolved(t)) {
        info!(%volume, %reason, "no cns volume; nothing to remove");
    }
    let mut answers = Vec::with_capacity(plan.removals.len());
    for entry in &plan.removals {
        answers.push(push(ctx, entry, true).await);
    }
    for entry in &plan.guessed {
        if let Err(Failed { message, .. }) = push(ctx, entry, true).await {
            warn_guess_left(object, ctx, entry, spec_valid, &message).await;
        }
    }
    // Removed, but a push without answer may still land: removed once more later.
    let release = match plan.conclude(answers, ctx.now()) {
        DeletionOutcome::Release(release) => release,
        DeletionOutcome::Hold {
            status,
            edit,
            failures,
            total,
        } => {
            let mut errors = String::new();
            for (entry, message) in &failures {
                let _ = write!(
                    errors,
                    " {} (volume {:?}): {message}.",
                    entry.volume_name, entry.volume_id
                );
            }
            let note = format!(
                "Failed to delete entry in CNS for instance {}. Requeuing request.{errors}",
                what(object)
            );
            ctx.publish(object, EventType::Warning, "DeleteVolumeMetadata", note)
                .await;
            write_status(object, ctx, status, &edit).await?;
            return Err(volumes_failed(object, failures.len(), total));
        }
    };
    let written = write(object, ctx, "remove finalizer", |o| release.apply(o)).await;
    if finalized {
        warn_finalizer_failure(object, ctx, "remove", &written).await;
    }
    let written = written?;
    if let Some(wait) = release.wait {
        let entities: Vec<String> = release
            .pending
            .iter()
            .map(|e| format!("{} on {}", e.entity_name, e.volume_id))
            .collect();
        info!(
            ?wait,
            entities = %entities.join(", "),
            "removed, but a push that got no answer may still land; removing again then"
        );
        return Ok(Action::requeue(wait.min(MAX_SETTLE_WAIT)));
    }
    if let Written::Updated(left) = written
        && record::read(&left).is_ok_and(|r| r.is_some())
    {
        info!("entries were recorded during the deletion; removing them next");
        return Ok(Action::requeue(RECORDED_MEANWHILE_RETRY));
    }
    ctx.forget_unanswered(&key);
    info!("metadata removed from cns; finalizer removed");
    Ok(Action::await_change())
}

/// Warns that a best-effort removal of `entry` failed: it may remain on CNS.
async fn warn_guess_left(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    entry: &PushedEntry,
    spec_valid: bool,
    message: &str,
) {
    let why = if spec_valid {
        "which its record does not list (it was never pushed)"
    } else {
        "whose spec is invalid"
    };
    let note = format!(
        "Could not remove entity {:?} from volume {:?} while deleting {:?}, {why}: \
         {message}. The entry may remain on CNS.",
        entry.entity_name,
        entry.volume_id,
        object.name_any()
    );
    ctx.publish(object, EventType::Warning, "DeleteVolumeMetadata", note)
        .await;
}

/// Publishes the `UpdateFailed` event Go records when adding or removing the finalizer
/// fails (`verb` is `add` or `remove`).
async fn warn_finalizer_failure<T>(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    verb: &str,
    result: &Result<T, ReconcileError>,
) {
    if let Err(error) = result {
        let note = format!(
            "Failed to {verb} finalizer {FINALIZER:?} for {:?}. Err: {}. Requeueing request.",
            object.name_any(),
            chain(error)
        );
        ctx.publish(object, EventType::Warning, "UpdateFinalizer", note)
            .await;
    }
}

fn volumes_failed(object: &CnsVolumeMetadata, failed: usize, total: usize) -> ReconcileError {
    ReconcileError::VolumesFailed {
        object: describe(object),
        failed,
        total,
    }
}

fn join_violations(invalid: &InvalidSpec) -> String {
    let messages: Vec<String> = invalid.violations.iter().map(ToString::to_string).collect();
    messages.join("; ")
}

fn volume_errors(status: &[VolumeStatus]) -> String {
    let mut text = String::new();
    for failed in status.iter().filter(|s| !s.updated) {
        let _ = write!(text, " {}: {}.", failed.volume_name, failed.error_message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_errors_list_only_failed_volumes() {
        let status = vec![
            VolumeStatus::updated("a"),
            VolumeStatus::failed("b", "persistentvolumeclaims \"b\" not found"),
        ];
        assert_eq!(
            volume_errors(&status),
            " b: persistentvolumeclaims \"b\" not found."
        );
    }
}
