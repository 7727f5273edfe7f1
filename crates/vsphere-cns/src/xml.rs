//! A small namespace-aware XML tree (quick-xml's `NsReader`: `xsi:type` found by namespace,
//! any prefix) and a writer whose escaping follows Go's `encoding/xml`, so requests are
//! byte-equal to govmomi's. The tree is kept small (shared namespace URIs, no whitespace
//! between elements); callers move parts out ([`Element::take_child`]) instead of cloning.

use std::collections::HashMap;
use std::sync::Arc;

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::reader::NsReader;

/// The XML Schema instance namespace (`xsi`).
pub(crate) const XSI_NS: &str = "http://www.w3.org/2001/XMLSchema-instance";
/// The SOAP 1.1 envelope namespace.
pub(crate) const SOAP_ENV_NS: &str = "http://schemas.xmlsoap.org/soap/envelope/";
/// Deepest nesting [`Element::parse`] accepts. SOAP messages of this API nest about 12
/// levels; the limit keeps a hostile document from overflowing the stack when the
/// (recursive) tree is walked or dropped.
const MAX_DEPTH: usize = 128;
/// The tree [`Element::parse`] builds may take at most this many times the document's size
/// (plus [`TREE_SLACK`]). A real response takes about 3.5 times; a document of many tiny
/// elements (`<a/><a/>...`, each a full [`Element`]) would take 30 times and more, and is
/// refused instead.
const TREE_FACTOR: usize = 6;
/// Room for the tree of a small document.
const TREE_SLACK: usize = 64 * 1024;

/// Why a document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed XML: {0}")]
pub(crate) struct XmlError(pub(crate) String);

/// One attribute, with its namespace resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attr {
    pub(crate) ns: Option<Arc<str>>,
    pub(crate) name: String,
    pub(crate) value: String,
}

/// One element: resolved namespace (shared), local name, attributes, child elements and
/// text. The text of an element that has children is empty unless it holds more than
/// whitespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Element {
    pub(crate) ns: Option<Arc<str>>,
    pub(crate) name: String,
    pub(crate) attrs: Vec<Attr>,
    pub(crate) children: Vec<Element>,
    pub(crate) text: String,
}

impl Element {
    /// Parses a whole document and returns its root element.
    pub(crate) fn parse(xml: &str) -> Result<Element, XmlError> {
        let mut reader = NsReader::from_str(xml);
        let mut stack: Vec<Element> = Vec::new();
        let mut namespaces = Namespaces::default();
        let err = |e: &dyn std::fmt::Display| XmlError(e.to_string());
        let budget = xml
            .len()
            .saturating_mul(TREE_FACTOR)
            .saturating_add(TREE_SLACK);
        let mut used = 0usize;
        let mut spend = |bytes: usize| {
            used = used.saturating_add(bytes);
            if used > budget {
                Err(XmlError(format!(
                    "the document's tree would take more than {budget} bytes \
                     ({TREE_FACTOR} times the document): too many small elements"
                )))
            } else {
                Ok(())
            }
        };
        loop {
            let (resolved, event) = reader.read_resolved_event().map_err(|e| err(&e))?;
            let ns = namespaces.get(resolved);
            match event {
                Event::Start(ref start) => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(XmlError(format!(
                            "elements nested deeper than {MAX_DEPTH} levels"
                        )));
                    }
                    let element = start_element(&reader, &mut namespaces, ns, start)?;
                    spend(element.own_bytes())?;
                    stack.push(element);
                }
                Event::Empty(ref start) => {
                    let element = start_element(&reader, &mut namespaces, ns, start)?;
                    spend(element.own_bytes())?;
                    match stack.last_mut() {
                        Some(parent) => parent.children.push(element),
                        None => return Ok(element),
                    }
                }
                Event::End(_) => {
                    let mut done = stack
                        .pop()
                        .ok_or_else(|| XmlError("unbalanced end tag".into()))?;
                    done.finish();
                    match stack.last_mut() {
                        Some(parent) => parent.children.push(done),
                        None => return Ok(done),
                    }
                }
                Event::Text(text) => {
                    if let Some(current) = stack.last_mut() {
                        let text = text.xml_content().map_err(|e| err(&e))?;
                        spend(text.len())?;
                        current.text.push_str(&text);
                    }
                }
                Event::CData(data) => {
                    if let Some(current) = stack.last_mut() {
                        let data = data.xml_content().map_err(|e| err(&e))?;
                        spend(data.len())?;
                        current.text.push_str(&data);
                    }
                }
                Event::GeneralRef(reference) => {
                    let resolved = match reference.resolve_char_ref().map_err(|e| err(&e))? {
                        Some(ch) => ch,
                        None => match reference.decode().map_err(|e| err(&e))?.as_ref() {
                            "amp" => '&',
                            "lt" => '<',
                            "gt" => '>',
                            "quot" => '"',
                            "apos" => '\'',
                            other => return Err(XmlError(format!("unknown entity &{other};"))),
                        },
                    };
                    if let Some(current) = stack.last_mut() {
                        current.text.push(resolved);
                    }
                }
                Event::Eof => return Err(XmlError("document has no complete root element".into())),
                _ => {}
            }
        }
    }

    /// The bytes this element takes without its text and children: its slot in the
    /// parent's list, its name and its attributes.
    fn own_bytes(&self) -> usize {
        std::mem::size_of::<Element>()
            + self.name.len()
            + self
                .attrs
                .iter()
                .map(|a| std::mem::size_of::<Attr>() + a.name.len() + a.value.len())
                .sum::<usize>()
    }

    /// Called at the end tag: drops the whitespace between child elements and the spare
    /// capacity of the child list and text.
    fn finish(&mut self) {
        if !self.children.is_empty() && self.text.trim().is_empty() {
            self.text = String::new();
        }
        self.children.shrink_to_fit();
        self.text.shrink_to_fit();
    }

    /// Moves the first child with this local name out of the tree (it is left empty in
    /// place), instead of cloning it.
    pub(crate) fn take_child(&mut self, name: &str) -> Option<Element> {
        self.children
            .iter_mut()
            .find(|c| c.name == name)
            .map(std::mem::take)
    }

    /// An estimate of the heap bytes this tree holds (namespace URIs, shared, not counted),
    /// for tests that bound the tree's size against the document's.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.name.capacity()
            + self.text.capacity()
            + self.attrs.capacity() * std::mem::size_of::<Attr>()
            + self
                .attrs
                .iter()
                .map(|a| a.name.capacity() + a.value.capacity())
                .sum::<usize>()
            + self.children.capacity() * std::mem::size_of::<Element>()
            + self.children.iter().map(Element::heap_bytes).sum::<usize>()
    }

    /// The first child with this local name (any namespace).
    pub(crate) fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child with this local name, in document order.
    pub(crate) fn children_named<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text of the first child with this local name.
    pub(crate) fn child_text(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }

    /// An attribute without namespace, such as a MoRef's `type`.
    pub(crate) fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|a| a.ns.is_none() && a.name == name)
            .map(|a| a.value.as_str())
    }

    /// The local part of the `type` attribute in the XSI namespace, under any prefix.
    pub(crate) fn xsi_type(&self) -> Option<&str> {
        self.attrs
            .iter()
            .find(|a| a.ns.as_deref() == Some(XSI_NS) && a.name == "type")
            .map(|a| a.value.rsplit(':').next().unwrap_or(&a.value))
    }
}

fn start_element(
    reader: &NsReader<&[u8]>,
    namespaces: &mut Namespaces,
    ns: Option<Arc<str>>,
    start: &BytesStart<'_>,
) -> Result<Element, XmlError> {
    let err = |e: &dyn std::fmt::Display| XmlError(e.to_string());
    let name = String::from_utf8_lossy(start.local_name().as_ref()).into_owned();
    let mut element = Element {
        ns,
        name,
        ..Element::default()
    };
    for attr in start.attributes() {
        let attr = attr.map_err(|e| err(&e))?;
        let key = attr.key;
        if key.as_ref() == b"xmlns" || key.as_ref().starts_with(b"xmlns:") {
            continue;
        }
        let (attr_ns, local) = reader.resolve_attribute(key);
        let value = attr.unescape_value().map_err(|e| err(&e))?.into_owned();
        element.attrs.push(Attr {
            ns: namespaces.get(attr_ns),
            name: String::from_utf8_lossy(local.as_ref()).into_owned(),
            value,
        });
    }
    Ok(element)
}

/// The namespace URIs of one document, each allocated once and shared by the elements
/// and attributes in it.
#[derive(Default)]
struct Namespaces(HashMap<Vec<u8>, Arc<str>>);

impl Namespaces {
    fn get(&mut self, resolved: ResolveResult<'_>) -> Option<Arc<str>> {
        let ResolveResult::Bound(ns) = resolved else {
            return None;
        };
        let uri = ns.as_ref();
        if let Some(shared) = self.0.get(uri) {
            return Some(shared.clone());
        }
        let shared: Arc<str> = Arc::from(String::from_utf8_lossy(uri).as_ref());
        self.0.insert(uri.to_vec(), shared.clone());
        Some(shared)
    }
}

/// Escapes text and attribute values the way Go's `encoding/xml` does.
pub(crate) fn escape(raw: &str, out: &mut String) {
    for ch in raw.chars() {
        match ch {
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\t' => out.push_str("&#x9;"),
            '\n' => out.push_str("&#xA;"),
            '\r' => out.push_str("&#xD;"),
            other => out.push(other),
        }
    }
}

/// Writes elements into a string, in the order they are called.
#[derive(Debug, Default)]
pub(crate) struct XmlWriter {
    buf: String,
}

impl XmlWriter {
    /// A writer with an empty buffer.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// `<name>`
    pub(crate) fn start(&mut self, name: &str) -> &mut Self {
        self.buf.push('<');
        self.buf.push_str(name);
        self.buf.push('>');
        self
    }

    /// `<name a="v" ...>`
    pub(crate) fn start_with(&mut self, name: &str, attrs: &[(&str, &str)]) -> &mut Self {
        self.buf.push('<');
        self.buf.push_str(name);
        for (key, value) in attrs {
            self.buf.push(' ');
            self.buf.push_str(key);
            self.buf.push_str("=\"");
            escape(value, &mut self.buf);
            self.buf.push('"');
        }
        self.buf.push('>');
        self
    }

    /// `<name xmlns:_XMLSchema-instance="..." _XMLSchema-instance:type="T">`, as govmomi writes
    /// a polymorphic field.
    pub(crate) fn start_typed(&mut self, name: &str, xsi_type: &str) -> &mut Self {
        self.start_with(
            name,
            &[
                ("xmlns:_XMLSchema-instance", XSI_NS),
                ("_XMLSchema-instance:type", xsi_type),
            ],
        )
    }

    /// `</name>`
    pub(crate) fn end(&mut self, name: &str) -> &mut Self {
        self.buf.push_str("</");
        self.buf.push_str(name);
        self.buf.push('>');
        self
    }

    /// `<name>escaped text</name>`
    pub(crate) fn text(&mut self, name: &str, text: &str) -> &mut Self {
        self.start(name);
        escape(text, &mut self.buf);
        self.end(name)
    }

    /// `<name>text</name>` only when `text` is set (Go's `omitempty`).
    pub(crate) fn opt_text(&mut self, name: &str, text: Option<&str>) -> &mut Self {
        if let Some(text) = text {
            self.text(name, text);
        }
        self
    }

    /// `<name type="kind">value</name>`: a managed object reference.
    pub(crate) fn moref(&mut self, name: &str, kind: &str, value: &str) -> &mut Self {
        self.start_with(name, &[("type", kind)]);
        escape(value, &mut self.buf);
        self.end(name)
    }

    /// The XML written so far.
    pub(crate) fn finish(self) -> String {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xsi_type_is_found_under_any_prefix() {
        for doc in [
            r#"<a xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="T"/>"#,
            r#"<a xmlns:_XMLSchema-instance="http://www.w3.org/2001/XMLSchema-instance" _XMLSchema-instance:type="T"/>"#,
            r#"<a xmlns:q="http://www.w3.org/2001/XMLSchema-instance" q:type="vim25:T"/>"#,
        ] {
            assert_eq!(Element::parse(doc).unwrap().xsi_type(), Some("T"), "{doc}");
        }
    }

    #[test]
    fn a_type_attribute_in_another_namespace_is_not_xsi_type() {
        let doc = r#"<a xmlns:o="urn:other" o:type="T" type="Datastore"/>"#;
        let root = Element::parse(doc).unwrap();
        assert_eq!(root.xsi_type(), None);
        assert_eq!(root.attr("type"), Some("Datastore"));
    }

    #[test]
    fn parses_namespaces_text_and_entities() {
        let doc = r#"<?xml version="1.0"?><e:Envelope xmlns:e="urn:env"><Body xmlns="urn:b"><x>a &amp; b &#34;c&#x27;</x><y/></Body></e:Envelope>"#;
        let root = Element::parse(doc).unwrap();
        assert_eq!(root.name, "Envelope");
        assert_eq!(root.ns.as_deref(), Some("urn:env"));
        let body = root.child("Body").unwrap();
        assert_eq!(body.ns.as_deref(), Some("urn:b"));
        assert_eq!(body.child_text("x"), Some("a & b \"c'"));
        assert_eq!(body.child_text("y"), Some(""));
    }

    #[test]
    fn malformed_documents_are_errors_not_panics() {
        for doc in ["", "<a>", "<a></b>", "<a>&bogus;</a>", "text only"] {
            assert!(Element::parse(doc).is_err(), "{doc:?} should not parse");
        }
    }

    #[test]
    fn hostile_nesting_is_refused_instead_of_overflowing_the_stack() {
        let depth = 200_000;
        let doc = format!("{}{}", "<a>".repeat(depth), "</a>".repeat(depth));
        let err = Element::parse(&doc).unwrap_err();
        assert!(err.to_string().contains("nested deeper than 128"), "{err}");
        let fine = format!("{}{}", "<a>".repeat(MAX_DEPTH), "</a>".repeat(MAX_DEPTH));
        assert!(Element::parse(&fine).is_ok());
    }

    /// A `CnsQueryVolume` response of `count` volumes as vCenter writes it (no whitespace),
    /// or indented (`pretty`).
    fn query_response(count: usize, pretty: bool) -> String {
        let sample = include_str!("../tests/samples/curl/08-CnsQueryVolume-after-update.resp.xml");
        let start = sample.find("<volumes>").unwrap();
        let end = sample.find("</volumes>").unwrap() + "</volumes>".len();
        let mut volume = sample[start..end].to_owned();
        if pretty {
            volume = volume.replace("><", ">\n    <");
        }
        format!(
            "{}{}{}",
            &sample[..start],
            volume.repeat(count),
            &sample[end..]
        )
    }

    #[test]
    fn the_tree_of_a_large_response_stays_a_small_multiple_of_its_size() {
        for pretty in [false, true] {
            let doc = query_response(500, pretty);
            let root = Element::parse(&doc).unwrap();
            let ratio = root.heap_bytes() as f64 / doc.len() as f64;
            eprintln!(
                "pretty={pretty}: {} bytes, tree {} bytes, {ratio:.2}x",
                doc.len(),
                root.heap_bytes()
            );
            assert!(
                ratio < 4.0,
                "pretty={pretty}: tree is {ratio:.2}x the document"
            );
        }
    }

    #[test]
    fn a_document_of_many_tiny_elements_is_refused_instead_of_taking_30_times_its_size() {
        let doc = format!("<r>{}</r>", "<a/>".repeat(200_000));
        let err = Element::parse(&doc).unwrap_err();
        assert!(err.to_string().contains("too many small elements"), "{err}");
        // The same count of elements with realistic content is fine.
        let doc = format!(
            "<r>{}</r>",
            "<name>pvc-0123456789abcdef</name>".repeat(200_000)
        );
        assert_eq!(Element::parse(&doc).unwrap().children.len(), 200_000);
    }

    #[test]
    fn writer_escapes_like_go() {
        let mut w = XmlWriter::new();
        w.text("k", "a<b>&\"'\t\n");
        w.moref("m", "T\"", "v");
        assert_eq!(
            w.finish(),
            "<k>a&lt;b&gt;&amp;&#34;&#39;&#x9;&#xA;</k><m type=\"T&#34;\">v</m>"
        );
    }
}
