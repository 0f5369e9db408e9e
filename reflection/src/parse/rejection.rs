//! [`Rejection`]: why a reply gave no usable description, as recorded with the attempt and named in the follow-up
//! message.

use crate::prompt::{CLOSE, OPEN};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a reply gave no usable description. Recorded with the attempt and named in the follow-up message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rejection {
    /// The reply has no `DESCRIPTION` label at all.
    NoDescription,
    /// The label is there but nothing follows it.
    Empty,
    /// The description is the reply format's `<...>` placeholder.
    Placeholder,
    /// The description reads like a chat reply ("Certainly, ...").
    ChatReply {
        /// The opening words that gave it away.
        opening: String,
    },
    /// The description is the current one, unchanged.
    Unchanged,
    /// The text talks about the description ("the current description is too broad...") instead of being
    /// one, and quotes no candidate description.
    MetaCommentary,
    /// The description is longer than allowed.
    TooLong {
        /// Its length in characters.
        chars: usize,
        /// The limit.
        max: usize,
    },
    /// The description pastes back part of the prompt or of the runs' data.
    PromptEcho {
        /// The pasted text (cut to 60 characters).
        pasted: String,
    },
    /// The description contains the prompt's data delimiters.
    Delimiters,
    /// The description talks about the runs (what the agent did or should have done) instead of the tool: a
    /// diagnosis written where the description goes. Every future task would read it.
    AboutTheRuns {
        /// The words that gave it away.
        words: String,
    },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::NoDescription => f.write_str("it has no line starting with DESCRIPTION:"),
            Rejection::Empty => f.write_str("the DESCRIPTION is empty"),
            Rejection::Placeholder => {
                f.write_str("the DESCRIPTION is the placeholder of the format, not a description")
            }
            Rejection::ChatReply { opening } => write!(
                f,
                "the DESCRIPTION is a chat reply or advice (\"{opening}...\"), not a description of the tool"
            ),
            Rejection::Unchanged => f.write_str(
                "the DESCRIPTION is the current description unchanged; write a different one",
            ),
            Rejection::MetaCommentary => f.write_str(
                "the DESCRIPTION talks about the description instead of describing the tool; write only the description itself",
            ),
            Rejection::TooLong { chars, max } => {
                write!(f, "the DESCRIPTION has {chars} characters; the limit is {max}")
            }
            Rejection::PromptEcho { pasted } => {
                write!(f, "the DESCRIPTION copies text from the prompt (\"{pasted}\")")
            }
            Rejection::Delimiters => write!(f, "the DESCRIPTION contains the markers {OPEN} or {CLOSE}"),
            Rejection::AboutTheRuns { words } => write!(
                f,
                "the DESCRIPTION talks about the runs (\"{words}\") instead of describing the tool; put that in \
                 the DIAGNOSIS and describe what the tool does"
            ),
        }
    }
}
