//! The workers (Go `processNextClaimWorkItem`, `processNextVolumeWorkItem`): one loop,
//! [`work`], that takes a key from a queue, runs its flow with a panic caught, lets the
//! flow's `settle` decide the retry and releases the key; and the periodic resync.
//!
//! In a claim's way: the first step, before `claim::sync_claim`, and the last, when its
//! result decides whether the claim is retried.

use std::{future::Future, sync::Arc};

use tracing::Instrument;

use super::{
    Context, calls,
    calls::{OpError, Outcome, Why},
    claim, crash_safety, volume,
};
use crate::queue::WorkQueue;

/// One worker of a flow: takes keys from `queue` until it shuts down; for each, runs
/// `sync` (a panic anywhere in it, in a hook or a bug, fails that key only: the worker
/// lives on), then `settle` with its result (forget, queue again, or give up), then
/// releases the key.
async fn work<T, S, F>(queue: &WorkQueue, what: &'static str, sync: impl Fn(String) -> S, settle: F)
where
    S: Future<Output = Result<T, OpError>>,
    F: Fn(&str, Result<T, OpError>),
{
    while let Some(key) = queue.get().await {
        let result = calls::call(None, sync(key.clone()))
            .await
            .unwrap_or_else(|e| Err(e.into_op(what)));
        settle(&key, result);
        queue.done(&key);
    }
}

pub(crate) async fn claim_worker(ctx: Arc<Context>) {
    let sync = |uid: String| {
        let ctx = Arc::clone(&ctx);
        async move {
            sync_claim(&ctx, &uid)
                .instrument(tracing::info_span!("sync_claim", claim_uid = %uid))
                .await
        }
    };
    work(&ctx.claim_queue, "sync of claim", sync, |uid, result| {
        settle_claim(&ctx, uid, result);
    })
    .await;
}

/// A claim's sync, with its provisioning in progress as the claim's record holds it now.
async fn sync_claim(ctx: &Context, uid: &str) -> Result<Outcome, OpError> {
    claim::sync_claim(ctx, uid, ctx.records.in_progress(uid)).await
}

/// What a claim's sync result means for the claim: forgotten, queued after a wait that
/// is no failure, retried with backoff, or given up past
/// [`Config::failed_provision_threshold`](crate::Config::failed_provision_threshold).
fn settle_claim(ctx: &Context, uid: &str, result: Result<Outcome, OpError>) {
    match result {
        Ok(Outcome::Done) => {
            ctx.claim_queue.forget(uid);
            ctx.records.set_in_progress(uid, None);
            ctx.records.forget_cleanup(uid);
        }
        Ok(Outcome::RequeueAfter { wait, why }) => {
            match &why {
                // Waiting after an infeasible answer: queued again once the wait is over
                // (or at once when the claim's class is re-created).
                Why::Infeasible => {
                    tracing::debug!(claim_uid = %uid, ?wait, "provisioning previously failed with infeasible error; retry delayed");
                }
                // A cleanup that found no asset yet, while a create may still land: looked
                // at again once it can no longer.
                Why::CreatesMayLand { .. } => {
                    tracing::info!(claim_uid = %uid, error = %why.with_wait(wait), "cleanup waits for creates that may still land");
                }
                // A cleanup the qualifier refuses now: asked again slowly.
                Why::CleanupRefused { .. } => {
                    tracing::debug!(claim_uid = %uid, error = %why.with_wait(wait), "cleanup refused; retry delayed");
                }
            }
            ctx.claim_queue.add_after(uid.to_owned(), wait);
        }
        Err(err) => {
            let failures = ctx.claim_queue.num_requeues(uid);
            let threshold = ctx.config.failed_provision_threshold;
            let error = calls::chain(&err);
            if threshold == 0 || failures < threshold {
                tracing::warn!(claim_uid = %uid, failures, %error, "retrying claim");
                ctx.claim_queue.add_rate_limited(uid.to_owned());
            } else if ctx.records.is_in_progress(uid) || crash_safety::entry(ctx, uid).is_some() {
                // Go drops the claim here and can leak the volume being provisioned.
                tracing::warn!(claim_uid = %uid, failures, %error,
                    "retrying claim past the threshold: its provisioning runs in the background or its journal entry is not done");
                ctx.claim_queue.add_rate_limited(uid.to_owned());
            } else {
                tracing::error!(claim_uid = %uid, failures, threshold, %error, "giving up on claim");
            }
        }
    }
}

pub(crate) async fn volume_worker(ctx: Arc<Context>) {
    let sync = |name: String| {
        let ctx = Arc::clone(&ctx);
        async move {
            volume::sync_volume(&ctx, &name)
                .instrument(tracing::info_span!("sync_volume", pv = %name))
                .await
        }
    };
    work(&ctx.volume_queue, "sync of volume", sync, |name, result| {
        settle_volume(&ctx, name, result);
    })
    .await;
}

/// What a volume's sync result means for the volume: forgotten, retried with backoff, or
/// given up past [`Config::failed_delete_threshold`](crate::Config::failed_delete_threshold).
fn settle_volume(ctx: &Context, name: &str, result: Result<(), OpError>) {
    match result {
        Ok(()) => ctx.volume_queue.forget(name),
        Err(err) => {
            let failures = ctx.volume_queue.num_requeues(name);
            let threshold = ctx.config.failed_delete_threshold;
            let error = calls::chain(&err);
            if threshold == 0 || failures < threshold {
                tracing::warn!(pv = %name, failures, %error, "retrying volume");
                ctx.volume_queue.add_rate_limited(name.to_owned());
            } else {
                tracing::error!(pv = %name, failures, threshold, %error, "giving up on volume");
            }
        }
    }
}

/// Queues every cached claim and volume each resync period (Go: informer resync).
pub(crate) async fn resync(ctx: Arc<Context>) {
    let period = ctx.config.resync_period;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Some(journal) = &ctx.journal
            && let Err(error) = journal.reload().await
        {
            tracing::warn!(error = %calls::chain(&error), "failed to read the provisioning journal; using what this process knows");
        }
        ctx.queue_everything();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use k8s_openapi::api::{core::v1::PersistentVolumeClaim, storage::v1::StorageClass};
    use kube_runtime::{reflector, watcher};
    use tokio::time::Instant;

    use super::*;
    use crate::{
        Config, FailureBackoff, PvSaveStrategy,
        cache::Caches,
        controller::save::Saver,
        events::Events,
        testing::{DeleteStep, FakeProvisioner, ProvisionStep, class, pvc},
    };

    const ME: &str = "example.com/fake";

    struct Harness {
        ctx: Arc<Context>,
        claims: reflector::store::Writer<PersistentVolumeClaim>,
        volumes: reflector::store::Writer<k8s_openapi::api::core::v1::PersistentVolume>,
        classes: reflector::store::Writer<StorageClass>,
        calls: Arc<Mutex<Vec<Instant>>>,
        /// What the qualifier answers (true at first).
        qualify: Arc<std::sync::atomic::AtomicBool>,
    }

    /// A context on empty caches and a client that is never contacted (the flows under
    /// test stop before any API call, or use the background saver).
    fn harness(config: Config, fake: FakeProvisioner, with_class: bool) -> Harness {
        let client = kube_client::Client::try_from(kube_client::Config::new(
            "http://127.0.0.1:9".parse().unwrap(),
        ))
        .unwrap();
        // Crash safety writes its journal, and this harness has no API server.
        build(
            client,
            config.crash_safe_provisioning(false),
            fake,
            with_class,
        )
    }

    /// A context whose client talks to a fresh kube-sim (returned too), with `config` as
    /// given; the caches are still fed by the test. For real time only: a paused clock
    /// advances while a request waits for the sim.
    async fn sim_harness(
        config: Config,
        fake: FakeProvisioner,
        with_class: bool,
    ) -> (kube_sim::KubeSim, Harness) {
        let sim = kube_sim::KubeSim::builder().start().await.unwrap();
        let h = build(sim.client(), config, fake, with_class);
        (sim, h)
    }

    fn build(
        client: kube_client::Client,
        config: Config,
        fake: FakeProvisioner,
        with_class: bool,
    ) -> Harness {
        let (claims_store, claims) = reflector::store();
        let (volumes_store, volumes) = reflector::store();
        let (classes_store, mut classes) = reflector::store();
        if with_class {
            classes.apply_watcher_event(&watcher::Event::Apply(
                class("fast").provisioner(ME).build(),
            ));
        }
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let qualify = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let answer = Arc::clone(&qualify);
        // The PVs wait in the background saver when the API server cannot be reached.
        let mut ctx = Context::new(crate::controller::Parts {
            journal_client: client.clone(),
            client,
            name: ME.into(),
            driver: crate::controller::Driver {
                provisioner: Arc::new(fake.clone()),
                qualifier: Some(Arc::new(move |_: &PersistentVolumeClaim| {
                    seen.lock().unwrap().push(Instant::now());
                    answer.load(std::sync::atomic::Ordering::SeqCst)
                })),
                guard: None,
                asset_lookup: Some(Arc::new(fake.clone())),
                late_assets: Some(Arc::new(fake.clone())),
            },
            config: config.pv_save(PvSaveStrategy::background()),
            caches: Caches::new(claims_store, volumes_store, classes_store),
            events: Events::disabled(),
            metrics: None,
        });
        ctx.accepting = std::sync::atomic::AtomicBool::new(true);
        let ctx = Arc::new(ctx);
        Harness {
            ctx,
            claims,
            volumes,
            classes,
            calls,
            qualify,
        }
    }

    impl Harness {
        /// Caches the claim as the feeder does: in the store, then in the UID index.
        fn put_claim(&mut self, claim: PersistentVolumeClaim) {
            self.claims
                .apply_watcher_event(&watcher::Event::Apply(claim.clone()));
            self.ctx.caches.index_claim(&claim);
        }
        fn add_claim(&mut self) {
            let claim = pvc("c")
                .uid("u1")
                .storage_class("fast")
                .provisioner(ME)
                .build();
            self.put_claim(claim);
            self.ctx.claim_queue.add("u1".into());
        }
        /// Seconds since `start` of each sync attempt.
        fn attempts(&self, start: Instant) -> Vec<u64> {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .map(|t| (*t - start).as_secs())
                .collect()
        }
        async fn run_for(&self, secs: u64) {
            let worker = tokio::spawn(claim_worker(Arc::clone(&self.ctx)));
            tokio::time::sleep(Duration::from_secs(secs)).await;
            self.ctx.claim_queue.shut_down();
            worker.await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_claim_backs_off_exponentially_and_gives_up_after_the_threshold() {
        let config = Config::default().failed_provision_threshold(3);
        // No class: every attempt fails before touching the API.
        let mut h = harness(config, FakeProvisioner::new(), false);
        let start = Instant::now();
        h.add_claim();
        h.run_for(2000).await;
        assert_eq!(h.attempts(start), [0, 15, 45, 105]);
        assert_eq!(
            h.ctx.claim_queue.num_requeues("u1"),
            3,
            "the failure count is kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn flat_backoff_retries_every_fifteen_seconds() {
        let config = Config::default()
            .failed_provision_threshold(3)
            .failure_backoff(FailureBackoff::Flat);
        let mut h = harness(config, FakeProvisioner::new(), false);
        let start = Instant::now();
        h.add_claim();
        h.run_for(2000).await;
        assert_eq!(h.attempts(start), [0, 15, 30, 45]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_threshold_retries_forever() {
        let config = Config::default()
            .failed_provision_threshold(0)
            .failure_backoff(FailureBackoff::Flat);
        let mut h = harness(config, FakeProvisioner::new(), false);
        let start = Instant::now();
        h.add_claim();
        h.run_for(15 * 40 + 1).await;
        assert_eq!(h.attempts(start).len(), 41);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_provisioning_in_background_is_driven_past_the_threshold_after_deletion() {
        let fake = FakeProvisioner::new()
            .script_provision(std::iter::repeat_n(ProvisionStep::InBackground, 5));
        let config = Config::default().failed_provision_threshold(2);
        let mut h = harness(config, fake.clone(), true);
        h.add_claim();
        let worker = tokio::spawn(claim_worker(Arc::clone(&h.ctx)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(h.ctx.records.is_in_progress("u1"));
        // The claim object goes away while the backend is still working.
        h.claims.apply_watcher_event(&watcher::Event::Delete(
            pvc("c")
                .uid("u1")
                .storage_class("fast")
                .provisioner(ME)
                .build(),
        ));
        tokio::time::sleep(Duration::from_secs(3000)).await;
        h.ctx.claim_queue.shut_down();
        worker.await.unwrap();
        assert_eq!(
            fake.provision_calls().len(),
            6,
            "five in background, then the volume"
        );
        assert_eq!(fake.assets().len(), 1);
        assert!(!h.ctx.records.is_in_progress("u1"));
        let Saver::Background(bg) = &h.ctx.saver else {
            unreachable!()
        };
        assert_eq!(bg.unsaved(), 1, "the PV waits for the background saver");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_provision_call_counts_as_running_in_the_background() {
        let fake = FakeProvisioner::new().script_provision([ProvisionStep::Hang]);
        let config = Config::default().provision_timeout(Some(Duration::from_secs(5)));
        let mut h = harness(config, fake.clone(), true);
        h.add_claim();
        let worker = tokio::spawn(claim_worker(Arc::clone(&h.ctx)));
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(h.ctx.records.is_in_progress("u1"));
        tokio::time::sleep(Duration::from_secs(20)).await;
        h.ctx.claim_queue.shut_down();
        worker.await.unwrap();
        assert_eq!(fake.provision_calls().len(), 2);
        assert!(!h.ctx.records.is_in_progress("u1"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_provisioner_fails_the_attempt_and_the_claim_is_retried() {
        let fake = FakeProvisioner::new().script_provision([ProvisionStep::Panic]);
        let mut h = harness(Config::default(), fake.clone(), true);
        h.add_claim();
        h.run_for(20).await;
        assert_eq!(fake.provision_calls().len(), 2);
        assert_eq!(fake.assets().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn claims_in_progress_follow_the_provisioning_state() {
        use ProvisionStep::*;
        let the_claim = || {
            pvc("c")
                .uid("u1")
                .storage_class("fast")
                .provisioner(ME)
                .build()
        };
        // (case, step, in progress before, claim still exists, in progress after, sync ok)
        let cases = [
            (
                "a failed attempt does not mark the claim",
                Failed,
                false,
                true,
                false,
                false,
            ),
            (
                "a background error marks the claim",
                InBackground,
                false,
                true,
                true,
                false,
            ),
            (
                "a no-change error does not mark the claim",
                NoChange,
                false,
                true,
                false,
                false,
            ),
            (
                "a failed attempt unmarks the claim",
                Failed,
                true,
                true,
                false,
                false,
            ),
            (
                "a background error keeps the claim",
                InBackground,
                true,
                true,
                true,
                false,
            ),
            (
                "a no-change error keeps the claim",
                NoChange,
                true,
                true,
                true,
                false,
            ),
            ("a panic keeps the claim", Panic, true, true, true, false),
            (
                "a reschedule without selected node acts as final",
                Reschedule,
                true,
                true,
                false,
                false,
            ),
            (
                "an ignored claim is unmarked",
                Ignored,
                true,
                true,
                false,
                true,
            ),
            (
                "a deleted claim in progress is provisioned",
                Succeed,
                true,
                false,
                false,
                true,
            ),
        ];
        for (name, step, before, exists, after, ok) in cases {
            let fake = FakeProvisioner::new().script_provision([step]);
            let mut h = harness(Config::default(), fake.clone(), true);
            if exists {
                h.put_claim(the_claim());
            }
            if before {
                h.ctx.records.set_in_progress(
                    "u1",
                    Some(crate::controller::records::InProgress::new(
                        Arc::new(the_claim()),
                        None,
                    )),
                );
            }
            let result = sync_claim(&h.ctx, "u1").await;
            assert_eq!(
                matches!(result, Ok(Outcome::Done)),
                ok,
                "case: {name}: {result:?}"
            );
            assert_eq!(h.ctx.records.is_in_progress("u1"), after, "case: {name}");
            assert_eq!(fake.provision_calls().len(), 1, "case: {name}");
        }
    }

    /// A claim the driver called infeasible waits without failing: the sync says so as an
    /// outcome, the claim is not counted as failing and keeps no in-progress mark.
    #[tokio::test(start_paused = true)]
    async fn an_infeasible_claim_waits_as_an_outcome_not_a_failure() {
        let fake = FakeProvisioner::new();
        let mut h = harness(Config::default(), fake.clone(), true);
        let claim = pvc("c")
            .uid("u1")
            .storage_class("fast")
            .provisioner(ME)
            .build();
        h.put_claim(claim);
        let fast = h.ctx.caches.class("fast");
        h.ctx.records.mark_infeasible("u1", fast.as_deref());
        tokio::time::advance(Duration::from_secs(60)).await;
        let got = sync_claim(&h.ctx, "u1").await;
        let Ok(Outcome::RequeueAfter { wait, why }) = got else {
            panic!("a wait, not {got:?}");
        };
        assert_eq!(why, Why::Infeasible);
        assert_eq!(wait, Duration::from_secs(240), "the rest of five minutes");
        assert!(fake.provision_calls().is_empty());
        assert!(!h.ctx.records.is_in_progress("u1"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_that_is_gone_and_not_in_progress_is_dropped() {
        let fake = FakeProvisioner::new();
        let h = harness(Config::default(), fake.clone(), true);
        assert_eq!(sync_claim(&h.ctx, "u1").await.ok(), Some(Outcome::Done));
        assert!(fake.provision_calls().is_empty());
    }

    /// A settled entry whose PV was saved (marked) and deleted while the volume watch
    /// relisted: the cache never heard of it, only the saved mark says it exists. The
    /// last sweep reads the PV, finds it gone, drops the mark, and the next sync cleans
    /// up and removes the entry (before: the sweep found no cached PV and kept the entry
    /// forever).
    #[tokio::test]
    async fn a_settled_entry_whose_pv_went_unseen_is_swept_and_removed() {
        let fake = FakeProvisioner::new();
        let (_sim, h) = sim_harness(Config::default(), fake.clone(), true).await;
        let journal = Arc::clone(h.ctx.journal.as_ref().unwrap());
        let committer = tokio::spawn(Arc::clone(&journal).run_committer());
        let now = crate::journal::now_secs();
        let entry = crate::journal::Entry {
            due: Some(now - 10),
            ..replicas::intent("00000000", 100)
        };
        journal.put("u1", entry, None).await.unwrap();
        h.ctx.caches.mark_saved("pvc-u1");
        // The sweep: the PV is not on the server either.
        assert_eq!(sync_claim(&h.ctx, "u1").await.ok(), Some(Outcome::Done));
        assert!(!h.ctx.caches.volume_exists("pvc-u1"), "the stale mark goes");
        assert!(journal.entry("u1").is_some(), "the cleanup decides, next");
        // The next sync: a settled entry whose PV is gone is cleaned up; no asset exists.
        assert_eq!(sync_claim(&h.ctx, "u1").await.ok(), Some(Outcome::Done));
        assert!(journal.entry("u1").is_none(), "the entry is removed");
        assert!(fake.assets().is_empty(), "the cleanup created nothing");
        committer.abort();
    }

    mod in_progress;
    mod panics;
    mod replicas;

    #[tokio::test]
    async fn a_failing_volume_is_retried_until_the_delete_threshold() {
        let fake = FakeProvisioner::new().script_delete(std::iter::repeat_n(DeleteStep::Fail, 10));
        let config = Config::default()
            .failed_delete_threshold(2)
            .failure_backoff(fast_backoff());
        let (sim, mut h) = sim_harness(config, fake.clone(), true).await;
        // The volume is read again before its asset is deleted: it must exist.
        let volumes: kube_client::Api<k8s_openapi::api::core::v1::PersistentVolume> =
            kube_client::Api::all(sim.client());
        let mut volume = crate::testing::pv("v")
            .phase("Released")
            .provisioned_by(ME)
            .build();
        let created = volumes.create(&Default::default(), &volume).await.unwrap();
        let status = serde_json::json!({"status": {"phase": "Released"}});
        volumes
            .patch_status(
                "v",
                &Default::default(),
                &kube_client::api::Patch::Merge(&status),
            )
            .await
            .unwrap();
        volume.metadata.uid = created.metadata.uid;
        h.volumes
            .apply_watcher_event(&watcher::Event::Apply(volume));
        h.ctx.volume_queue.add("v".into());
        let worker = tokio::spawn(volume_worker(Arc::clone(&h.ctx)));
        wait_for("three delete calls", || fake.delete_calls().len() >= 3).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        h.ctx.volume_queue.shut_down();
        worker.await.unwrap();
        assert_eq!(fake.delete_calls().len(), 3, "first try and two retries");
        assert_eq!(h.ctx.volume_queue.num_requeues("v"), 2);
    }

    /// Retries after 10 ms per failure, for tests on real time.
    fn fast_backoff() -> FailureBackoff {
        FailureBackoff::Custom(Arc::new(crate::ratelimit::ItemExponentialLimiter::new(
            Duration::from_millis(10),
            Duration::from_millis(10),
        )))
    }

    /// Polls `done` every 10 ms on real time, failing after 10 s.
    async fn wait_for(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
