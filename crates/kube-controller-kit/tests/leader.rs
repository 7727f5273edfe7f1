//! Leader election against kube-sim, on a paused clock with short timings
//! (2 s lease, 1 s renew deadline, 200 ms retry period).

use std::future::pending;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::Api;
use kube_client::api::PostParams;
use kube_controller_kit::client::for_leader_election;
use kube_controller_kit::leader::{
    LeaderElection, LeaderElector, LeaderError, LeaderState, LossReason,
};
use kube_sim::{FaultRule, KubeSim, Verb};
use tokio::time::{Instant, sleep};

const NAME: &str = "example.com-test";
const NAMESPACE: &str = "default";
const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(200);
/// Longest pause between two acquire attempts: the retry period plus client-go's jitter.
const MAX_RETRY: Duration = Duration::from_millis(440);

async fn sim() -> KubeSim {
    KubeSim::builder().start().await.unwrap()
}

fn elector(sim: &KubeSim, identity: &str) -> LeaderElector {
    let cfg = LeaderElection::new(NAME, NAMESPACE)
        .unwrap()
        .identity(identity)
        .timings(LEASE, RENEW, RETRY)
        .unwrap();
    let config = kube_client::Config::new(sim.url().parse().unwrap());
    LeaderElector::new(for_leader_election(&config).unwrap(), cfg).unwrap()
}

fn leases(sim: &KubeSim) -> Api<Lease> {
    Api::namespaced(sim.client(), NAMESPACE)
}

async fn lease_spec(sim: &KubeSim) -> LeaseSpec {
    leases(sim).get(NAME).await.unwrap().spec.unwrap()
}

/// Starts `elector.acquire()` in a task; yields the elector and when it started leading.
fn acquire_in_background(
    mut elector: LeaderElector,
) -> tokio::task::JoinHandle<(LeaderElector, Instant)> {
    tokio::spawn(async move {
        elector.acquire(pending()).await.unwrap();
        (elector, Instant::now())
    })
}

#[tokio::test(start_paused = true)]
async fn of_two_electors_started_together_exactly_one_leads() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    let mut b = elector(&sim, "b");
    let (ra, rb) = tokio::join!(a.acquire(sleep(LEASE * 3)), b.acquire(sleep(LEASE * 3)),);
    let (leader, standby, standby_result) = match (ra, rb) {
        (Ok(()), Err(e)) => (&a, &b, e),
        (Err(e), Ok(())) => (&b, &a, e),
        other => panic!("expected exactly one leader, got {other:?}"),
    };
    assert!(
        matches!(standby_result, LeaderError::Cancelled { .. }),
        "{standby_result}"
    );
    assert!(leader.is_leader());
    assert_eq!(
        standby.state(),
        LeaderState::Standby {
            holder: Some(leader.identity().to_owned())
        }
    );
    // The leader kept renewing for three lease durations, so the standby never took over.
    let spec = lease_spec(&sim).await;
    assert_eq!(spec.holder_identity.as_deref(), Some(leader.identity()));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.lease_duration_seconds, Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_leader_is_replaced_once_its_lease_expires() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    let b = acquire_in_background(elector(&sim, "b"));
    sleep(LEASE).await; // a renews meanwhile; b waits
    assert!(
        !b.is_finished(),
        "the standby must not take a lease that is being renewed"
    );

    let dropped = Instant::now();
    drop(a); // a crash: renewals stop, nothing is released
    let (b, leading_since) = b.await.unwrap();
    let handover = leading_since - dropped;
    // b takes over one lease duration after it last saw a's record change: not before
    // a's last renewal expired, and within the lease duration plus b's polling delays.
    assert!(
        handover >= LEASE - RETRY * 2,
        "took over too early: {handover:?}"
    );
    assert!(
        handover <= LEASE + MAX_RETRY * 2,
        "took over too late: {handover:?}"
    );
    assert!(b.is_leader());
    let spec = lease_spec(&sim).await;
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_graceful_release_hands_over_in_well_under_the_lease_duration() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    let b = acquire_in_background(elector(&sim, "b"));
    sleep(LEASE).await;
    assert!(!b.is_finished());

    let released = Instant::now();
    a.release().await.unwrap();
    assert_eq!(a.state(), LeaderState::Released);
    assert_eq!(a.lost().await.reason, LossReason::Released);
    let (b, leading_since) = b.await.unwrap();
    let handover = leading_since - released;
    assert!(handover < LEASE / 2, "handover took {handover:?}");
    assert!(b.is_leader());
    let spec = lease_spec(&sim).await;
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test(start_paused = true)]
async fn release_clears_the_holder_and_shortens_the_lease_to_one_second() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    let before = lease_spec(&sim).await;
    a.release().await.unwrap();
    let after = lease_spec(&sim).await;
    assert!(
        after.holder_identity.as_deref().is_none_or(str::is_empty),
        "{after:?}"
    );
    assert_eq!(after.lease_duration_seconds, Some(1));
    assert_eq!(after.lease_transitions, before.lease_transitions);
    // Nothing renews any more: the record stays as released.
    sleep(LEASE).await;
    assert_eq!(lease_spec(&sim).await, after);
    // Releasing twice is a no-op.
    a.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn another_holder_overwriting_the_lease_is_reported_as_loss() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    sleep(RETRY * 3).await;

    let mut lease = leases(&sim).get(NAME).await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    leases(&sim)
        .replace(NAME, &PostParams::default(), &lease)
        .await
        .unwrap();
    let overwritten = Instant::now();

    let lost = a.lost().await;
    assert_eq!(
        lost.reason,
        LossReason::TakenOver {
            holder: Some("intruder".into())
        }
    );
    assert!(
        overwritten.elapsed() <= RETRY * 2,
        "noticed after {:?}",
        overwritten.elapsed()
    );
    assert_eq!(a.state(), LeaderState::Lost(lost.reason.clone()));
    assert_eq!(
        lost.to_string(),
        "lost leadership of lease default/example.com-test: the lease is now held by intruder"
    );
    // Not leading: release writes nothing and leaves the intruder in place.
    a.release().await.unwrap();
    assert_eq!(
        lease_spec(&sim).await.holder_identity.as_deref(),
        Some("intruder")
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_failing_past_the_renew_deadline_are_reported_as_loss() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    sleep(RETRY * 3).await;

    sim.add_fault(FaultRule::new(Verb::Get, "leases").always());
    sim.add_fault(FaultRule::new(Verb::Update, "leases").always());
    let failing_since = Instant::now();
    let lost = a.lost().await;
    assert_eq!(lost.reason, LossReason::RenewDeadlineExceeded);
    let after = failing_since.elapsed();
    // The deadline counts from the last successful renewal, at most one retry period
    // before the faults started.
    assert!(after <= RENEW, "gave up after {after:?}");
    assert!(after >= RENEW - RETRY * 2, "gave up too early: {after:?}");
    assert!(!a.is_leader());
}

#[tokio::test(start_paused = true)]
async fn renewal_failures_shorter_than_the_deadline_keep_the_lease() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    // Two failed renewals (about 400 ms) are well within the 1 s deadline.
    sim.add_fault(FaultRule::new(Verb::Update, "leases").times(2));
    sleep(LEASE * 2).await;
    assert!(a.is_leader(), "{:?}", a.state());
    assert_eq!(lease_spec(&sim).await.holder_identity.as_deref(), Some("a"));
    let failed = sim
        .requests()
        .iter()
        .filter(|r| r.verb == "update" && r.path.contains("/leases/") && r.status == 500)
        .count();
    assert_eq!(failed, 2, "{:?}", sim.requests());
}

#[tokio::test(start_paused = true)]
async fn a_deleted_lease_is_reported_as_loss() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    leases(&sim)
        .delete(NAME, &Default::default())
        .await
        .unwrap();
    assert_eq!(a.lost().await.reason, LossReason::Deleted);
}

#[tokio::test(start_paused = true)]
async fn lease_transitions_count_every_handover() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    let mut b = elector(&sim, "b");
    a.acquire(pending()).await.unwrap();
    assert_eq!(lease_spec(&sim).await.lease_transitions, Some(0));
    a.release().await.unwrap();
    b.acquire(pending()).await.unwrap();
    assert_eq!(lease_spec(&sim).await.lease_transitions, Some(1));
    b.release().await.unwrap();
    // A released elector may stand again.
    a.acquire(pending()).await.unwrap();
    let spec = lease_spec(&sim).await;
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(2));
}

#[tokio::test(start_paused = true)]
async fn acquire_is_cancelled_by_shutdown_while_another_replica_leads() {
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    let mut b = elector(&sim, "b");
    let mut states = b.subscribe();
    let started = Instant::now();
    let err = b.acquire(sleep(RETRY * 5)).await.unwrap_err();
    assert!(matches!(err, LeaderError::Cancelled { .. }), "{err}");
    assert_eq!(started.elapsed(), RETRY * 5);
    assert_eq!(
        *states.borrow_and_update(),
        LeaderState::Standby {
            holder: Some("a".into())
        }
    );
    // Not leading: `lost` resolves at once and release is a no-op.
    assert_eq!(b.lost().await.reason, LossReason::NotLeading);
    b.release().await.unwrap();
    assert_eq!(lease_spec(&sim).await.holder_identity.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn a_create_race_and_an_update_conflict_are_re_read_at_once() {
    let sim = sim().await;
    // Another replica "created the lease first" (and then it vanished): re-read, create.
    sim.add_fault(FaultRule::new(Verb::Create, "leases").status(409, "AlreadyExists"));
    let mut a = elector(&sim, "a");
    let started = Instant::now();
    a.acquire(pending()).await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no retry period was waited"
    );

    sim.clear_requests();
    sim.add_fault(FaultRule::new(Verb::Update, "leases").status(409, "Conflict"));
    sleep(RETRY + RETRY / 2).await; // exactly one renewal round
    let lease_calls: Vec<(String, u16)> = sim
        .requests()
        .into_iter()
        .filter(|r| r.resource == "leases")
        .map(|r| (r.verb, r.status))
        .collect();
    let expected = [("get", 200), ("update", 409), ("get", 200), ("update", 200)];
    let expected: Vec<(String, u16)> = expected.iter().map(|(v, s)| (v.to_string(), *s)).collect();
    assert_eq!(lease_calls, expected);
    assert!(a.is_leader());
}

#[tokio::test(start_paused = true)]
async fn a_candidate_honours_the_duration_the_lease_itself_declares() {
    let sim = sim().await;
    let foreign = Lease {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("other".into()),
            lease_duration_seconds: Some(10),
            lease_transitions: Some(4),
            ..Default::default()
        }),
    };
    leases(&sim)
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let started = Instant::now();
    let b = acquire_in_background(elector(&sim, "b"));
    sleep(LEASE * 3).await; // three of *our* lease durations: still the other's lease
    assert!(
        !b.is_finished(),
        "took over a lease that declares 10 s after 6 s"
    );
    let (b, leading_since) = b.await.unwrap();
    let waited = leading_since - started;
    assert!(waited >= Duration::from_secs(10), "{waited:?}");
    assert!(waited <= Duration::from_secs(10) + MAX_RETRY, "{waited:?}");
    assert!(b.is_leader());
    assert_eq!(lease_spec(&sim).await.lease_transitions, Some(5));
}

/// Log lines written while the returned guard lives (on this thread: the test's runtime).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn lines_with(&self, text: &str) -> Vec<String> {
        let raw = self.0.lock().unwrap();
        String::from_utf8_lossy(&raw)
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn forbidden(verb: Verb) -> FaultRule {
    FaultRule::new(verb, "leases")
        .status(403, "Forbidden")
        .message(
            "leases.coordination.k8s.io is forbidden: User \
             \"system:serviceaccount:storage:provisioner\" cannot access leases",
        )
        .always()
}

fn lease_requests(sim: &KubeSim, verb: &str) -> usize {
    sim.requests()
        .iter()
        .filter(|r| r.resource == "leases" && r.verb == verb)
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_lease_is_reported_once_retried_slowly_and_acquired_once_allowed() {
    let (logs, _guard) = Logs::capture();
    let sim = sim().await;
    sim.add_fault(forbidden(Verb::Get));
    let candidate = acquire_in_background(elector(&sim, "a"));

    // Four minutes: about 600 attempts at the normal pace of 200 ms plus jitter.
    sleep(Duration::from_secs(240)).await;
    assert!(!candidate.is_finished());
    let attempts = lease_requests(&sim, "get");
    // 0.2, 0.4, ... doubling to 30 s (60 s at most with jitter): about a dozen.
    assert!(
        (5..=20).contains(&attempts),
        "{attempts} attempts in 4 minutes"
    );
    let reports = logs.lines_with("forbidden to get leases");
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert!(
        reports[0].contains(&format!(
            "leader election: forbidden to get leases \"{NAME}\" in namespace \"{NAMESPACE}\"; \
             check the RBAC of the service account"
        )),
        "{}",
        reports[0]
    );
    assert!(
        logs.lines_with("Status {").is_empty(),
        "no Status debug dump"
    );
    assert!(logs.lines_with("failed to acquire lease").is_empty());

    sim.clear_faults();
    let allowed = Instant::now();
    let (a, leading_since) = candidate.await.unwrap();
    assert!(a.is_leader());
    let waited = leading_since - allowed;
    assert!(
        waited <= Duration::from_secs(60),
        "acquired {waited:?} after the fix"
    );
    assert_eq!(logs.lines_with("no longer forbidden").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_create_is_reported_without_a_lease_name() {
    let (logs, _guard) = Logs::capture();
    let sim = sim().await;
    sim.add_fault(forbidden(Verb::Create));
    let mut a = elector(&sim, "a");
    let result = a.acquire(sleep(Duration::from_secs(120))).await;
    assert!(
        matches!(result, Err(LeaderError::Cancelled { .. })),
        "{result:?}"
    );
    let reports = logs.lines_with("forbidden to create leases");
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert!(
        reports[0].contains(&format!(
            "forbidden to create leases in namespace \"{NAMESPACE}\"; check the RBAC"
        )),
        "{}",
        reports[0]
    );
    assert!(lease_requests(&sim, "create") <= 12);
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_renewal_is_reported_once_and_ends_in_loss() {
    let (logs, _guard) = Logs::capture();
    let sim = sim().await;
    let mut a = elector(&sim, "a");
    a.acquire(pending()).await.unwrap();
    sim.add_fault(forbidden(Verb::Update));
    assert_eq!(a.lost().await.reason, LossReason::RenewDeadlineExceeded);
    // The round retried every retry period until the renew deadline (about 5 updates).
    assert!(lease_requests(&sim, "update") >= 3);
    let reports = logs.lines_with("forbidden to update leases");
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert!(logs.lines_with("failed to renew lease").is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_unset_namespace_is_the_clients_default_namespace() {
    let sim = sim().await;
    let namespaces: Api<Namespace> = Api::all(sim.client());
    for name in ["team-a", "elsewhere"] {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    let mut config = kube_client::Config::new(sim.url().parse().unwrap());
    config.default_namespace = "team-a".into();
    let client = for_leader_election(&config).unwrap();
    let timings = |cfg: LeaderElection| cfg.identity("a").timings(LEASE, RENEW, RETRY).unwrap();

    let unset = timings(LeaderElection::default().lease_name(NAME));
    assert_eq!(unset.namespace, "");
    let mut a = LeaderElector::new(client.clone(), unset).unwrap();
    assert_eq!(a.config().namespace, "team-a");
    a.acquire(pending()).await.unwrap();
    let in_team_a: Api<Lease> = Api::namespaced(sim.client(), "team-a");
    assert_eq!(
        in_team_a
            .get(NAME)
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("a")
    );
    a.release().await.unwrap();

    // A namespace that is set (POD_NAMESPACE, say) wins over the client's.
    let set = timings(LeaderElection::new(NAME, "elsewhere").unwrap());
    let mut b = LeaderElector::new(client, set).unwrap();
    b.acquire(pending()).await.unwrap();
    let elsewhere: Api<Lease> = Api::namespaced(sim.client(), "elsewhere");
    assert!(elsewhere.get_opt(NAME).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_missing_namespace_is_reported_once_shown_by_readyz_and_retried_slowly() {
    use kube_controller_kit::http::{Health, NotReady, Role};

    let (logs, _guard) = Logs::capture();
    let sim = sim().await;
    let cfg = LeaderElection::new(NAME, "storage")
        .unwrap()
        .identity("a")
        .timings(LEASE, RENEW, RETRY)
        .unwrap();
    let config = kube_client::Config::new(sim.url().parse().unwrap());
    let mut a = LeaderElector::new(for_leader_election(&config).unwrap(), cfg).unwrap();
    let health = Health::new();
    health.set_role(Role::Standby);
    health.set_caches_synced(true);
    a.report_to(health.clone());
    let candidate = acquire_in_background(a);

    // Twenty minutes: 0.2 s doubling to 4 min (5 at most with jitter) is about 15
    // attempts, where the normal pace would make about 3000.
    sleep(Duration::from_secs(20 * 60)).await;
    assert!(!candidate.is_finished());
    let attempts = lease_requests(&sim, "create");
    assert!(
        (10..=20).contains(&attempts),
        "{attempts} attempts in 20 minutes"
    );
    let errors = logs.lines_with("ERROR");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains(&format!(
            "leader election: namespace \"storage\" does not exist, so the Lease \
             storage/{NAME} cannot be created; create the namespace, or set the \
             leader-election namespace (POD_NAMESPACE) to one that exists"
        )),
        "{}",
        errors[0]
    );
    let again = logs.lines_with("still does not exist");
    assert_eq!(again.len(), 1, "{again:#?}");
    assert!(
        again[0].contains("retrying every 4 minutes"),
        "{}",
        again[0]
    );
    assert!(logs.lines_with("failed to acquire lease").is_empty());
    assert!(
        logs.lines_with("Status {").is_empty(),
        "no Status debug dump"
    );
    let Err(NotReady::ElectionBlocked(why)) = health.readiness() else {
        panic!("{:?}", health.readiness());
    };
    assert_eq!(
        why,
        "leader election: namespace \"storage\" does not exist; create it, or set the \
         leader-election namespace (POD_NAMESPACE) to one that exists"
    );

    let namespaces: Api<Namespace> = Api::all(sim.client());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("storage".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let created = Instant::now();
    let (a, leading_since) = candidate.await.unwrap();
    assert!(a.is_leader());
    let waited = leading_since - created;
    assert!(
        waited <= Duration::from_secs(5 * 60),
        "acquired {waited:?} after the namespace appeared"
    );
    assert_eq!(health.readiness(), Ok(()));
    assert_eq!(logs.lines_with("namespace exists now").len(), 1);
    let lease: Api<Lease> = Api::namespaced(sim.client(), "storage");
    let holder = lease.get(NAME).await.unwrap().spec.unwrap().holder_identity;
    assert_eq!(holder.as_deref(), Some("a"));
}
