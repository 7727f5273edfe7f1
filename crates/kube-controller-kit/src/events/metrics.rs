//! The events writer's metrics: events dropped (and why), writes, and occurrences folded
//! into an existing series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Why an event was not written.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
#[non_exhaustive]
pub enum DropReason {
    /// The queue stayed full for the whole bounded wait
    /// ([`EventWriterBuilder::full_queue_wait`](super::EventWriterBuilder::full_queue_wait)).
    QueueFull,
    /// The object's token bucket was empty
    /// ([`EventWriterBuilder::spam_filter`](super::EventWriterBuilder::spam_filter)).
    SpamFilter,
    /// The API server refused the write, or did not answer within the write timeout.
    WriteFailed,
    /// The writer task had stopped.
    WriterStopped,
}

impl DropReason {
    /// The `reason` label: `queue_full`, `spam_filter`, `write_failed`, `writer_stopped`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::SpamFilter => "spam_filter",
            Self::WriteFailed => "write_failed",
            Self::WriterStopped => "writer_stopped",
        }
    }
}

/// The `operation` label of a new Event object.
const CREATE: &str = "create";
/// The `operation` label of a series patch of an existing Event object.
const PATCH: &str = "patch";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    operation: &'static str,
}

/// The metrics of an [`EventWriter`](super::EventWriter); cheap to clone, clones count
/// into the same metrics.
///
/// Nothing is registered until [`register`](Self::register) is called:
///
/// | name | type | labels | meaning |
/// |---|---|---|---|
/// | `events_dropped_total` | counter | `reason`: `queue_full`, `spam_filter`, `write_failed`, `writer_stopped` | event occurrences never written |
/// | `events_writes_total` | counter | `operation`: `create`, `patch` | API writes made (successful or not) |
/// | `events_aggregated_total` | counter | | occurrences folded into an existing Event's series instead of a new object |
///
/// Register on a sub-registry (`Registry::sub_registry_with_prefix`) to prefix the names.
///
/// # Example
/// ```
/// use prometheus_client::registry::Registry;
/// use kube_controller_kit::events::{DropReason, EventMetrics};
///
/// let mut registry = Registry::default();
/// let metrics = EventMetrics::default();
/// metrics.register(&mut registry);
/// assert_eq!(metrics.dropped(DropReason::QueueFull), 0);
///
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry)?;
/// assert!(text.contains("# TYPE events_dropped counter"));
/// # Ok::<(), std::fmt::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct EventMetrics {
    dropped: Family<DropLabels, Counter>,
    writes: Family<WriteLabels, Counter>,
    aggregated: Counter,
}

impl EventMetrics {
    /// Registers the metrics on `registry`. Call it once per registry: the names are
    /// fixed, so a second call would encode every metric twice.
    pub fn register(&self, registry: &mut Registry) {
        // Counters are registered without `_total`: the encoder appends it.
        registry.register(
            "events_dropped",
            "Event occurrences never written, by reason",
            self.dropped.clone(),
        );
        registry.register(
            "events_writes",
            "Event writes sent to the API server, by operation",
            self.writes.clone(),
        );
        registry.register(
            "events_aggregated",
            "Event occurrences folded into the series of an existing Event",
            self.aggregated.clone(),
        );
    }

    /// Event occurrences dropped so far for `reason`.
    #[must_use]
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped
            .get_or_create(&DropLabels {
                reason: reason.as_str(),
            })
            .get()
    }

    /// Occurrences folded into an existing series so far.
    #[must_use]
    pub fn aggregated(&self) -> u64 {
        self.aggregated.get()
    }

    /// Creates sent so far.
    #[must_use]
    pub fn creates(&self) -> u64 {
        self.writes
            .get_or_create(&WriteLabels { operation: CREATE })
            .get()
    }

    /// Series patches sent so far.
    #[must_use]
    pub fn patches(&self) -> u64 {
        self.writes
            .get_or_create(&WriteLabels { operation: PATCH })
            .get()
    }

    pub(super) fn drop_events(&self, reason: DropReason, occurrences: u64) {
        if occurrences > 0 {
            self.dropped
                .get_or_create(&DropLabels {
                    reason: reason.as_str(),
                })
                .inc_by(occurrences);
        }
    }

    pub(super) fn created(&self) {
        self.writes
            .get_or_create(&WriteLabels { operation: CREATE })
            .inc();
    }

    pub(super) fn patched(&self) {
        self.writes
            .get_or_create(&WriteLabels { operation: PATCH })
            .inc();
    }

    pub(super) fn folded(&self) {
        self.aggregated.inc();
    }
}
