//! Two replicas without leader election share one journal: a replica that finds no asset
//! for a deleted claim must not drop the record of an attempt the other one began after
//! it looked (its create may land after that lookup).

use super::*;
use crate::journal::{Entry, Journal, JournalConfig};

/// The late-asset window of these tests.
const WINDOW: Duration = Duration::from_secs(1);

/// The other replica: a journal of its own (writer `other`) on this one's objects.
fn other_replica(sim: &kube_sim::KubeSim, h: &Harness) -> Arc<Journal> {
    let (namespace, lease_name) =
        crate::journal::location(&sim.client(), ME, h.ctx.config.leader_election.as_ref());
    Arc::new(Journal::new(
        sim.client(),
        JournalConfig {
            namespace,
            lease_name,
            writer: "other".into(),
            commit_delay: Duration::from_millis(10),
            full_group: 1,
            capacity: 1000,
            call_limit: None,
        },
        None,
    ))
}

/// An intent of the deleted claim `default/c` (uid `u1`) that `writer` wrote `age`
/// seconds ago.
pub(super) fn intent(writer: &str, age: i64) -> Entry {
    Entry {
        claim: "default/c".into(),
        pv: "pvc-u1".into(),
        since: crate::journal::now_secs() - age,
        writer: writer.into(),
        class: None,
        node: None,
        spec: Some(serde_json::json!({
            "storageClassName": "fast",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        })),
        due: None,
        attempt: None,
    }
}

/// The entry of `u1` on the API server, as a fresh reader loads it.
async fn on_the_server(sim: &kube_sim::KubeSim, h: &Harness) -> Option<Entry> {
    let reader = other_replica(sim, h);
    reader.reload().await.unwrap();
    reader.entry("u1")
}

/// Waits until the journal has written what it had pending (removals are lazy).
async fn flushed(sim: &kube_sim::KubeSim, h: &Harness, want_gone: bool) -> Option<Entry> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let entry = on_the_server(sim, h).await;
        if entry.is_none() == want_gone || Instant::now() > deadline {
            return entry;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// This replica (a harness with a journal) and the other one, whose old intent for the
/// deleted claim `u1` this replica has read; the committers stop when it is dropped.
struct Two {
    sim: kube_sim::KubeSim,
    h: Harness,
    fake: FakeProvisioner,
    journal: Arc<Journal>,
    other: Arc<Journal>,
    committers: Vec<tokio::task::JoinHandle<()>>,
}

impl Two {
    async fn start() -> Self {
        let fake = FakeProvisioner::new().with_late_asset_window(WINDOW);
        let (sim, h) = sim_harness(Config::default(), fake.clone(), true).await;
        let journal = Arc::clone(h.ctx.journal.as_ref().unwrap());
        let other = other_replica(&sim, &h);
        let committers = vec![
            tokio::spawn(Arc::clone(&journal).run_committer()),
            tokio::spawn(Arc::clone(&other).run_committer()),
        ];
        other.put("u1", intent("other", 100), None).await.unwrap();
        journal.reload().await.unwrap();
        // The claim is gone (not cached): the first look finds no asset and waits.
        let first = sync_claim(&h.ctx, "u1").await.ok();
        assert!(
            matches!(first, Some(Outcome::RequeueAfter { .. })),
            "a first look waits for late creates: {first:?}"
        );
        Self {
            sim,
            h,
            fake,
            journal,
            other,
            committers,
        }
    }
}

impl Drop for Two {
    fn drop(&mut self) {
        for task in &self.committers {
            task.abort();
        }
    }
}

/// This replica looked (no asset) and waited its window; meanwhile the other replica,
/// whose claim cache is behind, stamped a new attempt on the intent. This replica's view
/// of the journal is behind too: its cleanup finds no asset and removes only the entry it
/// read, so the stamped one stays on the server for whoever cleans up next.
#[tokio::test]
async fn a_cleanup_leaves_an_intent_another_replica_stamped_after_it_looked() {
    let Two {
        sim,
        h,
        fake,
        journal,
        other,
        ..
    } = &Two::start().await;
    // The other replica begins another attempt: a durable stamp before its create.
    let stamped = Entry {
        attempt: Some(crate::journal::now_secs()),
        ..intent("other", 100)
    };
    other.put("u1", stamped.clone(), None).await.unwrap();
    tokio::time::sleep(WINDOW + Duration::from_millis(1100)).await;

    // This replica's view still holds the old intent: it believes "none" now.
    assert_eq!(journal.entry("u1").and_then(|e| e.attempt), None);
    assert_eq!(sync_claim(&h.ctx, "u1").await.ok(), Some(Outcome::Done));
    assert!(fake.assets().is_empty(), "the cleanup created nothing");
    // The lazy removal is written (with a conflict and a fresh read) and refused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        flushed(sim, h, false).await,
        Some(stamped.clone()),
        "the other replica's newer attempt stays recorded"
    );

    // The next cleanup reads the stamped entry and believes "none" only a window after
    // its attempt.
    journal.reload().await.unwrap();
    h.ctx.records.forget_cleanup("u1");
    let mut syncs = 0;
    loop {
        let now = crate::journal::now_secs();
        let outcome = sync_claim(&h.ctx, "u1").await.ok();
        syncs += 1;
        match outcome {
            Some(Outcome::RequeueAfter { wait, .. }) if syncs < 4 => {
                tokio::time::sleep(wait).await;
            }
            Some(Outcome::Done) => {
                assert!(
                    crate::controller::crash_safety::attempt_wait(&stamped, 1, now).is_none(),
                    "believed no asset before the window after the attempt"
                );
                break;
            }
            unexpected => panic!("unexpected outcome {unexpected:?}"),
        }
    }
    // Once its window has passed, the unchanged entry goes.
    assert_eq!(flushed(sim, h, true).await, None, "the entry is removed");
}

/// A replica's own cleanup removes an entry nobody rewrote (the common case).
#[tokio::test]
async fn a_cleanup_removes_the_entry_it_read_when_nobody_rewrote_it() {
    let two = Two::start().await;
    tokio::time::sleep(WINDOW + Duration::from_millis(1100)).await;
    assert_eq!(sync_claim(&two.h.ctx, "u1").await.ok(), Some(Outcome::Done));
    assert_eq!(
        flushed(&two.sim, &two.h, true).await,
        None,
        "the entry is removed"
    );
}

#[test]
fn an_attempt_delays_the_belief_in_no_asset_by_the_window() {
    let mut e = intent("other", 0);
    e.since = 1000;
    let wait = |e: &Entry, now| crate::controller::crash_safety::attempt_wait(e, 5, now);
    assert_eq!(wait(&e, 1000), Some(Duration::from_secs(6)));
    assert_eq!(wait(&e, 1005), Some(Duration::from_secs(1)));
    assert_eq!(wait(&e, 1006), None);
    e.attempt = Some(1010);
    assert_eq!(
        wait(&e, 1006),
        Some(Duration::from_secs(10)),
        "from the attempt"
    );
    e.attempt = Some(900);
    assert_eq!(
        wait(&e, 1006),
        None,
        "an attempt before `since` counts as `since`"
    );
}

/// A retry of a live claim whose intent exists writes the attempt's time before the
/// driver is called again (the first attempt wrote the intent); the original time stays.
#[tokio::test]
async fn every_attempt_stamps_the_intent_before_the_driver_is_called() {
    let fake = FakeProvisioner::new()
        .with_late_asset_window(WINDOW)
        .script_provision([ProvisionStep::InBackground, ProvisionStep::InBackground]);
    let (sim, mut h) = sim_harness(Config::default(), fake.clone(), true).await;
    let journal = Arc::clone(h.ctx.journal.as_ref().unwrap());
    let committer = tokio::spawn(Arc::clone(&journal).run_committer());
    h.add_claim();
    let _ = sync_claim(&h.ctx, "u1").await;
    let first = on_the_server(&sim, &h)
        .await
        .expect("the intent is written");
    assert_eq!(
        first.attempt, None,
        "a first attempt is the intent's own time"
    );
    // The next attempt, in a later second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _ = sync_claim(&h.ctx, "u1").await;
    assert_eq!(fake.provision_calls().len(), 2);
    let second = on_the_server(&sim, &h).await.expect("the intent stays");
    assert_eq!(second.since, first.since, "the intent keeps when it began");
    assert!(
        second.attempt.is_some_and(|a| a > first.since),
        "the retry is stamped: {second:?}"
    );
    assert_eq!(second.writer, first.writer, "this process's own intent");
    committer.abort();
}
