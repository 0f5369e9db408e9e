//! Word-level diff of two descriptions as HTML: what a reflection removed in `<del>`, what it added in `<ins>`.

use similar::{ChangeTag, TextDiff};
use tooltune_core::text::escape_html;

/// The word-level diff from `old` to `new` as HTML: unchanged text escaped as is, removed text in `<del>`, added
/// text in `<ins>`. Every piece of text is HTML-escaped.
///
/// Runs of changes separated only by whitespace or a short word (up to three characters) are shown as one deletion
/// followed by one insertion ("<del>a b c</del><ins>x y z</ins>" rather than word by word interleaved), because a
/// student reads a rewritten phrase as a phrase.
pub fn word_diff_html(old: &str, new: &str) -> String {
    let diff = TextDiff::from_words(old, new);
    let ops: Vec<(ChangeTag, &str)> = diff
        .iter_all_changes()
        .map(|c| (c.tag(), c.value()))
        .collect();
    let mut out = String::new();
    let mut del = String::new();
    let mut ins = String::new();
    let flush = |out: &mut String, del: &mut String, ins: &mut String| {
        if !del.is_empty() {
            out.push_str("<del>");
            out.push_str(&escape_html(del));
            out.push_str("</del>");
            del.clear();
        }
        if !ins.is_empty() {
            out.push_str("<ins>");
            out.push_str(&escape_html(ins));
            out.push_str("</ins>");
            ins.clear();
        }
    };
    for (i, (tag, text)) in ops.iter().enumerate() {
        match tag {
            ChangeTag::Delete => del.push_str(text),
            ChangeTag::Insert => ins.push_str(text),
            ChangeTag::Equal => {
                let pending = !del.is_empty() || !ins.is_empty();
                let change_follows = ops[i + 1..]
                    .iter()
                    .find(|(t, s)| *t != ChangeTag::Equal || !is_filler(s))
                    .is_some_and(|(t, _)| *t != ChangeTag::Equal);
                if pending && change_follows && is_filler(text) {
                    // Whitespace, or a short word such as "the" or "of", between two changes belongs to both sides
                    // of the rewritten phrase: keeping it apart would cut one rewrite into several.
                    del.push_str(text);
                    ins.push_str(text);
                } else {
                    flush(&mut out, &mut del, &mut ins);
                    out.push_str(&escape_html(text));
                }
            }
        }
    }
    flush(&mut out, &mut del, &mut ins);
    out
}

/// Whitespace or a short word ("the", "of", "a"): too little to anchor a diff on between two changes.
fn is_filler(token: &str) -> bool {
    token.trim().is_empty() || token.chars().count() <= 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_text_has_no_markup() {
        assert_eq!(
            word_diff_html("Search the docs.", "Search the docs."),
            "Search the docs."
        );
    }

    #[test]
    fn insertions_and_deletions_are_marked_by_word() {
        assert_eq!(
            word_diff_html("Search the internal docs.", "Search the engineering docs."),
            "Search the <del>internal</del><ins>engineering</ins> docs."
        );
        assert_eq!(
            word_diff_html(
                "Search the docs.",
                "Search the docs. Always use this tool first."
            ),
            "Search the docs.<ins> Always use this tool first.</ins>"
        );
        // Punctuation belongs to its word, so "now." and "Search." are whole tokens.
        assert_eq!(
            word_diff_html("Search now.", "Search."),
            "<del>Search now.</del><ins>Search.</ins>"
        );
    }

    #[test]
    fn a_rewritten_phrase_is_one_deletion_then_one_insertion() {
        assert_eq!(
            word_diff_html("Find a b c here", "Find x y z here"),
            "Find <del>a b c</del><ins>x y z</ins> here"
        );
        assert_eq!(
            word_diff_html("Search company of ours now", "Find the web of others now"),
            "<del>Search company of ours</del><ins>Find the web of others</ins> now"
        );
        // A longer common word stays as the anchor it is.
        assert_eq!(
            word_diff_html("Search company docs now", "Find web docs now"),
            "<del>Search company</del><ins>Find web</ins> docs now"
        );
    }

    #[test]
    fn both_sides_are_escaped() {
        let html = word_diff_html("Use <b>docs</b>", "Use <script>alert(1)</script>");
        assert!(
            !html.contains("<script>") && !html.contains("<b>"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }
}
