//! Shared helpers of the evaluator's integration tests: building the example servers, installing the
//! third-party ones, starting an HTTP server process, and finding the suites.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The workspace root (the evaluator crate's parent).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("evaluator has a parent")
        .to_path_buf()
}

/// The folder holding the suites.
pub fn suites_dir() -> PathBuf {
    workspace().join("datasets").join("suites")
}

/// Builds `week01-tools` and `contractor` (once per test binary) into the directory the suites expect
/// (`${TOOLTUNE_BIN_DIR}`, which defaults to this test binary's profile folder) and returns it.
pub fn bin_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = tooltune_evaluator::suite::bin_dir();
            let mut cmd = Command::new(env!("CARGO"));
            cmd.current_dir(workspace()).args([
                "build",
                "-q",
                "-p",
                "week01-tools",
                "-p",
                "contractor",
            ]);
            if dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("cargo runs");
            assert!(status.success(), "building the example servers failed");
            assert!(
                dir.join("week01-tools").exists(),
                "week01-tools was not built into {}",
                dir.display()
            );
            dir
        })
        .clone()
}

/// Path of an example server binary.
pub fn server_bin(name: &str) -> String {
    bin_dir().join(name).to_string_lossy().into_owned()
}

/// The week01-tools data folder shipped with the crate.
pub fn week01_data() -> PathBuf {
    workspace().join("datasets/week01-tools/data")
}

/// Runs datasets/setup.sh (idempotent, milliseconds when already installed) once per test binary.
pub fn third_party() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let status = Command::new("bash")
            .arg(workspace().join("datasets/setup.sh"))
            .stdout(Stdio::null())
            .status()
            .expect("bash runs");
        assert!(status.success(), "datasets/setup.sh failed");
    });
}

/// A server process serving Streamable HTTP, killed on drop.
pub struct HttpServer {
    child: Child,
    /// Its endpoint URL.
    pub url: String,
}

impl HttpServer {
    /// Starts `bin args... --http 127.0.0.1:0` with an empty environment and reads the URL it prints.
    pub fn start(bin: &str, args: &[&str]) -> HttpServer {
        let mut child = Command::new(bin)
            .args(args)
            .args(["--http", "127.0.0.1:0"])
            .env_clear()
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("server starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("server prints its URL");
        let url = line.trim().to_string();
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "unexpected first line {url:?}"
        );
        HttpServer { child, url }
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A generous per-call timeout for tests.
pub const CALL: Duration = Duration::from_secs(20);

/// Median and 99th percentile of durations, in milliseconds.
pub fn median_p99(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p = |q: f64| ms(v[((v.len() as f64 - 1.0) * q).round() as usize]);
    (p(0.5), p(0.99))
}

/// A suite over the notes server (tests/servers/notes_server.py, Python) written into `dir` with `tasks`; with
/// `fixture` each rollout runs on a fresh copy of tests/fixtures/notes, without it on one shared copy made here
/// (no reset).
pub fn notes_suite(dir: &Path, fixture: bool, tasks: &str) -> tooltune_evaluator::Suite {
    third_party();
    let python = tooltune_evaluator::suite::third_party_dir(&suites_dir()).join("time/bin/python");
    let script = workspace().join("evaluator/tests/servers/notes_server.py");
    let source = workspace().join("evaluator/tests/fixtures/notes");
    let (fixture_section, cwd) = if fixture {
        (
            format!("[fixture]\npath = {:?}\n", source.display().to_string()),
            "${FIXTURE_DIR}".to_string(),
        )
    } else {
        let shared = dir.join("shared");
        let copy = tooltune_evaluator::fixture::Fixture::load(source)
            .expect("fixture")
            .materialise()
            .expect("copy");
        std::fs::rename(copy.keep(), &shared).expect("move the copy");
        (String::new(), shared.display().to_string())
    };
    let text = format!(
        "name = \"notes\"\ntools_under_study = [\"read_note\"]\nmax_steps = 2\n{fixture_section}\n[server]\n\
         command = {python:?}\nargs = [{script:?}]\ncwd = {cwd:?}\n\n{tasks}",
        python = python.display().to_string(),
        script = script.display().to_string(),
    );
    let path = dir.join("notes.toml");
    std::fs::write(&path, text).expect("write suite");
    tooltune_evaluator::Suite::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// Natural tasks for the notes server, for the evaluator benchmark's fixture case: questions a user of a notes
/// tool would ask, and deletions.
pub const NOTES_TASKS: &str = r#"
[[task]]
id = "alpha-launch"
prompt = "When does Alpha launch? It is in my notes."
split = "test"
owner = "read_note"
answer.contains = "2026-10-20"

[[task]]
id = "beta-state"
prompt = "What is the state of Beta, according to my notes?"
split = "test"
owner = "read_note"
answer.contains = "paused"

[[task]]
id = "delete-beta"
prompt = "Delete my note about beta, I do not need it any more."
split = "test"
owner = "delete_note"
expect_file = [{ path = "notes/beta.txt", exists = false }]

[[task]]
id = "how-many"
prompt = "How many notes do I have?"
split = "test"
owner = "count_notes"
answer.number = 2

[[task]]
id = "alpha-date-again"
prompt = "Remind me of the Alpha launch date from my notes."
split = "test"
owner = "read_note"
answer.contains = "2026-10-20"

[[task]]
id = "delete-alpha"
prompt = "Remove the alpha note."
split = "test"
owner = "delete_note"
expect_file = [{ path = "notes/alpha.txt", exists = false }]

[[task]]
id = "beta-paused"
prompt = "Is Beta paused? Check my notes."
split = "test"
owner = "read_note"
answer.contains = "paused"

[[task]]
id = "count-again"
prompt = "Count my notes for me."
split = "test"
owner = "count_notes"
answer.number = 2
"#;
