//! The description checks: what tells a usable description from the ways a small model fails (chat replies,
//! echoes, placeholders, meta commentary, talk about the runs, length), and the salvage of a partly good one.

use super::clean::collapse;
use super::{ParseContext, Rejection, re};
use crate::prompt::{CLOSE, OPEN};
use regex::Regex;
use std::sync::OnceLock;

/// A description that failed only in part keeps its good part: its quoted proposal when it announced one
/// (`The description of X should be: «...»`, the closing marker often lost to the token limit), and otherwise its
/// leading sentences up to the first one that talks about the runs or the description, without a last sentence
/// left unfinished. Measured on the 1.5B reflector's replies in a demo: "The search_docs tool is designed to read
/// the company's internal documentation ... It is not designed to search the web. The agent should use the
/// web_search tool ..." was refused whole for its last sentence. The rest is checked again as a whole; nothing is
/// rewritten, only cut.
pub(super) fn salvage(
    d: &str,
    rejection: Rejection,
    ctx: &ParseContext<'_>,
) -> Result<String, Rejection> {
    if !matches!(
        rejection,
        Rejection::AboutTheRuns { .. } | Rejection::MetaCommentary | Rejection::Delimiters
    ) {
        return Err(rejection);
    }
    let inner = match d.find(OPEN) {
        Some(start) => {
            let rest = &d[start + OPEN.len()..];
            rest.find(CLOSE).map_or(rest, |end| &rest[..end]).trim()
        }
        None => d,
    };
    let mut kept: Vec<&str> = Vec::new();
    for sentence in sentences(inner) {
        if about_the_runs().is_match(sentence) || meta_talk().is_match(sentence) {
            break;
        }
        kept.push(sentence);
    }
    if kept
        .last()
        .is_some_and(|l| !l.trim_end().ends_with(['.', '!', '?', ')']))
    {
        kept.pop();
    }
    let rest = kept.join(" ");
    if rest.chars().count() < 20 {
        return Err(rejection);
    }
    check(rest, ctx).map_err(|_| rejection)
}

/// Sentences: each ends at `.`, `!` or `?` followed by white space (or at the end of the text).
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    for (i, c) in text.char_indices() {
        if matches!(c, '.' | '!' | '?') && bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace())
        {
            let s = text[start..=i].trim();
            if !s.is_empty() {
                out.push(s);
            }
            start = i + 1;
        }
    }
    let tail = text[start..].trim();
    if !tail.is_empty() {
        out.push(tail);
    }
    out
}

/// Sentences about a description rather than about the tool, or plans for changing it ("should be updated to
/// include ..."). Narrow on purpose: "returns a description of the product" is a fine thing for a tool
/// description to say, and so is "use it when a record should be updated".
pub(super) fn meta_talk() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b(?:(?:current|new|old|updated|original|better|improved|revised|proposed)\s+description|more\s+\w+\s+description|(?:the|this|that)\s+description\s+(?:is|was|should|would|could|does|did|of\s+\S+\s+(?:is|should))|should\s+be\s+(?:updated|changed|rewritten|revised|modified|improved|expanded)\s+to\s+(?:include|mention|say|state|describe|specify|explain|clarify|cover|list))\b",
    )
}

/// What the agent did or should have done in the runs. Narrow on purpose: "use this when the user asks for X" is
/// a fine thing for a tool description to say, "the agent should have called X" is a diagnosis.
fn about_the_runs() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)\b(?:(?:the|this)\s+(?:agent|assistant|model)\s+(?:should(?:\s+have)?|shouldn't|did|didn't|did\s+not|was|wasn't|failed|called|chose|used|picked|selected|incorrectly|mistakenly)|should\s+have\s+(?:called|used|chosen|picked|selected)|in\s+(?:these|the\s+above|the\s+previous)\s+runs?)\b",
    )
}

fn chat_opening() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)^(certainly|sure|of course|absolutely|okay|alright|hello|thank you|thanks|i'd be happy|i would be happy|i'm happy|i am happy|happy to|here is|here's|here are|below is|as an ai|i am an ai|i'm an ai|i'm sorry|i am sorry|sorry|i cannot|i can't|i can|let me|i will|i'll|to improve|based on|describe the|write a|rewrite the|update the)\b",
    )
}

pub(super) fn contains_marker(text: &str, markers: &[String]) -> bool {
    let lower = text.to_lowercase();
    markers.iter().any(|m| lower.contains(&m.to_lowercase()))
}

fn normalise(s: &str) -> String {
    collapse(s).trim_end_matches('.').to_lowercase()
}

pub(super) fn check(d: String, ctx: &ParseContext<'_>) -> Result<String, Rejection> {
    if d.is_empty() || d == "..." {
        return Err(Rejection::Empty);
    }
    if d.contains(OPEN) || d.contains(CLOSE) {
        return Err(Rejection::Delimiters);
    }
    let lower = d.to_lowercase();
    if (d.starts_with('<') && d.ends_with('>')) || lower.contains("the new description of") {
        return Err(Rejection::Placeholder);
    }
    if let Some(m) = chat_opening().find(&d) {
        return Err(Rejection::ChatReply {
            opening: m.as_str().to_string(),
        });
    }
    if meta_talk().is_match(&d) {
        return Err(Rejection::MetaCommentary);
    }
    if let Some(marker) = ctx
        .echo_markers
        .iter()
        .find(|m| contains_marker(&d, std::slice::from_ref(m)))
    {
        return Err(Rejection::PromptEcho {
            pasted: crate::dataset::cut(marker, 60),
        });
    }
    if let Some(m) = about_the_runs().find(&d) {
        return Err(Rejection::AboutTheRuns {
            words: m.as_str().to_string(),
        });
    }
    if normalise(&d) == normalise(ctx.current_description) {
        return Err(Rejection::Unchanged);
    }
    let chars = d.chars().count();
    if chars > ctx.max_chars {
        return trim_to_sentences(&d, ctx.max_chars).ok_or(Rejection::TooLong {
            chars,
            max: ctx.max_chars,
        });
    }
    Ok(d)
}

/// A description over the limit, cut after its last whole sentence that fits, when that keeps at least half the
/// limit. Why not reject it: the 1.5B reflector overshot 400 characters in 4 of 14 replies of a contractor search
/// (issue 25), most often while listing the kinds of questions a tool is for, and a retry costs a decode round as
/// long as the first; the sentences that fit are a description in their own right, and the screen judges it like
/// any other. A reply with no sentence end in that window (one run-on sentence) is still rejected.
pub(crate) fn trim_to_sentences(d: &str, max: usize) -> Option<String> {
    let mut end = None;
    for (n, (i, c)) in d.char_indices().enumerate() {
        if n >= max {
            break;
        }
        let next = d[i + c.len_utf8()..].chars().next();
        if matches!(c, '.' | '!' | '?') && next.is_none_or(char::is_whitespace) {
            end = Some((n + 1, i + c.len_utf8()));
        }
    }
    let (kept, byte) = end?;
    (kept * 2 >= max).then(|| d[..byte].to_string())
}
