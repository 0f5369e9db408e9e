//! The shape a text reply must take, for replies a program parses: labelled lines in a fixed order
//! (`DIAGNOSIS: ...` then `DESCRIPTION: ...`), each one line of bounded length.
//!
//! The embedded model is held to it while it writes: the format becomes a GBNF grammar and the sampler only
//! keeps tokens the grammar allows, as tool calls already are. A 1.5B reflector asked for the format in words
//! left out the `DESCRIPTION:` line, echoed the `<...>` placeholder or ran past the token limit in a third of
//! its replies (issue 48); under the grammar none of these can happen. Remote endpoints get the format from
//! the prompt only: a JSON-schema `response_format` is not honoured by every OpenAI-compatible server, and the
//! models behind them follow a written format.

use serde::{Deserialize, Serialize};

/// Labelled lines, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyFormat {
    /// The lines, in the order they must come.
    pub fields: Vec<ReplyField>,
}

/// One labelled line: `LABEL: text`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyField {
    /// The label, written as given and followed by `: `.
    pub label: String,
    /// The longest text allowed after the label, in characters (at least 1).
    pub max_chars: u32,
}

impl ReplyFormat {
    /// A format of `(label, max_chars)` lines.
    pub fn labelled(fields: &[(&str, u32)]) -> Self {
        ReplyFormat {
            fields: fields
                .iter()
                .map(|(label, max_chars)| ReplyField {
                    label: (*label).to_string(),
                    max_chars: (*max_chars).max(1),
                })
                .collect(),
        }
    }

    /// The GBNF grammar of the format. Each line's text starts with a character that is not a space, `<` (the
    /// start of a `<placeholder>` echoed from the prompt) or a guillemet (the prompts' data delimiters), and holds
    /// no newline or guillemet. A final newline may end the reply; nothing else may follow.
    pub fn grammar(&self) -> String {
        let lines: Vec<String> = (0..self.fields.len()).map(|i| format!("f{i}")).collect();
        let mut g = format!("root ::= {} \"\\n\"?\n", lines.join(" \"\\n\" "));
        g.push_str("first ::= [^\\n\\t «»<]\n");
        g.push_str("rest ::= [^\\n«»]\n");
        for (i, f) in self.fields.iter().enumerate() {
            g.push_str(&format!(
                "f{i} ::= {} first rest{{0,{}}}\n",
                gbnf_literal(&format!("{}: ", f.label)),
                f.max_chars.saturating_sub(1)
            ));
        }
        g
    }

    /// A token limit under which a reply in this format is not cut: the labels and every line at its longest, at
    /// three characters per token (English text under Qwen's tokenizer averages about four).
    pub fn max_tokens(&self) -> u32 {
        self.fields
            .iter()
            .map(|f| (f.label.len() as u32 + 3) + f.max_chars.div_ceil(3))
            .sum::<u32>()
            + 4
    }
}

/// `s` as a GBNF string literal.
fn gbnf_literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_lists_the_labels_in_order_with_their_bounds() {
        let f = ReplyFormat::labelled(&[("DIAGNOSIS", 300), ("DESCRIPTION", 400)]);
        let g = f.grammar();
        assert!(g.starts_with("root ::= f0 \"\\n\" f1 \"\\n\"?\n"), "{g}");
        assert!(
            g.contains("f0 ::= \"DIAGNOSIS: \" first rest{0,299}\n"),
            "{g}"
        );
        assert!(
            g.contains("f1 ::= \"DESCRIPTION: \" first rest{0,399}\n"),
            "{g}"
        );
        assert!(f.max_tokens() >= (300 + 400) / 4, "{}", f.max_tokens());
    }

    #[test]
    fn labels_are_escaped_as_literals() {
        assert_eq!(gbnf_literal("A \"B\"\\"), "\"A \\\"B\\\"\\\\\"");
    }
}
