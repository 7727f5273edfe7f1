//! [`ConfigError`]: what is wrong with a configuration file, and where.

use std::path::PathBuf;

/// Why a configuration file was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is malformed or incomplete. Displays as
    /// `csi-vsphere.conf:7: [VirtualCenter "vc1"] port: the value is not a port number (1 to 65535)`.
    /// The message never quotes any part of a value.
    #[error("{}", invalid_display(file, *line, section.as_deref(), key.as_deref(), message))]
    Invalid {
        /// The file name.
        file: String,
        /// 1-based line, when the problem has one.
        line: Option<usize>,
        /// The section, as written: `Global` or `VirtualCenter "vc1"`.
        section: Option<String>,
        /// The key.
        key: Option<String>,
        /// The problem.
        message: String,
    },
}

fn invalid_display(
    file: &str,
    line: Option<usize>,
    section: Option<&str>,
    key: Option<&str>,
    message: &str,
) -> String {
    let mut out = file.to_owned();
    if let Some(line) = line {
        out.push_str(&format!(":{line}"));
    }
    out.push_str(": ");
    if let Some(section) = section {
        out.push_str(&format!("[{section}] "));
    }
    if let Some(key) = key {
        out.push_str(&format!("{key}: "));
    }
    out.push_str(message);
    out
}
