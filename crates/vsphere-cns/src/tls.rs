//! TLS for the vCenter connection: system roots, a CA bundle, a pinned SHA-256 thumbprint,
//! or (only when configured) no verification.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// How the server's certificate is checked.
///
/// Options that exclude each other are one enum. Parsing `csi-vsphere.conf` never produces
/// [`TlsMode::PlainHttp`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Verify the chain against the system's root certificates and check the host name.
    /// The default.
    #[default]
    Verified,
    /// Verify the chain against the certificates of this PEM bundle (`ca-file`) and check
    /// the host name.
    CaFile(PathBuf),
    /// Accept exactly the leaf certificate whose SHA-256 digest is this thumbprint
    /// (`thumbprint`), whatever its chain or name.
    Thumbprint(Thumbprint),
    /// Accept any certificate (`insecure-flag = true`). Never a default.
    Insecure,
    /// Plain `http://`, no TLS at all: only for the in-process simulator in tests and the demo.
    PlainHttp,
}

/// A SHA-256 certificate thumbprint, written `AA:BB:...` (32 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thumbprint([u8; 32]);

impl Thumbprint {
    /// Parses `AA:BB:..` (colons optional, case-insensitive).
    ///
    /// # Errors
    /// A message saying why the text is not a SHA-256 thumbprint.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let hex: String = text.trim().chars().filter(|c| *c != ':').collect();
        if hex.len() == 40 {
            return Err("is a SHA-1 thumbprint; only SHA-256 thumbprints are supported".into());
        }
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err("is not a SHA-256 thumbprint (32 hex bytes such as AA:BB:..)".into());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| "is not a SHA-256 thumbprint".to_owned())?;
        }
        Ok(Self(bytes))
    }

    /// The thumbprint of a DER certificate.
    pub fn of_certificate(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }
}

impl std::fmt::Display for Thumbprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|b| format!("{b:02X}")).collect();
        f.write_str(&parts.join(":"))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the rustls configuration for `mode`; `None` for [`TlsMode::PlainHttp`].
pub(crate) fn client_config(mode: &TlsMode) -> Result<Option<ClientConfig>> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Settings(format!("TLS setup failed: {e}")))?;
    let config = match mode {
        TlsMode::PlainHttp => return Ok(None),
        TlsMode::Verified => {
            let loaded = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(loaded.certs);
            if added == 0 {
                return Err(Error::Settings(
                    "no system root certificates found; set ca-file or thumbprint".into(),
                ));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsMode::CaFile(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                Error::Settings(format!("cannot read ca-file {}: {e}", path.display()))
            })?;
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    Error::Settings(format!("ca-file {} is not valid PEM: {e}", path.display()))
                })?;
                roots.add(cert).map_err(|e| {
                    Error::Settings(format!("ca-file {}: bad certificate: {e}", path.display()))
                })?;
            }
            if roots.is_empty() {
                return Err(Error::Settings(format!(
                    "ca-file {} holds no certificates",
                    path.display()
                )));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsMode::Thumbprint(thumbprint) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                expected: Some(thumbprint.clone()),
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        TlsMode::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                expected: None,
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
    };
    Ok(Some(config))
}

/// Accepts the leaf whose SHA-256 matches `expected`, or any leaf when `expected` is `None`
/// (insecure mode). Handshake signatures are still checked, so the peer holds the key.
#[derive(Debug)]
struct PinnedVerifier {
    expected: Option<Thumbprint>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match &self.expected {
            None => Ok(ServerCertVerified::assertion()),
            Some(expected) => {
                let actual = Thumbprint::of_certificate(end_entity.as_ref());
                if &actual == expected {
                    Ok(ServerCertVerified::assertion())
                } else {
                    Err(rustls::Error::General(format!(
                        "server certificate thumbprint {actual} does not match the configured {expected}"
                    )))
                }
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier(expected: Option<Thumbprint>) -> PinnedVerifier {
        PinnedVerifier {
            expected,
            algorithms: provider().signature_verification_algorithms,
        }
    }

    fn check(v: &PinnedVerifier, der: &[u8]) -> bool {
        let cert = CertificateDer::from(der.to_vec());
        let name = ServerName::try_from("vc.example.com").unwrap();
        v.verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
            .is_ok()
    }

    #[test]
    fn thumbprint_parses_with_or_without_colons_and_prints_upper_case() {
        let digest = Thumbprint::of_certificate(b"cert");
        let text = digest.to_string();
        assert_eq!(text.len(), 32 * 3 - 1);
        assert_eq!(Thumbprint::parse(&text).unwrap(), digest);
        assert_eq!(
            Thumbprint::parse(&text.replace(':', "").to_lowercase()).unwrap(),
            digest
        );
    }

    #[test]
    fn thumbprint_rejects_sha1_and_garbage() {
        let sha1 = ["AB"; 20].join(":");
        assert!(Thumbprint::parse(&sha1).unwrap_err().contains("SHA-1"));
        assert!(Thumbprint::parse("zz").is_err());
        assert!(Thumbprint::parse(&["GG"; 32].join(":")).is_err());
    }

    #[test]
    fn pinned_verifier_accepts_only_the_matching_leaf() {
        let pinned = verifier(Some(Thumbprint::of_certificate(b"the right cert")));
        assert!(check(&pinned, b"the right cert"));
        assert!(!check(&pinned, b"another cert"));
    }

    #[test]
    fn insecure_verifier_accepts_any_leaf() {
        assert!(check(&verifier(None), b"whatever"));
    }

    #[test]
    fn missing_ca_file_is_a_settings_error() {
        let err = client_config(&TlsMode::CaFile("/nonexistent/ca.pem".into())).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn ca_file_without_certificates_is_rejected() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "not a certificate\n").unwrap();
        let err = client_config(&TlsMode::CaFile(file.path().into())).unwrap_err();
        assert!(err.to_string().contains("no certificates"), "{err}");
    }
}
