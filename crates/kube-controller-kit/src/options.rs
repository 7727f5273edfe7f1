//! The `options!` macro: a config struct whose options are public fields and builder
//! methods of the same name, with the same docs.

/// Declares a config struct whose options are each a public field and a `#[must_use]`
/// builder method of the same name, with the same docs (and doc aliases).
///
/// The struct's own attributes (docs, derives, `#[non_exhaustive]`) are written on it. A
/// setter takes the field's type, or, with `=> |arg: Type| expr`, an argument of its own
/// turned into the field's value by `expr`. For the crates of this workspace; not a
/// supported API.
///
/// ```
/// kube_controller_kit::options! {
///     /// Options.
///     #[derive(Clone, Debug, Default)]
///     pub struct Options {
///         /// Workers. Default 0.
///         workers: u16;
///         /// The name. Default empty.
///         name: String => |name: impl Into<String>| name.into();
///     }
/// }
/// let options = Options::default().workers(3).name("a");
/// assert_eq!((options.workers, options.name.as_str()), (3, "a"));
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! options {
    (
        $(#[$meta:meta])*
        pub struct $config:ident {
            $(
                $(#[$doc:meta])*
                $name:ident: $ty:ty $(=> |$value:ident: $arg:ty| $set:expr)?;
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $config {
            $(
                $(#[$doc])*
                pub $name: $ty,
            )*
        }

        impl $config {
            $(
                $crate::options!(@setter $(#[$doc])* $name: $ty $(=> |$value: $arg| $set)?);
            )*
        }
    };
    (@setter $(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name = value;
            self
        }
    };
    (@setter $(#[$doc:meta])* $name:ident: $ty:ty => |$value:ident: $arg:ty| $set:expr) => {
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, $value: $arg) -> Self {
            self.$name = $set;
            self
        }
    };
}

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
