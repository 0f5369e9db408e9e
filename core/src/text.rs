//! Text helpers for showing untrusted or long text in one line, shared by the terminal output and the dashboard.

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

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_collapses_whitespace_and_cuts_with_an_ellipsis() {
        assert_eq!(super::one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(super::one_line("abcdef", 4), "abc…");
        assert_eq!(super::one_line("abcdef", 6), "abcdef");
    }
}
