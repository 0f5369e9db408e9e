//! HTML escaping for untrusted text (descriptions, diagnoses, task text, tool names) that the report writes outside
//! the template engine: inside SVG, diffs and highlighted descriptions.

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
    use super::*;

    #[test]
    fn escapes_markup_quotes_and_drops_control_characters() {
        assert_eq!(
            escape_html("<script>alert('x')</script> & \"y\"\u{0}\n"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;\n"
        );
    }
}
