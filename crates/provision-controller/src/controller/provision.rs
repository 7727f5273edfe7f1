//! The normal flow of a claim: `should_provision` and `can_provision` (pure), then
//! `provision` and `provision_claim` (I/O). Go: `shouldProvision`, `canProvision`,
//! `provisionClaimOperation`, `provisionVolumeErrorHandling`, `rescheduleProvisioning`.
//!
//! In a claim's way: after the crash-safety step, the driver, the PV object
//! (`volume_object`) and its saving (`save`).

use std::sync::Arc;

use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
use kube_client::{Api, api::PostParams};
use tokio::time::Instant;

use super::{
    Context,
    calls::{self, OpError, Outcome, Why, api, chain},
    crash_safety::{Guard, Guarded},
    names::Names,
    records::{Progress, State},
    volume_object::{claim_reference, decorate, ensure_name},
};
use crate::{
    ProvisionError, ProvisionOptions,
    annotations::{self, ANN_SELECTED_NODE, ClaimView},
    events,
};

/// How an attempt ended without failing.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attempted {
    /// The PV was saved (or handed to the background saver).
    Provisioned,
    /// Nothing more to do for now (Go `errStopProvision`): not a failure.
    Stopped(&'static str),
}

type Attempt = Result<Attempted, (State, OpError)>;

/// Whether the claim should get a volume from us (Go `shouldProvision`, after the qualifier).
///
/// # Errors
/// [`OpError::ClassNotFound`] when the claim names us but its class is missing: the
/// claim is retried, since the class may be created later.
pub(crate) fn should_provision(
    claim: &ClaimView,
    names: Names<'_>,
    class_of: impl Fn(&str) -> Option<Arc<StorageClass>>,
) -> Result<bool, OpError> {
    if is_bound(&claim.claim) {
        return Ok(false);
    }
    let Some(provisioner) = claim.storage_provisioner.as_deref() else {
        return Ok(false);
    };
    if !names.knows(provisioner) {
        return Ok(false);
    }
    let class_name = &claim.class_name;
    let class = class_of(class_name).ok_or_else(|| OpError::ClassNotFound {
        name: class_name.clone(),
    })?;
    if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") {
        // The scheduler's choice is required; we remove it ourselves to reschedule.
        return Ok(claim
            .selected_node
            .as_deref()
            .is_some_and(|n| !n.is_empty())
            && claim.has_selected_node);
    }
    Ok(true)
}

fn is_bound(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty())
}

/// Whether this driver can serve the claim at all (Go `canProvision`).
///
/// # Errors
/// The message for the `ProvisioningFailed` event.
pub(crate) fn can_provision(
    claim: &ClaimView,
    supports_block: bool,
    provisioner: &str,
) -> Result<(), String> {
    if claim.is_block && !supports_block {
        return Err(format!(
            "{provisioner} does not support block volume provisioning"
        ));
    }
    Ok(())
}

fn data_source_kind(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source.as_ref())
        .map_or("", |d| d.kind.as_str())
}

/// The normal flow of a claim's sync, after the crash-safety step: whether to provision
/// it, then one attempt with `class` (the class its provisioning started with), with its
/// metrics. Returns, with the result, what the claim must remember.
pub(crate) async fn provision(
    ctx: &Context,
    uid: &str,
    claim: &ClaimView,
    progress: Progress,
    class: Option<Arc<StorageClass>>,
    guard: Guard<'_>,
) -> (State, Result<Outcome, OpError>) {
    let source = data_source_kind(&claim.claim).to_owned();
    // A claim whose provisioning may run in the background is driven until the driver
    // answers, whatever the claim, its class or the qualifier say now: forgetting it
    // would leak the asset being created (Go forgets it here).
    let in_progress = progress == Progress::InBackground;
    if !in_progress && let Some(wait) = ctx.records.infeasible_wait(uid, class.as_deref()) {
        let delayed = Outcome::RequeueAfter {
            wait,
            why: Why::Infeasible,
        };
        return (State::NoChange, Ok(delayed));
    }
    // The metrics' class label is Go's (`updateProvisionStats`): `spec.storageClassName`,
    // never the beta annotation the provisioning itself reads first.
    let label = crate::metrics::claim_label_class(&claim.claim);
    let should = if in_progress {
        tracing::debug!(pvc = %claim.key, "provisioning runs in the background; driving it on");
        Ok(true)
    } else {
        // The qualifier is asked only about claims that are ours (same answers as Go,
        // which asks it first, without calling a possibly costly qualifier for every claim).
        match should_provision(claim, ctx.names(), |_| class.clone()) {
            Ok(false) => Ok(false),
            decision if ctx.qualified(&claim.claim).await => decision,
            _ => Ok(false),
        }
    };
    match should {
        Err(err) => {
            if let Some(m) = &ctx.metrics {
                m.provision_failed(label, &source, std::time::Duration::ZERO);
            }
            return (State::NoChange, Err(err));
        }
        Ok(false) => return (State::NoChange, Ok(Outcome::Done)),
        Ok(true) => {}
    }
    let start = Instant::now();
    // Boxed, as the cleanups: the flows are large futures, and inline they make each
    // poll's stack frames large enough to overflow a thread's stack in debug builds.
    let attempt = Box::pin(provision_claim(ctx, claim, progress, class, guard)).await;
    let elapsed = start.elapsed();
    match attempt {
        Ok(Attempted::Provisioned) => {
            if let Some(m) = &ctx.metrics {
                m.provision_succeeded(label, &source, elapsed);
            }
            (State::Finished, Ok(Outcome::Done))
        }
        Ok(Attempted::Stopped(why)) => {
            tracing::info!(pvc = %claim.key, why, "stopped provisioning");
            if let Some(m) = &ctx.metrics {
                m.provision_stopped(label, &source);
            }
            (State::Finished, Ok(Outcome::Done))
        }
        Err((state, err)) => {
            if let Some(m) = &ctx.metrics {
                m.provision_failed(label, &source, elapsed);
            }
            (state, Err(err))
        }
    }
}

/// One provisioning attempt (Go `provisionClaimOperation`).
///
/// [`Progress::InBackground`]: the driver may be creating the asset in the background. Such a claim
/// ends only with an answer of the driver (or its PV existing): a missing class keeps it
/// (and is retried) unless the class it started with is remembered (`class`), and a
/// class that now names another provisioner does not stop it.
///
/// The selected node is passed to the driver by name and never read (Go v13): a node
/// that is gone is the driver's to judge (it may answer `Reschedule`).
#[tracing::instrument(skip_all, fields(pvc = %claim.key))]
async fn provision_claim(
    ctx: &Context,
    claim: &ClaimView,
    progress: Progress,
    class: Option<Arc<StorageClass>>,
    guard: Guard<'_>,
) -> Attempt {
    let in_progress = progress == Progress::InBackground;
    let class_name = claim.class_name.clone();
    let pv_name = ctx.config.volume_namer.name(&claim.claim);
    // Saved, or waiting in the background saver (Go adds it to its volume cache).
    if ctx.caches.volume_exists(&pv_name) || ctx.saver.is_pending(&pv_name) {
        return Ok(Attempted::Stopped("persistentvolume already exists"));
    }
    claim_reference(claim).map_err(|e| (State::NoChange, e))?;

    if let Err(message) = can_provision(claim, ctx.driver.provisioner.supports_block(), &ctx.name) {
        tracing::error!(%message, "cannot provision claim");
        ctx.events
            .warning(&*claim.claim, events::PROVISIONING_FAILED, message)
            .await;
        return Ok(Attempted::Stopped("provisioner cannot serve the claim"));
    }
    // Retried: the class may be created again. `NoChange` keeps a claim in progress.
    let Some(class) = class else {
        return Err((State::NoChange, OpError::ClassNotFound { name: class_name }));
    };
    if !ctx.names().knows(&class.provisioner) {
        if !in_progress {
            tracing::error!(provisioner = %class.provisioner, "unknown provisioner requested in the claim's class");
            return Ok(Attempted::Stopped("class names another provisioner"));
        }
        tracing::warn!(provisioner = %class.provisioner, "the claim's class now names another provisioner; driving the provisioning that runs in the background to its end");
    }

    let options = ProvisionOptions::new(
        Arc::clone(&class),
        pv_name,
        Arc::clone(&claim.claim),
        claim.selected_node.clone(),
    );
    let note = format!(
        "External provisioner is provisioning volume for claim {:?}",
        claim.key
    );
    ctx.events
        .normal(&*claim.claim, events::PROVISIONING, note)
        .await;

    // The driver call, with crash safety around it (the journal names the asset first).
    let answer = match guard.provision(&class, &options, progress).await {
        Guarded::Answer(answer) => *answer,
        Guarded::Stopped(why) => return Ok(Attempted::Stopped(why)),
        Guarded::Failed(err) => return Err((State::NoChange, err)),
    };
    let uid = &claim.uid;
    let mut volume = match answer {
        Ok(Ok(volume)) => volume,
        Ok(Err(ProvisionError::Ignored { reason })) => {
            tracing::info!(%reason, "volume provision ignored");
            return Ok(Attempted::Stopped("provisioner ignored the claim"));
        }
        Ok(Err(ProvisionError::Infeasible(source))) => {
            // Go v13: a slow retry, and this event instead of the usual one.
            tracing::info!(error = %chain(&*source), "infeasible volume provisioning request; retries will be delayed");
            ctx.records.mark_infeasible(uid, Some(&class));
            let note = format!(
                "Volume provisioning failed with infeasible error. Retries will be delayed. {}",
                chain(&*source)
            );
            ctx.events
                .warning(&*claim.claim, events::PROVISIONING_FAILED, note)
                .await;
            let err = OpError::Provision {
                class: class_name,
                source: ProvisionError::Infeasible(source),
            };
            return Err((State::Finished, err));
        }
        Ok(Err(source)) => {
            let state = match &source {
                ProvisionError::InBackground(_) => State::InBackground,
                ProvisionError::NoChange(_) => State::NoChange,
                _ => State::Finished,
            };
            let err = OpError::Provision {
                class: class_name,
                source,
            };
            return error_handling(ctx, claim, state, err).await;
        }
        // The backend may still be working on a timed-out call.
        Err(e @ calls::CallError::Timeout(_)) => {
            let err = e.into_op("provision");
            return error_handling(ctx, claim, State::InBackground, err).await;
        }
        // We cannot know what a panicking driver did: keep the remembered state.
        Err(e @ calls::CallError::Panicked(_)) => {
            let err = e.into_op("provision");
            return error_handling(ctx, claim, State::NoChange, err).await;
        }
    };
    ensure_name(&mut volume, &options.pv_name, claim);
    tracing::info!(
        pv = volume.metadata.name.as_deref().unwrap_or_default(),
        "volume provisioned"
    );

    decorate(ctx, claim, &class, &mut volume);
    let name = volume.metadata.name.clone().unwrap_or_default();
    // A saved PV settles the claim's journal entry (`volume_object::create`); one waiting
    // in the background saver does not: its intent stays until the saver is done.
    let saved = ctx.saver.store(ctx, claim, volume).await?;
    if saved {
        ctx.caches.mark_saved(&name);
    }
    Ok(Attempted::Provisioned)
}

/// Go `provisionVolumeErrorHandling`: the event, then a reschedule when the driver asked
/// for one ([`ProvisionError::Reschedule`]).
async fn error_handling(ctx: &Context, claim: &ClaimView, state: State, err: OpError) -> Attempt {
    let reschedule = matches!(
        &err,
        OpError::Provision {
            source: ProvisionError::Reschedule(_),
            ..
        }
    );
    ctx.events
        .warning(&*claim.claim, events::PROVISIONING_FAILED, chain(&err))
        .await;
    if reschedule && claim.has_selected_node {
        return match reschedule_claim(ctx, claim).await {
            Ok(()) => {
                tracing::info!(reason = %chain(&err), "volume rescheduled");
                Ok(Attempted::Stopped("rescheduled to another node"))
            }
            Err(update) => {
                tracing::info!(error = %chain(&update), "volume rescheduling failed");
                Err((State::Finished, err))
            }
        };
    }
    Err((state, err))
}

/// Removes the selected-node annotation so the scheduler picks again (Go `rescheduleProvisioning`).
///
/// The claim is read fresh (our copy may be behind) and written
/// with an update, which fails with a conflict when it changed meanwhile; when the
/// scheduler already chose another node than the one we tried, nothing is removed.
async fn reschedule_claim(ctx: &Context, view: &ClaimView) -> Result<(), OpError> {
    let claim = &view.claim;
    let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
    let name = claim.metadata.name.clone().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let limit = ctx.config.provision_timeout;
    let what = || {
        format!(
            "delete annotation {ANN_SELECTED_NODE} of claim {}",
            view.key
        )
    };
    let Some(mut updated) = api(limit, what, claims.get_opt(&name)).await? else {
        return Ok(());
    };
    if updated.metadata.uid != claim.metadata.uid
        || annotations::selected_node(&updated) != view.selected_node.as_deref()
    {
        return Ok(());
    }
    if let Some(annotations) = updated.metadata.annotations.as_mut() {
        annotations.remove(ANN_SELECTED_NODE);
    }
    api(
        limit,
        what,
        claims.replace(&name, &PostParams::default(), &updated),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::{ANN_ALPHA_SELECTED_NODE, ANN_BETA_STORAGE_PROVISIONER};
    use crate::testing::{class, pvc};

    const ME: &str = "example.com/me";

    fn decide(claim: PersistentVolumeClaim, classes: &[StorageClass]) -> Result<bool, String> {
        let additional = vec!["example.com/old-name".to_owned()];
        let names = Names {
            primary: ME,
            additional: &additional,
        };
        should_provision(&ClaimView::new(Arc::new(claim)), names, |name| {
            classes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
                .cloned()
                .map(Arc::new)
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn should_provision_decisions() {
        let fast = class("fast").provisioner(ME).build();
        let wffc = class("wffc")
            .provisioner(ME)
            .wait_for_first_consumer()
            .build();
        let classes = [fast, wffc];
        let base = || pvc("c").uid("u1").storage_class("fast");
        let cases: Vec<(&str, PersistentVolumeClaim, Result<bool, String>)> = vec![
            (
                "should provision a claim that names us",
                base().provisioner(ME).build(),
                Ok(true),
            ),
            (
                "should provision a claim naming us in the beta annotation",
                base().annotation(ANN_BETA_STORAGE_PROVISIONER, ME).build(),
                Ok(true),
            ),
            (
                "should provision a claim naming an additional name",
                base().provisioner("example.com/old-name").build(),
                Ok(true),
            ),
            (
                "should not provision a bound claim",
                base().provisioner(ME).volume_name("pv-1").build(),
                Ok(false),
            ),
            (
                "should not provision a claim without annotation",
                base().build(),
                Ok(false),
            ),
            (
                "should not provision a claim for another provisioner",
                base().provisioner("example.com/other").build(),
                Ok(false),
            ),
            (
                "should fail when the class is missing",
                pvc("c").storage_class("gone").provisioner(ME).build(),
                Err("storageclass \"gone\" not found".into()),
            ),
            (
                "should not provision a wait-for-first-consumer claim without a selected node",
                pvc("c").storage_class("wffc").provisioner(ME).build(),
                Ok(false),
            ),
            (
                "should provision a wait-for-first-consumer claim with a selected node",
                pvc("c")
                    .storage_class("wffc")
                    .provisioner(ME)
                    .selected_node("n1")
                    .build(),
                Ok(true),
            ),
            (
                "should not provision a wait-for-first-consumer claim with an empty selected node",
                pvc("c")
                    .storage_class("wffc")
                    .provisioner(ME)
                    .selected_node("")
                    .build(),
                Ok(false),
            ),
            (
                "should not provision a wait-for-first-consumer claim with only the alpha node",
                pvc("c")
                    .storage_class("wffc")
                    .provisioner(ME)
                    .annotation(ANN_ALPHA_SELECTED_NODE, "n1")
                    .build(),
                Ok(false),
            ),
        ];
        for (name, claim, want) in cases {
            assert_eq!(decide(claim, &classes), want, "case: {name}");
        }
    }

    #[test]
    fn can_provision_decisions() {
        let block = ClaimView::new(Arc::new(pvc("c").block().build()));
        let fs = ClaimView::new(Arc::new(pvc("c").build()));
        assert_eq!(can_provision(&fs, false, ME), Ok(()));
        assert_eq!(can_provision(&block, true, ME), Ok(()));
        assert_eq!(
            can_provision(&block, false, ME),
            Err("example.com/me does not support block volume provisioning".into())
        );
    }
}
