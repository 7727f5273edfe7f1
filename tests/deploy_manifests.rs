//! The manifests shipped in `examples/deploy` match what the crates generate or use. These
//! tests live here, not in the crates, so each crate's package builds and tests alone.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Probe, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use provision_controller::LeaderElection;
use provision_controller::rbac::{Names, Permission};

const CLUSTER_PERMISSIONS: &[Permission] = Permission::CLUSTER;
const LEADER_ELECTION_PERMISSIONS: &[Permission] = Permission::LEADER_ELECTION;
const JOURNAL_PERMISSIONS: &[Permission] = Permission::JOURNAL;

/// One granted verb: group, resource, verb, and the one object it is limited to (`None`:
/// every object).
type Grants = BTreeSet<(String, String, String, Option<String>)>;

/// What `permissions` grant, with [`Names::LeaseName`] standing for `lease`.
fn flatten<'a>(permissions: impl IntoIterator<Item = &'a Permission>, lease: &str) -> Grants {
    let mut out = Grants::new();
    for p in permissions {
        let name = match p.names {
            Names::LeaseName => Some(lease.to_owned()),
            Names::Named(name) => Some(name.to_owned()),
            _ => None,
        };
        for verb in p.verbs {
            out.insert((
                p.group.to_owned(),
                p.resource.to_owned(),
                (*verb).to_owned(),
                name.clone(),
            ));
        }
    }
    out
}

/// What the rules of every `kind` document grant; a rule with `resourceNames` grants each
/// verb once per name.
fn granted(docs: &[serde_json::Value], kind: &str) -> Grants {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    let mut out = Grants::new();
    for doc in docs.iter().filter(|d| d["kind"] == kind) {
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

fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple(yaml).unwrap()
}

/// The one document of `kind` in `docs`.
fn one(docs: &[serde_json::Value], kind: &str) -> serde_json::Value {
    let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0].clone()
}

/// The service account every binding names, and that it is the one in `docs`: a
/// ClusterRoleBinding and `role_bindings` RoleBindings, each naming a role in the file.
fn bound_account(docs: &[serde_json::Value], role_bindings: usize) -> (String, String) {
    let account = &docs.iter().find(|d| d["kind"] == "ServiceAccount").unwrap()["metadata"];
    let account = (
        account["name"].as_str().unwrap().to_owned(),
        account["namespace"].as_str().unwrap().to_owned(),
    );
    let bindings: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .collect();
    assert_eq!(
        bindings.len(),
        1 + role_bindings,
        "a ClusterRoleBinding and {role_bindings} RoleBinding(s)"
    );
    for binding in bindings {
        let subjects = binding["subjects"].as_array().unwrap();
        assert_eq!(subjects.len(), 1, "{binding}");
        let subject = (
            subjects[0]["name"].as_str().unwrap().to_owned(),
            subjects[0]["namespace"].as_str().unwrap().to_owned(),
        );
        assert_eq!(subject, account, "{binding}");
        let role_kind = if binding["kind"] == "RoleBinding" {
            "Role"
        } else {
            "ClusterRole"
        };
        assert_eq!(binding["roleRef"]["kind"], role_kind, "{binding}");
        let role = docs.iter().find(|d| {
            d["kind"] == role_kind && d["metadata"]["name"] == binding["roleRef"]["name"]
        });
        assert!(role.is_some(), "the role {binding} names is in the file");
    }
    let role = docs.iter().find(|d| d["kind"] == "Role").unwrap();
    assert_eq!(
        role["metadata"]["namespace"].as_str(),
        Some(account.1.as_str())
    );
    account
}

#[test]
fn the_example_rbac_grants_exactly_what_the_controller_uses() {
    let docs = documents(include_str!("../examples/deploy/provisioner-rbac.yaml"));
    let lease = LeaderElection::lease_name_for("example.com/example-provisioner");
    assert_eq!(
        granted(&docs, "ClusterRole"),
        flatten(CLUSTER_PERMISSIONS, &lease)
    );
    assert_eq!(
        granted(&docs, "Role"),
        flatten(
            LEADER_ELECTION_PERMISSIONS
                .iter()
                .chain(JOURNAL_PERMISSIONS),
            &lease
        )
    );
    let (account, namespace) = bound_account(&docs, 1);
    assert_eq!(
        (account.as_str(), namespace.as_str()),
        ("example-provisioner", "example-provisioner")
    );
    // The namespace is the provisioner's own, and the file creates it.
    let created = one(&docs, "Namespace");
    assert_eq!(
        created["metadata"]["name"].as_str(),
        Some(namespace.as_str())
    );
    assert_eq!(created["apiVersion"], "v1");
}

/// Namespaces every cluster has and other components use: a Role there that grants every
/// ConfigMap reaches theirs (CoreDNS's and kube-proxy's configuration in kube-system).
const SHARED_NAMESPACES: [&str; 4] = ["kube-system", "kube-public", "kube-node-lease", "default"];

/// The namespace of each Role in `docs` that grants a verb on configmaps (`"<none>"` for a
/// Role without one).
fn configmap_role_namespaces(docs: &[serde_json::Value]) -> Vec<String> {
    docs.iter()
        .filter(|d| d["kind"] == "Role")
        .filter(|role| {
            let mut rules = role["rules"].as_array().into_iter().flatten();
            rules.any(|rule| {
                rule["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r == "configmaps")
            })
        })
        .map(|role| {
            role["metadata"]["namespace"]
                .as_str()
                .unwrap_or("<none>")
                .to_owned()
        })
        .collect()
}

/// Why the journal's Role in `docs` reaches ConfigMaps that are not the controller's, if it
/// does.
fn journal_role_problem(docs: &[serde_json::Value]) -> Option<String> {
    let namespaces = configmap_role_namespaces(docs);
    if namespaces.is_empty() {
        return Some("no Role grants the journal's configmaps".to_owned());
    }
    namespaces
        .iter()
        .find(|ns| *ns == "<none>" || SHARED_NAMESPACES.contains(&ns.as_str()))
        .map(|ns| format!("a Role granting every ConfigMap of namespace {ns}"))
}

#[test]
fn the_journal_role_is_not_in_kube_system() {
    let provisioner = include_str!("../examples/deploy/provisioner-rbac.yaml");
    for yaml in [
        provisioner,
        include_str!("../examples/deploy/vsphere-rbac.yaml"),
    ] {
        let docs = documents(yaml);
        assert_eq!(journal_role_problem(&docs), None);
        let namespaces = configmap_role_namespaces(&docs);
        assert!(
            !namespaces.iter().any(|ns| ns == "kube-system"),
            "{namespaces:?}"
        );
    }
    // The check catches the example as it was before: everything in kube-system.
    let in_kube_system =
        provisioner.replace("namespace: example-provisioner", "namespace: kube-system");
    assert_ne!(in_kube_system, provisioner);
    assert_eq!(
        journal_role_problem(&documents(&in_kube_system)),
        Some("a Role granting every ConfigMap of namespace kube-system".to_owned())
    );
}

#[test]
fn only_lease_create_and_the_journal_are_unlimited_by_name_in_the_namespaced_roles() {
    for yaml in [
        include_str!("../examples/deploy/provisioner-rbac.yaml"),
        include_str!("../examples/deploy/vsphere-rbac.yaml"),
    ] {
        let unlimited: Vec<_> = granted(&documents(yaml), "Role")
            .into_iter()
            .filter(|(.., name)| name.is_none())
            .map(|(_, resource, verb, _)| format!("{verb} {resource}"))
            .collect();
        let mut want = vec!["create leases".to_owned()];
        want.extend(
            JOURNAL_PERMISSIONS
                .iter()
                .flat_map(|p| p.verbs.iter().map(move |v| format!("{v} {}", p.resource))),
        );
        let (mut got, mut want) = (unlimited, want);
        got.sort();
        want.sort();
        assert_eq!(got, want);
    }
}

#[test]
fn the_vsphere_rbac_grants_exactly_what_both_controllers_use() {
    use vsphere_controllers::rbac;
    let docs = documents(include_str!("../examples/deploy/vsphere-rbac.yaml"));
    let lease = LeaderElection::lease_name_for(vsphere_cns::CSI_DRIVER);
    let union: Grants = flatten(CLUSTER_PERMISSIONS, &lease)
        .into_iter()
        .chain(flatten(rbac::METADATA_PERMISSIONS, &lease))
        .chain(flatten(rbac::CRD_PERMISSIONS, &lease))
        .collect();
    assert_eq!(granted(&docs, "ClusterRole"), union);
    assert_eq!(
        granted(&docs, "ClusterRole"),
        flatten(&rbac::cluster_permissions(), &lease)
    );
    let namespaced = rbac::LEADER_ELECTION_PERMISSIONS
        .iter()
        .chain(rbac::JOURNAL_PERMISSIONS)
        .chain(rbac::FEATURE_STATES_PERMISSIONS);
    assert_eq!(granted(&docs, "Role"), flatten(namespaced, &lease));
    // The journal in a namespace of its own, the Lease and the feature-state ConfigMap in
    // the controller's.
    let (_, namespace) = bound_account(&docs, 2);
    let home = rbac::LEADER_ELECTION_PERMISSIONS
        .iter()
        .chain(rbac::FEATURE_STATES_PERMISSIONS);
    assert_eq!(granted_in(&docs, &namespace), flatten(home, &lease));
    let journal = format!("{namespace}-journal");
    assert_eq!(
        granted_in(&docs, &journal),
        flatten(rbac::JOURNAL_PERMISSIONS, &lease)
    );
}

fn http_path(probe: &Option<Probe>) -> Option<(&str, String)> {
    let get = probe.as_ref()?.http_get.as_ref()?;
    let port = match &get.port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
    };
    Some((get.path.as_deref()?, port))
}

/// Liveness on /healthz; readiness and startup on /readyz (which waits for the caches);
/// all on the container's named metrics port.
fn assert_probes(container: &Container) {
    let metrics = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("a metrics port");
    let on = |path: &'static str| Some((path, "metrics".to_owned()));
    assert_eq!(http_path(&container.liveness_probe), on("/healthz"));
    assert_eq!(http_path(&container.readiness_probe), on("/readyz"));
    assert_eq!(http_path(&container.startup_probe), on("/readyz"));
    assert_eq!(metrics.container_port, 8080);
}

#[test]
fn the_example_deployment_probes_readyz_and_outlasts_the_stop() {
    let docs = documents(include_str!(
        "../examples/deploy/provisioner-deployment.yaml"
    ));
    let deployment: Deployment = serde_json::from_value(one(&docs, "Deployment")).unwrap();
    // The Deployment runs in the namespace of the RBAC's service account (where its Role
    // grants the Lease and the journal), and tells the controller so.
    let rbac = documents(include_str!("../examples/deploy/provisioner-rbac.yaml"));
    let (account, namespace) = bound_account(&rbac, 1);
    assert_eq!(
        deployment.metadata.namespace.as_deref(),
        Some(namespace.as_str())
    );
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(account.as_str()));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("example-provisioner")
    );
    let pod_namespace = pod.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_NAMESPACE")
        .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
        .expect("POD_NAMESPACE from the downward API");
    assert_eq!(pod_namespace.field_path, "metadata.namespace");
    assert_probes(&pod.containers[0]);
    // The drain, then the lease release (bounded by the renew deadline).
    let stop = provision_controller::Config::DEFAULT_SHUTDOWN_GRACE
        + LeaderElection::default().renew_deadline;
    let grace = Duration::from_secs(pod.termination_grace_period_seconds.unwrap() as u64);
    assert!(grace > stop, "{grace:?} must exceed {stop:?}");
}

#[test]
fn the_vsphere_deployment_runs_two_replicas_with_probes_and_the_secret_config() {
    let rbac = documents(include_str!("../examples/deploy/vsphere-rbac.yaml"));
    let (account, namespace) = bound_account(&rbac, 2);
    let docs = documents(include_str!("../examples/deploy/vsphere-deployment.yaml"));
    let deployment: Deployment = serde_json::from_value(one(&docs, "Deployment")).unwrap();
    let secret: Secret = serde_json::from_value(one(&docs, "Secret")).unwrap();
    assert_eq!(
        deployment.metadata.namespace.as_deref(),
        Some(namespace.as_str())
    );
    assert_eq!(
        secret.metadata.namespace.as_deref(),
        Some(namespace.as_str())
    );
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(account.as_str()));
    let container = &pod.containers[0];
    assert_probes(container);
    assert!(
        container
            .args
            .iter()
            .flatten()
            .any(|a| a == "--metrics-address=0.0.0.0:8080"),
        "the binary serves the probes on the metrics port"
    );
    let env = |name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is set"))
    };
    let pod_namespace = env("POD_NAMESPACE").value_from.unwrap().field_ref.unwrap();
    assert_eq!(pod_namespace.field_path, "metadata.namespace");
    // The journal where the RBAC grants it: a namespace of its own, created by the file.
    let journal = env("JOURNAL_NAMESPACE").value.unwrap();
    assert_ne!(journal, namespace, "the journal has a namespace of its own");
    assert_eq!(
        granted_in(&rbac, &journal),
        flatten(
            vsphere_controllers::rbac::JOURNAL_PERMISSIONS,
            &LeaderElection::lease_name_for(vsphere_cns::CSI_DRIVER)
        )
    );
    assert!(
        rbac.iter()
            .any(|d| d["kind"] == "Namespace" && d["metadata"]["name"] == journal.as_str()),
        "the RBAC file creates the journal's namespace"
    );

    // The Secret holds a csi-vsphere.conf that parses, mounted read-only where the binary
    // looks by default, readable by owner and group (fsGroup) only.
    let default = Path::new(vsphere_controllers::DEFAULT_VSPHERE_CONFIG);
    let file = default.file_name().unwrap().to_str().unwrap();
    let text = &secret.string_data.as_ref().unwrap()[file];
    vsphere_cns::VsphereConfig::parse(text).unwrap();
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.secret.is_some())
        .expect("a Secret volume");
    let source = volume.secret.as_ref().unwrap();
    assert_eq!(source.secret_name, secret.metadata.name);
    let items = source.items.as_ref().unwrap();
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        (file, file)
    );
    let mode = source.default_mode.unwrap();
    assert!(mode == 0o400 || mode == 0o440, "defaultMode {mode:o}");
    if mode & 0o040 != 0 {
        assert!(
            pod.security_context.as_ref().unwrap().fs_group.is_some(),
            "0440 needs an fsGroup"
        );
    }
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .expect("the Secret is mounted");
    assert_eq!(Path::new(&mount.mount_path), default.parent().unwrap());
    assert_eq!(mount.read_only, Some(true));

    // The kubelet's SIGKILL must not cut off the stop: the drain, the lease release and the
    // vCenter logout.
    let settings = vsphere_controllers::Settings {
        provisioner_name: vsphere_cns::CSI_DRIVER.to_owned(),
        leader_election: true,
        metrics_address: None,
        flavor: cnsmetadata::ClusterFlavor::Workload,
        cluster_id: String::new(),
        supervisor_id: None,
        vsphere_user: String::new(),
        provision_config: provision_controller::Config::default(),
        metadata_config: Ok(cnsmetadata::Config::default()),
        feature_states: vsphere_controllers::FeatureStates::default(),
    };
    let stop = settings.stop_deadline() + vsphere_controllers::LOGOUT_TIMEOUT;
    let grace = Duration::from_secs(pod.termination_grace_period_seconds.unwrap() as u64);
    assert!(grace > stop, "{grace:?} must exceed {stop:?}");
}

const CRD_MANIFEST_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/deploy/cnsvolumemetadata-crd.yaml"
);

#[test]
fn shipped_crd_manifest_matches_crd_yaml() {
    let shipped = std::fs::read_to_string(CRD_MANIFEST_PATH).unwrap();
    assert_eq!(
        shipped,
        cnsmetadata::crd_yaml(),
        "examples/deploy/cnsvolumemetadata-crd.yaml is stale; regenerate it with \
         `cargo test -p integration-tests --test deploy_manifests write_shipped_crd_manifest \
         -- --ignored`"
    );
    let parsed: CustomResourceDefinition = serde_saphyr::from_str(&shipped).unwrap();
    assert_eq!(parsed, cnsmetadata::crd());
}

#[test]
#[ignore = "writes examples/deploy/cnsvolumemetadata-crd.yaml"]
fn write_shipped_crd_manifest() {
    std::fs::write(CRD_MANIFEST_PATH, cnsmetadata::crd_yaml()).unwrap();
}

/// The Role documents in `namespace` and what they grant.
fn granted_in(docs: &[serde_json::Value], namespace: &str) -> Grants {
    let in_namespace: Vec<serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == namespace)
        .cloned()
        .collect();
    granted(&in_namespace, "Role")
}

/// The CSI sidecar's deployment files: its RBAC grants exactly what the sidecar and
/// provision-controller use (the Lease by upstream's name for the driver, the journal in a
/// namespace of its own), every binding names the Deployment's ServiceAccount, and the
/// sidecar shares the driver's socket and probes as a provisioner does.
#[test]
fn the_csi_sidecar_manifests_grant_exactly_what_the_sidecar_uses() {
    let docs = documents(include_str!("../examples/deploy/csi-provisioner-rbac.yaml"));
    let deployment: Deployment = serde_json::from_value(one(
        &documents(include_str!(
            "../examples/deploy/csi-provisioner-sidecar.yaml"
        )),
        "Deployment",
    ))
    .unwrap();
    let pod = deployment.spec.template.spec.unwrap();
    let driver = pod
        .containers
        .iter()
        .find(|c| c.name == "csi-driver")
        .unwrap();
    let name = driver
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--drivername="))
        .expect("the driver's name");
    let lease = csi_provisioner::rbac::lease_name(name);
    let namespace = deployment.metadata.namespace.clone().unwrap();

    let cluster = flatten(
        CLUSTER_PERMISSIONS
            .iter()
            .chain(csi_provisioner::rbac::SIDECAR_PERMISSIONS),
        &lease,
    );
    assert_eq!(granted(&docs, "ClusterRole"), cluster);
    assert_eq!(
        granted_in(&docs, &namespace),
        flatten(LEADER_ELECTION_PERMISSIONS, &lease),
        "the Lease's Role, for {lease}"
    );

    let sidecar = pod
        .containers
        .iter()
        .find(|c| c.name == "csi-provisioner")
        .unwrap();
    let env = |key: &str| {
        sidecar
            .env
            .iter()
            .flatten()
            .find(|e| e.name == key)
            .and_then(|e| e.value.clone())
    };
    let journal = env("JOURNAL_NAMESPACE").expect("JOURNAL_NAMESPACE");
    assert_ne!(journal, namespace, "the journal has a namespace of its own");
    assert_eq!(
        granted_in(&docs, &journal),
        flatten(JOURNAL_PERMISSIONS, &lease)
    );
    let namespaces: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "Namespace")
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(namespaces, [namespace.as_str(), journal.as_str()]);

    // Every binding names the Deployment's ServiceAccount and a role in the file.
    let account = pod.service_account_name.clone().unwrap();
    let bindings: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .collect();
    assert_eq!(bindings.len(), 3);
    for binding in bindings {
        let subjects = binding["subjects"].as_array().unwrap();
        assert_eq!(subjects.len(), 1, "{binding}");
        assert_eq!(subjects[0]["name"], account.as_str(), "{binding}");
        assert_eq!(subjects[0]["namespace"], namespace.as_str(), "{binding}");
        let kind = binding["kind"]
            .as_str()
            .unwrap()
            .trim_end_matches("Binding");
        assert!(
            docs.iter().any(|d| d["kind"] == kind
                && d["metadata"]["name"] == binding["roleRef"]["name"]
                && d["metadata"]["namespace"] == binding["metadata"]["namespace"]),
            "the role {binding} names is in the file"
        );
    }

    // The socket: the sidecar's --csi-address is the driver's endpoint, on a shared volume.
    let address = env("ADDRESS").expect("ADDRESS");
    assert!(
        sidecar
            .args
            .iter()
            .flatten()
            .any(|a| a == "--csi-address=$(ADDRESS)")
    );
    assert!(
        driver
            .args
            .iter()
            .flatten()
            .any(|a| *a == format!("--endpoint=unix://{address}"))
    );
    let mount = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| Path::new(&address).starts_with(&m.mount_path))
            .map(|m| m.name.clone())
    };
    assert_eq!(mount(sidecar), mount(driver));
    assert!(
        mount(sidecar).is_some(),
        "the socket's directory is mounted"
    );
    assert!(
        sidecar
            .args
            .iter()
            .flatten()
            .any(|a| a == "--leader-election")
    );
    assert!(
        sidecar
            .args
            .iter()
            .flatten()
            .any(|a| a == "--http-endpoint=:8080")
    );
    assert_probes(sidecar);
}
