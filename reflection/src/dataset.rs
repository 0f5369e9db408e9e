//! The reflective dataset: which evaluated rollouts the reflector is shown, and what of each one.
//!
//! A 1.5B reflector loses the thread in long prompts (FIELD.md: the reference GEPA's long prompt got chat
//! replies and pasted examples back), so only a few runs are shown and every piece of text from a run is cut
//! to a few hundred characters. Runs that count as failures under the goal come first, mixed across the
//! ways the tool under study can relate to a task, so one prompt can show a task the tool lost, a task it
//! took that belonged to another tool, and (when there is room) a run that went well.

use crate::Goal;
use serde::{Deserialize, Serialize};
use tooltune_core::{Step, Trajectory};

/// One evaluated rollout, as the driver hands it to reflection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReflectiveExample {
    /// The task text (the user's request).
    pub task: String,
    /// The tool the suite says the task belongs to, if it says.
    pub owner: Option<String>,
    /// What the agent saw and did.
    pub trajectory: Trajectory,
    /// Whether the suite's checks passed.
    pub success: bool,
    /// The checks' feedback text.
    pub feedback: String,
}

/// How a run relates to the tool under study: whose task it was and whether the agent called the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// The task belongs to the tool and the agent called it.
    OwnTaskTaken,
    /// The task belongs to the tool and the agent did not call it.
    OwnTaskMissed,
    /// The task belongs to another tool and the agent called this one anyway.
    OtherTaskTaken,
    /// The task belongs to another tool and the agent left this one alone.
    OtherTaskLeft,
    /// The suite names no owner; the agent called the tool.
    UnownedTaken,
    /// The suite names no owner; the agent did not call the tool.
    UnownedLeft,
}

impl Relation {
    /// Classifies a run. "Called" means called at all, so a run that tried the tool second still counts.
    pub fn of(example: &ReflectiveExample, tool: &str) -> Self {
        let called = example.trajectory.calls_of(tool) > 0;
        match (example.owner.as_deref(), called) {
            (Some(o), true) if o == tool => Relation::OwnTaskTaken,
            (Some(o), false) if o == tool => Relation::OwnTaskMissed,
            (Some(_), true) => Relation::OtherTaskTaken,
            (Some(_), false) => Relation::OtherTaskLeft,
            (None, true) => Relation::UnownedTaken,
            (None, false) => Relation::UnownedLeft,
        }
    }
}

/// Whether a run counts as a failure under the goal. For task success that is the checks' verdict; for
/// selection it is "the agent's first call was not the tool", the same rule the objectives crate scores
/// selection by.
pub fn failed_under(example: &ReflectiveExample, tool: &str, goal: Goal) -> bool {
    match goal {
        Goal::TaskSuccess => !example.success,
        Goal::Routing => {
            let first = example
                .trajectory
                .tool_calls()
                .next()
                .map(|c| c.name.as_str());
            first != example.owner.as_deref()
        }
        Goal::Selection => {
            example
                .trajectory
                .tool_calls()
                .next()
                .map(|c| c.name.as_str())
                != Some(tool)
        }
    }
}

/// The order in which relations are drawn from, failures and successes alike: first the runs that say
/// most about this tool's description (a task it should have had, a task it took from another tool), last
/// the runs where it played no part.
const RELATION_ORDER: [Relation; 6] = [
    Relation::OwnTaskMissed,
    Relation::OtherTaskTaken,
    Relation::OwnTaskTaken,
    Relation::UnownedTaken,
    Relation::UnownedLeft,
    Relation::OtherTaskLeft,
];

/// Chooses at most `cap` examples to show, returning their indices in the order they will appear.
///
/// Failures under the goal come first, drawn round-robin across [`Relation`]s (so three failures of
/// different kinds beat three of one kind); then successes the same way. When failures alone would fill
/// the prompt and there is a success, the last slot goes to one success (for `cap >= 3`), because seeing
/// what worked keeps a rewrite from discarding it. Within one relation the input order is kept, so the
/// caller decides (for example with a seeded shuffle) which of many similar runs is shown.
pub fn select(examples: &[ReflectiveExample], tool: &str, goal: Goal, cap: usize) -> Vec<usize> {
    select_about(examples, tool, tool, goal, cap)
}

/// [`select`] for a rewrite of `tool` whose goal is about another tool, `about` (the selection of the target
/// while a competitor's text is rewritten): failures are judged about `about`, relations to `tool`.
pub fn select_about(
    examples: &[ReflectiveExample],
    tool: &str,
    about: &str,
    goal: Goal,
    cap: usize,
) -> Vec<usize> {
    let failures = round_robin(examples, tool, |e| failed_under(e, about, goal));
    let successes = round_robin(examples, tool, |e| !failed_under(e, about, goal));
    let mut out: Vec<usize> = failures.into_iter().take(cap).collect();
    if out.len() < cap {
        out.extend(successes.into_iter().take(cap - out.len()));
    } else if cap >= 3
        && let Some(&first_success) = successes.first()
    {
        out[cap - 1] = first_success;
    }
    out
}

fn round_robin(
    examples: &[ReflectiveExample],
    tool: &str,
    keep: impl Fn(&ReflectiveExample) -> bool,
) -> Vec<usize> {
    let mut buckets: Vec<std::collections::VecDeque<usize>> = RELATION_ORDER
        .iter()
        .map(|r| {
            examples
                .iter()
                .enumerate()
                .filter(|(_, e)| keep(e) && Relation::of(e, tool) == *r)
                .map(|(i, _)| i)
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for b in &mut buckets {
            if let Some(i) = b.pop_front() {
                out.push(i);
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

/// How much of each run's text is kept. Characters, not tokens: about four characters per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Task text.
    pub task_chars: usize,
    /// Each tool call's arguments (as compact JSON).
    pub arguments_chars: usize,
    /// Each tool result.
    pub result_chars: usize,
    /// The final answer.
    pub answer_chars: usize,
    /// The checks' feedback.
    pub feedback_chars: usize,
    /// Each tool description shown (the current description of the tool under study is never cut).
    pub description_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            task_chars: 300,
            arguments_chars: 160,
            result_chars: 240,
            answer_chars: 160,
            feedback_chars: 160,
            description_chars: 300,
        }
    }
}

/// A tool as the agent saw it in a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownTool {
    /// Tool name.
    pub name: String,
    /// The description the agent read (cut to [`Limits::description_chars`]).
    pub description: String,
}

/// One tool call and, when the trajectory has it, the result the server really returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The tool called.
    pub name: String,
    /// The arguments as compact JSON (cut).
    pub arguments: String,
    /// The result text (cut), or `None` when the trajectory has no result for this call.
    pub result: Option<String>,
    /// The server flagged the result as an error.
    pub is_error: bool,
}

/// What the reflector is shown of one run. Text here is cut but not yet escaped: the prompt renderer
/// escapes every string it puts inside a data block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Index of the example in the request.
    pub index: usize,
    /// The task text.
    pub task: String,
    /// The tool the task belongs to, if known.
    pub owner: Option<String>,
    /// How the run relates to the tool under study.
    pub relation: Relation,
    /// Whether the run counts as a failure under the goal.
    pub failed: bool,
    /// The tools the agent was shown, with the descriptions it read.
    pub tools_shown: Vec<ShownTool>,
    /// The tool calls, in order, with their results.
    pub calls: Vec<CallRecord>,
    /// The agent's final answer (cut).
    pub final_answer: Option<String>,
    /// Whether the checks passed.
    pub success: bool,
    /// The checks' feedback (cut).
    pub feedback: String,
}

impl RunRecord {
    /// Builds the record of example `index`.
    pub fn build(
        examples: &[ReflectiveExample],
        index: usize,
        tool: &str,
        goal: Goal,
        limits: &Limits,
    ) -> Option<Self> {
        Self::build_about(examples, index, tool, tool, goal, limits)
    }

    /// [`RunRecord::build`] for a rewrite of `tool` whose goal is about `about` ([`select_about`]).
    pub fn build_about(
        examples: &[ReflectiveExample],
        index: usize,
        tool: &str,
        about: &str,
        goal: Goal,
        limits: &Limits,
    ) -> Option<Self> {
        let ex = examples.get(index)?;
        let t = &ex.trajectory;
        Some(RunRecord {
            index,
            task: cut(&ex.task, limits.task_chars),
            owner: ex.owner.clone(),
            relation: Relation::of(ex, tool),
            failed: failed_under(ex, about, goal),
            tools_shown: t
                .tools
                .iter()
                .map(|s| ShownTool {
                    name: s.name.clone(),
                    description: cut(&s.description, limits.description_chars),
                })
                .collect(),
            calls: calls_with_results(t, limits),
            final_answer: t
                .final_answer
                .as_deref()
                .map(|a| cut(a, limits.answer_chars)),
            success: ex.success,
            feedback: cut(&ex.feedback, limits.feedback_chars),
        })
    }
}

/// Pairs each call with its result: by call id when both carry one, otherwise with the first result of the
/// same tool that is still unclaimed (logs without ids put results in call order).
fn calls_with_results(t: &Trajectory, limits: &Limits) -> Vec<CallRecord> {
    let mut calls: Vec<(Option<&str>, CallRecord)> = Vec::new();
    for step in &t.steps {
        match step {
            Step::Model { tool_calls, .. } => {
                for c in tool_calls {
                    let args = serde_json::to_string(&c.arguments).unwrap_or_default();
                    calls.push((
                        c.id.as_deref(),
                        CallRecord {
                            name: c.name.clone(),
                            arguments: cut(&args, limits.arguments_chars),
                            result: None,
                            is_error: false,
                        },
                    ));
                }
            }
            Step::ToolResult {
                call_id,
                name,
                content,
                is_error,
                ..
            } => {
                let by_id = call_id.as_deref().and_then(|id| {
                    calls
                        .iter()
                        .position(|(cid, r)| *cid == Some(id) && r.result.is_none())
                });
                let slot = by_id.or_else(|| {
                    calls
                        .iter()
                        .position(|(_, r)| r.name == *name && r.result.is_none())
                });
                if let Some(i) = slot {
                    calls[i].1.result = Some(cut(content, limits.result_chars));
                    calls[i].1.is_error = *is_error;
                }
            }
            Step::User { .. } => {}
        }
    }
    calls.into_iter().map(|(_, r)| r).collect()
}

/// Cuts text to at most `max` characters (on a character boundary), marking the cut.
pub fn cut(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max).collect();
    s.push_str(" [...]");
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A contractor-like run: `called` is the tool the agent called (if any), `owner` the task's tool.
    pub(crate) fn run(
        task: &str,
        owner: &str,
        called: Option<&str>,
        success: bool,
    ) -> ReflectiveExample {
        let mut steps = vec![];
        if let Some(c) = called {
            steps.push(json!({"type": "model", "tool_calls": [{"id": "c1", "name": c, "arguments": {"query": task}}]}));
            steps.push(json!({"type": "tool_result", "call_id": "c1", "name": c, "content": format!("results of {c}")}));
        }
        steps.push(json!({"type": "model", "content": "answer"}));
        let trajectory: Trajectory = serde_json::from_value(json!({
            "task": task,
            "tools": [
                {"name": "search_docs", "description": "Search the company's internal documentation."},
                {"name": "web_search", "description": "Search the web."}
            ],
            "steps": steps,
            "final_answer": "answer"
        }))
        .expect("test trajectory parses");
        trajectory.validate().expect("test trajectory is valid");
        ReflectiveExample {
            task: task.into(),
            owner: Some(owner.into()),
            trajectory,
            success,
            feedback: if success {
                "ok".into()
            } else {
                "expected a different answer".into()
            },
        }
    }

    fn contractor_runs() -> Vec<ReflectiveExample> {
        vec![
            run("weather in Paris", "web_search", Some("web_search"), true), // 0: other task, left
            run(
                "billing SDK retries",
                "search_docs",
                Some("web_search"),
                false,
            ), // 1: own task missed
            run(
                "sync_orders returns",
                "search_docs",
                Some("web_search"),
                false,
            ), // 2: own task missed
            run("World Cup winner", "web_search", Some("search_docs"), false), // 3: other task taken
            run("on-call runbook", "search_docs", Some("search_docs"), true), // 4: own task taken, won
            run("refund limit", "search_docs", None, false),                  // 5: own task missed
        ]
    }

    #[test]
    fn relations_are_classified_from_owner_and_calls() {
        let r = contractor_runs();
        let rel: Vec<Relation> = r.iter().map(|e| Relation::of(e, "search_docs")).collect();
        assert_eq!(
            rel,
            vec![
                Relation::OtherTaskLeft,
                Relation::OwnTaskMissed,
                Relation::OwnTaskMissed,
                Relation::OtherTaskTaken,
                Relation::OwnTaskTaken,
                Relation::OwnTaskMissed,
            ]
        );
    }

    #[test]
    fn success_goal_mixes_failure_kinds_then_keeps_one_success() {
        let r = contractor_runs();
        // Failures: 1, 2, 5 (missed) and 3 (taken from web_search). Round-robin: 1, 3, 2, 5.
        assert_eq!(select(&r, "search_docs", Goal::TaskSuccess, 2), vec![1, 3]);
        // With three slots the last goes to the best success (4: its own task, taken).
        assert_eq!(
            select(&r, "search_docs", Goal::TaskSuccess, 3),
            vec![1, 3, 4]
        );
        assert_eq!(
            select(&r, "search_docs", Goal::TaskSuccess, 4),
            vec![1, 3, 2, 4]
        );
        // Room for everything: failures first, then successes in relation order.
        assert_eq!(
            select(&r, "search_docs", Goal::TaskSuccess, 10),
            vec![1, 3, 2, 5, 4, 0]
        );
        assert!(select(&r, "search_docs", Goal::TaskSuccess, 0).is_empty());
    }

    #[test]
    fn selection_goal_counts_runs_where_the_tool_was_not_first_as_failures() {
        let r = contractor_runs();
        // Not chosen first: 0 (other task), 1, 2, 5 (own tasks). Chosen: 3 (other), 4 (own).
        assert!(failed_under(&r[0], "search_docs", Goal::Selection));
        assert!(!failed_under(&r[3], "search_docs", Goal::Selection));
        assert_eq!(select(&r, "search_docs", Goal::Selection, 3), vec![1, 0, 3]);
        assert_eq!(select(&r, "search_docs", Goal::Selection, 2), vec![1, 0]);
        assert_eq!(
            select(&r, "search_docs", Goal::Selection, 6),
            vec![1, 0, 2, 5, 3, 4]
        );
    }

    #[test]
    fn all_successes_are_still_shown_when_nothing_failed() {
        let r = vec![
            run("a", "search_docs", Some("search_docs"), true),
            run("b", "web_search", Some("web_search"), true),
        ];
        assert_eq!(select(&r, "search_docs", Goal::TaskSuccess, 3), vec![0, 1]);
    }

    #[test]
    fn records_pair_results_with_calls_and_cut_long_text() {
        let t: Trajectory = serde_json::from_value(json!({
            "task": "Read notes.txt and sum the numbers in it.",
            "tools": [
                {"name": "read_file", "description": "Read a file."},
                {"name": "calculator", "description": "Evaluate arithmetic."}
            ],
            "steps": [
                {"type": "model", "tool_calls": [
                    {"name": "read_file", "arguments": {"path": "notes.txt"}},
                    {"name": "calculator", "arguments": {"expression": "1+1"}}
                ]},
                {"type": "tool_result", "name": "calculator", "content": "2"},
                {"type": "tool_result", "name": "read_file", "content": "x".repeat(1000), "is_error": true},
                {"type": "model", "content": "69504"}
            ],
            "final_answer": "69504"
        }))
        .expect("parses");
        t.validate().expect("valid");
        let ex = ReflectiveExample {
            task: "Read notes.txt and sum the numbers in it.".into(),
            owner: Some("read_file".into()),
            trajectory: t,
            success: true,
            feedback: "answer 69504 found".into(),
        };
        let rec = RunRecord::build(&[ex], 0, "read_file", Goal::TaskSuccess, &Limits::default())
            .expect("index 0 exists");
        assert_eq!(rec.relation, Relation::OwnTaskTaken);
        assert_eq!(rec.calls.len(), 2);
        assert_eq!(rec.calls[0].arguments, r#"{"path":"notes.txt"}"#);
        let r0 = rec.calls[0]
            .result
            .as_deref()
            .expect("read_file has a result");
        assert_eq!(r0.chars().count(), 240 + " [...]".len());
        assert!(rec.calls[0].is_error);
        assert_eq!(rec.calls[1].result.as_deref(), Some("2"));
        assert_eq!(rec.tools_shown.len(), 2);
        assert_eq!(cut("  héllo wörld ", 5), "héllo [...]");
        assert_eq!(cut("short", 5), "short");
    }
}
