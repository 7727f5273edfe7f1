//! Black-box tests across crates.
