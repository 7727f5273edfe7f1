//! The reconciler against kube-sim: `run` end to end through the builder, and `reconcile`
//! and `error_policy` called directly, one step at a time.

#![allow(unreachable_pub)]

mod deletion;
mod reconciler;
mod run;
mod stale_cache;
mod support;
mod unanswered;
