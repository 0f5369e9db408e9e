//! The evaluator's integration tests (real servers, the real local model), as one test binary with a module per file.
//!
//! Each `tests/*.rs` file would be a crate of its own, compiled and linked against the crate's whole dependency
//! graph once per file; those copies were minutes of CI's build. Run one module with a filter:
//! `cargo test --workspace --release --test evaluator_tests agent::`.

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod fixtures;
mod mcp_servers;
mod suites;
mod third_party;
