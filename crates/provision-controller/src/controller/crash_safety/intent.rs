//! The journal around a driver call and after a PV's save: the claim's intent recorded
//! before the driver may create ([`record_intent`], by [`Guard::provision`](super::Guard::provision)), removed or
//! settled after a final answer ([`no_asset`]), settled for its last sweep once a PV
//! records the asset ([`after_save`]).

use tracing::Instrument as _;

use k8s_openapi::{api::storage::v1::StorageClass, apimachinery::pkg::apis::meta::v1::ObjectMeta};

use crate::{
    DeleteError, ProvisionError,
    annotations::ClaimView,
    controller::{
        Context,
        calls::{OpError, chain},
    },
    journal::{self, Entry},
};

/// The largest class snapshot written to the journal, in bytes of JSON.
const MAX_CLASS_SNAPSHOT: usize = 16 * 1024;

/// The JSON of the class snapshot the journal keeps: the fields of `class` a driver
/// reads. `None` (logged) when it exceeds [`MAX_CLASS_SNAPSHOT`]: the claim then depends
/// on the class as it is at each sync.
pub(crate) fn class_snapshot(class: &StorageClass) -> Option<String> {
    let snapshot = StorageClass {
        metadata: ObjectMeta {
            name: class.metadata.name.clone(),
            uid: class.metadata.uid.clone(),
            ..ObjectMeta::default()
        },
        provisioner: class.provisioner.clone(),
        parameters: class.parameters.clone(),
        reclaim_policy: class.reclaim_policy.clone(),
        mount_options: class.mount_options.clone(),
        volume_binding_mode: class.volume_binding_mode.clone(),
        allowed_topologies: class.allowed_topologies.clone(),
        ..StorageClass::default()
    };
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    match serde_json::to_string(&snapshot) {
        Ok(json) if json.len() <= MAX_CLASS_SNAPSHOT => Some(json),
        Ok(json) => {
            tracing::warn!(
                storageclass = class_name,
                bytes = json.len(),
                limit = MAX_CLASS_SNAPSHOT,
                "the class is too large to be recorded in the journal; its provisioning will need the class to exist until it is done"
            );
            None
        }
        Err(err) => {
            tracing::warn!(storageclass = class_name, error = %err, "the class cannot be recorded in the journal");
            None
        }
    }
}

/// Whether the driver's answer says that it holds no asset for the claim (`Failed`,
/// `Reschedule`, `Ignored`, `Infeasible`): then the intent has nothing to record.
pub(crate) fn holds_no_asset(answer: &ProvisionError) -> bool {
    match answer {
        ProvisionError::Failed(_)
        | ProvisionError::Reschedule(_)
        | ProvisionError::Ignored { .. }
        | ProvisionError::Infeasible(_) => true,
        ProvisionError::InBackground(_) | ProvisionError::NoChange(_) => false,
    }
}

/// Records the claim's intent in the journal before the driver is asked for `pv_name`
/// with `class`, and returns once it is durable: a new intent, or the claim's intent with
/// this attempt's time ([`Entry::attempt`]), so that a replica that finds no asset waits
/// for a create this attempt may send (an attempt this process stamped this very second
/// needs no write). An intent another process wrote keeps no writer once this one
/// stamps it: a "no asset" answer then settles it rather than removing it. Returns the
/// entry as written (`None` without a journal).
///
/// # Errors
/// The journal could not be written: the driver must not be called.
pub(crate) async fn record_intent(
    ctx: &Context,
    claim: &ClaimView,
    class: &StorageClass,
    pv_name: &str,
) -> Result<Option<Entry>, OpError> {
    let Some(journal) = &ctx.journal else {
        return Ok(None);
    };
    let now = journal::now_secs();
    let existing = journal.entry(&claim.uid).filter(Entry::is_intent);
    if let Some(e) = &existing
        && e.writer == journal.writer()
        && e.last_attempt() >= now
    {
        return Ok(existing);
    }
    let spec = claim
        .claim
        .spec
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok());
    let (entry, snapshot) = match existing {
        Some(e) => {
            // The class the provisioning started with stays recorded.
            let snapshot = if e.class.is_some() {
                None
            } else {
                class_snapshot(class).map(|json| (journal::class_key(&json), json))
            };
            let writer = if e.writer == journal.writer() {
                e.writer.clone()
            } else {
                String::new()
            };
            let entry = Entry {
                writer,
                class: e
                    .class
                    .clone()
                    .or_else(|| snapshot.as_ref().map(|(k, _)| k.clone())),
                node: claim.selected_node.clone().or(e.node.clone()),
                spec: spec.or(e.spec.clone()),
                attempt: Some(now),
                ..e
            };
            (entry, snapshot)
        }
        None => {
            let snapshot = class_snapshot(class).map(|json| (journal::class_key(&json), json));
            let entry = Entry {
                claim: claim.key.clone(),
                pv: pv_name.to_owned(),
                since: now,
                writer: journal.writer().to_owned(),
                class: snapshot.as_ref().map(|(key, _)| key.clone()),
                node: claim.selected_node.clone(),
                spec,
                due: None,
                attempt: None,
            };
            (entry, snapshot)
        }
    };
    journal
        .put(&claim.uid, entry.clone(), snapshot)
        .instrument(tracing::debug_span!("journal_put"))
        .await
        .map_err(|message| OpError::Journal {
            claim: claim.key.clone(),
            message,
        })?;
    Ok(Some(entry))
}

/// The driver answered that it holds no asset for claim `uid`: the intent goes if this
/// process wrote it (the answer says nothing of another replica's create: its intent, or
/// the entry of a PV it saved meanwhile, stays). One another process (or an earlier life
/// of this one) wrote is settled instead when a create it sent may still land, for the
/// end of the late-asset window, whose sweep looks for that asset once more.
pub(crate) fn no_asset(ctx: &Context, uid: &str) {
    let Some(journal) = &ctx.journal else {
        return;
    };
    let Some(recorded) = journal.entry(uid).filter(Entry::is_intent) else {
        return;
    };
    let window = window_secs(ctx);
    if recorded.writer != journal.writer() && window > 0 {
        let due = journal.settle(uid, window);
        queue_at(ctx, uid, due);
    } else {
        journal.remove_own_intent(uid);
    }
}

/// After the PV `saved` of claim `claim_uid` was saved (by us, or by another replica
/// first): the driver hears of it ([`LateAssets::volume_saved`](crate::LateAssets::volume_saved):
/// it releases any other asset of the name), and the claim's entry is settled for its last
/// sweep when the late-asset window ends (removed without a window once the driver
/// answered without failing; a failure is swept again a second later, and so on).
pub(crate) async fn after_save(
    ctx: &Context,
    claim_uid: Option<&str>,
    saved: &k8s_openapi::api::core::v1::PersistentVolume,
) {
    let swept = volume_saved(ctx, saved).await;
    let (Some(journal), Some(uid)) = (&ctx.journal, claim_uid.filter(|u| !u.is_empty())) else {
        return;
    };
    let window = window_secs(ctx);
    if window == 0 && swept {
        // The entry as known now goes; one another replica stamps meanwhile stays (its
        // claim's next sync settles it: the PV exists).
        if let Some(known) = journal.entry(uid) {
            journal.remove_unchanged(uid, &known);
        }
        return;
    }
    let due = journal.settle(uid, window.max(1));
    queue_at(ctx, uid, due);
}

/// Tells the driver that `volume` is saved
/// ([`LateAssets::volume_saved`](crate::LateAssets::volume_saved), when it opted in),
/// bounded by the provision timeout; whether it answered without failing (a failure is
/// logged).
pub(crate) async fn volume_saved(
    ctx: &Context,
    volume: &k8s_openapi::api::core::v1::PersistentVolume,
) -> bool {
    let Some(late) = &ctx.driver.late_assets else {
        return true;
    };
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let result = match ctx
        .driver_slots
        .deleting(ctx.config.provision_timeout, late.volume_saved(volume))
        .await
    {
        Ok(Ok(()) | Err(DeleteError::Ignored { .. })) => return true,
        Ok(Err(DeleteError::Failed(e))) => chain(&*e),
        Err(e) => chain(&e.into_op("volume_saved")),
    };
    tracing::warn!(pv = name, error = %result, "the driver failed to release what else it holds for the claim of the saved volume; asked again");
    false
}

/// The driver's late-asset window in whole seconds (rounded up), 0 without one.
pub(crate) fn window_secs(ctx: &Context) -> i64 {
    ctx.late_window().map_or(0, |w| {
        i64::try_from(w.as_secs() + u64::from(w.subsec_nanos() > 0)).unwrap_or(i64::MAX)
    })
}

/// Queues claim `uid` for the time `due` (Unix seconds), at once when it has passed.
pub(super) fn queue_at(ctx: &Context, uid: &str, due: i64) {
    if !ctx.accepting() {
        return;
    }
    let wait = u64::try_from(due.saturating_sub(journal::now_secs())).unwrap_or(0);
    // A second more: the due time is whole seconds.
    ctx.claim_queue
        .add_after(uid.to_owned(), std::time::Duration::from_secs(wait + 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "example.com/me";

    #[test]
    fn the_class_snapshot_keeps_what_a_driver_reads() {
        let mut full = crate::testing::class("fast")
            .provisioner(ME)
            .reclaim_policy("Retain")
            .wait_for_first_consumer()
            .build();
        full.metadata.uid = Some("class-uid".into());
        full.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
        full.metadata.resource_version = Some("42".into());
        full.parameters = Some([("pool".to_owned(), "gold".to_owned())].into());
        full.mount_options = Some(vec!["noatime".into()]);
        full.allow_volume_expansion = Some(true);
        let json = class_snapshot(&full).expect("a small class is recorded");
        let read: StorageClass = serde_json::from_str(&json).unwrap();
        assert_eq!(read.metadata.name.as_deref(), Some("fast"));
        assert_eq!(read.metadata.uid.as_deref(), Some("class-uid"));
        assert_eq!(read.provisioner, ME);
        assert_eq!(read.parameters, full.parameters);
        assert_eq!(read.reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(read.mount_options, full.mount_options);
        assert_eq!(read.volume_binding_mode, full.volume_binding_mode);
        assert_eq!(read.metadata.labels, None, "only what a driver reads");
        assert_eq!(read.metadata.resource_version, None);
        assert_eq!(read.allow_volume_expansion, None);
        let mut huge = crate::testing::class("fast").provisioner(ME).build();
        huge.parameters = Some([("blob".to_owned(), "x".repeat(MAX_CLASS_SNAPSHOT))].into());
        assert_eq!(class_snapshot(&huge), None);
    }
}
