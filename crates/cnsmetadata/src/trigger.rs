//! Which watch events reconcile an object, across leadership terms (Go: the controller's
//! predicate `Funcs`): [`Triggers`] remembers per object what reconciles it, indexes
//! claims to the objects naming them, and hands objects to the current term's controller.

use std::{
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Mutex, MutexGuard},
};

use futures::channel::mpsc;
use kube_client::{Resource, ResourceExt};
use kube_runtime::{reflector::ObjectRef, watcher};

use crate::{backoff::PerObjectBackoff, related::ClaimKey, resource::CnsVolumeMetadata};

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

/// What is remembered of an object the watch holds.
#[derive(Clone, PartialEq, Eq)]
struct Seen {
    uid: Option<String>,
    /// [`trigger_hash`].
    hash: u64,
    /// The claims `spec.volumenames` names, in the object's namespace.
    claims: Vec<ClaimKey>,
}

impl Seen {
    fn of(object: &CnsVolumeMetadata) -> Self {
        let namespace = object.namespace().unwrap_or_default();
        let mut claims: Vec<ClaimKey> = object
            .spec
            .volume_names
            .iter()
            .map(|name| ObjectRef::new(name).within(&namespace))
            .collect();
        claims.sort_by(|a, b| a.name.cmp(&b.name));
        claims.dedup();
        Self {
            uid: object.metadata.uid.clone(),
            hash: trigger_hash(object),
            claims,
        }
    }
}

#[derive(Default)]
struct State {
    /// Every object the watch holds.
    seen: HashMap<Key, Seen>,
    /// The objects naming each claim (the reverse of `Seen::claims`).
    users: HashMap<ClaimKey, HashSet<Key>>,
    /// While the watch lists again (from `Init` to `InitDone`).
    relist: Option<Relist>,
    /// The controller of the current leadership term: objects that changed.
    subscriber: Option<mpsc::Sender<CnsVolumeMetadata>>,
    /// The same controller: objects whose claims or volumes changed.
    related: Option<mpsc::Sender<Key>>,
}

/// A list in progress. The reflector's store still holds the previous list until
/// `InitDone`, so a reconcile started earlier would not find an object created meanwhile:
/// the objects to reconcile wait for the end of the list.
#[derive(Default)]
struct Relist {
    listed: HashSet<Key>,
    changed: Vec<CnsVolumeMetadata>,
}

/// Objects to reconcile, and the queue of the term they go to.
pub(crate) type Triggered = (mpsc::Sender<CnsVolumeMetadata>, Vec<CnsVolumeMetadata>);

/// Objects to reconcile because a claim or volume they use changed, and the queue of the
/// term they go to.
pub(crate) type RelatedTriggered = (mpsc::Sender<Key>, Vec<Key>);

/// The queues of one leadership term.
pub(crate) struct Term {
    /// Objects created or changed.
    pub(crate) objects: mpsc::Receiver<CnsVolumeMetadata>,
    /// Objects whose claims or volumes changed.
    pub(crate) related: mpsc::Receiver<Key>,
}

/// Per-object trigger state and the current term's queue; see the module docs.
#[derive(Default)]
pub(crate) struct Triggers {
    state: Mutex<State>,
}

impl Triggers {
    fn state(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// Starts a term: the objects to reconcile from now on go to the returned queues.
    pub(crate) fn subscribe(&self) -> Term {
        let (sender, objects) = mpsc::channel(QUEUE);
        let (related_sender, related) = mpsc::channel(QUEUE);
        let mut state = self.state();
        state.subscriber = Some(sender);
        state.related = Some(related_sender);
        Term { objects, related }
    }

    /// Ends the term: events are only remembered until the next one.
    pub(crate) fn unsubscribe(&self) {
        let mut state = self.state();
        state.subscriber = None;
        state.related = None;
    }

    /// Number of objects whose trigger state is kept.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.state().seen.len()
    }

    /// Whether a term is running.
    #[cfg(test)]
    pub(crate) fn in_term(&self) -> bool {
        self.state().subscriber.is_some()
    }

    /// Number of claims in the index of users.
    #[cfg(test)]
    pub(crate) fn indexed_claims(&self) -> usize {
        self.state().users.len()
    }

    /// The objects naming any of `claims`, with the queue to send them to, when a term is
    /// running and there are some. A lookup per claim in the index: no scan.
    pub(crate) fn users_of(&self, claims: &[ClaimKey]) -> Option<RelatedTriggered> {
        let state = self.state();
        let queue = state.related.clone()?;
        let mut users: Vec<Key> = Vec::new();
        for claim in claims {
            for user in state.users.get(claim).into_iter().flatten() {
                if !users.contains(user) {
                    users.push(user.clone());
                }
            }
        }
        (!users.is_empty()).then_some((queue, users))
    }

    /// Records one watch event; deleted objects (and objects a relist no longer shows)
    /// are forgotten here and in `backoff`. Returns the objects to reconcile with the
    /// queue to send them to, when a term is running and the event triggers reconciles.
    pub(crate) fn observe(
        &self,
        event: &watcher::Event<CnsVolumeMetadata>,
        backoff: &PerObjectBackoff,
    ) -> Option<Triggered> {
        let mut state = self.state();
        let changed = match event {
            watcher::Event::Apply(object) => state.changed(object).then(|| vec![object.clone()]),
            watcher::Event::InitApply(object) => {
                let changed = state.changed(object);
                if let Some(relist) = state.relist.as_mut() {
                    relist.listed.insert(ObjectRef::from_obj(object));
                    if changed {
                        relist.changed.push(object.clone());
                    }
                }
                None
            }
            watcher::Event::Delete(object) => {
                let key = ObjectRef::from_obj(object);
                state.forget(&key);
                backoff.reset(&key);
                None
            }
            watcher::Event::Init => {
                state.relist = Some(Relist::default());
                None
            }
            watcher::Event::InitDone => state.relist.take().map(|relist| {
                let gone: Vec<Key> = state
                    .seen
                    .keys()
                    .filter(|key| !relist.listed.contains(key))
                    .cloned()
                    .collect();
                for key in &gone {
                    state.forget(key);
                }
                backoff.retain(|key| relist.listed.contains(key));
                relist.changed
            }),
        };
        let changed = changed.filter(|c| !c.is_empty())?;
        Some((state.subscriber.clone()?, changed))
    }
}

impl State {
    /// Remembers what reconciles `object` and the claims it names; whether what reconciles
    /// it changed.
    fn changed(&mut self, object: &CnsVolumeMetadata) -> bool {
        let key = ObjectRef::from_obj(object);
        let now = Seen::of(object);
        let before = self.seen.insert(key.clone(), now.clone());
        if before.as_ref().map(|b| &b.claims) != Some(&now.claims) {
            if let Some(before) = &before {
                self.unindex(&key, &before.claims);
            }
            for claim in &now.claims {
                self.users
                    .entry(claim.clone())
                    .or_default()
                    .insert(key.clone());
            }
        }
        before.is_none_or(|b| b.uid != now.uid || b.hash != now.hash)
    }

    /// Forgets a deleted object.
    fn forget(&mut self, key: &Key) {
        if let Some(before) = self.seen.remove(key) {
            self.unindex(key, &before.claims);
        }
    }

    fn unindex(&mut self, key: &Key, claims: &[ClaimKey]) {
        for claim in claims {
            if let Some(users) = self.users.get_mut(claim) {
                users.remove(key);
                if users.is_empty() {
                    self.users.remove(claim);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{resource::FINALIZER, testing::pvc_spec};
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
        let mut queue = triggers.subscribe().objects;
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
        assert_eq!(sent, vec![renamed.clone()]);
        futures::SinkExt::send(&mut sender, renamed.clone())
            .await
            .unwrap();
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
    fn objects_changed_during_a_relist_are_reconciled_once_it_is_complete() {
        let triggers = Triggers::default();
        let backoff = PerObjectBackoff::default();
        let a = object("gc-1-a", "u1");
        triggers.observe(&watcher::Event::Apply(a.clone()), &backoff);
        let _queue = triggers.subscribe();
        let b = object("gc-1-b", "u2");
        let mut a_edited = a.clone();
        a_edited.spec.entity_name = "edited".into();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(a_edited.clone()),
            watcher::Event::InitApply(b.clone()),
        ] {
            assert!(triggers.observe(&event, &backoff).is_none());
        }
        let (_, changed) = triggers
            .observe(&watcher::Event::InitDone, &backoff)
            .expect("the changes of the list");
        assert_eq!(changed, vec![a_edited.clone(), b.clone()]);
        // Listing again what is known triggers nothing.
        for event in [watcher::Event::Init, watcher::Event::InitApply(b)] {
            assert!(triggers.observe(&event, &backoff).is_none());
        }
        assert!(
            triggers
                .observe(&watcher::Event::InitDone, &backoff)
                .is_none()
        );
        assert_eq!(triggers.tracked(), 1, "a was not listed again");
    }

    #[test]
    fn claims_map_to_the_objects_naming_them_while_a_term_runs() {
        let triggers = Triggers::default();
        let backoff = PerObjectBackoff::default();
        let claim = |name: &str| ObjectRef::new(name).within("tenant");
        let mut a = object("gc-1-a", "u1");
        a.spec.volume_names = vec!["vol-1".into(), "vol-2".into()];
        let mut b = object("gc-1-b", "u2");
        b.spec.volume_names = vec!["vol-2".into()];
        let mut elsewhere = b.clone();
        elsewhere.metadata.namespace = Some("team-a".into());
        for object in [&a, &b, &elsewhere] {
            triggers.observe(&watcher::Event::Apply(object.clone()), &backoff);
        }
        assert!(
            triggers.users_of(&[claim("vol-2")]).is_none(),
            "no term: nothing to send"
        );
        let term = triggers.subscribe();
        let users = |claims: &[ClaimKey]| {
            let mut users = triggers
                .users_of(claims)
                .map(|(_, u)| u)
                .unwrap_or_default();
            users.sort_by(|x, y| x.name.cmp(&y.name));
            users
        };
        let (key_a, key_b) = (ObjectRef::from_obj(&a), ObjectRef::from_obj(&b));
        assert_eq!(users(&[claim("vol-1")]), vec![key_a.clone()]);
        assert_eq!(
            users(&[claim("vol-2"), claim("vol-1")]),
            [key_a.clone(), key_b.clone()]
        );
        assert!(users(&[claim("vol-3")]).is_empty());

        // A spec edit moves the object in the index; a deletion removes it.
        let mut edited = a.clone();
        edited.spec.volume_names = vec!["vol-3".into()];
        triggers.observe(&watcher::Event::Apply(edited.clone()), &backoff);
        assert!(users(&[claim("vol-1")]).is_empty());
        assert_eq!(users(&[claim("vol-3")]), [key_a]);
        triggers.observe(&watcher::Event::Delete(edited), &backoff);
        triggers.observe(&watcher::Event::Delete(b), &backoff);
        assert!(users(&[claim("vol-3"), claim("vol-2")]).is_empty());
        assert_eq!(triggers.indexed_claims(), 1, "only team-a/vol-2 is left");
        drop(term);
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
        assert_eq!(triggers.indexed_claims(), 1, "b's claim only");
        assert_eq!(backoff.len(), 1);
        assert_eq!(
            backoff.peek(&ObjectRef::from_obj(&a)),
            PerObjectBackoff::DEFAULT_INITIAL
        );
    }
}
