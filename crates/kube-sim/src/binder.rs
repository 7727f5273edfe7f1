//! The PV binder: the part of kube-controller-manager's persistent-volume controller that
//! external provisioners rely on, run as a client-side controller against the sim.
//!
//! It watches StorageClasses, PersistentVolumeClaims and PersistentVolumes, keeps them in
//! its own cache (see [`plan`]) and reacts to each change with at most the writes needed:
//!
//! - a pending claim whose `spec.storageClassName` names a class with a provisioner gets the
//!   `volume.kubernetes.io/storage-provisioner` and `volume.beta.kubernetes.io/storage-provisioner`
//!   annotations (for `WaitForFirstConsumer` classes only once the claim carries
//!   `volume.kubernetes.io/selected-node`);
//! - a PV whose `spec.claimRef` names an existing claim (and its uid, when set) is bound: the PV
//!   becomes `Bound` (and its claimRef gets the claim's uid), the claim gets `spec.volumeName`,
//!   `pv.kubernetes.io/bind-completed`, `pv.kubernetes.io/bound-by-controller` (when the binder
//!   set the volume name), and a `Bound` status with the PV's capacity and access modes --
//!   only when the PV fits the claim, as kube-controller-manager checks before binding:
//!   a `spec.capacity.storage` at least the claim's storage request (compared exactly, with
//!   [`kube_controller_kit::quantity`]), the same volume mode, all the claim's access modes,
//!   and, when the claim names the PV in `spec.volumeName`, the same storage class. A PV that
//!   does not fit is left as it is and the claim to its provisioner; a claim already bound
//!   (`pv.kubernetes.io/bind-completed`) keeps its PV;
//! - a PV without claimRef becomes `Available`;
//! - a PV whose claim (by uid) is gone becomes `Released`; the claimRef stays;
//! - a PV whose claim (by uid) is bound to another PV becomes `Released` when it was
//!   dynamically provisioned (`pv.kubernetes.io/provisioned-by`) with reclaim policy `Delete`,
//!   so its provisioner deletes it; any other such PV is unbound and becomes `Available` (its
//!   claimRef is removed when `pv.kubernetes.io/bound-by-controller` says the controller set
//!   it, else only the claimRef's uid, as kube-controller-manager does);
//! - a PV being deleted is still released as above (a provisioner's finalizer may wait for
//!   that), but never bound, unbound or made `Available`;
//! - the protection finalizers (kube-controller-manager's pvc-protection and pv-protection
//!   controllers): `kubernetes.io/pvc-protection` goes from a claim being deleted (no pod
//!   uses it: the sim has no pods), `kubernetes.io/pv-protection` from a PV being deleted
//!   that is not `Bound`; each with a merge patch carrying the resourceVersion it was
//!   planned on, so no other writer's finalizer is dropped. The sim adds them at creation
//!   ([`Builder::protection_finalizers`](crate::Builder::protection_finalizers)), and then
//!   the binder puts one back, as those controllers do, when someone removes it from an
//!   object that is not being deleted. With protection finalizers on and the binder off,
//!   the binder runs for these finalizers alone.
//!
//! # Caveats
//! - Claims without `spec.storageClassName` are left alone: the default StorageClass
//!   (`storageclass.kubernetes.io/is-default-class`) is not applied.
//! - Binding is driven by the PV's claimRef only: the binder never picks a matching PV for a
//!   claim, and never binds a PV named by a claim's `spec.volumeName` that lacks a claimRef.
//!   Label selectors and node affinity are not checked.
//! - Claims whose PV disappears are not marked `Lost`, and reclaim policies are not acted on
//!   (deleting a `Released` PV is its provisioner's job; `Recycle` is not simulated).
//! - Writes are JSON merge patches without resourceVersion preconditions; a failed write
//!   (a 409 or any other error but 404) is retried with a per-object backoff from 50 ms to 5 s,
//!   and every new event for the object re-evaluates it at once.

mod plan;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_client::api::{Api, Patch, PatchParams};
use kube_client::{Client, ResourceExt};
use kube_runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, warn};

pub(crate) use self::plan::Modes;
use self::plan::{Action, BindPlan, Cache, ClaimKey, Key};

/// Writes in flight at once; more pending work waits in the queue.
const MAX_IN_FLIGHT: usize = 32;
/// First retry delay after a failed write; doubles per failure up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// Longest retry delay after failed writes.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// One item of the merged watch streams.
enum Message {
    Class(Box<Result<watcher::Event<StorageClass>, watcher::Error>>),
    Claim(Box<Result<watcher::Event<PersistentVolumeClaim>, watcher::Error>>),
    Volume(Box<Result<watcher::Event<PersistentVolume>, watcher::Error>>),
}

/// An object a finished write returned, to be folded into the cache.
enum Written {
    Claim(Box<PersistentVolumeClaim>),
    Volume(Box<PersistentVolume>),
}

impl Written {
    fn claim(claim: PersistentVolumeClaim) -> Self {
        Self::Claim(Box::new(claim))
    }

    fn volume(volume: PersistentVolume) -> Self {
        Self::Volume(Box::new(volume))
    }
}

/// Runs the binder, playing what `modes` asks of kube-controller-manager, until its task
/// is aborted.
pub(crate) async fn run(client: Client, modes: Modes) {
    let config = watcher::Config::default();
    let classes = watcher(Api::<StorageClass>::all(client.clone()), config.clone())
        .default_backoff()
        .map(|event| Message::Class(Box::new(event)));
    let claims = watcher(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        config.clone(),
    )
    .default_backoff()
    .map(|event| Message::Claim(Box::new(event)));
    let volumes = watcher(Api::<PersistentVolume>::all(client.clone()), config)
        .default_backoff()
        .map(|event| Message::Volume(Box::new(event)));
    let mut events: BoxStream<'static, Message> =
        futures::stream::select_all([classes.boxed(), claims.boxed(), volumes.boxed()]).boxed();

    let mut binder = Binder::new(client, modes);
    loop {
        let next_retry = binder.retries.first().map(|(at, _)| *at);
        tokio::select! {
            message = events.next() => match message {
                Some(message) => binder.on_message(message),
                None => return,
            },
            Some(done) = binder.tasks.join_next(), if !binder.tasks.is_empty() => {
                match done {
                    Ok((key, result)) => binder.on_done(key, result),
                    Err(error) => warn!(%error, "pv binder write task failed"),
                }
            }
            () = sleep_until_or_never(next_retry) => binder.fire_retries(),
        }
        binder.dispatch();
    }
}

fn watch_failed(error: &watcher::Error, resource: &str) -> Vec<Key> {
    warn!(%error, resource, "pv binder watch failed; retrying");
    Vec::new()
}

async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The binder's state: cache, work queue, writes in flight, retries.
struct Binder {
    client: Client,
    cache: Cache,
    /// Watch streams that have delivered their initial list: classes, claims, volumes.
    synced: [bool; 3],
    queue: VecDeque<Key>,
    queued: BTreeSet<Key>,
    in_flight: BTreeSet<Key>,
    /// Keys that changed while their write was running.
    dirty_in_flight: BTreeSet<Key>,
    tasks: JoinSet<(Key, Result<Vec<Written>, kube_client::Error>)>,
    retries: BTreeSet<(Instant, Key)>,
    backoff: HashMap<Key, Duration>,
}

impl Binder {
    fn new(client: Client, modes: Modes) -> Self {
        Self {
            client,
            cache: Cache::new(modes),
            synced: [false; 3],
            queue: VecDeque::new(),
            queued: BTreeSet::new(),
            in_flight: BTreeSet::new(),
            dirty_in_flight: BTreeSet::new(),
            tasks: JoinSet::new(),
            retries: BTreeSet::new(),
            backoff: HashMap::new(),
        }
    }

    fn enqueue(&mut self, keys: impl IntoIterator<Item = Key>) {
        for key in keys {
            if self.queued.insert(key.clone()) {
                self.queue.push_back(key);
            }
        }
    }

    fn on_message(&mut self, message: Message) {
        let dirty = match message {
            Message::Class(event) => match *event {
                Ok(event) => self.on_class(event),
                Err(error) => watch_failed(&error, "storageclasses"),
            },
            Message::Claim(event) => match *event {
                Ok(event) => self.on_claim(event),
                Err(error) => watch_failed(&error, "persistentvolumeclaims"),
            },
            Message::Volume(event) => match *event {
                Ok(event) => self.on_volume(event),
                Err(error) => watch_failed(&error, "persistentvolumes"),
            },
        };
        self.enqueue(dirty);
    }

    fn on_class(&mut self, event: watcher::Event<StorageClass>) -> Vec<Key> {
        use watcher::Event;
        match event {
            Event::Apply(class) => self.cache.apply_class(&class),
            Event::Delete(class) => self.cache.delete_class(&class.name_any()),
            Event::Init => self.cache.begin_classes(),
            Event::InitApply(class) => self.cache.stage_class(&class),
            Event::InitDone => {
                self.synced[0] = true;
                self.cache.finish_classes()
            }
        }
    }

    fn on_claim(&mut self, event: watcher::Event<PersistentVolumeClaim>) -> Vec<Key> {
        use watcher::Event;
        match event {
            Event::Apply(claim) => self.cache.apply_claim(claim),
            Event::Delete(claim) => self.cache.delete_claim(&claim),
            Event::Init => self.cache.begin_claims(),
            Event::InitApply(claim) => self.cache.stage_claim(claim),
            Event::InitDone => {
                self.synced[1] = true;
                self.cache.finish_claims()
            }
        }
    }

    fn on_volume(&mut self, event: watcher::Event<PersistentVolume>) -> Vec<Key> {
        use watcher::Event;
        match event {
            Event::Apply(volume) => self.cache.apply_volume(volume),
            Event::Delete(volume) => self.cache.delete_volume(&volume),
            Event::Init => self.cache.begin_volumes(),
            Event::InitApply(volume) => self.cache.stage_volume(volume),
            Event::InitDone => {
                self.synced[2] = true;
                self.cache.finish_volumes()
            }
        }
    }

    fn on_done(&mut self, key: Key, result: Result<Vec<Written>, kube_client::Error>) {
        self.in_flight.remove(&key);
        if self.dirty_in_flight.remove(&key) {
            self.enqueue([key.clone()]);
        }
        match result {
            Ok(written) => {
                self.backoff.remove(&key);
                let mut dirty = Vec::new();
                for object in written {
                    dirty.extend(match object {
                        Written::Claim(claim) => self.cache.apply_claim(*claim),
                        Written::Volume(volume) => self.cache.apply_volume(*volume),
                    });
                }
                self.enqueue(dirty);
            }
            Err(kube_client::Error::Api(status)) if status.code == 404 => {
                debug!(
                    ?key,
                    "pv binder target is gone; waiting for its delete event"
                );
                self.backoff.remove(&key);
            }
            Err(error) => {
                let delay = self
                    .backoff
                    .get(&key)
                    .map_or(FIRST_RETRY, |previous| (*previous * 2).min(MAX_RETRY));
                warn!(?key, %error, ?delay, "pv binder write failed; retrying");
                self.backoff.insert(key.clone(), delay);
                self.retries.insert((Instant::now() + delay, key));
            }
        }
    }

    fn fire_retries(&mut self) {
        let now = Instant::now();
        while let Some(first) = self.retries.first() {
            if first.0 > now {
                break;
            }
            let (_, key) = self.retries.pop_first().expect("first() returned an entry");
            self.enqueue([key]);
        }
    }

    /// Plans queued keys and starts their writes, up to [`MAX_IN_FLIGHT`].
    fn dispatch(&mut self) {
        if self.synced.contains(&false) {
            return;
        }
        while self.tasks.len() < MAX_IN_FLIGHT {
            let Some(key) = self.queue.pop_front() else {
                break;
            };
            self.queued.remove(&key);
            if self.in_flight.contains(&key) {
                // Planned again when the running write finishes.
                self.dirty_in_flight.insert(key);
                continue;
            }
            let Some(action) = self.cache.plan(&key) else {
                continue;
            };
            self.in_flight.insert(key.clone());
            let client = self.client.clone();
            self.tasks
                .spawn(async move { (key, execute(client, action).await) });
        }
    }
}

/// Performs one planned action and returns the objects it wrote or read.
async fn execute(client: Client, action: Action) -> Result<Vec<Written>, kube_client::Error> {
    let params = PatchParams::default();
    match action {
        Action::AnnotateClaim { claim, provisioner } => {
            debug!(claim = %claim, %provisioner, "annotating claim with its provisioner");
            let patch = json!({"metadata": {"annotations": {
                plan::ANN_STORAGE_PROVISIONER: provisioner,
                plan::ANN_BETA_STORAGE_PROVISIONER: provisioner,
            }}});
            let api = claims(&client, &claim);
            Ok(vec![Written::claim(
                api.patch(&claim.name, &params, &Patch::Merge(patch))
                    .await?,
            )])
        }
        Action::SetVolumePhase { volume, phase } => {
            debug!(pv = %volume, phase, "setting volume phase");
            let patch = json!({"status": {"phase": phase}});
            let api = Api::<PersistentVolume>::all(client);
            Ok(vec![Written::volume(
                api.patch_status(&volume, &params, &Patch::Merge(patch))
                    .await?,
            )])
        }
        Action::ReleaseIfGone { volume, claim, uid } => {
            // The cache may not have seen a claim created just before its volume, so ask the
            // server before releasing anything.
            if let Some(found) = claims(&client, &claim).get_opt(&claim.name).await?
                && found.uid().as_deref() == Some(uid.as_str())
            {
                return Ok(vec![Written::claim(found)]);
            }
            debug!(pv = %volume, claim = %claim, "claim is gone; releasing volume");
            let patch = json!({"status": {"phase": "Released"}});
            let api = Api::<PersistentVolume>::all(client);
            Ok(vec![Written::volume(
                api.patch_status(&volume, &params, &Patch::Merge(patch))
                    .await?,
            )])
        }
        Action::Bind(bind) => bind_volume(client, *bind).await,
        Action::RemoveProtection(unprotect) | Action::AddProtection(unprotect) => {
            let plan::Unprotect {
                key,
                finalizers,
                resource_version,
            } = *unprotect;
            debug!(?key, ?finalizers, "setting the protection finalizer");
            let patch = Patch::Merge(json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": resource_version,
            }}));
            // Without finalizers left, the object is gone once written: its delete event
            // (which may come first) is what the cache folds in.
            let gone = finalizers.is_empty();
            let written = match key {
                Key::Claim(claim) => Written::claim(
                    claims(&client, &claim)
                        .patch(&claim.name, &params, &patch)
                        .await?,
                ),
                Key::Volume(volume) => Written::volume(
                    Api::<PersistentVolume>::all(client)
                        .patch(&volume, &params, &patch)
                        .await?,
                ),
            };
            Ok(if gone { Vec::new() } else { vec![written] })
        }
        Action::Unbind {
            volume,
            clear_claim_ref,
        } => {
            debug!(pv = %volume, clear_claim_ref, "claim is bound to another volume; unbinding volume");
            let patch = if clear_claim_ref {
                json!({
                    "metadata": {"annotations": {plan::ANN_BOUND_BY_CONTROLLER: null}},
                    "spec": {"claimRef": null},
                })
            } else {
                json!({"spec": {"claimRef": {"uid": null}}})
            };
            let api = Api::<PersistentVolume>::all(client);
            let unbound = api.patch(&volume, &params, &Patch::Merge(patch)).await?;
            let status = json!({"status": {"phase": "Available"}});
            let available = api
                .patch_status(&volume, &params, &Patch::Merge(status))
                .await?;
            Ok(vec![Written::volume(unbound), Written::volume(available)])
        }
    }
}

async fn bind_volume(client: Client, bind: BindPlan) -> Result<Vec<Written>, kube_client::Error> {
    debug!(pv = %bind.volume, claim = %bind.claim, "binding volume to claim");
    let params = PatchParams::default();
    let volumes = Api::<PersistentVolume>::all(client.clone());
    let claim_api = claims(&client, &bind.claim);
    let mut written = Vec::new();
    if let Some(uid) = bind.claim_uid_for_volume {
        let patch = json!({"spec": {"claimRef": {"uid": uid}}});
        written.push(Written::volume(
            volumes
                .patch(&bind.volume, &params, &Patch::Merge(patch))
                .await?,
        ));
    }
    if bind.volume_phase {
        let patch = json!({"status": {"phase": "Bound"}});
        written.push(Written::volume(
            volumes
                .patch_status(&bind.volume, &params, &Patch::Merge(patch))
                .await?,
        ));
    }
    if let Some(patch) = bind.claim_patch {
        written.push(Written::claim(
            claim_api
                .patch(&bind.claim.name, &params, &Patch::Merge(patch))
                .await?,
        ));
    }
    if let Some(patch) = bind.claim_status_patch {
        written.push(Written::claim(
            claim_api
                .patch_status(&bind.claim.name, &params, &Patch::Merge(patch))
                .await?,
        ));
    }
    Ok(written)
}

fn claims(client: &Client, claim: &ClaimKey) -> Api<PersistentVolumeClaim> {
    Api::namespaced(client.clone(), &claim.namespace)
}
