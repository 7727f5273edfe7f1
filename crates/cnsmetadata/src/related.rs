//! Which supervisor claim and volume events may change what a volume name resolves to
//! ([`Related`]): a claim that appears, binds or goes; a PV that appears, changes driver,
//! handle or `claimRef`, or goes. [`Triggers`](crate::trigger) maps those claims to the
//! objects naming them. No Go equivalent: see docs/architecture.md.

use std::{
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Mutex, MutexGuard},
};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube_client::{Resource, ResourceExt};
use kube_runtime::{reflector::ObjectRef, watcher};

/// A supervisor claim, by namespace and name.
pub(crate) type ClaimKey = ObjectRef<PersistentVolumeClaim>;

/// What of one claim or PV matters to the resolution of claims.
#[derive(Clone, Debug, PartialEq, Eq)]
struct View {
    /// Hash of the fields the resolution reads (and of the UID).
    hash: u64,
    /// The claim the object concerns: the claim itself, or the PV's `claimRef`.
    claim: Option<ClaimKey>,
    /// For a claim, the PV its `spec.volumeName` names.
    volume_name: Option<String>,
}

fn hash_of(value: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

fn non_empty(text: Option<&String>) -> Option<String> {
    text.filter(|t| !t.is_empty()).cloned()
}

fn claim_view(claim: &PersistentVolumeClaim) -> View {
    let volume_name = non_empty(claim.spec.as_ref().and_then(|s| s.volume_name.as_ref()));
    View {
        hash: hash_of((&claim.metadata.uid, &volume_name)),
        claim: Some(ObjectRef::from_obj(claim)),
        volume_name,
    }
}

fn volume_view(volume: &PersistentVolume) -> View {
    let spec = volume.spec.as_ref();
    let csi = spec
        .and_then(|s| s.csi.as_ref())
        .map(|c| (&c.driver, &c.volume_handle));
    let claim = spec.and_then(|s| s.claim_ref.as_ref()).and_then(|r| {
        let name = non_empty(r.name.as_ref())?;
        let namespace = r.namespace.clone().unwrap_or_default();
        Some(ObjectRef::new(&name).within(&namespace))
    });
    View {
        hash: hash_of((&volume.metadata.uid, csi, &claim)),
        claim,
        volume_name: None,
    }
}

/// The last view of every object of one cache, and the relist in progress.
struct Tracked<K: Resource<DynamicType = ()>> {
    seen: HashMap<ObjectRef<K>, View>,
    /// While the watch lists again: the objects listed, and the changes seen. The
    /// reflector's store holds the previous list until `InitDone`, so a reconcile started
    /// earlier would read it: the changes wait for the end of the list.
    relist: Option<(HashSet<ObjectRef<K>>, Vec<Change>)>,
}

impl<K: Resource<DynamicType = ()>> Default for Tracked<K> {
    fn default() -> Self {
        Self {
            seen: HashMap::new(),
            relist: None,
        }
    }
}

/// One object whose view changed: its name, and its view before and after (`None`: absent).
struct Change {
    name: String,
    before: Option<View>,
    after: Option<View>,
}

impl<K: Resource<DynamicType = ()> + Clone> Tracked<K> {
    /// Records `object`'s view; the change, if it is one.
    fn apply(&mut self, object: &K, view: View) -> Option<Change> {
        let before = self.seen.insert(ObjectRef::from_obj(object), view.clone());
        (before.as_ref() != Some(&view)).then(|| Change {
            name: object.name_any(),
            before,
            after: Some(view),
        })
    }

    /// Forgets `key`; the change, if it was known.
    fn remove(&mut self, key: &ObjectRef<K>) -> Option<Change> {
        self.seen.remove(key).map(|before| Change {
            name: key.name.clone(),
            before: Some(before),
            after: None,
        })
    }

    /// The changes `event` makes visible in the store now.
    fn observe(&mut self, event: &watcher::Event<K>, view: impl Fn(&K) -> View) -> Vec<Change> {
        match event {
            watcher::Event::Apply(object) => self.apply(object, view(object)).into_iter().collect(),
            watcher::Event::Delete(object) => self
                .remove(&ObjectRef::from_obj(object))
                .into_iter()
                .collect(),
            watcher::Event::Init => {
                self.relist = Some((HashSet::new(), Vec::new()));
                Vec::new()
            }
            watcher::Event::InitApply(object) => {
                let change = self.apply(object, view(object));
                if let Some((listed, changes)) = self.relist.as_mut() {
                    listed.insert(ObjectRef::from_obj(object));
                    changes.extend(change);
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                let Some((listed, mut changes)) = self.relist.take() else {
                    return Vec::new();
                };
                let gone: Vec<ObjectRef<K>> = self
                    .seen
                    .keys()
                    .filter(|key| !listed.contains(key))
                    .cloned()
                    .collect();
                changes.extend(gone.iter().filter_map(|key| self.remove(key)));
                changes
            }
        }
    }
}

#[derive(Default)]
struct State {
    claims: Tracked<PersistentVolumeClaim>,
    volumes: Tracked<PersistentVolume>,
    /// The claims whose `spec.volumeName` names each PV.
    claims_of_volume: HashMap<String, HashSet<ClaimKey>>,
}

/// Tracks the caches of claims and volumes; see the module docs.
#[derive(Default)]
pub(crate) struct Related {
    state: Mutex<State>,
}

impl Related {
    fn state(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// Records one event of the claims cache; the claims whose resolution may have changed.
    pub(crate) fn observe_claim(
        &self,
        event: &watcher::Event<PersistentVolumeClaim>,
    ) -> Vec<ClaimKey> {
        let mut state = self.state();
        let changes = state.claims.observe(event, claim_view);
        let mut concerned = Vec::new();
        for change in changes {
            for (view, add) in [(&change.before, false), (&change.after, true)] {
                let Some(View {
                    claim: Some(claim),
                    volume_name,
                    ..
                }) = view
                else {
                    continue;
                };
                if let Some(volume) = volume_name {
                    index(&mut state.claims_of_volume, volume, claim, add);
                }
                concerned.push(claim.clone());
            }
        }
        dedup(concerned)
    }

    /// Records one event of the volumes cache; the claims whose resolution may have changed.
    pub(crate) fn observe_volume(&self, event: &watcher::Event<PersistentVolume>) -> Vec<ClaimKey> {
        let mut state = self.state();
        let changes = state.volumes.observe(event, volume_view);
        let mut concerned = Vec::new();
        for change in changes {
            let views = [&change.before, &change.after];
            concerned.extend(views.into_iter().flatten().filter_map(|v| v.claim.clone()));
            if let Some(claims) = state.claims_of_volume.get(&change.name) {
                concerned.extend(claims.iter().cloned());
            }
        }
        dedup(concerned)
    }

    /// Number of claims and volumes tracked, and of PV names in the index.
    #[cfg(test)]
    fn tracked(&self) -> (usize, usize, usize) {
        let state = self.state();
        (
            state.claims.seen.len(),
            state.volumes.seen.len(),
            state.claims_of_volume.len(),
        )
    }
}

/// Adds `claim` to (or removes it from) the claims naming `volume`.
fn index(
    claims_of_volume: &mut HashMap<String, HashSet<ClaimKey>>,
    volume: &str,
    claim: &ClaimKey,
    add: bool,
) {
    if add {
        claims_of_volume
            .entry(volume.to_owned())
            .or_default()
            .insert(claim.clone());
    } else if let Some(claims) = claims_of_volume.get_mut(volume) {
        claims.remove(claim);
        if claims.is_empty() {
            claims_of_volume.remove(volume);
        }
    }
}

fn dedup(mut claims: Vec<ClaimKey>) -> Vec<ClaimKey> {
    let mut seen = HashSet::new();
    claims.retain(|c| seen.insert(c.clone()));
    claims
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{bound_claim, csi_volume};
    use k8s_openapi::api::core::v1::ObjectReference;

    fn claim(name: &str, volume: &str, uid: &str) -> PersistentVolumeClaim {
        let mut claim = bound_claim("tenant", name, volume);
        claim.metadata.uid = Some(uid.into());
        claim
    }

    fn volume(name: &str, handle: &str, claim: Option<&str>) -> PersistentVolume {
        let mut volume = csi_volume(name, crate::VSPHERE_CSI_DRIVER, handle);
        volume.metadata.uid = Some(format!("uid-{name}"));
        if let Some(spec) = volume.spec.as_mut() {
            spec.claim_ref = claim.map(|c| ObjectReference {
                namespace: Some("tenant".into()),
                name: Some(c.into()),
                ..ObjectReference::default()
            });
        }
        volume
    }

    fn key(name: &str) -> ClaimKey {
        ObjectRef::new(name).within("tenant")
    }

    #[test]
    fn a_claim_concerns_itself_when_it_appears_binds_or_goes_but_not_on_status_changes() {
        let related = Related::default();
        let unbound = claim("a", "", "u1");
        let apply = |c: &PersistentVolumeClaim| watcher::Event::Apply(c.clone());
        assert_eq!(related.observe_claim(&apply(&unbound)), [key("a")]);
        assert!(related.observe_claim(&apply(&unbound)).is_empty());
        let mut status = unbound.clone();
        status.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        status.metadata.resource_version = Some("7".into());
        assert!(related.observe_claim(&apply(&status)).is_empty());
        let bound = claim("a", "pv-a", "u1");
        assert_eq!(related.observe_claim(&apply(&bound)), [key("a")]);
        assert_eq!(related.tracked(), (1, 0, 1));
        assert_eq!(
            related.observe_claim(&watcher::Event::Delete(bound)),
            [key("a")]
        );
        assert_eq!(
            related.tracked(),
            (0, 0, 0),
            "nothing kept for a deleted claim"
        );
    }

    #[test]
    fn a_volume_concerns_its_claim_ref_and_the_claims_naming_it() {
        let related = Related::default();
        // Pre-bound from the claim side: the PV has no claimRef yet.
        related.observe_claim(&watcher::Event::Apply(claim("a", "pv-a", "u1")));
        let apply = |v: &PersistentVolume| watcher::Event::Apply(v.clone());
        assert_eq!(
            related.observe_volume(&apply(&volume("pv-a", "fcd-a", None))),
            [key("a")]
        );
        // The binder fills the claimRef: no resolution changes, but the claimRef is tracked.
        assert_eq!(
            related.observe_volume(&apply(&volume("pv-a", "fcd-a", Some("a")))),
            [key("a")]
        );
        assert!(
            related
                .observe_volume(&apply(&volume("pv-a", "fcd-a", Some("a"))))
                .is_empty()
        );
        // A PV bound to b, no claim naming it yet.
        assert_eq!(
            related.observe_volume(&apply(&volume("pv-b", "fcd-b", Some("b")))),
            [key("b")]
        );
        let mut rehandled = volume("pv-b", "fcd-b2", Some("b"));
        rehandled.metadata.resource_version = Some("9".into());
        assert_eq!(related.observe_volume(&apply(&rehandled)), [key("b")]);
        assert_eq!(
            related.observe_volume(&watcher::Event::Delete(rehandled)),
            [key("b")]
        );
        assert_eq!(related.tracked(), (1, 1, 1));
    }

    #[test]
    fn a_relist_reports_changes_and_disappearances_once_complete() {
        let related = Related::default();
        for name in ["a", "b"] {
            related.observe_claim(&watcher::Event::Apply(claim(name, "", name)));
        }
        let bound = claim("a", "pv-a", "a");
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(bound),
            watcher::Event::InitApply(claim("c", "", "c")),
        ] {
            assert!(related.observe_claim(&event).is_empty(), "{event:?}");
        }
        let mut concerned = related.observe_claim(&watcher::Event::InitDone);
        concerned.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(concerned, [key("a"), key("b"), key("c")]);
        assert_eq!(related.tracked(), (2, 0, 1));
    }
}
