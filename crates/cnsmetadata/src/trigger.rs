//! Which watch events reconcile an object, across leadership terms (Go: the controller's
//! predicate `Funcs`).
//!
//! The watch of `CnsVolumeMetadata` objects runs for the whole life of the reconciler,
//! leader or not, so a standby is warm. [`Triggers`] sees every event, remembers per object
//! what reconciles it (and forgets deleted objects at once, unlike kube's
//! `predicate_filter`, which keeps entries for an hour), and hands the objects to reconcile
//! to the controller of the current leadership term, if there is one.

use std::{
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Mutex, MutexGuard},
};

use futures::channel::mpsc;
use kube_client::{Resource, ResourceExt};
use kube_runtime::{reflector::ObjectRef, watcher};

use crate::{backoff::PerObjectBackoff, resource::CnsVolumeMetadata};

/// Objects waiting for the term's controller; the watch waits when it is full.
const QUEUE: usize = 1024;

type Key = ObjectRef<CnsVolumeMetadata>;

/// What reconciles an object: its creation (and every object once at start), a change of
/// spec or finalizers, and the start of its deletion; status and annotation writes do not.
pub(crate) fn trigger_hash(object: &CnsVolumeMetadata) -> u64 {
    let mut hasher = DefaultHasher::new();
    object.spec.hash(&mut hasher);
    object.finalizers().hash(&mut hasher);
    object.meta().deletion_timestamp.is_some().hash(&mut hasher);
    hasher.finish()
}

#[derive(Default)]
struct State {
    /// UID and trigger hash of every object the watch holds.
    seen: HashMap<Key, (Option<String>, u64)>,
    /// Objects listed since the watch restarted (`Init`), until the list is complete.
    relisted: Option<HashSet<Key>>,
    /// The controller of the current leadership term.
    subscriber: Option<mpsc::Sender<CnsVolumeMetadata>>,
}

/// Per-object trigger state and the current term's queue; see the module docs.
#[derive(Default)]
pub(crate) struct Triggers {
    state: Mutex<State>,
}

impl Triggers {
    fn state(&self) -> MutexGuard<'_, State> {
        // Plain maps: a panic elsewhere cannot leave them inconsistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a term: the objects to reconcile from now on go to the returned queue.
    pub(crate) fn subscribe(&self) -> mpsc::Receiver<CnsVolumeMetadata> {
        let (sender, receiver) = mpsc::channel(QUEUE);
        self.state().subscriber = Some(sender);
        receiver
    }

    /// Ends the term: events are only remembered until the next one.
    pub(crate) fn unsubscribe(&self) {
        self.state().subscriber = None;
    }

    /// Number of objects whose trigger state is kept.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.state().seen.len()
    }

    /// Records one watch event; deleted objects (and objects a relist no longer shows)
    /// are forgotten here and in `backoff`. Returns the object to reconcile with the queue
    /// to send it to, when a term is running and the event triggers a reconcile.
    pub(crate) fn observe(
        &self,
        event: &watcher::Event<CnsVolumeMetadata>,
        backoff: &PerObjectBackoff,
    ) -> Option<(mpsc::Sender<CnsVolumeMetadata>, CnsVolumeMetadata)> {
        let mut state = self.state();
        match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let key = ObjectRef::from_obj(object);
                if let (watcher::Event::InitApply(_), Some(relisted)) =
                    (event, state.relisted.as_mut())
                {
                    relisted.insert(key.clone());
                }
                let now = (object.metadata.uid.clone(), trigger_hash(object));
                if state.seen.insert(key, now.clone()).as_ref() == Some(&now) {
                    return None;
                }
                let sender = state.subscriber.clone()?;
                Some((sender, object.clone()))
            }
            watcher::Event::Delete(object) => {
                let key = ObjectRef::from_obj(object);
                state.seen.remove(&key);
                backoff.reset(&key);
                None
            }
            watcher::Event::Init => {
                state.relisted = Some(HashSet::new());
                None
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = state.relisted.take() {
                    state.seen.retain(|key, _| relisted.contains(key));
                    backoff.retain(|key| relisted.contains(key));
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{reconciler::FINALIZER, testing::pvc_spec};
    use futures::StreamExt;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn object(name: &str, uid: &str) -> CnsVolumeMetadata {
        let mut object = CnsVolumeMetadata::new(name, pvc_spec());
        object.metadata.namespace = Some("tenant".into());
        object.metadata.uid = Some(uid.into());
        object
    }

    #[test]
    fn status_changes_do_not_trigger_but_spec_finalizers_and_deletion_do() {
        let base = object("gc-1-a", "u1");
        let mut status_only = base.clone();
        status_only
            .status
            .volume_status
            .push(crate::resource::VolumeStatus::updated("x"));
        status_only.metadata.resource_version = Some("99".into());
        status_only
            .annotations_mut()
            .insert("cns.vmware.com/pushed-entities".into(), "[]".into());
        assert_eq!(trigger_hash(&base), trigger_hash(&status_only));

        let mut spec = base.clone();
        spec.spec.entity_name = "other".into();
        let mut finalized = base.clone();
        finalized.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let mut deleting = finalized.clone();
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        for changed in [&spec, &finalized] {
            assert_ne!(trigger_hash(&base), trigger_hash(changed));
        }
        assert_ne!(trigger_hash(&finalized), trigger_hash(&deleting));
    }

    #[tokio::test]
    async fn only_changes_reach_the_current_term_and_deletes_are_forgotten() {
        let triggers = Triggers::default();
        let backoff = PerObjectBackoff::default();
        let a = object("gc-1-a", "u1");
        // No term: remembered, not sent.
        assert!(
            triggers
                .observe(&watcher::Event::Apply(a.clone()), &backoff)
                .is_none()
        );
        let mut queue = triggers.subscribe();
        assert!(
            triggers
                .observe(&watcher::Event::Apply(a.clone()), &backoff)
                .is_none(),
            "unchanged"
        );
        let mut renamed = a.clone();
        renamed.spec.entity_name = "renamed".into();
        let (mut sender, sent) = triggers
            .observe(&watcher::Event::Apply(renamed.clone()), &backoff)
            .expect("a spec change triggers");
        futures::SinkExt::send(&mut sender, sent).await.unwrap();
        assert_eq!(queue.next().await, Some(renamed.clone()));
        // Same name and spec, another object (new UID): triggers.
        let recreated = object("gc-1-a", "u2");
        assert!(
            triggers
                .observe(&watcher::Event::Apply(recreated), &backoff)
                .is_some()
        );

        backoff.next_delay(&ObjectRef::from_obj(&a));
        triggers.observe(&watcher::Event::Delete(renamed), &backoff);
        assert_eq!(triggers.tracked(), 0);
        assert!(backoff.is_empty());
        triggers.unsubscribe();
        assert!(
            triggers
                .observe(&watcher::Event::Apply(object("gc-1-b", "u3")), &backoff)
                .is_none(),
            "the term ended"
        );
    }

    #[test]
    fn a_relist_forgets_objects_deleted_while_the_watch_was_down() {
        let triggers = Triggers::default();
        let backoff = PerObjectBackoff::default();
        let (a, b) = (object("gc-1-a", "u1"), object("gc-1-b", "u2"));
        for object in [&a, &b] {
            triggers.observe(&watcher::Event::Apply(object.clone()), &backoff);
            backoff.next_delay(&ObjectRef::from_obj(object));
        }
        triggers.observe(&watcher::Event::Init, &backoff);
        triggers.observe(&watcher::Event::InitApply(b.clone()), &backoff);
        assert_eq!(triggers.tracked(), 2, "kept until the list is complete");
        triggers.observe(&watcher::Event::InitDone, &backoff);
        assert_eq!(triggers.tracked(), 1);
        assert_eq!(backoff.len(), 1);
        assert_eq!(
            backoff.peek(&ObjectRef::from_obj(&a)),
            PerObjectBackoff::DEFAULT_INITIAL
        );
    }
}
