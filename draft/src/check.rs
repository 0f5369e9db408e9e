//! `suite check`: runs every task's reference calls on the suite's server (a fresh fixture copy per task when the
//! suite has a fixture) and reports the tasks that are no longer solvable (a call refused or failing, an answer the
//! last result no longer holds, a fixture check that fails), each with the file and line of its `[[task]]`. A
//! drafted task whose result changed since drafting (its `reference_sha256`) is reported as a note: a clock or a
//! counter changes without a task breaking.

use crate::DraftError;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tooltune_evaluator::fixture::{self, Workspace};
use tooltune_evaluator::{McpServer, Suite, Task};

/// What was found about one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Finding {
    /// The task cannot be solved any more.
    Unsolvable,
    /// Its reference result differs from the one it was drafted from (still solvable).
    Changed,
    /// It has no reference call, so it was not checked.
    NotChecked,
}

/// One finding, placed in the file.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// The suite file.
    pub file: PathBuf,
    /// The 1-based line of the task's `[[task]]` header.
    pub line: Option<usize>,
    /// The task's id.
    pub task: String,
    /// What kind of finding.
    pub finding: Finding,
    /// What is wrong, and what to do.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        write!(f, ": task `{}`: {}", self.task, self.message)
    }
}

/// The outcome of `suite check`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// The suite file.
    pub file: PathBuf,
    /// Tasks in the suite.
    pub tasks: usize,
    /// Tasks whose reference calls ran.
    pub checked: usize,
    /// The findings, in file order.
    pub problems: Vec<Problem>,
}

impl CheckReport {
    /// Tasks no longer solvable.
    pub fn unsolvable(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| p.finding == Finding::Unsolvable)
            .count()
    }
}

/// Checks the suite at `path`; `progress(done, total)` after each task.
pub async fn check_suite(
    path: &Path,
    call_timeout: Duration,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<CheckReport, DraftError> {
    let suite = Suite::load(path).map_err(DraftError::Existing)?;
    let text = std::fs::read_to_string(path).map_err(|e| DraftError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let lines = tooltune_evaluator::suite::task_lines(&text);
    let start = |e: tooltune_evaluator::EvalError| DraftError::ServerStart {
        command: crate::draft::command_line(&suite.server),
        message: e.to_string(),
    };
    // Without a fixture every task runs on one server; with one, each on its own copy (opened below).
    let shared = match &suite.fixture {
        None => Some(
            McpServer::connect(suite.server.clone())
                .await
                .map_err(start)?,
        ),
        Some(_) => None,
    };
    let mut report = CheckReport {
        file: path.to_path_buf(),
        tasks: suite.tasks.len(),
        checked: 0,
        problems: Vec::new(),
    };
    let total = suite.tasks.len();
    for (i, task) in suite.tasks.iter().enumerate() {
        let place = |finding, message: String| Problem {
            file: path.to_path_buf(),
            line: lines.get(i).copied(),
            task: task.id.clone(),
            finding,
            message,
        };
        if task.reference.is_empty() {
            report.problems.push(place(
                Finding::NotChecked,
                "no reference call, so its solvability is not checked".into(),
            ));
            progress(i + 1, total);
            continue;
        }
        let found = match (&shared, &suite.fixture) {
            (Some(server), _) => run_task(task, server, None, call_timeout).await,
            (None, Some(f)) => match Workspace::open(f, &suite.server, None).await {
                Ok(w) => {
                    let r = run_task(task, &w.server, Some(w.dir()), call_timeout).await;
                    w.close().await;
                    r
                }
                Err(e) => return Err(start(e)),
            },
            (None, None) => Vec::new(),
        };
        report.checked += 1;
        report
            .problems
            .extend(found.into_iter().map(|(f, m)| place(f, m)));
        progress(i + 1, total);
    }
    if let Some(s) = shared {
        s.shutdown().await;
    }
    Ok(report)
}

async fn run_task(
    task: &Task,
    server: &McpServer,
    dir: Option<&Path>,
    timeout: Duration,
) -> Vec<(Finding, String)> {
    let mut out = Vec::new();
    let mut last = String::new();
    for (j, call) in task.reference.iter().enumerate() {
        match server
            .call_tool(&call.tool, call.arguments.clone(), timeout)
            .await
        {
            Ok(o) if o.is_error => {
                out.push((
                    Finding::Unsolvable,
                    format!(
                        "reference[{j}] `{}` now answers with an error: {}; fix the call or delete the task",
                        call.tool,
                        crate::tools::cut(o.content_text.trim(), 200)
                    ),
                ));
                return out;
            }
            Ok(o) => last = o.content_text,
            Err(e) => {
                if e.is_infrastructure() {
                    let _ = server.ensure_connected().await;
                }
                out.push((
                    Finding::Unsolvable,
                    format!("reference[{j}] `{}` failed: {e}", call.tool),
                ));
                return out;
            }
        }
    }
    if let Some(a) = &task.answer
        && !a.found_in(&last)
    {
        out.push((
            Finding::Unsolvable,
            format!(
                "the last reference result no longer holds {} (it begins {:?}); update `answer` or delete the task",
                a.describe(),
                crate::tools::cut(last.trim(), 120)
            ),
        ));
    }
    if let Some(d) = dir {
        for (ok, what) in fixture::check_world(task, d).await {
            if !ok {
                out.push((
                    Finding::Unsolvable,
                    format!("after the reference calls: {what}"),
                ));
            }
        }
    }
    if out.is_empty()
        && let Some(want) = task
            .provenance
            .as_ref()
            .and_then(|p| p.reference_sha256.as_deref())
    {
        let got = format!("sha256:{}", hex::encode(Sha256::digest(last.as_bytes())));
        if got != want {
            out.push((
                Finding::Changed,
                "the reference result differs from the one the task was drafted from (still solvable)".into(),
            ));
        }
    }
    out
}
