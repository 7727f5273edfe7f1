#![doc = include_str!("../README.md")]

pub mod backoff;
pub mod client;
pub mod error;
pub mod events;
pub mod http;
pub mod leader;
mod options;
#[doc(hidden)]
pub use options::write_option_name;
pub mod quantity;
pub mod signal;
pub mod store;
