//! Writes of a `CnsVolumeMetadata` object (finalizer, record, status) through the main
//! resource, with conflict retries on a fresh copy.

use kube_client::{Api, ResourceExt, api::PostParams};
use kube_controller_kit::{error::chain, events::EventType};
use tracing::debug;

use crate::{
    context::{Context, ReconcileError, describe},
    record::{self, Edit},
    resource::{CnsVolumeMetadata, VolumeStatus},
};

/// Replace attempts when the API server answers 409 Conflict.
const CONFLICT_RETRIES: usize = 5;

/// What became of a write.
#[derive(Debug)]
pub(crate) enum Written {
    /// The object as the server stored it.
    Updated(Box<CnsVolumeMetadata>),
    /// Not written: the object is gone, was replaced by another one (new UID), or its
    /// spec changed meanwhile (a new reconcile follows).
    Abandoned,
}

/// Applies `change` to `object` and replaces it on the server (there is no status
/// subresource). On 409 Conflict the object is read again and `change` reapplied, unless
/// the object was replaced by another one, its spec changed or it is gone.
pub(crate) async fn write(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    action: &'static str,
    change: impl Fn(&mut CnsVolumeMetadata),
) -> Result<Written, ReconcileError> {
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
            Ok(written) => return Ok(Written::Updated(Box::new(written))),
            Err(kube_client::Error::Api(status)) if status.code == 409 => {
                debug!(action, "conflict; reading the object again");
                match api.get_opt(&name).await.map_err(fail)? {
                    Some(fresh)
                        if fresh.metadata.uid == object.metadata.uid
                            && fresh.spec == object.spec =>
                    {
                        current = fresh;
                    }
                    _ => return Ok(Written::Abandoned),
                }
            }
            Err(kube_client::Error::Api(status)) if status.code == 404 => {
                return Ok(Written::Abandoned);
            }
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

/// Writes `status` and applies `edit` to the record, unless neither changes anything; a
/// failure is also published as an `UpdateFailed` event.
pub(crate) async fn write_status(
    object: &CnsVolumeMetadata,
    ctx: &Context,
    status: Vec<VolumeStatus>,
    edit: &Edit,
) -> Result<(), ReconcileError> {
    if object.status.volume_status == status && edit.is_empty() {
        return Ok(());
    }
    let result = write(object, ctx, "update status", |o| {
        o.status.volume_status.clone_from(&status);
        if !edit.is_empty() {
            let recorded = record::read(o).ok().flatten().unwrap_or_default();
            record::store(o, edit.apply(&recorded));
        }
    })
    .await;
    if let Err(error) = &result {
        let note = format!(
            "Failed to update status for {:?}. Err: {}.",
            object.name_any(),
            chain(error)
        );
        ctx.publish(object, EventType::Warning, "UpdateStatus", note)
            .await;
    }
    result.map(drop)
}
