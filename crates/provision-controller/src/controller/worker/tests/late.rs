//! The late-asset sweep in the volume flow: its per-process record stays bounded, and
//! the driver's `volume_saved` never fails or holds up a volume sync.

use k8s_openapi::{
    api::core::v1::PersistentVolume, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp,
};

use super::*;
use crate::{Provisioner, testing::pv};

const WINDOW: Duration = Duration::from_secs(60);

/// An Available PV we provisioned, created `age` ago: the volume flow makes no API call
/// for it (no finalizer to add, nothing to delete).
fn young(uid: &str, age: Duration) -> PersistentVolume {
    let mut v = pv("v").phase("Available").provisioned_by(ME).build();
    v.metadata.uid = Some(uid.to_owned());
    let created = Timestamp::now() - k8s_openapi::jiff::SignedDuration::try_from(age).unwrap();
    v.metadata.creation_timestamp = Some(Time(created));
    v
}

fn put(h: &mut Harness, volume: PersistentVolume) {
    h.volumes
        .apply_watcher_event(&watcher::Event::Apply(volume));
}

#[tokio::test]
async fn the_record_of_swept_volumes_forgets_deleted_volumes_and_ended_windows() {
    let fake = FakeProvisioner::new().with_late_asset_window(WINDOW);
    let mut h = harness(Config::default(), fake.clone(), true);
    let calls = || fake.volume_saved_calls().len();

    put(&mut h, young("u1", Duration::ZERO));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!(
        (calls(), h.ctx.late.len()),
        (1, 1),
        "first sync: swept, recorded"
    );
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!((calls(), h.ctx.late.len()), (1, 1), "later syncs wait");

    // Deleted: forgotten.
    h.volumes
        .apply_watcher_event(&watcher::Event::Delete(young("u1", Duration::ZERO)));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!(
        (calls(), h.ctx.late.len()),
        (1, 0),
        "a deleted PV is forgotten"
    );

    // Re-created under the same name: a new PV, swept anew.
    put(&mut h, young("u2", Duration::ZERO));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!((calls(), h.ctx.late.len()), (2, 1));

    // Being deleted: forgotten, no call.
    let mut deleting = young("u2", Duration::ZERO);
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    put(&mut h, deleting);
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!(
        (calls(), h.ctx.late.len()),
        (2, 0),
        "a PV being deleted is forgotten"
    );

    // The window ends: the last call, then the PV is forgotten and never swept again.
    put(&mut h, young("u3", Duration::ZERO));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!((calls(), h.ctx.late.len()), (3, 1));
    put(&mut h, young("u3", WINDOW + Duration::from_secs(1)));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!((calls(), h.ctx.late.len()), (4, 0), "the last sweep");
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!((calls(), h.ctx.late.len()), (4, 0), "never again");
}

#[tokio::test]
async fn a_resync_forgets_swept_volumes_that_left_the_cache_unseen() {
    let fake = FakeProvisioner::new().with_late_asset_window(WINDOW);
    let mut h = harness(Config::default(), fake.clone(), true);
    put(&mut h, young("u1", Duration::ZERO));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!(h.ctx.late.len(), 1);
    // Gone from the cache without a sync (e.g. across a relist).
    h.volumes
        .apply_watcher_event(&watcher::Event::Delete(young("u1", Duration::ZERO)));
    h.ctx.queue_everything();
    assert_eq!(h.ctx.late.len(), 0);
}

#[tokio::test]
async fn a_failing_volume_saved_fails_no_volume_sync() {
    let fake = FakeProvisioner::new()
        .with_late_asset_window(WINDOW)
        .script_volume_saved([DeleteStep::Fail, DeleteStep::Fail]);
    let mut h = harness(Config::default(), fake.clone(), true);
    put(&mut h, young("u1", Duration::ZERO));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    put(&mut h, young("u1", WINDOW + Duration::from_secs(1)));
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!(
        fake.volume_saved_calls().len(),
        2,
        "both sweeps ran and failed"
    );
    assert_eq!(h.ctx.volume_queue.num_requeues("v"), 0, "nothing retried");
}

/// A driver whose `volume_saved` never returns.
struct Hangs(FakeProvisioner);

#[async_trait::async_trait]
impl Provisioner for Hangs {
    async fn provision(
        &self,
        options: &crate::ProvisionOptions,
    ) -> Result<PersistentVolume, crate::ProvisionError> {
        self.0.provision(options).await
    }
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), crate::DeleteError> {
        self.0.delete(volume).await
    }
    async fn volume_saved(&self, saved: &PersistentVolume) -> Result<(), crate::DeleteError> {
        let _ = self.0.volume_saved(saved).await;
        std::future::pending().await
    }
    fn late_asset_window(&self) -> Option<Duration> {
        Some(WINDOW)
    }
}

#[tokio::test(start_paused = true)]
async fn a_hanging_volume_saved_is_cut_at_the_provision_timeout() {
    let fake = FakeProvisioner::new();
    let config = Config::default().provision_timeout(Some(Duration::from_secs(5)));
    let mut h = harness(config, fake.clone(), true);
    Arc::get_mut(&mut h.ctx)
        .expect("only the harness holds the context")
        .provisioner = Arc::new(Hangs(fake.clone()));
    put(&mut h, young("u1", Duration::ZERO));
    let start = Instant::now();
    volume::sync_volume(&h.ctx, "v").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(fake.volume_saved_calls().len(), 1);
}
