//! Who the controller is: the provisioner names it answers to ([`Names`]), which PVs are
//! ours by those names ([`is_ours`]). The ground floor of the flows: every file of a claim's or a volume's way
//! asks it, and it asks none of them.

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::annotations;

/// The provisioner names this controller answers to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names<'a> {
    pub(crate) primary: &'a str,
    pub(crate) additional: &'a [String],
}

impl Names<'_> {
    pub(crate) fn knows(&self, name: &str) -> bool {
        name == self.primary || self.additional.iter().any(|n| n == name)
    }
}

/// Whether the PV belongs to us (newer Go `isProvisionerForVolume`):
/// - a dynamically provisioned PV (with `pv.kubernetes.io/provisioned-by`) is ours when
///   that annotation or `pv.kubernetes.io/migrated-to` names one of our names; its CSI
///   driver does not count (another provisioner may use the same driver);
/// - a statically provisioned CSI PV is ours when its driver is one of our names;
/// - a statically provisioned in-tree PV is ours only when migrated to us.
pub(crate) fn is_ours(volume: &PersistentVolume, names: Names<'_>) -> bool {
    let migrated_to_us = annotations::migrated_to(volume).is_some_and(|m| names.knows(m));
    if let Some(provisioned_by) = annotations::provisioned_by(volume) {
        return names.knows(provisioned_by) || migrated_to_us;
    }
    match volume.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        Some(csi) => names.knows(&csi.driver),
        None => migrated_to_us,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::pv;

    /// The provisioner name of the unit tests.
    pub(crate) const ME: &str = "example.com/me";

    /// [`ME`], answering to `extra` too.
    pub(crate) fn names(extra: &[String]) -> Names<'_> {
        Names {
            primary: ME,
            additional: extra,
        }
    }

    #[test]
    fn names_include_the_additional_ones() {
        let extra = vec!["old.example.com".to_owned()];
        let names = Names {
            primary: "new.example.com",
            additional: &extra,
        };
        assert!(names.knows("new.example.com") && names.knows("old.example.com"));
        assert!(!names.knows("other.example.com"));
    }

    #[test]
    fn volume_ownership_decisions() {
        let csi = |driver: &str| {
            let mut v = pv("v").build();
            let spec = v.spec.as_mut().unwrap();
            spec.host_path = None;
            spec.csi = Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: "handle-1".into(),
                ..Default::default()
            });
            v
        };
        let with_ann = |mut v: PersistentVolume, key: &str, value: &str| {
            v.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.into(), value.into());
            v
        };
        let cases: Vec<(&str, PersistentVolume, bool)> = vec![
            (
                "a volume provisioned by us is ours",
                pv("v").provisioned_by(ME).build(),
                true,
            ),
            (
                "a volume migrated to us is ours",
                pv("v").provisioned_by("in/tree").migrated_to(ME).build(),
                true,
            ),
            (
                "a volume of another provisioner is not ours",
                pv("v").provisioned_by("x/y").build(),
                false,
            ),
            (
                "a volume migrated to another driver is not ours",
                pv("v").provisioned_by("x/y").migrated_to("x/y").build(),
                false,
            ),
            (
                "a statically provisioned CSI volume of our driver is ours",
                csi(ME),
                true,
            ),
            (
                "a statically provisioned CSI volume of another driver is not ours",
                csi("x/y"),
                false,
            ),
            (
                "a dynamically provisioned CSI volume of another provisioner is not ours",
                with_ann(csi("x/y"), crate::annotations::ANN_PROVISIONED_BY, "x/y"),
                false,
            ),
            (
                "a dynamically provisioned volume of another provisioner is not ours, even with our CSI driver",
                with_ann(csi(ME), crate::annotations::ANN_PROVISIONED_BY, "x/y"),
                false,
            ),
            (
                "a dynamically provisioned CSI volume of another driver migrated to us is ours",
                with_ann(
                    with_ann(csi("x/y"), crate::annotations::ANN_PROVISIONED_BY, "x/y"),
                    crate::annotations::ANN_MIGRATED_TO,
                    ME,
                ),
                true,
            ),
            (
                "a statically provisioned CSI volume of another driver is not ours, even migrated to us",
                with_ann(csi("x/y"), crate::annotations::ANN_MIGRATED_TO, ME),
                false,
            ),
            (
                "a statically provisioned in-tree volume is never ours",
                pv("v").build(),
                false,
            ),
            (
                "a static in-tree volume migrated to us is ours",
                pv("v").migrated_to(ME).build(),
                true,
            ),
        ];
        for (name, volume, want) in cases {
            assert_eq!(is_ours(&volume, names(&[])), want, "case: {name}");
        }
    }
}
