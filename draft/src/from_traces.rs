//! `suite from-traces`: logged runs (read from the store by the caller) become a suite. The requests are grouped
//! and their owners, reference calls and answer checks read by [`crate::traces`]; with a server, each task's
//! logged calls are run there in order, as `suite check` runs them (on one fixture copy when a tool may write, never
//! a tool declared to write without one), and the task is kept only if the owner's call succeeds (a later call
//! that fails ends the reference before it); without one, the tasks are written unverified and their provenance
//! says so. The file and its review pages are written by the same code as a drafted suite's.

use crate::DraftError;
use crate::draft::{RESULT_IN_REVIEW, cut_result};
use crate::finish::{self, SuiteFile};
use crate::outcome::{
    DraftOutcome, DropReason, Dropped, Kept, Kind, Origin, Progress, TaskCheck, TraceSummary,
};
use crate::parse::NoCheck;
use crate::server::{self, Calls};
use crate::tools::{self, Access};
use crate::traces::{self, LoggedRun, Request};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tooltune_evaluator::{ServerSpec, Split};

/// What to make, from which runs, into which file.
#[derive(Debug, Clone)]
pub struct FromTracesConfig {
    /// The server to verify the reference calls on; `None` writes the tasks unverified.
    pub server: Option<ServerSpec>,
    /// A folder or file copied for every call of a tool that may write.
    pub fixture: Option<PathBuf>,
    /// The suite file to write.
    pub out: PathBuf,
    /// The suite's name (default: the file name).
    pub name: Option<String>,
    /// Keep only requests owned by these tools (empty: all, no-tool requests included).
    pub tools: Vec<String>,
    /// The filters the runs were read with, in words, for the message when none matched.
    pub filters: String,
    /// Seeds the splits.
    pub seed: u64,
    /// How long one reference call may take.
    pub call_timeout: Duration,
}

/// Runs `suite from-traces` over `runs` (the store's logged runs that passed the filters, in log order).
pub async fn from_traces(
    cfg: &FromTracesConfig,
    runs: Vec<LoggedRun>,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<DraftOutcome, DraftError> {
    let started = Instant::now();
    if runs.is_empty() {
        return Err(DraftError::NoLoggedRuns {
            filters: cfg.filters.clone(),
        });
    }
    let mut p = Progress {
        stage: "grouping",
        done: 0,
        total: runs.len(),
    };
    progress(&p);
    let requests: Vec<Request> = traces::group(&runs)
        .into_iter()
        .filter(|r| {
            cfg.tools.is_empty() || matches!(&r.owner, Ok(Some(o)) if cfg.tools.contains(o))
        })
        .collect();
    if requests.is_empty() {
        return Err(DraftError::NoLoggedRuns {
            filters: format!(
                "{}; no request's successful runs began with {}",
                cfg.filters,
                cfg.tools.join(" or ")
            ),
        });
    }
    p.done = runs.len();
    progress(&p);

    // The tools: the server's, else every tool the runs showed, in first-seen order.
    let opened = match &cfg.server {
        Some(s) => Some(server::open(s, cfg.fixture.as_deref()).await?),
        None => None,
    };
    let (tool_names, access): (Vec<String>, BTreeMap<String, Access>) = match &opened {
        Some(o) => (
            o.tools.iter().map(|t| t.name.clone()).collect(),
            o.access.clone(),
        ),
        None => {
            let mut specs: Vec<tooltune_core::ToolSpec> = Vec::new();
            for r in &runs {
                for t in &r.trajectory.tools {
                    if !specs.iter().any(|s| s.name == t.name) {
                        specs.push(t.clone());
                    }
                }
            }
            let access = tools::access_map(&specs, &BTreeMap::new());
            (specs.into_iter().map(|t| t.name).collect(), access)
        }
    };

    p.stage = if opened.is_some() {
        "verifying"
    } else {
        "writing"
    };
    p.done = 0;
    p.total = requests.len();
    progress(&p);
    let verified = opened.is_some();
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    let mut stopped = false;
    let calls = opened.as_ref().map(|o| Calls {
        spec: &o.spec,
        main: o.main.server(),
        fixture: o.fixture.as_ref(),
        access: &o.access,
        timeout: cfg.call_timeout,
    });
    let n_requests = requests.len();
    for r in requests {
        if stop.load(Ordering::SeqCst) {
            stopped = true;
        }
        let owner = match &r.owner {
            Ok(o) => o.clone(),
            Err((reason, detail)) => {
                dropped.push(dropped_of(&r, None, *reason, detail.clone(), None));
                p.done += 1;
                continue;
            }
        };
        if stopped {
            dropped.push(dropped_of(
                &r,
                owner,
                DropReason::Stopped,
                "stopped first".into(),
                None,
            ));
            continue;
        }
        let check = match &r.check {
            Ok(c) => TaskCheck::Answer(c.clone()),
            Err(why) => TaskCheck::Routing(routing_reason(why)),
        };
        let mut task = Kept {
            id: String::new(),
            prompt: r.prompt.clone(),
            split: Split::Train,
            owner: owner.clone(),
            kind: if owner.is_some() {
                Kind::Tool
            } else {
                Kind::NoTool
            },
            check,
            reference: r.reference.clone(),
            result_start: r
                .logged_results
                .last()
                .map(|t| cut_result(t, RESULT_IN_REVIEW)),
            digest: None,
            origin: Origin::Logged {
                trajectories: r.trajectories.clone(),
                verified,
            },
        };
        let last = match (&calls, &owner) {
            // No tool to call: nothing to run.
            (_, None) => None,
            (_, Some(o)) if r.reference.is_empty() => {
                if calls.is_some() {
                    dropped.push(dropped_of(
                        &r,
                        Some(o.clone()),
                        DropReason::NoCall,
                        format!(
                            "no successful run has a call of `{o}` that can be replayed (one that succeeded, with \
                             its arguments as a JSON object)"
                        ),
                        None,
                    ));
                    p.done += 1;
                    continue;
                }
                None
            }
            // Not verified: the log's own last result.
            (None, Some(_)) => r.logged_results.last().cloned(),
            (Some(c), Some(_)) => {
                let (results, failed) = c.run_chain(&r.reference).await;
                match (failed, results.is_empty()) {
                    // The owner's call itself failed: the task cannot be shown solvable.
                    (Some((reason, detail, result)), true) => {
                        dropped.push(dropped_of(
                            &r,
                            owner.clone(),
                            reason,
                            detail,
                            result.as_deref(),
                        ));
                        p.done += 1;
                        continue;
                    }
                    // A later call failed: the calls up to it are the reference.
                    (Some(_), false) => task.reference.truncate(results.len()),
                    (None, _) => {}
                }
                let last = results.last().cloned().unwrap_or_default();
                task.digest = Some(format!(
                    "sha256:{}",
                    hex::encode(Sha256::digest(last.as_bytes()))
                ));
                task.result_start = Some(cut_result(&last, RESULT_IN_REVIEW));
                Some(last)
            }
        };
        // `suite check` holds the answer to the last reference result: a value it does not hold is no check.
        if let (TaskCheck::Answer(c), Some(last)) = (&task.check, &last)
            && !traces::holds(c, last)
        {
            task.check = TaskCheck::Routing(
                "the shared value of the answers is not in the last reference result".into(),
            );
        }
        kept.push(task);
        p.done += 1;
        progress(&p);
    }
    // The fixture and protocol stay for the file's header; the server is done with.
    let (fixture, protocol) = match opened {
        Some(server::Opened {
            main,
            fixture,
            protocol,
            ..
        }) => {
            main.close().await;
            (fixture, protocol)
        }
        None => (None, None),
    };

    p.stage = "writing";
    progress(&p);
    let kept = finish::ids_and_splits(kept, None, cfg.seed);
    let (review_md, review_html) = finish::review_paths(&cfg.out);
    let mut outcome = DraftOutcome {
        suite: None,
        review_md: review_md.clone(),
        review_html,
        model: String::new(),
        tools: tool_names.iter().map(|n| (n.clone(), access[n])).collect(),
        explored: Vec::new(),
        existing: 0,
        kept,
        dropped,
        earlier: Vec::new(),
        traces: Some(TraceSummary {
            trajectories: runs.len(),
            requests: n_requests,
            verified,
        }),
        stopped,
        seconds: started.elapsed().as_secs_f64(),
    };
    let opening = format!(
        "Made by `tooltune suite from-traces` from logged runs: each task is a request users made, its owner the\n\
         tool its successful runs called first (none: a no-tool task), its answer check a number, name or date all\n\
         their answers hold. {}\n\
         Read {{review}} before using it; edit or delete tasks freely (provenance is informational). Format:\n\
         docs/suite-format.md.",
        if verified {
            "Each task's logged calls were run on the server and succeeded."
        } else {
            "No server was given: the logged calls were NOT run (provenance: verified =\nfalse); \
             `tooltune suite check` runs them once the server is set below."
        }
    );
    let file = SuiteFile {
        out: &cfg.out,
        name: cfg.name.as_deref(),
        server: cfg.server.as_ref(),
        fixture: fixture.as_ref(),
        protocol: protocol.as_deref(),
        tools: &tool_names,
        existing: None,
        opening: &opening,
        description: format!(
            "Made by tooltune suite from-traces from {} logged runs ({} tasks kept of {} requests{}).",
            runs.len(),
            outcome.kept.len(),
            n_requests,
            if verified { "" } else { ", unverified" }
        ),
        appended: String::new(),
    };
    finish::write_files(&file, &mut outcome)?;
    if outcome.kept.is_empty() {
        return Err(outcome.nothing_kept(review_md));
    }
    Ok(outcome)
}

fn dropped_of(
    r: &Request,
    owner: Option<String>,
    reason: DropReason,
    detail: String,
    result: Option<&str>,
) -> Dropped {
    Dropped {
        prompt: r.prompt.clone(),
        owner,
        kind: Kind::Tool,
        reason,
        detail,
        reference: r.reference.clone(),
        result_start: result.map(|t| cut_result(t, RESULT_IN_REVIEW)),
    }
}

/// Why a task from logs checks routing only, in the review page's words.
fn routing_reason(why: &NoCheck) -> String {
    match why {
        NoCheck::NoValue | NoCheck::NotInResult => {
            "the logged answers hold no number, name or date the request does not name".into()
        }
        NoCheck::Unstable => "the successful runs' answers do not share a value".into(),
        NoCheck::NotAStableValue => "the shared value is longer than a number, name or date".into(),
    }
}
