//! Text helpers for showing untrusted or long text: in one line (the terminal output and the dashboard) and
//! escaped for HTML (the report and the drafted suites' review pages, which write HTML outside a template engine).

/// `s` on one line (whitespace runs collapsed), cut to `max` characters with an ellipsis.
pub fn one_line(s: &str, max: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        format!(
            "{}…",
            flat.chars().take(max.saturating_sub(1)).collect::<String>()
        )
    } else {
        flat
    }
}

/// Escapes text for use in HTML or SVG element content and in double- or single-quoted attribute values.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters other than line breaks and tabs are not allowed in XML (inline SVG); dropping
            // them keeps the file well formed whatever a model wrote.
            c if c.is_control() && !matches!(c, '\n' | '\r' | '\t') => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_markup_quotes_and_drops_control_characters() {
        assert_eq!(
            super::escape_html("<script>alert('x')</script> & \"y\"\u{0}\n"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;\n"
        );
    }

    #[test]
    fn one_line_collapses_whitespace_and_cuts_with_an_ellipsis() {
        assert_eq!(super::one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(super::one_line("abcdef", 4), "abc…");
        assert_eq!(super::one_line("abcdef", 6), "abcdef");
    }
}
