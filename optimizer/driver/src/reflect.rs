//! Reflection: the failures (or screened first moves) of a candidate written up as the reflector's examples, the
//! waves of proposals, and what the search is told about them.

use super::*;

impl Ctx<'_> {
    /// The reflective dataset of `parent_descriptions` on `tasks`: its rollouts' trajectories, or, when the
    /// search runs on screens alone, each task's exact first moves written up as a one-step run.
    pub(crate) async fn reflective_examples(
        &self,
        parent_descriptions: &Descriptions,
        tasks: &[String],
    ) -> Result<Vec<ReflectiveExample>, DriverError> {
        if self.decisive() {
            return self.screen_examples(parent_descriptions, tasks).await;
        }
        let mut examples = Vec::new();
        let results = self.results(parent_descriptions, tasks).await?;
        for r in &results {
            let Some(id) = &r.trajectory_id else { continue };
            let Some(trajectory) = self
                .store
                .trajectory(&TrajectoryId::from_stored(id.clone()))
                .await?
            else {
                continue;
            };
            examples.push(ReflectiveExample {
                task: trajectory.task.clone(),
                owner: r.owner.clone(),
                trajectory,
                success: r.success,
                feedback: r.feedback.clone(),
            });
        }
        Ok(examples)
    }

    /// Each of `tasks` screened under `parent_descriptions` (exact first moves, from the cache when made before)
    /// and written up as a one-step run.
    async fn screen_examples(
        &self,
        parent_descriptions: &Descriptions,
        tasks: &[String],
    ) -> Result<Vec<ReflectiveExample>, DriverError> {
        let screens = self.screens(parent_descriptions, tasks).await?;
        let shown = EvalCandidate {
            descriptions: parent_descriptions.clone(),
        }
        .apply(&self.server_tools)
        .map_err(DriverError::Eval)?;
        let mut examples = Vec::new();
        for t in tasks {
            let (Some(r), Some(task)) =
                (screens.get(t), self.suite.tasks.iter().find(|x| &x.id == t))
            else {
                continue;
            };
            examples.extend(screen_example(r, &task.prompt, &shown));
        }
        Ok(examples)
    }

    /// Runs reflection requests together, decoded as one batch (see [`gather`]).
    pub(crate) async fn reflect_wave(
        &self,
        requests: Vec<ReflectionRequest>,
    ) -> Result<Vec<tooltune_reflection::Proposal>, DriverError> {
        let gather = gather::Gather::new(self.models.reflector.as_ref(), requests.len());
        let gather = &gather;
        let runs = requests.iter().map(|req| async move {
            let r = reflect(gather, req).await;
            gather.leave().await;
            r
        });
        let mut proposals = Vec::with_capacity(requests.len());
        for r in futures::future::join_all(runs).await {
            proposals.push(match r {
                Ok(p) => p,
                // A backend failure mid-way still yields the attempts made so far: recorded as a failed proposal.
                Err(tooltune_reflection::ReflectionError::Model { partial, .. }) => *partial,
                Err(e) => return Err(DriverError::Config(e.to_string())),
            });
        }
        Ok(proposals)
    }

    /// Asks the reflector for `k` new descriptions, decoded together, of `tools` (name and current text): one
    /// tool, or the tools a spread reflection covers, proposal `i` rewriting `tools[proposal_tool(i)]`. With
    /// `k > 1` they alternate between the two styles of [`Style`]: even ones are shown whole runs of the
    /// minibatch, odd ones list the minibatch and `evidence` (the search's screen sample) a question a line with
    /// the parent's screened first move; the first of each style for each tool is greedy, the others sampled.
    /// Stored under (parent, tools, minibatch, k) before the search sees them, so a resumed run gets the same
    /// proposals back.
    pub(crate) async fn reflect_action(
        &self,
        parent_descriptions: &Descriptions,
        parent: u32,
        tools: &[(String, String)],
        tasks: &[String],
        evidence: &[String],
        k: usize,
    ) -> Result<Vec<(String, tooltune_reflection::Proposal)>, DriverError> {
        let k = k.max(1);
        let n = tools.len().max(1);
        let names: Vec<&str> = tools.iter().map(|(t, _)| t.as_str()).collect();
        let joined = names.join("+");
        // `s`: the styles alternate (a proposal stored before they did was all `Runs` and is not reused). A
        // spread reflection's key names every tool, so it never meets an unspread one's.
        let key = if k == 1 {
            format!("c{parent}:{joined}:{}", tasks.join(","))
        } else {
            format!("c{parent}:{joined}:{}:k{k}s", tasks.join(","))
        };
        let for_tool = |i: usize| tools[tooltune_optimizer::proposal_tool(i, n)].0.clone();
        if let Some(stored) = self.store.proposal(&self.run_id, &key).await? {
            let corrupt = |e: serde_json::Error| DriverError::Corrupt {
                run: self.run_id.clone(),
                what: "proposal",
                message: e.to_string(),
            };
            let proposals: Vec<tooltune_reflection::Proposal> = if k == 1 {
                vec![serde_json::from_str(&stored).map_err(corrupt)?]
            } else {
                serde_json::from_str(&stored).map_err(corrupt)?
            };
            return Ok(proposals
                .into_iter()
                .enumerate()
                .map(|(i, p)| (for_tool(i), p))
                .collect());
        }
        self.emit(Event::Reflecting {
            parent,
            tool: names.join(", "),
        })
        .await?;
        let examples = self.reflective_examples(parent_descriptions, tasks).await?;
        // The questions a scope proposal lists: the minibatch and the screen sample, as screened first moves. The
        // gate screens the parent on exactly these tasks, so this adds no model time (the screens are cached).
        let extra: Vec<String> = evidence
            .iter()
            .filter(|t| !tasks.contains(t))
            .cloned()
            .collect();
        let scope_examples = if k <= 1 {
            Vec::new()
        } else if extra.is_empty() && self.decisive() {
            // The minibatch's screens are the examples already made above.
            examples.clone()
        } else {
            let all: Vec<String> = tasks.iter().cloned().chain(extra).collect();
            self.screen_examples(parent_descriptions, &all).await?
        };
        let schema = |tool: &str| {
            self.server_tools
                .iter()
                .find(|t| t.name == tool)
                .map(|t| (*t.input_schema).clone())
                .unwrap_or_default()
        };
        // With several proposals, each is asked once: a retry (the reply's fault named, a new reply decoded) costs
        // a decode round as long as the first, and it was paid whenever any one of the k failed, which at the
        // 1.5B's parse rate (about half) was nearly always; the screen needs only one usable proposal. Retries
        // come back, for one proposal, only when the whole first wave failed.
        let request = |i: usize, max_attempts: usize| {
            let (tool, current) = &tools[tooltune_optimizer::proposal_tool(i, n)];
            let scope = k > 1 && i % 2 == 1 && !scope_examples.is_empty();
            ReflectionRequest {
                tool: tool.clone(),
                current_description: current.clone(),
                input_schema: schema(tool),
                goal: match self.cfg.objective {
                    Objective::TaskSuccess => Goal::TaskSuccess,
                    Objective::SelectionRate => Goal::Selection,
                    Objective::Routing => Goal::Routing,
                },
                target: (*tool != self.cfg.target).then(|| self.cfg.target.clone()),
                examples: if scope {
                    scope_examples.clone()
                } else {
                    examples.clone()
                },
                options: ReflectionOptions {
                    style: if scope { Style::Scope } else { Style::Runs },
                    seed: self.cfg.seed.wrapping_add(1000 * i as u64),
                    // The first proposal of each style for each tool is the greedy one; the others are samples.
                    temperature: if i < 2 * n { 0.0 } else { 0.8 },
                    max_attempts,
                    ..ReflectionOptions::default()
                },
            }
        };
        let first_wave = if k == 1 {
            ReflectionOptions::default().max_attempts
        } else {
            1
        };
        let mut proposals = self
            .reflect_wave((0..k).map(|i| request(i, first_wave)).collect())
            .await?;
        if k > 1 && !proposals.iter().any(|p| p.succeeded()) {
            // A fresh sample (not the greedy reply again) with its retries, as proposal `k` (so its tool is the
            // one `proposal_tool` gives the stored proposal's place); sampled even where `k < 2n` would make
            // that place a greedy one.
            let mut retry = request(k, ReflectionOptions::default().max_attempts);
            retry.options.temperature = 0.8;
            proposals.extend(self.reflect_wave(vec![retry]).await?);
        }
        let stored = if k == 1 {
            serde_json::to_string(&proposals[0])
        } else {
            serde_json::to_string(&proposals)
        };
        self.store
            .save_proposal(&self.run_id, &key, &stored.unwrap_or_default())
            .await?;
        let proposals: Vec<(String, tooltune_reflection::Proposal)> = proposals
            .into_iter()
            .enumerate()
            .map(|(i, p)| (for_tool(i), p))
            .collect();
        for (tool, proposal) in &proposals {
            let error = (!proposal.succeeded()).then(|| proposal_error(proposal));
            self.emit(Event::Proposed {
                parent,
                tool: tool.clone(),
                description: proposal.description.clone(),
                diagnosis: proposal.diagnosis.clone(),
                error,
            })
            .await?;
        }
        Ok(proposals)
    }
}

/// Why a proposal gave no description.
pub(crate) fn proposal_error(p: &tooltune_reflection::Proposal) -> String {
    p.attempts
        .last()
        .and_then(|a| a.error.clone())
        .unwrap_or_else(|| "no usable reply".to_string())
}

/// A screened task written up as a one-step run for the reflector: the most likely first move (a call without
/// arguments, or an answer without a tool) and, as the checks' feedback, the exact probabilities of every move.
fn screen_example(r: &TaskResult, prompt: &str, shown: &[ToolSpec]) -> Option<ReflectiveExample> {
    let probs = r.first_call_probabilities.clone().unwrap_or_default();
    let no_call = r.no_call_probability.unwrap_or(0.0);
    let mut moves: Vec<String> = probs.iter().map(|(t, p)| format!("{t} {p:.2}")).collect();
    moves.push(format!("no tool {no_call:.2}"));
    let right = r.owner.clone().unwrap_or_else(|| "no tool".to_string());
    let routed =
        tooltune_objectives::routed(r.owner.as_deref(), r.called.first().map(String::as_str));
    let feedback = format!(
        "first move probabilities: {}; the right first move: {right}",
        moves.join(", ")
    );
    let step = match r.called.first() {
        Some(t) => {
            serde_json::json!({"type": "model", "tool_calls": [{"name": t, "arguments": {}}]})
        }
        None => serde_json::json!({"type": "model", "content": "(answers without a tool)"}),
    };
    let trajectory: tooltune_core::Trajectory = serde_json::from_value(serde_json::json!({
        "task": prompt,
        "tools": shown,
        "steps": [step],
        "outcome": {"success": routed, "score": if routed { 1.0 } else { 0.0 }, "feedback": feedback},
    }))
    .ok()?;
    Some(ReflectiveExample {
        task: prompt.to_string(),
        owner: r.owner.clone(),
        trajectory,
        success: routed,
        feedback,
    })
}
