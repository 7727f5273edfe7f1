//! Object names and builders, the no-op provisioner, and pre-bound claim/PV pairs.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, bail};
use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        core::v1::{
            CSIPersistentVolumeSource, Namespace, ObjectReference, PersistentVolume,
            PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec,
            VolumeResourceRequirements,
        },
        storage::v1::StorageClass,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube_client::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};
use provision_controller::{DeleteError, ProvisionError, ProvisionOptions, Provisioner};

/// Label on every object the bench creates (and on the PVs its provisioner returns).
pub(crate) const RUN_LABEL: &str = "bench.example.com/run";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// Names of one bench run.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    /// Random id of the run.
    pub(crate) run: String,
    /// Namespace of claims, events and metadata objects.
    pub(crate) namespace: String,
    /// StorageClass name.
    pub(crate) class: String,
    /// Provisioner name (and CSI driver of provisioned PVs).
    pub(crate) provisioner: String,
}

impl Names {
    /// Fresh names: `bench-<id>` and `bench.example.com/<id>`.
    /// The CSI driver name of the run's PVs: a DNS subdomain, as the API server requires
    /// (the provisioner name has a `/`).
    pub(crate) fn csi_driver(&self) -> String {
        format!("{}.bench.example.com", self.run)
    }

    pub(crate) fn fresh() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        Self::from_run(&format!("{:06x}", hasher.finish() & 0xff_ffff))
    }

    /// The names of run `run`.
    pub(crate) fn from_run(run: &str) -> Self {
        Self {
            namespace: format!("bench-{run}"),
            class: format!("bench-{run}"),
            provisioner: format!("bench.example.com/{run}"),
            run: run.to_owned(),
        }
    }

    /// Labels of the run's objects.
    pub(crate) fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(RUN_LABEL.to_owned(), self.run.clone())])
    }

    /// Label selector of the run's objects.
    pub(crate) fn selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.run)
    }

    /// Name of claim `i`.
    pub(crate) fn claim(i: usize) -> String {
        format!("bench-{i:06}")
    }

    /// Name of the pre-bound PV of claim `i`.
    pub(crate) fn volume(&self, i: usize) -> String {
        format!("pv-{}-{i:06}", self.run)
    }
}

/// The index of a claim (or metadata object) named by [`Names::claim`], below `n`.
pub(crate) fn index_of(name: &str, prefix: &str, n: usize) -> Option<usize> {
    name.strip_prefix(prefix)?.parse().ok().filter(|i| *i < n)
}

fn one_gib() -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_owned(), Quantity("1Gi".to_owned()))])
}

/// The run's namespace.
pub(crate) fn namespace(names: &Names) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(names.namespace.clone()),
            labels: Some(names.labels()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// The run's StorageClass (Immediate binding, reclaim Delete).
pub(crate) fn class(names: &Names) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(names.class.clone()),
            labels: Some(names.labels()),
            ..ObjectMeta::default()
        },
        provisioner: names.provisioner.clone(),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("Immediate".to_owned()),
        ..StorageClass::default()
    }
}

/// Claim `i` of the run's class; `volume` pre-binds it. A claim to provision carries the
/// provisioner annotation already (as a load generator on a real cluster sets it, so the
/// run does not wait for kube-controller-manager to add it).
pub(crate) fn claim(names: &Names, i: usize, volume: Option<String>) -> PersistentVolumeClaim {
    let annotations = volume.is_none().then(|| {
        BTreeMap::from([(
            "volume.kubernetes.io/storage-provisioner".to_owned(),
            names.provisioner.clone(),
        )])
    });
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(Names::claim(i)),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.labels()),
            annotations,
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(one_gib()),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: Some(names.class.clone()),
            volume_name: volume,
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// A CSI volume of `driver` bound to `claim`, as a provisioner would have saved it.
pub(crate) fn bound_volume(
    names: &Names,
    name: String,
    driver: &str,
    claim: &PersistentVolumeClaim,
) -> PersistentVolume {
    let annotations = BTreeMap::from([(ANN_PROVISIONED_BY.to_owned(), driver.to_owned())]);
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(names.labels()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            capacity: Some(one_gib()),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_owned(),
                volume_handle: format!("handle-{name}"),
                ..CSIPersistentVolumeSource::default()
            }),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: claim.metadata.uid.clone(),
                ..ObjectReference::default()
            }),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            storage_class_name: Some(names.class.clone()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// Creates `n` claims, each pre-bound to a CSI PV of `driver`, `in_flight` requests at a
/// time, then waits until every claim is Bound (the PV binder binds them).
pub(crate) async fn populate_pairs(
    client: Client,
    names: &Names,
    driver: &str,
    n: usize,
    in_flight: usize,
) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &names.namespace);
    let volumes: Api<PersistentVolume> = Api::all(client);
    futures::stream::iter(0..n)
        .map(|i| {
            let (claims, volumes) = (claims.clone(), volumes.clone());
            async move {
                let pv = names.volume(i);
                let mut wanted = claim(names, i, Some(pv.clone()));
                let annotations = wanted.metadata.annotations.get_or_insert_default();
                annotations.insert(ANN_STORAGE_PROVISIONER.to_owned(), driver.to_owned());
                let created = claims
                    .create(&PostParams::default(), &wanted)
                    .await
                    .with_context(|| format!("cannot create claim {}", Names::claim(i)))?;
                let volume = bound_volume(names, pv.clone(), driver, &created);
                volumes
                    .create(&PostParams::default(), &volume)
                    .await
                    .with_context(|| format!("cannot create volume {pv}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(in_flight)
        .try_collect::<()>()
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600 + n as u64 / 20);
    loop {
        let list = claims.list(&ListParams::default()).await?;
        let bound = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound >= n {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("only {bound} of {n} pre-bound claims became Bound");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A provisioner that creates nothing: it returns a valid CSI PV for every claim.
pub(crate) struct Noop {
    /// CSI driver name of the PVs.
    pub(crate) driver: String,
    /// Labels put on the PVs.
    pub(crate) labels: BTreeMap<String, String>,
}

#[async_trait]
impl Provisioner for Noop {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        let claim = options.claim.spec.clone().unwrap_or_default();
        let capacity = claim.resources.and_then(|r| r.requests);
        Ok(PersistentVolume {
            metadata: ObjectMeta {
                name: Some(options.pv_name.clone()),
                labels: Some(self.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(capacity.unwrap_or_else(one_gib)),
                access_modes: claim.access_modes,
                volume_mode: claim.volume_mode,
                persistent_volume_reclaim_policy: options.storage_class.reclaim_policy.clone(),
                csi: Some(CSIPersistentVolumeSource {
                    driver: self.driver.clone(),
                    volume_handle: options.pv_name.clone(),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        })
    }

    async fn delete(&self, _: &PersistentVolume) -> Result<(), DeleteError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_round_trip_to_their_index() {
        assert_eq!(index_of(&Names::claim(42), "bench-", 100), Some(42));
        assert_eq!(index_of(&Names::claim(142), "bench-", 100), None);
        assert_eq!(index_of("other-000001", "bench-", 100), None);
    }
}
