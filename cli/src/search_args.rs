//! Options shared by `optimize` and `demo`: the seed candidate's descriptions, and how proposals are screened.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tooltune_objectives::Objective;
use tooltune_optimizer::Screening;

/// How the search starts and screens.
#[derive(Debug, Clone, Args)]
pub struct SearchArgs {
    /// Start from this description instead of the server's: TOOL=TEXT (repeatable).
    #[arg(long = "override", value_name = "TOOL=TEXT")]
    pub overrides: Vec<String>,
    /// Start from the descriptions in this JSON file, keyed by tool name (what `optimize --export` writes).
    #[arg(long = "overrides", value_name = "FILE")]
    pub overrides_file: Option<PathBuf>,
    /// Proposals per reflection; all are screened (exact first moves, no rollouts) and the best goes on.
    #[arg(long, default_value_t = 4)]
    pub proposals: usize,
    /// GEPA as published: one proposal per reflection, no screening, every evaluation rolled out.
    #[arg(long)]
    pub no_screen: bool,
    /// Task success: a proposal whose mean screen falls more than this below its parent's is not rolled out.
    #[arg(long, default_value_t = 0.02)]
    pub screen_margin: f64,
    /// Screen proposals on their minibatch only: not also on the validation split (selection, routing) or on a
    /// fixed sample of training tasks (task success). Cheaper, less reliable.
    #[arg(long)]
    pub screen_minibatch_only: bool,
    /// With several tools under study, rewrite one tool a reflection, in turn (GEPA's rotation), instead of
    /// spreading each reflection's proposals over the tools and letting the screen choose.
    #[arg(long)]
    pub in_turn: bool,
    /// Task success: training tasks screened beside each minibatch, the same ones for the whole search.
    #[arg(long, default_value_t = Screening::DEFAULT_SAMPLE)]
    pub screen_sample: usize,
    /// Budget in screened task evaluations (one candidate's exact first moves on one task) [default: 1500 for
    /// `optimize`, 90 for `demo`, whose two searches and held-out rollouts must fit a class period].
    #[arg(long)]
    pub max_screened: Option<u64>,
    /// Compare candidates on this many validation tasks, a fixed sample balanced across owner tools, instead of
    /// the whole validation split [default: the whole split for `optimize`, 8 for `demo`].
    #[arg(long)]
    pub validation_sample: Option<usize>,
    /// Roll out this many held-out tasks, a fixed sample balanced across owner tools, and screen the rest (exact
    /// first moves): task success is measured on the sample, selection and routing on every test task
    /// [default: the whole split for `optimize`, 16 for `demo`].
    #[arg(long)]
    pub test_sample: Option<usize>,
}

impl SearchArgs {
    /// The search's screening under `objective`: decisive for selection and routing (their screen is exact),
    /// a gate before rollouts for task success.
    pub fn screening(&self, objective: Objective) -> Option<Screening> {
        (!self.no_screen).then(|| {
            let mut s =
                Screening::for_objective(objective != Objective::TaskSuccess, self.proposals);
            s.margin = self.screen_margin;
            s.spread = !self.in_turn;
            if self.screen_minibatch_only {
                s.on_validation = false;
                s.sample = 0;
            } else if !s.decisive {
                s.sample = self.screen_sample;
            }
            s
        })
    }

    /// The screened-evaluation budget: the one given, else `default`; none without screening.
    pub fn screen_budget(&self, default: u64) -> Option<u64> {
        (!self.no_screen).then(|| self.max_screened.unwrap_or(default))
    }

    /// The seed candidate's replaced descriptions.
    pub fn seed_overrides(&self) -> Result<BTreeMap<String, String>> {
        parse_overrides(&self.overrides, self.overrides_file.as_deref())
    }
}

/// Descriptions from `--overrides FILE` then `--override TOOL=TEXT` (which wins for the same tool).
pub fn parse_overrides(inline: &[String], file: Option<&Path>) -> Result<BTreeMap<String, String>> {
    let mut descriptions = BTreeMap::new();
    if let Some(file) = file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading --overrides {}", file.display()))?;
        let map: BTreeMap<String, String> = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: expected a JSON object of tool name -> description",
                file.display()
            )
        })?;
        descriptions.extend(map);
    }
    for o in inline {
        let Some((tool, text)) = o.split_once('=') else {
            bail!("--override {o:?}: expected TOOL=TEXT");
        };
        if tool.trim().is_empty() {
            bail!("--override {o:?}: the tool name is empty");
        }
        descriptions.insert(tool.trim().to_string(), text.to_string());
    }
    Ok(descriptions)
}
