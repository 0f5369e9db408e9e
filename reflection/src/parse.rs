//! A lenient parser of the reflector's reply, and the checks that tell a usable description from the ways a
//! small model fails (FIELD.md, MODELS.md): chat replies, echoes of the old description or of the prompt,
//! format placeholders, replies too long, and layouts that drift from `DIAGNOSIS:` / `DESCRIPTION:` lines.
//!
//! Lenient about layout (markdown bold and headings, labels inline or alone on their line, quotes, code
//! fences, a "Here is the new description:" preface); strict about content.
//!
//! This file holds the entry ([`parse_reply`]) and what it is given and gives back; `rejection` names why a reply
//! gave no description, `split` finds the labels a reply is split at, `clean` strips what surrounds a
//! description, and `check` tells a usable description from a failure (and salvages a partly good one).

mod check;
mod clean;
mod rejection;
mod split;
#[cfg(test)]
mod tests;

pub use rejection::Rejection;

pub(crate) use check::trim_to_sentences;
use check::{check, salvage};
use clean::{clean_description, collapse, strip_decoration};
use regex::Regex;
use split::{Label, find_labels, unfence};
use std::sync::OnceLock;

/// What the parser checks a description against.
#[derive(Debug, Clone)]
pub struct ParseContext<'a> {
    /// The tool under study (a leading `tool:` is stripped from the description).
    pub tool: &'a str,
    /// Its current description (an unchanged copy is rejected).
    pub current_description: &'a str,
    /// Texts whose presence marks an echo of the prompt.
    pub echo_markers: &'a [String],
    /// The longest description accepted, in characters.
    pub max_chars: usize,
}

/// A parsed reply: the diagnosis when there was one, and the description or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedReply {
    /// The diagnosis, whitespace collapsed.
    pub diagnosis: Option<String>,
    /// The new description, or the reason the reply has none.
    pub description: Result<String, Rejection>,
}

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    // The patterns are constants of this module and covered by its tests.
    cell.get_or_init(|| Regex::new(pattern).expect("constant pattern compiles"))
}

/// Parses a reply. Never fails as a function: a reply without a usable description is a [`Rejection`].
pub fn parse_reply(reply: &str, ctx: &ParseContext<'_>) -> ParsedReply {
    let text = unfence(reply);
    let labels = find_labels(&text);
    let section = |i: usize| -> &str {
        let end = labels.get(i + 1).map_or(text.len(), |n| n.start);
        &text[labels[i].end..end]
    };
    let diagnosis = labels
        .iter()
        .enumerate()
        .filter(|(_, l)| l.label == Label::Diagnosis)
        .map(|(i, _)| collapse(strip_decoration(section(i))))
        .find(|d| !d.is_empty());
    let mut first_rejection: Option<Rejection> = None;
    for (i, l) in labels.iter().enumerate() {
        if l.label != Label::Description {
            continue;
        }
        let cleaned = clean_description(section(i), ctx.tool, ctx.echo_markers);
        let checked = check(cleaned.clone(), ctx).or_else(|r| salvage(&cleaned, r, ctx));
        match checked {
            Ok(d) => {
                return ParsedReply {
                    diagnosis,
                    description: Ok(d),
                };
            }
            Err(r) => {
                // An empty section (a label echoed from the format) says less than a real attempt's fault.
                if first_rejection.is_none() || first_rejection == Some(Rejection::Empty) {
                    first_rejection = Some(r);
                }
            }
        }
    }
    ParsedReply {
        diagnosis,
        description: Err(first_rejection.unwrap_or(Rejection::NoDescription)),
    }
}
