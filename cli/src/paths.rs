//! Where tooltune keeps its files when the user does not say: one data directory for the store and the models.

use anyhow::{Context, Result};
use std::path::PathBuf;

/// The data directory: `$TOOLTUNE_DATA_DIR`, else the platform's data dir plus `tooltune`.
pub fn data_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("TOOLTUNE_DATA_DIR") {
        return Ok(PathBuf::from(d));
    }
    dirs::data_dir()
        .map(|d| d.join("tooltune"))
        .context("no data directory on this platform: set TOOLTUNE_DATA_DIR or --database-url")
}

/// The store URL: the one given, else a SQLite file in the data directory.
pub fn database_url(given: Option<&str>) -> Result<String> {
    match given {
        Some(u) if !u.is_empty() => Ok(u.to_string()),
        _ => Ok(data_dir()?.join("traces.sqlite").display().to_string()),
    }
}
