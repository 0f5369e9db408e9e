//! The command line's end-to-end tests (the built `tooltune` binary), as one test binary with a module per file.
//!
//! Each `tests/*.rs` file would be a crate of its own, compiled and linked against the crate's whole dependency
//! graph once per file; those copies were minutes of CI's build. Run one module with a filter:
//! `cargo test --workspace --release --test cli_tests from_traces_cli::`.

mod from_traces_cli;
mod ingest_cli;
mod label_cli;
mod optimize_cli;
mod proxy_cli;
