//! Wiring: caches, the trigger filter and the kube `Controller` (Go: `Add` and `add`).

use std::{
    future::Future,
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use futures::{FutureExt, StreamExt, future};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube_client::{Api, Client, Resource, ResourceExt};
use kube_runtime::{
    Controller, PredicateConfig, WatchStreamExt,
    controller::Config as ControllerConfig,
    reflector::{self, store::Writer},
    watcher,
};
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::{
    backend::{ClusterFlavor, VolumeMetadataBackend, error_chain},
    config::{Config, ConfigError},
    reconciler::{Context, error_policy, reconcile},
    resource::CnsVolumeMetadata,
};

/// Why [`run`] stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot be used.
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    /// A cache of claims or volumes stopped before it was filled.
    #[error("the {0} cache stopped before it was filled")]
    CacheStopped(&'static str),
}

/// What reconciles an object: its creation (and every object once at start), a change of
/// spec or finalizers, and the start of its deletion; status writes do not (Go: the
/// controller's predicate `Funcs`).
pub(crate) fn trigger_hash(object: &CnsVolumeMetadata) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    object.spec.hash(&mut hasher);
    object.finalizers().hash(&mut hasher);
    object.meta().deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// A reflector filling `writer` with every `K`, managedFields dropped; runs until dropped.
async fn fill_cache<K>(api: Api<K>, writer: Writer<K>, what: &'static str)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object: &mut K| object.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|event| {
            if let Err(error) = event {
                warn!(cache = what, error = %error_chain(&error), "watch failed; retrying");
            }
            future::ready(())
        })
        .await;
}

/// Runs the `CnsVolumeMetadata` reconciler until `shutdown` completes.
///
/// Does nothing and returns `Ok(())` at once unless the cluster flavor is
/// [`ClusterFlavor::Workload`]. Otherwise it fills caches of supervisor claims and volumes
/// (managedFields dropped), waits for both, and reconciles objects of every namespace with
/// [`Config::worker_threads`] workers.
///
/// # Guarantees
/// When `shutdown` completes, no new reconcile starts; the ones running finish, then `run`
/// returns `Ok(())`. No task outlives the returned future.
///
/// # Errors
/// [`Error::Config`] when [`Config::validate`] fails; [`Error::CacheStopped`] if a cache
/// cannot be filled.
///
/// # Assumptions
/// The `CnsVolumeMetadata` CRD is installed ([`crate::crd()`]); until it is, the watch
/// is retried with backoff. The client may list and watch claims, volumes and
/// `cnsvolumemetadatas`, update `cnsvolumemetadatas` and create events.
#[doc(alias = "Add")]
pub async fn run(
    client: Client,
    backend: Arc<dyn VolumeMetadataBackend>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    config.validate()?;
    let flavor = config.get_cluster_flavor();
    if flavor != ClusterFlavor::Workload {
        info!(%flavor, "not a supervisor (WORKLOAD) cluster; CnsVolumeMetadata reconciler not started");
        return Ok(());
    }
    let shutdown = shutdown.boxed().shared();
    let workers = config.get_worker_threads().get();

    let (claims, claims_writer) = reflector::store();
    let (volumes, volumes_writer) = reflector::store();
    let caches = future::join(
        fill_cache(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            claims_writer,
            "claims",
        ),
        fill_cache(
            Api::<PersistentVolume>::all(client.clone()),
            volumes_writer,
            "volumes",
        ),
    );

    let ctx = Arc::new(Context::new(
        client.clone(),
        backend,
        config,
        claims.clone(),
        volumes.clone(),
    ));
    let controller = async move {
        let ready = future::try_join(claims.wait_until_ready(), volumes.wait_until_ready());
        tokio::select! {
            ready = ready => ready.map_err(|_| Error::CacheStopped("claims or volumes"))?,
            () = shutdown.clone() => return Ok(()),
        };
        info!(
            workers,
            "caches filled; reconciling CnsVolumeMetadata objects"
        );
        let (reader, writer) = reflector::store();
        let trigger = watcher(
            Api::<CnsVolumeMetadata>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(trigger_hash, PredicateConfig::default());
        Controller::for_stream(trigger, reader)
            .with_config(ControllerConfig::default().concurrency(workers))
            .graceful_shutdown_on(shutdown)
            .run(reconcile, error_policy, ctx)
            .for_each(|result| {
                match result {
                    // A trigger for an object deleted since: expected after every deletion.
                    Err(kube_runtime::controller::Error::ObjectNotFound(object)) => {
                        debug!(object = %object, "object gone before its reconcile");
                    }
                    Err(error) => warn!(error = %error_chain(&error), "controller error"),
                    Ok(_) => {}
                }
                future::ready(())
            })
            .await;
        info!("CnsVolumeMetadata reconciler stopped");
        Ok(())
    };
    futures::pin_mut!(controller, caches);
    match future::select(controller, caches).await {
        future::Either::Left((result, _)) => result,
        future::Either::Right((((), ()), _)) => Err(Error::CacheStopped("claims or volumes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{reconciler::FINALIZER, testing::pvc_spec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn assert_send<T: Send>(t: T) -> T {
        t
    }

    /// Compile-only: the future `run` returns can be spawned.
    #[allow(dead_code)]
    fn run_future_is_send(client: Client, backend: Arc<dyn VolumeMetadataBackend>) {
        drop(assert_send(run(
            client,
            backend,
            Config::default(),
            future::pending(),
        )));
    }

    #[test]
    fn status_changes_do_not_trigger_but_spec_finalizers_and_deletion_do() {
        let base = CnsVolumeMetadata::new("gc-1-a", pvc_spec());
        let mut status_only = base.clone();
        status_only
            .status
            .volume_status
            .push(crate::resource::VolumeStatus::updated("x"));
        status_only.metadata.resource_version = Some("99".into());
        assert_eq!(trigger_hash(&base), trigger_hash(&status_only));

        let mut spec = base.clone();
        spec.spec.entity_name = "other".into();
        let mut finalized = base.clone();
        finalized.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let mut deleting = finalized.clone();
        deleting.metadata.deletion_timestamp = Some(Time(jiff_now()));
        for changed in [&spec, &finalized] {
            assert_ne!(trigger_hash(&base), trigger_hash(changed));
        }
        assert_ne!(trigger_hash(&finalized), trigger_hash(&deleting));
    }

    fn jiff_now() -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH
    }
}
