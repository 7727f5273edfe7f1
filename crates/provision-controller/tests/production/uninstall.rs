//! `Uninstall` after the controller stopped: it reports what the journal held
//! (provisionings in flight, whose assets may exist without a PV, and settled records),
//! deletes this controller's journal objects and no other's, removes the PV finalizer from
//! this provisioner's PVs only when asked, and leaves nothing of ours on any claim.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ListParams;
use provision_controller::{
    Uninstall, UninstallReport,
    annotations::FINALIZER_PV,
    annotations::JOURNAL_LABEL,
    testing::{FakeProvisioner, ProvisionStep, pv as pv_of},
};

use super::*;

/// The prefix of every key of Go's and ours on claims and PVs (Go writes only the PV
/// finalizer under it).
const OURS: &str = "external-provisioner.volume.kubernetes.io/";

/// Long enough that the settled records of the bound claims stay in the journal for the
/// whole test.
const LATE_WINDOW: Duration = Duration::from_secs(600);

fn maps(sim: &KubeSim) -> Api<ConfigMap> {
    Api::namespaced(sim.client(), "default")
}

/// The names of the journal objects labelled for `lease`.
async fn journal_objects(sim: &KubeSim, lease: &str) -> BTreeSet<String> {
    let params = ListParams::default().labels(&format!("{JOURNAL_LABEL}={lease}"));
    maps(sim)
        .list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect()
}

/// The entries (JSON) of the journal objects labelled for `lease`.
async fn journal_entries(sim: &KubeSim, lease: &str) -> Vec<serde_json::Value> {
    let params = ListParams::default().labels(&format!("{JOURNAL_LABEL}={lease}"));
    let mut entries = Vec::new();
    for cm in maps(sim).list(&params).await.unwrap().items {
        for (key, value) in cm.data.unwrap_or_default() {
            if key.starts_with("e.") {
                entries.push(serde_json::from_str(&value).unwrap());
            }
        }
    }
    entries
}

/// Whether the PV `name` carries [`FINALIZER_PV`].
async fn has_pv_finalizer(sim: &KubeSim, name: &str) -> bool {
    let pv = volumes(sim).get(name).await.unwrap();
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER_PV)
}

/// Every finalizer and annotation under [`OURS`] on any claim of the namespace.
async fn ours_on_claims(sim: &KubeSim) -> Vec<String> {
    let mut found = Vec::new();
    for claim in claims(sim)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let finalizers = claim.metadata.finalizers.iter().flatten();
        let annotations = claim.metadata.annotations.iter().flatten().map(|(k, _)| k);
        for key in finalizers.chain(annotations) {
            if key.starts_with(OURS) {
                found.push(format!("{name}: {key}"));
            }
        }
    }
    found
}

/// The claim uid of our PV name `pvc-<uid>`.
fn uid_of(pv: &str) -> String {
    pv.strip_prefix("pvc-").unwrap().to_owned()
}

/// What a stopped controller left: the PVs of the claims it finished (`bound`, with the
/// PV finalizer and a settled journal record each) and of the claims whose driver call
/// was in flight when it stopped (`in_flight`, an intent each, no PV).
struct Left {
    bound: BTreeSet<(String, String)>,
    in_flight: BTreeSet<(String, String)>,
}

/// Runs a controller with the PV finalizer on and a long late-asset window: `finished`
/// claims are provisioned and bound, then `blocked` claims get a driver call that never
/// returns; the controller is then killed (`kill`) or stopped gracefully with a short
/// grace period.
async fn controller_stopped_mid_provision(
    sim: &KubeSim,
    finished: &[&str],
    blocked: &[&str],
    kill: bool,
) -> Left {
    let fake = FakeProvisioner::new().with_late_asset_window(LATE_WINDOW);
    let replica = Replica::start(
        sim,
        fake.clone(),
        config(None)
            .add_finalizer(true)
            .shutdown_grace(Duration::from_millis(200)),
        false,
    );
    let mut left = Left {
        bound: BTreeSet::new(),
        in_flight: BTreeSet::new(),
    };
    for name in finished {
        let pv = create_claim(sim, name).await;
        bound(sim, name, &pv).await;
        left.bound.insert((format!("default/{name}"), pv));
    }
    // Every later provision call blocks (the script is shared by the fake's clones).
    let _ = fake
        .clone()
        .script_provision(blocked.iter().map(|_| ProvisionStep::Block));
    for name in blocked {
        let pv = create_claim(sim, name).await;
        left.in_flight.insert((format!("default/{name}"), pv));
    }
    tokio::time::timeout(Duration::from_secs(20), fake.wait_blocked(blocked.len()))
        .await
        .expect("the driver is called for every blocked claim");
    // The PV finalizer is on every finished PV, and the journal holds an intent for every
    // call in flight and a settled record for every finished claim (settles are written
    // lazily).
    let volumes = volumes(sim);
    eventually("the PV finalizer on every finished PV", || async {
        for (_, pv) in &left.bound {
            let v = volumes.get(pv).await.ok()?;
            v.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == FINALIZER_PV)
                .then_some(())?;
        }
        Some(())
    })
    .await;
    eventually(
        "an intent per call in flight, a settled record per PV",
        || async {
            let entries = journal_entries(sim, LEASE_NAME).await;
            let of = |settled: bool| -> BTreeSet<(String, String)> {
                entries
                    .iter()
                    .filter(|e| e.get("d").is_some() == settled)
                    .filter_map(|e| Some((e["n"].as_str()?.into(), e["v"].as_str()?.into())))
                    .collect()
            };
            (of(false) == left.in_flight && of(true) == left.bound).then_some(())
        },
    )
    .await;
    if kill {
        replica.kill().await;
    } else {
        replica.stop().await.unwrap();
    }
    fake.wait_blocked(0).await;
    for (_, pv) in &left.in_flight {
        assert!(fake.assets().contains(pv), "the backend created {pv}");
        assert!(
            volumes.get_opt(pv).await.unwrap().is_none(),
            "no PV for {pv}"
        );
    }
    left
}

/// The report's records as (claim, pv) pairs, in flight or not; checks each uid.
fn records(report: &UninstallReport, in_flight: bool) -> BTreeSet<(String, String)> {
    report
        .records
        .iter()
        .filter(|r| r.in_flight == in_flight)
        .map(|r| {
            assert_eq!(r.claim_uid, uid_of(&r.pv_name), "{r:?}");
            (r.claim.clone(), r.pv_name.clone())
        })
        .collect()
}

#[tokio::test]
async fn uninstall_reports_the_provisionings_in_flight_and_leaves_nothing_of_ours() {
    let sim = sim().await;
    // Another controller's journal in the same namespace, and a PV of another provisioner
    // with the same (Go's) finalizer: neither is ours to remove.
    let other_journal = ConfigMap {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("example.com-other-journal-00000000".into()),
            labels: Some([(JOURNAL_LABEL.to_owned(), "example.com-other".to_owned())].into()),
            ..Default::default()
        },
        data: Some(
            [(
                "e.0f6c2b9e-7d1a-4c55-9a43-1e2d3c4b5a69".to_owned(),
                r#"{"n":"default/x","v":"pvc-0f6c2b9e-7d1a-4c55-9a43-1e2d3c4b5a69","t":1}"#
                    .to_owned(),
            )]
            .into(),
        ),
        ..ConfigMap::default()
    };
    maps(&sim)
        .create(&PostParams::default(), &other_journal)
        .await
        .unwrap();
    volumes(&sim)
        .create(
            &PostParams::default(),
            &pv_of("pvc-of-another-provisioner")
                .provisioned_by("example.com/other")
                .finalizer(FINALIZER_PV)
                .build(),
        )
        .await
        .unwrap();

    let left = controller_stopped_mid_provision(&sim, &["a", "b"], &["c", "d"], true).await;
    let objects = journal_objects(&sim, LEASE_NAME).await;
    assert!(!objects.is_empty(), "the controller wrote its journal");
    // An in-tree PV migrated to us: the controller would delete its asset, so it is ours
    // too.
    volumes(&sim)
        .create(
            &PostParams::default(),
            &pv_of("pvc-migrated")
                .provisioned_by("kubernetes.io/in-tree-example")
                .migrated_to(ME)
                .finalizer(FINALIZER_PV)
                .build(),
        )
        .await
        .unwrap();

    let report = Uninstall::new(sim.client(), ME)
        .namespace("default")
        .remove_pv_finalizers(true)
        .run()
        .await
        .unwrap();

    assert_eq!(records(&report, true), left.in_flight, "{report:?}");
    assert_eq!(records(&report, false), left.bound, "{report:?}");
    assert_eq!(report.records.len(), 4, "{report:?}");
    assert_eq!(
        report
            .objects_deleted
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        objects
    );
    let mut ours: BTreeSet<String> = left.bound.iter().map(|(_, pv)| pv.clone()).collect();
    ours.insert("pvc-migrated".to_owned());
    assert_eq!(
        report
            .finalizers_removed
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        ours
    );

    assert_eq!(
        journal_objects(&sim, LEASE_NAME).await,
        BTreeSet::new(),
        "no journal object of ours remains"
    );
    assert_eq!(
        journal_objects(&sim, "example.com-other").await,
        BTreeSet::from(["example.com-other-journal-00000000".to_owned()]),
        "another controller's journal stays"
    );
    for pv in &ours {
        assert!(
            !has_pv_finalizer(&sim, pv).await,
            "{pv} keeps {FINALIZER_PV}"
        );
    }
    assert!(
        has_pv_finalizer(&sim, "pvc-of-another-provisioner").await,
        "another provisioner's PV keeps its finalizer"
    );
    assert_eq!(ours_on_claims(&sim).await, Vec::<String>::new());
    assert_eq!(
        claims(&sim)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        4,
        "no claim is touched"
    );

    let again = Uninstall::new(sim.client(), ME)
        .namespace("default")
        .remove_pv_finalizers(true)
        .run()
        .await
        .unwrap();
    assert_eq!(again, UninstallReport::default(), "a second run is a no-op");
}

#[tokio::test]
async fn uninstall_without_remove_pv_finalizers_keeps_them() {
    let sim = sim().await;
    let left = controller_stopped_mid_provision(&sim, &["a"], &["b"], false).await;
    let objects = journal_objects(&sim, LEASE_NAME).await;

    // The client's namespace and the default lease name: the controller's own.
    let report = Uninstall::new(sim.client(), ME).run().await.unwrap();

    assert_eq!(records(&report, true), left.in_flight, "{report:?}");
    assert_eq!(records(&report, false), left.bound, "{report:?}");
    assert_eq!(
        report
            .objects_deleted
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        objects
    );
    assert_eq!(report.finalizers_removed, Vec::<String>::new());
    assert_eq!(journal_objects(&sim, LEASE_NAME).await, BTreeSet::new());
    for (_, pv) in &left.bound {
        assert!(
            has_pv_finalizer(&sim, pv).await,
            "{pv} keeps {FINALIZER_PV}"
        );
    }
    assert_eq!(ours_on_claims(&sim).await, Vec::<String>::new());
}
