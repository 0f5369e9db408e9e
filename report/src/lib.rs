//! The report of optimisation runs: what a classroom looks at after `tooltune demo` has optimised the same seed
//! description once for task success and once for selection rate, to see whether selection-rate optimisation
//! inflates the description.
//!
//! [`Report::load`] reads runs from the trace store into figures (one [`RunReport`] per run: the validation
//! series, the accepted descriptions with their diffs, diagnoses and inflation measures, the seed-versus-winner
//! comparison on the held-out test split, a [`Verdict`] on inflation computed from those figures, and the
//! [`SideEffects`] of each candidate's rollouts: calls of tools not declared read-only, and read-only hints a
//! fixture's digest proved false).
//! [`Report::to_html`] renders them as one self-contained HTML file (inline CSS and SVG, no script, no external
//! asset) through the minijinja templates in `report/templates/`, and [`Report::to_json`] gives the same figures as
//! JSON. [`write`] puts both in a folder. The pieces ([`svg`], [`diff`], [`highlight`]) are public for the web
//! service's pages.
//!
//! Every piece of text that comes from a run (descriptions, diagnoses, task text, tool names, errors) is
//! HTML-escaped, and model specs that look like they carry a credential are not rendered. **Knows nothing about**
//! SQL (it asks the store), MCP or models.

pub mod diff;
pub mod highlight;
mod model;
mod render;
mod secrets;
pub mod svg;
pub mod verdict;

// The one HTML escape of the workspace is core's, shared with the drafted suites' review pages; re-exported
// here for the report's callers and tests.
pub use model::{
    CandidateRow, IterationPoint, ProposalRow, RunInput, RunReport, Settings, SideEffects, Step,
    ToolChange,
};
pub use render::fmt_p;
pub use tooltune_core::text::escape_html;
pub use verdict::{Outcome, Verdict};

use serde::Serialize;
use std::path::{Path, PathBuf};
use tooltune_core::TrajectoryId;
use tooltune_store::{RunRow, Store};

/// Everything that can go wrong while loading or writing a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// No run was asked for.
    #[error("no runs given: name at least one run id")]
    NoRuns,
    /// A run id that is not in the store.
    #[error("no run `{0}` in the store")]
    NoSuchRun(String),
    /// A run that is not an optimisation (a batch `from-traces` run holds one proposal, no search to chart).
    #[error(
        "run `{id}` is a `{kind}` run, not an optimisation: its result is in `tooltune optimize --from-traces --json` and the store"
    )]
    NotAnOptimization {
        /// The run.
        id: String,
        /// Its kind.
        kind: tooltune_store::RunKind,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] tooltune_store::StoreError),
    /// Writing the files failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The figures could not be serialised (not expected: they are plain data).
    #[error("cannot serialise the report: {0}")]
    Json(#[from] serde_json::Error),
}

/// The figures of several runs, in the order they were asked for.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// One entry per run.
    pub runs: Vec<RunReport>,
}

impl Report {
    /// Reads `run_ids` from the store. A run that is still running or failed is included with what its events
    /// show; an id the store does not know is an error.
    pub async fn load(store: &Store, run_ids: &[String]) -> Result<Report, ReportError> {
        if run_ids.is_empty() {
            return Err(ReportError::NoRuns);
        }
        let mut runs = Vec::new();
        for id in run_ids {
            let row = store
                .run(id)
                .await?
                .ok_or_else(|| ReportError::NoSuchRun(id.clone()))?;
            if row.kind != tooltune_store::RunKind::Optimize {
                return Err(ReportError::NotAnOptimization {
                    id: id.clone(),
                    kind: row.kind,
                });
            }
            let events = store.events(id, -1).await?;
            let schema = if row.result.is_none() {
                target_schema(store, &row).await?
            } else {
                None
            };
            let rollouts = store.run_rollouts(id).await?;
            runs.push(RunReport::build(RunInput {
                row,
                events,
                schema,
                rollouts,
            }));
        }
        Ok(Report { runs })
    }

    /// Builds a report from rows already read (for callers that hold them, and for tests).
    pub fn from_inputs(inputs: Vec<RunInput>) -> Report {
        Report {
            runs: inputs.into_iter().map(RunReport::build).collect(),
        }
    }

    /// The figures as JSON (the same as `report.json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }

    /// The report as one self-contained HTML document.
    pub fn to_html(&self) -> String {
        render::html(self)
    }
}

/// Writes `report.html` and `report.json` into `dir` (created if missing). Each file is written to a temporary
/// name in the same folder and renamed into place, so a reader never sees half a report.
pub fn write(report: &Report, dir: &Path) -> Result<(PathBuf, PathBuf), ReportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReportError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let html = dir.join("report.html");
    let json = dir.join("report.json");
    let json_text = serde_json::to_string_pretty(&report.to_json())?;
    write_atomically(&html, report.to_html().as_bytes()).map_err(io(&html))?;
    write_atomically(&json, json_text.as_bytes()).map_err(io(&json))?;
    Ok((html, json))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The target tool's input schema as the server declared it, from a trajectory of the run's seed candidate: an
/// unfinished run has no summary, and its candidates' scope claims can only be measured against the schema.
async fn target_schema(
    store: &Store,
    row: &RunRow,
) -> Result<Option<serde_json::Value>, ReportError> {
    let Ok(cfg) = serde_json::from_str::<tooltune_run::RunConfig>(&row.config) else {
        return Ok(None);
    };
    let Some(state) = &row.state else {
        return Ok(None);
    };
    let Ok(search) = tooltune_run::Checkpoint::parse(state) else {
        return Ok(None);
    };
    let Some(seed) = search.seed() else {
        return Ok(None);
    };
    let key = tooltune_run::candidate_key(seed);
    for r in store.rollouts(&row.id, &key).await? {
        let Some(id) = r.trajectory_id else { continue };
        if let Some(t) = store.trajectory(&TrajectoryId::from_stored(id)).await?
            && let Some(tool) = t.tools.iter().find(|t| t.name == cfg.target)
        {
            return Ok(Some((*tool.input_schema).clone()));
        }
    }
    Ok(None)
}
