//! The client's hardened edges against hand-written loopback servers: the response-size
//! limit, redirects, plain HTTP only to loopback, and error chains without repetition.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kube_controller_kit::error::chain;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{CnsClient, Error, TlsMode, VirtualCenterConfig};

const PASSWORD: &str = "pw-Secret-7781";
const SERVICE_CONTENT: &str = r#"<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><RetrieveServiceContentResponse xmlns="urn:vim25"><returnval><sessionManager type="SessionManager">SessionManager</sessionManager><propertyCollector type="PropertyCollector">propertyCollector</propertyCollector></returnval></RetrieveServiceContentResponse></soapenv:Body></soapenv:Envelope>"#;

fn config(port: u16) -> VirtualCenterConfig {
    VirtualCenterConfig::new("127.0.0.1", "admin", PASSWORD)
        .port(port)
        .tls(TlsMode::PlainHttp)
        .timeout(Duration::from_secs(30))
}

/// Reads one request: its head and its body (by `Content-Length`); `None` at EOF.
async fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((head, body))
}

fn reply(status: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves every connection on `listener` with `answer` until the test ends. `answer` gets
/// the request head and body and writes to the stream itself; it returns `false` to close.
fn serve<F, Fut>(listener: TcpListener, answer: F)
where
    F: Fn(String, Vec<u8>, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Option<TcpStream>> + Send,
{
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                while let Some((head, body)) = read_request(&mut stream).await {
                    match answer(head, body, stream).await {
                        Some(back) => stream = back,
                        None => return,
                    }
                }
            });
        }
    });
}

async fn listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// A GET (service version discovery) gets 404, so the client uses its default versions.
async fn not_found(mut stream: TcpStream) -> Option<TcpStream> {
    stream
        .write_all(&reply("404 Not Found", "", ""))
        .await
        .ok()?;
    Some(stream)
}

#[tokio::test]
async fn a_response_larger_than_the_limit_fails_without_being_read_to_the_end() {
    let (listener, port) = listener().await;
    let sent = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (sent2, done2) = (sent.clone(), done.clone());
    serve(listener, move |head, _body, mut stream| {
        let (sent, done) = (sent2.clone(), done2.clone());
        async move {
            if head.starts_with("GET") {
                return not_found(stream).await;
            }
            // An endless chunked body of up to 1 GiB, counting what the kernel accepted.
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nTransfer-Encoding: chunked\r\n\r\n";
            let mut ok = stream.write_all(head.as_bytes()).await.is_ok();
            let chunk = format!("10000\r\n{}\r\n", "<a/>".repeat(0x10000 / 4));
            while ok && sent.load(Ordering::SeqCst) < 1 << 30 {
                ok = stream.write_all(chunk.as_bytes()).await.is_ok();
                sent.fetch_add(0x10000, Ordering::SeqCst);
            }
            done.store(true, Ordering::SeqCst);
            None
        }
    });
    let limit = 1024 * 1024;
    let err = CnsClient::connect(&config(port).max_response_bytes(limit))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ResponseTooLarge { operation: "RetrieveServiceContent", limit: l } if l == limit),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("RetrieveServiceContent") && text.contains("1048576"),
        "{text}"
    );
    // The client closed the connection: the server's writes fail long before 1 GiB.
    for _ in 0..600 {
        if done.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(done.load(Ordering::SeqCst), "the server is still writing");
    let sent = sent.load(Ordering::SeqCst);
    assert!(
        sent < 64 << 20,
        "the client read {sent} bytes of a body limited to {limit}"
    );
}

#[tokio::test]
async fn an_announced_length_over_the_limit_fails_before_the_body_is_read() {
    let (listener, port) = listener().await;
    serve(listener, |head, _body, mut stream| async move {
        if head.starts_with("GET") {
            return not_found(stream).await;
        }
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: 1073741824\r\n\r\n";
        stream.write_all(head.as_bytes()).await.ok()?;
        // Never sends the body: a client that waited for it would time out instead.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        None
    });
    let config = config(port)
        .max_response_bytes(4096)
        .timeout(Duration::from_secs(20));
    let err = CnsClient::connect(&config).await.unwrap_err();
    assert!(
        matches!(err, Error::ResponseTooLarge { limit: 4096, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_redirect_on_login_is_an_error_and_the_password_goes_nowhere_else() {
    // The redirect target records whether anything reached it.
    let (elsewhere, elsewhere_port) = listener().await;
    let reached = Arc::new(AtomicBool::new(false));
    let reached2 = reached.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = elsewhere.accept().await {
            reached2.store(true, Ordering::SeqCst);
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink).await;
        }
    });
    let (listener, port) = listener().await;
    let location = format!("http://127.0.0.1:{elsewhere_port}/sdk");
    serve(listener, move |head, body, mut stream| {
        let location = location.clone();
        async move {
            if head.starts_with("GET") {
                return not_found(stream).await;
            }
            let body = String::from_utf8_lossy(&body).into_owned();
            let answer = if body.contains("<Login") {
                reply(
                    "307 Temporary Redirect",
                    &format!("Location: {location}\r\n"),
                    "",
                )
            } else {
                reply("200 OK", "", SERVICE_CONTENT)
            };
            stream.write_all(&answer).await.ok()?;
            Some(stream)
        }
    });
    let err = CnsClient::connect(&config(port).timeout(Duration::from_secs(10)))
        .await
        .unwrap_err();
    let expected = format!("127.0.0.1:{elsewhere_port}");
    assert!(
        matches!(&err, Error::Redirect { operation: "Login", status: 307, location: Some(l) } if *l == expected),
        "{err:?}"
    );
    let text = chain(&err);
    assert!(
        text.contains("HTTP 307") && text.contains(&expected),
        "{text}"
    );
    assert!(!text.contains(PASSWORD) && !format!("{err:?}").contains(PASSWORD));
    assert!(!reached.load(Ordering::SeqCst), "the redirect was followed");
}

#[tokio::test]
async fn plain_http_to_a_host_that_is_not_loopback_is_refused_before_sending() {
    // 192.0.2.0/24 is TEST-NET-1: nothing answers there, so only an early refusal is quick.
    let config = VirtualCenterConfig::new("192.0.2.1", "admin", PASSWORD)
        .tls(TlsMode::PlainHttp)
        .timeout(Duration::from_secs(60));
    let err = tokio::time::timeout(Duration::from_secs(10), CnsClient::connect(&config))
        .await
        .expect("refused without network I/O")
        .unwrap_err();
    assert!(matches!(err, Error::Settings(_)), "{err:?}");
    assert!(err.to_string().contains("loopback"), "{err}");
}

/// Each error of the chain shows up once in `chain(err)`, and so does `needle`.
fn assert_said_once(err: &(dyn std::error::Error + 'static), needle: &str) {
    let text = chain(err);
    assert_eq!(text.matches(needle).count(), 1, "{needle:?} in {text}");
    let mut layer: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = layer {
        let own = e.to_string();
        assert_eq!(text.matches(own.as_str()).count(), 1, "{own:?} in {text}");
        layer = e.source();
    }
}

#[tokio::test]
async fn a_transport_error_chain_names_the_url_once() {
    let (listener, port) = listener().await;
    drop(listener); // connection refused
    let err = CnsClient::connect(&config(port)).await.unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
    assert!(std::error::Error::source(&err).is_some());
    assert_said_once(&err, &format!("http://127.0.0.1:{port}/sdk"));
}

#[test]
fn a_config_read_error_chain_names_the_path_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.conf");
    let err = crate::VsphereConfig::load(&path).unwrap_err();
    assert!(std::error::Error::source(&err).is_some());
    assert_said_once(&err, &path.display().to_string());
}
