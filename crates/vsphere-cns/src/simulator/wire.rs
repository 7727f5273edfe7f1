//! Response documents in the shapes vcsim sends (see `tests/samples`).

use crate::soap::encode::{self, CNS_VOLUME_MANAGER};
use crate::wire::CnsVolume;
use crate::xml::{XSI_NS, XmlWriter, escape};

use super::TaskRecord;

/// The version the simulator reports for both `urn:vim25` and `urn:vsan`.
pub(super) const VERSION: &str = "8.0.3.0";

fn esc(text: &str) -> String {
    let mut out = String::new();
    escape(text, &mut out);
    out
}

/// vcsim's envelope around `body`.
pub(super) fn envelope(body: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<soapenv:Envelope xmlns:soapenc=\"http://schemas.xmlsoap.org/soap/encoding/\" xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"{XSI_NS}\"><soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
    )
}

/// A SOAP fault document: `<detail><{T}Fault xmlns="urn:vim25" xsi:type="{T}">detail</..>`.
pub(super) fn fault(fault_type: &str, message: &str, detail: &str) -> String {
    let t = esc(fault_type);
    envelope(&format!(
        "<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>{}</faultstring><detail><{t}Fault xmlns=\"urn:vim25\" xsi:type=\"{t}\">{detail}</{t}Fault></detail></soapenv:Fault>",
        esc(message)
    ))
}

/// `vimServiceVersions.xml` / `vsanServiceVersions.xml`.
pub(super) fn service_versions(namespace: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<namespaces version=\"1.0\">\n <namespace>\n  <name>{namespace}</name>\n  <version>{VERSION}</version>\n </namespace>\n</namespaces>\n"
    )
}

pub(super) fn service_content() -> String {
    let mut w = XmlWriter::new();
    w.start_with(
        "RetrieveServiceContentResponse",
        &[("xmlns", encode::VIM_NS)],
    )
    .start("returnval");
    w.moref("rootFolder", "Folder", "group-d1");
    w.moref(
        "propertyCollector",
        "PropertyCollector",
        "propertyCollector",
    );
    w.start("about")
        .text("name", "VMware vCenter Server")
        .text("fullName", "vsphere-cns simulator")
        .text("vendor", "VMware, Inc.")
        .text("version", VERSION)
        .text("apiType", "VirtualCenter")
        .text("apiVersion", VERSION)
        .end("about");
    w.moref("sessionManager", "SessionManager", "SessionManager");
    w.moref("searchIndex", "SearchIndex", "SearchIndex");
    w.end("returnval").end("RetrieveServiceContentResponse");
    envelope(&w.finish())
}

pub(super) fn login(key: &str, user: &str) -> String {
    let mut w = XmlWriter::new();
    w.start_with("LoginResponse", &[("xmlns", encode::VIM_NS)])
        .start("returnval");
    w.text("key", key)
        .text("userName", user)
        .text("fullName", user);
    w.text("locale", "en_US").text("messageLocale", "en_US");
    w.end("returnval").end("LoginResponse");
    envelope(&w.finish())
}

pub(super) fn empty(method: &str, ns: &str) -> String {
    let mut w = XmlWriter::new();
    w.start_with(&format!("{method}Response"), &[("xmlns", ns)])
        .end(&format!("{method}Response"));
    envelope(&w.finish())
}

pub(super) fn task(method: &str, task_id: &str) -> String {
    let mut w = XmlWriter::new();
    let name = format!("{method}Response");
    w.start_with(&name, &[("xmlns", encode::VSAN_NS)])
        .moref("returnval", "Task", task_id)
        .end(&name);
    envelope(&w.finish())
}

/// `<fault _XMLSchema-instance:type="T">detail</fault><localizedMessage>..`, for use inside
/// an element that declares the `_XMLSchema-instance` prefix.
pub(super) fn localized_fault(fault_type: &str, message: &str, detail: &str) -> String {
    let mut out = format!(
        "<fault _XMLSchema-instance:type=\"{}\">{detail}</fault>",
        esc(fault_type)
    );
    if !message.is_empty() {
        out.push_str(&format!(
            "<localizedMessage>{}</localizedMessage>",
            esc(message)
        ));
    }
    out
}

/// `volumeResults` of a batch result, typed `kind`.
pub(super) fn volume_result(
    kind: &str,
    volume_id: &str,
    extra: &str,
    fault: Option<&str>,
) -> String {
    let mut out = format!(
        "<volumeResults _XMLSchema-instance:type=\"{kind}\"><volumeId><id>{}</id></volumeId>",
        esc(volume_id)
    );
    if let Some(fault) = fault {
        out.push_str(&format!("<fault>{fault}</fault>"));
    }
    out.push_str(extra);
    out.push_str("</volumeResults>");
    out
}

pub(super) fn task_info(task_id: &str, record: &TaskRecord, user: &str) -> String {
    let t = esc(task_id);
    let (state, outcome) = match &record.outcome {
        Ok(result) => (
            "success",
            format!(
                "<result _XMLSchema-instance:type=\"CnsVolumeOperationBatchResult\">{result}</result>"
            ),
        ),
        Err(error) => ("error", format!("<error>{error}</error>")),
    };
    let method = &record.method;
    envelope(&format!(
        "<RetrievePropertiesExResponse xmlns=\"urn:vim25\"><returnval><objects><obj type=\"Task\">{t}</obj><propSet><name>info</name><val xmlns:_XMLSchema-instance=\"{XSI_NS}\" _XMLSchema-instance:type=\"TaskInfo\"><key>{t}</key><task type=\"Task\">{t}</task><name>{method}</name><descriptionId>CnsVolumeManager.{method}</descriptionId><entity type=\"CnsVolumeManager\">{CNS_VOLUME_MANAGER}</entity><entityName>{CNS_VOLUME_MANAGER}</entityName><state>{state}</state><cancelled>false</cancelled><cancelable>false</cancelable>{outcome}<reason _XMLSchema-instance:type=\"TaskReasonUser\"><userName>{}</userName></reason><queueTime>2026-01-01T00:00:00Z</queueTime><startTime>2026-01-01T00:00:00Z</startTime><completeTime>2026-01-01T00:00:00Z</completeTime><eventChainId>0</eventChainId></val></propSet></objects></returnval></RetrievePropertiesExResponse>",
        esc(user)
    ))
}

pub(super) fn query(volumes: &[CnsVolume]) -> String {
    let mut w = XmlWriter::new();
    w.start_with("CnsQueryVolumeResponse", &[("xmlns", encode::VSAN_NS)])
        .start("returnval");
    for volume in volumes {
        encode::write_volume(&mut w, volume);
    }
    w.start("cursor")
        .text("offset", "0")
        .text("limit", "0")
        .end("cursor");
    w.end("returnval").end("CnsQueryVolumeResponse");
    envelope(&w.finish())
}
