//! [`Secret`]: a string that never shows up in `Debug` output, logs or error messages.

use std::fmt;

/// A password or other credential.
///
/// `Debug` prints `Secret("<redacted>")` and there is no `Display`, so a `Secret` cannot end
/// up in a log line or an error message by accident. Read the value with [`Secret::expose`]
/// only where it is sent to the server.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The credential itself. Call this only to put it on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the credential is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(\"<redacted>\")")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let secret = Secret::new("hunter2");
        let printed = format!("{secret:?} {secret:#?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("redacted"));
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn debug_of_a_struct_holding_a_secret_hides_it() {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            user: String,
            password: Secret,
        }
        let holder = Holder {
            user: "admin".into(),
            password: "s3cr3t".into(),
        };
        let printed = format!("{holder:?}");
        assert!(printed.contains("admin"));
        assert!(!printed.contains("s3cr3t"), "{printed}");
    }
}
