//! Carrying out the schedule: one task per claim chain, and the global steps.

use std::sync::Arc;
use std::time::Duration;

use kube_client::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use vsphere_cns::simulator::SimFault;

use super::checks::read_journal;
use super::faults;
use super::names;
use super::objects;
use super::schedule::{Action, BAD_SIZE, CnsSite, Step};
use super::world::{ClaimRecord, MetadataRecord, Shared, World, is_not_found, retry};

/// Runs one claim's steps in order, each at its time or (when the previous one took
/// longer) right after it.
pub async fn run_chain(shared: Arc<Shared>, claim: usize, steps: Vec<Step>) {
    for step in steps {
        tokio::time::sleep_until(shared.started + step.at).await;
        claim_action(&shared, claim, &step.action).await;
    }
}

fn describe<T>(result: &kube_client::Result<T>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(kube_client::Error::Api(s)) => {
            format!("failed: {} {}: {}", s.code, s.reason, s.message)
        }
        Err(e) => format!("failed: {e}"),
    }
}

/// The claim's record.
fn record(shared: &Shared, claim: usize) -> ClaimRecord {
    shared
        .records()
        .claims
        .get(&claim)
        .cloned()
        .unwrap_or_default()
}

/// The name of the PV the claim is bound to, waiting up to 2 s for the binding.
async fn bound_volume(shared: &Shared, name: &str) -> Option<String> {
    for _ in 0..20 {
        if let Ok(Some(claim)) = shared.claims().get_opt(name).await
            && let Some(volume) = claim.spec.and_then(|s| s.volume_name)
            && !volume.is_empty()
        {
            return Some(volume);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

async fn claim_action(shared: &Shared, claim: usize, action: &Action) {
    let name = names::claim(claim);
    let line = match action {
        Action::CreateClaim { class, size, node } => {
            let object = objects::claim(&name, class, size, *node);
            let result = retry(|| async {
                match shared
                    .claims()
                    .create(&PostParams::default(), &object)
                    .await
                {
                    // A create answered with an error after it was carried out.
                    Err(kube_client::Error::Api(s)) if s.reason == "AlreadyExists" => {
                        shared.claims().get(&name).await
                    }
                    other => other,
                }
            })
            .await;
            let line = describe(&result);
            let now = shared.now();
            let mut records = shared.records();
            let entry = records.claims.entry(claim).or_default();
            entry.name.clone_from(&name);
            (*class).clone_into(&mut entry.class);
            if let Ok(created) = result {
                entry.uid = created.metadata.uid;
                entry.created_at = Some(now);
            }
            line
        }
        _ if record(shared, claim).uid.is_none() => "skipped: the claim was not created".to_owned(),
        Action::DeleteClaim { .. } => {
            let result = retry(|| async {
                shared
                    .claims()
                    .delete(&name, &DeleteParams::default())
                    .await
            })
            .await;
            if (result.is_ok() || is_not_found(&result))
                && let Some(entry) = shared.records().claims.get_mut(&claim)
            {
                entry.deleted = true;
            }
            describe(&result)
        }
        // The only finalizer a claim carries is kube-controller-manager's protection (the
        // controller puts none of its own on claims); anything else stays, so that a
        // finalizer a controller should not have written is not hidden by the strip.
        Action::StripFinalizers => {
            let result = retry(|| async {
                let current = shared.claims().get(&name).await?;
                let kept: Vec<&String> = current
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .filter(|f| *f != PVC_PROTECTION)
                    .collect();
                // With the resourceVersion read: a concurrent change is a 409, retried.
                let patch = Patch::Merge(json!({"metadata": {
                    "finalizers": kept,
                    "resourceVersion": current.metadata.resource_version,
                }}));
                shared
                    .claims()
                    .patch(&name, &PatchParams::default(), &patch)
                    .await
            })
            .await;
            if result.is_ok() || is_not_found(&result) {
                let now = shared.now();
                if let Some(entry) = shared.records().claims.get_mut(&claim) {
                    entry.stripped_at = Some(now);
                }
            }
            describe(&result)
        }
        // A switch to Retain is the user's "keep it" before the claim is deleted; one after
        // the deletion races the reclaim of a PV already being released (a claim deleted
        // mid-provisioning stays bound, Terminating, until its cleanup ends), for which no
        // promise holds: such a switch is not made.
        Action::RetainVolume if record(shared, claim).deleted => {
            "skipped: the claim was deleted".to_owned()
        }
        Action::RetainVolume => match bound_volume(shared, &name).await {
            None => "skipped: the claim is not bound".to_owned(),
            Some(volume) => {
                let patch =
                    Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}}));
                let result = retry(|| async {
                    shared
                        .volumes()
                        .patch(&volume, &PatchParams::default(), &patch)
                        .await
                })
                .await;
                if result.is_ok()
                    && let Some(entry) = shared.records().claims.get_mut(&claim)
                {
                    entry.retained_pv = Some(volume.clone());
                }
                format!("{volume}: {}", describe(&result))
            }
        },
        Action::BindStatic => bind_static(shared, claim, &name).await,
        Action::DuplicateVolume => duplicate(shared, claim, &name).await,
        Action::CreateMetadata {
            object,
            entity,
            valid,
        } => {
            let spec = objects::metadata_spec(object, &name, *entity, 0, *valid);
            let created = objects::metadata(object, spec);
            let result = retry(|| async {
                shared
                    .metadata()
                    .create(&PostParams::default(), &created)
                    .await
            })
            .await;
            if result.is_ok() {
                shared.records().metadata.insert(
                    object.clone(),
                    MetadataRecord {
                        claim,
                        entity: *entity,
                        valid: *valid,
                        deleted: false,
                    },
                );
            }
            describe(&result)
        }
        Action::EditMetadata {
            object,
            valid,
            revision,
        } => {
            let Some(entity) = shared.records().metadata.get(object).map(|m| m.entity) else {
                return shared.log(format!("{name}: {action}: skipped, not created"));
            };
            let spec = objects::metadata_spec(object, &name, entity, *revision, *valid);
            let result = retry(|| async {
                let mut current = shared.metadata().get(object).await?;
                current.spec = spec.clone();
                shared
                    .metadata()
                    .replace(object, &PostParams::default(), &current)
                    .await
            })
            .await;
            if result.is_ok()
                && let Some(entry) = shared.records().metadata.get_mut(object)
            {
                entry.valid = *valid;
            }
            describe(&result)
        }
        Action::DeleteMetadata { object } => {
            let result = retry(|| async {
                shared
                    .metadata()
                    .delete(object, &DeleteParams::default())
                    .await
            })
            .await;
            if (result.is_ok() || is_not_found(&result))
                && let Some(entry) = shared.records().metadata.get_mut(object)
            {
                entry.deleted = true;
            }
            describe(&result)
        }
        other => format!("not a claim action: {other}"),
    };
    shared.log(format!("{name}: {action}: {line}"));
}

/// The claim finalizer of kube-controller-manager's PVC protection controller.
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// How the records call a volume the harness inserted and then had no use for.
pub const UNUSED: &str = "an unused";

/// Inserts a CNS volume and a Retain PV pre-bound to the claim.
async fn bind_static(shared: &Shared, claim: usize, name: &str) -> String {
    let entry = record(shared, claim);
    let Some(uid) = entry.uid else {
        return "skipped: no uid".to_owned();
    };
    if entry.deleted {
        return "skipped: the claim was deleted".to_owned();
    }
    let volume = names::static_volume(claim);
    let id = shared.cns.insert_volume(&volume, names::CLUSTER_ID);
    let pv_name = names::static_pv(claim);
    shared
        .records()
        .inserted
        .insert(id.to_string(), format!("the volume of static PV {pv_name}"));
    let pv = objects::static_pv(&pv_name, &entry.class, name, &uid, id.as_str());
    let result = retry(|| async {
        match shared.volumes().create(&PostParams::default(), &pv).await {
            Err(kube_client::Error::Api(s)) if s.reason == "AlreadyExists" => {
                shared.volumes().get(&pv_name).await
            }
            other => other,
        }
    })
    .await;
    let mut records = shared.records();
    if result.is_ok() {
        if let Some(entry) = records.claims.get_mut(&claim) {
            entry.static_pv = Some(pv_name.clone());
        }
    } else {
        // The user gave up: the volume stays, named by nothing, the user's own leak.
        records.inserted.insert(
            id.to_string(),
            format!("{UNUSED} static volume (creating PV {pv_name} failed)"),
        );
    }
    format!("{pv_name} -> cns volume {id}: {}", describe(&result))
}

/// Inserts a CNS volume named like the claim's own, as a create that landed late would
/// leave, but only while the claim is being provisioned or provisioned by us: a volume a
/// provisioner never had a reason to make is not a duplicate.
async fn duplicate(shared: &Shared, claim: usize, name: &str) -> String {
    let entry = record(shared, claim);
    let Some(uid) = entry.uid else {
        return "skipped: no uid".to_owned();
    };
    if entry.deleted || entry.static_pv.is_some() {
        return "skipped: the claim was deleted or bound statically".to_owned();
    }
    let volume_name = names::provisioned(&uid);
    let current = match shared.claims().get_opt(name).await {
        Ok(Some(current)) => current,
        Ok(None) => return "skipped: the claim is gone".to_owned(),
        Err(e) => return format!("skipped: {e}"),
    };
    // An intent in the controllers' journal: a create of the name may have been sent.
    let in_progress = match retry(|| read_journal(shared)).await {
        Ok(journal) => journal.entries.get(&uid).is_some_and(|e| e.due.is_none()),
        Err(e) => return format!("skipped: cannot read the journal: {e}"),
    };
    let provisioned =
        current.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(&volume_name);
    if current.metadata.deletion_timestamp.is_some() || !(in_progress || provisioned) {
        return "skipped: not being provisioned by us".to_owned();
    }
    // A claim the driver refuses (a parameter it does not know, a size CNS cannot give)
    // never sends a create, so no volume of its name can appear in a real cluster; one
    // inserted here between the driver's lookup and the removal of the journal intent
    // would be a leak no controller could see (tests/refused_claims.rs covers the hand-over of
    // such a volume found at the lookup). Decided here, not in the schedule, so that the
    // seeds' schedules stay the same.
    let spec = current.spec.as_ref();
    let refused_class =
        spec.and_then(|s| s.storage_class_name.as_deref()) == Some(names::CLASS_BAD_PARAMETER);
    let refused_size = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .is_some_and(|q| q.0 == BAD_SIZE);
    if refused_class || refused_size {
        return "skipped: the driver refuses this claim".to_owned();
    }
    // A create of the name sent before the claim's PV was saved (by any replica) lands
    // within the settle window after it was sent, so before the PV's late-asset window
    // ends (counted from the save), when the controllers make the last sweep. One inserted
    // later (this step can run late: the user's requests before it retry through faults)
    // is no volume a real CNS could show, and would stay for good under Retain, as the
    // provisioner documents. Decided here, not in the schedule (see above).
    match shared.volumes().get_opt(&volume_name).await {
        Ok(Some(pv)) => {
            let late_window = super::world::CREATE_SETTLE;
            let window_over = pv.metadata.creation_timestamp.as_ref().is_some_and(|t| {
                k8s_openapi::jiff::Timestamp::now().duration_since(t.0)
                    >= k8s_openapi::jiff::SignedDuration::try_from(late_window).unwrap_or_default()
            });
            if window_over {
                return format!(
                    "skipped: PV {volume_name} was saved more than {late_window:?} ago: no \
                     create sent before can land now"
                );
            }
        }
        Ok(None) => {}
        Err(e) => return format!("skipped: {e}"),
    }
    let id = shared.cns.insert_volume(&volume_name, names::CLUSTER_ID);
    shared
        .records()
        .inserted
        .insert(id.to_string(), format!("a duplicate named {volume_name}"));
    let why = if in_progress {
        "its intent is in the journal"
    } else {
        "the claim is bound to its PV"
    };
    format!("cns volume {id} named {volume_name} ({why})")
}

/// Carries out a global step. User requests run in tasks of their own, so that a slow
/// answer does not hold up the clock.
///
/// # Errors
/// When a replica cannot be started.
pub fn global_action(world: &mut World, action: &Action) -> anyhow::Result<()> {
    let shared = world.shared.clone();
    match action {
        Action::ApiFault(fault) => world.kube.add_fault(faults::rule(fault)),
        Action::CutWatches => world.kube.cut_watches(),
        Action::Compact => world.kube.compact(),
        Action::CnsFault {
            method,
            site,
            fault,
        } => {
            let injected = match site {
                CnsSite::Call => SimFault::call(*fault),
                CnsSite::Task => SimFault::task(*fault),
                CnsSite::TaskAfterChange => SimFault::task_after_change(*fault),
                CnsSite::VolumeResult => SimFault::volume_result(*fault),
            }
            .message("injected by the chaos schedule");
            shared.cns.fail_next(method, injected);
        }
        Action::CnsDelay { method, delay } => shared.cns.delay(method, *delay),
        Action::ExpireSessions => shared.cns.expire_sessions(),
        Action::Kill { replica } => {
            world.replicas[*replica].kill();
        }
        Action::Stop { replica } => {
            world.replicas[*replica].stop();
        }
        Action::Start { replica } => {
            world.replicas[*replica].start()?;
        }
        Action::Partition { replica, hang } => {
            world.replicas[*replica].partition().cut(*hang);
            // Established watches break too.
            world.kube.cut_watches();
        }
        Action::Heal { replica } => {
            world.replicas[*replica].partition().heal();
        }
        Action::DeleteNode { node } => {
            let node = *node;
            tokio::spawn(async move {
                let result =
                    retry(|| async { shared.nodes().delete(node, &DeleteParams::default()).await })
                        .await;
                shared.log(format!("* delete node {node}: {}", describe(&result)));
            });
            return Ok(());
        }
        Action::CreateNode { node } => {
            let node = *node;
            tokio::spawn(async move {
                let object = objects::node(node);
                let result = retry(|| async {
                    shared.nodes().create(&PostParams::default(), &object).await
                })
                .await;
                shared.log(format!("* create node {node}: {}", describe(&result)));
            });
            return Ok(());
        }
        Action::DeleteClass { class } => {
            let class = *class;
            tokio::spawn(async move {
                let result = retry(|| async {
                    shared
                        .classes()
                        .delete(class, &DeleteParams::default())
                        .await
                })
                .await;
                shared.log(format!(
                    "* delete storageclass {class}: {}",
                    describe(&result)
                ));
            });
            return Ok(());
        }
        Action::CreateClass { class, ours } => {
            let (class, ours) = (*class, *ours);
            tokio::spawn(async move {
                let object = objects::class(class, ours);
                let result = retry(|| async {
                    shared
                        .classes()
                        .create(&PostParams::default(), &object)
                        .await
                })
                .await;
                shared.log(format!(
                    "* create storageclass {class} (ours: {ours}): {}",
                    describe(&result)
                ));
            });
            return Ok(());
        }
        claim_only => {
            shared.log(format!("* not a global action: {claim_only}"));
            return Ok(());
        }
    }
    shared.log(format!("* {action}"));
    Ok(())
}
