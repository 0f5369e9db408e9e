//! Labels from evidence a log already holds, for trajectories whose producer wrote no outcome: a tool result
//! flagged `isError` (or reading "Error: ..."), the same call (tool and arguments) made twice, a run stopped at a turn limit without an
//! answer, no final answer at all, and an answer that says it could not do the task.
//!
//! Every rule is a sign of failure; none is a sign of success. A run where no rule fires is labelled a success
//! with no score and the feedback "no failure evidence": it is what the log cannot rule out, not a checked
//! answer (the judge, `judge.rs`, is what reads the answer against the task). Pure code: no IO, no model.

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;
use tooltune_core::{Step, Trajectory};

/// Version of the rules below, stored with every heuristic label: a label says which rules it came from.
pub const HEURISTICS_VERSION: &str = "heuristics-v1";

/// A rule that found evidence of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A tool result was flagged as an error by the server (MCP's `isError`), or its text starts with `Error:` (all
    /// a chat-completions log can show).
    ToolError,
    /// The same tool was called with the same arguments more than once: the agent was going round in circles.
    RepeatedCall,
    /// The run was told it had used its last turn (a limit note in the conversation) and gave no answer.
    TurnLimit,
    /// The run ended without a final answer (or with a tool call written out as text instead of one).
    NoFinalAnswer,
    /// The final answer says the agent could not do it ("I couldn't", "I was unable", "no information", "sorry").
    GaveUp,
}

impl Rule {
    /// The rule's name as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::ToolError => "tool_error",
            Rule::RepeatedCall => "repeated_call",
            Rule::TurnLimit => "turn_limit",
            Rule::NoFinalAnswer => "no_final_answer",
            Rule::GaveUp => "gave_up",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule that fired, with what it saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleHit {
    /// The rule.
    pub rule: Rule,
    /// What it saw, e.g. `read_file returned an error: «no such file»` (cut, one line).
    pub detail: String,
}

/// A heuristic verdict on one trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeuristicLabel {
    /// `false` when any rule fired.
    pub success: bool,
    /// `0` for a failure; `None` for a run with no failure evidence (the rules cannot grade an answer).
    pub score: Option<f64>,
    /// The rules that fired, in the order of [`Rule`].
    pub hits: Vec<RuleHit>,
    /// One line naming the rules that fired and what they saw, or that none did.
    pub feedback: String,
}

/// Phrases of an answer that gives up. Matched case-insensitively on word boundaries; apostrophes may be
/// straight or curly. Kept to first-person or "no information" forms, so that an answer *about* an inability
/// ("the API is unable to retry after 3 attempts") does not count.
fn gave_up_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?ix)
            \b(?: i \s+ (?:could \s* n[o']?t | couldn[’']t | can \s* n[o']?t | can[’']t | cannot
                       | was \s+ (?:unable|not \s+ able) | am \s+ (?:unable|not \s+ able) | [’']m \s+ (?:unable|not \s+ able)
                       | wasn[’']t \s+ able | do \s+ not \s+ have | don[’']t \s+ have | did \s+ not \s+ find | didn[’']t \s+ find)
                | i[’']m \s+ (?:unable|not \s+ able|sorry)
                | unable \s+ to \s+ (?:find|locate|access|determine|retrieve|complete|answer|get)
                | no \s+ (?:relevant \s+)? (?:information|results? \s+ (?:were|was)? \s* found|data \s+ (?:is|was) \s+ available)
                | there \s+ (?:is|was) \s+ no \s+ (?:information|mention)
                | sorry
                | apologi[sz]e
            )\b",
        )
        .expect("the gave-up pattern compiles")
    })
}

/// Notes a host writes into the conversation when a run used its last turn. The evaluator's own note
/// ("You cannot call any more tools") and the usual wordings of agent frameworks' limits.
fn limit_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?ix)
            cannot \s+ call \s+ any \s+ more \s+ tools
            | (?:step|turn|iteration|tool[- ]call) \s+ limit
            | max(?:imum)? \s+ (?:number \s+ of \s+)? (?:steps|turns|iterations|tool \s+ calls)
            | ran \s+ out \s+ of \s+ (?:steps|turns|iterations)",
        )
        .expect("the limit pattern compiles")
    })
}

/// A tool result whose text says it failed. Chat-completions logs have no `isError` (a tool message is only
/// text), so a server's error there reads "Error: ..." and nothing else marks it.
fn reads_as_error(content: &str) -> bool {
    let t = content.trim_start();
    let starts = |p: &str| t.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p));
    starts("error:") || starts("traceback (most recent call last)")
}

/// A final answer that is a tool call written out as text: a small model that could not call any more tools
/// often does this instead of answering.
fn looks_like_a_call(answer: &str) -> bool {
    let a = answer.trim_start();
    a.starts_with("<tool_call>")
        || a.starts_with("{\"name\"")
        || a.starts_with("{ \"name\"")
        || (a.starts_with("```") && a.contains("\"arguments\""))
}

/// One line of at most `max` characters: whitespace runs become one space.
fn short(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let mut s: String = flat.chars().take(max).collect();
        s.push_str("...");
        s
    }
}

/// Applies every rule to `t`.
pub fn label(t: &Trajectory) -> HeuristicLabel {
    let mut hits: Vec<RuleHit> = Vec::new();

    let failed_result = |s: &Step| match s {
        Step::ToolResult {
            name,
            content,
            is_error,
            ..
        } if *is_error || reads_as_error(content) => Some((name.clone(), content.clone())),
        _ => None,
    };
    if let Some((name, content)) = t.steps.iter().find_map(failed_result) {
        let errors = t.steps.iter().filter_map(failed_result).count();
        hits.push(RuleHit {
            rule: Rule::ToolError,
            detail: format!(
                "{name} returned an error{}: \"{}\"",
                if errors > 1 {
                    format!(" ({errors} errors in all)")
                } else {
                    String::new()
                },
                short(&content, 80)
            ),
        });
    }

    // Arguments compared in canonical form, so that key order or spacing in the log does not hide a repeat.
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for c in t.tool_calls() {
        *seen
            .entry((c.name.clone(), tooltune_core::canonical_json(&c.arguments)))
            .or_default() += 1;
    }
    if let Some(((name, args), n)) = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .max_by_key(|(_, n)| **n)
    {
        hits.push(RuleHit {
            rule: Rule::RepeatedCall,
            detail: format!("{name} called {n} times with {}", short(args, 80)),
        });
    }

    let answer = t.final_answer.as_deref().map(str::trim).unwrap_or("");
    let answered = !answer.is_empty() && !looks_like_a_call(answer);
    let limit_note = t.steps.iter().find_map(|s| match s {
        Step::User { content } => limit_pattern()
            .find(content)
            .map(|m| m.as_str().to_string()),
        _ => None,
    });
    if let (Some(note), false) = (&limit_note, answered) {
        hits.push(RuleHit {
            rule: Rule::TurnLimit,
            detail: format!(
                "stopped at a limit (\"{}\") with no answer",
                short(note, 60)
            ),
        });
    }
    if !answered {
        hits.push(RuleHit {
            rule: Rule::NoFinalAnswer,
            detail: if answer.is_empty() {
                match t.steps.last() {
                    Some(Step::ToolResult { .. }) => "the run ends on a tool result".to_string(),
                    Some(Step::Model { tool_calls, .. }) if !tool_calls.is_empty() => {
                        "the run ends on a tool call".to_string()
                    }
                    _ => "no final answer".to_string(),
                }
            } else {
                format!(
                    "the answer is a tool call written as text: \"{}\"",
                    short(answer, 60)
                )
            },
        });
    } else if let Some(m) = gave_up_pattern().find(answer) {
        hits.push(RuleHit {
            rule: Rule::GaveUp,
            detail: format!("the answer says \"{}\"", short(m.as_str(), 40)),
        });
    }

    hits.sort_by_key(|h| h.rule);
    if hits.is_empty() {
        return HeuristicLabel {
            success: true,
            score: None,
            hits,
            feedback: "no failure evidence: answered, no tool error, no repeated call".to_string(),
        };
    }
    let feedback = hits
        .iter()
        .map(|h| format!("{}: {}", h.rule, h.detail))
        .collect::<Vec<_>>()
        .join("; ");
    HeuristicLabel {
        success: false,
        score: Some(0.0),
        hits,
        feedback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn traj(steps: serde_json::Value, answer: Option<&str>) -> Trajectory {
        serde_json::from_value(json!({
            "task": "Read notes.txt and sum the numbers in it.",
            "tools": [
                {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}},
                {"name": "calculator", "description": "Evaluate arithmetic.", "input_schema": {"type": "object"}}
            ],
            "steps": steps,
            "final_answer": answer,
            "meta": {"source": "openai"}
        }))
        .expect("trajectory")
    }

    fn call(id: &str, name: &str, args: serde_json::Value) -> serde_json::Value {
        json!({"type": "model", "tool_calls": [{"id": id, "name": name, "arguments": args}]})
    }

    fn result(id: &str, name: &str, content: &str, is_error: bool) -> serde_json::Value {
        json!({"type": "tool_result", "call_id": id, "name": name, "content": content, "is_error": is_error})
    }

    fn rules(l: &HeuristicLabel) -> Vec<Rule> {
        l.hits.iter().map(|h| h.rule).collect()
    }

    #[test]
    fn a_clean_answered_run_has_no_failure_evidence_and_no_score() {
        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "notes.txt"})),
                result("c1", "read_file", "4 48000 9500 12000", false),
                call(
                    "c2",
                    "calculator",
                    json!({"expression": "4 + 48000 + 9500 + 12000"})
                ),
                result("c2", "calculator", "69504", false),
            ]),
            Some("The numbers add up to 69504."),
        );
        let l = label(&t);
        assert!(l.success);
        assert_eq!(l.score, None);
        assert!(l.hits.is_empty());
        assert!(
            l.feedback.starts_with("no failure evidence"),
            "{}",
            l.feedback
        );
    }

    #[test]
    fn a_tool_error_is_named_with_its_tool_and_text() {
        // A chat log cannot flag a result; its text is the evidence.
        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "note.txt"})),
                result("c1", "read_file", "Error: No such file: note.txt", false),
            ]),
            Some("I read it."),
        );
        assert_eq!(
            label(&t).feedback,
            "tool_error: read_file returned an error: \"Error: No such file: note.txt\""
        );
        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "notes.txt"})),
                result("c1", "read_file", "The error: budget was 48000", false),
            ]),
            Some("48000"),
        );
        assert!(
            label(&t).success,
            "an error mentioned in a result is not one"
        );
        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "note.txt"})),
                result("c1", "read_file", "no such file:\n note.txt", true),
                call("c2", "read_file", json!({"path": "notes.txt"})),
                result("c2", "read_file", "4 48000", true),
            ]),
            Some("69504"),
        );
        let l = label(&t);
        assert!(!l.success);
        assert_eq!(l.score, Some(0.0));
        assert_eq!(rules(&l), vec![Rule::ToolError]);
        assert_eq!(
            l.feedback,
            "tool_error: read_file returned an error (2 errors in all): \"no such file: note.txt\""
        );
    }

    #[test]
    fn the_same_call_twice_is_a_repeat_whatever_the_key_order() {
        let t = traj(
            json!([
                call(
                    "c1",
                    "calculator",
                    json!({"expression": "1+1", "precision": 2})
                ),
                result("c1", "calculator", "2", false),
                call(
                    "c2",
                    "calculator",
                    json!({"precision": 2, "expression": "1+1"})
                ),
                result("c2", "calculator", "2", false),
                call("c3", "calculator", json!({"expression": "1+2"})),
                result("c3", "calculator", "3", false),
            ]),
            Some("2"),
        );
        let l = label(&t);
        assert_eq!(rules(&l), vec![Rule::RepeatedCall]);
        assert!(
            l.feedback.contains(
                "calculator called 2 times with {\"expression\":\"1+1\",\"precision\":2}"
            ),
            "{}",
            l.feedback
        );
        // Different arguments are not a repeat.
        let t = traj(
            json!([
                call("c1", "calculator", json!({"expression": "1+1"})),
                call("c2", "calculator", json!({"expression": "1+2"})),
            ]),
            Some("3"),
        );
        assert!(label(&t).success);
    }

    #[test]
    fn no_answer_says_where_the_run_ended_and_a_limit_note_is_named() {
        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "notes.txt"})),
                result("c1", "read_file", "4 48000", false),
            ]),
            None,
        );
        let l = label(&t);
        assert_eq!(rules(&l), vec![Rule::NoFinalAnswer]);
        assert_eq!(l.feedback, "no_final_answer: the run ends on a tool result");

        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "notes.txt"})),
                result("c1", "read_file", "4 48000", false),
                {"type": "user", "content": "You cannot call any more tools. Using what you found so far, reply with the final answer only."},
                {"type": "model", "content": "<tool_call>{\"name\": \"calculator\"}</tool_call>"},
            ]),
            Some("<tool_call>{\"name\": \"calculator\"}</tool_call>"),
        );
        let l = label(&t);
        assert_eq!(rules(&l), vec![Rule::TurnLimit, Rule::NoFinalAnswer]);
        assert!(
            l.feedback
                .starts_with("turn_limit: stopped at a limit (\"cannot call any more tools\")"),
            "{}",
            l.feedback
        );
        assert!(
            l.feedback.contains("a tool call written as text"),
            "{}",
            l.feedback
        );

        // Told to answer at the limit, and it did: the limit alone is no failure (the contractor suite's runs
        // all end this way).
        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "notes.txt"})),
                result("c1", "read_file", "4 48000", false),
                {"type": "user", "content": "You cannot call any more tools. Reply with the final answer only."},
                {"type": "model", "content": "48004"},
            ]),
            Some("48004"),
        );
        assert!(label(&t).success);
    }

    #[test]
    fn answers_that_give_up_are_caught_and_answers_about_inability_are_not() {
        for a in [
            "I couldn't find notes.txt in the workspace.",
            "I could not read the file.",
            "I was unable to compute the sum.",
            "I’m unable to access that folder.",
            "Sorry, the file is empty.",
            "There is no information about this in the docs.",
            "No results were found for your query.",
            "I don't have access to the internet.",
        ] {
            let l = label(&traj(json!([]), Some(a)));
            assert_eq!(rules(&l), vec![Rule::GaveUp], "{a}");
            assert!(
                l.feedback.starts_with("gave_up: the answer says \""),
                "{}",
                l.feedback
            );
        }
        for a in [
            "The SDK is unable to retry after 3 attempts.",
            "Retries: 3; the client cannot exceed 60 requests a minute.",
            "The numbers add up to 69504.",
        ] {
            assert!(label(&traj(json!([]), Some(a))).success, "{a}");
        }
    }

    #[test]
    fn several_rules_are_all_named_in_rule_order() {
        let t = traj(
            json!([
                call("c1", "read_file", json!({"path": "x"})),
                result("c1", "read_file", "denied", true),
                call("c2", "read_file", json!({"path": "x"})),
                result("c2", "read_file", "denied", true),
            ]),
            Some("Sorry, I could not read it."),
        );
        let l = label(&t);
        assert_eq!(
            rules(&l),
            vec![Rule::ToolError, Rule::RepeatedCall, Rule::GaveUp]
        );
        assert_eq!(l.feedback.matches("; ").count(), 2, "{}", l.feedback);
        // Serialised rule names are the printed ones.
        assert_eq!(
            serde_json::to_value(&l.hits[0]).expect("json")["rule"],
            "tool_error"
        );
    }
}
