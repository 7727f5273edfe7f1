//! The Kubernetes objects a driver needs to run in a cluster: its namespaces, ServiceAccount,
//! ClusterRole and Roles with their bindings (exactly the [`rbac`](crate::rbac)
//! permissions), and a Deployment with probes, as k8s-openapi objects and as YAML.
//!
//! A binary prints them (`my-driver --print-manifests | kubectl apply -f -`), kube-rs's
//! convention for a controller's CRDs; change the typed objects first when the driver needs
//! more (volumes, arguments, resources).
//!
//! ```
//! use provision_controller::manifests::Manifests;
//!
//! let manifests = Manifests::new(
//!     "example.com/my-driver",
//!     "my-driver",
//!     "registry.example.com/my-driver:1.0.0",
//! )
//! .metrics_port(8080);
//! assert_eq!(manifests.service_account.metadata.name.as_deref(), Some("example.com-my-driver"));
//! let yaml = manifests.to_yaml();
//! assert!(yaml.contains("kind: Deployment"));
//! ```
//!
//! The journal of crash-safe provisioning gets a namespace of its own,
//! `<namespace>-journal` (passed to the binary as `JOURNAL_NAMESPACE`, which
//! [`Config::from_lookup`](crate::Config::from_lookup) reads): its Role covers every
//! ConfigMap of that namespace, and nothing else lives there, so the driver cannot read or
//! change any other ConfigMap (docs/production.md says why names cannot narrow it instead).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    Namespace, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec,
    Probe, ResourceRequirements, SecurityContext, ServiceAccount, WeightedPodAffinityTerm,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::LeaderElection;
use crate::rbac::{Names, Permission};

/// The label that selects the driver's pods.
const APP_LABEL: &str = "app.kubernetes.io/name";

/// What the manifests are generated from: [`Manifests::new`]'s arguments and options.
#[derive(Clone, Debug)]
struct Options {
    provisioner_name: String,
    namespace: String,
    image: String,
    leader_election: bool,
    crash_safe_provisioning: bool,
    metrics_port: u16,
}

/// The objects of a driver, in the order they are applied: built by [`new`](Self::new)
/// and the option methods (each builds them anew), then each is public, to be changed
/// before [`to_yaml`](Self::to_yaml).
#[derive(Clone, Debug)]
pub struct Manifests {
    /// The driver's namespace and the journal's (none for `default` and `kube-*`
    /// namespaces, which exist already and are never the driver's to delete).
    pub namespaces: Vec<Namespace>,
    /// The identity the driver's pods run as.
    pub service_account: ServiceAccount,
    /// Claims, volumes, classes and events, cluster-wide ([`Permission::CLUSTER`]).
    pub cluster_role: ClusterRole,
    /// Binds [`cluster_role`](Self::cluster_role) to the ServiceAccount.
    pub cluster_role_binding: ClusterRoleBinding,
    /// The Lease's Role in the driver's namespace (with leader election) and the journal's
    /// in the journal's namespace (with crash-safe provisioning).
    pub roles: Vec<Role>,
    /// One binding per Role.
    pub role_bindings: Vec<RoleBinding>,
    /// The driver's pods.
    pub deployment: Deployment,
    options: Options,
}

impl Options {
    fn name(&self) -> String {
        LeaderElection::lease_name_for(&self.provisioner_name)
    }

    fn journal_namespace(&self) -> String {
        format!("{}-journal", self.namespace)
    }

    fn build(self) -> Manifests {
        let name = self.name();
        let meta = |namespace: Option<&str>, name: String| ObjectMeta {
            name: Some(name),
            namespace: namespace.map(str::to_owned),
            labels: Some(labels(&self.name())),
            ..ObjectMeta::default()
        };
        let journal_namespace = self.journal_namespace();
        let mut namespaces = vec![self.namespace.clone()];
        if self.crash_safe_provisioning {
            namespaces.push(journal_namespace.clone());
        }
        let namespaces = namespaces
            .into_iter()
            .filter(|ns| ns != "default" && !ns.starts_with("kube-"))
            .map(|ns| Namespace {
                metadata: meta(None, ns),
                ..Namespace::default()
            })
            .collect();
        let subject = Subject {
            kind: "ServiceAccount".into(),
            name: name.clone(),
            namespace: Some(self.namespace.clone()),
            api_group: None,
        };
        let role_ref = |kind: &str, name: String| RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: kind.into(),
            name,
        };
        let mut roles = Vec::new();
        if self.leader_election {
            roles.push(Role {
                metadata: meta(Some(&self.namespace), format!("{name}-leader-election")),
                rules: Some(rules(Permission::LEADER_ELECTION, &name)),
            });
        }
        if self.crash_safe_provisioning {
            roles.push(Role {
                metadata: meta(Some(&journal_namespace), format!("{name}-journal")),
                rules: Some(rules(Permission::JOURNAL, &name)),
            });
        }
        let role_bindings = roles
            .iter()
            .map(|role| RoleBinding {
                metadata: role.metadata.clone(),
                role_ref: role_ref("Role", role.metadata.name.clone().unwrap_or_default()),
                subjects: Some(vec![subject.clone()]),
            })
            .collect();
        Manifests {
            namespaces,
            service_account: ServiceAccount {
                metadata: meta(Some(&self.namespace), name.clone()),
                ..ServiceAccount::default()
            },
            cluster_role: ClusterRole {
                metadata: meta(None, name.clone()),
                rules: Some(rules(Permission::CLUSTER, &name)),
                aggregation_rule: None,
            },
            cluster_role_binding: ClusterRoleBinding {
                metadata: meta(None, name.clone()),
                role_ref: role_ref("ClusterRole", name.clone()),
                subjects: Some(vec![subject]),
            },
            roles,
            role_bindings,
            deployment: self.deployment(meta(Some(&self.namespace), name.clone())),
            options: self,
        }
    }

    fn deployment(&self, metadata: ObjectMeta) -> Deployment {
        let name = self.name();
        let container = self.container();
        let serves = self.metrics_port != 0;
        let selector = labels(&name);
        let annotations = serves.then(|| {
            BTreeMap::from([
                ("prometheus.io/scrape".to_owned(), "true".to_owned()),
                (
                    "prometheus.io/port".to_owned(),
                    self.metrics_port.to_string(),
                ),
                ("prometheus.io/path".to_owned(), "/metrics".to_owned()),
            ])
        });
        let (replicas, strategy, affinity) = self.placement(&selector);
        Deployment {
            metadata,
            spec: DeploymentSpec {
                replicas: Some(replicas),
                selector: LabelSelector {
                    match_labels: Some(selector.clone()),
                    match_expressions: None,
                },
                strategy,
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(selector),
                        annotations,
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(name),
                        // The drain (Config::shutdown_grace, 30 s) and the lease release
                        // (at most the renew deadline, 10 s) fit before SIGKILL.
                        termination_grace_period_seconds: Some(45),
                        affinity,
                        containers: vec![container],
                        ..PodSpec::default()
                    }),
                },
                ..DeploymentSpec::default()
            },
            status: None,
        }
    }

    /// The driver's container: its environment, probes (when it serves metrics),
    /// resources and a locked-down security context.
    fn container(&self) -> Container {
        let env = |name: &str, value: &str| EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        };
        let mut envs = vec![EnvVar {
            name: "POD_NAMESPACE".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.namespace".into(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        }];
        if self.crash_safe_provisioning {
            envs.push(env("JOURNAL_NAMESPACE", &self.journal_namespace()));
        }
        envs.push(env("METRICS_PORT", &self.metrics_port.to_string()));
        envs.push(env("RUST_LOG", "info"));
        let probe = |path: &str, period: i32, failures: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::String("metrics".into()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(period),
            failure_threshold: Some(failures),
            ..Probe::default()
        };
        let serves = self.metrics_port != 0;
        Container {
            name: "driver".into(),
            image: Some(self.image.clone()),
            env: Some(envs),
            ports: serves.then(|| {
                vec![ContainerPort {
                    name: Some("metrics".into()),
                    container_port: i32::from(self.metrics_port),
                    ..ContainerPort::default()
                }]
            }),
            // The process is alive (the HTTP server answers).
            liveness_probe: serves.then(|| probe("/healthz", 10, 3)),
            // Caches synced and leading or standing by; 503 while starting or stopping.
            readiness_probe: serves.then(|| probe("/readyz", 5, 2)),
            // The first cache sync lists every claim, volume and class: up to 5 minutes.
            startup_probe: serves.then(|| probe("/readyz", 5, 60)),
            resources: Some(ResourceRequirements {
                requests: Some(
                    [
                        ("cpu".to_owned(), Quantity("50m".into())),
                        ("memory".to_owned(), Quantity("64Mi".into())),
                    ]
                    .into(),
                ),
                limits: Some([("memory".to_owned(), Quantity("256Mi".into()))].into()),
                ..ResourceRequirements::default()
            }),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                run_as_non_root: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    add: None,
                }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        }
    }

    /// Replicas, update strategy and affinity: two replicas on different nodes when they
    /// elect a leader; one, stopped before its replacement starts, when they do not.
    fn placement(
        &self,
        selector: &BTreeMap<String, String>,
    ) -> (i32, Option<DeploymentStrategy>, Option<Affinity>) {
        if self.leader_election {
            let spread = WeightedPodAffinityTerm {
                weight: 100,
                pod_affinity_term: PodAffinityTerm {
                    topology_key: "kubernetes.io/hostname".into(),
                    label_selector: Some(LabelSelector {
                        match_labels: Some(selector.clone()),
                        match_expressions: None,
                    }),
                    ..PodAffinityTerm::default()
                },
            };
            let affinity = Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![spread]),
                    ..PodAntiAffinity::default()
                }),
                ..Affinity::default()
            };
            (2, None, Some(affinity))
        } else {
            let recreate = DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            };
            (1, Some(recreate), None)
        }
    }
}

impl Manifests {
    /// The manifests of the driver `provisioner_name` (the name StorageClasses give), run
    /// in `namespace` from `image`: leader election on (two replicas), crash-safe
    /// provisioning on, metrics and probes off (port 0), as [`Config`](crate::Config)'s
    /// defaults.
    #[must_use]
    pub fn new(
        provisioner_name: impl Into<String>,
        namespace: impl Into<String>,
        image: impl Into<String>,
    ) -> Self {
        Options {
            provisioner_name: provisioner_name.into(),
            namespace: namespace.into(),
            image: image.into(),
            leader_election: true,
            crash_safe_provisioning: true,
            metrics_port: 0,
        }
        .build()
    }

    /// With leader election (default): two replicas and the Lease's Role; without: one
    /// replica, replaced by stopping it first (`Recreate`), so two never run at once.
    /// Builds the objects anew.
    #[must_use]
    pub fn leader_election(self, on: bool) -> Self {
        Options {
            leader_election: on,
            ..self.options
        }
        .build()
    }

    /// With crash-safe provisioning (default): the journal's namespace and Role. Builds the
    /// objects anew.
    #[must_use]
    pub fn crash_safe_provisioning(self, on: bool) -> Self {
        Options {
            crash_safe_provisioning: on,
            ..self.options
        }
        .build()
    }

    /// The port of the metrics and probe server ([`Config::metrics_port`](crate::Config)),
    /// passed to the pod as `METRICS_PORT`; other than 0, the pod gets the port, probes on
    /// `/healthz` and `/readyz`, and Prometheus scrape annotations. Builds the objects anew.
    #[must_use]
    pub fn metrics_port(self, port: u16) -> Self {
        Options {
            metrics_port: port,
            ..self.options
        }
        .build()
    }

    /// The name of every object: the provisioner name with `/` replaced by `-`, as its
    /// Lease's ([`LeaderElection::lease_name_for`]).
    #[must_use]
    pub fn name(&self) -> String {
        self.options.name()
    }

    /// The journal's namespace: `<namespace>-journal`.
    #[must_use]
    pub fn journal_namespace(&self) -> String {
        self.options.journal_namespace()
    }

    /// Every object as JSON, with `apiVersion` and `kind`, in the order to apply them
    /// (namespaces first, the Deployment last); delete them in the reverse order.
    ///
    /// # Panics
    /// Never: k8s-openapi objects always serialize.
    #[must_use]
    pub(crate) fn to_values(&self) -> Vec<serde_json::Value> {
        fn value<T: serde::Serialize>(object: &T) -> serde_json::Value {
            serde_json::to_value(object).expect("a k8s-openapi object serializes")
        }
        let mut out: Vec<serde_json::Value> = self.namespaces.iter().map(value).collect();
        out.push(value(&self.service_account));
        out.push(value(&self.cluster_role));
        out.push(value(&self.cluster_role_binding));
        out.extend(self.roles.iter().map(value));
        out.extend(self.role_bindings.iter().map(value));
        out.push(value(&self.deployment));
        out
    }

    /// Every object as one multi-document YAML stream, for `kubectl apply -f -`.
    ///
    /// # Panics
    /// Never: JSON values always serialize to YAML.
    #[must_use]
    pub fn to_yaml(&self) -> String {
        let mut yaml = String::new();
        for object in self.to_values() {
            yaml.push_str("---\n");
            yaml.push_str(&serde_saphyr::to_string(&object).expect("JSON serializes to YAML"));
        }
        yaml
    }
}

fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(APP_LABEL.to_owned(), name.to_owned())])
}

/// `permissions` as RBAC rules, [`Names::LeaseName`] standing for `lease`.
fn rules(permissions: &[Permission], lease: &str) -> Vec<PolicyRule> {
    permissions
        .iter()
        .map(|p| PolicyRule {
            api_groups: Some(vec![p.group.to_owned()]),
            resources: Some(vec![p.resource.to_owned()]),
            verbs: p.verbs.iter().map(|v| (*v).to_owned()).collect(),
            resource_names: match p.names {
                Names::Any => None,
                Names::LeaseName => Some(vec![lease.to_owned()]),
                Names::Named(name) => Some(vec![name.to_owned()]),
            },
            non_resource_urls: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(set: &Manifests) -> Vec<String> {
        set.to_values()
            .iter()
            .map(|v| format!("{}/{}", v["kind"].as_str().unwrap(), v["metadata"]["name"]))
            .collect()
    }

    #[test]
    fn every_object_is_named_after_the_provisioner_and_applied_in_order() {
        let set = Manifests::new("example.com/my-driver", "my-driver", "img:1");
        assert_eq!(
            kinds(&set),
            [
                "Namespace/\"my-driver\"",
                "Namespace/\"my-driver-journal\"",
                "ServiceAccount/\"example.com-my-driver\"",
                "ClusterRole/\"example.com-my-driver\"",
                "ClusterRoleBinding/\"example.com-my-driver\"",
                "Role/\"example.com-my-driver-leader-election\"",
                "Role/\"example.com-my-driver-journal\"",
                "RoleBinding/\"example.com-my-driver-leader-election\"",
                "RoleBinding/\"example.com-my-driver-journal\"",
                "Deployment/\"example.com-my-driver\"",
            ]
        );
        let values = set.to_values();
        let journal_role = &values[6];
        assert_eq!(journal_role["metadata"]["namespace"], "my-driver-journal");
        let lease_rule = &values[5]["rules"][1];
        assert_eq!(lease_rule["resourceNames"][0], "example.com-my-driver");
        assert_eq!(values[7]["subjects"][0]["namespace"], "my-driver");
        let deployment = &values[9]["spec"];
        assert_eq!(deployment["replicas"], 2);
        let container = &deployment["template"]["spec"]["containers"][0];
        assert!(
            container["readinessProbe"].is_null(),
            "no metrics port, no probes"
        );
        let env = container["env"].to_string();
        assert!(
            env.contains(r#""name":"JOURNAL_NAMESPACE","value":"my-driver-journal""#),
            "{env}"
        );
    }

    #[test]
    fn options_change_roles_replicas_and_probes() {
        let set = Manifests::new("d", "kube-system", "img")
            .leader_election(false)
            .crash_safe_provisioning(false)
            .metrics_port(9090);
        assert!(set.namespaces.is_empty(), "kube-system exists already");
        assert!(set.roles.is_empty() && set.role_bindings.is_empty());
        let spec = set.deployment.spec;
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.strategy.unwrap().type_.as_deref(), Some("Recreate"));
        let pod = spec.template.spec.unwrap();
        let container = &pod.containers[0];
        assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 9090);
        assert!(container.readiness_probe.is_some());
        let env: Vec<_> = container
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(env, ["POD_NAMESPACE", "METRICS_PORT", "RUST_LOG"]);
    }

    #[test]
    fn the_yaml_reads_back_as_the_same_objects() {
        let set = Manifests::new("example.com/my-driver", "my-driver", "img:1").metrics_port(8080);
        let yaml = set.to_yaml();
        let back: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(back, set.to_values());
    }
}
