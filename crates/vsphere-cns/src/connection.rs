//! [`VirtualCenterConfig`]: where and how [`CnsClient`](crate::CnsClient) connects.

use std::time::Duration;

use crate::secret::Secret;
use crate::tls::TlsMode;

/// One vCenter: where and how [`CnsClient`](crate::CnsClient) connects.
///
/// Build it with [`VirtualCenterConfig::new`] and the `#[must_use]` setters, or parse a
/// `csi-vsphere.conf` ([`VsphereConfig::virtual_centers`](crate::VsphereConfig::virtual_centers):
/// one per `[VirtualCenter "host"]` section, with `[Global]` defaults applied and
/// `insecure-flag`, `thumbprint` and `ca-file` resolved into [`tls`](Self::tls)).
/// `Debug` never shows the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualCenterConfig {
    /// Host name or IP address of the vCenter.
    pub host: String,
    /// HTTPS port. Default 443.
    pub port: u16,
    /// The user to log in as, for example `administrator@vsphere.local`.
    pub user: String,
    /// The user's password.
    pub password: Secret,
    /// How the server certificate is checked. Default: verified against the system roots.
    pub tls: TlsMode,
    /// Limit for each HTTP round trip (one SOAP call). Default 60 s.
    pub timeout: Duration,
    /// Limit for waiting on a task (create, delete, update). Default 5 min.
    pub task_timeout: Duration,
    /// First pause between task polls; it doubles up to 2 s (a longer one stays as it is).
    /// Default 200 ms.
    pub task_poll_interval: Duration,
    /// `datacenters` of `csi-vsphere.conf`, split at commas (the client does not use them).
    pub datacenters: Vec<String>,
    /// Largest response body read from the server, in bytes. A larger response fails with
    /// [`Error::ResponseTooLarge`](crate::Error::ResponseTooLarge) and is not read past the
    /// limit. Default 16 MiB (a `CnsQueryVolume` page of 100 volumes is well under 1 MiB).
    pub max_response_bytes: u64,
}

impl VirtualCenterConfig {
    /// Default for [`VirtualCenterConfig::port`].
    pub const DEFAULT_PORT: u16 = 443;
    /// Default for [`VirtualCenterConfig::timeout`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
    /// Default for [`VirtualCenterConfig::task_timeout`].
    pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(300);
    /// Default for [`VirtualCenterConfig::task_poll_interval`].
    pub const DEFAULT_TASK_POLL_INTERVAL: Duration = Duration::from_millis(200);
    /// Default for [`VirtualCenterConfig::max_response_bytes`]: 16 MiB.
    pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;

    /// Settings for `host` with every default: port 443, verified TLS, 60 s per call.
    pub fn new(
        host: impl Into<String>,
        user: impl Into<String>,
        password: impl Into<Secret>,
    ) -> Self {
        Self {
            host: host.into(),
            port: Self::DEFAULT_PORT,
            user: user.into(),
            password: password.into(),
            tls: TlsMode::default(),
            timeout: Self::DEFAULT_TIMEOUT,
            task_timeout: Self::DEFAULT_TASK_TIMEOUT,
            task_poll_interval: Self::DEFAULT_TASK_POLL_INTERVAL,
            datacenters: Vec::new(),
            max_response_bytes: Self::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// Sets [`VirtualCenterConfig::datacenters`].
    #[must_use]
    pub fn datacenters(mut self, datacenters: Vec<String>) -> Self {
        self.datacenters = datacenters;
        self
    }

    /// Sets [`VirtualCenterConfig::port`].
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Sets [`VirtualCenterConfig::tls`].
    #[must_use]
    pub fn tls(mut self, tls: TlsMode) -> Self {
        self.tls = tls;
        self
    }

    /// Sets [`VirtualCenterConfig::timeout`].
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`VirtualCenterConfig::task_timeout`].
    #[must_use]
    pub fn task_timeout(mut self, timeout: Duration) -> Self {
        self.task_timeout = timeout;
        self
    }

    /// Sets [`VirtualCenterConfig::task_poll_interval`].
    #[must_use]
    pub fn task_poll_interval(mut self, interval: Duration) -> Self {
        self.task_poll_interval = interval;
        self
    }

    /// Sets [`VirtualCenterConfig::max_response_bytes`].
    #[must_use]
    pub fn max_response_bytes(mut self, limit: u64) -> Self {
        self.max_response_bytes = limit;
        self
    }

    /// Checks what [`CnsClient::connect`](crate::CnsClient::connect) checks before it sends
    /// anything.
    ///
    /// # Rules
    /// - `host` is a host name or an IP address, not a URL (no scheme, path, `@`, `?`, `#`
    ///   or whitespace).
    /// - `https://` is used for every [`TlsMode`] except [`TlsMode::PlainHttp`], and
    ///   [`TlsMode::PlainHttp`] (`http://`, no TLS) is accepted only when `host` is a
    ///   loopback IP address (`127.0.0.0/8` or `::1`; not the name `localhost`, which a
    ///   hosts file could point elsewhere). It exists for the in-process simulator and tests;
    ///   `csi-vsphere.conf` never selects it.
    /// - `max_response_bytes` is not zero.
    ///
    /// # Errors
    /// [`Error::Settings`](crate::Error::Settings) naming the rule that is broken.
    pub fn validate(&self) -> crate::Result<()> {
        use crate::Error;
        let host = self.host.as_str();
        if host.is_empty()
            || host.contains("://")
            || host
                .chars()
                .any(|c| matches!(c, '/' | '@' | '?' | '#') || c.is_whitespace())
        {
            return Err(Error::Settings(format!(
                "vCenter host {host:?} must be a host name or an IP address, not a URL"
            )));
        }
        if self.tls == TlsMode::PlainHttp && !self.host_is_loopback_ip() {
            return Err(Error::Settings(format!(
                "plain HTTP (TlsMode::PlainHttp) is only allowed to a loopback IP address \
                 (127.0.0.0/8 or ::1), not to {host}; use https (system roots, ca-file or thumbprint)"
            )));
        }
        if self.max_response_bytes == 0 {
            return Err(Error::Settings(
                "max_response_bytes must be greater than zero".into(),
            ));
        }
        Ok(())
    }

    fn host_is_loopback_ip(&self) -> bool {
        let bare = self
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&self.host);
        bare.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
    }

    /// `https://host:port` (or `http://` for [`TlsMode::PlainHttp`]), IPv6 hosts bracketed.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls == TlsMode::PlainHttp {
            "http"
        } else {
            "https"
        };
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_secure() {
        let config = VirtualCenterConfig::new("vc.example.com", "admin", "pw");
        assert_eq!(config.tls, TlsMode::Verified);
        assert_eq!(config.base_url(), "https://vc.example.com:443");
        assert_eq!(config.max_response_bytes, 16 * 1024 * 1024);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn plain_http_and_ipv6_urls() {
        let config = VirtualCenterConfig::new("::1", "admin", "pw")
            .port(8989)
            .tls(TlsMode::PlainHttp);
        assert_eq!(config.base_url(), "http://[::1]:8989");
    }

    #[test]
    fn plain_http_is_refused_unless_the_host_is_a_loopback_ip() {
        for host in ["127.0.0.1", "127.3.4.5", "::1", "[::1]"] {
            let config = VirtualCenterConfig::new(host, "admin", "pw").tls(TlsMode::PlainHttp);
            assert!(config.validate().is_ok(), "{host}");
        }
        for host in ["vc.example.com", "10.0.0.1", "localhost", "::2", "0.0.0.0"] {
            let config = VirtualCenterConfig::new(host, "admin", "pw").tls(TlsMode::PlainHttp);
            let err = config.validate().unwrap_err().to_string();
            assert!(
                err.contains("only allowed to a loopback IP"),
                "{host}: {err}"
            );
            assert!(err.contains(host), "{host}: {err}");
            // Every TLS mode is https, so the same host is fine with TLS.
            assert!(config.tls(TlsMode::Insecure).validate().is_ok(), "{host}");
        }
    }

    #[test]
    fn a_url_or_an_empty_host_and_a_zero_response_limit_are_refused() {
        for host in ["", "https://vc", "vc/sdk", "user@vc", "vc?x", "vc #1"] {
            let err = VirtualCenterConfig::new(host, "admin", "pw")
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains("not a URL"), "{host:?}: {err}");
        }
        let err = VirtualCenterConfig::new("vc", "admin", "pw")
            .max_response_bytes(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("max_response_bytes"), "{err}");
    }

    #[test]
    fn debug_hides_the_password() {
        let config = VirtualCenterConfig::new("vc", "admin", "very-secret-pw");
        assert!(!format!("{config:?}").contains("very-secret-pw"));
    }
}
