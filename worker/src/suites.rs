//! How a worker finds the suite a job names: by content address, from the store, so that it needs the suite's
//! servers (and fixture) installed, not the driver's checkout. A suite's relative paths (`${SUITE_DIR}/...`)
//! resolve against a folder of the worker's own: the suite file's, when a file with the same content is found
//! under the worker's `--suite-dir`s (or at the path the driver read it from), else the first `--suite-dir`.

use crate::WorkerError;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tooltune_evaluator::{Suite, Transport};
use tooltune_store::Store;

/// Finds, parses and checks the suite stored under `digest`. `Err(CannotServe)` says what this machine lacks.
pub async fn resolve(
    store: &Store,
    digest: &str,
    suite_dirs: &[PathBuf],
) -> Result<Suite, WorkerError> {
    let cannot = |name: &str, reason: String| WorkerError::CannotServe {
        suite: name.to_string(),
        digest: digest.chars().take(12).collect(),
        reason,
    };
    let Some(stored) = store.job_suite(digest).await? else {
        return Err(cannot(
            "?",
            "the store holds no suite with this content address".to_string(),
        ));
    };
    let file_name = Path::new(&stored.origin).file_name().map_or_else(
        || format!("{}.toml", stored.name),
        |n| n.to_os_string().to_string_lossy().into_owned(),
    );
    let same_file = std::iter::once(PathBuf::from(&stored.origin))
        .chain(suite_dirs.iter().map(|d| d.join(&file_name)))
        .find(|p| std::fs::read(p).is_ok_and(|b| hex::encode(Sha256::digest(&b)) == digest));
    let parsed = match &same_file {
        Some(p) => Suite::load(p),
        None => {
            let at = suite_dirs
                .first()
                .map_or_else(|| PathBuf::from(&stored.origin), |d| d.join(&file_name));
            Suite::parse(&at, &stored.text)
        }
    };
    let suite =
        parsed.map_err(|e| cannot(&stored.name, format!("the suite does not load here: {e}")))?;
    if suite.world_digest() != stored.fixture_digest {
        return Err(cannot(
            &stored.name,
            format!(
                "its fixture here has another content ({}) than the driver's ({}); copy the driver's fixture folder",
                short(&suite.world_digest()),
                short(&stored.fixture_digest)
            ),
        ));
    }
    if let Transport::Stdio { command, .. } = &suite.server.transport
        && !command_exists(command)
    {
        return Err(cannot(
            &stored.name,
            format!(
                "its server's command `{command}` is not on this machine; install the server (or give \
                 --suite-dir the folder holding the suite file and what it references)"
            ),
        ));
    }
    Ok(suite)
}

fn short(d: &str) -> String {
    if d.is_empty() {
        "none".to_string()
    } else {
        d.chars().take(12).collect()
    }
}

/// Whether a server command can start here: a path that exists, or a bare name found on `PATH`.
fn command_exists(command: &str) -> bool {
    if command.contains('/') {
        return Path::new(command).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(command).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_found_by_path_or_on_path() {
        assert!(command_exists("sh"));
        assert!(!command_exists("tooltune-no-such-command-here"));
        assert!(!command_exists("/no/such/dir/server"));
    }
}
