//! Black-box tests across crates, and the seeded chaos suite ([`chaos`]).

pub mod chaos;
pub mod pv_diff;

/// The code blocks of docs/testing.md, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/testing.md")]
struct DocsTesting;
