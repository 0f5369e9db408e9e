//! Fixtures: the world a server that writes starts from. A suite's `[fixture]` (a folder or a file) is copied
//! fresh for every rollout into a scratch folder, `${FIXTURE_DIR}` in the server's command, arguments,
//! environment and working folder names the copy, and a server is started on it; after the rollout the copy is
//! checked (`expect_file`, `expect_command`), digested, and thrown away. So every rollout of every candidate
//! starts from the same state, whatever the previous one wrote.
//!
//! Copies are made copy-on-write (reflink) where the file system has it and byte copies elsewhere. Servers are
//! started a chunk ahead ([`Prepared`]), so a Python server's start-up (most of a second) runs while the
//! model works on the previous chunk.

use crate::EvalError;
use crate::mcp::{McpServer, ServerSpec, Transport};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The variable that names a rollout's copy of the fixture.
pub const FIXTURE_VAR: &str = "${FIXTURE_DIR}";

/// A suite's fixture: where it lives and the digest of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixture {
    /// The folder or file copied for each rollout.
    pub source: PathBuf,
    /// sha256 over its content (see [`digest`]): part of every rollout key, so an edited fixture is a new world.
    pub digest: String,
}

impl Fixture {
    /// Reads the fixture at `source` (which must exist) and digests it.
    pub fn load(source: PathBuf) -> Result<Fixture, EvalError> {
        let fail = |e: std::io::Error| EvalError::Fixture {
            path: source.clone(),
            message: e.to_string(),
        };
        // The digest of what a rollout's copy holds, so the two compare: a file fixture lands in its folder under
        // its own name, so it is digested as a folder holding that one file.
        let digest = if source.is_dir() {
            digest(&source).map_err(fail)?
        } else {
            let name = source
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let mut h = Sha256::new();
            let body = std::fs::read(&source).map_err(fail)?;
            for part in [name.as_bytes(), b"file".as_slice(), &body] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part);
            }
            hex::encode(h.finalize())
        };
        Ok(Fixture { source, digest })
    }

    /// Copies the fixture into a fresh scratch folder with a random name. A folder's content lands in the
    /// scratch folder itself; a file lands in it under its own name.
    pub fn materialise(&self) -> Result<tempfile::TempDir, EvalError> {
        self.materialise_in(None)
    }

    /// Like [`Fixture::materialise`], but for the rollout in position `slot` of a batch the folder's name is a
    /// pure function of the fixture's digest and the slot, when that name is free: servers print their paths in
    /// tool results ("Successfully wrote to /tmp/..."), and a random name there would make the same greedy rollout
    /// read different text each time. When the name is taken (another process is using it, or a crash left it) a
    /// random name is used instead.
    pub fn materialise_in(&self, slot: Option<usize>) -> Result<tempfile::TempDir, EvalError> {
        let fail = |e: std::io::Error| EvalError::Fixture {
            path: self.source.clone(),
            message: format!("cannot copy: {e}"),
        };
        let stable = slot.and_then(|k| {
            tempfile::Builder::new()
                .prefix(&format!(
                    "tooltune-fixture-{}-{k}",
                    &self.digest[..12.min(self.digest.len())]
                ))
                .rand_bytes(0)
                .tempdir()
                .ok()
        });
        let dir = match stable {
            Some(d) => d,
            None => tempfile::Builder::new()
                .prefix("tooltune-fixture-")
                .tempdir()
                .map_err(fail)?,
        };
        if self.source.is_dir() {
            copy_tree(&self.source, dir.path()).map_err(fail)?;
        } else {
            let name = self.source.file_name().unwrap_or_default();
            reflink_copy::reflink_or_copy(&self.source, dir.path().join(name)).map_err(fail)?;
        }
        Ok(dir)
    }
}

/// Copies every file and folder under `from` into `to` (which exists), copy-on-write where possible. Symbolic
/// links are recreated as links, not followed, so a fixture cannot pull in files from outside itself.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in walkdir::WalkDir::new(from).min_depth(1).sort_by_file_name() {
        let entry = entry.map_err(std::io::Error::other)?;
        let rel = entry
            .path()
            .strip_prefix(from)
            .map_err(std::io::Error::other)?;
        let dest = to.join(rel);
        let kind = entry.file_type();
        if kind.is_dir() {
            std::fs::create_dir_all(&dest)?;
        } else if kind.is_symlink() {
            let target = std::fs::read_link(entry.path())?;
            #[cfg(unix)]
            std::os::unix::fs::symlink(target, &dest)?;
            #[cfg(not(unix))]
            let _ = target;
        } else {
            reflink_copy::reflink_or_copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

/// The content digest of a file or folder: sha256 over every entry's path relative to the root (sorted), its
/// kind, and a file's bytes or a link's target. Modification times and permissions are left out: a copy has
/// other times but the same world.
pub fn digest(root: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let meta = std::fs::symlink_metadata(root)?;
    if !meta.is_dir() {
        h.update(b"file\0");
        h.update(std::fs::read(root)?);
        return Ok(hex::encode(h.finalize()));
    }
    for entry in walkdir::WalkDir::new(root).min_depth(1).sort_by_file_name() {
        let entry = entry.map_err(std::io::Error::other)?;
        let rel = entry
            .path()
            .strip_prefix(root)
            .map_err(std::io::Error::other)?
            .to_string_lossy()
            .into_owned();
        let kind = entry.file_type();
        let (tag, body): (&[u8], Vec<u8>) = if kind.is_dir() {
            (b"dir", Vec::new())
        } else if kind.is_symlink() {
            (
                b"link",
                std::fs::read_link(entry.path())?
                    .to_string_lossy()
                    .into_owned()
                    .into_bytes(),
            )
        } else {
            (b"file", std::fs::read(entry.path())?)
        };
        // Length-prefixed parts: no path or content can run into the next entry.
        for part in [rel.as_bytes(), tag, &body] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// `spec` with `${FIXTURE_DIR}` replaced by `dir` in the command, arguments, environment and working folder.
pub fn spec_for(spec: &ServerSpec, dir: &Path) -> ServerSpec {
    let d = dir.to_string_lossy();
    let sub = |s: &str| s.replace(FIXTURE_VAR, &d);
    let mut out = spec.clone();
    if let Transport::Stdio {
        command,
        args,
        env,
        cwd,
        ..
    } = &mut out.transport
    {
        *command = sub(command);
        for a in args.iter_mut() {
            *a = sub(a);
        }
        for v in env.values_mut() {
            *v = sub(v);
        }
        if let Some(c) = cwd {
            *c = PathBuf::from(sub(&c.to_string_lossy()));
        }
    }
    out
}

/// A rollout's world: a fresh copy of the fixture and a server started on it.
pub struct Workspace {
    /// The server, started with `${FIXTURE_DIR}` naming [`Workspace::dir`].
    pub server: McpServer,
    dir: tempfile::TempDir,
}

impl Workspace {
    /// Copies the fixture (into the stable folder of `slot`, when given and free) and starts a server on the copy.
    pub async fn open(
        fixture: &Fixture,
        spec: &ServerSpec,
        slot: Option<usize>,
    ) -> Result<Workspace, EvalError> {
        let dir = fixture.materialise_in(slot)?;
        let server = McpServer::connect(spec_for(spec, dir.path())).await?;
        Ok(Workspace { server, dir })
    }

    /// The copy's folder (`${FIXTURE_DIR}`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the server and removes the copy.
    pub async fn close(self) {
        self.server.shutdown().await;
        drop(self.dir);
    }
}

/// Workspaces being prepared in the background for the next chunk of rollouts.
pub struct Prepared {
    handles: Vec<tokio::task::JoinHandle<Result<Workspace, EvalError>>>,
}

impl Prepared {
    /// Starts preparing `n` workspaces (copies and server starts run concurrently) for the rollouts in positions
    /// `first..first + n` of the evaluation (each position has its own stable folder name; see
    /// [`Fixture::materialise_in`]).
    pub fn start(fixture: &Fixture, spec: &ServerSpec, first: usize, n: usize) -> Prepared {
        let handles = (first..first + n)
            .map(|k| {
                let (f, s) = (fixture.clone(), spec.clone());
                tokio::spawn(async move { Workspace::open(&f, &s, Some(k)).await })
            })
            .collect();
        Prepared { handles }
    }

    /// Waits for them: each a workspace, or why it could not be prepared (its rollout then records an
    /// infrastructure failure instead of stopping the evaluation).
    pub async fn take(self) -> Vec<Result<Workspace, EvalError>> {
        let mut out = Vec::with_capacity(self.handles.len());
        for h in self.handles {
            out.push(match h.await {
                Ok(w) => w,
                Err(e) => Err(EvalError::Fixture {
                    path: PathBuf::new(),
                    message: format!("preparing a workspace panicked: {e}"),
                }),
            });
        }
        out
    }
}

/// A command run between rollouts to reset state that lives outside a folder (a database, say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetCommand {
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working folder (default: the suite's folder).
    pub cwd: Option<PathBuf>,
    /// How long it may take.
    pub timeout: Duration,
}

impl ResetCommand {
    /// Runs it; a non-zero exit, a failure to start or a timeout is an error naming the command and what it
    /// printed last.
    pub async fn run(&self, suite_dir: &Path) -> Result<(), EvalError> {
        let out = run_command(
            &self.command,
            &self.args,
            self.cwd.as_deref().unwrap_or(suite_dir),
            &[],
            self.timeout,
        )
        .await;
        match out {
            CommandOutcome::Passed => Ok(()),
            other => Err(EvalError::Reset {
                command: self.command.clone(),
                message: other.describe(),
            }),
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandOutcome {
    /// Exit status 0.
    Passed,
    /// Another exit status, with the last line it printed.
    Failed {
        /// The exit status as the system words it.
        status: String,
        /// The last line it printed (standard output or error), cut to 200 characters.
        last_line: String,
    },
    /// It could not be started.
    NotStarted(String),
    /// It ran longer than its timeout and was killed.
    TimedOut(Duration),
}

impl CommandOutcome {
    /// One line for feedback and errors.
    pub fn describe(&self) -> String {
        match self {
            CommandOutcome::Passed => "exited with status 0".into(),
            CommandOutcome::Failed { status, last_line } if last_line.is_empty() => {
                format!("exited with {status}")
            }
            CommandOutcome::Failed { status, last_line } => {
                format!("exited with {status}: {last_line}")
            }
            CommandOutcome::NotStarted(e) => format!("could not start: {e}"),
            CommandOutcome::TimedOut(t) => format!("did not finish within {t:?} and was stopped"),
        }
    }
}

/// Runs `command args` in `cwd` with `env` added, killing it after `timeout`.
pub async fn run_command(
    command: &str,
    args: &[String],
    cwd: &Path,
    env: &[(&str, &str)],
    timeout: Duration,
) -> CommandOutcome {
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return CommandOutcome::NotStarted(e.to_string()),
    };
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => CommandOutcome::TimedOut(timeout),
        Ok(Err(e)) => CommandOutcome::NotStarted(e.to_string()),
        Ok(Ok(out)) if out.status.success() => CommandOutcome::Passed,
        Ok(Ok(out)) => {
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let last_line = text
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            CommandOutcome::Failed {
                status: out.status.to_string(),
                last_line,
            }
        }
    }
}

/// The verdicts of a task's checks on a rollout's copy of the fixture, one per check: whether it passed, and
/// what it found (worded for the reflection model).
pub async fn check_world(task: &crate::suite::Task, dir: &Path) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    for f in &task.expect_files {
        out.push(check_file(f, dir));
    }
    if let Some(c) = &task.expect_command {
        let d = dir.to_string_lossy();
        let outcome =
            run_command(&c.command, &c.args, dir, &[("FIXTURE_DIR", &d)], c.timeout).await;
        let ok = outcome == CommandOutcome::Passed;
        out.push((
            ok,
            format!(
                "check command `{}` on the files {}",
                c.command,
                if ok {
                    "passed".to_string()
                } else {
                    outcome.describe()
                }
            ),
        ));
    }
    out
}

fn check_file(f: &crate::suite::FileCheck, dir: &Path) -> (bool, String) {
    let path = dir.join(&f.path);
    let name = &f.path;
    if !f.exists {
        return if path.exists() {
            (
                false,
                format!("file `{name}` should no longer exist but is still there"),
            )
        } else {
            (true, format!("file `{name}` is gone"))
        };
    }
    let text = match std::fs::read(&path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (false, format!("file `{name}` does not exist"));
        }
        Err(e) => return (false, format!("file `{name}` cannot be read: {e}")),
    };
    let mut fails = Vec::new();
    if let Some(want) = &f.equals
        && text.trim() != want.trim()
    {
        let shown: String = text.trim().chars().take(120).collect();
        fails.push(format!(
            "does not equal the expected text (it holds {shown:?})"
        ));
    }
    let missing: Vec<&str> = f
        .contains
        .iter()
        .filter(|c| !text.contains(c.as_str()))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        fails.push(format!("lacks {missing:?}"));
    }
    let present: Vec<&str> = f
        .lacks
        .iter()
        .filter(|c| text.contains(c.as_str()))
        .map(String::as_str)
        .collect();
    if !present.is_empty() {
        fails.push(format!("still contains {present:?}"));
    }
    if fails.is_empty() {
        (true, format!("file `{name}` is as expected"))
    } else {
        (false, format!("file `{name}` {}", fails.join(" and ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_has_the_digest_of_its_source_and_a_change_shows() {
        let src = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(src.path().join("notes/deep")).expect("mkdir");
        std::fs::write(src.path().join("notes/a.md"), "alpha").expect("write");
        std::fs::write(src.path().join("notes/deep/b.md"), "beta").expect("write");
        let f = Fixture::load(src.path().to_path_buf()).expect("fixture");
        let copy = f.materialise().expect("copy");
        assert_eq!(digest(copy.path()).expect("digest"), f.digest);
        std::fs::write(copy.path().join("notes/a.md"), "alphA").expect("write");
        assert_ne!(digest(copy.path()).expect("digest"), f.digest);
        // The source is untouched by writes to the copy.
        assert_eq!(
            std::fs::read_to_string(src.path().join("notes/a.md")).expect("read"),
            "alpha"
        );
    }

    #[test]
    fn a_slot_gets_the_same_folder_each_time_it_is_free_and_another_when_it_is_not() {
        let src = tempfile::tempdir().expect("dir");
        std::fs::write(src.path().join("a"), "slot test").expect("write");
        let f = Fixture::load(src.path().to_path_buf()).expect("fixture");
        let first = f.materialise_in(Some(7)).expect("copy");
        let path = first.path().to_path_buf();
        // Taken: a second copy for the same slot gets a folder of its own.
        let other = f.materialise_in(Some(7)).expect("copy");
        assert_ne!(other.path(), path);
        drop(first);
        drop(other);
        // Free again: the same name as before.
        let again = f.materialise_in(Some(7)).expect("copy");
        assert_eq!(again.path(), path);
        assert_eq!(digest(again.path()).expect("digest"), f.digest);
    }

    #[test]
    fn moving_content_between_files_changes_the_digest() {
        let a = tempfile::tempdir().expect("dir");
        std::fs::write(a.path().join("x"), "ab").expect("write");
        std::fs::write(a.path().join("y"), "").expect("write");
        let b = tempfile::tempdir().expect("dir");
        std::fs::write(b.path().join("x"), "a").expect("write");
        std::fs::write(b.path().join("y"), "b").expect("write");
        assert_ne!(
            digest(a.path()).expect("digest"),
            digest(b.path()).expect("digest")
        );
    }

    #[test]
    fn a_file_fixture_lands_under_its_own_name() {
        let src = tempfile::tempdir().expect("dir");
        let file = src.path().join("memory.jsonl");
        std::fs::write(&file, "{}\n").expect("write");
        let f = Fixture::load(file).expect("fixture");
        let copy = f.materialise().expect("copy");
        assert_eq!(
            std::fs::read_to_string(copy.path().join("memory.jsonl")).expect("read"),
            "{}\n"
        );
        // An untouched copy has the fixture's digest; a write changes it.
        assert_eq!(digest(copy.path()).expect("digest"), f.digest);
        std::fs::write(copy.path().join("memory.jsonl"), "{}\n{}\n").expect("write");
        assert_ne!(digest(copy.path()).expect("digest"), f.digest);
    }

    #[test]
    fn the_fixture_variable_is_replaced_everywhere_in_a_stdio_spec() {
        let mut spec = ServerSpec::stdio("s", "${FIXTURE_DIR}/bin", &["--root", "${FIXTURE_DIR}"]);
        if let Transport::Stdio { env, cwd, .. } = &mut spec.transport {
            env.insert("DB".into(), "${FIXTURE_DIR}/db.json".into());
            *cwd = Some(PathBuf::from("${FIXTURE_DIR}"));
        }
        let out = spec_for(&spec, Path::new("/scratch/x"));
        let Transport::Stdio {
            command,
            args,
            env,
            cwd,
            ..
        } = out.transport
        else {
            panic!("stdio")
        };
        assert_eq!(command, "/scratch/x/bin");
        assert_eq!(args, ["--root", "/scratch/x"]);
        assert_eq!(env["DB"], "/scratch/x/db.json");
        assert_eq!(cwd, Some(PathBuf::from("/scratch/x")));
    }

    #[tokio::test]
    async fn a_command_outcome_says_how_it_ended() {
        let dir = std::env::temp_dir();
        let t = Duration::from_secs(5);
        assert_eq!(
            run_command("sh", &["-c".into(), "exit 0".into()], &dir, &[], t).await,
            CommandOutcome::Passed
        );
        let failed = run_command(
            "sh",
            &["-c".into(), "echo nope >&2; exit 3".into()],
            &dir,
            &[],
            t,
        )
        .await;
        assert!(failed.describe().ends_with(": nope"), "{failed:?}");
        assert!(matches!(
            run_command(
                "sh",
                &["-c".into(), "sleep 5".into()],
                &dir,
                &[],
                Duration::from_millis(100)
            )
            .await,
            CommandOutcome::TimedOut(_)
        ));
        assert!(matches!(
            run_command("/no/such/program", &[], &dir, &[], t).await,
            CommandOutcome::NotStarted(_)
        ));
    }
}
