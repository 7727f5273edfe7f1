//! `serve --timings`: where a claim's time goes, from the controller's own spans. A
//! tracing layer records how long each span of interest lived (created to closed) and
//! the queue waits the work queue reports, and prints percentiles per stage at the end.
//!
//! Stages (spans of provision-controller and kube-controller-kit, debug level):
//! `queue_wait/<queue>` (a key's wait in a work queue), `sync_claim` (one claim's sync),
//! `journal_put` (a claim's wait for its journal intent to be durable), `journal_write`
//! (one group write of the journal), `driver_provision` (a driver call, with its wait for
//! a driver slot), `create_pv` (the PV create, with its slot wait), and
//! `slot_wait/<method> <resource>` (a request's wait for a slot of the bound on requests
//! in flight).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{Arc, Mutex},
};

use tokio::time::Instant;

use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
    span::{Attributes, Id},
};
use tracing_subscriber::{Layer, layer::Context, registry::LookupSpan};

/// The spans whose lifetimes are recorded.
const STAGES: [&str; 7] = [
    "sync_claim",
    "provision_claim",
    "journal_put",
    "journal_write",
    "driver_provision",
    "create_pv",
    "slot_wait",
];

/// Durations by stage, in microseconds.
#[derive(Clone, Default)]
pub(crate) struct Timings {
    stages: Arc<Mutex<BTreeMap<String, Vec<u64>>>>,
}

struct Started {
    at: Instant,
    label: String,
}

/// Appends `/<value>` of a `what` or `queue` field to a label; reads `waited_us`.
struct Fields<'a> {
    label: &'a mut String,
    waited_us: Option<u64>,
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if matches!(field.name(), "what" | "queue") {
            let _ = write!(self.label, "/{value:?}");
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if matches!(field.name(), "what" | "queue") {
            let _ = write!(self.label, "/{value}");
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "waited_us" {
            self.waited_us = Some(value);
        }
    }
}

impl Timings {
    fn push(&self, label: String, micros: u64) {
        let mut stages = self
            .stages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        stages.entry(label).or_default().push(micros);
    }

    /// One line per stage: count, mean, p50, p90, p99, max (ms) and the total (s).
    pub(crate) fn report(&self) -> String {
        let stages = self
            .stages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = format!(
            "{:<44} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
            "stage", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "total_s"
        );
        for (label, values) in stages.iter() {
            let mut v = values.clone();
            v.sort_unstable();
            let at = |q: f64| {
                let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
                v[i] as f64 / 1000.0
            };
            let total: u64 = v.iter().sum();
            let _ = writeln!(
                out,
                "{label:<44} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                v.len(),
                total as f64 / v.len() as f64 / 1000.0,
                at(0.5),
                at(0.9),
                at(0.99),
                at(1.0),
                total as f64 / 1e6
            );
        }
        out
    }
}

impl<S> Layer<S> for Timings
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        if !STAGES.contains(&name) {
            return;
        }
        let mut label = name.to_owned();
        attrs.record(&mut Fields {
            label: &mut label,
            waited_us: None,
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Started {
                at: Instant::now(),
                label,
            });
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let extensions = span.extensions();
        if let Some(started) = extensions.get::<Started>() {
            let micros = u64::try_from(started.at.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.push(started.label.clone(), micros);
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().name() != "queue_wait" && !event.metadata().target().ends_with("queue")
        {
            return;
        }
        let mut label = "queue_wait".to_owned();
        let mut fields = Fields {
            label: &mut label,
            waited_us: None,
        };
        event.record(&mut fields);
        if let Some(micros) = fields.waited_us {
            self.push(label, micros);
        }
    }
}
