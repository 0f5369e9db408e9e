//! Playing an evaluation: each task's result found in the store (this run's, or any run's under the same
//! content address) or played now, here or on workers; exact screens likewise; and the content addresses that
//! make "no rollout twice" hold.

use super::*;

impl Ctx<'_> {
    /// Results of `descriptions` on `tasks`, running only the rollouts not already stored: first this run's own
    /// rows, then the store's result cache (a rollout is a pure function of its key, see [`rollout_key`]), and
    /// only then the evaluator. Whatever is found or played is recorded under this run too.
    pub(crate) async fn results(
        &self,
        descriptions: &Descriptions,
        tasks: &[String],
    ) -> Result<Vec<TaskResult>, DriverError> {
        let key = candidate_key(descriptions);
        let mut have: BTreeMap<(String, i64), TaskResult> = BTreeMap::new();
        for row in self.store.rollouts(&self.run_id, &key).await? {
            let r: TaskResult = self.parse_result(&row.result, "rollout result")?;
            have.insert((row.task_id, row.rollout), r);
        }
        let candidate = EvalCandidate {
            descriptions: descriptions.clone(),
        };
        let world = self.world_key(descriptions);
        for rollout in 0..self.cfg.rollouts_per_task {
            let mut missing: Vec<String> = tasks
                .iter()
                .filter(|t| !have.contains_key(&((*t).clone(), i64::from(rollout))))
                .cloned()
                .collect();
            if missing.is_empty() {
                continue;
            }
            let keys: Vec<String> = missing
                .iter()
                .map(|t| self.task_key("rollout", &world, t, rollout))
                .collect();
            let cached = self.store.cached_results(&keys).await?;
            let mut still = Vec::new();
            for (t, k) in missing.iter().zip(&keys) {
                match cached.get(k) {
                    Some(c) => {
                        let r: TaskResult = self.parse_result(&c.result, "cached rollout")?;
                        self.store
                            .save_rollout(
                                &self.run_id,
                                &key,
                                t,
                                i64::from(rollout),
                                &c.result,
                                c.trajectory_id.as_deref(),
                            )
                            .await?;
                        have.insert((t.clone(), i64::from(rollout)), r);
                    }
                    None => still.push(t.clone()),
                }
            }
            missing = still;
            if missing.is_empty() {
                continue;
            }
            let opts = EvalOptions {
                task_ids: missing,
                target: Some(self.cfg.target.clone()),
                mode: Mode::Full,
                batch: self.cfg.batch,
                run_id: Some(self.run_id.clone()),
                candidate_id: Some(key.clone()),
                rollout,
                host: self.host(rollout),
                ..EvalOptions::default()
            };
            let played = self.play(&candidate, &opts, &world).await?;
            for r in played {
                let json = serde_json::to_string(&r).unwrap_or_default();
                self.store
                    .save_rollout(
                        &self.run_id,
                        &key,
                        &r.task_id,
                        i64::from(rollout),
                        &json,
                        r.trajectory_id.as_deref(),
                    )
                    .await?;
                // An infrastructure failure says nothing about the candidate: it is not worth keeping.
                if r.infra_failure.is_none() {
                    self.store
                        .cache_result(
                            &self.task_key("rollout", &world, &r.task_id, rollout),
                            "rollout",
                            &json,
                            r.trajectory_id.as_deref(),
                        )
                        .await?;
                }
                // The exact first moves scored before the rollout are this candidate's screen of the task.
                if rollout == 0
                    && let Some(screen) = r.first_move_only(&self.cfg.target)
                {
                    self.store
                        .cache_result(
                            &self.task_key("screen", &world, &r.task_id, 0),
                            "screen",
                            &serde_json::to_string(&screen).unwrap_or_default(),
                            None,
                        )
                        .await?;
                }
                have.insert((r.task_id.clone(), i64::from(rollout)), r);
            }
        }
        Ok(tasks
            .iter()
            .flat_map(|t| {
                (0..self.cfg.rollouts_per_task)
                    .filter_map(|r| have.get(&(t.clone(), i64::from(r))).cloned())
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    /// Exact first-move results (no rollouts) of `descriptions` on `tasks`, from the result cache where the
    /// same screen was made before (by any run), else from the evaluator in selection-only mode.
    pub(crate) async fn screens(
        &self,
        descriptions: &Descriptions,
        tasks: &[String],
    ) -> Result<HashMap<String, TaskResult>, DriverError> {
        let world = self.world_key(descriptions);
        let keys: Vec<String> = tasks
            .iter()
            .map(|t| self.task_key("screen", &world, t, 0))
            .collect();
        let cached = self.store.cached_results(&keys).await?;
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        for (t, k) in tasks.iter().zip(&keys) {
            match cached.get(k) {
                Some(c) => {
                    out.insert(t.clone(), self.parse_result(&c.result, "cached screen")?);
                }
                None => missing.push(t.clone()),
            }
        }
        if !missing.is_empty() {
            let opts = EvalOptions {
                task_ids: missing,
                target: Some(self.cfg.target.clone()),
                mode: Mode::SelectionOnly,
                batch: self.cfg.batch,
                host: self.host(0),
                ..EvalOptions::default()
            };
            let candidate = EvalCandidate {
                descriptions: descriptions.clone(),
            };
            for r in self.play(&candidate, &opts, &world).await? {
                // Only an exact screen is a pure function of its key; a sampled one is not kept.
                if r.infra_failure.is_none()
                    && r.routing_probability.is_some()
                    && r.first_move_samples.is_none()
                {
                    self.store
                        .cache_result(
                            &self.task_key("screen", &world, &r.task_id, 0),
                            "screen",
                            &serde_json::to_string(&r).unwrap_or_default(),
                            None,
                        )
                        .await?;
                }
                out.insert(r.task_id.clone(), r);
            }
        }
        Ok(out)
    }

    /// Screens a candidate on `tasks` and reports it as an evaluation of `phase`: its screen scores under the
    /// run's objective (the exact probability of the right first move for task success and routing, since task
    /// success on these suites is mostly routing; of choosing the target first for selection). A backend that
    /// cannot score exactly gives its sampled first move as 0 or 1.
    pub(crate) async fn screen_candidate(
        &self,
        candidate: u32,
        phase: Phase,
        descriptions: &Descriptions,
        tasks: &[String],
        rollouts_spent: u64,
        counted: bool,
    ) -> Result<Scores, DriverError> {
        self.emit(Event::Evaluating {
            candidate,
            phase,
            tasks: tasks.len(),
        })
        .await?;
        let results = self.screens(descriptions, tasks).await?;
        let ordered: Vec<TaskResult> = tasks
            .iter()
            .filter_map(|t| results.get(t).cloned())
            .collect();
        let scores: Scores = tasks
            .iter()
            .map(|t| {
                let v = results.get(t).map_or(0.0, |r| {
                    screen_value(r, self.cfg.objective, &self.cfg.target)
                });
                (t.clone(), v)
            })
            .collect();
        self.emit(Event::Evaluated {
            candidate,
            phase,
            mean: tooltune_optimizer::mean_over(&scores, tasks),
            metrics: Box::new(screen_metrics(&self.facts(&ordered)?)),
            rollouts_spent,
            screened_spent: if counted {
                self.screened_spent
                    .fetch_add(tasks.len() as u64, std::sync::atomic::Ordering::Relaxed)
                    + tasks.len() as u64
            } else {
                self.screened_spent
                    .load(std::sync::atomic::Ordering::Relaxed)
            },
        })
        .await?;
        Ok(scores)
    }

    /// Plays `opts.task_ids` with `candidate`: here through the evaluator (full rollouts stored as they finish),
    /// or, in a run with workers, as jobs keyed by their content address in `world`, whose trajectories are
    /// stored here once their results arrive (the driver is the only writer of trajectories, so a job that ran
    /// twice is stored once).
    pub(crate) async fn play(
        &self,
        candidate: &EvalCandidate,
        opts: &EvalOptions,
        world: &str,
    ) -> Result<Vec<TaskResult>, DriverError> {
        let Some(dispatcher) = &self.dispatcher else {
            let sink = (opts.mode == Mode::Full).then_some(self.store as &dyn TrajectorySink);
            let result = evaluate(
                &self.suite,
                &self.server,
                self.models.agent.as_ref(),
                sink,
                candidate,
                opts,
                |_, _| {},
            )
            .await?;
            if let Some(w) = result.order_warning()
                && !self
                    .warned_order
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!("{w}");
            }
            return Ok(result.tasks);
        };
        let kind = match opts.mode {
            Mode::Full => "rollout",
            Mode::SelectionOnly => "screen",
        };
        let jobs: Vec<tooltune_worker::Job> = opts
            .task_ids
            .iter()
            .map(|t| tooltune_worker::Job {
                key: self.task_key(kind, world, t, opts.rollout),
                suite: dispatcher.suite_digest().to_string(),
                model: dispatcher.model().to_string(),
                task_id: t.clone(),
                mode: opts.mode,
                descriptions: candidate.descriptions.clone(),
                target: opts
                    .target
                    .clone()
                    .unwrap_or_else(|| self.cfg.target.clone()),
                rollout: opts.rollout,
                seed: opts.host.seed,
                run_id: opts.run_id.clone(),
                candidate_id: opts.candidate_id.clone(),
                max_attempts: dispatcher.policy().max_attempts,
                call_timeout_ms: u64::try_from(opts.call_timeout.as_millis()).unwrap_or(u64::MAX),
            })
            .collect();
        let done = dispatcher.run(&jobs, &|| self.stop_requested()).await?;
        let mut results = Vec::with_capacity(done.len());
        let mut trajectories = Vec::new();
        for r in done {
            let mut result = self.parse_result(&r.result, "job result")?;
            if let Some(t) = &r.trajectory {
                let t: tooltune_core::Trajectory =
                    serde_json::from_str(t).map_err(|e| DriverError::Corrupt {
                        run: self.run_id.clone(),
                        what: "job trajectory",
                        message: e.to_string(),
                    })?;
                t.validate().map_err(|e| DriverError::Corrupt {
                    run: self.run_id.clone(),
                    what: "job trajectory",
                    message: e.to_string(),
                })?;
                // The id is the content address of what is stored here. Floats are read back exactly
                // (serde_json's `float_roundtrip`), so this is the worker's id; recomputing it keeps that true
                // whatever a worker sent.
                result.trajectory_id = Some(t.id().to_string());
                trajectories.push(t);
            }
            results.push(result);
        }
        self.store.insert(&trajectories).await?;
        Ok(results)
    }

    pub(crate) fn parse_result(
        &self,
        text: &str,
        what: &'static str,
    ) -> Result<TaskResult, DriverError> {
        serde_json::from_str(text).map_err(|e| DriverError::Corrupt {
            run: self.run_id.clone(),
            what,
            message: e.to_string(),
        })
    }

    /// The host settings of rollout `rollout`.
    pub(crate) fn host(&self, rollout: u32) -> tooltune_evaluator::host::HostConfig {
        tooltune_evaluator::host::HostConfig {
            seed: Some(self.cfg.seed.wrapping_add(u64::from(rollout))),
            ..Default::default()
        }
    }

    /// What every rollout of `descriptions` in this run shares: the agent model (and the SIMD path its greedy
    /// output depends on), the host and its settings, the suite file, the server, and the tools as shown.
    pub(crate) fn world_key(&self, descriptions: &Descriptions) -> String {
        let shown: Vec<(&str, &str, String)> = self
            .server_tools
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    descriptions
                        .get(&t.name)
                        .map_or(t.description.as_str(), String::as_str),
                    t.input_schema.to_string(),
                )
            })
            .collect();
        let mut h = Sha256::new();
        for part in [
            self.models.agent.id(),
            simd_path().to_string(),
            HOST_VERSION.to_string(),
            format!("{:?}", tooltune_evaluator::host::HostConfig::default()),
            self.suite_digest.clone(),
            serde_json::to_string(&self.suite.server).unwrap_or_default(),
            serde_json::to_string(&shown).unwrap_or_default(),
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        // Settings that change the agent's greedy output (a non-default thread count): added only when there are
        // some, so the keys of runs on the defaults stay as they were.
        let numerics = self.models.agent.numerics();
        if !numerics.is_empty() {
            h.update(b"numerics\0");
            h.update(numerics.as_bytes());
        }
        // The fixture's content is the server's initial state: an edited fixture is another world. (Added only
        // when there is one, so the keys of suites without a fixture stay as they were.)
        let fixture = self.suite.world_digest();
        if !fixture.is_empty() {
            h.update(b"fixture\0");
            h.update(fixture.as_bytes());
        }
        hex::encode(h.finalize())
    }

    /// The content address of one task's result in a world: see [`rollout_key`].
    pub(crate) fn task_key(&self, kind: &str, world: &str, task: &str, rollout: u32) -> String {
        let task_text = self
            .suite
            .tasks
            .iter()
            .find(|t| t.id == task)
            .map(|t| format!("{t:?}"))
            .unwrap_or_default();
        let host = self.host(rollout);
        let seed = (host.temperature > 0.0).then_some(host.seed).flatten();
        rollout_key(kind, world, &task_text, rollout, seed)
    }

    pub(crate) fn facts(&self, results: &[TaskResult]) -> Result<Vec<RolloutFacts>, DriverError> {
        facts_of(results, &self.cfg.target)
    }
}
