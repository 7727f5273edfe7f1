//! The PV binder against the sim: provisioner annotations, binding, release.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_runtime::wait::await_condition;
use kube_sim::{FaultRule, KubeSim, Verb};
use serde_json::json;

const PROVISIONER: &str = "example.com/csi";
const ANN_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_BETA_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";

async fn sim() -> KubeSim {
    KubeSim::builder().pv_binder(true).start().await.unwrap()
}

async fn create_class(sim: &KubeSim, name: &str, binding_mode: &str) {
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": PROVISIONER,
        "volumeBindingMode": binding_mode,
    }))
    .unwrap();
    let api = Api::<StorageClass>::all(sim.client());
    api.create(&PostParams::default(), &class).await.unwrap();
}

async fn create_claim(sim: &KubeSim, name: &str, class: &str) -> PersistentVolumeClaim {
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "storageClassName": class,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    claims(sim)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap()
}

async fn create_volume(sim: &KubeSim, name: &str, claim_ref: Option<serde_json::Value>) {
    let mut spec = json!({
        "capacity": {"storage": "2Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Delete",
        "storageClassName": "fast",
        "csi": {"driver": PROVISIONER, "volumeHandle": format!("handle-{name}")},
    });
    if let Some(claim_ref) = claim_ref {
        spec["claimRef"] = claim_ref;
    }
    let volume: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    volumes(sim)
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
}

/// Creates a volume whose claimRef names the claim `claim` with its `uid`, with reclaim
/// policy `policy` and the volume annotations `annotations`.
async fn create_volume_for(
    sim: &KubeSim,
    name: &str,
    claim: &str,
    uid: &str,
    policy: &str,
    annotations: serde_json::Value,
) {
    let volume: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": policy,
            "csi": {"driver": PROVISIONER, "volumeHandle": format!("handle-{name}")},
            "claimRef": {"namespace": "default", "name": claim, "uid": uid},
        },
    }))
    .unwrap();
    volumes(sim)
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
}

fn claims(sim: &KubeSim) -> Api<PersistentVolumeClaim> {
    Api::namespaced(sim.client(), "default")
}

fn volumes(sim: &KubeSim) -> Api<PersistentVolume> {
    Api::all(sim.client())
}

/// Waits (bounded, so a broken binder fails instead of hanging) until `cond` holds.
async fn wait_for<K, F>(api: Api<K>, name: &str, what: &str, cond: F) -> K
where
    K: kube_client::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    F: Fn(&K) -> bool + Send + 'static,
{
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        await_condition(api.clone(), name, move |obj: Option<&K>| {
            obj.is_some_and(&cond)
        }),
    )
    .await;
    match waited {
        Ok(Ok(Some(obj))) => obj,
        other => {
            let now = api.get_opt(name).await.unwrap();
            panic!("{name}: never {what} ({other:?}); now {now:#?}")
        }
    }
}

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn claim_phase(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref()?.phase.as_deref()
}

fn volume_phase(volume: &PersistentVolume) -> Option<&str> {
    volume.status.as_ref()?.phase.as_deref()
}

#[tokio::test]
async fn claim_is_annotated_bound_and_its_volume_released() {
    let sim = sim().await;
    create_class(&sim, "fast", "Immediate").await;
    let claim = create_claim(&sim, "claim-1", "fast").await;

    let annotated = wait_for(claims(&sim), "claim-1", "annotated", |c| {
        annotation(c, ANN_PROVISIONER).is_some()
    })
    .await;
    assert_eq!(annotation(&annotated, ANN_PROVISIONER), Some(PROVISIONER));
    assert_eq!(
        annotation(&annotated, ANN_BETA_PROVISIONER),
        Some(PROVISIONER)
    );
    assert_eq!(claim_phase(&annotated), Some("Pending"));

    let uid = claim.metadata.uid.clone().unwrap();
    let claim_ref = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": "default", "name": "claim-1", "uid": uid});
    create_volume(&sim, "pv-1", Some(claim_ref)).await;

    let bound = wait_for(claims(&sim), "claim-1", "bound", |c| {
        claim_phase(c) == Some("Bound")
    })
    .await;
    let spec = bound.spec.as_ref().unwrap();
    assert_eq!(spec.volume_name.as_deref(), Some("pv-1"));
    assert_eq!(
        annotation(&bound, "pv.kubernetes.io/bind-completed"),
        Some("yes")
    );
    assert_eq!(
        annotation(&bound, "pv.kubernetes.io/bound-by-controller"),
        Some("yes")
    );
    let status = bound.status.as_ref().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["storage"].0, "2Gi");
    assert_eq!(
        status.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_owned()][..])
    );
    let volume = wait_for(volumes(&sim), "pv-1", "bound", |v| {
        volume_phase(v) == Some("Bound")
    })
    .await;
    assert_eq!(volume_phase(&volume), Some("Bound"));

    claims(&sim)
        .delete("claim-1", &DeleteParams::default())
        .await
        .unwrap();
    let released = wait_for(volumes(&sim), "pv-1", "released", |v| {
        volume_phase(v) == Some("Released")
    })
    .await;
    let kept = released.spec.unwrap().claim_ref.unwrap();
    assert_eq!(kept.name.as_deref(), Some("claim-1"));
    assert_eq!(kept.uid.as_deref(), Some(uid.as_str()));
}

#[tokio::test]
async fn wait_for_first_consumer_claim_is_annotated_only_after_node_selection() {
    let sim = sim().await;
    create_class(&sim, "late", "WaitForFirstConsumer").await;
    create_class(&sim, "now", "Immediate").await;
    create_claim(&sim, "waiting", "late").await;
    // The binder sees claims in order; once the later claim is annotated, it has long decided
    // about the first one.
    create_claim(&sim, "marker", "now").await;
    wait_for(claims(&sim), "marker", "annotated", |c| {
        annotation(c, ANN_PROVISIONER).is_some()
    })
    .await;
    let waiting = claims(&sim).get("waiting").await.unwrap();
    assert_eq!(annotation(&waiting, ANN_PROVISIONER), None);
    assert_eq!(annotation(&waiting, ANN_BETA_PROVISIONER), None);

    let selected = json!({"metadata": {"annotations": {
        "volume.kubernetes.io/selected-node": "node-1"}}});
    claims(&sim)
        .patch("waiting", &PatchParams::default(), &Patch::Merge(selected))
        .await
        .unwrap();
    let annotated = wait_for(claims(&sim), "waiting", "annotated", |c| {
        annotation(c, ANN_PROVISIONER).is_some()
    })
    .await;
    assert_eq!(
        annotation(&annotated, ANN_BETA_PROVISIONER),
        Some(PROVISIONER)
    );
}

#[tokio::test]
async fn pre_bound_volume_gets_claim_uid_and_is_released_later() {
    let sim = sim().await;
    // Volume first, naming a claim that does not exist yet and no uid.
    let claim_ref = json!({"namespace": "default", "name": "static"});
    create_volume(&sim, "pv-static", Some(claim_ref)).await;
    wait_for(volumes(&sim), "pv-static", "available", |v| {
        volume_phase(v) == Some("Available")
    })
    .await;

    let claim = create_claim(&sim, "static", "fast").await;
    let bound = wait_for(claims(&sim), "static", "bound", |c| {
        claim_phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("pv-static")
    );
    let volume = wait_for(volumes(&sim), "pv-static", "bound", |v| {
        volume_phase(v) == Some("Bound")
    })
    .await;
    let claim_ref = volume.spec.unwrap().claim_ref.unwrap();
    assert_eq!(claim_ref.uid, claim.metadata.uid);
    // No class named "fast" exists, so the binder never asked for provisioning.
    assert_eq!(annotation(&bound, ANN_PROVISIONER), None);

    claims(&sim)
        .delete("static", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(volumes(&sim), "pv-static", "released", |v| {
        volume_phase(v) == Some("Released")
    })
    .await;
}

// kube-controller-manager: a volume made for a claim that got bound to another volume is
// released when it was dynamically provisioned with reclaim policy Delete (its provisioner
// then deletes it), and unbound otherwise.
#[tokio::test]
async fn volumes_of_a_claim_bound_elsewhere_are_released_or_unbound() {
    let sim = sim().await;
    // No class "manual" exists: nothing provisions the claim.
    let claim = create_claim(&sim, "data", "manual").await;
    let uid = claim.metadata.uid.unwrap();
    create_volume(
        &sim,
        "pv-static",
        Some(json!({"namespace": "default", "name": "data"})),
    )
    .await;
    wait_for(claims(&sim), "data", "bound", |c| {
        claim_phase(c) == Some("Bound")
    })
    .await;

    let dynamic = json!({"pv.kubernetes.io/provisioned-by": PROVISIONER});
    create_volume_for(&sim, "pv-dynamic", "data", &uid, "Delete", dynamic.clone()).await;
    create_volume_for(&sim, "pv-retained", "data", &uid, "Retain", dynamic).await;
    let by_controller = json!({"pv.kubernetes.io/bound-by-controller": "yes"});
    create_volume_for(
        &sim,
        "pv-bound-by-us",
        "data",
        &uid,
        "Delete",
        by_controller,
    )
    .await;

    let released = wait_for(volumes(&sim), "pv-dynamic", "released", |v| {
        volume_phase(v) == Some("Released")
    })
    .await;
    let kept = released.spec.unwrap().claim_ref.unwrap();
    assert_eq!(kept.uid.as_deref(), Some(uid.as_str()), "claimRef kept");

    let retained = wait_for(volumes(&sim), "pv-retained", "available", |v| {
        volume_phase(v) == Some("Available")
    })
    .await;
    let reserved = retained.spec.unwrap().claim_ref.unwrap();
    assert_eq!(
        (reserved.name.as_deref(), reserved.uid),
        (Some("data"), None),
        "only the uid is removed from a claimRef the creator set"
    );

    let unbound = wait_for(volumes(&sim), "pv-bound-by-us", "available", |v| {
        volume_phase(v) == Some("Available")
    })
    .await;
    assert!(unbound.spec.unwrap().claim_ref.is_none());
    assert!(
        !unbound
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("pv.kubernetes.io/bound-by-controller")
    );

    let data = claims(&sim).get("data").await.unwrap();
    assert_eq!(
        data.spec.unwrap().volume_name.as_deref(),
        Some("pv-static"),
        "the claim stays bound to its volume"
    );
}

// A PV whose deletion waits for a finalizer is still released when its claim goes.
#[tokio::test]
async fn a_volume_being_deleted_is_released_when_its_claim_is_gone() {
    let sim = sim().await;
    let claim = create_claim(&sim, "data", "manual").await;
    let uid = claim.metadata.uid.unwrap();
    let mut volume: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-1", "finalizers": ["example.com/keep"]},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "csi": {"driver": PROVISIONER, "volumeHandle": "handle-1"},
            "claimRef": {"namespace": "default", "name": "data", "uid": uid},
        },
    }))
    .unwrap();
    volume = volumes(&sim)
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
    wait_for(volumes(&sim), "pv-1", "bound", |v| {
        volume_phase(v) == Some("Bound")
    })
    .await;
    volumes(&sim)
        .delete("pv-1", &DeleteParams::default())
        .await
        .unwrap();
    claims(&sim)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let released = wait_for(volumes(&sim), "pv-1", "released", |v| {
        volume_phase(v) == Some("Released")
    })
    .await;
    assert!(released.metadata.deletion_timestamp.is_some());
    assert_eq!(released.metadata.uid, volume.metadata.uid);
}

#[tokio::test]
async fn volume_without_claim_ref_becomes_available() {
    let sim = sim().await;
    create_volume(&sim, "pv-free", None).await;
    let volume = wait_for(volumes(&sim), "pv-free", "available", |v| {
        volume_phase(v) == Some("Available")
    })
    .await;
    assert!(volume.spec.unwrap().claim_ref.is_none());
}

#[tokio::test]
async fn binder_writes_nothing_once_settled() {
    let sim = sim().await;
    create_class(&sim, "fast", "Immediate").await;
    let claim = create_claim(&sim, "quiet", "fast").await;
    let claim_ref = json!({"namespace": "default", "name": "quiet",
        "uid": claim.metadata.uid.clone().unwrap()});
    create_volume(&sim, "pv-quiet", Some(claim_ref)).await;
    wait_for(claims(&sim), "quiet", "bound", |c| {
        claim_phase(c) == Some("Bound")
    })
    .await;
    wait_for(volumes(&sim), "pv-quiet", "bound", |v| {
        volume_phase(v) == Some("Bound")
    })
    .await;

    // A change the binder does not care about must not trigger writes of its own.
    sim.clear_requests();
    let label = json!({"metadata": {"labels": {"touched": "yes"}}});
    claims(&sim)
        .patch("quiet", &PatchParams::default(), &Patch::Merge(label))
        .await
        .unwrap();
    // A later marker write that the binder must act on proves it has processed the label.
    create_volume(&sim, "pv-marker", None).await;
    wait_for(volumes(&sim), "pv-marker", "available", |v| {
        volume_phase(v) == Some("Available")
    })
    .await;
    let writes: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .filter(|r| r.name.as_deref() == Some("quiet"))
        .collect();
    assert_eq!(
        writes.len(),
        1,
        "only the test's own label patch: {writes:#?}"
    );
}

#[tokio::test]
async fn failed_writes_are_retried_until_bound() {
    let sim = sim().await;
    sim.add_fault(
        FaultRule::new(Verb::Patch, "persistentvolumes")
            .subresource("status")
            .times(2)
            .status(409, "Conflict"),
    );
    sim.add_fault(
        FaultRule::new(Verb::Patch, "persistentvolumeclaims")
            .subresource("status")
            .times(1)
            .status(500, "InternalError"),
    );
    let claim = create_claim(&sim, "flaky", "none").await;
    let claim_ref = json!({"namespace": "default", "name": "flaky",
        "uid": claim.metadata.uid.clone().unwrap()});
    create_volume(&sim, "pv-flaky", Some(claim_ref)).await;
    wait_for(claims(&sim), "flaky", "bound", |c| {
        claim_phase(c) == Some("Bound")
    })
    .await;
    wait_for(volumes(&sim), "pv-flaky", "bound", |v| {
        volume_phase(v) == Some("Bound")
    })
    .await;
    let failed: Vec<u16> = sim
        .requests()
        .into_iter()
        .filter(|r| r.verb == "patch" && r.subresource.as_deref() == Some("status"))
        .map(|r| r.status)
        .filter(|status| *status >= 400)
        .collect();
    assert_eq!(
        failed,
        vec![409, 409, 500],
        "every injected fault was hit and retried"
    );
}

#[tokio::test]
async fn binder_keeps_working_after_cut_watches_and_compaction() {
    let sim = sim().await;
    create_class(&sim, "fast", "Immediate").await;
    let claim = create_claim(&sim, "before-cut", "fast").await;
    let claim_ref = json!({"namespace": "default", "name": "before-cut",
        "uid": claim.metadata.uid.clone().unwrap()});
    create_volume(&sim, "pv-cut", Some(claim_ref)).await;
    wait_for(claims(&sim), "before-cut", "bound", |c| {
        claim_phase(c) == Some("Bound")
    })
    .await;

    // The binder's watches end and their resourceVersions expire: it must relist.
    sim.compact();
    sim.cut_watches();
    claims(&sim)
        .delete("before-cut", &DeleteParams::default())
        .await
        .unwrap();
    create_claim(&sim, "after-cut", "fast").await;

    wait_for(volumes(&sim), "pv-cut", "released", |v| {
        volume_phase(v) == Some("Released")
    })
    .await;
    let annotated = wait_for(claims(&sim), "after-cut", "annotated", |c| {
        annotation(c, ANN_PROVISIONER).is_some()
    })
    .await;
    assert_eq!(
        annotation(&annotated, ANN_BETA_PROVISIONER),
        Some(PROVISIONER)
    );
}

fn finalizers<K: kube_client::Resource>(object: &K) -> Vec<String> {
    object.meta().finalizers.clone().unwrap_or_default()
}

/// As on a real cluster: a claim and a PV get their protection finalizers at creation (the
/// admission plugin); a deleted claim is Terminating until the binder (kube-controller-
/// manager) removes the claim's, and a deleted PV stays while it is Bound.
#[tokio::test]
async fn protection_finalizers_are_added_at_creation_and_removed_as_kcm_does() {
    let sim = sim().await;
    create_class(&sim, "fast", "Immediate").await;
    let claim = create_claim(&sim, "kept", "fast").await;
    assert_eq!(finalizers(&claim), ["kubernetes.io/pvc-protection"]);
    let uid = claim.metadata.uid.clone().unwrap();
    create_volume_for(&sim, "pv-kept", "kept", &uid, "Delete", json!({})).await;
    let volume = volumes(&sim).get("pv-kept").await.unwrap();
    assert_eq!(finalizers(&volume), ["kubernetes.io/pv-protection"]);
    wait_for(volumes(&sim), "pv-kept", "bound", |v| {
        volume_phase(v) == Some("Bound")
    })
    .await;

    // A Bound PV being deleted stays (Terminating) while its claim is there.
    volumes(&sim)
        .delete("pv-kept", &DeleteParams::default())
        .await
        .unwrap();
    // The claim, held by a finalizer of another controller too, is Terminating and keeps
    // that one: only the protection finalizer goes.
    let hold =
        json!({"metadata": {"finalizers": ["kubernetes.io/pvc-protection", "example.com/hold"]}});
    claims(&sim)
        .patch("kept", &PatchParams::default(), &Patch::Merge(hold))
        .await
        .unwrap();
    let deleted = claims(&sim)
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        deleted
            .left()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        "a deleted claim is Terminating first"
    );
    let held = wait_for(claims(&sim), "kept", "unprotected", |c| {
        finalizers(c) == ["example.com/hold"]
    })
    .await;
    assert!(held.metadata.deletion_timestamp.is_some());
    let still = volumes(&sim).get("pv-kept").await.unwrap();
    assert_eq!(volume_phase(&still), Some("Bound"));
    assert_eq!(finalizers(&still), ["kubernetes.io/pv-protection"]);

    // The claim goes; the PV is released, then its protection goes and the PV with it.
    let release = json!({"metadata": {"finalizers": null}});
    claims(&sim)
        .patch("kept", &PatchParams::default(), &Patch::Merge(release))
        .await
        .unwrap();
    let gone = await_condition(volumes(&sim), "pv-kept", |v: Option<&PersistentVolume>| {
        v.is_none()
    });
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the released PV loses its protection and goes")
        .unwrap();
}

/// `protection_finalizers(false)` keeps the old sim: a deleted claim vanishes at once.
#[tokio::test]
async fn protection_finalizers_can_be_switched_off() {
    let sim = KubeSim::builder()
        .pv_binder(true)
        .protection_finalizers(false)
        .start()
        .await
        .unwrap();
    let claim = create_claim(&sim, "plain", "fast").await;
    assert!(finalizers(&claim).is_empty());
    claims(&sim)
        .delete("plain", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        claims(&sim).get_opt("plain").await.unwrap().is_none(),
        "deleted at once"
    );
    // Without the binder they are off by default too.
    let bare = KubeSim::start().await.unwrap();
    assert!(finalizers(&create_claim(&bare, "plain", "fast").await).is_empty());
}

/// Someone removes a protection finalizer from a claim or a PV that is not being deleted:
/// it is put back, as kube-controller-manager's protection controllers do. With protection
/// finalizers on and the binder off, those controllers run alone: no annotation, and a
/// deleted claim still goes.
#[tokio::test]
async fn a_removed_protection_finalizer_is_put_back_also_without_the_binder() {
    let sim = KubeSim::builder()
        .protection_finalizers(true)
        .start()
        .await
        .unwrap();
    create_class(&sim, "fast", "Immediate").await;
    let claim = create_claim(&sim, "c", "fast").await;
    assert_eq!(finalizers(&claim), ["kubernetes.io/pvc-protection"]);
    create_volume(&sim, "pv-free", None).await;
    let strip = json!({"metadata": {"finalizers": ["example.com/mine"]}});
    claims(&sim)
        .patch("c", &PatchParams::default(), &Patch::Merge(strip.clone()))
        .await
        .unwrap();
    volumes(&sim)
        .patch("pv-free", &PatchParams::default(), &Patch::Merge(strip))
        .await
        .unwrap();
    let back = wait_for(claims(&sim), "c", "protected again", |c| {
        finalizers(c) == ["example.com/mine", "kubernetes.io/pvc-protection"]
    })
    .await;
    assert_eq!(annotation(&back, ANN_PROVISIONER), None, "no binder");
    wait_for(volumes(&sim), "pv-free", "protected again", |v| {
        finalizers(v) == ["example.com/mine", "kubernetes.io/pv-protection"]
    })
    .await;
    // Being deleted, the protection goes (and is not put back); the claim waits for ours.
    claims(&sim)
        .delete("c", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(claims(&sim), "c", "unprotected", |c| {
        finalizers(c) == ["example.com/mine"]
    })
    .await;
    let release = json!({"metadata": {"finalizers": null}});
    claims(&sim)
        .patch("c", &PatchParams::default(), &Patch::Merge(release))
        .await
        .unwrap();
    assert!(claims(&sim).get_opt("c").await.unwrap().is_none());
}
