//! What the controller adds to the driver's PV before saving it (Go: the part of
//! `provisionClaimOperation` after the driver returned).

use k8s_openapi::api::{
    core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};

use super::{Context, claim::claim_key, op::OpError};
use crate::annotations::{self, ANN_PROVISIONED_BY, FINALIZER_PV};

/// What the controller adds to the driver's PV: claimRef, storageClassName, the
/// protection finalizer (when configured) and `pv.kubernetes.io/provisioned-by`.
pub(crate) fn decorate(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    volume: &mut PersistentVolume,
) {
    let spec = volume.spec.get_or_insert_with(Default::default);
    if let Ok(claim_ref) = claim_reference(claim) {
        spec.claim_ref = Some(claim_ref);
    }
    spec.storage_class_name = Some(annotations::claim_class(claim).to_owned());
    let reclaim_delete = spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete");
    if ctx.config.add_finalizer && reclaim_delete {
        let finalizers = volume.metadata.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.iter().any(|f| f == FINALIZER_PV) {
            finalizers.push(FINALIZER_PV.to_owned());
        }
    }
    // The class's provisioner (one of our names), as Go; ours when the class changed to
    // another provisioner while the claim was provisioned in the background, so that
    // this controller, which holds the asset, also deletes it.
    let provisioned_by = if ctx.names().knows(&class.provisioner) {
        class.provisioner.clone()
    } else {
        ctx.name.clone()
    };
    volume
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANN_PROVISIONED_BY.to_owned(), provisioned_by);
}

/// Gives a nameless PV from the driver the name it must have (`pv_name`); a PV with
/// another name is kept as it is (Go does not check), with a warning.
pub(crate) fn ensure_name(
    volume: &mut PersistentVolume,
    pv_name: &str,
    claim: &PersistentVolumeClaim,
) {
    match volume.metadata.name.as_deref() {
        None | Some("") => {
            tracing::warn!(pvc = %claim_key(claim), pv = pv_name, "the provisioner returned a PV without a name; naming it");
            volume.metadata.name = Some(pv_name.to_owned());
        }
        Some(name) if name != pv_name => {
            tracing::warn!(pvc = %claim_key(claim), pv = name, expected = pv_name, "the provisioner returned a PV with another name than asked for");
        }
        Some(_) => {}
    }
}

pub(crate) fn claim_reference(claim: &PersistentVolumeClaim) -> Result<ObjectReference, OpError> {
    if claim.metadata.uid.as_deref().is_none_or(str::is_empty) {
        return Err(OpError::NoUid {
            claim: claim_key(claim),
        });
    }
    Ok(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..ObjectReference::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pvc;

    #[test]
    fn a_nameless_volume_gets_the_name_it_must_have() {
        let claim = pvc("c").uid("u1").build();
        let mut nameless = PersistentVolume::default();
        ensure_name(&mut nameless, "pvc-u1", &claim);
        assert_eq!(nameless.metadata.name.as_deref(), Some("pvc-u1"));
        let mut empty = PersistentVolume::default();
        empty.metadata.name = Some(String::new());
        ensure_name(&mut empty, "pvc-u1", &claim);
        assert_eq!(empty.metadata.name.as_deref(), Some("pvc-u1"));
        let mut other = PersistentVolume::default();
        other.metadata.name = Some("mine".into());
        ensure_name(&mut other, "pvc-u1", &claim);
        assert_eq!(other.metadata.name.as_deref(), Some("mine"));
    }

    #[test]
    fn claim_reference_names_the_claim_and_needs_a_uid() {
        let claim = pvc("c").namespace("ns").uid("u1").build();
        let r = claim_reference(&claim).unwrap();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (
                Some("PersistentVolumeClaim"),
                Some("ns"),
                Some("c"),
                Some("u1")
            )
        );
        assert!(claim_reference(&pvc("c").build()).is_err());
        assert!(
            claim_reference(&pvc("c").uid("").build()).is_err(),
            "an empty uid is no uid"
        );
    }
}
