//! The command line's end-to-end tests (the built `tooltune` binary), as one test binary with a module per file.
//!
//! Each `tests/*.rs` file would be a crate of its own, compiled and linked against the crate's whole dependency
//! graph once per file; those copies were minutes of CI's build. Run one module with a filter:
//! `cargo test --workspace --release --test cli_tests from_traces_cli::`.

mod catalog_cli;
mod doctor_cli;
mod from_traces_cli;
mod ingest_cli;
mod label_cli;
mod optimize_cli;
mod postgres;
mod proxy_cli;
mod suite_cli;
mod workers_cli;

use std::path::Path;
use std::process::{Command, Output};

/// `tooltune --database-url DB ARGS` with no model, config or store of the user's environment leaking in.
pub(crate) fn tooltune(db: &str, data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tooltune"))
        .arg("--database-url")
        .arg(db)
        .args(args)
        .env_remove("TOOLTUNE_DATABASE_URL")
        .env_remove("TOOLTUNE_AGENT")
        .env_remove("TOOLTUNE_REFLECTOR")
        .env_remove("TOOLTUNE_CONFIG")
        // No config file from the user's data dir may leak into the test.
        .env("TOOLTUNE_DATA_DIR", data_dir)
        .output()
        .expect("run tooltune")
}

/// The JSON a successful command printed; a failure shows its stderr, output that is not JSON shows what it was.
pub(crate) fn ok_json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "tooltune failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}
