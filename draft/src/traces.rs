//! Tasks from logged runs, the pure part of `suite from-traces`: runs of the same request (the same words once
//! case, punctuation and spacing are set aside) are merged; the owner is the tool the *successful* runs called
//! first (no call: a no-tool request), by majority, and unclear on a tie; the reference calls are one such run's
//! logged calls from the owner's first that succeeded on (a suite's reference is the chain that solves the task, the
//! last result holding the answer: `read_file` then `calculator`); the answer check is a number, name or date that
//! every successful run's final answer holds and the request does not already name.
//!
//! Only successful runs decide: a failing run may have called the wrong tool, which is exactly what an optimised
//! description should stop, so it would name the wrong owner. A request no run succeeded on is dropped with its
//! reason, since nothing says which tool serves it.

use crate::outcome::DropReason;
use crate::parse::{self, Check, NoCheck};
use std::collections::BTreeMap;
use tooltune_core::{Step, Trajectory};
use tooltune_evaluator::ReferenceCall;
use tooltune_evaluator::suite::numbers_in;

/// A logged run as the store hands it over.
#[derive(Debug, Clone)]
pub struct LoggedRun {
    /// The trajectory's id in the store.
    pub id: String,
    /// The trajectory.
    pub trajectory: Trajectory,
    /// Its verdict: the producer's outcome, else a label tooltune stored (when labels are used); `None` when
    /// nobody judged it.
    pub success: Option<bool>,
}

/// The requests of a set of logged runs, with what their successful runs say.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request as first logged.
    pub prompt: String,
    /// Runs of it (all verdicts).
    pub runs: usize,
    /// Ids of the successful runs that agree on the owner, in log order.
    pub trajectories: Vec<String>,
    /// The owner (`None`: answered without a tool), or why there is none.
    pub owner: Result<Option<String>, (DropReason, String)>,
    /// The reference calls: the logged calls of the first agreeing run that has the owner's, from the owner's
    /// first call that did not fail, without the calls that failed in the log or whose arguments are not a JSON
    /// object; empty for a no-tool request, or when no run has such a call of the owner.
    pub reference: Vec<ReferenceCall>,
    /// What each of them returned in the log.
    pub logged_results: Vec<String>,
    /// The answer check the successful runs' final answers support.
    pub check: Result<Check, NoCheck>,
}

/// Merges the runs of each request (in order of first appearance) and reads owner, reference call and answer check
/// from the successful ones.
pub fn group(runs: &[LoggedRun]) -> Vec<Request> {
    let mut order: Vec<String> = Vec::new();
    let mut by_key: BTreeMap<String, Vec<&LoggedRun>> = BTreeMap::new();
    for r in runs {
        let key = parse::normalise(&r.trajectory.task);
        if key.is_empty() {
            continue;
        }
        if !by_key.contains_key(&key) {
            order.push(key.clone());
        }
        by_key.entry(key).or_default().push(r);
    }
    order.iter().map(|k| request(&by_key[k])).collect()
}

fn request(runs: &[&LoggedRun]) -> Request {
    let prompt = runs[0].trajectory.task.trim().to_string();
    let ok: Vec<&LoggedRun> = runs
        .iter()
        .copied()
        .filter(|r| r.success == Some(true))
        .collect();
    let mut req = Request {
        prompt,
        runs: runs.len(),
        trajectories: Vec::new(),
        owner: Err((DropReason::NoSuccessfulRun, String::new())),
        reference: Vec::new(),
        logged_results: Vec::new(),
        check: Err(NoCheck::NoValue),
    };
    if ok.is_empty() {
        let judged = runs.iter().filter(|r| r.success.is_some()).count();
        req.owner = Err((
            DropReason::NoSuccessfulRun,
            format!(
                "none of its {} logged runs succeeded ({} judged failing, {} not judged; `tooltune traces label` \
                 labels runs whose producer wrote no outcome)",
                runs.len(),
                judged,
                runs.len() - judged
            ),
        ));
        return req;
    }
    // Votes for the first move of each successful run.
    let mut votes: BTreeMap<Option<&str>, usize> = BTreeMap::new();
    for r in &ok {
        *votes.entry(first_tool(&r.trajectory)).or_default() += 1;
    }
    let best = votes.values().copied().max().unwrap_or(0);
    let winners: Vec<Option<&str>> = votes
        .iter()
        .filter(|(_, n)| **n == best)
        .map(|(o, _)| *o)
        .collect();
    if winners.len() > 1 {
        req.owner = Err((
            DropReason::OwnerUnclear,
            format!(
                "its successful runs began with {}, equally often",
                votes
                    .iter()
                    .map(|(o, n)| format!("{} ({n})", o.unwrap_or("no tool")))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
        return req;
    }
    let owner = winners[0];
    let agree: Vec<&LoggedRun> = ok
        .into_iter()
        .filter(|r| first_tool(&r.trajectory) == owner)
        .collect();
    req.trajectories = agree.iter().map(|r| r.id.clone()).collect();
    req.owner = Ok(owner.map(str::to_string));
    if let Some(owner) = owner
        && let Some(chain) = agree
            .iter()
            .map(|r| chain(&r.trajectory))
            .find(|c| c.first().is_some_and(|(call, _)| call.tool == owner))
    {
        (req.reference, req.logged_results) = chain.into_iter().unzip();
    }
    let answers: Vec<&str> = agree
        .iter()
        .map(|r| r.trajectory.final_answer.as_deref().unwrap_or("").trim())
        .collect();
    req.check = answer_from_logs(&req.prompt, &answers);
    req
}

/// The tool a run called first; `None` when it called none.
pub fn first_tool(t: &Trajectory) -> Option<&str> {
    t.tool_calls().next().map(|c| c.name.as_str())
}

/// A run's calls that can be replayed, with their logged results: from its first call, leaving out the calls whose
/// arguments are not a JSON object (a producer may log unparseable arguments as a string) and those that failed in
/// the log (a wrong path the agent then corrected), since a reference call must succeed.
fn chain(t: &Trajectory) -> Vec<(ReferenceCall, String)> {
    let mut out = Vec::new();
    for (i, step) in t.steps.iter().enumerate() {
        let Step::Model { tool_calls, .. } = step else {
            continue;
        };
        for c in tool_calls.iter().filter(|c| c.arguments.is_object()) {
            // The result with the call's id; without ids, the next result of the same tool.
            let result = t.steps[i + 1..].iter().find_map(|s| match s {
                Step::ToolResult {
                    call_id,
                    name,
                    content,
                    is_error,
                    ..
                } if (c.id.is_some() && call_id == &c.id)
                    || (c.id.is_none() && name == &c.name) =>
                {
                    Some((content.clone(), *is_error))
                }
                _ => None,
            });
            if let Some((content, false)) = result {
                out.push((
                    ReferenceCall {
                        tool: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                    content,
                ));
            }
        }
    }
    out
}

/// Whether `check` holds in `text` (the last reference result), the way the evaluator reads an answer.
pub fn holds(check: &Check, text: &str) -> bool {
    match check {
        Check::Number(n) => numbers_in(text)
            .iter()
            .any(|x| (x - n).abs() <= check.tolerance()),
        Check::Contains(v) => text.to_lowercase().contains(&v.to_lowercase()),
    }
}

/// The answer check the successful runs' final answers support: the first value of the first answer (a short
/// whole answer, else a date, a file or other name with a dot, slash or underscore, a number, or a capitalised
/// name not opening a sentence) that the request does not name and that every answer holds, checked with the
/// drafting rules ([`parse::answer_check`]: a number, or at most 6 words and 60 characters).
pub fn answer_from_logs(request: &str, answers: &[&str]) -> Result<Check, NoCheck> {
    let Some(first) = answers.first().filter(|a| !a.is_empty()) else {
        return Err(NoCheck::NoValue);
    };
    let mut why = NoCheck::NoValue;
    for v in values(first) {
        if in_request(&v, request) {
            continue;
        }
        let others: &[&str] = if answers.len() > 1 {
            &answers[1..]
        } else {
            &answers[..1]
        };
        let mut verdict = Ok(Check::Number(0.0));
        for other in others {
            verdict = parse::answer_check(Some(&v), first, other);
            if verdict.is_err() {
                break;
            }
        }
        match verdict {
            Ok(c) => return Ok(c),
            Err(e) => {
                if why == NoCheck::NoValue || e == NoCheck::Unstable {
                    why = e;
                }
            }
        }
    }
    Err(why)
}

fn in_request(v: &str, request: &str) -> bool {
    let n = numbers_in(v);
    if n.len() == 1 && v.chars().filter(|c| c.is_alphabetic()).count() <= 3 {
        return numbers_in(request).iter().any(|x| (x - n[0]).abs() < 1e-9);
    }
    request.to_lowercase().contains(&v.to_lowercase())
}

/// The values an answer holds, in the order of [`answer_from_logs`].
pub fn values(answer: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let whole = answer.trim().trim_end_matches(['.', '!']).trim();
    // A whole answer of one to three words each opening with a capital or a digit is a value (`Canberra.`,
    // `Joon Lee`, `69504`); `It is 399.5` is a sentence, whose words an agent would choose differently.
    if (1..=3).contains(&whole.split_whitespace().count())
        && whole.split_whitespace().all(|w| {
            w.chars()
                .next()
                .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit())
        })
        && whole.chars().filter(|c| c.is_alphanumeric()).count() >= 2
    {
        out.push(whole.to_string());
    }
    let raw: Vec<&str> = answer.split_whitespace().collect();
    let mut name: Vec<String> = Vec::new();
    let flush = |name: &mut Vec<String>, out: &mut Vec<String>| {
        if !name.is_empty() {
            out.push(name.join(" "));
            name.clear();
        }
    };
    for (i, r) in raw.iter().enumerate() {
        let sentence_start = i == 0 || raw[i - 1].ends_with(['.', '!', '?', ':']);
        let t = r
            .trim_matches(|c: char| "\"'()[]{},;:!?«»“”‘’`*".contains(c))
            .trim_end_matches('.');
        if t.chars().filter(|c| c.is_alphanumeric()).count() < 2 {
            flush(&mut name, &mut out);
            continue;
        }
        let letters = t.chars().filter(|c| c.is_alphabetic()).count();
        let digits = t.chars().any(|c| c.is_ascii_digit());
        let capital = t.chars().next().is_some_and(char::is_uppercase);
        if capital && letters > 0 && !digits && (!sentence_start || !name.is_empty()) {
            name.push(t.to_string());
            // A name ends at punctuation after it.
            if r.ends_with([',', '.', ';', ':', '!', '?', ')']) {
                flush(&mut name, &mut out);
            }
            continue;
        }
        flush(&mut name, &mut out);
        // A date, a name with a dot, slash or underscore (`notes.txt`), or one number with a unit at most.
        let named = is_date(t) || (letters > 0 && t.contains(['.', '/', '_']));
        if named || (digits && numbers_in(t).len() == 1 && letters <= 3) {
            out.push(t.to_string());
        }
    }
    flush(&mut name, &mut out);
    let mut seen = Vec::new();
    out.retain(|v| {
        let fresh = !seen.contains(v);
        seen.push(v.clone());
        fresh
    });
    out
}

fn is_date(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tooltune_core::{Outcome, ToolCall};

    fn run(
        id: &str,
        task: &str,
        calls: &[(&str, serde_json::Value, &str, bool)],
        answer: &str,
        ok: Option<bool>,
    ) -> LoggedRun {
        let mut steps = Vec::new();
        for (i, (name, args, result, err)) in calls.iter().enumerate() {
            steps.push(Step::Model {
                content: None,
                tool_calls: vec![ToolCall {
                    id: Some(format!("c{i}")),
                    name: name.to_string(),
                    arguments: args.clone(),
                }],
                timing: Default::default(),
                usage: None,
            });
            steps.push(Step::ToolResult {
                call_id: Some(format!("c{i}")),
                name: name.to_string(),
                content: result.to_string(),
                is_error: *err,
                timing: Default::default(),
            });
        }
        LoggedRun {
            id: id.into(),
            trajectory: Trajectory {
                task: task.into(),
                system: None,
                tools: Vec::new(),
                tool_annotations: Default::default(),
                steps,
                final_answer: Some(answer.into()),
                outcome: Outcome::default(),
                meta: Default::default(),
                links: Default::default(),
            },
            success: ok,
        }
    }

    #[test]
    fn repeats_merge_and_the_successful_runs_name_owner_reference_and_check() {
        let sum = "Read notes.txt and sum the numbers in it.";
        let runs = vec![
            run(
                "a",
                sum,
                &[(
                    "calculator",
                    json!({"expression": "48000 + 9500"}),
                    "57500",
                    false,
                )],
                "The sum is 57500.",
                Some(false),
            ),
            run(
                "b",
                sum,
                &[
                    (
                        "read_file",
                        json!({"path": "note.txt"}),
                        "no such file",
                        true,
                    ),
                    (
                        "read_file",
                        json!({"path": "notes.txt"}),
                        "Pizza budget: 48000",
                        false,
                    ),
                ],
                "69504",
                Some(true),
            ),
            run(
                "c",
                "read NOTES.txt and sum the numbers in it",
                &[(
                    "read_file",
                    json!({"path": "notes.txt"}),
                    "Pizza budget: 48000",
                    false,
                )],
                "The numbers in notes.txt add up to 69,504.",
                Some(true),
            ),
            run(
                "d",
                "What is the capital of Australia?",
                &[],
                "Canberra.",
                Some(true),
            ),
            run(
                "e",
                "How many files are in the reports folder?",
                &[("web_search", json!({"q": "x"}), "", false)],
                "I can't see them.",
                Some(false),
            ),
            run(
                "f",
                "How many files are in the reports folder?",
                &[],
                "No idea.",
                None,
            ),
        ];
        let g = group(&runs);
        assert_eq!(g.len(), 3, "{g:#?}");
        let notes = &g[0];
        assert_eq!(notes.prompt, sum);
        assert_eq!(notes.runs, 3);
        assert_eq!(notes.owner, Ok(Some("read_file".into())));
        assert_eq!(notes.trajectories, ["b", "c"]);
        // The failing call on note.txt is passed over for the one that returned the file.
        assert_eq!(notes.reference.len(), 1);
        assert_eq!(notes.reference[0].arguments, json!({"path": "notes.txt"}));
        assert_eq!(notes.logged_results, ["Pizza budget: 48000"]);
        assert_eq!(notes.check, Ok(Check::Number(69504.0)));

        assert_eq!(g[1].owner, Ok(None), "answered without a tool");
        assert!(g[1].reference.is_empty());
        assert_eq!(g[1].check, Ok(Check::Contains("Canberra".into())));

        let (reason, detail) = g[2].owner.clone().expect_err("no success");
        assert_eq!(reason, DropReason::NoSuccessfulRun);
        assert!(
            detail.contains("1 judged failing, 1 not judged"),
            "{detail}"
        );
    }

    #[test]
    fn a_tie_between_first_moves_leaves_the_owner_unclear() {
        let q = "Which file mentions the pizza budget?";
        let runs = vec![
            run(
                "a",
                q,
                &[("list_dir", json!({"path": "."}), "notes.txt", false)],
                "notes.txt",
                Some(true),
            ),
            run(
                "b",
                q,
                &[("read_file", json!({"path": "notes.txt"}), "Pizza", false)],
                "notes.txt",
                Some(true),
            ),
        ];
        let g = group(&runs);
        let (reason, detail) = g[0].owner.clone().expect_err("tie");
        assert_eq!(reason, DropReason::OwnerUnclear);
        assert!(
            detail.contains("list_dir (1)") && detail.contains("read_file (1)"),
            "{detail}"
        );
        // With a third run the majority decides.
        let mut more = runs.clone();
        more.push(run(
            "c",
            q,
            &[("list_dir", json!({}), "notes.txt", false)],
            "It is notes.txt.",
            Some(true),
        ));
        let g = group(&more);
        assert_eq!(g[0].owner, Ok(Some("list_dir".into())));
        assert_eq!(g[0].trajectories, ["a", "c"]);
        assert_eq!(g[0].check, Ok(Check::Contains("notes.txt".into())));
    }

    #[test]
    fn answer_checks_take_a_value_every_answer_holds_and_the_request_does_not_name() {
        let q = "What is 17% of 2350?";
        assert_eq!(
            answer_from_logs(q, &["17% of 2350 is 399.5."]),
            Ok(Check::Number(399.5))
        );
        assert_eq!(
            answer_from_logs(
                "Which file mentions the pizza budget?",
                &["notes.txt mentions it (Pizza budget: 48000)."]
            ),
            Ok(Check::Contains("notes.txt".into()))
        );
        assert_eq!(
            answer_from_logs(
                "Who is the treasurer?",
                &["The treasurer is Joon Lee, since 2024-03-01."]
            ),
            Ok(Check::Contains("Joon Lee".into()))
        );
        assert_eq!(
            answer_from_logs(
                "When did Joon Lee start?",
                &["Joon Lee started on 2024-03-01."]
            ),
            Ok(Check::Contains("2024-03-01".into()))
        );
        // Runs that disagree give no check; neither does an answer with no value in it.
        assert_eq!(
            answer_from_logs(q, &["It is 399.5.", "It is 400."]),
            Err(NoCheck::Unstable)
        );
        assert_eq!(
            answer_from_logs("Say hello", &["hello there, how are you today my friend"]),
            Err(NoCheck::NoValue)
        );
        assert_eq!(answer_from_logs(q, &[]), Err(NoCheck::NoValue));
    }

    #[test]
    fn the_reference_is_the_replayable_chain_of_the_first_run_that_begins_with_the_owner() {
        let q = "Read notes.txt and sum the numbers in it.";
        let runs = vec![
            // Successful, but begins with a call the log cannot replay (arguments as a string).
            run(
                "a",
                q,
                &[(
                    "read_file",
                    json!("notes.txt"),
                    "Pizza budget: 48000",
                    false,
                )],
                "69504",
                Some(true),
            ),
            run(
                "b",
                q,
                &[
                    (
                        "read_file",
                        json!({"path": "notes.txt"}),
                        "Pizza budget: 48000",
                        false,
                    ),
                    (
                        "calculator",
                        json!({"expression": "4 + 48000"}),
                        "not a number",
                        true,
                    ),
                    (
                        "calculator",
                        json!({"expression": "4 + 48000 + 9500 + 12000"}),
                        "69504",
                        false,
                    ),
                ],
                "The sum is 69504.",
                Some(true),
            ),
        ];
        let g = group(&runs);
        assert_eq!(g[0].owner, Ok(Some("read_file".into())));
        let tools: Vec<&str> = g[0].reference.iter().map(|c| c.tool.as_str()).collect();
        assert_eq!(
            tools,
            ["read_file", "calculator"],
            "the failed calculator call is left out"
        );
        assert_eq!(
            g[0].reference[1].arguments,
            json!({"expression": "4 + 48000 + 9500 + 12000"})
        );
        assert_eq!(
            g[0].logged_results.last().map(String::as_str),
            Some("69504")
        );
        let check = g[0].check.clone().expect("check");
        assert_eq!(check, Check::Number(69504.0));
        assert!(holds(&check, "69,504") && !holds(&check, "Pizza budget: 48000"));
        // A fraction holds within a millionth, as the suite writes it: a tool's float noise is not a wrong answer.
        assert!(
            holds(&Check::Number(399.5), "399.50000000000006")
                && !holds(&Check::Number(399.5), "399.6")
        );
        assert!(holds(
            &Check::Contains("Joon Lee".into()),
            "treasurer: JOON LEE"
        ));
    }
}
