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
    use sha2::Digest;
    use tooltune_store::JobSuite;

    fn suite_text(command: &str) -> String {
        format!(
            "name = \"tiny\"\ntools_under_study = [\"echo\"]\n\n[server]\ncommand = \"{command}\"\n\
             args = [\"${{SUITE_DIR}}/data\"]\n\n[[task]]\nid = \"t1\"\nprompt = \"Say hi.\"\n\
             split = \"train\"\nowner = \"echo\"\nanswer.regex = \"hi\"\n"
        )
    }

    async fn store_with(dir: &Path, text: &str, origin: &str) -> (Store, String) {
        let store = Store::open(&dir.join("s.db").display().to_string())
            .await
            .expect("store");
        let digest = hex::encode(Sha256::digest(text.as_bytes()));
        store
            .save_job_suite(&JobSuite {
                digest: digest.clone(),
                name: "tiny".into(),
                text: text.to_string(),
                origin: origin.into(),
                fixture_digest: String::new(),
            })
            .await
            .expect("save");
        (store, digest)
    }

    #[tokio::test]
    async fn a_suite_whose_server_is_missing_here_is_refused_naming_the_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = suite_text("/no/such/dir/tiny-server");
        let (store, digest) = store_with(dir.path(), &text, "/elsewhere/tiny.toml").await;
        let e = resolve(&store, &digest, &[dir.path().to_path_buf()])
            .await
            .expect_err("no server here");
        let msg = e.to_string();
        assert!(
            matches!(e, WorkerError::CannotServe { .. })
                && msg.contains("/no/such/dir/tiny-server"),
            "{msg}"
        );
        let e = resolve(&store, "0000", &[])
            .await
            .expect_err("unknown digest");
        assert!(
            e.to_string().contains("no suite with this content address"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_suite_resolves_against_the_worker_folder_that_holds_the_same_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = suite_text("sh");
        let (store, digest) = store_with(dir.path(), &text, "/elsewhere/tiny.toml").await;
        // Not on this machine: parsed from the store as if in the first --suite-dir.
        let here = dir.path().join("suites");
        std::fs::create_dir_all(&here).expect("dir");
        let s = resolve(&store, &digest, std::slice::from_ref(&here))
            .await
            .expect("resolves");
        assert_eq!(s.dir, here);
        // The same file in a later folder is found by content, and its folder is the suite's.
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).expect("dir");
        std::fs::write(other.join("tiny.toml"), &text).expect("write");
        std::fs::write(here.join("tiny.toml"), format!("{text}\n# edited\n")).expect("write");
        let s = resolve(&store, &digest, &[here.clone(), other.clone()])
            .await
            .expect("resolves");
        assert_eq!(s.dir, other);
    }

    #[test]
    fn a_command_is_found_by_path_or_on_path() {
        assert!(command_exists("sh"));
        assert!(!command_exists("tooltune-no-such-command-here"));
        assert!(!command_exists("/no/such/dir/server"));
    }
}
