//! Cleaning a description section: decoration, our data markers, prefaces, the tool's name as a prefix, and
//! wrapping quotes or brackets are stripped; nothing is judged here.

use super::check::{contains_marker, meta_talk};
use super::re;
use crate::prompt::{CLOSE, OPEN};
use regex::Regex;
use std::sync::OnceLock;

/// Trims markdown emphasis and list markers left around a section.
pub(super) fn strip_decoration(s: &str) -> &str {
    s.trim()
        .trim_start_matches(['*', '_', '-', '#', ' ', '\t', '\n'])
        .trim_end_matches(['*', '_', ' ', '\t', '\n'])
        .trim()
}

pub(super) fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn preface() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)^(?:sure[,!.]?\s*)?here(?:'s| is)\s+(?:the|a|my|an)\s+(?:(?:new|updated|improved|revised|better|rewritten)\s+)?(?:tool\s+)?description[^:\n]*:\s*",
    )
}

/// "The new description of search_docs should be ...", "The description of search_docs now states: ...", "The
/// new version of search_docs is ..." (real 1.5B openings). Only a preface when a colon or a quote follows;
/// "should be updated to ..." is commentary, left for the meta-talk check.
fn announce() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?i)^(?:the\s+)?(?:(?:new|updated|improved|revised|better)\s+)?(?:description|version)\s+(?:of|for)\s+\S+\s+(?:now\s+)?(?:should\s+be|would\s+be|could\s+be|is|states|reads|says)(?:\s*:)?\s*",
    )
}

fn strip_preface(para: &str) -> String {
    let p = preface().replace(para, "");
    if let Some(m) = announce().find(&p) {
        let rest = &p[m.end()..];
        if m.as_str().trim_end().ends_with(':')
            || rest.starts_with(['"', '\u{201c}', '\'', '`', '\u{ab}'])
        {
            return rest.trim().to_string();
        }
    }
    p.trim().to_string()
}

/// `"First sentence." More text` (a quoted opening followed by the rest, from the announcing replies above):
/// the pair of quotes goes, the text stays. Only when the text opens with a quote and holds exactly one more.
fn unquote_opening(d: &str) -> String {
    for (open, close) in [('"', '"'), ('\u{201c}', '\u{201d}')] {
        if let Some(rest) = d.strip_prefix(open)
            && rest.matches(close).count() == 1
            && rest.matches(open).count() == usize::from(open == close)
        {
            return rest.replacen(close, "", 1).trim().to_string();
        }
    }
    d.to_string()
}

/// Takes the description's first paragraph and strips what surrounds it: decoration, our own data markers
/// (the 1.5B model wrapped its answer in the markers like the data it was shown, then went on pasting the
/// prompt), a preface, the tool's name as a prefix, and wrapping quotes or brackets. A later line that
/// repeats a line of the prompt ends the description.
pub(super) fn clean_description(section: &str, tool: &str, echo_markers: &[String]) -> String {
    let mut s = strip_decoration(section);
    if let Some(rest) = s.strip_prefix(OPEN) {
        s = match rest.find(CLOSE) {
            Some(end) => &rest[..end],
            None => rest.split('\n').next().unwrap_or(""),
        };
    }
    let para = s.split("\n\n").next().unwrap_or("").trim();
    let para = para
        .lines()
        .enumerate()
        .take_while(|(i, l)| *i == 0 || !contains_marker(l, echo_markers))
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n");
    let para = para.as_str();
    let mut d = strip_preface(para);
    for prefix in [
        format!("`{tool}`:"),
        format!("{tool}:"),
        format!("`{tool}` -"),
        format!("{tool} -"),
    ] {
        if let Some(rest) = d.strip_prefix(&prefix) {
            d = rest.trim().to_string();
        }
    }
    d = d
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    if meta_talk().is_match(&d)
        && let Some(q) = last_quoted(&d)
    {
        // "The current description is too broad. A better one would be \"...\"": keep the quoted proposal.
        d = q;
    }
    d = strip_triple_quotes(&d).to_string();
    for _ in 0..2 {
        d = unwrap_once(&d).to_string();
    }
    d = unquote_opening(&d);
    strip_decoration(&d).to_string()
}

/// The last double-quoted span of at least 15 characters, straight or curly quotes.
fn last_quoted(s: &str) -> Option<String> {
    static R: OnceLock<Regex> = OnceLock::new();
    let r = re(
        &R,
        r#""([^"\n]{15,})"|\u{201c}([^\u{201d}\n]{15,})\u{201d}"#,
    );
    r.captures_iter(s)
        .filter_map(|c| c.get(1).or_else(|| c.get(2)))
        .last()
        .map(|m| m.as_str().trim().to_string())
}

/// A Python-style docstring wrapper (`""" ... """`, seen from the 1.5B reflector, sometimes with its closing
/// half cut off by the token limit). Three quotes in a row never belong to a description, so each end loses them
/// on its own.
fn strip_triple_quotes(s: &str) -> &str {
    let mut s = s.trim();
    for q in ["\"\"\"", "'''", "```"] {
        s = s.strip_prefix(q).unwrap_or(s).trim_start();
        s = s.strip_suffix(q).unwrap_or(s).trim_end();
    }
    s
}

fn unwrap_once(s: &str) -> &str {
    const PAIRS: [(char, char); 7] = [
        ('"', '"'),
        ('\'', '\''),
        ('`', '`'),
        ('\u{201c}', '\u{201d}'),
        ('\u{2018}', '\u{2019}'),
        ('\u{ab}', '\u{bb}'),
        ('[', ']'),
    ];
    for (open, close) in PAIRS {
        if let Some(inner) = s.strip_prefix(open).and_then(|r| r.strip_suffix(close)) {
            // Only when the pair wraps the whole text: `"a" or "b"` is not one quoted string.
            if !inner.contains(open) && !inner.contains(close) {
                return inner.trim();
            }
        }
    }
    s
}
