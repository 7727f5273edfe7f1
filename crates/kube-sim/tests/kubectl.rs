//! The real `kubectl` against the sim, with its default validation. Each test says why it
//! skipped when `kubectl` is not installed.

use std::process::{Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference, PersistentVolumeClaim};
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kube_runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use kube_sim::KubeSim;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// Bound on one kubectl run, so a hung kubectl fails the test instead of hanging it.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

const CLASS_AND_CLAIM: &str = "\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: fast
provisioner: example.com/csi
reclaimPolicy: Delete
volumeBindingMode: Immediate
parameters:
  tier: gold
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claim-1
  namespace: default
  labels:
    app: demo
spec:
  storageClassName: fast
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
";

/// A started sim plus a private kubectl cache directory.
struct Kubectl {
    sim: KubeSim,
    cache: tempfile::TempDir,
}

impl Kubectl {
    /// `None` (after saying why) when kubectl is not installed.
    async fn start() -> Option<Self> {
        let found = Command::new("kubectl")
            .args(["version", "--client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        if !found.is_ok_and(|status| status.success()) {
            eprintln!("skipped: kubectl is not installed (or `kubectl version --client` failed)");
            return None;
        }
        // Claims and volumes carry their protection finalizers, as on a real server (and as
        // the server binary has them).
        let sim = KubeSim::builder()
            .protection_finalizers(true)
            .start()
            .await
            .unwrap();
        Some(Self {
            sim,
            cache: tempfile::tempdir().unwrap(),
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(self.sim.kubeconfig_path())
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs kubectl with `stdin` as its input and returns its output, whatever the exit code.
    async fn output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut command = self.command(args);
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("kubectl starts");
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(input.as_bytes()).await.unwrap();
            drop(pipe);
        }
        tokio::time::timeout(KUBECTL_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish"))
            .unwrap()
    }

    /// Runs kubectl, asserts it succeeded, and returns its stdout.
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        let output = self.output(args, stdin).await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "kubectl {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
            output.status
        );
        stdout
    }

    async fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let stdout = self.run(&all, None).await;
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }
}

#[tokio::test]
async fn apply_patch_get_and_delete_class_and_claim() {
    let Some(k) = Kubectl::start().await else {
        return;
    };

    let applied = k.run(&["apply", "-f", "-"], Some(CLASS_AND_CLAIM)).await;
    assert!(
        applied.contains("storageclass.storage.k8s.io/fast created"),
        "{applied}"
    );
    assert!(
        applied.contains("persistentvolumeclaim/claim-1 created"),
        "{applied}"
    );

    let claim = k.get_json(&["pvc", "claim-1", "-n", "default"]).await;
    assert_eq!(claim["kind"], "PersistentVolumeClaim");
    assert_eq!(claim["spec"]["storageClassName"], "fast");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
    assert_eq!(claim["status"]["phase"], "Pending");
    assert!(
        claim["metadata"]["uid"]
            .as_str()
            .is_some_and(|uid| !uid.is_empty())
    );
    let class = k.get_json(&["storageclass", "fast"]).await;
    assert_eq!(class["provisioner"], "example.com/csi");
    assert_eq!(class["parameters"]["tier"], "gold");

    let merge = k
        .run(
            &[
                "patch",
                "pvc",
                "claim-1",
                "--type",
                "merge",
                "-p",
                r#"{"metadata":{"labels":{"merge":"yes"}}}"#,
            ],
            None,
        )
        .await;
    assert!(
        merge.contains("persistentvolumeclaim/claim-1 patched"),
        "{merge}"
    );
    let json_patch = r#"[{"op":"test","path":"/metadata/labels/merge","value":"yes"},
        {"op":"add","path":"/metadata/labels/json","value":"yes"}]"#;
    k.run(
        &[
            "patch", "pvc", "claim-1", "--type", "json", "-p", json_patch,
        ],
        None,
    )
    .await;
    k.run(
        &[
            "patch",
            "pvc",
            "claim-1",
            "--type",
            "strategic",
            "-p",
            r#"{"metadata":{"labels":{"strategic":"yes"}}}"#,
        ],
        None,
    )
    .await;
    k.run(
        &[
            "patch",
            "storageclass",
            "fast",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"merge":"yes"}}}"#,
        ],
        None,
    )
    .await;
    let failed = k
        .output(
            &[
                "patch",
                "pvc",
                "claim-1",
                "--type",
                "json",
                "-p",
                r#"[{"op":"test","path":"/metadata/labels/merge","value":"no"}]"#,
            ],
            None,
        )
        .await;
    assert!(
        !failed.status.success(),
        "a failing JSON patch test must fail"
    );

    let claim = k.get_json(&["pvc", "claim-1"]).await;
    let labels = &claim["metadata"]["labels"];
    assert_eq!(
        labels,
        &json!({"app": "demo", "merge": "yes", "json": "yes", "strategic": "yes"})
    );
    let class = k.get_json(&["storageclass", "fast"]).await;
    assert_eq!(class["metadata"]["labels"]["merge"], "yes");

    // Client-side apply of a changed manifest: a three-way merge with last-applied.
    let changed = CLASS_AND_CLAIM.replace("app: demo", "app: demo\n    tier: gold");
    let reapplied = k.run(&["apply", "-f", "-"], Some(&changed)).await;
    assert!(
        reapplied.contains("storageclass.storage.k8s.io/fast unchanged"),
        "{reapplied}"
    );
    assert!(
        reapplied.contains("persistentvolumeclaim/claim-1 configured"),
        "{reapplied}"
    );
    let claim = k.get_json(&["pvc", "claim-1"]).await;
    assert_eq!(claim["metadata"]["labels"]["tier"], "gold");
    assert_eq!(
        claim["metadata"]["labels"]["merge"], "yes",
        "apply keeps fields it never set"
    );

    let deleted = k.run(&["delete", "pvc", "claim-1"], None).await;
    assert!(
        deleted.contains("persistentvolumeclaim \"claim-1\" deleted"),
        "{deleted}"
    );
    let missing = k.output(&["get", "pvc", "claim-1"], None).await;
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("NotFound") || stderr.contains("not found"),
        "{stderr}"
    );
    let deleted = k.run(&["delete", "storageclass", "fast"], None).await;
    assert!(deleted.contains("deleted"), "{deleted}");
}

#[tokio::test]
async fn server_side_apply_creates_and_merges_owned_fields() {
    let Some(k) = Kubectl::start().await else {
        return;
    };

    let applied = k
        .run(
            &["apply", "--server-side", "-f", "-"],
            Some(CLASS_AND_CLAIM),
        )
        .await;
    assert!(
        applied.contains("persistentvolumeclaim/claim-1 serverside-applied"),
        "{applied}"
    );
    assert!(
        applied.contains("storageclass.storage.k8s.io/fast serverside-applied"),
        "{applied}"
    );
    k.run(&["label", "pvc", "claim-1", "other=kept"], None)
        .await;

    let changed = CLASS_AND_CLAIM.replace("app: demo", "app: changed");
    k.run(&["apply", "--server-side", "-f", "-"], Some(&changed))
        .await;
    let claim = k.get_json(&["pvc", "claim-1"]).await;
    assert_eq!(claim["metadata"]["labels"]["app"], "changed");
    assert_eq!(claim["metadata"]["labels"]["other"], "kept");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
}

#[tokio::test]
async fn watch_prints_changes_as_they_happen() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(k.sim.client(), "default");
    let claim = |name: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap()
    };
    claims
        .create(&PostParams::default(), &claim("before"))
        .await
        .unwrap();

    // The table printer is the one that honours --output-watch-events: "EVENT NAME ...".
    let mut watch = k
        .command(&["get", "pvc", "--watch", "--output-watch-events"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut next_event = async || -> (String, String) {
        let line = tokio::time::timeout(KUBECTL_TIMEOUT, lines.next_line())
            .await
            .expect("kubectl watch printed a line in time")
            .unwrap()
            .expect("kubectl watch is still running");
        let mut columns = line.split_whitespace().map(str::to_owned);
        (
            columns.next().unwrap_or_default(),
            columns.next().unwrap_or_default(),
        )
    };
    let pair = |event: &str, name: &str| (event.to_owned(), name.to_owned());
    assert_eq!(
        next_event().await,
        pair("EVENT", "NAME"),
        "the header comes first"
    );
    assert_eq!(next_event().await, pair("ADDED", "before"));

    claims
        .create(&PostParams::default(), &claim("after"))
        .await
        .unwrap();
    assert_eq!(next_event().await, pair("ADDED", "after"));
    let label = json!({"metadata": {"labels": {"seen": "yes"}}});
    let params = PatchParams::default();
    claims
        .patch("before", &params, &Patch::Merge(label))
        .await
        .unwrap();
    assert_eq!(next_event().await, pair("MODIFIED", "before"));
    claims.delete("before", &Default::default()).await.unwrap();
    // As on a real server, the claim is Terminating first (MODIFIED: its deletion starts,
    // its pvc-protection finalizer goes), then DELETED.
    let mut event = next_event().await;
    let mut modified = 0;
    while event == pair("MODIFIED", "before") {
        modified += 1;
        event = next_event().await;
    }
    assert_eq!(event, pair("DELETED", "before"));
    assert!(modified >= 1, "Terminating before it goes");

    watch.kill().await.unwrap();
}

const CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: cnsvolumemetadatas.cns.vmware.com
spec:
  group: cns.vmware.com
  scope: Namespaced
  names:
    kind: CnsVolumeMetadata
    plural: cnsvolumemetadatas
    singular: cnsvolumemetadata
    listKind: CnsVolumeMetadataList
  versions:
    - name: v1alpha1
      served: true
      storage: true
      subresources:
        status: {}
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
";

const CUSTOM_OBJECT: &str = "\
apiVersion: cns.vmware.com/v1alpha1
kind: CnsVolumeMetadata
metadata:
  name: meta-1
  namespace: default
spec:
  volumenames: [pvc-1]
  entitytype: PERSISTENT_VOLUME_CLAIM
";

#[tokio::test]
async fn wait_for_established_crd_then_use_it() {
    let Some(k) = Kubectl::start().await else {
        return;
    };

    let created = k.run(&["apply", "-f", "-"], Some(CRD)).await;
    assert!(
        created.contains("cnsvolumemetadatas.cns.vmware.com created"),
        "{created}"
    );
    let waited = k
        .run(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "crd/cnsvolumemetadatas.cns.vmware.com",
            ],
            None,
        )
        .await;
    assert!(waited.contains("condition met"), "{waited}");

    let applied = k.run(&["apply", "-f", "-"], Some(CUSTOM_OBJECT)).await;
    assert!(
        applied.contains("cnsvolumemetadata.cns.vmware.com/meta-1 created"),
        "{applied}"
    );
    let object = k.get_json(&["cnsvolumemetadatas", "meta-1"]).await;
    assert_eq!(object["spec"]["entitytype"], "PERSISTENT_VOLUME_CLAIM");
    assert_eq!(object["metadata"]["namespace"], "default");
    let list = k.get_json(&["cnsvolumemetadata"]).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");
    let deleted = k
        .run(&["delete", "cnsvolumemetadata", "meta-1"], None)
        .await;
    assert!(deleted.contains("deleted"), "{deleted}");
}

#[tokio::test]
async fn describe_claim_shows_its_fields() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    k.run(&["apply", "-f", "-"], Some(CLASS_AND_CLAIM)).await;

    let described = k.run(&["describe", "pvc", "claim-1"], None).await;
    let field = |name: &str| -> Option<String> {
        let line = described
            .lines()
            .find(|line| line.starts_with(&format!("{name}:")))?;
        Some(line[name.len() + 1..].trim().to_owned())
    };
    assert_eq!(field("Name").as_deref(), Some("claim-1"), "{described}");
    assert_eq!(
        field("Namespace").as_deref(),
        Some("default"),
        "{described}"
    );
    assert_eq!(
        field("StorageClass").as_deref(),
        Some("fast"),
        "{described}"
    );
    assert_eq!(field("Status").as_deref(), Some("Pending"), "{described}");
    assert_eq!(field("Labels").as_deref(), Some("app=demo"), "{described}");
    // What a real server's claim shows (the StorageObjectInUseProtection admission).
    assert_eq!(
        field("Finalizers").as_deref(),
        Some("[kubernetes.io/pvc-protection]"),
        "{described}"
    );
}

#[tokio::test]
async fn standalone_server_serves_kubectl_until_interrupted() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--pv-binder")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let banner = tokio::time::timeout(KUBECTL_TIMEOUT, lines.next_line())
        .await
        .expect("the server printed its address in time")
        .unwrap()
        .expect("the server printed a line");
    assert!(banner.contains("http://127.0.0.1:"), "{banner}");
    assert!(
        banner.contains(&kubeconfig.display().to_string()),
        "{banner}"
    );

    let mut get = Command::new("kubectl");
    get.arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(k.cache.path())
        .args(["get", "namespaces", "-o", "name"]);
    let output = tokio::time::timeout(KUBECTL_TIMEOUT, get.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("namespace/default"));

    // The binder (on via --pv-binder) binds a claim to a PV that names it.
    let pv = "\
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-1
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  storageClassName: fast
  claimRef:
    namespace: default
    name: claim-1
  csi:
    driver: example.com/csi
    volumeHandle: vol-1
";
    let manifests = format!("{CLASS_AND_CLAIM}---\n{pv}");
    let kubectl = |args: &[&str]| {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(k.cache.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    };
    let mut apply = kubectl(&["apply", "-f", "-"]).spawn().unwrap();
    let mut stdin = apply.stdin.take().unwrap();
    stdin.write_all(manifests.as_bytes()).await.unwrap();
    drop(stdin);
    let applied = apply.wait_with_output().await.unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let wait = kubectl(&[
        "wait",
        "--for=jsonpath={.status.phase}=Bound",
        "--timeout=30s",
        "pvc/claim-1",
    ])
    .output();
    let waited = tokio::time::timeout(KUBECTL_TIMEOUT, wait)
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&waited.stdout);
    assert!(
        stdout.contains("condition met"),
        "{stdout}{}",
        String::from_utf8_lossy(&waited.stderr)
    );

    let pid = server.id().expect("the server is running").to_string();
    let interrupt = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .unwrap();
    assert!(interrupt.success());
    let status = tokio::time::timeout(KUBECTL_TIMEOUT, server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "the server exits cleanly on Ctrl-C: {status}"
    );
}

/// The server binary as a user starts it (no `--pv-binder`): a new claim carries
/// `kubernetes.io/pvc-protection` as on a real server, the finalizer is put back when
/// removed from a claim that is not being deleted (kube-controller-manager's
/// pvc-protection controller), and `kubectl delete` still completes.
#[tokio::test]
async fn standalone_server_protects_claims_as_a_real_server_does() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    tokio::time::timeout(KUBECTL_TIMEOUT, lines.next_line())
        .await
        .expect("the server printed its address in time")
        .unwrap()
        .expect("the server printed a line");
    let kubectl = |args: &[&str], stdin: Option<&str>| {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(k.cache.path())
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        let input = stdin.map(str::to_owned);
        let pipe = child.stdin.take();
        async move {
            if let (Some(input), Some(mut pipe)) = (input, pipe) {
                pipe.write_all(input.as_bytes()).await.unwrap();
            }
            let output = tokio::time::timeout(KUBECTL_TIMEOUT, child.wait_with_output())
                .await
                .unwrap()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                output.status.success(),
                "{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            );
            stdout
        }
    };
    kubectl(&["apply", "-f", "-"], Some(CLASS_AND_CLAIM)).await;
    let finalizers = || {
        kubectl(
            &[
                "get",
                "pvc",
                "claim-1",
                "-o",
                "jsonpath={.metadata.finalizers}",
            ],
            None,
        )
    };
    assert_eq!(finalizers().await, r#"["kubernetes.io/pvc-protection"]"#);
    let described = kubectl(&["describe", "pvc", "claim-1"], None).await;
    assert!(
        described
            .lines()
            .any(|l| l.starts_with("Finalizers:") && l.ends_with("[kubernetes.io/pvc-protection]")),
        "{described}"
    );
    kubectl(
        &[
            "patch",
            "pvc",
            "claim-1",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    )
    .await;
    let deadline = tokio::time::Instant::now() + KUBECTL_TIMEOUT;
    while finalizers().await != r#"["kubernetes.io/pvc-protection"]"# {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the finalizer is put back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deleted = kubectl(&["delete", "pvc", "claim-1", "--timeout=30s"], None).await;
    assert!(
        deleted.contains(r#"persistentvolumeclaim "claim-1" deleted"#),
        "{deleted}"
    );

    let pid = server.id().expect("the server is running").to_string();
    let interrupt = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .unwrap();
    assert!(interrupt.success());
    tokio::time::timeout(KUBECTL_TIMEOUT, server.wait())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn delete_waits_until_the_last_finalizer_is_removed() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    let held = CLASS_AND_CLAIM.replace(
        "    app: demo",
        "    app: demo\n  finalizers: [example.com/hold]",
    );
    k.run(&["apply", "-f", "-"], Some(&held)).await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(k.sim.client(), "default");

    let mut delete = k.command(&["delete", "pvc", "claim-1"]).spawn().unwrap();
    let deleting = kube_runtime::wait::await_condition(
        claims.clone(),
        "claim-1",
        |c: Option<&PersistentVolumeClaim>| {
            c.is_some_and(|c| c.metadata.deletion_timestamp.is_some())
        },
    );
    tokio::time::timeout(KUBECTL_TIMEOUT, deleting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        delete.try_wait().unwrap().is_none(),
        "kubectl delete waits while a finalizer holds the claim"
    );

    let release = json!({"metadata": {"finalizers": null}});
    claims
        .patch("claim-1", &PatchParams::default(), &Patch::Merge(release))
        .await
        .unwrap();
    let output = tokio::time::timeout(KUBECTL_TIMEOUT, delete.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("persistentvolumeclaim \"claim-1\" deleted"),
        "{stdout}"
    );
    assert!(claims.get_opt("claim-1").await.unwrap().is_none());
}

/// `kubectl patch` with another object's uid: the sim answers as a real kube-apiserver
/// v1.36 does (422, the uid is immutable; not a 409 precondition), so kubectl prints what it
/// prints against a real cluster, for a merge and a strategic-merge patch alike.
#[tokio::test]
async fn patching_another_uid_prints_what_a_real_server_makes_kubectl_print() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    k.run(&["apply", "-f", "-"], Some(CLASS_AND_CLAIM)).await;
    let other = "00000000-0000-0000-0000-000000000000";
    let patch = format!(r#"{{"metadata":{{"uid":"{other}"}}}}"#);
    for kind in ["merge", "strategic"] {
        let output = k
            .output(
                &["patch", "pvc", "claim-1", "--type", kind, "-p", &patch],
                None,
            )
            .await;
        assert!(!output.status.success(), "{kind}: kubectl patch must fail");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            stderr.trim_end(),
            format!(
                "The PersistentVolumeClaim \"claim-1\" is invalid: metadata.uid: Invalid value: \
                 \"{other}\": field is immutable"
            ),
            "{kind}"
        );
    }
}

#[tokio::test]
async fn standalone_server_reports_a_bad_kubeconfig_path_in_one_line() {
    let output = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--kubeconfig", "/nonexistent-dir/kubeconfig"])
        .env("RUST_LOG", "off")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(KUBECTL_TIMEOUT, output)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("kube-sim: cannot start the server: "),
        "{stderr}"
    );
    assert!(stderr.contains("/nonexistent-dir/kubeconfig"), "{stderr}");
    assert!(output.stdout.is_empty());
}

/// The `Events:` section of `kubectl describe` output.
fn events_section(described: &str) -> &str {
    described
        .split_once("\nEvents:")
        .map_or("", |(_, events)| events)
}

#[tokio::test]
async fn describe_claim_lists_core_and_events_v1_events_about_it() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    k.run(&["apply", "-f", "-"], Some(CLASS_AND_CLAIM)).await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(k.sim.client());
    let claim = claims.get("claim-1").await.unwrap();
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some("claim-1".into()),
        namespace: Some("default".into()),
        uid: claim.metadata.uid.clone(),
        ..ObjectReference::default()
    };
    // As kube-runtime's Recorder writes them: events.k8s.io/v1.
    let recorder = Recorder::new(
        k.sim.client(),
        Reporter {
            controller: "example.com/csi".into(),
            instance: None,
        },
    );
    let failed = RecordedEvent {
        type_: EventType::Warning,
        reason: "ProvisioningFailed".into(),
        note: Some("no space left on the datastore".into()),
        action: "Provision".into(),
        secondary: None,
    };
    recorder.publish(&failed, &reference).await.unwrap();
    recorder.publish(&failed, &reference).await.unwrap();
    // As client-go's legacy recorder writes them: core/v1.
    let core: Api<CoreEvent> = Api::default_namespaced(k.sim.client());
    let waiting = serde_json::from_value(json!({
        "metadata": {"name": "claim-1.external"},
        "involvedObject": reference,
        "reason": "ExternalProvisioning",
        "message": "Waiting for a volume to be created by the external provisioner",
        "type": "Normal",
        "source": {"component": "persistentvolume-controller"},
        "count": 1,
    }))
    .unwrap();
    core.create(&PostParams::default(), &waiting).await.unwrap();
    // An event about another claim stays out of the section.
    let mut unrelated = reference.clone();
    unrelated.name = Some("claim-2".into());
    recorder
        .publish(
            &RecordedEvent {
                type_: EventType::Normal,
                reason: "Unrelated".into(),
                note: None,
                action: "Provision".into(),
                secondary: None,
            },
            &unrelated,
        )
        .await
        .unwrap();

    let described = k.run(&["describe", "pvc", "claim-1"], None).await;
    let events = events_section(&described);
    assert!(events.contains("ProvisioningFailed"), "{described}");
    assert!(events.contains("(x2 over"), "{described}");
    assert!(events.contains("example.com/csi"), "{described}");
    assert!(
        events.contains("no space left on the datastore"),
        "{described}"
    );
    assert!(events.contains("ExternalProvisioning"), "{described}");
    assert!(
        events.contains("persistentvolume-controller"),
        "{described}"
    );
    assert!(!events.contains("Unrelated"), "{described}");

    let listed = k.run(&["events", "--for", "pvc/claim-1"], None).await;
    assert!(listed.contains("ProvisioningFailed"), "{listed}");
    assert!(listed.contains("PersistentVolumeClaim/claim-1"), "{listed}");
    assert!(!listed.contains("Unrelated"), "{listed}");
}

const BOGUS_CLAIM: &str = "\
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claim-bogus
  namespace: default
spec:
  bogus: 1
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
";

#[tokio::test]
async fn unknown_fields_fail_strict_validation_and_are_dropped_with_a_warning() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    let refused = k.output(&["apply", "-f", "-"], Some(BOGUS_CLAIM)).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "PersistentVolumeClaim in version \"v1\" cannot be handled as a \
             PersistentVolumeClaim: strict decoding error: unknown field \"spec.bogus\""
        ),
        "{stderr}"
    );
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(k.sim.client());
    assert!(claims.get_opt("claim-bogus").await.unwrap().is_none());

    let warned = k
        .output(&["apply", "--validate=warn", "-f", "-"], Some(BOGUS_CLAIM))
        .await;
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(warned.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: unknown field \"spec.bogus\""),
        "{stderr}"
    );
    let stored = k.get_json(&["pvc", "claim-bogus"]).await;
    assert!(stored["spec"].get("bogus").is_none(), "{stored}");
    assert_eq!(stored["spec"]["resources"]["requests"]["storage"], "1Gi");
}

/// The header line of `kubectl get`, split into column names.
fn header(printed: &str) -> Vec<String> {
    let line = printed.lines().next().unwrap_or_default();
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn get_prints_the_server_columns_for_claims_volumes_and_classes() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    k.run(&["apply", "-f", "-"], Some(CLASS_AND_CLAIM)).await;
    let volume = "\
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-1
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: fast
  claimRef: {namespace: default, name: claim-1}
  csi: {driver: example.com/csi, volumeHandle: vol-1}
";
    k.run(&["apply", "-f", "-"], Some(volume)).await;

    let claims = k.run(&["get", "pvc"], None).await;
    assert_eq!(
        header(&claims),
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE"
        ],
        "{claims}"
    );
    let row: Vec<&str> = claims.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..4],
        ["claim-1", "Pending", "fast", "<unset>"],
        "{claims}"
    );

    let volumes = k.run(&["get", "pv"], None).await;
    assert_eq!(
        header(&volumes),
        [
            "NAME",
            "CAPACITY",
            "ACCESS MODES",
            "RECLAIM POLICY",
            "STATUS",
            "CLAIM",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "REASON",
            "AGE"
        ],
        "{volumes}"
    );
    let row: Vec<&str> = volumes.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..7],
        [
            "pv-1",
            "1Gi",
            "RWO",
            "Retain",
            "Pending",
            "default/claim-1",
            "fast"
        ],
        "{volumes}"
    );

    let classes = k.run(&["get", "sc"], None).await;
    assert_eq!(
        header(&classes),
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "VOLUMEBINDINGMODE",
            "ALLOWVOLUMEEXPANSION",
            "AGE"
        ],
        "{classes}"
    );
    let row: Vec<&str> = classes.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..5],
        ["fast", "example.com/csi", "Delete", "Immediate", "false"],
        "{classes}"
    );
}

#[tokio::test]
async fn auth_can_i_says_yes() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    let answer = k
        .run(&["auth", "can-i", "delete", "persistentvolumes"], None)
        .await;
    assert_eq!(answer.trim(), "yes");
    let rules = k.run(&["auth", "can-i", "--list"], None).await;
    assert!(rules.lines().any(|l| l.starts_with("*.*")), "{rules}");
}

#[tokio::test]
async fn create_namespace_run_and_api_resources_work() {
    let Some(k) = Kubectl::start().await else {
        return;
    };
    let created = k.run(&["create", "namespace", "demo"], None).await;
    assert_eq!(created.trim(), "namespace/demo created");
    let namespace = k.get_json(&["namespace", "demo"]).await;
    assert_eq!(namespace["status"]["phase"], "Active");
    assert!(
        namespace["metadata"].get("generateName").is_none(),
        "{namespace}"
    );
    let again = k.output(&["create", "namespace", "demo"], None).await;
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("namespaces \"demo\" already exists"),
        "{stderr}"
    );
    let deleted = k.run(&["delete", "namespace", "demo"], None).await;
    assert!(deleted.contains("deleted"), "{deleted}");

    let ran = k.run(&["run", "web", "--image=nginx"], None).await;
    assert_eq!(ran.trim(), "pod/web created");
    let pod = k.get_json(&["pod", "web"]).await;
    assert_eq!(pod["spec"]["containers"][0]["image"], "nginx");
    let resources = k.run(&["api-resources", "-o", "name"], None).await;
    for name in [
        "persistentvolumeclaims",
        "events.events.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
    ] {
        assert!(resources.lines().any(|l| l == name), "{name}: {resources}");
    }
}
