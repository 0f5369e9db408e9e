//! `tooltune rewrite`: the baseline a user would try before a search. Each tool's description is rewritten once by
//! the reflector from a good prompt (what it does, when to use it, when not, what it returns) without any evidence;
//! with `--best-of K`, K such rewrites of the whole set are made (the first greedy, the rest sampled) and the one
//! whose exact routing on the training split is highest is kept. The result is written in the `--overrides` shape
//! that `eval` and `optimize` read, so it can be measured on held-out tasks like any search winner.

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, Mode, evaluate};
use tooltune_evaluator::{Split, Suite};
use tooltune_reflection::dataset::ShownTool;
use tooltune_reflection::rewrite::{RewriteOptions, RewriteRequest, rewrite_all};

/// Arguments of `tooltune rewrite`.
#[derive(Debug, Args)]
pub struct RewriteArgs {
    /// The task suite (TOML; a catalog suite or one with a server).
    #[arg(long)]
    suite: PathBuf,
    /// Rewrite only this tool (repeatable) [default: the suite's tools under study].
    #[arg(long = "tool", value_name = "TOOL")]
    tools: Vec<String>,
    /// Make K rewrites of the set (the first greedy, the others sampled at temperature 0.7) and keep the one with
    /// the highest exact routing on the training split (needs the local model as agent).
    #[arg(long, default_value_t = 1, value_name = "K")]
    best_of: u32,
    /// The agent's model, which scores the rewrites with --best-of [default: the config file's, else local]
    #[arg(long, env = "TOOLTUNE_AGENT")]
    model: Option<String>,
    /// The reflector's model, which writes them [default: the config file's, else local]
    #[arg(long, env = "TOOLTUNE_REFLECTOR")]
    reflector: Option<String>,
    /// Environment variable holding the API key of an OpenAI-compatible endpoint.
    #[arg(long)]
    api_key_env: Option<String>,
    /// Sampling seed of the sampled rewrites.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the chosen descriptions here, keyed by tool (the `--overrides` file of `eval` and `optimize`).
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// One rewrite of the set and, with --best-of, its training routing.
#[derive(Debug, serde::Serialize)]
struct Made {
    /// The descriptions that changed (a tool whose every reply was rejected keeps its text and is absent).
    descriptions: BTreeMap<String, String>,
    /// Tools whose replies were all rejected, with the last reason.
    rejected: BTreeMap<String, String>,
    /// Mean exact probability of the right first move on the training split.
    train_routing: Option<f64>,
    /// Reflector tokens spent on this set.
    tokens: u64,
}

pub async fn run(config: Option<&std::path::Path>, args: RewriteArgs) -> Result<ExitCode> {
    if args.best_of == 0 {
        bail!("--best-of 0: give at least 1");
    }
    let suite = Suite::load(&args.suite)?;
    let server = suite
        .connect()
        .await
        .with_context(|| format!("starting the suite's server ({})", args.suite.display()))?;
    let listed = server.list_tools().await?;
    suite.check_tool_names(&listed)?;
    let tools = suite.visible_tools(listed);
    let chosen: Vec<String> = if args.tools.is_empty() {
        suite.tools_under_study.clone()
    } else {
        args.tools.clone()
    };
    for t in &chosen {
        if !tools.iter().any(|s| &s.name == t) {
            bail!(
                "--tool {t}: not a tool of suite `{}` (it has: {})",
                suite.name,
                tools
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let (agent_spec, reflector_spec) =
        crate::llm_config::resolve(config, args.model.as_deref(), args.reflector.as_deref())?;
    let reflector = tooltune_llm::build(
        &crate::llm_config::spec(&reflector_spec, args.api_key_env.as_deref())
            .with_context(|| format!("--reflector {reflector_spec}"))?,
    )
    .await?;
    // The agent is loaded only to score several rewrites; with the same spec the reflector serves as agent.
    let agent = if args.best_of > 1 && agent_spec != reflector_spec {
        Some(
            tooltune_llm::build(
                &crate::llm_config::spec(&agent_spec, args.api_key_env.as_deref())
                    .with_context(|| format!("--model {agent_spec}"))?,
            )
            .await?,
        )
    } else {
        None
    };
    let requests: Vec<RewriteRequest> = chosen
        .iter()
        .filter_map(|name| {
            let t = tools.iter().find(|s| &s.name == name)?;
            Some(RewriteRequest {
                tool: t.name.clone(),
                current_description: t.description.clone(),
                input_schema: (*t.input_schema).clone(),
                other_tools: tools
                    .iter()
                    .filter(|o| o.name != t.name)
                    .map(|o| ShownTool {
                        name: o.name.clone(),
                        description: o.description.clone(),
                    })
                    .collect(),
            })
        })
        .collect();
    let bar = ProgressBar::new(u64::from(args.best_of));
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg} [{bar:30}] {pos}/{len} rewrites of the set ({elapsed}, about {eta} left)",
        )
        .unwrap_or(ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(format!("{} tools of {}", requests.len(), suite.name));
    let train: Vec<String> = suite.split(Split::Train).map(|t| t.id.clone()).collect();
    if args.best_of > 1 && train.is_empty() {
        bail!(
            "--best-of {}: suite `{}` has no training task to choose the best rewrite on",
            args.best_of,
            suite.name
        );
    }
    let mut made: Vec<Made> = Vec::new();
    for k in 0..args.best_of {
        let opts = RewriteOptions {
            // The first set is what asking once gives; the others are what asking again gives.
            temperature: if k == 0 { 0.0 } else { 0.7 },
            seed: args.seed.wrapping_add(u64::from(k) * 1000),
            ..RewriteOptions::default()
        };
        let proposals = rewrite_all(reflector.as_ref(), &requests, &opts).await?;
        let mut m = Made {
            descriptions: BTreeMap::new(),
            rejected: BTreeMap::new(),
            train_routing: None,
            tokens: proposals.iter().map(|p| p.total_tokens()).sum(),
        };
        for p in proposals {
            match p.description {
                Some(d) => {
                    m.descriptions.insert(p.tool, d);
                }
                None => {
                    let why = p
                        .attempts
                        .last()
                        .and_then(|a| a.error.clone())
                        .unwrap_or_default();
                    m.rejected.insert(p.tool, why);
                }
            }
        }
        if args.best_of > 1 {
            let scorer = agent.as_ref().unwrap_or(&reflector);
            let r = evaluate(
                &suite,
                &server,
                scorer.as_ref(),
                None,
                &Candidate {
                    descriptions: m.descriptions.clone(),
                },
                &EvalOptions {
                    split: Some(Split::Train),
                    mode: Mode::SelectionOnly,
                    ..EvalOptions::default()
                },
                |_, _| {},
            )
            .await?;
            m.train_routing = r.expected_routing;
        }
        made.push(m);
        bar.inc(1);
    }
    bar.finish_and_clear();
    server.shutdown().await;
    // Ties keep the earlier set, so with K = 1 (or equal scores) the greedy rewrite is the one kept.
    let best = (0..made.len())
        .max_by(|&a, &b| {
            let s = |i: usize| made[i].train_routing.unwrap_or(f64::NEG_INFINITY);
            s(a).total_cmp(&s(b)).then(b.cmp(&a))
        })
        .unwrap_or(0);
    if let Some(path) = &args.export {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&made[best].descriptions)? + "\n",
        )
        .with_context(|| format!("--export {}", path.display()))?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "suite": suite.name,
                "reflector": reflector.id(),
                "best": best,
                "sets": made,
            }))?
        );
    } else {
        for (i, m) in made.iter().enumerate() {
            let mark = if i == best { "*" } else { " " };
            let score = m
                .train_routing
                .map(|r| format!("train routing {r:.3}, "))
                .unwrap_or_default();
            println!(
                "{mark} set {i}: {score}{} rewritten, {} rejected, {} tokens",
                m.descriptions.len(),
                m.rejected.len(),
                m.tokens
            );
        }
        println!();
        for (tool, d) in &made[best].descriptions {
            println!("{tool}: {d}");
        }
        for (tool, why) in &made[best].rejected {
            println!("{tool}: (kept its text: every reply was rejected; last: {why})");
        }
        if let Some(path) = &args.export {
            println!(
                "\nwritten to {} (measure it: tooltune eval --suite {} --split test --overrides {})",
                path.display(),
                args.suite.display(),
                path.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
