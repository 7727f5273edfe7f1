//! The manifests a driver prints (`provision_controller::manifests`, the README driver's
//! `--print-manifests`): a server-side dry run of `kubectl apply` on kube-sim accepts every
//! object, and the Roles grant every Lease and ConfigMap call the controller makes while it
//! provisions and deletes, by name where RBAC allows, and nothing on a ConfigMap that is not
//! the journal's: first evaluated here on kube-sim's request log, then enforced by kube-sim
//! itself (`Builder::rbac`) with the controller running as the printed ServiceAccount.

use std::process::Stdio;
use std::time::Duration;

use provision_controller::manifests::Manifests;
use provision_controller::testing::{DriverTest, FakeProvisioner, pvc};
use provision_controller::{Config, LeaderElection, ProvisionController};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const NAME: &str = "example.com/my-driver";
const NAMESPACE: &str = "my-driver";

/// The objects in apply order, as JSON values (read back from the YAML a binary prints).
fn values(set: &Manifests) -> Vec<Value> {
    serde_saphyr::from_multiple(&set.to_yaml()).unwrap()
}

fn manifests() -> Manifests {
    Manifests::new(NAME, NAMESPACE, "registry.example.com/my-driver:0.1.0").metrics_port(8080)
}

/// Runs kubectl against `sim` with `yaml` on its standard input.
async fn kubectl(sim: &kube_sim::KubeSim, args: &[&str], yaml: &str) -> (bool, String) {
    let cache = std::env::temp_dir().join(format!("kubectl-cache-{}", std::process::id()));
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .arg("--cache-dir")
        .arg(&cache)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(yaml.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl finished")
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[tokio::test]
async fn a_server_side_dry_run_accepts_every_printed_object() {
    let found = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    if !found.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: kubectl is not installed (or `kubectl version --client` failed)");
        return;
    }
    let sim = kube_sim::KubeSim::start().await.unwrap();
    let set = manifests();
    // Objects of a namespace that does not exist yet are refused even in a dry run (as a
    // real server's NamespaceLifecycle does): the namespaces go first, for real.
    let namespaces: String = values(&set)
        .into_iter()
        .filter(|v| v["kind"] == "Namespace")
        .map(|v| format!("---\n{}", serde_saphyr::to_string(&v).unwrap()))
        .collect();
    let (ok, out) = kubectl(&sim, &["apply", "-f", "-"], &namespaces).await;
    assert!(ok, "{out}");
    let yaml = set.to_yaml();
    let (ok, out) = kubectl(&sim, &["apply", "--dry-run=server", "-f", "-"], &yaml).await;
    assert!(ok, "{out}");
    let accepted = out
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    assert_eq!(accepted, values(&set).len(), "{out}");
}

/// Whether the printed rules let the driver's ServiceAccount do `verb` on `resource` of
/// `group`, object `name`, in `namespace` (`None`: cluster-wide).
fn allowed(
    docs: &[Value],
    namespace: Option<&str>,
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let has = |v: &Value, want: &str| v.as_array().is_some_and(|a| a.iter().any(|s| s == want));
    docs.iter()
        .filter(|d| match d["kind"].as_str() {
            Some("ClusterRole") => true,
            Some("Role") => namespace.is_some() && d["metadata"]["namespace"] == namespace.unwrap(),
            _ => false,
        })
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .any(|rule| {
            has(&rule["apiGroups"], group)
                && has(&rule["resources"], resource)
                && has(&rule["verbs"], verb)
                && (rule["resourceNames"].is_null()
                    || name.is_some_and(|n| has(&rule["resourceNames"], n)))
        })
}

#[tokio::test]
async fn the_roles_grant_every_lease_and_journal_call_and_no_other_configmap() {
    let set = manifests();
    let docs = values(&set);
    // Every Role is bound to the driver's ServiceAccount.
    for binding in docs.iter().filter(|d| d["kind"] == "RoleBinding") {
        assert_eq!(binding["subjects"][0]["name"], "example.com-my-driver");
        assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    }
    let journal_namespace = manifests().journal_namespace();
    let config = Config::default()
        .leader_election(Some(LeaderElection::default().namespace(NAMESPACE)))
        .journal_namespace(Some(journal_namespace.clone()));
    let test = DriverTest::start_controller(NAME, move |client| {
        ProvisionController::new(client, NAME, FakeProvisioner::new()).config(config)
    })
    .await
    .unwrap();
    // The namespaces the manifests create (the Lease's and the journal's).
    let namespaces: kube_client::Api<k8s_openapi::api::core::v1::Namespace> =
        kube_client::Api::all(test.client());
    for namespace in &set.namespaces {
        namespaces
            .create(&Default::default(), namespace)
            .await
            .unwrap();
    }
    test.provision(pvc("data").request("1Gi")).await.unwrap();
    test.delete(&pvc("data").build()).await.unwrap();
    let calls: Vec<_> = test
        .sim()
        .requests()
        .into_iter()
        .filter(|r| matches!(r.resource.as_str(), "leases" | "configmaps"))
        .collect();
    assert!(
        calls.iter().any(|r| r.resource == "configmaps"),
        "the journal was written"
    );
    assert!(
        calls.iter().any(|r| r.resource == "leases"),
        "the lease was taken"
    );
    for call in &calls {
        let group = if call.resource == "leases" {
            "coordination.k8s.io"
        } else {
            ""
        };
        // A create names no existing object: RBAC sees no name for it.
        let name = (call.verb != "create")
            .then_some(call.name.as_deref())
            .flatten();
        assert!(
            allowed(
                &docs,
                call.namespace.as_deref(),
                group,
                &call.resource,
                &call.verb,
                name
            ),
            "not granted: {call:?}"
        );
    }
    test.stop().await.unwrap();
    // A ConfigMap of the driver's namespace (its own configuration, say) is out of reach.
    for verb in ["get", "list", "update", "patch", "delete"] {
        assert!(
            !allowed(
                &docs,
                Some(NAMESPACE),
                "",
                "configmaps",
                verb,
                Some("my-driver-settings")
            ),
            "{verb} on another ConfigMap is granted"
        );
    }
    // Leases of others too.
    assert!(!allowed(
        &docs,
        Some(NAMESPACE),
        "coordination.k8s.io",
        "leases",
        "update",
        Some("other")
    ));
}

/// The least-privilege check: the printed manifests applied to kube-sim with RBAC enforced,
/// and the controller run under the printed ServiceAccount (its own client and its leader
/// election client) through leader election, the journal, a provision, a delete and a
/// release. Nothing it calls is forbidden, every rule the manifests grant is used (or is
/// listed below with the reason this run does not reach it), and the ServiceAccount cannot
/// touch a ConfigMap of its own namespace.
#[tokio::test]
async fn under_its_service_account_with_rbac_enforced_the_driver_is_refused_nothing() {
    use std::collections::BTreeSet;

    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use kube_client::Api;
    use kube_client::api::{DeleteParams, PostParams};
    use provision_controller::testing::class;

    let sim = kube_sim::KubeSim::builder()
        .pv_binder(true)
        .rbac(true)
        .start()
        .await
        .unwrap();
    let admin = sim.client();
    let pp = PostParams::default();
    let set = manifests();
    for namespace in &set.namespaces {
        Api::<Namespace>::all(admin.clone())
            .create(&pp, namespace)
            .await
            .unwrap();
    }
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create(&pp, &set.service_account)
        .await
        .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &set.cluster_role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &set.cluster_role_binding)
        .await
        .unwrap();
    for role in &set.roles {
        let ns = role.metadata.namespace.as_deref().unwrap();
        Api::<Role>::namespaced(admin.clone(), ns)
            .create(&pp, role)
            .await
            .unwrap();
    }
    for binding in &set.role_bindings {
        let ns = binding.metadata.namespace.as_deref().unwrap();
        Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .create(&pp, binding)
            .await
            .unwrap();
    }
    // The driver's own configuration, which the driver must not be able to change.
    let settings: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "my-driver-settings"}, "data": {"mode": "safe"}
    }))
    .unwrap();
    let driver_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    driver_maps.create(&pp, &settings).await.unwrap();
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(admin.clone())
        .create(&pp, &class("fast").provisioner(NAME).build())
        .await
        .unwrap();

    let sa = manifests().name();
    let user = format!("system:serviceaccount:{NAMESPACE}:{sa}");
    let config = sim.service_account_config(NAMESPACE, &sa);
    let client = kube_client::Client::try_from(config.clone()).unwrap();
    let leader_client = provision_controller::client::for_leader_election(&config).unwrap();
    let controller_config = Config::default()
        .leader_election(Some(LeaderElection::default().namespace(NAMESPACE)))
        .journal_namespace(Some(manifests().journal_namespace()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(
        ProvisionController::new(client.clone(), NAME, FakeProvisioner::new())
            .config(controller_config)
            .leader_election_client(leader_client)
            .run(async {
                let _ = stopped.await;
            }),
    );

    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(admin.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(admin.clone());
    // Two claims, the second created while the first one's journal entry is still there
    // (entries go a second or more after they settle), so its intent rewrites that object.
    let mut bound = Vec::new();
    for name in ["data", "logs"] {
        claims
            .create(&pp, &pvc(name).storage_class("fast").request("1Gi").build())
            .await
            .unwrap();
        let volume = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let claim = claims.get(name).await.unwrap();
                if claim.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                    return claim.spec.unwrap().volume_name.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the claim was bound within 30 s");
        bound.push((name, volume));
    }
    for (name, volume) in bound {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), async {
            while volumes.get_opt(&volume).await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the volume was deleted within 30 s");
    }
    // The journal's entry goes lazily (a second or more after it settles): its object is
    // rewritten, then deleted once empty.
    let journal: Api<ConfigMap> = Api::namespaced(admin.clone(), &manifests().journal_namespace());
    tokio::time::timeout(Duration::from_secs(30), async {
        while !journal
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the journal was emptied within 30 s");
    stop.send(()).unwrap();
    controller.await.unwrap().unwrap();

    let calls: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.user.as_deref() == Some(user.as_str()))
        .collect();
    let refused: Vec<_> = calls
        .iter()
        .filter(|r| r.status == 403 || r.status == 401)
        .collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");
    // What the driver did, as `verb resource[/subresource]`.
    let key = |verb: &str, resource: &str, sub: Option<&str>| match sub {
        Some(sub) => format!("{verb} {resource}/{sub}"),
        None => format!("{verb} {resource}"),
    };
    let used: BTreeSet<String> = calls
        .iter()
        .map(|r| key(&r.verb, &r.resource, r.subresource.as_deref()))
        .collect();
    for needed in [
        "create leases",
        "update leases",
        "create configmaps",
        "create persistentvolumes",
        "delete persistentvolumes",
        "create events",
    ] {
        assert!(used.contains(needed), "the run did not {needed}: {used:?}");
    }
    // Everything granted, from the printed rules.
    let granted: BTreeSet<String> = values(&set)
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .flat_map(|rule| {
            let strings = |v: &Value| -> Vec<String> {
                v.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            };
            let resources = strings(&rule["resources"]);
            strings(&rule["verbs"])
                .into_iter()
                .flat_map(move |verb| {
                    resources
                        .clone()
                        .into_iter()
                        .map(move |resource| format!("{verb} {resource}"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let unused: BTreeSet<&str> = granted
        .iter()
        .filter(|g| !used.contains(*g))
        .map(String::as_str)
        .collect();
    // Granted for paths a run like this one may not take; each is what a real run needs at
    // times.
    let not_reached = BTreeSet::from([
        // rescheduling a claim whose selected node cannot host it (remove the annotation)
        "get persistentvolumeclaims",
        "update persistentvolumeclaims",
        // counting a repeated event in its series
        "patch events",
        // reading a journal object again after a write conflict
        "get configmaps",
        // the PV protection finalizer, when the controller has to add or drop it itself
        "patch persistentvolumes",
        // a PV read again by name (the cache usually answers)
        "get persistentvolumes",
    ]);
    let surplus: Vec<_> = unused.difference(&not_reached).collect();
    assert!(
        surplus.is_empty(),
        "granted but neither used nor explained: {surplus:?}; used: {used:?}"
    );

    // A ConfigMap of the driver's namespace is out of reach, whatever the verb.
    let as_driver: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let forbidden = |result: Result<_, kube_client::Error>| match result {
        Err(kube_client::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected 403, got {other:?}"),
    };
    let (code, message) = forbidden(as_driver.get("my-driver-settings").await.map(drop));
    assert_eq!(code, 403);
    assert_eq!(
        message,
        format!(
            "configmaps \"my-driver-settings\" is forbidden: User \"{user}\" cannot get \
             resource \"configmaps\" in API group \"\" in the namespace \"{NAMESPACE}\""
        )
    );
    let mut changed = driver_maps.get("my-driver-settings").await.unwrap();
    changed.data = Some([("mode".to_owned(), "unsafe".to_owned())].into());
    let (code, message) = forbidden(
        as_driver
            .replace("my-driver-settings", &pp, &changed)
            .await
            .map(drop),
    );
    assert_eq!(code, 403, "{message}");
    let patch = kube_client::api::Patch::Merge(serde_json::json!({"data": {"mode": "unsafe"}}));
    let (code, _) = forbidden(
        as_driver
            .patch("my-driver-settings", &Default::default(), &patch)
            .await
            .map(drop),
    );
    assert_eq!(code, 403);
    let (code, _) = forbidden(
        as_driver
            .delete("my-driver-settings", &DeleteParams::default())
            .await
            .map(drop),
    );
    assert_eq!(code, 403);
    let (code, _) = forbidden(as_driver.list(&Default::default()).await.map(drop));
    assert_eq!(code, 403);
    assert_eq!(
        driver_maps.get("my-driver-settings").await.unwrap().data,
        settings.data
    );
    // Nor another Lease of its namespace.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client, NAMESPACE);
    assert_eq!(forbidden(leases.get("someone-else").await.map(drop)).0, 403);
}

/// One granted verb: namespace (`""` for a ClusterRole), group, resource, verb, and the one
/// object it is limited to (`None`: every object).
type Grant = (String, String, String, String, Option<String>);

/// What the ClusterRoles and Roles of `docs` grant, one entry per verb and name.
fn grants(docs: &[Value]) -> std::collections::BTreeSet<Grant> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    let mut out = std::collections::BTreeSet::new();
    for doc in docs {
        let namespace = match doc["kind"].as_str() {
            Some("ClusterRole") => String::new(),
            Some("Role") => doc["metadata"]["namespace"].as_str().unwrap().to_owned(),
            _ => continue,
        };
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let names = strings(&rule["resourceNames"]);
            let names: Vec<Option<String>> = if names.is_empty() {
                vec![None]
            } else {
                names.into_iter().map(Some).collect()
            };
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        for name in &names {
                            out.insert((
                                namespace.clone(),
                                group.clone(),
                                resource.clone(),
                                verb.clone(),
                                name.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

/// What `permissions` grant in `namespace`.
fn permission_grants(
    namespace: &str,
    permissions: &[provision_controller::rbac::Permission],
) -> std::collections::BTreeSet<Grant> {
    use provision_controller::rbac::Names;
    let mut out = std::collections::BTreeSet::new();
    for p in permissions {
        let name = match p.names {
            Names::Named(name) => Some(name.to_owned()),
            Names::Any => None,
            other => panic!("not expected in the vSphere reconciler's rules: {other:?}"),
        };
        for verb in p.verbs {
            out.insert((
                namespace.to_owned(),
                p.group.to_owned(),
                p.resource.to_owned(),
                (*verb).to_owned(),
                name.clone(),
            ));
        }
    }
    out
}

/// The vSphere binary's shipped RBAC (`examples/deploy/vsphere-rbac.yaml`) against what
/// `provision_controller::manifests` generates for the same provisioner and namespace. The
/// differences, each asserted so that a change to either side shows here:
/// - names: the shipped objects are `vsphere-cns-controllers`, the generated ones are named
///   after the provisioner (`csi.vsphere.vmware.com`); only the rules are compared;
/// - the CnsVolumeMetadata reconciler's rules, which a provisioner alone does not need:
///   `vsphere_controllers::rbac::METADATA_PERMISSIONS` and `CRD_PERMISSIONS` in the
///   ClusterRole, `FEATURE_STATES_PERMISSIONS` (the feature-state ConfigMap, by name) in
///   the namespace;
/// - the journal is where the generated manifests put it, in a namespace of its own
///   (`vmware-system-csi-journal`, `JOURNAL_NAMESPACE` in the shipped Deployment), so its
///   Role reaches no ConfigMap of the controller's namespace (the supervisor's
///   `csi-feature-states` is listed and watched by name only).
#[test]
fn the_vsphere_rbac_is_the_generated_driver_rbac_plus_the_reconcilers_rules() {
    use vsphere_controllers::rbac::{
        CRD_PERMISSIONS, FEATURE_STATES_PERMISSIONS, METADATA_PERMISSIONS,
    };
    const CSI_NAMESPACE: &str = "vmware-system-csi";

    let generated = Manifests::new(vsphere_cns::CSI_DRIVER, CSI_NAMESPACE, "unused");
    let generated = grants(&values(&generated));
    let shipped: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../examples/deploy/vsphere-rbac.yaml")).unwrap();
    let shipped = grants(&shipped);
    let in_namespace = |set: &std::collections::BTreeSet<Grant>, ns: &str| {
        set.iter()
            .filter(|g| g.0 == ns)
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
    };

    // Cluster-wide: the generated ClusterRole, plus the reconciler's rules.
    let mut expected = in_namespace(&generated, "");
    expected.extend(permission_grants("", METADATA_PERMISSIONS));
    expected.extend(permission_grants("", CRD_PERMISSIONS));
    assert_eq!(in_namespace(&shipped, ""), expected, "the ClusterRole");
    // The reconciler's additions are real additions: the provisioner alone has none of them.
    assert!(!in_namespace(&generated, "").contains(&(
        String::new(),
        "cns.vmware.com".into(),
        "cnsvolumemetadatas".into(),
        "update".into(),
        None
    )));

    // The controller's namespace: the generated Lease rules and the feature-state ConfigMap
    // by name; the journal's namespace: the generated journal rules, unchanged.
    let journal_namespace = format!("{CSI_NAMESPACE}-journal");
    let journal = in_namespace(&generated, &journal_namespace);
    assert!(!journal.is_empty(), "the generated journal Role");
    assert_eq!(
        in_namespace(&shipped, &journal_namespace),
        journal,
        "the Role in {journal_namespace}"
    );
    let mut expected = in_namespace(&generated, CSI_NAMESPACE);
    expected.extend(permission_grants(CSI_NAMESPACE, FEATURE_STATES_PERMISSIONS));
    assert_eq!(
        in_namespace(&shipped, CSI_NAMESPACE),
        expected,
        "the Role in {CSI_NAMESPACE}"
    );
    // Nowhere else.
    let namespaces: std::collections::BTreeSet<_> = shipped.iter().map(|g| g.0.clone()).collect();
    assert_eq!(
        namespaces,
        [String::new(), CSI_NAMESPACE.to_owned(), journal_namespace].into(),
        "the shipped roles' namespaces"
    );
}
