//! The manifests a driver prints (`provision_controller::manifests`, the README driver's
//! `--print-manifests`): a server-side dry run of `kubectl apply` on kube-sim accepts every
//! object, and the Roles grant every Lease and ConfigMap call the controller makes while it
//! provisions and deletes, by name where RBAC allows, and nothing on a ConfigMap that is not
//! the journal's. kube-sim enforces no RBAC: the rules are evaluated here, on its request log.

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
    let set = manifests().build();
    // Objects of a namespace that does not exist yet are refused even in a dry run (as a
    // real server's NamespaceLifecycle does): the namespaces go first, for real.
    let namespaces: String = set
        .to_values()
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
    assert_eq!(accepted, set.to_values().len(), "{out}");
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
    let set = manifests().build();
    let docs = set.to_values();
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
