//! Each way a first run fails reads as one line with its cause in words
//! (`error::chain` of what `client::check` and `client::from_config` return), against
//! servers this test starts on loopback: a closed port, a TLS server whose certificate
//! another authority signed, a server answering 401 and 403. None quotes a credential.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{Api, Config};
use kube_controller_kit::client::{check, from_config};
use kube_controller_kit::error::chain;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

const SERVER_CERT: &[u8] = include_bytes!("certs/test-server.pem");
const SERVER_KEY: &[u8] = include_bytes!("certs/test-server.key");
const TOKEN: &str = "s3cr3t-token-value";

/// Answers every request with `code` and a Status of `message` (plain HTTP), or `{}`
/// over TLS when `tls`.
async fn serve(code: u16, message: &'static str, tls: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tls.then(|| {
        let certs = CertificateDer::pem_slice_iter(SERVER_CERT)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(SERVER_KEY).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_request| async move {
                    let body = serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": message, "code": code,
                        "reason": if code == 401 { "Unauthorized" } else { "Forbidden" },
                    });
                    let mut response =
                        http::Response::new(Full::new(Bytes::from(body.to_string())));
                    *response.status_mut() = http::StatusCode::from_u16(code).unwrap();
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(response)
                });
                let server = auto::Builder::new(TokioExecutor::new());
                let _ = match acceptor {
                    Some(acceptor) => {
                        let Ok(tls) = acceptor.accept(stream).await else {
                            return;
                        };
                        server.serve_connection(TokioIo::new(tls), service).await
                    }
                    None => server.serve_connection(TokioIo::new(stream), service).await,
                };
            });
        }
    });
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://127.0.0.1:{port}")
}

fn config(url: &str) -> Config {
    let mut config = Config::new(url.parse().unwrap());
    config.auth_info.token = Some(TOKEN.to_owned().into());
    config
}

/// What `check` says, as one line.
async fn checked(config: Config) -> String {
    let client = from_config(config.clone()).unwrap();
    let line = chain(&check(&client, &config).await.expect_err("the check fails"));
    assert!(!line.contains(TOKEN), "{line}");
    assert!(!line.contains('\n') && !line.contains("Status {"), "{line}");
    line
}

#[tokio::test]
async fn nothing_listening_is_connection_refused() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let line = checked(config(&format!("http://127.0.0.1:{port}"))).await;
    assert_eq!(
        line,
        format!(
            "cannot reach the API server at http://127.0.0.1:{port}/: connection refused \
             (nothing listens there: is the API server running, and is the kubeconfig's \
             server address right?)"
        )
    );
}

#[tokio::test]
async fn a_certificate_of_another_authority_is_an_unknown_issuer() {
    let url = serve(200, "", true).await;
    // No root certificate: the platform's roots, which never signed the test server's.
    let line = checked(config(&url)).await;
    assert_eq!(
        line,
        format!(
            "cannot reach the API server at {url}/: TLS: unknown issuer (the server's \
             certificate is not signed by the kubeconfig's certificate-authority)"
        )
    );
}

#[tokio::test]
async fn a_401_says_the_credentials_were_refused() {
    let url = serve(401, "Unauthorized", false).await;
    let line = checked(config(&url)).await;
    assert_eq!(
        line,
        format!(
            "the API server at {url}/ refused the client: 401 Unauthorized: the API server \
             refused the credentials (check the kubeconfig's user, or the service account's \
             token)"
        )
    );
}

#[tokio::test]
async fn a_403_names_the_verb_and_the_resource() {
    const DENIED: &str = "leases.coordination.k8s.io \"l\" is forbidden: User \
        \"system:serviceaccount:ns:sa\" cannot get resource \"leases\" in API group \
        \"coordination.k8s.io\" in the namespace \"ns\"";
    let url = serve(403, DENIED, false).await;
    let client = from_config(config(&url)).unwrap();
    let error = Api::<Lease>::namespaced(client, "ns")
        .get("l")
        .await
        .expect_err("forbidden");
    assert_eq!(chain(&error), format!("403 Forbidden: {DENIED}"));
}

#[tokio::test]
async fn a_corrupt_client_key_is_named_without_its_content() {
    let mut config = config("https://127.0.0.1:1");
    let key = std::env::temp_dir().join(format!("corrupt-key-{}.pem", std::process::id()));
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nbm90LWEta2V5LXMzY3IzdA==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let cert = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/certs/test-server.pem");
    config.auth_info.client_certificate = Some(cert.to_owned());
    config.auth_info.client_key = Some(key.display().to_string());
    let Err(error) = from_config(config) else {
        panic!("the key is not a key")
    };
    let line = chain(&error);
    assert!(
        !line.contains("bm90LWEta2V5") && !line.contains("Rustls"),
        "{line}"
    );
    assert!(!line.contains('\n') && !line.contains("General("), "{line}");
    assert!(
        line.starts_with("cannot build a Kubernetes client for https://127.0.0.1:1/: "),
        "{line}"
    );
    let _ = std::fs::remove_file(&key);
    println!("{line}");
    assert_eq!(
        line,
        "cannot build a Kubernetes client for https://127.0.0.1:1/: the kubeconfig's client \
         key is not a usable private key (unexpected error: failed to parse private key as \
         RSA, ECDSA, or EdDSA)"
    );
}
