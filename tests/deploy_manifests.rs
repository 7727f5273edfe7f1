//! The manifests shipped in `examples/deploy` match what the crates generate or use. These
//! tests live here, not in the crates, so each crate's package builds and tests alone.

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use provision_controller::rbac::{CLUSTER_PERMISSIONS, LEADER_ELECTION_PERMISSIONS, Permission};

type Grants = BTreeSet<(String, String, String)>;

fn flatten(permissions: &[Permission]) -> Grants {
    permissions
        .iter()
        .flat_map(|p| {
            p.verbs
                .iter()
                .map(|v| (p.group.to_owned(), p.resource.to_owned(), (*v).to_owned()))
        })
        .collect()
}

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
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        out.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn the_example_rbac_grants_exactly_what_the_controller_uses() {
    let yaml = include_str!("../examples/deploy/provisioner-rbac.yaml");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).unwrap();
    assert_eq!(granted(&docs, "ClusterRole"), flatten(CLUSTER_PERMISSIONS));
    assert_eq!(granted(&docs, "Role"), flatten(LEADER_ELECTION_PERMISSIONS));
    let bound: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .map(|d| d["subjects"][0]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(bound, ["example-provisioner", "example-provisioner"]);
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
