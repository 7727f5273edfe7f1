//! The CreateVolume and DeleteVolume requests and the PVs the provisioner makes, checked
//! call by call against an in-process fake driver, with kube-sim holding the secrets,
//! classes and VolumeAttachments.

mod common;

use std::{collections::BTreeMap, sync::Arc};

use common::{DRIVER, FakeCsi, Step};
use csi_provisioner::{
    CsiOptions, CsiProvisioner, DriverCapabilities, TopologySettings,
    csi::{
        Status,
        volume_capability::{AccessType, BlockVolume, Mode},
    },
};
use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{
            Namespace, ObjectReference, PersistentVolume, PersistentVolumeClaim, Secret,
            SecretReference,
        },
        storage::v1::{
            StorageClass, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
        },
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube_client::{Api, Client, api::PostParams};
use kube_sim::KubeSim;
use provision_controller::{
    DeleteError, ProvisionError, ProvisionOptions, Provisioner,
    testing::{class, pvc},
};

const PV: &str = "pvc-0001";
const IDENTITY: &str = "1-2-fake";

struct Setup {
    sim: KubeSim,
    fake: FakeCsi,
    provisioner: CsiProvisioner,
}

impl Setup {
    async fn new(capabilities: DriverCapabilities, options: CsiOptions) -> Self {
        let sim = KubeSim::start().await.expect("kube-sim starts");
        let fake = FakeCsi::new();
        let provisioner = CsiProvisioner::new(
            Arc::new(fake.clone()),
            sim.client(),
            DRIVER,
            capabilities,
            options.identity(IDENTITY),
        )
        .expect("valid options");
        Self {
            sim,
            fake,
            provisioner,
        }
    }

    async fn plain() -> Self {
        Self::new(DriverCapabilities::default(), CsiOptions::default()).await
    }

    fn client(&self) -> Client {
        self.sim.client()
    }

    async fn provision(
        &self,
        class: StorageClass,
        claim: PersistentVolumeClaim,
    ) -> Result<PersistentVolume, ProvisionError> {
        let options = ProvisionOptions::new(Arc::new(class), PV, Arc::new(claim), None);
        self.provisioner.provision(&options).await
    }

    async fn secret(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let _ = Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &ns)
            .await;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(self.client(), namespace)
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret created");
    }
}

fn fast() -> provision_controller::testing::ClassBuilder {
    class("fast").provisioner(DRIVER).reclaim_policy("Delete")
}

fn spec(volume: &PersistentVolume) -> &k8s_openapi::api::core::v1::PersistentVolumeSpec {
    volume.spec.as_ref().expect("spec")
}

fn csi(volume: &PersistentVolume) -> &k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
    spec(volume).csi.as_ref().expect("spec.csi")
}

fn map(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn reference(name: &str, namespace: &str) -> Option<SecretReference> {
    Some(SecretReference {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
    })
}

fn variant(error: &ProvisionError) -> &'static str {
    match error {
        ProvisionError::InBackground(_) => "InBackground",
        ProvisionError::Failed(_) => "Failed",
        ProvisionError::NoChange(_) => "NoChange",
        ProvisionError::Reschedule(_) => "Reschedule",
        ProvisionError::Ignored { .. } => "Ignored",
        ProvisionError::Infeasible(_) => "Infeasible",
        _ => "other",
    }
}

/// The error and its sources, as the claim's event quotes them.
fn text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        text.push_str(": ");
        text.push_str(&next.to_string());
        source = next.source();
    }
    text
}

#[tokio::test]
async fn a_plain_claim_gets_upstreams_request_and_volume() {
    let setup = Setup::plain().await;
    setup.fake.context(&[("share", "/exports/1")]);
    let mut class = fast()
        .parameter("pool", "gold")
        .parameter("csi.storage.k8s.io/fstype", "xfs")
        .build();
    class.mount_options = Some(vec!["noatime".into()]);
    let claim = pvc("data").namespace("apps").request("2Gi").build();
    let volume = setup.provision(class, claim).await.expect("provisioned");

    let creates = setup.fake.creates();
    assert_eq!(creates.len(), 1);
    let request = &creates[0];
    assert_eq!(request.name, PV);
    let range = request.capacity_range.expect("capacity range");
    assert_eq!((range.required_bytes, range.limit_bytes), (2 << 30, 0));
    assert_eq!(request.parameters, map(&[("pool", "gold")]));
    assert!(request.secrets.is_empty());
    assert_eq!(request.accessibility_requirements, None);
    assert_eq!(request.volume_content_source, None);
    assert_eq!(request.volume_capabilities.len(), 1);
    let capability = &request.volume_capabilities[0];
    assert_eq!(
        capability.access_mode.expect("mode").mode,
        Mode::SingleNodeWriter as i32
    );
    let Some(AccessType::Mount(mount)) = &capability.access_type else {
        panic!("not a mount capability: {capability:?}");
    };
    assert_eq!(mount.fs_type, "xfs");
    assert_eq!(mount.mount_flags, ["noatime"]);

    assert_eq!(volume.metadata.name.as_deref(), Some(PV));
    let annotations = volume.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations,
        BTreeMap::from([
            (
                "volume.kubernetes.io/provisioner-deletion-secret-name".to_owned(),
                String::new()
            ),
            (
                "volume.kubernetes.io/provisioner-deletion-secret-namespace".to_owned(),
                String::new()
            ),
        ])
    );
    let spec = spec(&volume);
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "2Gi");
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_owned()][..])
    );
    assert_eq!(
        spec.mount_options.as_deref(),
        Some(&["noatime".to_owned()][..])
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.node_affinity, None);
    assert_eq!(spec.volume_mode, None);
    let csi = csi(&volume);
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.volume_handle, "vol-1");
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(
        csi.volume_attributes,
        Some(BTreeMap::from([
            ("share".to_owned(), "/exports/1".to_owned()),
            (
                "storage.kubernetes.io/csiProvisionerIdentity".to_owned(),
                IDENTITY.to_owned()
            ),
        ]))
    );
    assert_eq!(csi.controller_publish_secret_ref, None);
    assert_eq!(csi.node_stage_secret_ref, None);
    assert_eq!(csi.node_publish_secret_ref, None);
    assert_eq!(csi.controller_expand_secret_ref, None);
    assert_eq!(csi.node_expand_secret_ref, None);
    assert_eq!(csi.read_only, None);
}

#[tokio::test]
async fn capabilities_follow_access_modes_volume_mode_and_the_driver() {
    // (access modes, block, single_node_multi_writer, expected modes)
    let table: &[(&[&str], bool, bool, &[Mode])] = &[
        (&["ReadWriteOnce"], false, false, &[Mode::SingleNodeWriter]),
        (
            &["ReadWriteOnce"],
            false,
            true,
            &[Mode::SingleNodeMultiWriter],
        ),
        (
            &["ReadWriteOncePod"],
            false,
            false,
            &[Mode::SingleNodeWriter],
        ),
        (
            &["ReadWriteOncePod"],
            true,
            true,
            &[Mode::SingleNodeSingleWriter],
        ),
        (
            &["ReadOnlyMany"],
            false,
            false,
            &[Mode::MultiNodeReaderOnly],
        ),
        (
            &["ReadWriteMany"],
            true,
            false,
            &[Mode::MultiNodeMultiWriter],
        ),
        (
            &["ReadWriteMany", "ReadOnlyMany"],
            false,
            true,
            &[Mode::MultiNodeMultiWriter, Mode::MultiNodeReaderOnly],
        ),
    ];
    for (modes, block, multi, expected) in table {
        let setup = Setup::new(
            DriverCapabilities::default().single_node_multi_writer(*multi),
            CsiOptions::default().default_fstype("ext4"),
        )
        .await;
        let mut claim = pvc("data").build();
        claim.spec.as_mut().unwrap().access_modes =
            Some(modes.iter().map(|m| (*m).to_owned()).collect());
        if *block {
            claim.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        }
        let volume = setup
            .provision(fast().build(), claim)
            .await
            .expect("provisioned");
        let request = &setup.fake.creates()[0];
        let got: Vec<i32> = request
            .volume_capabilities
            .iter()
            .map(|c| c.access_mode.unwrap().mode)
            .collect();
        let want: Vec<i32> = expected.iter().map(|m| *m as i32).collect();
        assert_eq!(got, want, "{modes:?} block={block} multi={multi}");
        for capability in &request.volume_capabilities {
            match (&capability.access_type, block) {
                (Some(AccessType::Block(BlockVolume {})), true) => {}
                (Some(AccessType::Mount(mount)), false) => assert_eq!(mount.fs_type, "ext4"),
                (other, _) => panic!("{modes:?} block={block}: {other:?}"),
            }
        }
        // A block PV has no fsType, and the claim's volume mode.
        let csi = csi(&volume);
        if *block {
            assert_eq!(csi.fs_type, None);
            assert_eq!(spec(&volume).volume_mode.as_deref(), Some("Block"));
        } else {
            assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
        }
        assert_eq!(
            spec(&volume).access_modes.clone().unwrap_or_default(),
            modes.iter().map(|m| (*m).to_owned()).collect::<Vec<_>>()
        );
    }
}

#[tokio::test]
async fn a_block_claim_with_an_fstype_class_is_made_as_upstream_makes_it() {
    // Upstream does not refuse it: the block capability carries no fsType, nor the PV.
    let setup = Setup::plain().await;
    let volume = setup
        .provision(
            fast().parameter("csi.storage.k8s.io/fstype", "xfs").build(),
            pvc("raw").block().build(),
        )
        .await
        .expect("provisioned");
    assert_eq!(
        setup.fake.creates()[0].volume_capabilities[0].access_type,
        Some(AccessType::Block(BlockVolume {}))
    );
    assert_eq!(csi(&volume).fs_type, None);
}

#[tokio::test]
async fn extra_create_metadata_adds_the_claim_and_pv_names() {
    for on in [false, true] {
        let setup = Setup::new(
            DriverCapabilities::default(),
            CsiOptions::default().extra_create_metadata(on),
        )
        .await;
        setup
            .provision(
                fast().parameter("pool", "a").build(),
                pvc("data").namespace("apps").build(),
            )
            .await
            .expect("provisioned");
        let expected = if on {
            map(&[
                ("pool", "a"),
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "apps"),
                ("csi.storage.k8s.io/pv/name", PV),
            ])
        } else {
            map(&[("pool", "a")])
        };
        assert_eq!(setup.fake.creates()[0].parameters, expected, "on={on}");
    }
}

#[tokio::test]
async fn secrets_come_from_the_class_with_their_templates() {
    let setup = Setup::plain().await;
    setup
        .secret(
            "apps",
            "data-creds",
            &[("user", "admin"), ("password", "hunter2")],
        )
        .await;
    let class = fast()
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.name}-creds",
        )
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        )
        .parameter(
            "csi.storage.k8s.io/controller-publish-secret-name",
            "${pvc.annotations['example.com/publish']}",
        )
        .parameter(
            "csi.storage.k8s.io/controller-publish-secret-namespace",
            "infra",
        )
        .parameter(
            "csi.storage.k8s.io/node-stage-secret-name",
            "stage-${pv.name}",
        )
        .parameter(
            "csi.storage.k8s.io/node-stage-secret-namespace",
            "${pv.name}",
        )
        .parameter("csi.storage.k8s.io/node-publish-secret-name", "publish")
        .parameter("csi.storage.k8s.io/node-publish-secret-namespace", "infra")
        .parameter("csi.storage.k8s.io/controller-expand-secret-name", "expand")
        .parameter(
            "csi.storage.k8s.io/controller-expand-secret-namespace",
            "infra",
        )
        .parameter("csi.storage.k8s.io/node-expand-secret-name", "node-expand")
        .parameter("csi.storage.k8s.io/node-expand-secret-namespace", "infra")
        .parameter("csi.storage.k8s.io/controller-modify-secret-name", "modify")
        .parameter(
            "csi.storage.k8s.io/controller-modify-secret-namespace",
            "infra",
        )
        .parameter("pool", "a")
        .build();
    let claim = pvc("data")
        .namespace("apps")
        .annotation("example.com/publish", "attach-secret")
        .build();
    let volume = setup.provision(class, claim).await.expect("provisioned");

    let request = &setup.fake.creates()[0];
    assert_eq!(
        request.secrets,
        map(&[("user", "admin"), ("password", "hunter2")])
    );
    assert_eq!(request.parameters, map(&[("pool", "a")]));
    assert!(!format!("{request:?}").contains("hunter2"));

    let csi = csi(&volume);
    assert_eq!(
        csi.controller_publish_secret_ref,
        reference("attach-secret", "infra")
    );
    assert_eq!(csi.node_stage_secret_ref, reference("stage-pvc-0001", PV));
    assert_eq!(csi.node_publish_secret_ref, reference("publish", "infra"));
    assert_eq!(
        csi.controller_expand_secret_ref,
        reference("expand", "infra")
    );
    assert_eq!(
        csi.node_expand_secret_ref,
        reference("node-expand", "infra")
    );
    let annotations = volume.metadata.annotations.clone().unwrap_or_default();
    let get = |key: &str| annotations.get(key).map(String::as_str);
    assert_eq!(
        get("volume.kubernetes.io/provisioner-deletion-secret-name"),
        Some("data-creds")
    );
    assert_eq!(
        get("volume.kubernetes.io/provisioner-deletion-secret-namespace"),
        Some("apps")
    );
    assert_eq!(
        get("volume.kubernetes.io/controller-modify-secret-name"),
        Some("modify")
    );
    assert_eq!(
        get("volume.kubernetes.io/controller-modify-secret-namespace"),
        Some("infra")
    );
}

#[tokio::test]
async fn a_secret_that_cannot_be_read_is_retried_and_named_without_its_values() {
    let setup = Setup::plain().await;
    let class = fast()
        .parameter("csi.storage.k8s.io/provisioner-secret-name", "missing")
        .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "apps")
        .build();
    let error = setup
        .provision(class, pvc("data").namespace("apps").build())
        .await
        .expect_err("no secret");
    assert_eq!(variant(&error), "NoChange");
    assert!(
        text(&error).contains("reading secret apps/missing failed"),
        "{}",
        text(&error)
    );
    assert!(setup.fake.creates().is_empty());

    // A template the claim cannot fill: NoChange too (upstream), naming the class.
    let class = fast()
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.annotations['absent']}",
        )
        .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "apps")
        .build();
    let error = setup
        .provision(class, pvc("data").build())
        .await
        .expect_err("bad template");
    assert_eq!(variant(&error), "NoChange");
    let message = text(&error);
    assert!(
        message.contains("storage class \"fast\"") && message.contains("invalid tokens"),
        "{message}"
    );
}

// Upstream passes a secret's bytes on as they are; CSI secrets are strings, and a lossy
// conversion would send other credentials than the secret holds.
#[tokio::test]
async fn a_secret_value_that_is_not_utf8_is_refused_naming_the_secret_and_key() {
    let setup = Setup::plain().await;
    setup.secret("apps", "creds", &[("user", "admin")]).await;
    let secrets = Api::<Secret>::namespaced(setup.client(), "apps");
    let mut secret = secrets.get("creds").await.expect("secret read");
    secret
        .data
        .get_or_insert_default()
        .insert("password".into(), ByteString(vec![0xff, 0xfe, b'x']));
    secrets
        .replace("creds", &PostParams::default(), &secret)
        .await
        .expect("secret replaced");
    let class = fast()
        .parameter("csi.storage.k8s.io/provisioner-secret-name", "creds")
        .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "apps")
        .build();
    let error = setup
        .provision(class, pvc("data").namespace("apps").build())
        .await
        .expect_err("a value that is not text");
    let message = text(&error);
    assert!(
        message.contains("key \"password\" of secret apps/creds is not UTF-8 text"),
        "{message}"
    );
    assert!(!message.contains("admin"), "{message}");
    assert!(setup.fake.creates().is_empty());
}

#[tokio::test]
async fn bad_classes_and_claims_fail_without_a_create() {
    let setup = Setup::plain().await;
    let cases: Vec<(StorageClass, PersistentVolumeClaim, &str, &str)> = vec![
        (
            fast().parameter("csi.storage.k8s.io/unknown", "x").build(),
            pvc("data").build(),
            "Failed",
            "unknown parameter \"csi.storage.k8s.io/unknown\"",
        ),
        (
            fast()
                .parameter("csi.storage.k8s.io/fstype", "xfs")
                .parameter("fstype", "ext4")
                .build(),
            pvc("data").build(),
            "Failed",
            "both \"fstype\" and \"csi.storage.k8s.io/fstype\"",
        ),
        (
            fast().build(),
            {
                let mut claim = pvc("data").build();
                claim.spec.as_mut().unwrap().selector = Some(Default::default());
                claim
            },
            "Failed",
            "claim default/data has a selector",
        ),
        (
            fast().build(),
            {
                let mut claim = pvc("data").build();
                claim.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
                claim
            },
            "Infeasible",
            "VolumeAttributesClasses are not supported by this sidecar yet",
        ),
        (
            fast().build(),
            {
                let mut claim = pvc("copy").build();
                claim.spec.as_mut().unwrap().data_source =
                    Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                        kind: "PersistentVolumeClaim".into(),
                        name: "data".into(),
                        api_group: None,
                    });
                claim
            },
            "Infeasible",
            "clones and snapshots are not supported by this sidecar yet",
        ),
        (
            fast().build(),
            {
                let mut claim = pvc("restored").build();
                claim.spec.as_mut().unwrap().data_source_ref =
                    Some(k8s_openapi::api::core::v1::TypedObjectReference {
                        kind: "VolumeSnapshot".into(),
                        name: "snap".into(),
                        api_group: Some("snapshot.storage.k8s.io".into()),
                        namespace: None,
                    });
                claim
            },
            "Infeasible",
            "VolumeSnapshot \"snap\": clones and snapshots are not supported",
        ),
        (
            fast().build(),
            {
                let mut claim = pvc("populated").build();
                claim.spec.as_mut().unwrap().data_source_ref =
                    Some(k8s_openapi::api::core::v1::TypedObjectReference {
                        kind: "Image".into(),
                        name: "img".into(),
                        api_group: Some("example.com".into()),
                        namespace: None,
                    });
                claim
            },
            "Ignored",
            "assuming an external populator will provision it",
        ),
    ];
    for (class, claim, expected, words) in cases {
        let error = setup.provision(class, claim).await.expect_err("refused");
        let message = text(&error);
        assert_eq!(variant(&error), expected, "{message}");
        assert!(message.contains(words), "{message}");
    }
    assert!(setup.fake.creates().is_empty(), "no CreateVolume was sent");
}

#[tokio::test]
async fn create_errors_map_to_what_may_still_exist() {
    let setup = Setup::plain().await;
    setup.fake.script([
        Step::Fail(Status::deadline_exceeded("slow backend")),
        Step::Fail(Status::invalid_argument("no such pool")),
        Step::Fail(Status::resource_exhausted("full")),
        Step::Fail(Status::internal("broken")),
    ]);
    for expected in ["InBackground", "Infeasible", "Failed", "Failed"] {
        let error = setup
            .provision(fast().build(), pvc("data").build())
            .await
            .expect_err("scripted error");
        assert_eq!(variant(&error), expected, "{}", text(&error));
        assert!(text(&error).contains("CreateVolume of volume \"pvc-0001\" failed"));
    }
    // ResourceExhausted with a selected node reschedules only with topology.
    let topology = Setup::new(
        DriverCapabilities::default().accessibility_constraints(true),
        CsiOptions::default(),
    )
    .await;
    // node-1 runs the driver with a zone key, so the requirements are made and CreateVolume
    // is what answers ResourceExhausted.
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-1", "labels": {"zone": "a"}}}))
    .expect("a node");
    let csi_node: k8s_openapi::api::storage::v1::CSINode =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-1"},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": "node-1", "topologyKeys": ["zone"]}]}}))
        .expect("a CSINode");
    let post = kube_client::api::PostParams::default();
    kube_client::Api::all(topology.client())
        .create(&post, &node)
        .await
        .expect("node created");
    kube_client::Api::all(topology.client())
        .create(&post, &csi_node)
        .await
        .expect("CSINode created");
    for node in [Some("node-1".to_owned()), None] {
        topology
            .fake
            .script([Step::Fail(Status::resource_exhausted("full"))]);
        let rescheduled = node.is_some();
        let options = ProvisionOptions::new(
            Arc::new(fast().build()),
            PV,
            Arc::new(pvc("data").build()),
            node,
        );
        let error = topology
            .provisioner
            .provision(&options)
            .await
            .expect_err("full");
        let want = if rescheduled { "Reschedule" } else { "Failed" };
        assert_eq!(variant(&error), want, "{}", text(&error));
        assert!(text(&error).contains("full"), "{}", text(&error));
    }
    let off = Setup::new(
        DriverCapabilities::default().accessibility_constraints(true),
        CsiOptions::default().topology(TopologySettings::default()),
    )
    .await;
    off.fake
        .script([Step::Fail(Status::resource_exhausted("full"))]);
    let options = ProvisionOptions::new(
        Arc::new(fast().build()),
        PV,
        Arc::new(pvc("data").build()),
        Some("node-1".into()),
    );
    let error = off.provisioner.provision(&options).await.expect_err("full");
    assert_eq!(variant(&error), "Failed", "topology off: no reschedule");
}

#[tokio::test]
async fn answers_without_a_volume_or_capacity() {
    let setup = Setup::plain().await;
    setup.fake.answer_no_volume();
    let error = setup
        .provision(fast().build(), pvc("data").build())
        .await
        .expect_err("no volume");
    assert_eq!(variant(&error), "Failed");
    assert!(
        text(&error).contains(&format!("CSI driver {DRIVER} answered CreateVolume")),
        "{}",
        text(&error)
    );

    // Capacity 0 (unknown): the request.
    let setup = Setup::plain().await;
    setup.fake.capacity(0);
    let volume = setup
        .provision(fast().build(), pvc("data").request("3Gi").build())
        .await
        .expect("provisioned");
    assert_eq!(spec(&volume).capacity.as_ref().unwrap()["storage"].0, "3Gi");

    // More than asked: what was made.
    let setup = Setup::plain().await;
    setup.fake.capacity(5 << 30);
    let volume = setup
        .provision(fast().build(), pvc("data").request("3Gi").build())
        .await
        .expect("provisioned");
    assert_eq!(spec(&volume).capacity.as_ref().unwrap()["storage"].0, "5Gi");

    // Less than asked: deleted again (with the provisioner secrets), and a failure.
    let setup = Setup::plain().await;
    setup.fake.capacity(1 << 30);
    let error = setup
        .provision(fast().build(), pvc("data").request("3Gi").build())
        .await
        .expect_err("too small");
    assert_eq!(variant(&error), "Failed", "{}", text(&error));
    assert_eq!(setup.fake.deletes().len(), 1);
    assert!(setup.fake.volumes().is_empty());
    // ... and when deleting it fails, it may still exist: asked again.
    let setup = Setup::plain().await;
    setup.fake.capacity(1 << 30);
    setup
        .fake
        .fail_deletes((0..5).map(|_| Status::unavailable("down")));
    let error = setup
        .provision(fast().build(), pvc("data").request("3Gi").build())
        .await
        .expect_err("too small");
    assert_eq!(variant(&error), "InBackground", "{}", text(&error));
    assert_eq!(setup.fake.deletes().len(), 5);
}

/// A PV as the controller saves it: our volume, its claimRef and class.
fn saved(volume: &PersistentVolume, class: &str) -> PersistentVolume {
    let mut volume = volume.clone();
    let spec = volume.spec.as_mut().unwrap();
    spec.storage_class_name = Some(class.into());
    spec.claim_ref = Some(ObjectReference {
        name: Some("data".into()),
        namespace: Some("apps".into()),
        ..ObjectReference::default()
    });
    volume
}

#[tokio::test]
async fn delete_sends_the_secrets_the_annotations_name() {
    let setup = Setup::plain().await;
    setup.secret("apps", "creds", &[("token", "t0k3n")]).await;
    let class = fast()
        .parameter("csi.storage.k8s.io/provisioner-secret-name", "creds")
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        )
        .build();
    let volume = setup
        .provision(class, pvc("data").namespace("apps").build())
        .await
        .expect("provisioned");
    // The class is gone (never created here): the annotations name the secret.
    setup
        .provisioner
        .delete(&saved(&volume, "fast"))
        .await
        .expect("deleted");
    let deletes = setup.fake.deletes();
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].volume_id, "vol-1");
    assert_eq!(deletes[0].secrets, map(&[("token", "t0k3n")]));
    assert!(setup.fake.volumes().is_empty());
}

#[tokio::test]
async fn delete_without_annotations_reads_the_class_while_it_exists() {
    let setup = Setup::plain().await;
    setup
        .secret("apps", "data-creds", &[("token", "t0k3n")])
        .await;
    let class = fast()
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.name}-creds",
        )
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        )
        .build();
    let volume = setup
        .provision(class.clone(), pvc("data").namespace("apps").build())
        .await
        .expect("provisioned");
    let mut old = saved(&volume, "fast");
    old.metadata.annotations = None; // a PV made before the annotations existed

    // No class: deleted without secrets.
    setup.provisioner.delete(&old).await.expect("deleted");
    assert!(setup.fake.deletes()[0].secrets.is_empty());

    Api::<StorageClass>::all(setup.client())
        .create(&PostParams::default(), &class)
        .await
        .expect("class created");
    setup.provisioner.delete(&old).await.expect("deleted");
    assert_eq!(setup.fake.deletes()[1].secrets, map(&[("token", "t0k3n")]));

    // Empty annotations: no secrets, whatever the class says.
    let mut none = saved(&volume, "fast");
    for value in none.metadata.annotations.as_mut().unwrap().values_mut() {
        value.clear();
    }
    setup.provisioner.delete(&none).await.expect("deleted");
    assert!(setup.fake.deletes()[2].secrets.is_empty());

    // A secret gone meanwhile: deleted without it (upstream).
    let mut gone = saved(&volume, "fast");
    gone.metadata.annotations.as_mut().unwrap().insert(
        "volume.kubernetes.io/provisioner-deletion-secret-name".into(),
        "gone".into(),
    );
    setup.provisioner.delete(&gone).await.expect("deleted");
    assert!(setup.fake.deletes()[3].secrets.is_empty());
}

#[tokio::test]
async fn delete_refuses_other_drivers_attached_volumes_and_reports_driver_errors() {
    let setup = Setup::new(
        DriverCapabilities::default().publish_unpublish(true),
        CsiOptions::default(),
    )
    .await;
    let volume = setup
        .provision(fast().build(), pvc("data").build())
        .await
        .expect("provisioned");

    let mut other = volume.clone();
    other.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "other.csi.example.com".into();
    assert!(matches!(
        setup.provisioner.delete(&other).await,
        Err(DeleteError::Ignored { .. })
    ));
    let mut not_csi = volume.clone();
    not_csi.spec.as_mut().unwrap().csi = None;
    let error = setup
        .provisioner
        .delete(&not_csi)
        .await
        .expect_err("not csi");
    assert!(
        text(&error).contains("has no CSI volume source"),
        "{}",
        text(&error)
    );

    let attachment = VolumeAttachment {
        metadata: ObjectMeta {
            name: Some("csi-1".into()),
            ..ObjectMeta::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.into(),
            node_name: "node-7".into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(PV.into()),
                ..VolumeAttachmentSource::default()
            },
        },
        status: None,
    };
    let attachments: Api<VolumeAttachment> = Api::all(setup.client());
    attachments
        .create(&PostParams::default(), &attachment)
        .await
        .expect("attachment created");
    let error = setup
        .provisioner
        .delete(&volume)
        .await
        .expect_err("attached");
    assert!(matches!(error, DeleteError::Failed(_)));
    assert!(
        text(&error).contains(&format!(
            "persistentvolume {PV} is still attached to node node-7"
        )),
        "{}",
        text(&error)
    );
    assert!(
        setup.fake.deletes().is_empty(),
        "no DeleteVolume while attached"
    );
    // The guard says the same.
    let guard = csi_provisioner::AttachedVolumeGuard::new(setup.client());
    assert!(!provision_controller::DeletionGuard::should_delete(&guard, &volume).await);
    attachments
        .delete("csi-1", &Default::default())
        .await
        .expect("attachment deleted");
    assert!(provision_controller::DeletionGuard::should_delete(&guard, &volume).await);

    // The driver's errors are failures with its message; NotFound too (upstream).
    setup.fake.fail_deletes([
        Status::internal("disk busy"),
        Status::not_found("no such volume"),
    ]);
    for words in ["disk busy", "no such volume"] {
        let error = setup.provisioner.delete(&volume).await.expect_err("fails");
        assert!(matches!(error, DeleteError::Failed(_)));
        let message = text(&error);
        assert!(
            message
                .contains("DeleteVolume of volume \"vol-1\" of persistentvolume pvc-0001 failed")
                && message.contains(words),
            "{message}"
        );
    }
    setup.provisioner.delete(&volume).await.expect("deleted");
    assert!(setup.fake.volumes().is_empty());
}
