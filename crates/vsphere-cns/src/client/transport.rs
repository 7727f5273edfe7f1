//! HTTP transport of [`CnsClient`](super::CnsClient): one SOAP round trip with its timeout,
//! the session cookie, login and the single re-login on `NotAuthenticated`.

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use tracing::{debug, warn};

use super::{Endpoint, Inner, SESSION_COOKIE};
use crate::connection::VirtualCenterConfig;
use crate::error::{Error, Result};
use crate::soap::{decode, encode};
use crate::xml::Element;

/// What one HTTP round trip returned: the status, the session cookie it set, and the body
/// (at most `max_response_bytes`).
pub(super) struct Exchange {
    pub(super) status: StatusCode,
    pub(super) session: Option<String>,
    pub(super) body: Vec<u8>,
}

/// Sends `request` and reads the response, bounded by `config.timeout` as a whole.
///
/// # Errors
/// [`Error::Redirect`] for any 3xx (the client follows no redirects, so the request,
/// including a `Login` body, goes only to the configured endpoint);
/// [`Error::ResponseTooLarge`] as soon as the body (announced or received) passes
/// `config.max_response_bytes`, without reading further; [`Error::Timeout`];
/// [`Error::Transport`] with a source that does not repeat the URL.
pub(super) async fn exchange(
    request: reqwest::RequestBuilder,
    config: &VirtualCenterConfig,
    operation: &'static str,
    url: &str,
) -> Result<Exchange> {
    let limit = config.max_response_bytes;
    let transport = |source: reqwest::Error| Error::Transport {
        operation,
        url: url.to_owned(),
        // The URL is in this error's own message already.
        source: source.without_url(),
    };
    let work = async {
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status();
        if status.is_redirection() {
            return Err(Error::Redirect {
                operation,
                status: status.as_u16(),
                location: location_host(&response),
            });
        }
        let session = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(session_cookie);
        let too_large = Error::ResponseTooLarge { operation, limit };
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(too_large);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Exchange {
            status,
            session,
            body,
        })
    };
    tokio::time::timeout(config.timeout, work)
        .await
        .map_err(|_| Error::Timeout {
            operation,
            after: config.timeout,
        })?
}

/// `host:port` of a redirect's `Location` (resolved against the request URL), never its
/// path or query.
fn location_host(response: &reqwest::Response) -> Option<String> {
    let location = response.headers().get(LOCATION)?.to_str().ok()?;
    let target = response.url().join(location).ok()?;
    let host = target.host_str()?;
    Some(match target.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

pub(super) async fn fetch_version(
    http: &reqwest::Client,
    config: &VirtualCenterConfig,
    base: &str,
    file: &str,
    namespace: &str,
) -> Result<Option<String>> {
    const OP: &str = "service version discovery";
    let url = format!("{base}/sdk/{file}");
    let response = exchange(http.get(&url), config, OP, &url).await?;
    let version = if response.status.is_success() {
        std::str::from_utf8(&response.body)
            .ok()
            .and_then(|t| decode::service_version(t, namespace))
    } else {
        None
    };
    if version.is_none() {
        warn!(%url, "no service version found; using a default");
    }
    Ok(version)
}

impl Inner {
    /// `post`, logging in again and retrying once on `NotAuthenticated`.
    pub(super) async fn call(
        &self,
        endpoint: Endpoint,
        operation: &'static str,
        body: String,
    ) -> Result<Element> {
        let before = self.cookie();
        match self.post(endpoint, operation, body.clone()).await {
            Err(e) if e.is_not_authenticated() => {
                warn!(operation, "session not authenticated; logging in again");
                self.relogin(before).await?;
                self.post(endpoint, operation, body).await
            }
            other => other,
        }
    }

    pub(super) fn cookie(&self) -> Option<String> {
        self.cookie_slot().clone()
    }

    /// The session cookie.
    pub(super) fn cookie_slot(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        crate::lock(&self.cookie)
    }

    async fn relogin(&self, stale: Option<String>) -> Result<()> {
        let _guard = self.login_lock.lock().await;
        if self.cookie() != stale {
            return Ok(()); // another call logged in meanwhile
        }
        self.login().await
    }

    pub(super) async fn login(&self) -> Result<()> {
        *self.cookie_slot() = None;
        let body = encode::login(
            &self.content.session_manager,
            &self.config.user,
            self.config.password.expose(),
            "en_US",
        );
        self.post(Endpoint::Vim, "Login", body).await?;
        if self.cookie().is_none() {
            return Err(Error::Protocol {
                operation: "Login",
                detail: format!("the response set no {SESSION_COOKIE} cookie"),
            });
        }
        debug!(user = %self.config.user, "logged in");
        Ok(())
    }

    /// One SOAP round trip, bounded by the configured timeout.
    pub(super) async fn post(
        &self,
        endpoint: Endpoint,
        operation: &'static str,
        body: String,
    ) -> Result<Element> {
        let (path, action) = route(endpoint, &self.vim_version, &self.vsan_version);
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .post(&url)
            .header(CONTENT_TYPE, "text/xml; charset=\"utf-8\"")
            .header("SOAPAction", action)
            .body(body);
        if let Some(cookie) = self.cookie() {
            request = request.header(COOKIE, cookie);
        }
        debug!(operation, path, "SOAP call");
        let response = exchange(request, &self.config, operation, &url).await?;
        if let Some(session) = response.session {
            *self.cookie_slot() = Some(session);
        }
        let status = response.status;
        let parsed = std::str::from_utf8(&response.body)
            .map_err(|_| Error::Protocol {
                operation,
                detail: "the response body is not UTF-8".into(),
            })
            .and_then(|text| decode::body(text, operation));
        drop(response.body);
        match parsed {
            Err(Error::Protocol { detail, .. }) if !status.is_success() => Err(Error::Protocol {
                operation,
                detail: format!("HTTP {status}: {detail}"),
            }),
            other => other,
        }
    }
}

/// The path and `SOAPAction` of a call to `endpoint`.
pub(crate) fn route(
    endpoint: Endpoint,
    vim_version: &str,
    vsan_version: &str,
) -> (&'static str, String) {
    match endpoint {
        Endpoint::Vim => ("/sdk", format!("urn:vim25/{vim_version}")),
        Endpoint::VimForTasks => ("/sdk", format!("urn:vsan/{vsan_version}")),
        Endpoint::Cns => ("/vsanHealth", format!("urn:vsan/{vsan_version}")),
    }
}

/// The `vmware_soap_session=...` part of a `Set-Cookie` value, verbatim (quotes included).
fn session_cookie(set_cookie: &str) -> Option<String> {
    let pair = set_cookie.split(';').next()?.trim();
    let (name, value) = pair.split_once('=')?;
    (name.trim() == SESSION_COOKIE && !value.is_empty()).then(|| pair.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_cookie_is_kept_verbatim_with_quotes() {
        assert_eq!(
            session_cookie("vmware_soap_session=\"52c4e1\"; Path=/; HttpOnly; Secure;").as_deref(),
            Some("vmware_soap_session=\"52c4e1\"")
        );
        assert_eq!(
            session_cookie("vmware_soap_session=ed7a3778-d322; HttpOnly").as_deref(),
            Some("vmware_soap_session=ed7a3778-d322")
        );
        assert_eq!(session_cookie("other=1; Path=/"), None);
        assert_eq!(session_cookie("vmware_soap_session=; Path=/"), None);
    }
}
