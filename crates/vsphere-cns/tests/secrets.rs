//! The password never shows up in logs (at any level), errors or `Debug` output.
#![cfg(feature = "simulator")]

use std::fmt::{Debug, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use vsphere_cns::simulator::CnsSimulator;
use vsphere_cns::{CnsClient, VirtualCenterConfig, wire::QueryFilter};

const PASSWORD: &str = "Pa55-w0rd-never-logged";

/// Records every span and event field, at every level, as text.
#[derive(Clone, Default)]
struct Capture {
    text: Arc<Mutex<String>>,
    next_id: Arc<AtomicU64>,
}

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        span.record(&mut Fields(&mut self.text.lock().unwrap()));
        Id::from_u64(self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, values: &Record<'_>) {
        values.record(&mut Fields(&mut self.text.lock().unwrap()));
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = self.text.lock().unwrap();
        text.push_str(event.metadata().target());
        text.push(' ');
        event.record(&mut Fields(&mut text));
        text.push('\n');
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[tokio::test]
async fn the_password_is_in_no_log_error_or_debug_output() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let sim = CnsSimulator::builder()
        .credentials("cnsuser", PASSWORD)
        .start()
        .await
        .unwrap();
    let config = sim.vc_config();
    let client = CnsClient::connect(&config).await.unwrap();
    sim.expire_sessions();
    client.query_volume(&QueryFilter::default()).await.unwrap();
    let wrong = VirtualCenterConfig {
        password: format!("{PASSWORD}-wrong").into(),
        ..config.clone()
    };
    let refused = CnsClient::connect(&wrong).await.unwrap_err();
    let mut shown = format!("{config:?} {wrong:?} {client:?} {refused} {refused:?}");
    let mut source = std::error::Error::source(&refused);
    while let Some(cause) = source {
        let _ = write!(shown, " {cause} {cause:?}");
        source = cause.source();
    }
    sim.shutdown().await;
    let logs = capture.text.lock().unwrap().clone();
    assert!(
        logs.contains("SOAP call"),
        "the capture saw the calls: {logs}"
    );
    assert!(logs.contains("logging in again"), "{logs}");
    assert!(!logs.contains(PASSWORD), "{logs}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(refused.is_invalid_login(), "{refused}");
}
