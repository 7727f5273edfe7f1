#![doc = include_str!("../README.md")]

pub mod backoff;
pub mod client;
pub mod error;
pub mod events;
pub mod http;
pub mod leader;
mod options;
pub mod quantity;
pub mod signal;
pub mod store;
