//! Before the provisioning step: what crash safety does with a claim ([`plan`], pure),
//! from its journal entry, its PV and the claim itself; [`before_provisioning`] carries
//! it out (settles, waits, cleanups, last sweeps) or lets the normal flow run.

use std::sync::Arc;

use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};

use super::{
    Presence,
    cleanup::{LateWindow, Seen, clean_up, last_sweep},
    intent::{queue_at, window_secs},
};
use crate::{
    annotations::ClaimView,
    controller::{
        Context,
        calls::{OpError, Outcome},
        records::{InProgress, Progress, State},
    },
    events,
    journal::{self, Entry},
};

/// The class to provision (or clean up) the claim with: the class its provisioning
/// started with, as remembered in memory (`entry`) or recorded in the journal, else its
/// class as cached now. A claim in progress must not depend on a class that may have been
/// deleted or changed since its asset was asked for.
pub(crate) fn provisioning_class(
    ctx: &Context,
    claim: &ClaimView,
    entry: Option<&InProgress>,
    recorded: Option<&Entry>,
) -> Option<Arc<StorageClass>> {
    entry
        .and_then(|e| e.class.clone())
        .or_else(|| {
            let key = recorded?.class.as_deref()?;
            ctx.journal.as_ref()?.class(&claim.uid, key)
        })
        .or_else(|| ctx.caches.class(&claim.class_name))
}

/// Whether the claim still asks us for a volume: its storage-provisioner annotation names
/// us, and so does its class when it is cached.
fn wanted(ctx: &Context, claim: &ClaimView) -> bool {
    let names = ctx.names();
    claim
        .storage_provisioner
        .as_deref()
        .is_some_and(|p| names.knows(p))
        && ctx
            .caches
            .class(&claim.class_name)
            .is_none_or(|c| names.knows(&c.provisioner))
}

/// How [`before_provisioning`] left the claim's sync.
pub(super) enum Step {
    /// Crash safety finished the sync (a cleanup or sweep ran, or the entry was settled):
    /// `state` is what the claim must remember, `class` the class the cleanup ran with.
    Done {
        state: State,
        class: Option<Arc<StorageClass>>,
        result: Result<Outcome, OpError>,
    },
    /// The normal flow runs, with the class its provisioning started with
    /// ([`provisioning_class`]).
    Provision { class: Option<Arc<StorageClass>> },
}

/// The crash-safety step of a claim's sync, before the normal flow: a claim that is
/// [`Presence::Gone`] (`claim` is the copy kept in `entry`, or rebuilt from its journal entry) or
/// whose journal entry asks for it gets what [`plan`] says (the entry settled, a cleanup,
/// the last sweep); any other goes on to the normal flow.
pub(super) async fn before_provisioning(
    ctx: &Context,
    claim: &ClaimView,
    entry: Option<&InProgress>,
    presence: Presence,
) -> Step {
    let gone = presence == Presence::Gone;
    let done = |result| Step::Done {
        state: State::NoChange,
        class: None,
        result,
    };
    let recorded = super::entry(ctx, &claim.uid);
    if recorded.is_none() && !gone {
        // Nothing recorded for a live claim: the normal flow (which calls the volume
        // namer only once the claim is found to be ours).
        return Step::Provision {
            class: provisioning_class(ctx, claim, entry, None),
        };
    }
    let pv_name = recorded.as_ref().map_or_else(
        || ctx.config.volume_namer.name(&claim.claim),
        |e| e.pv.clone(),
    );
    let now = journal::now_secs();
    let facts = Facts {
        gone,
        in_progress: entry.is_some(),
        recorded: recorded.as_ref(),
        pv_name: &pv_name,
        volume_exists: ctx.caches.volume_exists(&pv_name),
        wanted: !gone && wanted(ctx, claim),
        now,
    };
    let plan = plan(&claim.claim, facts);
    if let Some(recorded) = &recorded
        && recorded.is_intent()
        && !gone
    {
        warn_if_held(ctx, claim, recorded, now).await;
    }
    let class = provisioning_class(ctx, claim, entry, recorded.as_ref());
    match plan {
        Plan::Continue => Step::Provision { class },
        Plan::Wait => {
            if let Some(due) = recorded.as_ref().and_then(|e| e.due) {
                queue_at(ctx, &claim.uid, due);
            }
            done(Ok(Outcome::Done))
        }
        Plan::Settle => {
            // A PV of its name exists: it records the asset. Its saver settled the entry,
            // or stopped before it could: the last sweep is due a window from now.
            let uid = &claim.uid;
            if let Some(j) = &ctx.journal {
                let due = j.settle(uid, window_secs(ctx));
                queue_at(ctx, uid, due);
            }
            done(Ok(Outcome::Done))
        }
        Plan::Sweep => {
            let due = recorded.as_ref().and_then(|e| e.due).unwrap_or(now);
            done(
                last_sweep(ctx, &claim.uid, &pv_name, due)
                    .await
                    .map(|()| Outcome::Done),
            )
        }
        Plan::CleanUp(window) => {
            // Boxed: the cleanup is a large future (see `provision::provision`).
            let progress = Progress::of(entry);
            let seen = Seen {
                entry: recorded.as_ref(),
                window,
            };
            let cleanup = clean_up(
                ctx,
                claim,
                class.clone(),
                presence,
                progress,
                &pv_name,
                seen,
            );
            let (state, result) = Box::pin(cleanup).await;
            Step::Done {
                state,
                class,
                result,
            }
        }
    }
}

/// What [`plan`] needs to know besides the claim.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<'a> {
    /// The claim is not cached: deleted (this is the copy the controller kept, or the
    /// one its journal entry describes).
    pub(crate) gone: bool,
    /// Its provisioning runs in the background in this process.
    pub(crate) in_progress: bool,
    /// Its journal entry.
    pub(crate) recorded: Option<&'a Entry>,
    /// The name our PV for the claim has.
    pub(crate) pv_name: &'a str,
    /// That PV is cached, or was just saved by us.
    pub(crate) volume_exists: bool,
    /// The claim still asks us for a volume: its storage-provisioner annotation names us,
    /// and so does its class when it is cached.
    pub(crate) wanted: bool,
    /// Now, in Unix seconds.
    pub(crate) now: i64,
}

/// What crash safety does with a claim, before the normal claim flow.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not crash safety's to handle: run the normal flow.
    Continue,
    /// Nothing to do now (a settled entry whose sweep is not due, for a claim that is
    /// gone or needs nothing).
    Wait,
    /// An intent whose PV exists (or whose claim is bound to it): settle it.
    Settle,
    /// A settled entry whose last sweep is due, and whose PV exists: sweep and remove it.
    Sweep,
    /// The claim will not get our PV the normal way (it is gone, being deleted, bound to
    /// another PV, or asks another provisioner now) and our PV does not exist: save a PV
    /// for the asset, if any ([`clean_up`]), a create sent before may still land or not.
    CleanUp(LateWindow),
}

/// Decides what crash safety does with a claim (pure).
pub(crate) fn plan(claim: &PersistentVolumeClaim, facts: Facts<'_>) -> Plan {
    let Some(recorded) = facts.recorded else {
        // No record: only a claim whose provisioning ran in the background in this
        // process and that vanished needs crash safety (nothing records its asset).
        return if facts.gone && facts.in_progress {
            Plan::CleanUp(LateWindow::Open)
        } else if facts.gone {
            Plan::Wait
        } else {
            Plan::Continue
        };
    };
    if let Some(due) = recorded.due {
        if due > facts.now {
            return if facts.gone {
                Plan::Wait
            } else {
                Plan::Continue
            };
        }
        return if facts.volume_exists {
            Plan::Sweep
        } else {
            Plan::CleanUp(LateWindow::Over)
        };
    }
    if facts.volume_exists {
        return Plan::Settle;
    }
    if facts.gone {
        return Plan::CleanUp(LateWindow::Open);
    }
    let bound_to = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    match bound_to {
        Some(volume) if volume == facts.pv_name => Plan::Settle,
        // Bound to another PV: ours, if its asset exists, would never be used.
        Some(_) => Plan::CleanUp(LateWindow::Open),
        None if claim.metadata.deletion_timestamp.is_some() || !facts.wanted => {
            Plan::CleanUp(LateWindow::Open)
        }
        None => Plan::Continue,
    }
}

/// A `ProvisioningHeld` Warning event on a live claim whose intent is older than
/// [`Config::provisioning_held_warning`](crate::Config), once per process.
async fn warn_if_held(ctx: &Context, claim: &ClaimView, recorded: &Entry, now: i64) {
    let limit = i64::try_from(ctx.config.provisioning_held_warning.as_secs()).unwrap_or(i64::MAX);
    let age = now.saturating_sub(recorded.since);
    if age < limit {
        return;
    }
    if !ctx.records.warn_held_once(&claim.uid) {
        return;
    }
    let note = format!(
        "The provisioning of volume {} for claim {} started {age} s ago and has not finished: the driver has not \
         answered with a volume or a final error yet. The controller's journal keeps the claim until it does.",
        recorded.pv, claim.key
    );
    tracing::warn!(pvc = %claim.key, age_seconds = age, "provisioning held for long");
    ctx.events
        .warning(&*claim.claim, events::PROVISIONING_HELD, note)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    const ME: &str = "example.com/me";

    fn intent() -> Entry {
        Entry {
            claim: "default/c".into(),
            pv: "pvc-u1".into(),
            since: 1000,
            writer: "w".into(),
            class: None,
            node: None,
            spec: None,
            due: None,
            attempt: None,
        }
    }

    fn settled(due: i64) -> Entry {
        Entry {
            due: Some(due),
            ..intent()
        }
    }

    #[test]
    fn plan_decisions() {
        let base = || pvc("c").uid("u1").provisioner(ME);
        let facts = |recorded: Option<&'static Entry>, gone, exists, wanted| Facts {
            gone,
            in_progress: false,
            recorded,
            pv_name: "pvc-u1",
            volume_exists: exists,
            wanted,
            now: 2000,
        };
        let intent: &'static Entry = Box::leak(Box::new(intent()));
        let due: &'static Entry = Box::leak(Box::new(settled(1500)));
        let later: &'static Entry = Box::leak(Box::new(settled(2500)));
        // (case, claim, facts, plan)
        let cases = [
            (
                "a claim without entry runs the normal flow",
                base().build(),
                facts(None, false, false, true),
                Plan::Continue,
            ),
            (
                "a live claim with an intent is provisioned again",
                base().build(),
                facts(Some(intent), false, false, true),
                Plan::Continue,
            ),
            (
                "an intent whose PV exists is settled",
                base().build(),
                facts(Some(intent), false, true, true),
                Plan::Settle,
            ),
            (
                "an intent whose claim is bound to our PV is settled",
                base().volume_name("pvc-u1").build(),
                facts(Some(intent), false, false, true),
                Plan::Settle,
            ),
            (
                "an intent whose claim is bound to another PV is cleaned up",
                base().volume_name("static").build(),
                facts(Some(intent), false, false, true),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "an intent whose claim is gone is cleaned up",
                base().build(),
                facts(Some(intent), true, false, false),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "an intent whose claim is being deleted is cleaned up",
                base().deleting().build(),
                facts(Some(intent), false, false, true),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "an intent whose claim asks another provisioner now is cleaned up",
                base().provisioner("example.com/other").build(),
                facts(Some(intent), false, false, false),
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "a gone claim whose PV exists only settles",
                base().build(),
                facts(Some(intent), true, true, false),
                Plan::Settle,
            ),
            (
                "a settled entry not due yet: the normal flow for a live claim",
                base().volume_name("pvc-u1").build(),
                facts(Some(later), false, true, true),
                Plan::Continue,
            ),
            (
                "a settled entry not due yet: nothing for a gone claim",
                base().build(),
                facts(Some(later), true, false, false),
                Plan::Wait,
            ),
            (
                "a settled entry due, PV there: the last sweep",
                base().build(),
                facts(Some(due), true, true, false),
                Plan::Sweep,
            ),
            (
                "a settled entry due, PV gone: a last cleanup",
                base().build(),
                facts(Some(due), true, false, false),
                Plan::CleanUp(LateWindow::Over),
            ),
            (
                "a gone claim without entry that ran in the background is cleaned up",
                base().build(),
                Facts {
                    in_progress: true,
                    ..facts(None, true, false, false)
                },
                Plan::CleanUp(LateWindow::Open),
            ),
            (
                "a gone claim without entry and nothing in progress needs nothing",
                base().build(),
                facts(None, true, false, false),
                Plan::Wait,
            ),
        ];
        for (name, claim, facts, want) in cases {
            assert_eq!(plan(&claim, facts), want, "case: {name}");
        }
    }
}
