//! `csi-vsphere.conf`: the INI file vsphere-csi-driver reads (with gcfg).
//!
//! ```ini
//! [Global]
//! cluster-id = "demo-cluster"
//!
//! [VirtualCenter "vc.example.com"]
//! user = "administrator@vsphere.local"
//! password = "..."
//! port = "443"
//! datacenters = "dc-1, dc-2"
//! thumbprint = "AA:BB:..."   # or ca-file = "/etc/ssl/vc.pem", or insecure-flag = "true"
//! ```
//!
//! `[Global]` may also hold `user`, `password`, `port`, `insecure-flag`, `ca-file`,
//! `thumbprint` and `datacenters`; a `[VirtualCenter]` section that leaves one unset
//! inherits it, as upstream does.
//!
//! # Certificate checking: the section wins
//! `insecure-flag`, `thumbprint` and `ca-file` are resolved together: a `[VirtualCenter]`
//! section that sets any of them takes all three from itself and none from `[Global]`, so
//! `[Global] insecure-flag = true` cannot switch off the `thumbprint` or `ca-file` a section
//! sets, nor its explicit `insecure-flag = false`. A section that sets none of them
//! inherits all three from `[Global]`. After that, `insecure-flag = true` together with a
//! `thumbprint` or a `ca-file` is an error naming the file and the section(s): the file
//! asks for a check and for no check at once.
//!
//! # Secrets
//! Error messages name the file, line, section and key, never any part of a value (a
//! `password` may be the value on the line). [`VsphereConfig::load`] adds a warning when
//! the file is readable by group or others.
//!
//! # Differences from gcfg
//! - Unknown keys and sections are ignored with a warning (gcfg's `FatalOnly` drops them
//!   silently); the warnings are kept in [`VsphereConfig::warnings`] and logged.
//! - A section or a key given twice is an error (gcfg merges sections and lets the last
//!   value win), so a pasted duplicate cannot silently change a password.
//! - Environment variables (`VSPHERE_*`) are not read: libraries take configuration.

mod error;
mod ini;

pub use error::ConfigError;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::connection::VirtualCenterConfig;
use crate::secret::Secret;
use crate::tls::{Thumbprint, TlsMode};
use ini::Item;

/// A parsed `csi-vsphere.conf`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VsphereConfig {
    /// `[Global]`.
    pub global: GlobalConfig,
    /// Each `[VirtualCenter "host"]`, in file order, with `[Global]` defaults applied.
    pub virtual_centers: Vec<VirtualCenterConfig>,
    /// `[Labels]` (for example `region`, `zone`), keys lower-cased.
    pub labels: BTreeMap<String, String>,
    /// Unknown keys and sections that were ignored, and (from [`VsphereConfig::load`]) a
    /// file readable by group or others, as `file[:line]: ...` messages. Each is also logged
    /// with `tracing::warn!`.
    pub warnings: Vec<String>,
}

/// The `[Global]` settings that are not connection defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GlobalConfig {
    /// `cluster-id` (at most 64 characters; empty when unset).
    pub cluster_id: String,
    /// `supervisor-id`, as written (vsphere-csi-driver prefixes it with
    /// `vSphereSupervisorID-` before use).
    pub supervisor_id: Option<String>,
    /// `cluster-distribution`, for example `OpenShift`.
    pub cluster_distribution: Option<String>,
}

/// The section currently being filled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    None,
    Global,
    VirtualCenter(usize),
    Labels,
    Unknown,
}

/// Raw values of one section: key → (line, value).
#[derive(Default)]
struct Raw {
    line: usize,
    title: String,
    host: String,
    values: BTreeMap<String, (usize, Option<String>)>,
}

struct Parser<'a> {
    file: &'a str,
    warnings: Vec<String>,
}

impl Parser<'_> {
    fn error(
        &self,
        line: Option<usize>,
        section: Option<&Raw>,
        key: Option<&str>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            line,
            section: section.map(|s| s.title.clone()),
            key: key.map(str::to_owned),
            message: message.into(),
        }
    }

    fn text(&self, raw: &Raw, key: &str) -> Option<String> {
        raw.values
            .get(key)
            .map(|(_, v)| v.clone().unwrap_or_default())
    }

    fn boolean(&self, raw: &Raw, key: &str) -> Result<Option<bool>, ConfigError> {
        let Some((line, value)) = raw.values.get(key) else {
            return Ok(None);
        };
        match value
            .as_deref()
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("true" | "yes" | "on" | "1") => Ok(Some(true)),
            Some("false" | "no" | "off" | "0") => Ok(Some(false)),
            // The value is never quoted: a misplaced password could be on this line.
            Some(_) => Err(self.error(
                Some(*line),
                Some(raw),
                Some(key),
                "the value is not a boolean (use true or false)",
            )),
        }
    }

    fn port(&self, raw: &Raw) -> Result<Option<u16>, ConfigError> {
        let Some((line, value)) = raw.values.get("port") else {
            return Ok(None);
        };
        let value = value.as_deref().unwrap_or_default();
        match value.trim().parse::<u16>() {
            Ok(port) if port > 0 => Ok(Some(port)),
            _ => Err(self.error(
                Some(*line),
                Some(raw),
                Some("port"),
                "the value is not a port number (1 to 65535)",
            )),
        }
    }

    fn thumbprint(&self, raw: &Raw) -> Result<Option<Thumbprint>, ConfigError> {
        let Some((line, value)) = raw.values.get("thumbprint") else {
            return Ok(None);
        };
        let value = value.as_deref().unwrap_or_default();
        // `why` describes the value without quoting it.
        Thumbprint::parse(value).map(Some).map_err(|why| {
            self.error(
                Some(*line),
                Some(raw),
                Some("thumbprint"),
                format!("the value {why}"),
            )
        })
    }

    fn limited(&self, raw: &Raw, key: &str) -> Result<Option<String>, ConfigError> {
        let value = self.text(raw, key);
        if let Some(v) = &value
            && v.chars().count() > 64
        {
            let line = raw.values.get(key).map(|(l, _)| *l);
            return Err(self.error(line, Some(raw), Some(key), "must not exceed 64 characters"));
        }
        Ok(value)
    }

    fn warn_unknown(&mut self, raw: &Raw, known: &[&str]) {
        for (key, (line, _)) in &raw.values {
            if !known.contains(&key.as_str()) {
                let message = format!(
                    "{}:{line}: [{}] {key}: unknown key, ignored",
                    self.file, raw.title
                );
                tracing::warn!("{message}");
                self.warnings.push(message);
            }
        }
    }
}

const GLOBAL_KEYS: &[&str] = &[
    "cluster-id",
    "supervisor-id",
    "cluster-distribution",
    "user",
    "password",
    "port",
    "insecure-flag",
    "ca-file",
    "thumbprint",
    "datacenters",
];
const VC_KEYS: &[&str] = &[
    "user",
    "password",
    "port",
    "datacenters",
    "insecure-flag",
    "ca-file",
    "thumbprint",
];

impl VsphereConfig {
    /// Parses the text of a `csi-vsphere.conf`; errors name the file as `csi-vsphere.conf`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the line, section and key of the first problem.
    pub fn parse(text: &str) -> Result<VsphereConfig, ConfigError> {
        Self::parse_named(text, "csi-vsphere.conf")
    }

    /// Reads and parses the file at `path`; errors name the path.
    ///
    /// A file that group or others may read (any of the mode bits `0o044`, as in the
    /// `0644` a Kubernetes Secret volume gives by default) gets a warning in
    /// [`VsphereConfig::warnings`] (also logged): it holds a password. Mount it with
    /// `defaultMode: 0400` (or `0440` with an `fsGroup`).
    ///
    /// # Errors
    /// [`ConfigError::Io`] when the file cannot be read; otherwise as [`VsphereConfig::parse`].
    pub fn load(path: impl AsRef<Path>) -> Result<VsphereConfig, ConfigError> {
        let path = path.as_ref();
        let io = |source| ConfigError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let readable_by_others = permission_warning(&file, path).map_err(io)?;
        let text = std::io::read_to_string(file).map_err(io)?;
        let mut config = Self::parse_named(&text, &path.display().to_string())?;
        if let Some(warning) = readable_by_others {
            tracing::warn!("{warning}");
            config.warnings.insert(0, warning);
        }
        Ok(config)
    }

    fn parse_named(text: &str, file: &str) -> Result<VsphereConfig, ConfigError> {
        let mut parser = Parser {
            file,
            warnings: Vec::new(),
        };
        let items = ini::tokenize(text).map_err(|e| ConfigError::Invalid {
            file: file.to_owned(),
            line: Some(e.line),
            section: e.section,
            key: e.key,
            message: e.message,
        })?;
        let mut sections = Sections::new();
        let mut target = Target::None;
        for item in items {
            match item {
                Item::Section {
                    line,
                    name,
                    display,
                    sub,
                } => target = sections.open(&mut parser, line, &name, display, sub)?,
                Item::Variable { line, name, value } => {
                    sections.set(&parser, target, line, name, value)?;
                }
            }
        }
        let Sections {
            global,
            labels,
            vcs,
            ..
        } = sections;
        parser.warn_unknown(&global, GLOBAL_KEYS);
        for vc in &vcs {
            parser.warn_unknown(vc, VC_KEYS);
        }
        let global_config = GlobalConfig {
            cluster_id: parser.limited(&global, "cluster-id")?.unwrap_or_default(),
            supervisor_id: parser.limited(&global, "supervisor-id")?,
            cluster_distribution: parser.text(&global, "cluster-distribution"),
        };
        if vcs.is_empty() {
            return Err(parser.error(None, None, None, "no [VirtualCenter \"host\"] section"));
        }
        let mut virtual_centers = Vec::new();
        for vc in &vcs {
            virtual_centers.push(virtual_center(&parser, vc, &global)?);
        }
        Ok(VsphereConfig {
            global: global_config,
            virtual_centers,
            labels: labels
                .values
                .into_iter()
                .map(|(k, (_, v))| (k, v.unwrap_or_default()))
                .collect(),
            warnings: parser.warnings,
        })
    }
}

/// The sections read so far, with the line each known one first appeared at.
struct Sections {
    global: Raw,
    global_seen: Option<usize>,
    labels: Raw,
    labels_seen: Option<usize>,
    vcs: Vec<Raw>,
}

impl Sections {
    fn new() -> Self {
        Self {
            global: Raw {
                title: "Global".into(),
                ..Raw::default()
            },
            global_seen: None,
            labels: Raw {
                title: "Labels".into(),
                ..Raw::default()
            },
            labels_seen: None,
            vcs: Vec::new(),
        }
    }

    /// Opens section `name` (`display` as written, `sub` its quoted part) at `line`: the
    /// section the keys that follow go to. A known section twice is an error; an unknown
    /// one is ignored with a warning.
    fn open(
        &mut self,
        parser: &mut Parser<'_>,
        line: usize,
        name: &str,
        display: String,
        sub: Option<String>,
    ) -> Result<Target, ConfigError> {
        let title = match &sub {
            Some(sub) => format!("{display} {sub:?}"),
            None => display,
        };
        let duplicate = |first: usize| {
            parser.error(
                Some(line),
                None,
                None,
                format!("section [{title}] appears twice (first at line {first})"),
            )
        };
        Ok(match (name, sub) {
            ("global", None) => {
                if let Some(first) = self.global_seen.replace(line) {
                    return Err(duplicate(first));
                }
                self.global.line = line;
                Target::Global
            }
            ("labels", None) => {
                if let Some(first) = self.labels_seen.replace(line) {
                    return Err(duplicate(first));
                }
                Target::Labels
            }
            ("virtualcenter", Some(host)) => {
                if host.trim().is_empty() {
                    return Err(parser.error(
                        Some(line),
                        None,
                        None,
                        "[VirtualCenter \"\"] needs a host name",
                    ));
                }
                if let Some(first) = self.vcs.iter().find(|v| v.host == host) {
                    return Err(duplicate(first.line));
                }
                self.vcs.push(Raw {
                    line,
                    title: title.clone(),
                    host,
                    values: BTreeMap::new(),
                });
                Target::VirtualCenter(self.vcs.len() - 1)
            }
            ("virtualcenter", None) => {
                return Err(parser.error(
                    Some(line),
                    None,
                    None,
                    "[VirtualCenter] needs a host name, as in [VirtualCenter \"vc.example.com\"]",
                ));
            }
            _ => {
                let message = format!("{}:{line}: unknown section [{title}], ignored", parser.file);
                tracing::warn!("{message}");
                parser.warnings.push(message);
                Target::Unknown
            }
        })
    }

    /// Sets key `name` of the `target` section at `line`; a key set twice, or outside of
    /// any section, is an error.
    fn set(
        &mut self,
        parser: &Parser<'_>,
        target: Target,
        line: usize,
        name: String,
        value: Option<String>,
    ) -> Result<(), ConfigError> {
        let raw = match target {
            Target::None => {
                return Err(parser.error(
                    Some(line),
                    None,
                    Some(&name),
                    "key outside of any section",
                ));
            }
            Target::Unknown => return Ok(()),
            Target::Global => &mut self.global,
            Target::Labels => &mut self.labels,
            Target::VirtualCenter(i) => &mut self.vcs[i],
        };
        if let Some((first, _)) = raw.values.get(&name) {
            let (first, title) = (*first, raw.title.clone());
            return Err(ConfigError::Invalid {
                file: parser.file.to_owned(),
                line: Some(line),
                section: Some(title),
                key: Some(name),
                message: format!("set twice (first at line {first})"),
            });
        }
        raw.values.insert(name, (line, value));
        Ok(())
    }
}

fn virtual_center(
    parser: &Parser<'_>,
    vc: &Raw,
    global: &Raw,
) -> Result<VirtualCenterConfig, ConfigError> {
    let pick = |key: &str| {
        parser
            .text(vc, key)
            .filter(|v| !v.is_empty())
            .or_else(|| parser.text(global, key).filter(|v| !v.is_empty()))
    };
    let missing = |key: &str| {
        parser.error(
            Some(vc.line),
            Some(vc),
            Some(key),
            format!("missing (set {key} here or in [Global])"),
        )
    };
    let user = pick("user").ok_or_else(|| missing("user"))?;
    let password = pick("password").ok_or_else(|| missing("password"))?;
    let port = match parser.port(vc)? {
        Some(port) => port,
        None => parser
            .port(global)?
            .unwrap_or(VirtualCenterConfig::DEFAULT_PORT),
    };
    let tls = tls_settings(parser, vc, global)?;
    let datacenters = pick("datacenters")
        .map(|d| {
            d.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok(
        VirtualCenterConfig::new(vc.host.clone(), user, Secret::new(password))
            .port(port)
            .tls(tls.mode())
            .datacenters(datacenters),
    )
}

/// The keys that decide how the server certificate is checked; resolved as a group.
const TLS_KEYS: &[&str] = &["insecure-flag", "thumbprint", "ca-file"];

struct TlsSettings {
    insecure_flag: bool,
    thumbprint: Option<Thumbprint>,
    ca_file: Option<PathBuf>,
}

impl TlsSettings {
    /// `insecure-flag`, else `thumbprint`, else `ca-file`, else the system roots (the
    /// parser refuses `insecure-flag` together with either of the others).
    fn mode(self) -> TlsMode {
        match self {
            Self {
                insecure_flag: true,
                ..
            } => TlsMode::Insecure,
            Self {
                thumbprint: Some(thumbprint),
                ..
            } => TlsMode::Thumbprint(thumbprint),
            Self {
                ca_file: Some(ca_file),
                ..
            } => TlsMode::CaFile(ca_file),
            _ => TlsMode::Verified,
        }
    }
}

/// `insecure-flag`, `thumbprint` and `ca-file` of `vc`: all from the section when it sets
/// any of them, otherwise all from `[Global]`; insecure with a check is an error.
fn tls_settings(parser: &Parser<'_>, vc: &Raw, global: &Raw) -> Result<TlsSettings, ConfigError> {
    let sets_any = |raw: &Raw| TLS_KEYS.iter().any(|key| raw.values.contains_key(*key));
    // Global's values are validated even when a section overrides them.
    let global_insecure = parser.boolean(global, "insecure-flag")?;
    let global_thumbprint = parser.thumbprint(global)?;
    let (source, insecure, thumbprint) = if sets_any(vc) {
        (
            vc,
            parser.boolean(vc, "insecure-flag")?,
            parser.thumbprint(vc)?,
        )
    } else {
        (global, global_insecure, global_thumbprint)
    };
    let ca_file = parser
        .text(source, "ca-file")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let insecure_flag = insecure.unwrap_or(false);
    if insecure_flag && (thumbprint.is_some() || ca_file.is_some()) {
        let with = match (thumbprint.is_some(), ca_file.is_some()) {
            (true, true) => "thumbprint and ca-file",
            (true, false) => "thumbprint",
            _ => "ca-file",
        };
        let line = source.values.get("insecure-flag").map(|(line, _)| *line);
        let inherited = if std::ptr::eq(source, vc) {
            String::new()
        } else {
            format!(
                " (inherited by [{}], which sets none of {})",
                vc.title,
                TLS_KEYS.join(", ")
            )
        };
        return Err(parser.error(
            line,
            Some(source),
            Some("insecure-flag"),
            format!(
                "insecure-flag = true together with {with}{inherited}: choose one way of \
                 checking the vCenter certificate"
            ),
        ));
    }
    Ok(TlsSettings {
        insecure_flag,
        thumbprint,
        ca_file,
    })
}

/// A warning when `file` may be read by group or others (Unix mode bits `0o044`).
#[cfg(unix)]
fn permission_warning(file: &std::fs::File, path: &Path) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::PermissionsExt;
    let mode = file.metadata()?.permissions().mode() & 0o777;
    Ok((mode & 0o044 != 0).then(|| {
        format!(
            "{}: the file is readable by group or others (mode {mode:04o}) and holds a \
             password; make it readable by its owner only (chmod 600, or defaultMode: 0400 \
             for a Secret volume)",
            path.display()
        )
    }))
}

/// Other platforms have no mode bits to check.
#[cfg(not(unix))]
fn permission_warning(_file: &std::fs::File, _path: &Path) -> std::io::Result<Option<String>> {
    Ok(None)
}

impl fmt::Display for VirtualCenterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}:{}", self.user, self.host, self.port)
    }
}

#[cfg(test)]
mod tests;
