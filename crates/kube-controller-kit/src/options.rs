//! How the libraries of this workspace name a config option in an error message.

/// Writes a config option's name for an error message, with Go's name for it when it has
/// one: `name (Go GoName)`. For the crates of this workspace; not a supported API.
#[doc(hidden)]
pub fn write_option_name(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    go_name: Option<&str>,
) -> std::fmt::Result {
    f.write_str(name)?;
    if let Some(go) = go_name {
        write!(f, " (Go {go})")?;
    }
    Ok(())
}
