//! The SOAP layer: request bodies as govmomi writes them ([`encode`]) and namespace-aware
//! response parsing with faults turned into [`Error`](crate::Error)s ([`decode`]).

pub(crate) mod decode;
pub(crate) mod encode;

#[cfg(test)]
mod golden_tests;
