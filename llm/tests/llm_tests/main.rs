//! The model backends' integration tests (the local engine, the OpenAI-compatible server), as one test binary with a module per file.
//!
//! Each `tests/*.rs` file would be a crate of its own, compiled and linked against the crate's whole dependency
//! graph once per file; those copies were minutes of CI's build. Run one module with a filter:
//! `cargo test --workspace --release --test llm_tests local::`.

mod local;
mod openai_serve;
