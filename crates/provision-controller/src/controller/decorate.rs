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
    volume
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANN_PROVISIONED_BY.to_owned(), class.provisioner.clone());
}

pub(crate) fn claim_reference(claim: &PersistentVolumeClaim) -> Result<ObjectReference, OpError> {
    if claim.metadata.uid.is_none() {
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
    }
}
