//! Golden tests against the recorded exchanges in `tests/samples` (copied from
//! `shared/cns/samples`): govmomi's requests byte for byte, every recorded response parsed.

use std::path::{Path, PathBuf};

use super::decode::{self, TaskState};
use super::encode;
use crate::client::Endpoint;
use crate::error::Error;
use crate::wire::*;
use crate::xml::{Element, XmlWriter};

fn samples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/samples")
}

fn read(relative: &str) -> String {
    let path = samples().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Drops whitespace between tags and at the ends.
fn normalise(xml: &str) -> String {
    let mut out = String::new();
    let mut pending = String::new();
    let mut after_tag = true;
    for ch in xml.trim().chars() {
        if ch.is_whitespace() {
            pending.push(ch);
            continue;
        }
        if !(after_tag && ch == '<') {
            out.push_str(&pending);
        }
        pending.clear();
        out.push(ch);
        after_tag = ch == '>';
    }
    out
}

fn assert_same(built: &str, golden_file: &str) {
    assert_eq!(
        normalise(built),
        normalise(&read(golden_file)),
        "request differs from {golden_file}"
    );
}

/// The method element of a recorded request (for the curl samples, whose envelope differs).
fn method_element(xml: &str, method: &str) -> String {
    let start = xml.find(&format!("<{method} ")).expect("method start");
    let end_tag = format!("</{method}>");
    let end = xml.find(&end_tag).expect("method end") + end_tag.len();
    normalise(&xml[start..end])
}

fn demo_cluster() -> ContainerCluster {
    ContainerCluster::kubernetes("demo-cluster", "cnsuser", ClusterFlavor::Vanilla)
}

const PV: &str = "pvc-f5299aad-7a30-45dd-b47d-434169bb117c";
const VOLUME: &str = "e421d406-8ddc-46c0-9068-f1b103734eb6";

fn create_spec() -> VolumeCreateSpec {
    VolumeCreateSpec {
        name: PV.into(),
        volume_type: VolumeType::Block,
        datastores: vec![MoRef::datastore("datastore-59")],
        metadata: VolumeMetadata::for_cluster(demo_cluster(), vec![]),
        capacity_in_mb: 1024,
        ..VolumeCreateSpec::default()
    }
}

fn update_spec() -> VolumeMetadataUpdateSpec {
    let pv = EntityMetadata {
        cluster_id: Some("demo-cluster".into()),
        ..EntityMetadata::new(EntityType::PersistentVolume, PV)
    };
    let pvc = EntityMetadata {
        labels: vec![KeyValue::new("team", "storage")],
        cluster_id: Some("demo-cluster".into()),
        namespace: Some("default".into()),
        referred_entity: vec![EntityReference {
            entity_type: EntityType::PersistentVolume,
            entity_name: PV.into(),
            namespace: None,
            cluster_id: Some("demo-cluster".into()),
        }],
        ..EntityMetadata::new(EntityType::PersistentVolumeClaim, "my-claim")
    };
    VolumeMetadataUpdateSpec {
        volume_id: VOLUME.into(),
        metadata: VolumeMetadata::for_cluster(demo_cluster(), vec![pv, pvc]),
    }
}

/// What the client builds for each govmomi request it also sends, by INDEX.txt id, with
/// the endpoint it sends it to.
fn built_requests() -> Vec<(&'static str, String, Endpoint)> {
    let sm = MoRef::new("SessionManager", "SessionManager");
    let delete = encode::cns_delete_volume(&[VOLUME], true);
    vec![
        ("1-0001", encode::retrieve_service_content(), Endpoint::Vim),
        // govmomi's recording masks the password the same way.
        (
            "1-0002",
            encode::login(&sm, "cnsuser", "********", "en_US"),
            Endpoint::Vim,
        ),
        ("1-0008", encode::logout(&sm), Endpoint::Vim),
        (
            "2-0001",
            encode::cns_create_volume(&create_spec()),
            Endpoint::Cns,
        ),
        (
            "2-0002",
            encode::cns_query_volume(&QueryFilter::by_ids([CnsVolumeId::from(VOLUME)])),
            Endpoint::Cns,
        ),
        (
            "2-0003",
            encode::cns_update_volume_metadata(&update_spec()),
            Endpoint::Cns,
        ),
        ("2-0004", delete.clone(), Endpoint::Cns),
        ("2-0005", delete, Endpoint::Cns),
    ]
}

/// govmomi requests the client does not send, and why.
fn not_sent(id: &str, method: &str) -> Option<&'static str> {
    match method {
        // govmomi's task.Wait; the client polls RetrievePropertiesEx(Task.info) instead
        // (PROTOCOL 1.7), compared with the curl recording below. Same endpoint and action.
        "CreatePropertyCollector"
        | "CreateFilter"
        | "WaitForUpdatesEx"
        | "DestroyPropertyFilter"
        | "DestroyPropertyCollector" => Some("task wait"),
        // govmomi's finder walking the inventory to find the datastore by path; the client
        // asks FindByInventoryPath (compared with the curl recording below).
        "RetrievePropertiesEx" if id.starts_with("1-") => Some("inventory traversal"),
        _ => None,
    }
}

/// Every request listed in govmomi's INDEX.txt is either compared byte for byte (and
/// sent to the same path with the same SOAPAction) or explicitly not sent by this client.
#[test]
fn every_request_in_the_govmomi_index_is_compared_or_explained() {
    let built = built_requests();
    let index = read("govmomi/INDEX.txt");
    let mut compared = Vec::new();
    let mut explained = 0;
    for line in index.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        let (id, method) = fields[0].split_once(' ').expect("id and method");
        let headers = read(&format!("govmomi/{id}.req.headers"));
        let path = headers.split_whitespace().nth(1).expect("request line");
        let action = headers
            .lines()
            .find_map(|l| l.strip_prefix("Soapaction: "))
            .expect("SOAPAction header")
            .trim();
        let (route_path, route_action) = match built.iter().find(|(i, ..)| *i == id) {
            Some((_, body, endpoint)) => {
                assert_same(body, &format!("govmomi/{id}.req.xml"));
                compared.push(id);
                crate::client::route(*endpoint, "9.1.0.0", "6.5")
            }
            None => {
                let why = not_sent(id, method)
                    .unwrap_or_else(|| panic!("{id} {method} is neither compared nor explained"));
                explained += 1;
                // The task wait goes where the client's polls go.
                let endpoint = if why == "task wait" {
                    Endpoint::VimForTasks
                } else {
                    Endpoint::Vim
                };
                crate::client::route(endpoint, "9.1.0.0", "6.5")
            }
        };
        assert_eq!(
            (path, action),
            (route_path, route_action.as_str()),
            "{id} {method}"
        );
    }
    assert_eq!(
        compared.len(),
        built.len(),
        "every built request is in INDEX.txt"
    );
    assert_eq!(
        compared.len() + explained,
        35,
        "INDEX.txt lists 35 requests"
    );
}

#[test]
fn session_requests_match_govmomi() {
    let built = built_requests();
    for (id, body, _) in &built[..3] {
        assert_same(body, &format!("govmomi/{id}.req.xml"));
    }
}

#[test]
fn task_poll_matches_the_verified_curl_request() {
    let body = encode::retrieve_task_info(
        &MoRef::new("PropertyCollector", "propertyCollector"),
        &MoRef::new("Task", "task-94"),
    );
    let golden = read("curl/05-CnsCreateVolume-wait-RetrievePropertiesEx.req.xml");
    assert_eq!(
        method_element(&body, "RetrievePropertiesEx"),
        method_element(&golden, "RetrievePropertiesEx")
    );
}

#[test]
fn find_by_inventory_path_matches_the_curl_request() {
    let body = encode::find_by_inventory_path(
        &MoRef::new("SearchIndex", "SearchIndex"),
        "DC0/datastore/LocalDS_0",
    );
    let golden = read("curl/03-FindByInventoryPath.req.xml");
    assert_eq!(
        method_element(&body, "FindByInventoryPath"),
        method_element(&golden, "FindByInventoryPath")
    );
    let response = body_of("curl/03-FindByInventoryPath.resp.xml");
    assert_eq!(
        response.child("returnval").and_then(decode::moref),
        Some(MoRef::datastore("datastore-59"))
    );
}

#[test]
fn profile_and_backing_disk_follow_backing_object_details() {
    let spec = VolumeCreateSpec {
        name: "v".into(),
        capacity_in_mb: 0,
        backing_disk_id: Some("fcd-1".into()),
        profile_id: Some("policy-1".into()),
        ..VolumeCreateSpec::default()
    };
    let body = encode::cns_create_volume(&spec);
    let xsi = "xmlns:_XMLSchema-instance=\"http://www.w3.org/2001/XMLSchema-instance\"";
    assert!(body.contains(&format!(
        "<backingObjectDetails {xsi} _XMLSchema-instance:type=\"CnsBlockBackingDetails\"><backingDiskId>fcd-1</backingDiskId></backingObjectDetails><profile {xsi} _XMLSchema-instance:type=\"VirtualMachineDefinedProfileSpec\"><profileId>policy-1</profileId></profile></createSpecs>"
    )), "{body}");
}

/// Every recorded response: parses into the response element or into a typed fault.
#[test]
fn every_recorded_response_parses() {
    let mut count = 0;
    for dir in ["curl", "curl-edge", "govmomi"] {
        for entry in std::fs::read_dir(samples().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if let Some(service) = name.strip_suffix("ServiceVersions.xml") {
                let namespace = if service.ends_with("vsan") {
                    "urn:vsan"
                } else {
                    "urn:vim25"
                };
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    decode::service_version(&text, namespace).is_some(),
                    "{dir}/{name}"
                );
                count += 1;
                continue;
            }
            if !(name.ends_with(".resp.xml") || name.ends_with(".res.xml")) {
                continue;
            }
            count += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            match decode::body(&text, "test") {
                Ok(response) => {
                    if response.name == "RetrievePropertiesExResponse" && text.contains("TaskInfo")
                    {
                        decode::task_info(&response, "test")
                            .unwrap_or_else(|e| panic!("{name}: {e}"));
                    }
                    if response.name == "CnsQueryVolumeResponse" {
                        let _ = decode::query_result(&response);
                    }
                }
                Err(Error::Fault { fault_type, .. }) => assert!(!fault_type.is_empty(), "{name}"),
                Err(other) => panic!("{name}: {other}"),
            }
        }
    }
    assert!(count >= 60, "only {count} responses found");
}

fn body_of(file: &str) -> Element {
    decode::body(&read(file), "test").unwrap()
}

fn fault_of(file: &str, operation: &'static str) -> Error {
    decode::body(&read(file), operation).unwrap_err()
}

#[test]
fn service_versions_and_content() {
    assert_eq!(
        decode::service_version(&read("curl/00-vimServiceVersions.xml"), "urn:vim25").as_deref(),
        Some("6.5")
    );
    assert_eq!(
        decode::service_version(&read("curl/00-vsanServiceVersions.xml"), "urn:vsan").as_deref(),
        Some("6.5")
    );
    assert_eq!(
        decode::service_version(&read("curl/00-vsanServiceVersions.xml"), "urn:vim25"),
        None
    );
    let content = decode::service_content(&body_of("govmomi/1-0001.res.xml")).unwrap();
    assert_eq!(
        content.session_manager,
        MoRef::new("SessionManager", "SessionManager")
    );
    assert_eq!(
        content.property_collector,
        MoRef::new("PropertyCollector", "propertyCollector")
    );
    assert_eq!(content.api_version, "6.5");
    assert_eq!(
        content.search_index,
        MoRef::new("SearchIndex", "SearchIndex")
    );
}

#[test]
fn task_references_are_read_from_mutating_calls() {
    let task =
        decode::returnval_moref(&body_of("govmomi/2-0001.res.xml"), "CnsCreateVolume").unwrap();
    assert_eq!(task, MoRef::new("Task", "task-86"));
}

#[test]
fn faults_on_the_call_are_typed() {
    let no_session = fault_of(
        "curl/15-CnsQueryVolume-no-session.resp.xml",
        "CnsQueryVolume",
    );
    assert!(no_session.is_not_authenticated(), "{no_session}");
    assert!(
        no_session.to_string().contains("privilegeId: System.View"),
        "{no_session}"
    );
    let bad_password = fault_of("curl-edge/16-E7-Login-bad-password.resp.xml", "Login");
    assert!(bad_password.is_invalid_login());
    assert_eq!(
        bad_password.to_string(),
        "Login failed with vSphere fault InvalidLogin: Login failure"
    );
    let unknown_task = fault_of(
        "curl-edge/14-E6-RetrievePropertiesEx-unknown-task.resp.xml",
        "RetrievePropertiesEx",
    );
    assert_eq!(unknown_task.fault_type(), Some("ManagedObjectNotFound"));
    assert!(!unknown_task.is_not_found());
}

#[test]
fn create_task_result_with_xml_schema_instance_prefix() {
    let info = decode::task_info(
        &body_of("curl/05-CnsCreateVolume-wait-RetrievePropertiesEx.resp.xml"),
        "t",
    )
    .unwrap();
    assert_eq!(info.state, TaskState::Success);
    assert_eq!(info.results.len(), 1);
    assert_eq!(
        info.results[0].volume_id.as_ref().map(CnsVolumeId::as_str),
        Some("37171b29-3e58-4c53-8d25-0ca15b7e19c0")
    );
    assert_eq!(
        info.results[0].name.as_deref(),
        Some("pvc-bb708120-d68f-4d5f-b71e-a8f9eee11b54")
    );
    assert_eq!(info.results[0].fault, None);
}

#[test]
fn deleting_a_missing_volume_yields_a_not_found_result_fault() {
    for file in [
        "curl/12-CnsDeleteVolume-again-wait-RetrievePropertiesEx.resp.xml",
        "curl-edge/09-E3-wait-RetrievePropertiesEx.resp.xml",
    ] {
        let info = decode::task_info(&body_of(file), "CnsDeleteVolume").unwrap();
        assert_eq!(info.state, TaskState::Success);
        let fault = info.results[0].fault.clone().expect(file);
        assert!(fault.into_error("CnsDeleteVolume").is_not_found(), "{file}");
    }
}

#[test]
fn task_errors_carry_fault_class_and_details() {
    let info = decode::task_info(
        &body_of("curl-edge/13-E5-wait-RetrievePropertiesEx.resp.xml"),
        "t",
    )
    .unwrap();
    assert_eq!(info.state, TaskState::Error);
    let err = info.error.unwrap().into_error("CnsCreateVolume");
    assert_eq!(err.fault_type(), Some("InvalidArgument"));
    assert!(
        err.to_string()
            .contains("invalidProperty: createSpecs.datastores"),
        "{err}"
    );
}

#[test]
fn empty_update_result_has_no_volume_results() {
    let info = decode::task_info(
        &body_of("curl-edge/07-E2-wait-RetrievePropertiesEx.resp.xml"),
        "t",
    )
    .unwrap();
    assert_eq!(info.state, TaskState::Success);
    assert!(info.results.is_empty());
}

#[test]
fn query_results_carry_metadata_and_backing_details() {
    let volumes = decode::query_result(&body_of("curl/08-CnsQueryVolume-after-update.resp.xml"));
    assert_eq!(volumes.len(), 1);
    let volume = &volumes[0];
    assert_eq!(
        volume.volume_id.as_str(),
        "37171b29-3e58-4c53-8d25-0ca15b7e19c0"
    );
    assert_eq!(volume.capacity_in_mb, Some(1024));
    assert_eq!(volume.volume_type.as_deref(), Some("BLOCK"));
    let metadata = volume.metadata.as_ref().unwrap();
    assert_eq!(metadata.container_cluster, demo_cluster());
    assert_eq!(metadata.entity_metadata.len(), 2);
    let pvc = &metadata.entity_metadata[1];
    assert_eq!(pvc.entity_type, EntityType::PersistentVolumeClaim);
    assert_eq!(pvc.labels, vec![KeyValue::new("team", "storage")]);
    assert_eq!(
        pvc.referred_entity[0].entity_name,
        "pvc-bb708120-d68f-4d5f-b71e-a8f9eee11b54"
    );
    assert!(
        decode::query_result(&body_of("curl/13-CnsQueryVolume-after-delete.resp.xml")).is_empty()
    );
}

#[test]
fn written_volumes_read_back_identically() {
    let volume =
        decode::query_result(&body_of("curl/08-CnsQueryVolume-after-update.resp.xml")).remove(0);
    let mut w = XmlWriter::new();
    w.start("returnval");
    encode::write_volume(&mut w, &volume);
    w.end("returnval");
    let xml = format!("<R xmlns=\"urn:vsan\">{}</R>", w.finish());
    let again = decode::query_result(&Element::parse(&xml).unwrap()).remove(0);
    assert_eq!(again, volume);
}

#[test]
fn unknown_elements_are_ignored() {
    let xml = r#"<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><CnsQueryVolumeResponse xmlns="urn:vsan"><returnval><future>1</future><volumes><volumeId><id>v1</id><extra/></volumeId><newField><x>1</x></newField><name>n</name></volumes></returnval></CnsQueryVolumeResponse></soapenv:Body></soapenv:Envelope>"#;
    let volumes = decode::query_result(&decode::body(xml, "t").unwrap());
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].name.as_deref(), Some("n"));
}

#[test]
fn non_soap_bodies_are_protocol_errors() {
    for body in [
        "",
        "<html>502</html>",
        "<Envelope xmlns=\"http://schemas.xmlsoap.org/soap/envelope/\"><Body/></Envelope>",
    ] {
        assert!(
            matches!(decode::body(body, "t"), Err(Error::Protocol { .. })),
            "{body:?}"
        );
    }
}
