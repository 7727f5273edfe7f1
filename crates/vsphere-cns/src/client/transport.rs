//! HTTP transport of [`CnsClient`](super::CnsClient): one SOAP round trip with its timeout,
//! the session cookie, login and the single re-login on `NotAuthenticated`.

use reqwest::header::{CONTENT_TYPE, COOKIE, SET_COOKIE};
use tracing::{debug, warn};

use super::{Endpoint, Inner, SESSION_COOKIE};
use crate::connection::VcConfig;
use crate::error::{Error, Result};
use crate::soap::{decode, encode};
use crate::xml::Element;

pub(super) async fn fetch_version(
    http: &reqwest::Client,
    config: &VcConfig,
    base: &str,
    file: &str,
    namespace: &str,
) -> Result<Option<String>> {
    const OP: &str = "service version discovery";
    let url = format!("{base}/sdk/{file}");
    let work = async {
        let response = http.get(&url).send().await?;
        if !response.status().is_success() {
            return Ok(None);
        }
        response.text().await.map(Some)
    };
    let text = tokio::time::timeout(config.timeout, work)
        .await
        .map_err(|_| Error::Timeout {
            operation: OP,
            after: config.timeout,
        })?
        .map_err(|source| Error::Transport {
            operation: OP,
            url: url.clone(),
            source,
        })?;
    let version = text
        .as_deref()
        .and_then(|t| decode::service_version(t, namespace));
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

    /// The session cookie. It is a plain value, so a panic elsewhere while the lock was
    /// held cannot leave it half-written: a poisoned lock is used as is.
    pub(super) fn cookie_slot(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.cookie
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        let work = async {
            let response = request.send().await?;
            let status = response.status();
            let session = response
                .headers()
                .get_all(SET_COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(session_cookie);
            Ok::<_, reqwest::Error>((status, session, response.text().await?))
        };
        let limit = self.config.timeout;
        let (status, session, text) = tokio::time::timeout(limit, work)
            .await
            .map_err(|_| Error::Timeout {
                operation,
                after: limit,
            })?
            .map_err(|source| Error::Transport {
                operation,
                url: url.clone(),
                source,
            })?;
        if let Some(session) = session {
            *self.cookie_slot() = Some(session);
        }
        match decode::body(&text, operation) {
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
