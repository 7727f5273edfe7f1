//! StorageClass parameters, named as vsphere-csi-driver names them (matched case-insensitively).

use std::collections::BTreeMap;

use super::ProvisionerError;

/// `datastoreurl`: the URL of the datastore to place volumes on (`ds:///vmfs/volumes/...`).
pub const PARAM_DATASTORE_URL: &str = "datastoreurl";
/// `datastoremoref`: the managed object ID of the datastore (`datastore-59`); an extension of
/// this crate for setups without a URL map.
pub const PARAM_DATASTORE_MOREF: &str = "datastoremoref";
/// `storagepolicyid`: the SPBM profile ID of the storage policy.
pub const PARAM_STORAGE_POLICY_ID: &str = "storagepolicyid";
/// `storagepolicyname`: recognised, but resolving a name needs the SPBM API, which this crate
/// does not speak; use `storagepolicyid`.
pub const PARAM_STORAGE_POLICY_NAME: &str = "storagepolicyname";
/// `csi.storage.k8s.io/fstype`: the file system of `Filesystem` volumes. Default `ext4`.
pub const PARAM_FS_TYPE: &str = "csi.storage.k8s.io/fstype";
/// `fstype`: the deprecated spelling of [`PARAM_FS_TYPE`] that vsphere-csi-driver still accepts.
pub const PARAM_FS_TYPE_DEPRECATED: &str = "fstype";
/// The prefix of parameters the CSI external-provisioner consumes itself (secrets); they are
/// not driver parameters and are ignored.
const CSI_PREFIX: &str = "csi.storage.k8s.io/";
/// The default file system.
pub const DEFAULT_FS_TYPE: &str = "ext4";

/// The parameters of one StorageClass, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClassParams {
    pub(crate) datastore_url: Option<String>,
    pub(crate) datastore_moref: Option<String>,
    pub(crate) storage_policy_id: Option<String>,
    pub(crate) fs_type: Option<String>,
}

impl ClassParams {
    /// Reads the parameters of class `class`; unknown ones are an error naming them.
    pub(crate) fn parse(
        class: &str,
        parameters: Option<&BTreeMap<String, String>>,
    ) -> Result<Self, ProvisionerError> {
        let mut params = ClassParams::default();
        for (key, value) in parameters.into_iter().flatten() {
            let invalid = |reason: &str| ProvisionerError::InvalidParameter {
                class: class.to_owned(),
                parameter: key.clone(),
                reason: reason.to_owned(),
            };
            let value = value.trim();
            let slot = match key.to_ascii_lowercase().as_str() {
                PARAM_DATASTORE_URL => &mut params.datastore_url,
                PARAM_DATASTORE_MOREF => &mut params.datastore_moref,
                PARAM_STORAGE_POLICY_ID => &mut params.storage_policy_id,
                PARAM_FS_TYPE | PARAM_FS_TYPE_DEPRECATED => &mut params.fs_type,
                PARAM_STORAGE_POLICY_NAME => {
                    return Err(invalid(
                        "resolving a policy name needs the SPBM API, which this provisioner \
                         does not use; set storagepolicyid to the policy's profile ID instead",
                    ));
                }
                lower if lower.starts_with(CSI_PREFIX) => continue,
                _ => {
                    return Err(ProvisionerError::UnknownParameter {
                        class: class.to_owned(),
                        parameter: key.clone(),
                    });
                }
            };
            if value.is_empty() {
                return Err(invalid("is empty"));
            }
            if slot.as_deref().is_some_and(|v| v != value) {
                return Err(invalid("is given twice with different values"));
            }
            *slot = Some(value.to_owned());
        }
        if params.datastore_url.is_some() && params.datastore_moref.is_some() {
            return Err(ProvisionerError::InvalidParameter {
                class: class.to_owned(),
                parameter: PARAM_DATASTORE_MOREF.to_owned(),
                reason: "cannot be combined with datastoreurl".to_owned(),
            });
        }
        Ok(params)
    }

    /// The file system, `ext4` unless the class names one.
    pub(crate) fn fs_type(&self) -> &str {
        self.fs_type.as_deref().unwrap_or(DEFAULT_FS_TYPE)
    }
}

/// The file system class `parameters` name, read without checking the other parameters
/// (for the PV of a volume adopted while the class is refused): the first non-empty
/// [`PARAM_FS_TYPE`], else [`PARAM_FS_TYPE_DEPRECATED`], matched case-insensitively;
/// `ext4` when neither is given.
pub(crate) fn fs_type_lenient(parameters: Option<&BTreeMap<String, String>>) -> &str {
    let named = |wanted: &str| {
        parameters
            .into_iter()
            .flatten()
            .find(|(key, value)| key.eq_ignore_ascii_case(wanted) && !value.trim().is_empty())
            .map(|(_, value)| value.trim())
    };
    named(PARAM_FS_TYPE)
        .or_else(|| named(PARAM_FS_TYPE_DEPRECATED))
        .unwrap_or(DEFAULT_FS_TYPE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<ClassParams, ProvisionerError> {
        let map = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ClassParams::parse("fast", Some(&map))
    }

    #[test]
    fn known_parameters_are_read_case_insensitively() {
        let params = parse(&[
            ("DatastoreURL", "ds:///vmfs/volumes/a/"),
            ("storagePolicyID", "policy-1"),
            ("csi.storage.k8s.io/fstype", "xfs"),
        ])
        .unwrap();
        assert_eq!(
            params.datastore_url.as_deref(),
            Some("ds:///vmfs/volumes/a/")
        );
        assert_eq!(params.storage_policy_id.as_deref(), Some("policy-1"));
        assert_eq!(params.fs_type(), "xfs");
        assert_eq!(parse(&[]).unwrap().fs_type(), "ext4");
        assert_eq!(parse(&[("fstype", "ext3")]).unwrap().fs_type(), "ext3");
        assert_eq!(
            parse(&[("datastoremoref", "datastore-59")])
                .unwrap()
                .datastore_moref
                .as_deref(),
            Some("datastore-59")
        );
    }

    #[test]
    fn the_lenient_fs_type_ignores_the_other_parameters() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let refused = map(&[("diskformat", "thin"), ("FSType", " xfs ")]);
        assert!(ClassParams::parse("fast", Some(&refused)).is_err());
        assert_eq!(fs_type_lenient(Some(&refused)), "xfs");
        let both = map(&[("fstype", "ext3"), ("csi.storage.k8s.io/fstype", "xfs")]);
        assert_eq!(fs_type_lenient(Some(&both)), "xfs", "the current key first");
        assert_eq!(fs_type_lenient(Some(&map(&[("fstype", " ")]))), "ext4");
        assert_eq!(fs_type_lenient(None), "ext4");
    }

    #[test]
    fn provisioner_secret_parameters_are_ignored() {
        let params = parse(&[("csi.storage.k8s.io/provisioner-secret-name", "s")]).unwrap();
        assert_eq!(params, ClassParams::default());
    }

    #[test]
    fn unknown_parameters_name_the_class_and_parameter() {
        let err = parse(&[("datastore", "LocalDS_0")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"storageclass "fast": unknown parameter "datastore""#
        );
    }

    #[test]
    fn bad_values_are_errors() {
        for (pairs, fragment) in [
            (vec![("datastoreurl", " ")], "is empty"),
            (vec![("storagepolicyname", "gold")], "storagepolicyid"),
            (
                vec![("fstype", "ext4"), ("csi.storage.k8s.io/fstype", "xfs")],
                "twice",
            ),
            (
                vec![
                    ("datastoreurl", "ds:///a/"),
                    ("datastoremoref", "datastore-1"),
                ],
                "cannot be combined",
            ),
        ] {
            let err = parse(&pairs).unwrap_err().to_string();
            assert!(err.contains(fragment) && err.contains("\"fast\""), "{err}");
        }
    }
}
