//! The driver conformance suite: one call that checks the contract the controller relies
//! on (see [`Provisioner`]'s "Assumptions") against a real driver and its backend, as
//! csi-sanity does for CSI drivers.
//!
//! ```
//! use provision_controller::testing::{FakeProvisioner, conformance::Conformance};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let report = Conformance::new("example.com/fake").check(&FakeProvisioner::new()).await;
//! report.assert_conforms(); // panics naming each clause the driver broke
//! # }
//! ```
//!
//! Each [`Clause`] is checked with claims of its own (uids `conformance-…`, so PV names
//! `pvc-conformance-…`); every asset the suite made is deleted again at the end. A driver
//! that needs class parameters (a datastore, a pool) is given them with
//! [`Conformance::class`]; [`Conformance::refused_class`] names a class the driver must
//! refuse, to check what its errors say. A driver that offers an [`AssetLookup`] is
//! checked with [`Conformance::check_with_lookup`], which also checks the lookup.

use std::{
    collections::BTreeMap,
    fmt,
    panic::AssertUnwindSafe,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::FutureExt as _;
use k8s_openapi::api::{
    core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use kube_client::{Api, api::PostParams};
use kube_controller_kit::{error::chain, quantity::Quantity};

use crate::{
    AssetLookup, DeleteError, ProvisionError, ProvisionOptions, Provisioner,
    controller::{same_source, volume_source},
    testing::{class, pvc},
};

/// Why the clauses that need a cleanup lookup are skipped without one.
const NO_LOOKUP: &str =
    "the driver offers no AssetLookup (Conformance::check_with_lookup checks one)";
const NO_LOOKUP_HINT: &str = "an AssetLookup (Conformance::check_with_lookup)";

/// One clause of the driver's contract (the "Assumptions" of [`Provisioner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Clause {
    /// A returned PV is valid for the API server: named `pv_name`, a positive capacity at
    /// least the request, the claim's access modes, the class's reclaim policy (`Delete`
    /// when it names none), exactly one volume source; the server accepts it.
    ValidVolume,
    /// Provisioning the same claim (the same `pv_name`) twice gives the same asset.
    Idempotent,
    /// `delete` removes the asset, and deleting an asset that is already gone succeeds.
    DeleteMissing,
    /// A cleanup lookup ([`AssetLookup::find`]) creates nothing: it answers `None` (or a
    /// final error) when no asset exists, and finds the one that does. Skipped for a
    /// driver without a lookup.
    CleanupCreatesNothing,
    /// Errors classify as documented: a final answer (`Failed`, `Infeasible`,
    /// `Reschedule`, `Ignored`) leaves no asset; a retryable one (`InBackground`,
    /// `NoChange`) ends, when asked again, in a volume or a final answer.
    ErrorsTellTheTruth,
    /// Block support as declared by [`Provisioner::supports_block`]: a `Block` claim gets
    /// a `Block` PV when supported, a `Filesystem` claim never gets one.
    BlockAsDeclared,
}

impl Clause {
    /// Every clause, in the order the suite checks them.
    pub const ALL: [Self; 6] = [
        Self::ValidVolume,
        Self::Idempotent,
        Self::DeleteMissing,
        Self::CleanupCreatesNothing,
        Self::ErrorsTellTheTruth,
        Self::BlockAsDeclared,
    ];

    /// A short name, e.g. `idempotent`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::ValidVolume => "valid-volume",
            Self::Idempotent => "idempotent",
            Self::DeleteMissing => "delete-missing",
            Self::CleanupCreatesNothing => "cleanup-creates-nothing",
            Self::ErrorsTellTheTruth => "errors-tell-the-truth",
            Self::BlockAsDeclared => "block-as-declared",
        }
    }

    /// The clause as the contract states it.
    #[must_use]
    pub fn text(self) -> &'static str {
        match self {
            Self::ValidVolume => "a returned PV is valid for the API server",
            Self::Idempotent => "provisioning the same claim twice gives the same asset",
            Self::DeleteMissing => {
                "delete removes the asset, and deleting an asset that is gone succeeds"
            }
            Self::CleanupCreatesNothing => "a cleanup lookup creates nothing",
            Self::ErrorsTellTheTruth => {
                "a final error leaves no asset; a retryable one ends in a volume or a final error"
            }
            Self::BlockAsDeclared => "block volumes as supports_block() declares",
        }
    }
}

impl fmt::Display for Clause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.text())
    }
}

/// How one clause fared.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The driver kept the clause.
    Passed,
    /// The driver broke it; what it did.
    Failed(String),
    /// Not checked; why (e.g. no [`Conformance::refused_class`]).
    Skipped(String),
}

/// One clause and its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The clause.
    pub clause: Clause,
    /// How it fared.
    pub outcome: Outcome,
}

/// What [`Conformance::check`] found: one [`Check`] per [`Clause`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The checks, in [`Clause::ALL`] order.
    pub checks: Vec<Check>,
}

impl Report {
    /// The checks the driver failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    /// Whether no check failed (skipped ones do not count).
    #[must_use]
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The outcome of `clause`.
    #[must_use]
    pub fn outcome(&self, clause: Clause) -> Option<&Outcome> {
        self.checks
            .iter()
            .find(|c| c.clause == clause)
            .map(|c| &c.outcome)
    }

    /// Whether `clause` failed.
    #[must_use]
    pub fn failed(&self, clause: Clause) -> bool {
        matches!(self.outcome(clause), Some(Outcome::Failed(_)))
    }

    /// Panics, listing every broken clause and what the driver did, unless all passed.
    ///
    /// # Panics
    /// When a check failed.
    #[track_caller]
    pub fn assert_conforms(&self) {
        assert!(
            self.passed(),
            "the driver breaks the provisioner contract:\n{self}"
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            match &check.outcome {
                Outcome::Passed => writeln!(f, "  ok      {}", check.clause)?,
                Outcome::Failed(what) => writeln!(f, "  FAILED  {}: {what}", check.clause)?,
                Outcome::Skipped(why) => writeln!(f, "  skipped {}: {why}", check.clause)?,
            }
        }
        Ok(())
    }
}

/// The suite's settings; [`check`](Self::check) runs it against a driver.
#[derive(Clone, Debug)]
#[must_use]
pub struct Conformance {
    class: StorageClass,
    refused: Option<StorageClass>,
    claim: PersistentVolumeClaim,
    call_limit: Duration,
    attempts: u32,
    pause: Duration,
}

impl Conformance {
    /// The suite for a driver running as `provisioner_name`: claims of 1Gi,
    /// `ReadWriteOnce`, of a class named `conformance` (reclaim policy `Delete`, no
    /// parameters); each driver call may take 60 s; a retryable answer is asked again up
    /// to 60 times, 500 ms apart.
    pub fn new(provisioner_name: &str) -> Self {
        Self {
            class: class("conformance")
                .provisioner(provisioner_name)
                .reclaim_policy("Delete")
                .build(),
            refused: None,
            claim: pvc("conformance").build(),
            call_limit: Duration::from_secs(60),
            attempts: 60,
            pause: Duration::from_millis(500),
        }
    }

    /// The class the claims are provisioned with (its parameters, reclaim policy).
    pub fn class(mut self, class: StorageClass) -> Self {
        self.class = class;
        self
    }

    /// The claim each check provisions (its size and access modes; the suite sets its
    /// uid, and `volumeMode: Block` for the block check).
    pub fn claim(mut self, claim: PersistentVolumeClaim) -> Self {
        self.claim = claim;
        self
    }

    /// A class the driver must refuse (an unknown parameter, a pool that does not exist):
    /// [`Clause::ErrorsTellTheTruth`] provisions with it and checks that a final error
    /// leaves no asset. Without one that check is only made on retryable answers.
    pub fn refused_class(mut self, class: StorageClass) -> Self {
        self.refused = Some(class);
        self
    }

    /// The limit of each driver call (60 s).
    pub fn call_limit(mut self, limit: Duration) -> Self {
        self.call_limit = limit;
        self
    }

    /// How many times, and how far apart, a retryable answer is asked again (60, 500 ms).
    pub fn retries(mut self, attempts: u32, pause: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.pause = pause;
        self
    }

    /// Runs every check against `provisioner`; never panics (a driver's panic fails the
    /// check it happened in). Deletes the assets it made.
    pub async fn check(&self, provisioner: &(impl Provisioner + ?Sized)) -> Report {
        self.run(provisioner, None).await
    }

    /// Runs every check against `provisioner` and its `lookup` (often the same value):
    /// [`check`](Self::check), and the lookup finds what exists and creates nothing.
    pub async fn check_with_lookup(
        &self,
        provisioner: &(impl Provisioner + ?Sized),
        lookup: &impl AssetLookup,
    ) -> Report {
        self.run(provisioner, Some(lookup)).await
    }

    async fn run(
        &self,
        provisioner: &(impl Provisioner + ?Sized),
        lookup: Option<&dyn AssetLookup>,
    ) -> Report {
        let mut run = Run {
            suite: self,
            driver: provisioner,
            lookup,
            tag: unique_tag(),
            made: Vec::new(),
            background_failure: None,
        };
        let checks = run.all().await;
        run.clean_up().await;
        Report { checks }
    }
}

/// A run of the suite against one driver.
struct Run<'a, P: ?Sized> {
    suite: &'a Conformance,
    driver: &'a P,
    /// The driver's cleanup lookup, when it offers one.
    lookup: Option<&'a dyn AssetLookup>,
    tag: String,
    /// Volumes the driver returned, deleted at the end.
    made: Vec<PersistentVolume>,
    /// A retryable answer that never ended (for [`Clause::ErrorsTellTheTruth`]).
    background_failure: Option<String>,
}

type Answer = Result<PersistentVolume, String>;

/// How a call to `provision` ended.
enum Provisioned {
    Volume(Box<PersistentVolume>),
    /// A final error (no asset may exist).
    Final(String),
    /// `Ignored`: a final error; for a cleanup lookup, "no asset".
    Ignored(String),
    /// A retryable error.
    Retryable(String),
    /// It panicked or timed out.
    Broken(String),
}

impl<P: Provisioner + ?Sized> Run<'_, P> {
    async fn all(&mut self) -> Vec<Check> {
        let mut outcomes = BTreeMap::new();
        let first_options = self.options("a", &self.suite.class, false);
        let first = self.provision_until_done(&first_options).await;
        if let Ok(volume) = &first {
            self.made.push(volume.clone());
        }
        outcomes.insert(
            Clause::ValidVolume,
            match &first {
                Ok(volume) => self.valid_volume(&first_options, volume).await,
                Err(what) => Outcome::Failed(format!("provisioning a claim failed: {what}")),
            },
        );
        let blocked = |what: &str| Outcome::Skipped(format!("needs a provisioned volume ({what})"));
        match &first {
            Ok(volume) => {
                outcomes.insert(
                    Clause::Idempotent,
                    self.idempotent(&first_options, volume).await,
                );
                let cleanup = if self.lookup.is_some() {
                    self.cleanup_creates_nothing(&first_options, volume).await
                } else {
                    Outcome::Skipped(NO_LOOKUP.into())
                };
                outcomes.insert(Clause::CleanupCreatesNothing, cleanup);
                outcomes.insert(
                    Clause::DeleteMissing,
                    self.delete_missing(&first_options, volume).await,
                );
                outcomes.insert(Clause::BlockAsDeclared, self.block(volume).await);
            }
            Err(what) => {
                for clause in [
                    Clause::Idempotent,
                    Clause::CleanupCreatesNothing,
                    Clause::DeleteMissing,
                    Clause::BlockAsDeclared,
                ] {
                    outcomes.insert(clause, blocked(what));
                }
            }
        }
        outcomes.insert(Clause::ErrorsTellTheTruth, self.errors().await);
        Clause::ALL
            .into_iter()
            .map(|clause| Check {
                clause,
                outcome: outcomes
                    .remove(&clause)
                    .unwrap_or_else(|| Outcome::Skipped("not run".into())),
            })
            .collect()
    }

    /// Options for a claim of its own (`pvc-conformance-<tag>-<which>`).
    fn options(&self, which: &str, class: &StorageClass, block: bool) -> ProvisionOptions {
        let mut claim = self.suite.claim.clone();
        let uid = format!("conformance-{}-{which}", self.tag);
        claim.metadata.uid = Some(uid.clone());
        claim.metadata.name = Some(format!("conformance-{which}"));
        let spec = claim.spec.get_or_insert_with(Default::default);
        spec.storage_class_name.clone_from(&class.metadata.name);
        if block {
            spec.volume_mode = Some("Block".into());
        }
        ProvisionOptions::new(
            Arc::new(class.clone()),
            format!("pvc-{uid}"),
            Arc::new(claim),
            None,
        )
    }

    /// One `provision` call, bounded, with panics caught.
    async fn provision_once(&self, options: &ProvisionOptions) -> Provisioned {
        let call = AssertUnwindSafe(self.driver.provision(options)).catch_unwind();
        match tokio::time::timeout(self.suite.call_limit, call).await {
            Err(_) => Provisioned::Broken(format!(
                "provision {} did not return within {:?}",
                options.pv_name, self.suite.call_limit
            )),
            Ok(Err(_)) => Provisioned::Broken(format!("provision {} panicked", options.pv_name)),
            Ok(Ok(Ok(volume))) => Provisioned::Volume(Box::new(volume)),
            Ok(Ok(Err(
                error @ (ProvisionError::InBackground(_) | ProvisionError::NoChange(_)),
            ))) => Provisioned::Retryable(chain(&error)),
            Ok(Ok(Err(error @ ProvisionError::Ignored { .. }))) => {
                Provisioned::Ignored(describe(&error))
            }
            Ok(Ok(Err(error))) => Provisioned::Final(describe(&error)),
        }
    }

    /// `provision` asked again while it answers a retryable error, as the controller does.
    async fn provision_until_done(&mut self, options: &ProvisionOptions) -> Answer {
        let mut last = String::new();
        for attempt in 0..self.suite.attempts {
            if attempt > 0 {
                tokio::time::sleep(self.suite.pause).await;
            }
            match self.provision_once(options).await {
                Provisioned::Volume(volume) => return Ok(*volume),
                Provisioned::Final(what)
                | Provisioned::Ignored(what)
                | Provisioned::Broken(what) => return Err(what),
                Provisioned::Retryable(what) => last = what,
            }
        }
        let what = format!(
            "provision {} still answered a retryable error after {} attempts: {last}",
            options.pv_name, self.suite.attempts
        );
        self.background_failure.get_or_insert(what.clone());
        Err(what)
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), String> {
        let name = volume.metadata.name.as_deref().unwrap_or_default();
        let call = AssertUnwindSafe(self.driver.delete(volume)).catch_unwind();
        match tokio::time::timeout(self.suite.call_limit, call).await {
            Err(_) => Err(format!(
                "delete {name} did not return within {:?}",
                self.suite.call_limit
            )),
            Ok(Err(_)) => Err(format!("delete {name} panicked")),
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(error @ DeleteError::Ignored { .. }))) => Err(format!(
                "delete {name} answered Ignored for a volume the driver provisioned: {}",
                chain(&error)
            )),
            Ok(Ok(Err(error))) => Err(format!("delete {name} failed: {}", chain(&error))),
        }
    }

    /// A cleanup lookup ([`AssetLookup::find`]), bounded and with panics caught: `Ok(None)`
    /// also when the driver answers a final error (no asset), as the controller reads it.
    /// Callers check that the driver offers a lookup.
    async fn look_up(
        &self,
        options: &ProvisionOptions,
    ) -> Result<Option<PersistentVolume>, String> {
        let Some(lookup) = self.lookup else {
            return Err(NO_LOOKUP.into());
        };
        let name = &options.pv_name;
        let call = AssertUnwindSafe(lookup.find(options)).catch_unwind();
        match tokio::time::timeout(self.suite.call_limit, call).await {
            Err(_) => Err(format!(
                "a cleanup lookup of {name} did not return within {:?}",
                self.suite.call_limit
            )),
            Ok(Err(_)) => Err(format!("a cleanup lookup of {name} panicked")),
            Ok(Ok(Ok(found))) => Ok(found),
            Ok(Ok(Err(
                error @ (ProvisionError::InBackground(_) | ProvisionError::NoChange(_)),
            ))) => Err(format!(
                "a cleanup lookup of {name} answered {}, not a volume or a final answer",
                chain(&error)
            )),
            Ok(Ok(Err(_))) => Ok(None),
        }
    }

    async fn valid_volume(&self, options: &ProvisionOptions, volume: &PersistentVolume) -> Outcome {
        let mut problems = invalid_fields(options, volume);
        if problems.is_empty()
            && let Err(refused) = server_accepts(options, volume).await
        {
            problems.push(refused);
        }
        if problems.is_empty() {
            Outcome::Passed
        } else {
            Outcome::Failed(problems.join("; "))
        }
    }

    async fn idempotent(
        &mut self,
        options: &ProvisionOptions,
        first: &PersistentVolume,
    ) -> Outcome {
        match self.provision_until_done(options).await {
            Err(what) => Outcome::Failed(format!(
                "provisioning {} a second time failed: {what}",
                options.pv_name
            )),
            Ok(second) if same_source(first, &second) => Outcome::Passed,
            Ok(second) => {
                self.made.push(second.clone());
                Outcome::Failed(format!(
                    "provisioning {} a second time returned another asset: {} then {}",
                    options.pv_name,
                    source_of(first),
                    source_of(&second)
                ))
            }
        }
    }

    async fn cleanup_creates_nothing(
        &mut self,
        existing: &ProvisionOptions,
        volume: &PersistentVolume,
    ) -> Outcome {
        let never = self.options("never", &self.suite.class.clone(), false);
        match self.look_up(&never).await {
            Err(what) => return Outcome::Failed(what),
            Ok(Some(found)) => {
                self.made.push(found.clone());
                return Outcome::Failed(format!(
                    "a cleanup lookup of {}, never provisioned, returned a volume ({}): it created an asset",
                    never.pv_name,
                    source_of(&found)
                ));
            }
            Ok(None) => {}
        }
        // A driver that creates the asset and still answers Ignored is caught by a
        // second lookup, which finds what the first one made.
        match self.look_up(&never).await {
            Ok(None) => {}
            Ok(Some(found)) => {
                self.made.push(found.clone());
                return Outcome::Failed(format!(
                    "after a cleanup lookup of {}, never provisioned, a second lookup found an asset ({}): the first one created it",
                    never.pv_name,
                    source_of(&found)
                ));
            }
            Err(what) => return Outcome::Failed(what),
        }
        match self.look_up(existing).await {
            Ok(Some(found)) if same_source(volume, &found) => Outcome::Passed,
            Ok(Some(found)) => {
                self.made.push(found.clone());
                Outcome::Failed(format!(
                    "a cleanup lookup of {} returned another asset ({}) than the one provisioned ({})",
                    existing.pv_name,
                    source_of(&found),
                    source_of(volume)
                ))
            }
            Ok(None) => Outcome::Failed(format!(
                "a cleanup lookup of {} answered that no asset exists, but it does ({})",
                existing.pv_name,
                source_of(volume)
            )),
            Err(what) => Outcome::Failed(what),
        }
    }

    async fn delete_missing(
        &mut self,
        options: &ProvisionOptions,
        volume: &PersistentVolume,
    ) -> Outcome {
        let mut deleted = volume.clone();
        if deleted.metadata.name.is_none() {
            deleted.metadata.name = Some(options.pv_name.clone());
        }
        if let Err(what) = self.delete(&deleted).await {
            return Outcome::Failed(what);
        }
        if self.lookup.is_some() {
            match self.look_up(options).await {
                Ok(None) => {}
                Ok(Some(found)) => {
                    return Outcome::Failed(format!(
                        "after delete {} succeeded, a cleanup lookup still found its asset ({})",
                        options.pv_name,
                        source_of(&found)
                    ));
                }
                Err(what) => return Outcome::Failed(what),
            }
        }
        match self.delete(&deleted).await {
            Ok(()) => Outcome::Passed,
            Err(what) => Outcome::Failed(format!("deleting an asset that is gone: {what}")),
        }
    }

    async fn block(&mut self, filesystem: &PersistentVolume) -> Outcome {
        let mode = |v: &PersistentVolume| v.spec.as_ref().and_then(|s| s.volume_mode.clone());
        if mode(filesystem).as_deref() == Some("Block") {
            return Outcome::Failed("a Filesystem claim got a volume with volumeMode Block".into());
        }
        if !self.driver.supports_block() {
            return Outcome::Passed;
        }
        let options = self.options("block", &self.suite.class.clone(), true);
        match self.provision_until_done(&options).await {
            Err(what) => Outcome::Failed(format!(
                "supports_block() is true, but provisioning a Block claim failed: {what}"
            )),
            Ok(volume) => {
                self.made.push(volume.clone());
                match mode(&volume) {
                    Some(m) if m == "Block" => Outcome::Passed,
                    other => Outcome::Failed(format!(
                        "supports_block() is true, but a Block claim got a volume with volumeMode {}",
                        other.unwrap_or_else(|| "unset (Filesystem)".into())
                    )),
                }
            }
        }
    }

    async fn errors(&mut self) -> Outcome {
        let background = self.background_failure.clone();
        if let Some(what) = background {
            return Outcome::Failed(what);
        }
        let Some(refused) = self.suite.refused.clone() else {
            return Outcome::Skipped(
                "no retryable answer seen and no refused class given (Conformance::refused_class)"
                    .into(),
            );
        };
        let options = self.options("refused", &refused, false);
        let answer = loop_answer(self, &options).await;
        let final_error = match answer {
            Err(failure) => return Outcome::Failed(failure),
            Ok(Ok(volume)) => {
                self.made.push(volume);
                return Outcome::Failed(format!(
                    "the refused class {:?} was provisioned",
                    refused.metadata.name.unwrap_or_default()
                ));
            }
            Ok(Err(final_error)) => final_error,
        };
        if self.lookup.is_none() {
            return Outcome::Skipped(format!(
                "the refused class got a final answer ({final_error}); whether it left an asset needs {NO_LOOKUP_HINT}"
            ));
        }
        match self.look_up(&options).await {
            Ok(None) => Outcome::Passed,
            Ok(Some(found)) => {
                self.made.push(found.clone());
                Outcome::Failed(format!(
                    "provision {} answered {final_error} (a final error: no asset may exist), but a cleanup lookup found one ({})",
                    options.pv_name,
                    source_of(&found)
                ))
            }
            Err(what) => Outcome::Failed(what),
        }
    }

    /// Deletes every asset the suite made (best effort).
    async fn clean_up(&mut self) {
        for volume in std::mem::take(&mut self.made) {
            let _ = self.delete(&volume).await;
        }
    }
}

/// Provisions with `options` until a volume or a final error: `Ok(Ok(volume))`,
/// `Ok(Err(final error))`, or `Err(why the clause failed)`.
async fn loop_answer<P: Provisioner + ?Sized>(
    run: &mut Run<'_, P>,
    options: &ProvisionOptions,
) -> Result<Answer, String> {
    for attempt in 0..run.suite.attempts {
        if attempt > 0 {
            tokio::time::sleep(run.suite.pause).await;
        }
        match run.provision_once(options).await {
            Provisioned::Volume(volume) => return Ok(Ok(*volume)),
            Provisioned::Final(what) | Provisioned::Ignored(what) => return Ok(Err(what)),
            Provisioned::Broken(what) => return Err(what),
            Provisioned::Retryable(_) => {}
        }
    }
    Err(format!(
        "provision {} still answered a retryable error after {} attempts",
        options.pv_name, run.suite.attempts
    ))
}

/// A final error as `Variant: message`.
fn describe(error: &ProvisionError) -> String {
    let variant = match error {
        ProvisionError::Failed(_) => "Failed",
        ProvisionError::Infeasible(_) => "Infeasible",
        ProvisionError::Reschedule(_) => "Reschedule",
        ProvisionError::Ignored { .. } => "Ignored",
        ProvisionError::InBackground(_) => "InBackground",
        ProvisionError::NoChange(_) => "NoChange",
    };
    format!("{variant}: {}", chain(error))
}

/// A tag that makes this run's PV names its own (a backend may keep earlier runs' assets).
fn unique_tag() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}", nanos & 0xffff_ffff_ffff)
}

/// The asset a PV names, for messages: its volume source as JSON.
fn source_of(volume: &PersistentVolume) -> String {
    let spec = serde_json::to_value(volume_source(volume)).unwrap_or_default();
    let sources: Vec<String> = spec
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| kube_sim::PV_SOURCES.contains(&key.as_str()))
        .map(|(key, value)| format!("{key} {value}"))
        .collect();
    if sources.is_empty() {
        "no volume source".into()
    } else {
        sources.join(", ")
    }
}

/// What a PV lacks for the API server, each naming the field.
fn invalid_fields(options: &ProvisionOptions, volume: &PersistentVolume) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(name) = &volume.metadata.name
        && *name != options.pv_name
    {
        problems.push(format!(
            "metadata.name is {name:?}, not the pv_name {:?}",
            options.pv_name
        ));
    }
    let Some(spec) = &volume.spec else {
        problems.push("spec: missing".into());
        return problems;
    };
    let requested = options
        .claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| Quantity::parse(&q.0).ok());
    match spec.capacity.as_ref().and_then(|c| c.get("storage")) {
        None => problems.push("spec.capacity[storage]: missing".into()),
        Some(q) => match Quantity::parse(&q.0) {
            Err(error) => problems.push(format!("spec.capacity[storage]: {error}")),
            Ok(capacity) if !capacity.is_positive() => {
                problems.push(format!("spec.capacity[storage] is {:?}, not positive", q.0));
            }
            Ok(capacity) if requested.is_some_and(|r| capacity.as_nanos() < r.as_nanos()) => {
                problems.push(format!(
                    "spec.capacity[storage] is {:?}, less than the claim's request",
                    q.0
                ));
            }
            Ok(_) => {}
        },
    }
    let modes = spec.access_modes.clone().unwrap_or_default();
    if modes.is_empty() {
        problems.push("spec.accessModes: missing".into());
    } else {
        let asked = options
            .claim
            .spec
            .as_ref()
            .and_then(|s| s.access_modes.clone())
            .unwrap_or_default();
        for mode in asked.iter().filter(|m| !modes.contains(m)) {
            problems.push(format!(
                "spec.accessModes {modes:?} lacks the claim's {mode:?}"
            ));
        }
    }
    let wanted = options
        .storage_class
        .reclaim_policy
        .clone()
        .unwrap_or_else(|| "Delete".into());
    match &spec.persistent_volume_reclaim_policy {
        None => problems.push(format!(
            "spec.persistentVolumeReclaimPolicy: missing (the server makes it Retain; the class says {wanted})"
        )),
        Some(policy) if *policy != wanted => problems.push(format!(
            "spec.persistentVolumeReclaimPolicy is {policy}, the class says {wanted}"
        )),
        Some(_) => {}
    }
    let sources = serde_json::to_value(spec).unwrap_or_default();
    let count = sources
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, value)| kube_sim::PV_SOURCES.contains(&key.as_str()) && !value.is_null())
        .count();
    match count {
        0 => problems.push("spec: no volume source (hostPath, csi, nfs, ...)".into()),
        1 => {}
        n => problems.push(format!("spec: {n} volume sources, at most 1 is allowed")),
    }
    problems
}

/// Saves the PV, as the controller would (claimRef, class), on a fresh kube-sim, which
/// validates as the API server does.
async fn server_accepts(
    options: &ProvisionOptions,
    volume: &PersistentVolume,
) -> Result<(), String> {
    let sim = kube_sim::KubeSim::start()
        .await
        .map_err(|e| format!("cannot start kube-sim to check the volume: {}", chain(&e)))?;
    let mut saved = volume.clone();
    saved.metadata.name = Some(options.pv_name.clone());
    saved.metadata.resource_version = None;
    let spec = saved.spec.get_or_insert_with(Default::default);
    spec.claim_ref = Some(ObjectReference {
        kind: Some("PersistentVolumeClaim".into()),
        api_version: Some("v1".into()),
        namespace: options.claim.metadata.namespace.clone(),
        name: options.claim.metadata.name.clone(),
        uid: options.claim.metadata.uid.clone(),
        ..ObjectReference::default()
    });
    spec.storage_class_name
        .clone_from(&options.storage_class.metadata.name);
    let volumes: Api<PersistentVolume> = Api::all(sim.client());
    let result = volumes.create(&PostParams::default(), &saved).await;
    sim.shutdown().await;
    match result {
        Ok(_) => Ok(()),
        Err(kube_client::Error::Api(status)) => {
            Err(format!("the API server refuses it: {}", status.message))
        }
        Err(error) => Err(format!("saving it on kube-sim failed: {}", chain(&error))),
    }
}
