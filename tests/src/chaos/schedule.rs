//! The seeded schedule: every action of one run, generated up front as a pure function of
//! `(seed, claims)`.
//!
//! Claim actions form one chain per claim (creation, then what happens to it: deletion
//! before, during or after provisioning, stripped finalizers, a static PV that binds it,
//! a duplicate volume, a reclaim policy switched to Retain, `CnsVolumeMetadata` objects
//! created, edited and deleted). Global actions hit the whole system: API and CNS faults,
//! watch cuts and 410 relists, replica deaths, graceful stops, partitions, and the user
//! deleting nodes and classes.

use std::fmt;
use std::time::Duration;

use kube_sim::Verb;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::names;

/// How long a run's chaos lasts for `claims` claims (claims are created in the first 70 %).
#[must_use]
pub fn span_for(claims: usize) -> Duration {
    let per_claim = u64::try_from(claims)
        .unwrap_or(u64::MAX)
        .saturating_mul(100);
    Duration::from_millis(per_claim.max(8_000))
}

/// Every action of one run, ordered by time.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// The seed it was generated from.
    pub seed: u64,
    /// How many claims it creates.
    pub claims: usize,
    /// When the last global action may happen.
    pub span: Duration,
    /// Whether the provision controller puts its finalizer on PVs (`add_finalizer`).
    pub pv_finalizer: bool,
    /// Whether the replicas elect a leader (the default); without, both work at once, as
    /// a failover or a partitioned old leader can make them overlap.
    pub leader_election: bool,
    /// The actions, ordered by `at` (stable for equal times).
    pub steps: Vec<Step>,
}

/// One action at one time.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Time from the start of the run.
    pub at: Duration,
    /// Whose chain it belongs to.
    pub target: Target,
    /// What to do.
    pub action: Action,
}

/// The chain a step belongs to: claim steps run in order, one claim after another's
/// steps may overlap; global steps run on the schedule's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// The whole system.
    Global,
    /// Claim number `n` (and its `CnsVolumeMetadata` objects).
    Claim(usize),
}

/// What a user does to a claim's objects, or what goes wrong in the system.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Creates the claim.
    CreateClaim {
        /// The StorageClass.
        class: &'static str,
        /// The storage request (`4Ei` is more than CNS can give).
        size: &'static str,
        /// `volume.kubernetes.io/selected-node`, for WaitForFirstConsumer claims.
        node: Option<&'static str>,
    },
    /// Deletes the claim.
    DeleteClaim {
        /// Before, during or after provisioning, as planned (faults may shift it).
        when: &'static str,
    },
    /// Removes the claim's `kubernetes.io/pvc-protection` finalizer, as a user unsticking a
    /// claim does (the controllers put no finalizer of their own on claims).
    StripFinalizers,
    /// Switches the reclaim policy of the claim's PV to Retain.
    RetainVolume,
    /// Inserts a CNS volume of another name and a PV pre-bound to the claim (Retain) that
    /// the binder binds it to.
    BindStatic,
    /// Inserts a CNS volume named like the claim's volume (`pvc-<uid>`).
    DuplicateVolume,
    /// Creates a `CnsVolumeMetadata` object about the claim's volume.
    CreateMetadata {
        /// The object's name.
        object: String,
        /// The guest entity it describes.
        entity: Entity,
        /// Whether its spec passes validation.
        valid: bool,
    },
    /// Edits the object's spec: new labels and reference (valid) or a broken rule.
    EditMetadata {
        /// The object's name.
        object: String,
        /// Whether the new spec passes validation.
        valid: bool,
        /// Distinguishes successive edits.
        revision: u32,
    },
    /// Deletes the object.
    DeleteMetadata {
        /// The object's name.
        object: String,
    },
    /// Adds an API fault rule.
    ApiFault(ApiFault),
    /// Ends every open watch.
    CutWatches,
    /// Drops the watch history: resuming watches get 410 and relist.
    Compact,
    /// Makes the next call of a CNS method fail.
    CnsFault {
        /// The SOAP method.
        method: &'static str,
        /// Where the fault shows up.
        site: CnsSite,
        /// The fault class.
        fault: &'static str,
    },
    /// Delays every call of a CNS method (zero removes the delay).
    CnsDelay {
        /// The SOAP method.
        method: &'static str,
        /// The delay.
        delay: Duration,
    },
    /// Forgets every CNS session.
    ExpireSessions,
    /// Kills a replica: its runtime is dropped mid-call, nothing is cleaned up.
    Kill {
        /// 0 or 1.
        replica: usize,
    },
    /// Stops a replica gracefully.
    Stop {
        /// 0 or 1.
        replica: usize,
    },
    /// Starts a replica that is down.
    Start {
        /// 0 or 1.
        replica: usize,
    },
    /// Cuts a replica off from the API server (its CNS calls still go through).
    Partition {
        /// 0 or 1.
        replica: usize,
        /// Refused connections, or requests that hang until they time out.
        hang: bool,
    },
    /// Ends a replica's partition.
    Heal {
        /// 0 or 1.
        replica: usize,
    },
    /// Deletes a node (WaitForFirstConsumer claims may have selected it).
    DeleteNode {
        /// The node.
        node: &'static str,
    },
    /// Creates a node again.
    CreateNode {
        /// The node.
        node: &'static str,
    },
    /// Deletes a StorageClass.
    DeleteClass {
        /// The class.
        class: &'static str,
    },
    /// Creates a StorageClass again, with our provisioner or another one.
    CreateClass {
        /// The class.
        class: &'static str,
        /// Whether the class names our provisioner.
        ours: bool,
    },
}

/// The guest entity a `CnsVolumeMetadata` object describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entity {
    /// A guest PVC referring to a guest PV.
    Claim,
    /// A guest PV referring to the supervisor claim.
    Volume,
    /// A guest pod referring to a guest PVC.
    Pod,
}

/// Where an injected CNS fault shows up (`SimFault` constructors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CnsSite {
    /// A SOAP fault on the call.
    Call,
    /// A task ending in error.
    Task,
    /// A task that carries out the change, then ends in error.
    TaskAfterChange,
    /// A successful task whose volume result carries the fault.
    VolumeResult,
}

/// One API fault rule, as data (see `faults::rule`).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiFault {
    /// The verb.
    pub verb: Verb,
    /// The resource plural.
    pub resource: &'static str,
    /// The subresource, if any.
    pub subresource: Option<&'static str>,
    /// What the matching requests get.
    pub kind: ApiFaultKind,
    /// How many times or for how long it fires.
    pub reach: Reach,
    /// Seeds the rule's probability draws.
    pub seed: u64,
}

/// What a faulted request gets.
#[derive(Clone, Debug, PartialEq)]
pub enum ApiFaultKind {
    /// An error status (500, 409 Conflict, 410 Expired).
    Status {
        /// The HTTP code.
        code: u16,
        /// The `Status` reason.
        reason: &'static str,
    },
    /// `429 TooManyRequests` with `Retry-After`.
    Throttled {
        /// Seconds of `Retry-After`.
        retry_after_secs: u64,
    },
    /// Latency beyond the controllers' call timeouts; the request is then served (the
    /// client has given up, the server carried it out) or fails with 504.
    Timeout {
        /// How long the answer takes.
        latency: Duration,
        /// Whether the server carries the request out.
        served: bool,
    },
    /// Added latency, then served.
    Slow {
        /// How long the answer takes.
        latency: Duration,
    },
}

/// How long a fault rule lives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reach {
    /// The next `n` matching requests.
    Times(u32),
    /// Every matching request for a while, each with a probability.
    Lasting {
        /// How long.
        duration: Duration,
        /// Percent of the matching requests that fail.
        percent: u8,
    },
}

/// The verbs and resources the controllers (and the PV binder) use.
const API_TARGETS: &[(Verb, &str, Option<&str>)] = &[
    (Verb::Get, "persistentvolumeclaims", None),
    (Verb::List, "persistentvolumeclaims", None),
    (Verb::Watch, "persistentvolumeclaims", None),
    (Verb::Update, "persistentvolumeclaims", None),
    (Verb::Patch, "persistentvolumeclaims", None),
    (Verb::Patch, "persistentvolumeclaims", Some("status")),
    (Verb::Get, "persistentvolumes", None),
    (Verb::List, "persistentvolumes", None),
    (Verb::Watch, "persistentvolumes", None),
    (Verb::Create, "persistentvolumes", None),
    (Verb::Delete, "persistentvolumes", None),
    (Verb::Patch, "persistentvolumes", None),
    (Verb::Patch, "persistentvolumes", Some("status")),
    (Verb::List, "storageclasses", None),
    (Verb::Watch, "storageclasses", None),
    (Verb::Get, "nodes", None),
    (Verb::Create, "events", None),
    (Verb::Patch, "events", None),
    (Verb::Get, "leases", None),
    (Verb::Create, "leases", None),
    (Verb::Update, "leases", None),
    (Verb::List, "cnsvolumemetadatas", None),
    (Verb::Watch, "cnsvolumemetadatas", None),
    (Verb::Update, "cnsvolumemetadatas", None),
];

/// The CNS methods the controllers call.
const CNS_METHODS: &[&str] = &[
    "CnsCreateVolume",
    "CnsDeleteVolume",
    "CnsUpdateVolumeMetadata",
    "CnsQueryVolume",
];

/// Storage requests; the last one is more than CNS can give.
const SIZES: &[&str] = &["1Gi", "1500Mi", "2G", "512Mi"];
/// A storage request more than CNS can give: the driver refuses such claims.
pub const BAD_SIZE: &str = "4Ei";

/// A time in `[from, to]` milliseconds.
fn ms(rng: &mut StdRng, from: u64, to: u64) -> Duration {
    Duration::from_millis(rng.random_range(from..=to.max(from)))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Schedule {
    /// The schedule of seed `seed` with `claims` claims. Same inputs, same schedule.
    #[must_use]
    pub fn generate(seed: u64, claims: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let span = span_for(claims);
        let pv_finalizer = rng.random_bool(0.5);
        let mut steps = Vec::new();
        for claim in 0..claims {
            claim_chain(&mut rng, span, claim, &mut steps);
        }
        global_steps(&mut rng, span, &mut steps);
        let leader_election = rng.random_bool(0.8);
        // Stable: a chain's steps keep their order at equal times.
        steps.sort_by_key(|s| s.at);
        Self {
            seed,
            claims,
            span,
            pv_finalizer,
            leader_election,
            steps,
        }
    }

    /// The steps of one claim's chain, in order.
    pub fn chain(&self, claim: usize) -> impl Iterator<Item = &Step> {
        self.steps
            .iter()
            .filter(move |s| s.target == Target::Claim(claim))
    }

    /// The global steps, in order.
    pub fn global(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.target == Target::Global)
    }
}

fn push(steps: &mut Vec<Step>, at: Duration, target: Target, action: Action) {
    steps.push(Step { at, target, action });
}

/// One claim's life.
fn claim_chain(rng: &mut StdRng, span: Duration, claim: usize, steps: &mut Vec<Step>) {
    let target = Target::Claim(claim);
    let created = ms(rng, 300, millis(span) * 7 / 10);
    let class = *[
        (names::CLASS_IMMEDIATE, 50),
        (names::CLASS_WFFC, 22),
        (names::CLASS_VOLATILE, 12),
        (names::CLASS_RETAIN, 10),
        (names::CLASS_BAD_PARAMETER, 3),
        (names::CLASS_MISSING, 3),
    ]
    .choose_weighted(rng, |c| c.1)
    .expect("weights are positive");
    let class = class.0;
    let size = if rng.random_bool(0.03) {
        BAD_SIZE
    } else {
        SIZES.choose(rng).copied().expect("sizes are listed")
    };
    let node = (class == names::CLASS_WFFC).then(|| *names::NODES.choose(rng).expect("nodes"));
    push(
        steps,
        created,
        target,
        Action::CreateClaim { class, size, node },
    );

    let fate = rng.random_range(0..100);
    let mut deleted = match fate {
        0..12 => Some((created + ms(rng, 0, 30), "before provisioning")),
        12..26 => Some((created + ms(rng, 40, 400), "during provisioning")),
        26..46 => Some((created + ms(rng, 800, 4_000), "after provisioning")),
        _ => None,
    };
    if rng.random_bool(0.08) {
        push(steps, created + ms(rng, 0, 250), target, Action::BindStatic);
    }
    if rng.random_bool(0.08) {
        push(
            steps,
            created + ms(rng, 0, 400),
            target,
            Action::DuplicateVolume,
        );
    }
    if rng.random_bool(0.12) {
        let at = created + ms(rng, 500, 2_000);
        push(steps, at, target, Action::RetainVolume);
        if let Some((when, what)) = &mut deleted
            && *what == "after provisioning"
            && *when < at + Duration::from_millis(150)
        {
            *when = at + ms(rng, 150, 1_000);
        }
    }
    match deleted {
        Some((at, when)) => {
            push(steps, at, target, Action::DeleteClaim { when });
            if rng.random_bool(0.25) {
                push(steps, at + ms(rng, 5, 300), target, Action::StripFinalizers);
            }
        }
        None if rng.random_bool(0.04) => {
            push(
                steps,
                created + ms(rng, 10, 300),
                target,
                Action::StripFinalizers,
            );
        }
        None => {}
    }
    if rng.random_bool(0.35) {
        let object = format!("meta-{claim:03}");
        let entity = *[Entity::Claim, Entity::Claim, Entity::Volume, Entity::Pod]
            .choose(rng)
            .expect("entities are listed");
        let mut at = created + ms(rng, 700, 2_500);
        push(
            steps,
            at,
            target,
            Action::CreateMetadata {
                object: object.clone(),
                entity,
                valid: rng.random_bool(0.92),
            },
        );
        for revision in 1..=2 {
            if rng.random_bool(0.4) {
                at += ms(rng, 300, 1_500);
                let valid = rng.random_bool(0.75);
                push(
                    steps,
                    at,
                    target,
                    Action::EditMetadata {
                        object: object.clone(),
                        valid,
                        revision,
                    },
                );
            }
        }
        if rng.random_bool(0.35) {
            at += ms(rng, 300, 2_000);
            push(steps, at, target, Action::DeleteMetadata { object });
        }
    }
}

/// Faults, replica events and cluster-wide user actions.
fn global_steps(rng: &mut StdRng, span: Duration, steps: &mut Vec<Step>) {
    let span_ms = millis(span);
    let seconds = span_ms / 1_000;
    let g = Target::Global;
    let at = |rng: &mut StdRng| ms(rng, 0, span_ms);

    for _ in 0..seconds * 3 {
        let fault = api_fault(rng);
        push(steps, at(rng), g, Action::ApiFault(fault));
    }
    for _ in 0..seconds.div_ceil(3) {
        push(steps, at(rng), g, Action::CutWatches);
    }
    for _ in 0..seconds.div_ceil(3) {
        push(steps, at(rng), g, Action::Compact);
    }
    for _ in 0..seconds * 3 / 2 {
        let method = *CNS_METHODS.choose(rng).expect("methods are listed");
        let site = *[
            CnsSite::Call,
            CnsSite::Task,
            CnsSite::TaskAfterChange,
            CnsSite::VolumeResult,
        ]
        .choose(rng)
        .expect("sites are listed");
        let fault = if rng.random_bool(0.15) {
            "NotAuthenticated"
        } else {
            "CnsFault"
        };
        push(
            steps,
            at(rng),
            g,
            Action::CnsFault {
                method,
                site,
                fault,
            },
        );
    }
    for _ in 0..seconds.div_ceil(4) {
        push(steps, at(rng), g, Action::ExpireSessions);
    }
    // Slow CNS windows: creates (and sometimes deletes and updates) slower than the
    // client's timeout, so the volume appears after the caller gave up.
    for method in CNS_METHODS {
        let windows = match *method {
            "CnsCreateVolume" => rng.random_range(1..=2),
            "CnsQueryVolume" => 0,
            _ => rng.random_range(0..=1),
        };
        for _ in 0..windows {
            let start = at(rng);
            push(
                steps,
                start,
                g,
                Action::CnsDelay {
                    method,
                    delay: ms(rng, 1_600, 3_000),
                },
            );
            push(
                steps,
                start + ms(rng, 300, 1_500),
                g,
                Action::CnsDelay {
                    method,
                    delay: Duration::ZERO,
                },
            );
        }
    }
    replica_steps(rng, span, steps);
    if rng.random_bool(0.4) {
        let node = *names::NODES.choose(rng).expect("nodes");
        let when = at(rng);
        push(steps, when, g, Action::DeleteNode { node });
        if rng.random_bool(0.5) {
            push(
                steps,
                when + ms(rng, 500, 3_000),
                g,
                Action::CreateNode { node },
            );
        }
    }
    if rng.random_bool(0.5) {
        let class = names::CLASS_VOLATILE;
        let when = at(rng);
        push(steps, when, g, Action::DeleteClass { class });
        if rng.random_bool(0.7) {
            push(
                steps,
                when + ms(rng, 300, 2_000),
                g,
                Action::CreateClass {
                    class,
                    ours: rng.random_bool(0.5),
                },
            );
        }
    }
}

/// Deaths, graceful stops and a partition longer than the lease, never two at once on
/// one replica.
fn replica_steps(rng: &mut StdRng, span: Duration, steps: &mut Vec<Step>) {
    let span_ms = millis(span);
    let g = Target::Global;
    let mut busy_until = [Duration::ZERO; 2];
    let mut events: Vec<u8> = vec![0, 1];
    if rng.random_bool(0.6) {
        events.push(0);
    }
    events.push(2);
    // Place the partition first: it is the longest.
    events.sort_by_key(|e| std::cmp::Reverse(*e));
    for event in events {
        let replica = rng.random_range(0..2);
        let earliest = busy_until[replica].max(Duration::from_millis(span_ms / 10));
        let latest = Duration::from_millis(span_ms * 7 / 10);
        if earliest >= latest {
            continue;
        }
        let start = ms(rng, millis(earliest), millis(latest));
        let end = match event {
            2 => {
                // Longer than the lease (2 s), so the other replica takes over.
                let end = start + ms(rng, 3_500, 5_500);
                push(
                    steps,
                    start,
                    g,
                    Action::Partition {
                        replica,
                        hang: rng.random_bool(0.5),
                    },
                );
                push(steps, end, g, Action::Heal { replica });
                end
            }
            1 => {
                let end = start + ms(rng, 300, 1_500);
                push(steps, start, g, Action::Stop { replica });
                push(steps, end, g, Action::Start { replica });
                end
            }
            _ => {
                let end = start + ms(rng, 200, 1_500);
                push(steps, start, g, Action::Kill { replica });
                push(steps, end, g, Action::Start { replica });
                end
            }
        };
        busy_until[replica] = end + Duration::from_millis(500);
    }
}

fn api_fault(rng: &mut StdRng) -> ApiFault {
    let &(verb, resource, subresource) = API_TARGETS.choose(rng).expect("targets are listed");
    let write = matches!(verb, Verb::Update | Verb::Patch);
    let roll = rng.random_range(0..100);
    let kind = match roll {
        0..30 => ApiFaultKind::Status {
            code: 500,
            reason: "InternalError",
        },
        30..45 => ApiFaultKind::Throttled {
            retry_after_secs: 1,
        },
        45..60 if write => ApiFaultKind::Status {
            code: 409,
            reason: "Conflict",
        },
        45..60 if verb == Verb::Watch => ApiFaultKind::Status {
            code: 410,
            reason: "Expired",
        },
        60..78 if verb != Verb::Watch => ApiFaultKind::Timeout {
            latency: ms(rng, 2_300, 3_000),
            served: rng.random_bool(0.6),
        },
        _ => ApiFaultKind::Slow {
            latency: ms(rng, 50, 800),
        },
    };
    let reach = if rng.random_bool(0.7) {
        Reach::Times(rng.random_range(1..=3))
    } else {
        Reach::Lasting {
            duration: ms(rng, 300, 1_500),
            percent: *[30, 60, 100].choose(rng).expect("percentages"),
        }
    };
    ApiFault {
        verb,
        resource,
        subresource,
        kind,
        reach,
        seed: rng.random(),
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CreateClaim { class, size, node } => {
                write!(f, "create claim (class {class}, {size}")?;
                if let Some(node) = node {
                    write!(f, ", selected node {node}")?;
                }
                f.write_str(")")
            }
            Self::DeleteClaim { when } => write!(f, "delete claim ({when})"),
            Self::StripFinalizers => f.write_str("strip the claim's finalizers"),
            Self::RetainVolume => f.write_str("switch the claim's PV to Retain"),
            Self::BindStatic => f.write_str("bind the claim to a static PV"),
            Self::DuplicateVolume => f.write_str("insert a CNS volume named like the claim's"),
            Self::CreateMetadata {
                object,
                entity,
                valid,
            } => write!(
                f,
                "create cnsvolumemetadata {object} ({entity:?} entity, {})",
                validity(*valid)
            ),
            Self::EditMetadata {
                object,
                valid,
                revision,
            } => write!(
                f,
                "edit cnsvolumemetadata {object} (revision {revision}, {})",
                validity(*valid)
            ),
            Self::DeleteMetadata { object } => write!(f, "delete cnsvolumemetadata {object}"),
            Self::ApiFault(fault) => write!(f, "api fault: {fault}"),
            Self::CutWatches => f.write_str("cut every watch"),
            Self::Compact => f.write_str("compact the watch history (410 relists)"),
            Self::CnsFault {
                method,
                site,
                fault,
            } => write!(f, "cns fault: next {method} fails with {fault} ({site:?})"),
            Self::CnsDelay { method, delay } if delay.is_zero() => {
                write!(f, "cns: {method} at full speed again")
            }
            Self::CnsDelay { method, delay } => write!(f, "cns: every {method} takes {delay:?}"),
            Self::ExpireSessions => f.write_str("cns: expire every session"),
            Self::Kill { replica } => write!(f, "kill replica {replica} (no cleanup)"),
            Self::Stop { replica } => write!(f, "stop replica {replica} gracefully"),
            Self::Start { replica } => write!(f, "start replica {replica}"),
            Self::Partition { replica, hang } => write!(
                f,
                "partition replica {replica} from the API server ({})",
                if *hang {
                    "requests hang"
                } else {
                    "connections refused"
                }
            ),
            Self::Heal { replica } => write!(f, "heal replica {replica}'s partition"),
            Self::DeleteNode { node } => write!(f, "delete node {node}"),
            Self::CreateNode { node } => write!(f, "create node {node}"),
            Self::DeleteClass { class } => write!(f, "delete storageclass {class}"),
            Self::CreateClass { class, ours } => write!(
                f,
                "create storageclass {class} ({} provisioner)",
                if *ours { "our" } else { "another" }
            ),
        }
    }
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

fn validity(valid: bool) -> &'static str {
    if valid { "valid" } else { "invalid" }
}

impl fmt::Display for ApiFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(sub) = self.subresource {
            write!(f, "/{sub}")?;
        }
        match &self.kind {
            ApiFaultKind::Status { code, reason } => write!(f, " -> {code} {reason}")?,
            ApiFaultKind::Throttled { retry_after_secs } => {
                write!(f, " -> 429 (Retry-After {retry_after_secs})")?;
            }
            ApiFaultKind::Timeout { latency, served } => write!(
                f,
                " -> answered after {latency:?} ({})",
                if *served { "carried out" } else { "504" }
            )?,
            ApiFaultKind::Slow { latency } => write!(f, " -> {latency:?} slower")?,
        }
        match self.reach {
            Reach::Times(n) => write!(f, ", {n} times"),
            Reach::Lasting { duration, percent } => {
                write!(f, ", {percent}% of requests for {duration:?}")
            }
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.at.as_secs_f64();
        match self.target {
            Target::Global => write!(f, "{at:>7.3}s  {:<9}  {}", "*", self.action),
            Target::Claim(n) => write!(f, "{at:>7.3}s  {:<9}  {}", names::claim(n), self.action),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "schedule of seed {} ({} claims, span {:?}, PV finalizer {}, leader election {}): \
             {} steps",
            self.seed,
            self.claims,
            self.span,
            on_off(self.pv_finalizer),
            on_off(self.leader_election),
            self.steps.len()
        )?;
        for step in &self.steps {
            writeln!(f, "  {step}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        for seed in [0, 1, 42, u64::MAX] {
            assert_eq!(Schedule::generate(seed, 30), Schedule::generate(seed, 30));
        }
    }

    #[test]
    fn other_seeds_give_other_schedules() {
        assert_ne!(Schedule::generate(1, 30), Schedule::generate(2, 30));
    }

    #[test]
    fn every_claim_is_created_first_in_its_chain() {
        let schedule = Schedule::generate(7, 50);
        for claim in 0..50 {
            let first = schedule.chain(claim).next().expect("a chain per claim");
            assert!(
                matches!(first.action, Action::CreateClaim { .. }),
                "claim {claim} starts with {}",
                first.action
            );
        }
    }

    #[test]
    fn steps_are_in_time_order_and_replicas_come_back() {
        let schedule = Schedule::generate(11, 40);
        assert!(schedule.steps.windows(2).all(|w| w[0].at <= w[1].at));
        let downs = schedule
            .global()
            .filter(|s| matches!(s.action, Action::Kill { .. } | Action::Stop { .. }))
            .count();
        let ups = schedule
            .global()
            .filter(|s| matches!(s.action, Action::Start { .. }))
            .count();
        assert_eq!(downs, ups);
    }
}
