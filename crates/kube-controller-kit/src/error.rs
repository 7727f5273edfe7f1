//! Error reports on one line: an error and all its sources.
//!
//! `Display` of a `thiserror` error shows only its own message (`"delete persistentvolume
//! pvc-1 failed"`); the cause (`"connection refused"`) sits in
//! [`source`](std::error::Error::source). Event notes, status messages and log fields
//! need the whole story in one string, which [`chain`] builds.
//!
//! `tracing` prints only the top message of an error passed as `error = %err`; pass
//! `error = %chain(&err)` instead.

use std::error::Error;
use std::fmt::Write as _;

/// `error` and each of its sources, outermost first, joined by `": "`, each message once.
///
/// A source whose message the text so far already ends with, after a separator such as
/// `": "` (an error that embeds its source with `{0}`, like many library errors do), or
/// equals, is skipped, so the report never reads
/// `failed: X: X`; its own sources still follow. A `kube_client::Error::Api` is written
/// without the `Status` debug dump its `Display` adds: a 401 as
/// `401 Unauthorized: the API server refused the credentials (...)`, a 403 as
/// `403 Forbidden: <the server's message>` (it names the verb and the resource), others as
/// `ApiError: <message>: <reason>`. A kube error that did not reach the server is written as
/// its cause in words (`connection refused (...)`, `host not found (...)`, `TLS: unknown
/// issuer (...)`) instead of `ServiceError: client error (Connect)` and its sources.
///
/// ```
/// use kube_controller_kit::error::chain;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("saving persistentvolume pvc-1 failed")]
/// struct SaveFailed(#[source] std::io::Error);
///
/// let error = SaveFailed(std::io::Error::other("connection refused"));
/// assert_eq!(chain(&error), "saving persistentvolume pvc-1 failed: connection refused");
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("saving persistentvolume pvc-1 failed: {0}")]
/// struct EmbedsItsSource(#[source] std::io::Error);
///
/// let error = EmbedsItsSource(std::io::Error::other("connection refused"));
/// assert_eq!(chain(&error), "saving persistentvolume pvc-1 failed: connection refused");
/// ```
#[must_use]
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let (mut text, mut covered) = message(error);
    let mut source = error.source();
    while let Some(cause) = source.filter(|_| !covered) {
        let (next, covers) = message(cause);
        if !next.is_empty() && !ends_with_message(&text, &next) {
            // Writing to a String cannot fail.
            let _ = write!(text, ": {next}");
        }
        covered = covers;
        source = cause.source();
    }
    text
}

/// Whether `text` is `message` or ends with it after a non-alphanumeric character (as in
/// `"...: {0}"`): a source already printed, not merely a suffix of a word.
fn ends_with_message(text: &str, message: &str) -> bool {
    text.strip_suffix(message).is_some_and(|before| {
        before
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_alphanumeric())
    })
}

/// The message of one error (its `Display`, except for kube's errors, see [`chain`]), and
/// whether it already says what its sources would.
fn message(error: &(dyn Error + 'static)) -> (String, bool) {
    match error.downcast_ref::<kube_client::Error>() {
        Some(kube_client::Error::Api(status)) => (api_message(status), true),
        Some(kube_client::Error::RustlsTls(tls)) => {
            use kube_client::client::RustlsTlsError as T;
            let detail = match tls {
                T::InvalidPrivateKey(inner) => inner.to_string(),
                T::MissingPrivateKey | T::UnknownPrivateKeyFormat => tls.to_string(),
                _ => return (format!("TLS settings: {tls}"), true),
            };
            let line =
                format!("the kubeconfig's client key is not a usable private key ({detail})");
            (line, true)
        }
        Some(other) => match transport_cause(other) {
            Some(cause) => (cause, true),
            None => (other.to_string(), false),
        },
        None => (error.to_string(), false),
    }
}

/// A status the API server answered, in words: 401 says the credentials were refused,
/// 403 quotes the server (who may not do which verb on which resource).
fn api_message(status: &kube_client::core::Status) -> String {
    match status.code {
        401 => "401 Unauthorized: the API server refused the credentials (check the \
                kubeconfig's user, or the service account's token)"
            .to_owned(),
        403 => format!("403 Forbidden: {}", status.message),
        _ => format!("ApiError: {status}"),
    }
}

/// Why a request did not reach the API server, in words, when one of `error`'s sources
/// says: connection refused, host not found, a TLS failure (unknown issuer, a name the
/// certificate does not cover, an expired certificate), a timeout.
pub(crate) fn transport_cause(error: &(dyn Error + 'static)) -> Option<String> {
    let mut next: Option<&(dyn Error + 'static)> = Some(error);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            // io::Error's own `source` skips the error it wraps: look at that one first.
            if let Some(found) = io.get_ref().and_then(|inner| transport_cause(inner)) {
                return Some(found);
            }
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    return Some(
                        "connection refused (nothing listens there: is the API server \
                         running, and is the kubeconfig's server address right?)"
                            .to_owned(),
                    );
                }
                std::io::ErrorKind::TimedOut => return Some("connection timed out".to_owned()),
                _ => {}
            }
        }
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls_cause(tls));
        }
        if error.to_string() == "dns error" {
            // hyper-util's connector: the host name did not resolve.
            let detail = error.source().map(ToString::to_string).unwrap_or_default();
            return Some(format!(
                "host not found (the server's name does not resolve: {detail})"
            ));
        }
        next = error.source();
    }
    None
}

fn tls_cause(error: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match error {
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => "TLS: unknown issuer (the \
            server's certificate is not signed by the kubeconfig's certificate-authority)"
            .to_owned(),
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => "TLS: the server's certificate is not valid for its address in the kubeconfig"
            .to_owned(),
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "TLS: the server's certificate has expired".to_owned()
        }
        other => format!("TLS: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layers(messages: &[&'static str]) -> Option<Box<Layer>> {
        let (first, rest) = messages.split_first()?;
        Some(Box::new(Layer {
            message: first,
            source: layers(rest),
        }))
    }

    #[test]
    fn every_source_follows_its_error_outermost_first() {
        let error = layers(&["create volume", "session expired", "401"]).unwrap();
        assert_eq!(chain(&*error), "create volume: session expired: 401");
    }

    #[test]
    fn an_error_without_source_is_its_own_message() {
        let error = layers(&["claim c has no uid"]).unwrap();
        assert_eq!(chain(&*error), "claim c has no uid");
    }

    #[test]
    fn a_boxed_send_sync_error_can_be_passed() {
        let boxed: Box<dyn Error + Send + Sync> = layers(&["outer", "inner"]).unwrap();
        assert_eq!(chain(&*boxed), "outer: inner");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("failed to get lease: {0}")]
    struct Embeds(#[source] Box<Layer>);

    #[test]
    fn a_source_already_embedded_in_its_error_is_printed_once() {
        let error = Embeds(layers(&["connection refused", "os error 111"]).unwrap());
        assert_eq!(
            chain(&error),
            "failed to get lease: connection refused: os error 111"
        );
    }

    #[test]
    fn a_source_equal_to_its_error_is_printed_once() {
        let error = layers(&["timed out", "timed out"]).unwrap();
        assert_eq!(chain(&*error), "timed out");
    }

    #[test]
    fn a_source_contained_elsewhere_than_at_the_end_or_inside_a_word_is_kept() {
        let error = layers(&["pvc-1 not saved", "pvc-1"]).unwrap();
        assert_eq!(chain(&*error), "pvc-1 not saved: pvc-1");
        let error = layers(&["status 5001", "001"]).unwrap();
        assert_eq!(chain(&*error), "status 5001: 001");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("failed to renew lease ns/l")]
    struct Renew(#[source] kube_client::Error);

    #[test]
    fn a_kube_api_error_is_its_status_message_once_without_the_debug_dump() {
        let status = kube_client::core::Status::failure(
            "leases.coordination.k8s.io \"l\" is forbidden",
            "Forbidden",
        )
        .with_code(403);
        let error = Renew(kube_client::Error::Api(Box::new(status)));
        assert_eq!(
            chain(&error),
            "failed to renew lease ns/l: 403 Forbidden: leases.coordination.k8s.io \"l\" is forbidden"
        );
    }
}
