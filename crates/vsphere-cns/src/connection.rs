//! [`VcConfig`]: where and how [`CnsClient`](crate::CnsClient) connects.

use std::time::Duration;

use crate::secret::Secret;
use crate::tls::TlsMode;

/// Connection settings for one vCenter.
///
/// Build it with [`VcConfig::new`] and the `#[must_use]` setters, or from a parsed
/// `csi-vsphere.conf` with
/// [`VirtualCenterConfig::vc_config`](crate::config::VirtualCenterConfig::vc_config).
/// `Debug` never shows the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcConfig {
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
    /// First pause between task polls; it doubles up to 2 s. Default 200 ms.
    pub task_poll_interval: Duration,
}

impl VcConfig {
    /// Default for [`VcConfig::port`].
    pub const DEFAULT_PORT: u16 = 443;
    /// Default for [`VcConfig::timeout`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
    /// Default for [`VcConfig::task_timeout`].
    pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(300);
    /// Default for [`VcConfig::task_poll_interval`].
    pub const DEFAULT_TASK_POLL_INTERVAL: Duration = Duration::from_millis(200);

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
        }
    }

    /// Sets [`VcConfig::port`].
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Sets [`VcConfig::tls`].
    #[must_use]
    pub fn tls(mut self, tls: TlsMode) -> Self {
        self.tls = tls;
        self
    }

    /// Sets [`VcConfig::timeout`].
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`VcConfig::task_timeout`].
    #[must_use]
    pub fn task_timeout(mut self, timeout: Duration) -> Self {
        self.task_timeout = timeout;
        self
    }

    /// Sets [`VcConfig::task_poll_interval`].
    #[must_use]
    pub fn task_poll_interval(mut self, interval: Duration) -> Self {
        self.task_poll_interval = interval;
        self
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
        let config = VcConfig::new("vc.example.com", "admin", "pw");
        assert_eq!(config.tls, TlsMode::Verified);
        assert_eq!(config.base_url(), "https://vc.example.com:443");
    }

    #[test]
    fn plain_http_and_ipv6_urls() {
        let config = VcConfig::new("::1", "admin", "pw")
            .port(8989)
            .tls(TlsMode::PlainHttp);
        assert_eq!(config.base_url(), "http://[::1]:8989");
    }

    #[test]
    fn debug_hides_the_password() {
        let config = VcConfig::new("vc", "admin", "very-secret-pw");
        assert!(!format!("{config:?}").contains("very-secret-pw"));
    }
}
