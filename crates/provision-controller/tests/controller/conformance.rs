//! The driver conformance suite (`testing::conformance`): a driver that keeps the contract
//! passes every clause, and a driver broken in one way fails exactly the clause it breaks,
//! with a message that names it.

use std::{
    collections::BTreeMap,
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use provision_controller::{
    AssetLookup, DeleteError, ProvisionError, ProvisionOptions, Provisioner,
    testing::{
        FakeProvisioner, class,
        conformance::{Clause, Conformance, Outcome, Report},
        volume_for,
    },
};

use super::ME;

/// The one way a [`Toy`] breaks the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Break {
    None,
    /// Returns a PV without `spec.capacity`.
    NoCapacity,
    /// Returns a PV without a reclaim policy (the server would make it Retain).
    NoReclaimPolicy,
    /// Creates a new asset at every call.
    NewAssetEachCall,
    /// Fails to delete an asset that is gone.
    DeleteMissingFails,
    /// A lookup creates the asset.
    CleanupCreates,
    /// Answers a final error (`Infeasible`) after creating the asset.
    ErrorLeavesAsset,
    /// Declares block support, gives a Block claim a Filesystem volume.
    BlockIgnored,
}

/// A driver whose assets are numbered, named by PV name; classes with the parameter
/// `refuse` are refused (`Infeasible`).
struct Toy {
    assets: Mutex<BTreeMap<String, u32>>,
    next: AtomicU32,
    broken: Break,
}

impl Toy {
    fn new(broken: Break) -> Self {
        Self {
            assets: Mutex::default(),
            next: AtomicU32::new(1),
            broken,
        }
    }

    fn volume(&self, options: &ProvisionOptions, id: u32) -> PersistentVolume {
        let mut volume = volume_for(options);
        let spec = volume.spec.get_or_insert_with(Default::default);
        if let Some(source) = spec.host_path.as_mut() {
            source.path = format!("/toy/{}/{id}", options.pv_name);
        }
        match self.broken {
            Break::NoCapacity => spec.capacity = None,
            Break::NoReclaimPolicy => spec.persistent_volume_reclaim_policy = None,
            Break::BlockIgnored => spec.volume_mode = None,
            _ => {}
        }
        volume
    }
}

#[async_trait]
impl Provisioner for Toy {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        let mut assets = self.assets.lock().unwrap();
        let existing = assets.get(&options.pv_name).copied();
        let refused = options
            .storage_class
            .parameters
            .as_ref()
            .is_some_and(|p| p.contains_key("refuse"));
        let id = match existing {
            Some(id) if self.broken != Break::NewAssetEachCall => id,
            _ => self.next.fetch_add(1, Ordering::Relaxed),
        };
        if refused {
            if self.broken == Break::ErrorLeavesAsset {
                assets.insert(options.pv_name.clone(), id);
            }
            return Err(ProvisionError::infeasible("the class asks to refuse"));
        }
        assets.insert(options.pv_name.clone(), id);
        Ok(self.volume(options, id))
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        let removed = self.assets.lock().unwrap().remove(&name);
        if removed.is_none() && self.broken == Break::DeleteMissingFails {
            return Err(DeleteError::Failed(format!("no asset {name}").into()));
        }
        Ok(())
    }

    fn supports_block(&self) -> bool {
        true
    }
}

#[async_trait]
impl AssetLookup for Toy {
    async fn find(
        &self,
        options: &ProvisionOptions,
    ) -> Result<Option<PersistentVolume>, ProvisionError> {
        if self.broken == Break::CleanupCreates {
            return self.provision(options).await.map(Some);
        }
        let existing = self.assets.lock().unwrap().get(&options.pv_name).copied();
        Ok(existing.map(|id| self.volume(options, id)))
    }
}

fn suite() -> Conformance {
    Conformance::new(ME)
        .refused_class(
            class("refused")
                .provisioner(ME)
                .parameter("refuse", "yes")
                .build(),
        )
        .retries(3, Duration::from_millis(10))
}

async fn check(broken: Break) -> Report {
    let toy = Toy::new(broken);
    suite().check_with_lookup(&toy, &toy).await
}

/// Asserts that `report` fails `clause` and only it, and that its text names the clause
/// and contains `detail`.
fn fails_only(report: &Report, clause: Clause, detail: &str) {
    let failed: Vec<Clause> = report.failures().map(|c| c.clause).collect();
    assert_eq!(failed, [clause], "{report}");
    let Some(Outcome::Failed(what)) = report.outcome(clause) else {
        unreachable!("checked above");
    };
    assert!(what.contains(detail), "{clause}: {what}");
    let text = report.to_string();
    assert!(text.contains(&format!("FAILED  {clause}: ")), "{text}");
}

#[tokio::test]
async fn a_driver_that_keeps_the_contract_passes_every_clause() {
    let report = check(Break::None).await;
    report.assert_conforms();
    for clause in Clause::ALL {
        assert_eq!(report.outcome(clause), Some(&Outcome::Passed), "{report}");
    }
}

#[tokio::test]
async fn the_fake_provisioner_conforms() {
    let fake = FakeProvisioner::new();
    let report = Conformance::new(ME).check_with_lookup(&fake, &fake).await;
    report.assert_conforms();
    // Without a refused class and with no retryable answer, the error clause is skipped.
    assert!(matches!(
        report.outcome(Clause::ErrorsTellTheTruth),
        Some(Outcome::Skipped(_))
    ));
}

#[tokio::test]
async fn a_volume_without_capacity_breaks_valid_volume() {
    let report = check(Break::NoCapacity).await;
    fails_only(
        &report,
        Clause::ValidVolume,
        "spec.capacity[storage]: missing",
    );
}

#[tokio::test]
async fn a_volume_without_reclaim_policy_breaks_valid_volume() {
    let report = check(Break::NoReclaimPolicy).await;
    fails_only(
        &report,
        Clause::ValidVolume,
        "spec.persistentVolumeReclaimPolicy: missing",
    );
}

#[tokio::test]
async fn a_new_asset_per_call_breaks_idempotence() {
    let report = check(Break::NewAssetEachCall).await;
    let failed: Vec<Clause> = report.failures().map(|c| c.clause).collect();
    // The second call's asset is not the first one's; the lookup then finds the second.
    assert!(failed.contains(&Clause::Idempotent), "{report}");
    let Some(Outcome::Failed(what)) = report.outcome(Clause::Idempotent) else {
        unreachable!("checked above");
    };
    assert!(what.contains("returned another asset"), "{what}");
    assert!(
        report.to_string().contains(
            "FAILED  idempotent (provisioning the same claim twice gives the same asset)"
        )
    );
}

#[tokio::test]
async fn failing_to_delete_a_missing_asset_breaks_delete_missing() {
    let report = check(Break::DeleteMissingFails).await;
    fails_only(
        &report,
        Clause::DeleteMissing,
        "deleting an asset that is gone",
    );
}

#[tokio::test]
async fn a_lookup_that_creates_breaks_cleanup_creates_nothing() {
    let report = check(Break::CleanupCreates).await;
    // Every later lookup creates too, so the clauses that look assets up fail as well.
    assert!(report.failed(Clause::CleanupCreatesNothing), "{report}");
    let Some(Outcome::Failed(what)) = report.outcome(Clause::CleanupCreatesNothing) else {
        unreachable!("checked above");
    };
    assert!(
        what.contains("never provisioned, returned a volume"),
        "{what}"
    );
    assert!(
        report
            .to_string()
            .contains("FAILED  cleanup-creates-nothing (a cleanup lookup creates nothing)"),
        "{report}"
    );
}

#[tokio::test]
async fn a_final_error_that_leaves_an_asset_breaks_errors_tell_the_truth() {
    let report = check(Break::ErrorLeavesAsset).await;
    fails_only(
        &report,
        Clause::ErrorsTellTheTruth,
        "a final error: no asset may exist",
    );
}

#[tokio::test]
async fn a_retryable_answer_that_never_ends_breaks_errors_tell_the_truth() {
    use provision_controller::testing::ProvisionStep;
    let stuck = FakeProvisioner::new().script_provision(vec![ProvisionStep::InBackground; 10]);
    let report = Conformance::new(ME)
        .retries(3, Duration::from_millis(10))
        .check(&stuck)
        .await;
    assert!(report.failed(Clause::ErrorsTellTheTruth), "{report}");
    assert!(report.failed(Clause::ValidVolume), "{report}");
}

#[tokio::test]
async fn a_block_claim_given_a_filesystem_volume_breaks_block_as_declared() {
    let report = check(Break::BlockIgnored).await;
    fails_only(&report, Clause::BlockAsDeclared, "volumeMode unset");
}

#[tokio::test]
async fn a_driver_without_a_lookup_skips_only_the_clauses_that_need_one() {
    let report = suite().check(&Toy::new(Break::None)).await;
    for check in &report.checks {
        match check.clause {
            Clause::CleanupCreatesNothing | Clause::ErrorsTellTheTruth => assert!(
                matches!(&check.outcome, Outcome::Skipped(why) if why.contains("AssetLookup")),
                "{check:?}"
            ),
            _ => assert_eq!(check.outcome, Outcome::Passed, "{check:?}"),
        }
    }
}
