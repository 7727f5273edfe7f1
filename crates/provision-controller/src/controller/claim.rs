//! A claim's sync (Go `syncClaimHandler` + `syncClaim`): the claim is read once
//! ([`ClaimView`]), then the crash-safety step (`crash_safety`), or the normal flow
//! (`provision`: the driver, the PV object, its saving), and last what the claim's
//! record must keep (`records`).
//!
//! A claim's way starts here (the claim worker calls [`sync_claim`] with the claim's
//! provisioning in progress, as its record holds it when the sync starts).

use std::sync::Arc;

use super::{
    Context,
    calls::{OpError, Outcome},
    crash_safety::{self, Presence},
    provision,
    records::{InProgress, Progress},
};
use crate::annotations::ClaimView;

/// Processes the claim with this UID; `entry` is its provisioning that may run in the
/// background, as the claim's record holds it when the sync starts. The outcome says
/// whether the claim is done or waits; an error requeues it with backoff.
pub(crate) async fn sync_claim(
    ctx: &Context,
    uid: &str,
    entry: Option<InProgress>,
) -> Result<Outcome, OpError> {
    let Some((claim, presence)) = find_claim(ctx, uid, entry.as_ref()) else {
        tracing::debug!(claim_uid = uid, "claim in work queue no longer exists");
        return Ok(Outcome::Done);
    };
    let progress = Progress::of(entry.as_ref());
    let step = |class, guard| provision::provision(ctx, uid, &claim, progress, class, guard);
    let (state, class, result) =
        crash_safety::guarded(ctx, &claim, entry.as_ref(), presence, step).await;
    ctx.records.remember(uid, state, &claim.claim, class);
    result
}

/// The claim with this UID, read once: the cached one, else the copy kept while its
/// provisioning runs in the background (`entry`), else the one its journal entry
/// describes. With crash-safe provisioning such a copy means the claim is
/// [`Presence::Gone`]: its asset, if any, is cleaned up.
fn find_claim(
    ctx: &Context,
    uid: &str,
    entry: Option<&InProgress>,
) -> Option<(ClaimView, Presence)> {
    let (claim, presence) = match (ctx.caches.claim_by_uid(uid), entry) {
        (Some(claim), _) => (claim, Presence::Live),
        (None, Some(entry)) => {
            let presence = if ctx.config.crash_safe_provisioning {
                Presence::Gone
            } else {
                Presence::Live
            };
            (Arc::clone(&entry.claim), presence)
        }
        (None, None) => (
            Arc::new(crash_safety::entry(ctx, uid)?.claim(uid)),
            Presence::Gone,
        ),
    };
    Some((ClaimView::new(claim), presence))
}
