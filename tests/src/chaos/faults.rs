//! API fault rules from the schedule's data.

use kube_sim::FaultRule;

use super::schedule::{ApiFault, ApiFaultKind, Reach};

/// The kube-sim rule for `fault`.
#[must_use]
pub fn rule(fault: &ApiFault) -> FaultRule {
    let mut rule = FaultRule::new(fault.verb, fault.resource)
        .message("injected by the chaos schedule")
        .seed(fault.seed);
    if let Some(sub) = fault.subresource {
        rule = rule.subresource(sub);
    }
    rule = match fault.reach {
        Reach::Times(n) => rule.times(n),
        Reach::Lasting { duration, percent } => rule
            .always()
            .lasting(duration)
            .probability(f64::from(percent) / 100.0),
    };
    match &fault.kind {
        ApiFaultKind::Status { code, reason } => rule.status(*code, *reason),
        ApiFaultKind::Throttled { retry_after_secs } => rule
            .status(429, "TooManyRequests")
            .retry_after(std::time::Duration::from_secs(*retry_after_secs)),
        ApiFaultKind::Timeout {
            latency,
            served: true,
        } => rule.latency(*latency).no_status(),
        ApiFaultKind::Timeout {
            latency,
            served: false,
        } => rule.latency(*latency).status(504, "Timeout"),
        ApiFaultKind::Slow { latency } => rule.latency(*latency).no_status(),
    }
}
