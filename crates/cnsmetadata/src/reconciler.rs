//! `reconcile` and `error_policy` for `CnsVolumeMetadata` (Go: `ReconcileCnsVolumeMetadata`).

use std::{fmt::Write as _, sync::Arc};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube_client::{Api, Client, Resource, ResourceExt, api::PostParams};
use kube_runtime::{
    controller::Action,
    reflector::{ObjectRef, Store},
};
use tracing::{debug, info, warn};

use crate::{
    backend::{VolumeMetadataBackend, error_chain},
    backoff::PerObjectBackoff,
    config::Config,
    events::{EventType, EventWriter},
    plan::{plan_update, referred_entities},
    resource::{CnsVolumeMetadata, VolumeStatus},
    validate::{InvalidSpec, validate},
};

/// Finalizer the reconciler puts on every object (Go: `cnsoperatortypes.CNSFinalizer`).
pub const FINALIZER: &str = "cns.vmware.com";
/// Event reason of failures.
pub const REASON_UPDATE_FAILED: &str = "UpdateFailed";
/// Event reason of successful updates.
pub const REASON_UPDATE_SUCCEEDED: &str = "UpdateSucceeded";
/// `reportingController` of published events (Go's event source component).
pub const REPORTING_CONTROLLER: &str = "cns.vmware.com";
/// Replace attempts when the API server answers 409 Conflict.
const CONFLICT_RETRIES: usize = 5;
/// Events notes are limited to 1 kB.
const MAX_NOTE_BYTES: usize = 1024;

/// Why one reconcile of one object failed; [`error_policy`] schedules the retry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The spec breaks validation rules.
    #[error("cnsvolumemetadata {object} is invalid")]
    InvalidSpec {
        /// `namespace/name` of the object.
        object: String,
        /// Every broken rule.
        #[source]
        source: InvalidSpec,
    },
    /// Some volumes could not be updated on CNS; their status says why.
    #[error("{failed} of {total} volumes of cnsvolumemetadata {object} failed to update on cns")]
    VolumesFailed {
        /// `namespace/name` of the object.
        object: String,
        /// Volumes that failed.
        failed: usize,
        /// Volumes named in the spec.
        total: usize,
    },
    /// Writing the object (finalizer or status) failed.
    #[error("failed to {action} of cnsvolumemetadata {object}")]
    Write {
        /// `namespace/name` of the object.
        object: String,
        /// What was written.
        action: &'static str,
        /// The API error.
        #[source]
        source: Box<kube_client::Error>,
    },
}

/// Everything `reconcile` needs: API client, caches, backend, options, retry state.
pub struct Context {
    client: Client,
    backend: Arc<dyn VolumeMetadataBackend>,
    config: Config,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    events: EventWriter,
    backoff: PerObjectBackoff,
}

impl Context {
    /// A context reading supervisor claims and volumes from the given caches (fill them
    /// with reflectors; [`run`](crate::run) does).
    #[must_use]
    pub fn new(
        client: Client,
        backend: Arc<dyn VolumeMetadataBackend>,
        config: Config,
        claims: Store<PersistentVolumeClaim>,
        volumes: Store<PersistentVolume>,
    ) -> Self {
        Self {
            events: EventWriter::new(
                client.clone(),
                REPORTING_CONTROLLER,
                config.get_reporting_instance(),
            ),
            client,
            backend,
            config,
            claims,
            volumes,
            backoff: PerObjectBackoff::default(),
        }
    }

    /// The retry delays per object.
    #[must_use]
    pub fn backoff(&self) -> &PerObjectBackoff {
        &self.backoff
    }

    async fn publish(
        &self,
        object: &CnsVolumeMetadata,
        type_: EventType,
        action: &str,
        note: String,
    ) {
        let reason = match type_ {
            EventType::Normal => REASON_UPDATE_SUCCEEDED,
            EventType::Warning => REASON_UPDATE_FAILED,
        };
        let note = truncate(note, MAX_NOTE_BYTES);
        self.events
            .publish(object.object_ref(&()), type_, reason, action, note)
            .await;
    }
}

/// Reconciles one object: validate, add the finalizer, push metadata to CNS (or remove it
/// when the object is being deleted, then drop the finalizer), and persist the per-volume
/// status. Resets the object's retry delay on success.
///
/// # Errors
/// [`ReconcileError`]; every failure has also been published as an `UpdateFailed` event.
#[doc(alias = "Reconcile")]
pub async fn reconcile(
    object: Arc<CnsVolumeMetadata>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let key = ObjectRef::from_obj(&*object);
    let action = apply(&object, &ctx).await?;
    ctx.backoff.reset(&key);
    Ok(action)
}

/// Schedules the retry of a failed object after its next backoff delay.
#[must_use]
pub fn error_policy(
    object: Arc<CnsVolumeMetadata>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx.backoff.next_delay(&ObjectRef::from_obj(&*object));
    warn!(error = %error_chain(error), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn describe(object: &CnsVolumeMetadata) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

async fn apply(object: &CnsVolumeMetadata, ctx: &Context) -> Result<Action, ReconcileError> {
    let spec = &object.spec;
    info!(entity_type = %spec.entity_type, entity = %spec.entity_name, "reconciling");
    if let Err(invalid) = validate(object) {
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
    let has_finalizer = object.finalizers().iter().any(|f| f == FINALIZER);
    let what = format!(
        "with name {:?} and entity type {:?} in the guest cluster {:?}",
        spec.entity_name,
        spec.entity_type.as_str(),
        spec.guest_cluster_id
    );
    if object.meta().deletion_timestamp.is_some() {
        if !has_finalizer {
            debug!("being deleted without our finalizer; nothing to do");
            return Ok(Action::await_change());
        }
        let status = sync_volumes(object, ctx, true).await;
        let failed = count_failed(&status);
        if failed > 0 {
            let note = format!(
                "Failed to delete entry in CNS for instance {what}. Requeuing request.{}",
                volume_errors(&status)
            );
            ctx.publish(object, EventType::Warning, "DeleteVolumeMetadata", note)
                .await;
            write_status(object, ctx, status.clone()).await?;
            return Err(volumes_failed(object, failed, status.len()));
        }
        let removed = write(object, ctx, "remove finalizer", |o| {
            o.metadata
                .finalizers
                .get_or_insert_default()
                .retain(|f| f != FINALIZER);
            o.status.volume_status.clone_from(&status);
        })
        .await;
        warn_finalizer_failure(object, ctx, "remove", &removed).await;
        removed?;
        info!("metadata removed from cns; finalizer removed");
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        let added = write(object, ctx, "add finalizer", |o| {
            let finalizers = o.metadata.finalizers.get_or_insert_default();
            if !finalizers.iter().any(|f| f == FINALIZER) {
                finalizers.push(FINALIZER.to_owned());
            }
        })
        .await;
        warn_finalizer_failure(object, ctx, "add", &added).await;
        added?;
        // The finalizer change triggers the next reconcile, which pushes the metadata.
        return Ok(Action::await_change());
    }
    let status = sync_volumes(object, ctx, false).await;
    let failed = count_failed(&status);
    if failed > 0 {
        let note = format!(
            "Failed to update entry in CNS for instance {what}. Requeueing request.{}",
            volume_errors(&status)
        );
        ctx.publish(object, EventType::Warning, "UpdateVolumeMetadata", note)
            .await;
        write_status(object, ctx, status.clone()).await?;
        return Err(volumes_failed(object, failed, status.len()));
    }
    let note = format!("Successfully updated entry in CNS for instance {what}.");
    ctx.publish(object, EventType::Normal, "UpdateVolumeMetadata", note)
        .await;
    write_status(object, ctx, status).await?;
    Ok(Action::await_change())
}

/// Publishes the `UpdateFailed` event Go records when adding or removing the finalizer
/// fails (`verb` is `add` or `remove`).
async fn warn_finalizer_failure(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    verb: &str,
    result: &Result<(), ReconcileError>,
) {
    if let Err(error) = result {
        let note = format!(
            "Failed to {verb} finalizer {FINALIZER:?} for {:?}. Err: {}. Requeueing request.",
            object.name_any(),
            error_chain(error)
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

fn count_failed(status: &[VolumeStatus]) -> usize {
    status.iter().filter(|s| !s.updated).count()
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

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max.saturating_sub(3);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// Pushes (or, with `delete`, removes) the entity on every volume of `object`, one status
/// per volume name in order.
async fn sync_volumes(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    delete: bool,
) -> Vec<VolumeStatus> {
    let spec = &object.spec;
    let namespace = object.namespace().unwrap_or_default();
    let mut references = referred_entities(spec, &ctx.config).into_iter();
    let mut statuses = Vec::with_capacity(spec.volume_names.len());
    for volume in &spec.volume_names {
        // Validation guarantees one reference per volume name.
        let reference = references.next().unwrap_or_default();
        let claim_key = ObjectRef::new(volume).within(&namespace);
        let Some(claim) = ctx.claims.get(&claim_key) else {
            if delete {
                info!(pvc = %claim_key, "claim not found; assuming the cns entry is gone");
                statuses.push(VolumeStatus::updated(volume));
            } else {
                let message = format!("persistentvolumeclaims {volume:?} not found");
                statuses.push(VolumeStatus::failed(volume, message));
            }
            continue;
        };
        let pv_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if pv_name.is_empty() {
            let message = format!("persistentvolumeclaim {volume:?} is not bound to a volume");
            statuses.push(VolumeStatus::failed(volume, message));
            continue;
        }
        let Some(pv) = ctx.volumes.get(&ObjectRef::new(&pv_name)) else {
            let message = format!("persistentvolumes {pv_name:?} not found");
            statuses.push(VolumeStatus::failed(volume, message));
            continue;
        };
        let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
        let Some(csi) = csi.filter(|c| c.driver == ctx.config.get_csi_driver()) else {
            debug!(pv = %pv_name, "volume of another driver; skipped");
            statuses.push(VolumeStatus::updated(volume));
            continue;
        };
        let update = plan_update(spec, &csi.volume_handle, reference, delete, &ctx.config);
        let timeout = ctx.config.get_backend_timeout();
        let outcome =
            tokio::time::timeout(timeout, ctx.backend.update_volume_metadata(&update)).await;
        statuses.push(match outcome {
            Ok(Ok(())) => VolumeStatus::updated(volume),
            Ok(Err(error)) if delete && error.is_not_found() => {
                info!(volume_id = %update.volume_id, "volume not found in cns; already deleted");
                VolumeStatus::updated(volume)
            }
            Ok(Err(error)) => {
                warn!(volume_id = %update.volume_id, error = %error_chain(&error), "cns update failed");
                VolumeStatus::failed(volume, error_chain(&error))
            }
            Err(_) => VolumeStatus::failed(
                volume,
                format!("cns volume metadata update timed out after {timeout:?}"),
            ),
        });
    }
    statuses
}

async fn write_status(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    status: Vec<VolumeStatus>,
) -> Result<(), ReconcileError> {
    if object.status.volume_status == status {
        return Ok(());
    }
    let result = write(object, ctx, "update status", |o| {
        o.status.volume_status.clone_from(&status)
    })
    .await;
    if let Err(error) = &result {
        let note = format!(
            "Failed to update status for {:?}. Err: {}.",
            object.name_any(),
            error_chain(error)
        );
        ctx.publish(object, EventType::Warning, "UpdateStatus", note)
            .await;
    }
    result
}

/// Applies `change` to `object` and replaces it on the server (there is no status
/// subresource). On 409 Conflict the object is read again and `change` reapplied, unless
/// the object was replaced by another one (new UID), its spec changed (a new reconcile
/// follows) or it is gone.
async fn write(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    action: &'static str,
    change: impl Fn(&mut CnsVolumeMetadata),
) -> Result<(), ReconcileError> {
    let namespace = object.namespace().unwrap_or_default();
    let api: Api<CnsVolumeMetadata> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = object.name_any();
    let fail = |source: kube_client::Error| ReconcileError::Write {
        object: describe(object),
        action,
        source: Box::new(source),
    };
    let mut current = object.clone();
    for _ in 0..CONFLICT_RETRIES {
        change(&mut current);
        match api.replace(&name, &PostParams::default(), &current).await {
            Ok(_) => return Ok(()),
            Err(kube_client::Error::Api(status)) if status.code == 409 => {
                debug!(action, "conflict; reading the object again");
                match api.get_opt(&name).await.map_err(fail)? {
                    Some(fresh)
                        if fresh.metadata.uid == object.metadata.uid
                            && fresh.spec == object.spec =>
                    {
                        current = fresh;
                    }
                    _ => return Ok(()),
                }
            }
            Err(kube_client::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(error) => return Err(fail(error)),
        }
    }
    let conflict = kube_client::Error::Api(Box::new(
        kube_client::core::Status::failure(
            &format!("still conflicting after {CONFLICT_RETRIES} attempts"),
            "Conflict",
        )
        .with_code(409),
    ));
    Err(fail(conflict))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_at_a_char_boundary() {
        let note = "é".repeat(600);
        let cut = truncate(note, MAX_NOTE_BYTES);
        assert!(cut.len() <= MAX_NOTE_BYTES);
        assert!(cut.ends_with("..."));
        assert_eq!(truncate("short".into(), MAX_NOTE_BYTES), "short");
    }

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
        assert_eq!(count_failed(&status), 1);
    }
}
