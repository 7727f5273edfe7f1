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

/// `error` and each of its sources, outermost first, joined by `": "`.
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
/// ```
#[must_use]
pub fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // Writing to a String cannot fail.
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
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
}
