//! Black-box tests across crates, and the seeded chaos suite ([`chaos`]).

pub mod chaos;
