//! `tooltune traces label`: verdicts for logged runs whose producer wrote no outcome, from the evidence the log
//! holds (heuristics) and, with `--judge`, from a grader model. Labels go to their own table, apart from the
//! producer's outcomes, which stay as they were; `traces stats` and `optimize --from-traces` use or ignore them.

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;
use tooltune_core::Trajectory;
use tooltune_core::text::one_line;
use tooltune_reflection::heuristics::{self, HEURISTICS_VERSION};
use tooltune_reflection::judge::{JudgeOptions, Judgement, judge_many};
use tooltune_store::{LabelSource, NewLabel, Store, ToLabel};

/// Arguments of `tooltune traces label`.
#[derive(Debug, Args)]
pub struct LabelArgs {
    /// Only trajectories that showed this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only trajectories ingested at or after this (YYYY-MM-DD or RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Also ask a grader model: local (1.5B), local:fast (0.5B) or openai:MODEL@BASE_URL. `--judge` alone: the
    /// config file's reflector, else local.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    judge: Option<String>,
    /// Environment variable holding the API key of an OpenAI-compatible judge.
    #[arg(long)]
    api_key_env: Option<String>,
    /// Also label trajectories whose producer wrote an outcome (it stays as it is; the labels are stored beside
    /// it), and print how often the labels agree with it: a way to measure a judge on runs whose outcome is known.
    #[arg(long)]
    with_outcome: bool,
    /// With --judge: skip trajectories this judge model has labelled already.
    #[arg(long)]
    only_new: bool,
    /// Label at most this many trajectories, newest first.
    #[arg(long, default_value_t = 1000)]
    limit: u64,
    /// Runs sent to the judge together (the local model decodes them as one batch).
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `--since` as the store compares it (text order of RFC 3339 times): a date or a time, nothing else.
fn check_since(s: &str) -> Result<()> {
    let b = s.as_bytes();
    let date = b.len() >= 10
        && b[..10].iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        });
    if !date || (b.len() > 10 && b[10] != b'T' && b[10] != b' ') {
        bail!(
            "--since {s}: expected a date YYYY-MM-DD or an RFC 3339 time such as 2026-12-01T00:00:00Z"
        );
    }
    Ok(())
}

/// A label as printed for one trajectory.
#[derive(Debug, Serialize)]
struct Shown {
    success: Option<bool>,
    score: Option<f64>,
    feedback: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Labels against the producer's outcome, on the trajectories that have both.
#[derive(Debug, Default, Serialize)]
struct Confusion {
    /// label success, outcome success
    label_yes_outcome_yes: u64,
    label_yes_outcome_no: u64,
    label_no_outcome_yes: u64,
    label_no_outcome_no: u64,
    /// Trajectories with an outcome but no label from this source (an unparsable judge reply).
    unlabelled: u64,
}

impl Confusion {
    fn add(&mut self, label: Option<bool>, outcome: bool) {
        match (label, outcome) {
            (Some(true), true) => self.label_yes_outcome_yes += 1,
            (Some(true), false) => self.label_yes_outcome_no += 1,
            (Some(false), true) => self.label_no_outcome_yes += 1,
            (Some(false), false) => self.label_no_outcome_no += 1,
            (None, _) => self.unlabelled += 1,
        }
    }
    fn n(&self) -> u64 {
        self.label_yes_outcome_yes
            + self.label_yes_outcome_no
            + self.label_no_outcome_yes
            + self.label_no_outcome_no
    }
    fn agreement(&self) -> Option<f64> {
        let n = self.n();
        (n > 0).then(|| (self.label_yes_outcome_yes + self.label_no_outcome_no) as f64 / n as f64)
    }
    fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["n"] = json!(self.n());
        v["agreement"] = json!(self.agreement());
        v
    }
    fn print(&self, name: &str) {
        println!(
            "{name} vs the producer's outcome ({} runs{}):",
            self.n(),
            if self.unlabelled > 0 {
                format!(", {} without a label", self.unlabelled)
            } else {
                String::new()
            }
        );
        println!("  {:<16} {:>12} {:>12}", "", "outcome: yes", "outcome: no");
        println!(
            "  {:<16} {:>12} {:>12}",
            format!("{name}: yes"),
            self.label_yes_outcome_yes,
            self.label_yes_outcome_no
        );
        println!(
            "  {:<16} {:>12} {:>12}",
            format!("{name}: no"),
            self.label_no_outcome_yes,
            self.label_no_outcome_no
        );
        if let Some(a) = self.agreement() {
            println!("  agreement {:.2}", a);
        }
    }
}

pub async fn run(db: &str, config: Option<&Path>, args: LabelArgs) -> Result<ExitCode> {
    if let Some(s) = &args.since {
        check_since(s)?;
    }
    if args.batch == 0 {
        bail!("--batch 0: the judge needs at least one run per request batch");
    }
    let store = Store::open(db).await?;
    if let Some(tool) = &args.tool
        && store.tool_stats(Some(tool)).await?.is_empty()
    {
        bail!(
            "--tool {tool}: no stored trajectory showed this tool; `tooltune traces stats` lists the tools in the \
             store"
        );
    }
    let chosen = store
        .trajectories_to_label(
            args.tool.as_deref(),
            args.since.as_deref(),
            args.with_outcome,
            args.limit,
        )
        .await?;
    let mut runs: Vec<(ToLabel, Trajectory)> = Vec::with_capacity(chosen.len());
    for c in chosen {
        let t = store
            .trajectory(&c.id)
            .await?
            .with_context(|| format!("trajectory {} vanished while labelling", c.id))?;
        runs.push((c, t));
    }
    let scope = format!(
        "{}{}",
        args.tool
            .as_ref()
            .map(|t| format!(" that showed `{t}`"))
            .unwrap_or_default(),
        args.since
            .as_ref()
            .map(|s| format!(" ingested since {s}"))
            .unwrap_or_default()
    );
    if runs.is_empty() {
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"selected": 0, "trajectories": []}))?
            );
        } else {
            println!(
                "no trajectories{scope} {}: nothing to label",
                if args.with_outcome {
                    "in the store"
                } else {
                    "without a producer's outcome"
                }
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !args.json {
        eprintln!(
            "labelling {} trajectories{scope}{}",
            runs.len(),
            if args.with_outcome {
                " (with or without a producer's outcome)"
            } else {
                " without a producer's outcome"
            }
        );
    }

    // Heuristics: cheap, every run, stored in one transaction.
    let heur: Vec<heuristics::HeuristicLabel> =
        runs.iter().map(|(_, t)| heuristics::label(t)).collect();
    let new: Vec<NewLabel> = runs
        .iter()
        .zip(&heur)
        .map(|((c, _), h)| NewLabel {
            trajectory_id: c.id.to_string(),
            source: LabelSource::Heuristic,
            model: String::new(),
            score: h.score,
            success: h.success,
            feedback: h.feedback.clone(),
            detail: Some(json!({"version": HEURISTICS_VERSION, "rules": h.hits}).to_string()),
        })
        .collect();
    store
        .save_labels(&new)
        .await
        .context("storing the heuristic labels")?;
    let mut rule_counts: BTreeMap<&str, u64> = BTreeMap::new();
    for h in &heur {
        for hit in &h.hits {
            *rule_counts.entry(hit.rule.as_str()).or_default() += 1;
        }
    }
    let heur_failed = heur.iter().filter(|h| !h.success).count();

    // The judge, in batches, each stored as soon as it is read so an interrupted run keeps what it did.
    let mut judged: Vec<Option<Judgement>> = runs.iter().map(|_| None).collect();
    let mut judge_summary = serde_json::Value::Null;
    if let Some(given) = &args.judge {
        let spec_text = if given.is_empty() {
            crate::llm_config::resolve(config, None, None)?.1
        } else {
            given.clone()
        };
        let spec = crate::llm_config::spec(&spec_text, args.api_key_env.as_deref())
            .with_context(|| format!("--judge {spec_text}"))?;
        let model = tooltune_llm::build(&spec)
            .await
            .with_context(|| format!("--judge {spec_text}: cannot start the judge model"))?;
        let model_id = model.id();
        let mut todo: Vec<usize> = Vec::new();
        for (i, (c, _)) in runs.iter().enumerate() {
            if args.only_new
                && store
                    .labels(&c.id)
                    .await?
                    .iter()
                    .any(|l| l.label.source == LabelSource::Judge && l.label.model == model_id)
            {
                continue;
            }
            todo.push(i);
        }
        let opts = JudgeOptions::default();
        let started = Instant::now();
        let mut done = 0usize;
        let (mut prompt_tokens, mut completion_tokens) = (0u64, 0u64);
        eprintln!(
            "judge {model_id}: {} runs in batches of {}{}",
            todo.len(),
            args.batch,
            if todo.len() < runs.len() {
                format!(" ({} already labelled by it)", runs.len() - todo.len())
            } else {
                String::new()
            }
        );
        for chunk in todo.chunks(args.batch) {
            let ts: Vec<&Trajectory> = chunk.iter().map(|&i| &runs[i].1).collect();
            let out = judge_many(model.as_ref(), &ts, &opts)
                .await
                .with_context(|| format!("--judge {spec_text}"))?;
            let mut labels = Vec::new();
            for (&i, j) in chunk.iter().zip(out) {
                prompt_tokens += j.usage.prompt_tokens;
                completion_tokens += j.usage.completion_tokens;
                if let Some(v) = &j.verdict {
                    labels.push(NewLabel {
                        trajectory_id: runs[i].0.id.to_string(),
                        source: LabelSource::Judge,
                        model: model_id.clone(),
                        score: v.score,
                        success: v.success,
                        feedback: if v.feedback.is_empty() {
                            "(the judge gave no reason)".to_string()
                        } else {
                            v.feedback.clone()
                        },
                        detail: Some(
                            json!({"template_version": j.template_version, "attempts": j.attempts})
                                .to_string(),
                        ),
                    });
                }
                judged[i] = Some(j);
            }
            store
                .save_labels(&labels)
                .await
                .context("storing the judge's labels")?;
            done += chunk.len();
            let elapsed = started.elapsed().as_secs_f64();
            let left = elapsed / done as f64 * (todo.len() - done) as f64;
            eprintln!(
                "judge: {done}/{} runs ({:.0} s, about {:.0} s left)",
                todo.len(),
                elapsed,
                left
            );
        }
        let verdicts: Vec<&Judgement> = judged.iter().flatten().collect();
        let labelled = verdicts.iter().filter(|j| j.verdict.is_some()).count();
        let succeeded = verdicts
            .iter()
            .filter(|j| j.verdict.as_ref().is_some_and(|v| v.success))
            .count();
        let backend = verdicts
            .iter()
            .filter(|j| {
                j.verdict.is_none() && j.error.as_deref().is_some_and(|e| e.starts_with("backend"))
            })
            .count();
        judge_summary = json!({
            "model": model_id,
            "asked": verdicts.len(),
            "skipped_already_labelled": runs.len() - todo.len(),
            "labelled": labelled,
            "success": succeeded,
            "failure": labelled - succeeded,
            "unparsable": verdicts.len() - labelled - backend,
            "backend_errors": backend,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "wall_s": started.elapsed().as_secs_f64(),
        });
    }

    // Agreement with the producer's outcome, where there is one.
    let mut agree_h = Confusion::default();
    let mut agree_j = Confusion::default();
    for (i, (c, _)) in runs.iter().enumerate() {
        if let Some(outcome) = c.producer_success {
            agree_h.add(Some(heur[i].success), outcome);
            if let Some(j) = &judged[i] {
                agree_j.add(j.verdict.as_ref().map(|v| v.success), outcome);
            }
        }
    }
    let with_outcomes = runs.iter().any(|(c, _)| c.producer_success.is_some());

    let rows: Vec<serde_json::Value> = runs
        .iter()
        .enumerate()
        .map(|(i, (c, t))| {
            let h = &heur[i];
            let j = judged[i].as_ref().map(|j| Shown {
                success: j.verdict.as_ref().map(|v| v.success),
                score: j.verdict.as_ref().and_then(|v| v.score),
                feedback: j.verdict.as_ref().map(|v| v.feedback.clone()),
                error: j.error.clone(),
            });
            json!({
                "id": c.id.as_str(),
                "task": t.task,
                "producer_success": c.producer_success,
                "heuristic": Shown {
                    success: Some(h.success),
                    score: h.score,
                    feedback: Some(h.feedback.clone()),
                    error: None,
                },
                "judge": j,
            })
        })
        .collect();

    if args.json {
        let mut out = json!({
            "selected": runs.len(),
            "heuristic": {
                "version": HEURISTICS_VERSION,
                "labelled": heur.len(),
                "failed": heur_failed,
                "no_failure_evidence": heur.len() - heur_failed,
                "rules": rule_counts,
            },
            "judge": judge_summary,
            "trajectories": rows,
        });
        if with_outcomes {
            out["agreement"] = json!({
                "heuristic": agree_h.to_json(),
                "judge": if args.judge.is_some() { agree_j.to_json() } else { serde_json::Value::Null },
            });
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }

    for row in &rows {
        let id = row["id"].as_str().unwrap_or("");
        let h = &row["heuristic"];
        let mut line = format!(
            "{}  heuristic: {}",
            &id[..id.len().min(12)],
            if h["success"] == true {
                "ok".to_string()
            } else {
                format!(
                    "FAIL ({})",
                    one_line(h["feedback"].as_str().unwrap_or(""), 70)
                )
            }
        );
        if !row["judge"].is_null() {
            let j = &row["judge"];
            match j["success"].as_bool() {
                Some(s) => line.push_str(&format!(
                    "  judge: {}{} {}",
                    if s { "ok" } else { "FAIL" },
                    j["score"]
                        .as_f64()
                        .map(|x| format!(" {x:.2}"))
                        .unwrap_or_default(),
                    one_line(j["feedback"].as_str().unwrap_or(""), 60)
                )),
                None => line.push_str(&format!(
                    "  judge: no label ({})",
                    one_line(j["error"].as_str().unwrap_or(""), 60)
                )),
            }
        }
        if let Some(o) = row["producer_success"].as_bool() {
            line.push_str(if o {
                "  [outcome: ok]"
            } else {
                "  [outcome: FAIL]"
            });
        }
        println!("{line}");
    }
    println!(
        "heuristics ({HEURISTICS_VERSION}): {} labelled, {} failed ({}), {} with no failure evidence",
        heur.len(),
        heur_failed,
        if rule_counts.is_empty() {
            "no rule fired".to_string()
        } else {
            rule_counts
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        heur.len() - heur_failed
    );
    if !judge_summary.is_null() {
        let s = &judge_summary;
        println!(
            "judge {}: {} asked, {} labelled ({} success, {} failure), {} unparsable, {} backend errors, {:.0} s",
            s["model"].as_str().unwrap_or(""),
            s["asked"],
            s["labelled"],
            s["success"],
            s["failure"],
            s["unparsable"],
            s["backend_errors"],
            s["wall_s"].as_f64().unwrap_or(0.0)
        );
    }
    if with_outcomes {
        agree_h.print("heuristic");
        if args.judge.is_some() {
            agree_j.print("judge");
        }
    }
    println!(
        "labels are stored apart from the producers' outcomes; `tooltune traces stats` and `optimize --from-traces` \
         use them where no outcome was written (--labels ignore to leave them out)"
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_date_or_a_time_and_names_the_bad_value() {
        assert!(check_since("2026-12-01").is_ok());
        assert!(check_since("2026-12-01T10:00:00Z").is_ok());
        let e = check_since("01/12/2026").expect_err("bad").to_string();
        assert!(
            e.starts_with("--since 01/12/2026: expected a date YYYY-MM-DD"),
            "{e}"
        );
        assert!(check_since("2026-12-01x").is_err());
    }

    #[test]
    fn agreement_counts_only_runs_with_both() {
        let mut c = Confusion::default();
        c.add(Some(true), true);
        c.add(Some(false), true);
        c.add(Some(false), false);
        c.add(None, false);
        assert_eq!(c.n(), 3);
        assert_eq!(c.unlabelled, 1);
        assert_eq!(c.agreement(), Some(2.0 / 3.0));
    }
}
