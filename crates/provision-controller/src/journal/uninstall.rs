//! [`Uninstall`]: removes the journal (and, when asked, the PV finalizer) once no
//! controller runs.

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
};

use super::{
    format::{JOURNAL_LABEL, Shard, label_value, object_seq},
    location,
};
use crate::{LeaderElection, annotations::FINALIZER_PV};

/// One entry the journal still held when [`Uninstall::run`] removed it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalRecord {
    /// The claim's `namespace/name`.
    pub claim: String,
    /// The claim's uid.
    pub claim_uid: String,
    /// The PV name its asset has (or would have).
    pub pv_name: String,
    /// `true`: a provisioning had started and no PV recorded its asset yet: the backend
    /// may hold an asset for `pv_name` that nothing in the cluster names; check it.
    /// `false`: a PV recorded the asset; only the last late-asset sweep was still due.
    pub in_flight: bool,
}

/// What [`Uninstall::run`] found and removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UninstallReport {
    /// The journal objects deleted.
    pub objects_deleted: Vec<String>,
    /// The entries they held.
    pub records: Vec<JournalRecord>,
    /// The PVs whose finalizer
    /// [`FINALIZER_PV`] was removed.
    pub finalizers_removed: Vec<String>,
}

/// Removes what a provision controller leaves in a cluster once it no longer runs: its
/// journal objects and, when asked, the PV finalizer it shares with Go's library. Claims
/// carry nothing of the controller's.
///
/// Stop every replica first (scale the Deployment to 0): a running controller writes its
/// journal again. Then run this, read the report (entries still
/// [`in_flight`](JournalRecord::in_flight) name assets the backend may hold without a
/// PV), and delete the Lease and the RBAC objects (see `docs/production.md`).
///
/// ```no_run
/// # async fn doc(client: kube_client::Client) -> Result<(), kube_client::Error> {
/// use provision_controller::Uninstall;
/// let report = Uninstall::new(client, "example.com/nfs")
///     .namespace("storage")
///     .remove_pv_finalizers(true)
///     .run()
///     .await?;
/// for record in report.records.iter().filter(|r| r.in_flight) {
///     println!("check the backend for {} (claim {})", record.pv_name, record.claim);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Uninstall {
    client: Client,
    provisioner_name: String,
    additional_names: Vec<String>,
    election: LeaderElection,
    journal_namespace: Option<String>,
    remove_pv_finalizers: bool,
}

impl Uninstall {
    /// Uninstalls the controller of `provisioner_name`, whose journal is in the client's
    /// namespace under the default lease name, unless set otherwise.
    #[must_use]
    pub fn new(client: Client, provisioner_name: impl Into<String>) -> Self {
        Self {
            client,
            provisioner_name: provisioner_name.into(),
            additional_names: Vec::new(),
            election: LeaderElection::default(),
            journal_namespace: None,
            remove_pv_finalizers: false,
        }
    }

    /// The other names the controller answered to
    /// ([`Config::additional_provisioner_names`](crate::Config)): their PVs are the
    /// controller's too when [`remove_pv_finalizers`](Self::remove_pv_finalizers) is set.
    #[must_use]
    pub fn additional_provisioner_names(mut self, names: Vec<String>) -> Self {
        self.additional_names = names;
        self
    }

    /// The controller's namespace (its Lease's), when not the client's.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.election.namespace = namespace.into();
        self
    }

    /// The journal's namespace, when the controller had one set
    /// ([`Config::journal_namespace`](crate::Config::journal_namespace)).
    #[must_use]
    pub fn journal_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.journal_namespace = Some(namespace.into());
        self
    }

    /// The controller's lease name, when it was set with `LeaderElection::lease_name`.
    #[must_use]
    pub fn lease_name(mut self, lease_name: impl Into<String>) -> Self {
        self.election.lease_name = lease_name.into();
        self
    }

    /// Also removes [`FINALIZER_PV`] from every PV the
    /// controller would delete (made by this provisioner, `pv.kubernetes.io/provisioned-by`,
    /// migrated to it, or a static CSI PV of its driver name): for an uninstall that
    /// installs no other provisioner of the same name (Go's library and the CSI
    /// external-provisioner use the same finalizer and would keep using it). A PV being
    /// deleted then goes without its asset being deleted. Default off.
    #[must_use]
    pub fn remove_pv_finalizers(mut self, remove: bool) -> Self {
        self.remove_pv_finalizers = remove;
        self
    }

    /// Reports and deletes the journal, then removes the PV finalizers when asked.
    ///
    /// # Errors
    /// The first API call that failed; what was removed before stays removed, and running
    /// it again continues.
    pub async fn run(self) -> Result<UninstallReport, kube_client::Error> {
        let (namespace, lease_name) =
            location(&self.client, &self.provisioner_name, Some(&self.election));
        let namespace = self.journal_namespace.clone().unwrap_or(namespace);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
        let params =
            ListParams::default().labels(&format!("{JOURNAL_LABEL}={}", label_value(&lease_name)));
        let mut report = UninstallReport::default();
        // An object is deleted as it was read (resourceVersion precondition): one that a
        // replica still running wrote meanwhile is read again, so that what it holds is
        // reported before it goes.
        let mut todo: Vec<ConfigMap> = api.list(&params).await?.items;
        let mut rounds = 0;
        while let Some(cm) = todo.pop() {
            let Some(name) = cm.metadata.name.clone() else {
                continue;
            };
            if object_seq(&lease_name, &name).is_none() {
                continue;
            }
            let delete = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: cm.metadata.resource_version.clone(),
                    uid: cm.metadata.uid.clone(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &delete).await {
                Ok(_) => {}
                Err(kube_client::Error::Api(s)) if s.code == 404 => continue,
                Err(kube_client::Error::Api(s)) if s.code == 409 && rounds < 10 => {
                    rounds += 1;
                    if let Some(again) = api.get_opt(&name).await? {
                        todo.push(again);
                    }
                    continue;
                }
                Err(err) => return Err(err),
            }
            for (uid, entry) in Shard::parse(&cm).entries {
                report.records.push(JournalRecord {
                    claim: entry.claim.clone(),
                    claim_uid: uid,
                    pv_name: entry.pv.clone(),
                    in_flight: entry.is_intent(),
                });
            }
            report.objects_deleted.push(name);
        }
        if self.remove_pv_finalizers {
            let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
            for pv in volumes.list(&ListParams::default()).await?.items {
                let names = crate::controller::names::Names {
                    primary: &self.provisioner_name,
                    additional: &self.additional_names,
                };
                let ours = crate::controller::names::is_ours(&pv, names);
                if !ours || !crate::annotations::has_finalizer(&pv, FINALIZER_PV) {
                    continue;
                }
                let name = pv.metadata.name.clone().unwrap_or_default();
                let patch = serde_json::json!({"metadata": {
                    "$deleteFromPrimitiveList/finalizers": [FINALIZER_PV]
                }});
                match volumes
                    .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                {
                    Ok(_) => report.finalizers_removed.push(name),
                    Err(kube_client::Error::Api(s)) if s.code == 404 => {}
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(report)
    }
}
