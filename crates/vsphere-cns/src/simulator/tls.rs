//! HTTPS for the simulator: a listener that completes a TLS handshake with the test
//! certificate in `certs/` before handing the connection to axum.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// The test CA that signed the simulator's server certificate (PEM).
pub(super) const TEST_CA_PEM: &str = include_str!("certs/test-ca.pem");
/// The simulator's server certificate, for `localhost` and `127.0.0.1` (PEM).
const TEST_SERVER_PEM: &str = include_str!("certs/test-server.pem");
const TEST_SERVER_KEY: &str = include_str!("certs/test-server.key");

/// The server certificate in DER form (what a thumbprint is computed over).
pub(super) fn server_certificate() -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(TEST_SERVER_PEM.as_bytes())
        .expect("the bundled test certificate is valid PEM")
}

fn acceptor() -> std::io::Result<TlsAcceptor> {
    let key = PrivateKeyDer::from_pem_slice(TEST_SERVER_KEY.as_bytes())
        .map_err(|e| std::io::Error::other(format!("bundled test key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(vec![server_certificate()], key)
        .map_err(std::io::Error::other)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TCP connections and completes the TLS handshake; failed handshakes (a client
/// that rejects the certificate) are dropped.
pub(super) struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl TlsListener {
    pub(super) fn new(tcp: TcpListener) -> std::io::Result<Self> {
        Ok(Self {
            tcp,
            acceptor: acceptor()?,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            };
            match self.acceptor.accept(stream).await {
                Ok(tls) => return (tls, addr),
                Err(e) => tracing::debug!(error = %e, "simulator TLS handshake failed"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
