//! [`Error`]: everything a CNS call can fail with, and how to tell "not found" apart.

use std::time::Duration;

/// Errors of [`CnsClient`](crate::CnsClient) calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with a vSphere fault: a SOAP fault on the call itself, a task that
    /// ended in `error`, or a fault in the task's per-volume result.
    #[error("{operation} failed with vSphere fault {fault_type}{}", message_suffix(.message))]
    Fault {
        /// The SOAP method, for example `CnsDeleteVolume`.
        operation: &'static str,
        /// The fault class (the `xsi:type`), for example `NotFound` or `InvalidLogin`.
        fault_type: String,
        /// The server's message, possibly empty.
        message: String,
    },
    /// The call did not finish within the configured timeout.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        /// The SOAP method or `task wait`.
        operation: &'static str,
        /// The limit that was exceeded.
        after: Duration,
    },
    /// The request could not be sent or its response not received (connection, TLS).
    #[error("{operation}: HTTP request to {url} failed")]
    Transport {
        /// The SOAP method.
        operation: &'static str,
        /// The endpoint (no credentials are ever part of it).
        url: String,
        /// What went wrong.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with something that is not the expected SOAP document.
    #[error("{operation}: unexpected response: {detail}")]
    Protocol {
        /// The SOAP method.
        operation: &'static str,
        /// What was wrong with the response.
        detail: String,
    },
    /// The response body was larger than
    /// [`VirtualCenterConfig::max_response_bytes`](crate::VirtualCenterConfig::max_response_bytes). The body was
    /// not read past the limit.
    #[error(
        "{operation}: the response body exceeds the limit of {limit} bytes \
         (VirtualCenterConfig::max_response_bytes); the rest was not read"
    )]
    ResponseTooLarge {
        /// The SOAP method.
        operation: &'static str,
        /// The limit in bytes.
        limit: u64,
    },
    /// The server answered with a redirect (HTTP 3xx). Redirects are never followed: the
    /// request (for `Login`, the password) is sent to the configured endpoint only.
    #[error(
        "{operation}: the server answered HTTP {status} redirecting to {}; redirects are not followed",
        location.as_deref().unwrap_or("no Location")
    )]
    Redirect {
        /// The SOAP method.
        operation: &'static str,
        /// The HTTP status, for example 307.
        status: u16,
        /// `host:port` of the `Location` header (never its path or query), when it has one.
        location: Option<String>,
    },
    /// The connection settings cannot be used (bad thumbprint, unreadable CA file, plain
    /// HTTP to a host that is not loopback, ...).
    #[error("invalid vCenter connection settings: {0}")]
    Settings(String),
}

fn message_suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The fault class when this is a [`Error::Fault`], without a `vim.fault.` prefix.
    pub fn fault_type(&self) -> Option<&str> {
        match self {
            Error::Fault { fault_type, .. } => Some(
                fault_type
                    .strip_prefix("vim.fault.")
                    .unwrap_or(fault_type.as_str()),
            ),
            _ => None,
        }
    }

    /// Whether the volume (or object) the call named does not exist.
    ///
    /// Decided as vsphere-csi-driver decides it for a delete: the fault class is vim's
    /// `NotFound` (`vim.fault.NotFound`), whether it came as a SOAP fault on the call or as
    /// the fault of the task's per-volume result. `CnsVolumeNotFoundFault` counts as well
    /// (defensive: vsphere-csi-driver does not see it in practice). Messages are never
    /// matched.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.fault_type(),
            Some("NotFound" | "CnsVolumeNotFoundFault")
        )
    }

    /// Whether the session is missing or expired (`NotAuthenticated`).
    pub fn is_not_authenticated(&self) -> bool {
        self.fault_type() == Some("NotAuthenticated")
    }

    /// Whether the user name or password was refused (`InvalidLogin`).
    pub fn is_invalid_login(&self) -> bool {
        self.fault_type() == Some("InvalidLogin")
    }

    /// Whether the call timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(fault_type: &str, message: &str) -> Error {
        Error::Fault {
            operation: "CnsDeleteVolume",
            fault_type: fault_type.into(),
            message: message.into(),
        }
    }

    #[test]
    fn not_found_is_decided_by_fault_class_only() {
        assert!(fault("NotFound", "").is_not_found());
        assert!(fault("vim.fault.NotFound", "").is_not_found());
        assert!(fault("CnsVolumeNotFoundFault", "").is_not_found());
        assert!(
            !fault(
                "CnsFault",
                "The object or item referred to could not be found."
            )
            .is_not_found()
        );
        assert!(!fault("ManagedObjectNotFound", "").is_not_found());
        assert!(
            !Error::Timeout {
                operation: "x",
                after: Duration::from_secs(1)
            }
            .is_not_found()
        );
    }

    #[test]
    fn session_and_login_faults_are_recognised() {
        assert!(fault("NotAuthenticated", "").is_not_authenticated());
        assert!(fault("InvalidLogin", "Login failure").is_invalid_login());
        assert!(!fault("InvalidLogin", "").is_not_authenticated());
    }

    #[test]
    fn messages_name_the_operation_and_fault() {
        assert_eq!(
            fault("InvalidLogin", "Login failure").to_string(),
            "CnsDeleteVolume failed with vSphere fault InvalidLogin: Login failure"
        );
        assert_eq!(
            fault("NotFound", "").to_string(),
            "CnsDeleteVolume failed with vSphere fault NotFound"
        );
    }
}
