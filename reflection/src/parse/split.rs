//! Splitting a reply at its `DIAGNOSIS:` / `DESCRIPTION:` labels, however decorated, once code fences are dropped.

use super::re;
use regex::Regex;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Label {
    Diagnosis,
    Description,
}

pub(super) struct Found {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) label: Label,
}

/// A label at the start of a line, any case, with markdown decoration: `**Diagnosis:**`, `### Description`,
/// `- New description for search_docs:`. Without a colon or dash it must stand alone on its line, so a
/// sentence beginning "Description is vague" is not a label.
fn line_label() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?im)^[ \t>#*_\-]*(?:(?:new|updated|improved|revised|proposed|rewritten|suggested|better)\s+)?(?:tool\s+)?(diagnosis|description)(?:\s+(?:of|for)\s+[`'*]?[\w.\-]+[`'*]?)?[ \t*_]*(?:(?:[:：]|[ \t]+[-–—])[ \t*_]*|$)",
    )
}

/// A label inside a line: only the requested upper-case form or a bold one, so prose such as "its current
/// description: ..." is not taken for a label.
fn inline_label() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"(?:\*\*|__)?\b(DIAGNOSIS|DESCRIPTION)\b(?:\*\*|__)?[ \t]*[:：][ \t]*(?:\*\*|__)?|\*\*(?i:(?:new\s+)?(diagnosis|description))[ \t]*[:：]?\*\*[ \t]*[:：]?",
    )
}

pub(super) fn find_labels(text: &str) -> Vec<Found> {
    let mut found: Vec<Found> = Vec::new();
    for r in [line_label(), inline_label()] {
        for c in r.captures_iter(text) {
            let whole = c.get(0).expect("group 0 always exists");
            let word = c
                .get(1)
                .or_else(|| c.get(2))
                .map(|m| m.as_str().to_ascii_lowercase());
            let label = match word.as_deref() {
                Some("diagnosis") => Label::Diagnosis,
                Some("description") => Label::Description,
                _ => continue,
            };
            found.push(Found {
                start: whole.start(),
                end: whole.end(),
                label,
            });
        }
    }
    found.sort_by_key(|f| (f.start, std::cmp::Reverse(f.end)));
    let mut out: Vec<Found> = Vec::new();
    for f in found {
        if out.last().is_none_or(|l| f.start >= l.end) {
            out.push(f);
        }
    }
    out
}

/// Drops code-fence lines (keeping what they fence) and normalises line ends.
pub(super) fn unfence(reply: &str) -> String {
    reply
        .replace("\r\n", "\n")
        .lines()
        .filter(|l| !l.trim_start().starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n")
}
