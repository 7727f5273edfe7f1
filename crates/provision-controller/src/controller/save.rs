//! Saving provisioned PVs (Go `volume_store.go`) as [`Config::pv_save`](crate::Config)
//! says: blocking with retries and cleanup, or a background queue that retries forever
//! (whose saves settle the claim's journal entry).
//!
//! In a claim's way: the last step of a provisioning attempt (`claim`), after the PV was
//! built (`volume_object`, which also creates it).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use super::{
    Context,
    calls::{OpError, chain, get_volume, is_api},
    crash_safety,
    records::State,
    volume_object::{self, reuse_existing},
};
use crate::{DeleteError, annotations::ClaimView, events, queue::WorkQueue, retry::PvSaveStrategy};

/// The configured strategy, ready to run.
pub(crate) enum Saver {
    Blocking { pauses: Vec<Duration> },
    Background(Background),
}

/// PVs that failed to save, retried by [`run_background_worker`].
pub(crate) struct Background {
    pub(crate) queue: Arc<WorkQueue>,
    pending: Mutex<HashMap<String, PersistentVolume>>,
}

impl Background {
    fn pending(&self) -> MutexGuard<'_, HashMap<String, PersistentVolume>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    pub(crate) fn unsaved(&self) -> usize {
        self.pending().len()
    }
    /// The PV waiting to be saved under `name`.
    #[cfg(test)]
    pub(crate) fn pending_volume(&self, name: &str) -> Option<PersistentVolume> {
        self.pending().get(name).cloned()
    }
}

impl Saver {
    pub(crate) fn new(
        strategy: &PvSaveStrategy,
        metrics: Option<&crate::metrics::ControllerMetrics>,
    ) -> Self {
        match (strategy.pauses(), strategy) {
            (Some(pauses), _) => Self::Blocking { pauses },
            (None, PvSaveStrategy::Background { limiter }) => Self::Background(Background {
                queue: Arc::new(WorkQueue::new(
                    "unsavedpvs",
                    Arc::clone(limiter),
                    metrics.map(|m| m.queue("unsavedpvs")),
                )),
                pending: Mutex::default(),
            }),
            (None, _) => Self::Blocking { pauses: Vec::new() },
        }
    }

    /// Whether the background saver holds an unsaved PV named `name`.
    pub(crate) fn is_pending(&self, name: &str) -> bool {
        match self {
            Self::Background(bg) => bg.pending().contains_key(name),
            Self::Blocking { .. } => false,
        }
    }

    /// Drops the unsaved PV `name` (a PV of its name was saved, or the driver holds no
    /// asset any more).
    pub(crate) fn forget_pending(&self, ctx: &Context, name: &str) {
        if let Self::Background(bg) = self {
            let unsaved = {
                let mut pending = bg.pending();
                if pending.remove(name).is_none() {
                    return;
                }
                pending.len()
            };
            tracing::info!(pv = name, "dropped an unsaved PV that is no longer needed");
            set_unsaved(ctx, unsaved);
        }
    }

    /// Saves `volume` for `claim`: `Ok(true)` when the PV is saved (or another PV was
    /// saved under its name first), `Ok(false)` when the background saver took it over.
    ///
    /// With the blocking strategy an error means no PV was saved, with what the claim
    /// must remember: [`State::InBackground`] when the asset was kept (always with crash-safe
    /// provisioning: the claim keeps its journal intent and is provisioned, and saved, again),
    /// [`State::Finished`] when, without crash safety, no PV exists and the asset was
    /// deleted (or a cleanup event was sent). The background strategy never fails.
    pub(crate) async fn store(
        &self,
        ctx: &Context,
        claim: &ClaimView,
        volume: PersistentVolume,
    ) -> Result<bool, (State, OpError)> {
        match self {
            Self::Blocking { pauses } => Box::pin(store_blocking(ctx, pauses, claim, volume))
                .await
                .map(|()| true),
            Self::Background(bg) => {
                let name = volume.metadata.name.clone().unwrap_or_default();
                match create(ctx, &volume).await {
                    Ok(_) => {
                        succeeded(ctx, &claim.claim, &name).await;
                        return Ok(true);
                    }
                    Err(err) if invalid(&err).is_some() => {
                        // The server will refuse this PV however often it is sent: the
                        // driver must change it. The asset is kept; the claim is
                        // provisioned again after its backoff.
                        return Err(refused_as_invalid(ctx, claim, &name, err).await);
                    }
                    Err(err) => {
                        tracing::warn!(pv = %name, error = %chain(&err), "failed to save volume; retrying in background");
                        let unsaved = {
                            let mut pending = bg.pending();
                            pending.insert(name.clone(), volume);
                            pending.len()
                        };
                        set_unsaved(ctx, unsaved);
                        bg.queue.add(name);
                    }
                }
                Ok(false)
            }
        }
    }
}

/// Saves the PV ([`volume_object::create`]: an existing one counts as saved), then the
/// driver hears of the saved PV and the claim's journal entry is settled
/// ([`crash_safety::after_save`]).
async fn create(ctx: &Context, volume: &PersistentVolume) -> Result<PersistentVolume, OpError> {
    let saved = volume_object::create(ctx, volume).await?;
    crash_safety::after_save(ctx, volume_object::claim_uid(volume), &saved).await;
    Ok(saved)
}

fn set_unsaved(ctx: &Context, n: usize) {
    if let Some(m) = &ctx.metrics {
        m.set_unsaved_pvs(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

async fn succeeded(ctx: &Context, claim: &PersistentVolumeClaim, name: &str) {
    let note = format!("Successfully provisioned volume {name}");
    ctx.events
        .normal(claim, events::PROVISIONING_SUCCEEDED, note)
        .await;
}

async fn store_blocking(
    ctx: &Context,
    pauses: &[Duration],
    claim: &ClaimView,
    volume: PersistentVolume,
) -> Result<(), (State, OpError)> {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let mut last = None;
    for attempt in 0..=pauses.len() {
        if attempt > 0 {
            tokio::time::sleep(pauses[attempt - 1]).await;
        }
        match create(ctx, &volume).await {
            Ok(_) => {
                succeeded(ctx, &claim.claim, &name).await;
                return Ok(());
            }
            Err(err) if invalid(&err).is_some() => {
                // 422 Invalid: sending the same PV again cannot succeed (Go retries it
                // CreateProvisionedPVRetryCount times, 50 s by default, before any event).
                if ctx.config.crash_safe_provisioning {
                    return Err(refused_as_invalid(ctx, claim, &name, err).await);
                }
                last = Some(err);
                break;
            }
            Err(err) => {
                tracing::info!(pv = %name, attempt, error = %chain(&err), "failed to save persistentvolume");
                last = Some(err);
            }
        }
    }
    let save_error = last.expect("at least one attempt was made");

    if ctx.config.crash_safe_provisioning {
        // Never delete: the claim keeps its journal intent and stays in progress,
        // so it is provisioned again (the driver finds the asset) and saved later. A
        // delete here could destroy an asset that another replica's PV names meanwhile.
        return match saved_meanwhile(ctx, claim, &volume).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(keep_asset(ctx, claim, &name, save_error, None).await),
            Err(get_error) => Err(keep_asset(ctx, claim, &name, save_error, Some(get_error)).await),
        };
    }

    // Without crash safety (Go): delete the asset on the same schedule, but never while a
    // PV of its name exists: a create that failed may have been saved anyway, or another
    // replica saved a PV under this name, possibly naming this very asset. So the PV is
    // read again right before each delete attempt.
    let mut delete_error = None;
    for attempt in 0..=pauses.len() {
        if attempt > 0 {
            tokio::time::sleep(pauses[attempt - 1]).await;
        }
        match saved_meanwhile(ctx, claim, &volume).await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(get_error) => {
                return Err(keep_asset(ctx, claim, &name, save_error, Some(get_error)).await);
            }
        }
        if attempt == 0 {
            let note = format!(
                "Error creating provisioned PV object for claim {}: {}. Deleting the volume.",
                claim.key,
                chain(&save_error)
            );
            tracing::error!(pvc = %claim.key, error = %chain(&save_error), "saving the PV failed; deleting the volume");
            ctx.events
                .warning(&*claim.claim, events::PROVISIONING_FAILED, note)
                .await;
        }
        match ctx
            .driver_slots
            .deleting(
                ctx.config.provision_timeout,
                ctx.driver.provisioner.delete(&volume),
            )
            .await
        {
            Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => {
                delete_error = None;
                break;
            }
            Ok(Err(DeleteError::Failed(e))) => delete_error = Some(chain(&*e)),
            Err(e) => delete_error = Some(chain(&e.into_op("delete"))),
        }
        tracing::info!(
            pv = %name,
            attempt,
            error = delete_error.as_deref().unwrap_or_default(),
            "failed to clean up volume"
        );
    }
    if let Some(err) = delete_error {
        let note = format!(
            "Error cleaning provisioned volume for claim {}: {err}. Please delete manually.",
            claim.key
        );
        tracing::error!(pvc = %claim.key, pv = %name, error = %err, "cleaning up the provisioned volume failed; delete it manually");
        ctx.events
            .warning(&*claim.claim, events::PROVISIONING_CLEANUP_FAILED, note)
            .await;
    }
    Err((State::Finished, save_error))
}

/// The API server's message when `err` is its 422 Invalid answer (the PV the driver
/// returned breaks a validation rule; the message names the field).
fn invalid(err: &OpError) -> Option<&str> {
    match err {
        OpError::Api { source, .. } if is_api(source, |s| s.code == 422) => match source {
            kube_client::Error::Api(status) => Some(status.message.as_str()),
            _ => None,
        },
        _ => None,
    }
}

/// Reports a PV the API server refused as invalid, at once, with a Warning event that
/// quotes the server (which names the field); the asset is kept, so the claim must
/// remember that it may exist without a PV.
async fn refused_as_invalid(
    ctx: &Context,
    claim: &ClaimView,
    name: &str,
    err: OpError,
) -> (State, OpError) {
    let message = invalid(&err).unwrap_or_default();
    let note = format!(
        "The API server refused the PersistentVolume {name} the driver returned for claim {} as invalid: {message}. Keeping the volume; the driver must return a valid PV (capacity, access modes, reclaim policy, one volume source).",
        claim.key
    );
    tracing::error!(pvc = %claim.key, pv = name, error = %chain(&err), "the API server refused the provisioned PV as invalid; keeping the volume");
    ctx.events
        .warning(&*claim.claim, events::PROVISIONING_FAILED, note)
        .await;
    (State::InBackground, err)
}

/// Whether a PV of `volume`'s name exists now (then it is reused, see [`reuse_existing`],
/// and the claim told it succeeded).
///
/// # Errors
/// The read failed: whether a PV exists is unknown.
async fn saved_meanwhile(
    ctx: &Context,
    claim: &ClaimView,
    volume: &PersistentVolume,
) -> Result<bool, OpError> {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    match get_volume(&ctx.client, ctx.config.provision_timeout, name).await? {
        Some(saved) => {
            reuse_existing(volume, &saved);
            let claim_uid = (!claim.uid.is_empty()).then_some(claim.uid.as_str());
            crash_safety::after_save(ctx, claim_uid, &saved).await;
            succeeded(ctx, &claim.claim, name).await;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Reports a PV that could not be saved while its asset is kept (`get_error`: reading the
/// PV failed too); returns what the claim must remember: the asset may exist without a PV.
async fn keep_asset(
    ctx: &Context,
    claim: &ClaimView,
    name: &str,
    save_error: OpError,
    get_error: Option<OpError>,
) -> (State, OpError) {
    let why = match &get_error {
        Some(get_error) => format!("whether a PV names it is unknown ({})", chain(get_error)),
        None => "the claim is provisioned again and its PV saved then".to_owned(),
    };
    let note = format!(
        "Error creating provisioned PV object for claim {}: {}. Keeping the volume: {why}.",
        claim.key,
        chain(&save_error),
    );
    tracing::error!(pvc = %claim.key, pv = name, error = %chain(&save_error), %why, "saving the PV failed; keeping the volume");
    ctx.events
        .warning(&*claim.claim, events::PROVISIONING_FAILED, note)
        .await;
    (State::InBackground, save_error)
}

/// One worker of the background saver: saves PVs until the queue shuts down.
pub(crate) async fn run_background_worker(ctx: Arc<Context>) {
    let Saver::Background(bg) = &ctx.saver else {
        return;
    };
    while let Some(name) = bg.queue.get().await {
        let volume = bg.pending().get(&name).cloned();
        let claim = volume
            .as_ref()
            .and_then(|v| v.spec.as_ref())
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.as_deref())
            .and_then(|uid| ctx.caches.claim_by_uid(uid));
        match volume {
            None => bg.queue.forget(&name),
            Some(volume) => match create(&ctx, &volume).await {
                Ok(_) => {
                    // `create` settled the claim's journal entry: the PV records the asset.
                    let unsaved = {
                        let mut pending = bg.pending();
                        pending.remove(&name);
                        pending.len()
                    };
                    set_unsaved(&ctx, unsaved);
                    bg.queue.forget(&name);
                    ctx.caches.mark_saved(&name);
                    if let Some(claim) = &claim {
                        succeeded(&ctx, claim, &name).await;
                    }
                }
                Err(err) => {
                    tracing::warn!(pv = %name, error = %chain(&err), "failed to save volume; retrying");
                    bg.queue.add_rate_limited(name.clone());
                }
            },
        }
        bg.queue.done(&name);
    }
}
