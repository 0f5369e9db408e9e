//! A trace's outcome from its Langfuse scores: which score names grade success, and which scores set the score, the
//! success flag and the feedback.

use super::schema::{Score, Text};
use serde_json::Value;
use tooltune_core::Outcome;

/// Whether a score's name says it grades success: one of its words (split on anything not a letter or digit) is
/// success, successful, succeeded, correct, correctness, accuracy, resolved, pass, passed, completed or
/// completion. Word matching keeps `incorrect` or `hallucination` from counting.
pub(super) fn names_success(name: &str) -> bool {
    const WORDS: [&str; 11] = [
        "success",
        "successful",
        "succeeded",
        "correct",
        "correctness",
        "accuracy",
        "resolved",
        "pass",
        "passed",
        "completed",
        "completion",
    ];
    name.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| WORDS.contains(&w))
}

/// Outcome from scores: the first NUMERIC score in [0, 1] with a success-like name is the score, the first
/// BOOLEAN one the success flag; trace-level scores come before observation-level ones. Their comments are the
/// feedback.
pub(super) fn outcome_from_scores(scores: &[Score]) -> Outcome {
    let mut ordered: Vec<&Score> = scores.iter().filter(|s| names_success(&s.name)).collect();
    ordered.sort_by_key(|s| s.observation_id.is_some());
    let mut out = Outcome::default();
    let mut comments: Vec<String> = Vec::new();
    for s in ordered {
        let number = s.value.as_ref().and_then(Value::as_f64);
        match s.data_type.as_ref().map(Text::as_str) {
            Some("BOOLEAN") if out.success.is_none() => {
                let flag =
                    number
                        .map(|v| v >= 0.5)
                        .or(match s.string_value.as_ref().map(Text::as_str) {
                            Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
                            Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
                            _ => None,
                        });
                if flag.is_some() {
                    out.success = flag;
                    comments.extend(s.comment.as_ref().map(|c| c.as_str().to_string()));
                }
            }
            Some("NUMERIC") | None if out.score.is_none() => {
                if let Some(v) = number.filter(|v| (0.0..=1.0).contains(v)) {
                    out.score = Some(v);
                    comments.extend(s.comment.as_ref().map(|c| c.as_str().to_string()));
                }
            }
            _ => {}
        }
    }
    comments.dedup();
    if !comments.is_empty() {
        out.feedback = Some(comments.join("; "));
    }
    out
}
