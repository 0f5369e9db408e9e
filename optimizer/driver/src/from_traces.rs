//! Batch mode: a description's v2 from logged runs. The failing trajectories already in the store (ingested from
//! production logs) that showed the tool become the reflective dataset; the reflector writes a diagnosis and a new
//! description; when a suite is given, seed and v2 are both evaluated on its held-out test split and compared with
//! paired tests. Stored as a run of kind `from-traces`, so the proposal, its diagnosis and the verdict stay with the
//! evidence.
//!
//! The verdict is what a cron job acts on: it is `improved` only when a suite was given and v2 beat the seed on
//! the run's objective; an unvalidated proposal is reported as such, never as an improvement.

use crate::Comparison;
use crate::summary::compare;
use crate::{DriverError, Models, candidate_key, facts_of};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, Mode, evaluate};
use tooltune_evaluator::{Split, Suite};
use tooltune_objectives::{Objective, RolloutFacts, per_task_scores};
use tooltune_reflection::{Goal, ReflectionOptions, ReflectionRequest, ReflectiveExample, reflect};
use tooltune_store::{LabelUse, Store, VerdictCounts};

/// What a batch run from traces is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FromTracesConfig {
    /// The tool whose description is rewritten.
    pub tool: String,
    /// Only trajectories ingested at or after this (RFC 3339 or `YYYY-MM-DD`).
    pub since: Option<String>,
    /// Failing trajectories shown to the reflector, newest first.
    pub max_examples: usize,
    /// What the new description should serve (it is also what the validation compares).
    pub objective: Objective,
    /// A suite to validate the proposal on (its test split), with its real server.
    pub suite: Option<PathBuf>,
    /// Seed of the reflector's sampling and of the permutation test.
    pub seed: u64,
    /// The agent model spec (validation).
    pub agent: String,
    /// The reflector model spec.
    pub reflector: String,
    /// Whether trajectories without a producer's outcome count with tooltune's label (`traces label`).
    #[serde(default)]
    pub labels: LabelUse,
}

/// Seed against proposal on a suite's test split (`comparison.winner` is the proposal).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Validation {
    /// The suite's name.
    pub suite: String,
    /// Both metrics of both descriptions and the paired tests.
    pub comparison: Comparison,
    /// Mean objective score of the seed over the test tasks.
    pub seed_mean: f64,
    /// Mean objective score of the proposal over the test tasks.
    pub proposal_mean: f64,
}

/// The outcome of a batch run from traces.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FromTracesSummary {
    /// The run id.
    pub run_id: String,
    /// The tool.
    pub tool: String,
    /// Judged trajectories that showed the tool (in the `since` window).
    pub judged: u64,
    /// Failing ones among them that were found (at most `max_examples`).
    pub failing: usize,
    /// Where the verdicts counted in `judged` came from: the producer's outcomes and, with labels in use,
    /// tooltune's labels where the producer wrote none.
    #[serde(default)]
    pub judged_by: VerdictCounts,
    /// Where the verdicts of the failing trajectories shown came from (`producer`, `judge`, `heuristic`).
    #[serde(default)]
    pub failing_by: BTreeMap<String, usize>,
    /// The description the proposal starts from: the server's when a suite is given, else the newest version in
    /// the failing traces.
    pub seed_description: String,
    /// The new description, when the reflector produced a usable one.
    pub proposal: Option<String>,
    /// The reflector's diagnosis.
    pub diagnosis: Option<String>,
    /// Reflection tokens spent.
    pub reflection_tokens: u64,
    /// The comparison on the suite's test split, when a suite was given and a proposal made.
    pub validation: Option<Validation>,
    /// `no_failures`, `proposal_failed`, `unvalidated`, `improved` or `not_better`.
    pub verdict: String,
    /// Wall time, seconds.
    pub wall_s: f64,
}

/// Runs a batch reflection from the store's failing trajectories of `cfg.tool`, stored as a `from-traces` run.
pub async fn from_traces(
    store: &Store,
    cfg: FromTracesConfig,
    models: Models,
) -> Result<FromTracesSummary, DriverError> {
    let started = Instant::now();
    let run_id = format!("ft-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    store
        .create_run(
            &run_id,
            tooltune_store::RunKind::FromTraces,
            cfg.suite
                .as_ref()
                .map(|s| s.display().to_string())
                .as_deref(),
            cfg.objective,
            &serde_json::to_string(&cfg).unwrap_or_default(),
        )
        .await?;
    let result = run(store, &run_id, &cfg, &models, started).await;
    match &result {
        Ok(summary) => {
            store
                .finish_run(
                    &run_id,
                    tooltune_store::RunStatus::Finished,
                    Some(&serde_json::to_string(summary).unwrap_or_default()),
                    None,
                )
                .await?
        }
        Err(e) => {
            // The run's own error is what the caller can act on; `?` here would replace it with the store's.
            if let Err(store_error) = store
                .finish_run(
                    &run_id,
                    tooltune_store::RunStatus::Failed,
                    None,
                    Some(&e.to_string()),
                )
                .await
            {
                tracing::error!(
                    run = %run_id,
                    "recording the run's failure ({e}): {store_error}; the run stays `running`"
                );
            }
        }
    }
    result
}

async fn run(
    store: &Store,
    run_id: &str,
    cfg: &FromTracesConfig,
    models: &Models,
    started: Instant,
) -> Result<FromTracesSummary, DriverError> {
    let (failing, judged_by) = store
        .failing_for_tool_with(
            &cfg.tool,
            cfg.since.as_deref(),
            cfg.max_examples as u64,
            cfg.labels,
        )
        .await?;
    let judged = judged_by.total().judged;
    let mut examples = Vec::new();
    let mut failing_by: BTreeMap<String, usize> = BTreeMap::new();
    for f in &failing {
        let Some(t) = store.trajectory(&f.id).await? else {
            continue;
        };
        *failing_by.entry(f.verdict_source.clone()).or_default() += 1;
        // A label's feedback says why the run was judged a failure (the rules that fired, the judge's line);
        // the producer's own feedback is in the trajectory.
        let feedback = match &f.label_feedback {
            Some(l) => format!("({} label) {l}", f.verdict_source),
            None => t.outcome.feedback.clone().unwrap_or_default(),
        };
        examples.push(ReflectiveExample {
            task: t.task.clone(),
            owner: None,
            success: false,
            feedback,
            trajectory: t,
        });
    }
    // With a suite, the server's live description is the seed (what users see today); without, the newest
    // version the failing traces showed.
    let suite = match &cfg.suite {
        Some(p) => Some(Suite::load(p)?),
        None => None,
    };
    let server = match &suite {
        Some(s) => Some(s.connect().await?),
        None => None,
    };
    let server_tools = match (&suite, &server) {
        (Some(s), Some(srv)) => {
            let listed = srv.list_tools().await?;
            s.check_tool_names(&listed)?;
            Some(s.visible_tools(listed))
        }
        _ => None,
    };
    let from_traces = examples.first().and_then(|e| {
        e.trajectory
            .tools
            .iter()
            .find(|t| t.name == cfg.tool)
            .cloned()
    });
    let seed_spec = match &server_tools {
        Some(tools) => tools.iter().find(|t| t.name == cfg.tool).cloned(),
        None => from_traces,
    };
    let mut summary = FromTracesSummary {
        run_id: run_id.to_string(),
        tool: cfg.tool.clone(),
        judged,
        failing: examples.len(),
        judged_by,
        failing_by,
        seed_description: seed_spec
            .as_ref()
            .map(|t| t.description.clone())
            .unwrap_or_default(),
        proposal: None,
        diagnosis: None,
        reflection_tokens: 0,
        validation: None,
        verdict: String::new(),
        wall_s: 0.0,
    };
    let Some(seed_spec) = seed_spec else {
        summary.verdict = "no_failures".into();
        summary.wall_s = started.elapsed().as_secs_f64();
        return Ok(summary);
    };
    if examples.is_empty() {
        summary.verdict = "no_failures".into();
        summary.wall_s = started.elapsed().as_secs_f64();
        return Ok(summary);
    }
    let request = ReflectionRequest {
        target: None,
        tool: cfg.tool.clone(),
        current_description: seed_spec.description.clone(),
        input_schema: (*seed_spec.input_schema).clone(),
        goal: match cfg.objective {
            Objective::TaskSuccess => Goal::TaskSuccess,
            Objective::SelectionRate => Goal::Selection,
            Objective::Routing => Goal::Routing,
        },
        examples,
        options: ReflectionOptions {
            max_examples: cfg.max_examples,
            seed: cfg.seed,
            ..ReflectionOptions::default()
        },
    };
    let proposal = match reflect(models.reflector.as_ref(), &request).await {
        Ok(p) => p,
        Err(tooltune_reflection::ReflectionError::Model { partial, .. }) => *partial,
        Err(e) => return Err(DriverError::Config(e.to_string())),
    };
    store
        .save_proposal(
            run_id,
            &format!("from-traces:{}", cfg.tool),
            &serde_json::to_string(&proposal).unwrap_or_default(),
        )
        .await?;
    summary.reflection_tokens = proposal.total_tokens();
    summary.diagnosis = proposal.diagnosis.clone();
    summary.proposal = proposal.description.clone();
    let Some(v2) = proposal.description.clone() else {
        summary.verdict = "proposal_failed".into();
        summary.wall_s = started.elapsed().as_secs_f64();
        return Ok(summary);
    };
    let (Some(suite), Some(server), Some(tools)) = (&suite, &server, &server_tools) else {
        summary.verdict = "unvalidated".into();
        summary.wall_s = started.elapsed().as_secs_f64();
        return Ok(summary);
    };
    let seed_desc: BTreeMap<String, String> = tools
        .iter()
        .map(|t| (t.name.clone(), t.description.clone()))
        .collect();
    let mut v2_desc = seed_desc.clone();
    v2_desc.insert(cfg.tool.clone(), v2);
    let eval = |descriptions: BTreeMap<String, String>| {
        let key = candidate_key(&descriptions);
        async move {
            let opts = EvalOptions {
                split: Some(Split::Test),
                target: Some(cfg.tool.clone()),
                mode: Mode::Full,
                run_id: Some(run_id.to_string()),
                candidate_id: Some(key),
                host: tooltune_evaluator::host::HostConfig {
                    seed: Some(cfg.seed),
                    ..Default::default()
                },
                ..EvalOptions::default()
            };
            evaluate(
                suite,
                server,
                models.agent.as_ref(),
                Some(store),
                &Candidate { descriptions },
                &opts,
                |_, _| {},
            )
            .await
        }
    };
    let seed_r = eval(seed_desc).await?;
    let v2_r = eval(v2_desc).await?;
    let a = facts_of(&seed_r.tasks, &cfg.tool)?;
    let b = facts_of(&v2_r.tasks, &cfg.tool)?;
    let mean = |facts: &[RolloutFacts]| {
        let scores = per_task_scores(cfg.objective, facts);
        scores.values().sum::<f64>() / scores.len().max(1) as f64
    };
    let validation = Validation {
        suite: suite.name.clone(),
        comparison: compare(&a, &b, cfg.objective, cfg.seed)?,
        seed_mean: mean(&a),
        proposal_mean: mean(&b),
    };
    summary.verdict = if validation.proposal_mean > validation.seed_mean {
        "improved".into()
    } else {
        "not_better".into()
    };
    summary.validation = Some(validation);
    summary.wall_s = started.elapsed().as_secs_f64();
    Ok(summary)
}
