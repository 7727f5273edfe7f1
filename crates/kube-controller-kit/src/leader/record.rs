//! Pure decisions on a Lease record: is it free, whose is it, what do we write.
//!
//! Expiry is judged the way client-go judges it: not by the remote `renewTime` (other
//! machines' clocks are not trusted) but by how long ago *this* process last saw the
//! record change, measured on the local monotonic clock ([`tokio::time::Instant`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::Instant;

/// The last version of the record this process has seen, and when it first saw it.
#[derive(Debug, Default)]
pub(crate) struct Observation {
    seen: Option<(LeaseSpec, Instant)>,
}

impl Observation {
    /// Records `spec` as seen at `now`; returns the local instant at which this exact
    /// record was first seen (`now` when it changed since the last call).
    pub(crate) fn observe(&mut self, spec: &LeaseSpec, now: Instant) -> Instant {
        match &self.seen {
            Some((prev, at)) if prev == spec => *at,
            _ => {
                self.seen = Some((spec.clone(), now));
                now
            }
        }
    }

    /// Forgets what was seen (the lease was deleted).
    pub(crate) fn clear(&mut self) {
        self.seen = None;
    }
}

/// Whether we try to take the lease or to keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A candidate: take the lease when it is free or expired.
    Acquire,
    /// The leader: renew only while `holderIdentity` is still us.
    Renew,
}

/// What to do with the record that was read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Write this spec (optimistically, with the resourceVersion that was read).
    Write {
        /// The new record.
        spec: LeaseSpec,
        /// Whether this write takes the lease over from someone else (or from nobody).
        takes_over: bool,
    },
    /// Another holder has a valid lease; try again in `remaining` at the earliest.
    HeldByOther {
        /// The current holder.
        holder: String,
        /// Time left before the lease expires by our observation.
        remaining: Duration,
    },
    /// We were renewing but the record names someone else (or nobody): leadership is gone.
    NotOurs {
        /// The holder the record names, if any.
        holder: Option<String>,
    },
}

/// Everything [`decide`] needs to know about the local side.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Local<'a> {
    pub(crate) identity: &'a str,
    pub(crate) mode: Mode,
    /// When the current record was first seen locally (from [`Observation::observe`]).
    pub(crate) observed_at: Instant,
    pub(crate) now: Instant,
    /// Wall-clock time written into `acquireTime`/`renewTime` (informational only).
    pub(crate) now_wall: jiff::Timestamp,
    /// Our `leaseDurationSeconds`.
    pub(crate) lease_duration_seconds: i32,
    /// Used when the record carries no (or a non-positive) `leaseDurationSeconds`.
    pub(crate) fallback_duration: Duration,
}

/// The holder named by a record, treating an empty string as nobody.
pub(crate) fn holder_of(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The validity the record itself declares, or `fallback` when it declares none.
pub(crate) fn declared_duration(spec: &LeaseSpec, fallback: Duration) -> Duration {
    match spec.lease_duration_seconds {
        Some(secs) if secs > 0 => Duration::from_secs(u64::from(secs.unsigned_abs())),
        _ => fallback,
    }
}

/// Decides what to do with `current` (client-go's `tryAcquireOrRenew`, minus the I/O).
pub(crate) fn decide(current: &LeaseSpec, local: Local<'_>) -> Decision {
    let holder = holder_of(current);
    let ours = holder == Some(local.identity);
    if local.mode == Mode::Renew && !ours {
        return Decision::NotOurs {
            holder: holder.map(str::to_owned),
        };
    }
    if let Some(other) = holder.filter(|_| !ours) {
        let expires_at = local.observed_at + declared_duration(current, local.fallback_duration);
        if local.now < expires_at {
            return Decision::HeldByOther {
                holder: other.to_owned(),
                remaining: expires_at - local.now,
            };
        }
    }
    let now = Some(MicroTime(local.now_wall));
    let spec = if ours {
        LeaseSpec {
            holder_identity: Some(local.identity.to_owned()),
            lease_duration_seconds: Some(local.lease_duration_seconds),
            renew_time: now,
            ..current.clone()
        }
    } else {
        LeaseSpec {
            holder_identity: Some(local.identity.to_owned()),
            lease_duration_seconds: Some(local.lease_duration_seconds),
            acquire_time: now.clone(),
            renew_time: now,
            lease_transitions: Some(current.lease_transitions.unwrap_or(0).saturating_add(1)),
            ..current.clone()
        }
    };
    Decision::Write {
        spec,
        takes_over: !ours,
    }
}

/// The record for a Lease that does not exist yet: ours, with no transitions.
pub(crate) fn initial(
    identity: &str,
    lease_duration_seconds: i32,
    now_wall: jiff::Timestamp,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(lease_duration_seconds),
        acquire_time: Some(MicroTime(now_wall)),
        renew_time: Some(MicroTime(now_wall)),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    }
}

/// The record written on release (client-go's `ReleaseOnCancel`): no holder and a one
/// second lease, so any candidate takes over at its next attempt; transitions are kept.
pub(crate) fn released(current: &LeaseSpec, now_wall: jiff::Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now_wall)),
        renew_time: Some(MicroTime(now_wall)),
        lease_transitions: current.lease_transitions,
        ..current.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";

    fn spec(holder: Option<&str>, secs: Option<i32>, transitions: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: secs,
            lease_transitions: transitions,
            acquire_time: Some(MicroTime(jiff::Timestamp::UNIX_EPOCH)),
            renew_time: Some(MicroTime(jiff::Timestamp::UNIX_EPOCH)),
            ..LeaseSpec::default()
        }
    }

    fn local(mode: Mode, observed_at: Instant, now: Instant) -> Local<'static> {
        Local {
            identity: ME,
            mode,
            observed_at,
            now,
            now_wall: jiff::Timestamp::from_second(1_000).unwrap(),
            lease_duration_seconds: 15,
            fallback_duration: Duration::from_secs(15),
        }
    }

    #[test]
    fn candidate_waits_while_another_holder_is_within_its_declared_duration() {
        let t0 = Instant::now();
        let d = decide(
            &spec(Some("other"), Some(5), Some(3)),
            local(Mode::Acquire, t0, t0 + Duration::from_secs(4)),
        );
        assert_eq!(
            d,
            Decision::HeldByOther {
                holder: "other".into(),
                remaining: Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn candidate_takes_an_expired_lease_and_counts_a_transition() {
        let t0 = Instant::now();
        let d = decide(
            &spec(Some("other"), Some(5), Some(3)),
            local(Mode::Acquire, t0, t0 + Duration::from_secs(5)),
        );
        let Decision::Write { spec, takes_over } = d else {
            panic!("expected a write, got {d:?}");
        };
        assert!(takes_over);
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, spec.renew_time);
        assert_ne!(
            spec.acquire_time,
            Some(MicroTime(jiff::Timestamp::UNIX_EPOCH))
        );
    }

    #[test]
    fn candidate_uses_configured_duration_when_record_declares_none() {
        let t0 = Instant::now();
        let d = decide(
            &spec(Some("other"), None, None),
            local(Mode::Acquire, t0, t0 + Duration::from_secs(14)),
        );
        assert!(matches!(d, Decision::HeldByOther { .. }), "{d:?}");
    }

    #[test]
    fn candidate_takes_a_released_lease_at_once() {
        let t0 = Instant::now();
        let released = released(
            &spec(Some("other"), Some(15), Some(2)),
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.lease_duration_seconds, Some(1));
        assert_eq!(released.lease_transitions, Some(2));
        let Decision::Write { spec, takes_over } = decide(&released, local(Mode::Acquire, t0, t0))
        else {
            panic!("expected a write");
        };
        assert!(takes_over);
        assert_eq!(spec.lease_transitions, Some(3));
    }

    #[test]
    fn empty_holder_string_counts_as_nobody() {
        let t0 = Instant::now();
        let d = decide(
            &spec(Some(""), Some(15), Some(0)),
            local(Mode::Acquire, t0, t0),
        );
        assert!(
            matches!(
                d,
                Decision::Write {
                    takes_over: true,
                    ..
                }
            ),
            "{d:?}"
        );
    }

    #[test]
    fn leader_renewal_keeps_acquire_time_and_transitions() {
        let t0 = Instant::now();
        let current = spec(Some(ME), Some(15), Some(7));
        let Decision::Write { spec, takes_over } = decide(&current, local(Mode::Renew, t0, t0))
        else {
            panic!("expected a write");
        };
        assert!(!takes_over);
        assert_eq!(spec.lease_transitions, Some(7));
        assert_eq!(spec.acquire_time, current.acquire_time);
        assert_ne!(spec.renew_time, current.renew_time);
    }

    #[test]
    fn leader_that_finds_another_holder_has_lost_even_if_that_lease_looks_expired() {
        let t0 = Instant::now();
        let d = decide(
            &spec(Some("other"), Some(1), Some(1)),
            local(Mode::Renew, t0, t0 + Duration::from_secs(60)),
        );
        assert_eq!(
            d,
            Decision::NotOurs {
                holder: Some("other".into())
            }
        );
        let d = decide(&spec(None, Some(1), Some(1)), local(Mode::Renew, t0, t0));
        assert_eq!(d, Decision::NotOurs { holder: None });
    }

    #[test]
    fn observation_time_moves_only_when_the_record_changes() {
        let t0 = Instant::now();
        let mut obs = Observation::default();
        let a = spec(Some("other"), Some(15), Some(1));
        assert_eq!(obs.observe(&a, t0), t0);
        assert_eq!(obs.observe(&a, t0 + Duration::from_secs(3)), t0);
        let mut b = a.clone();
        b.renew_time = Some(MicroTime(jiff::Timestamp::from_second(5).unwrap()));
        let t1 = t0 + Duration::from_secs(4);
        assert_eq!(obs.observe(&b, t1), t1);
        obs.clear();
        let t2 = t0 + Duration::from_secs(9);
        assert_eq!(obs.observe(&b, t2), t2);
    }

    #[test]
    fn initial_record_names_us_with_no_transitions() {
        let s = initial(ME, 2, jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(s.holder_identity.as_deref(), Some(ME));
        assert_eq!(s.lease_transitions, Some(0));
        assert_eq!(s.lease_duration_seconds, Some(2));
    }
}
