//! The web service's integration tests (HTTP API, browser, restarts), as one test binary with a module per file.
//!
//! Each `tests/*.rs` file would be a crate of its own, compiled and linked against the crate's whole dependency
//! graph once per file; those copies were minutes of CI's build. Run one module with a filter:
//! `cargo test --workspace --release --test web_tests api::`.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod browser;
mod run_restart;
