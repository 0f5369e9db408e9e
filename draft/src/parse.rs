//! Reading the drafting model's replies (numbered lists of requests, verdicts on reference results) and deciding
//! what answer check a reference result supports. Pure, and lenient where a small model's layout varies, strict
//! where a wrong reading would put a bad task in the suite.

use tooltune_evaluator::suite::numbers_in;

/// Why a drafted request line was not kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineRejection {
    /// Fewer than three words, or no letters.
    TooShort,
    /// Longer than [`MAX_REQUEST_CHARS`].
    TooLong,
    /// It names the tool (`list_directory`): a user does not know tool names, and a request that names the tool
    /// tests nothing.
    NamesTheTool(String),
    /// It holds code, JSON or the prompt's data delimiters (backticks, braces, an arrow, guillemets): a small model
    /// echoing the prompt, not a request.
    LooksLikeCode,
}

/// The longest request kept, in characters.
pub const MAX_REQUEST_CHARS: usize = 300;

/// The requests of a numbered (or bulleted) list reply, in order (repeats included: the caller drops them with a
/// reason), with the lines that looked like items but were refused. Lines that are not list items (a preamble, "Sure! Here are…") are ignored; a reply without any list
/// item gives nothing.
pub fn requests(reply: &str, tool_names: &[&str]) -> (Vec<String>, Vec<(String, LineRejection)>) {
    let mut kept: Vec<String> = Vec::new();
    let mut refused = Vec::new();
    for line in reply.lines() {
        let Some(item) = list_item(line) else {
            continue;
        };
        let text = unquote(&strip_commentary(item));
        if text.is_empty() || text.ends_with(':') {
            continue;
        }
        let words = text.split_whitespace().count();
        if words < 3 || !text.chars().any(char::is_alphabetic) {
            refused.push((text, LineRejection::TooShort));
            continue;
        }
        if text.chars().count() > MAX_REQUEST_CHARS {
            refused.push((text, LineRejection::TooLong));
            continue;
        }
        if text.contains(['`', '{', '}', '«', '»', '‹', '›'])
            || text.contains("->")
            || text.contains("=>")
        {
            refused.push((text, LineRejection::LooksLikeCode));
            continue;
        }
        if let Some(n) = tool_names
            .iter()
            .find(|n| n.contains(['_', '-']) && text.to_lowercase().contains(&n.to_lowercase()))
        {
            refused.push((text, LineRejection::NamesTheTool(n.to_string())));
            continue;
        }
        kept.push(text);
    }
    (kept, refused)
}

/// The request without a trailing parenthetical comment of six words or more (`Will it rain? (This request would
/// be served by …)`): the 1.5B explained its requests that way, and the comment is not part of what a user types.
fn strip_commentary(item: &str) -> String {
    if let Some(at) = item.find(" (") {
        let comment = &item[at + 2..];
        if comment.split_whitespace().count() >= 6 {
            return item[..at].trim().to_string();
        }
    }
    item.to_string()
}

/// The text of a list item line (`1. …`, `2) …`, `- …`, `* …`), or `None`.
fn list_item(line: &str) -> Option<&str> {
    let t = line.trim();
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && digits <= 3 {
        let rest = &t[digits..];
        if let Some(r) = rest.strip_prefix('.').or_else(|| rest.strip_prefix(')')) {
            return Some(r.trim());
        }
        return None;
    }
    ["- ", "* ", "• "]
        .iter()
        .find_map(|p| t.strip_prefix(p))
        .map(str::trim)
}

/// Strips markdown emphasis and one pair of surrounding quotes.
fn unquote(s: &str) -> String {
    let s = s.trim().trim_matches('*').trim();
    let pairs = [
        ('"', '"'),
        ('\'', '\''),
        ('“', '”'),
        ('«', '»'),
        ('‹', '›'),
        ('`', '`'),
    ];
    for (a, b) in pairs {
        if let Some(inner) = s.strip_prefix(a).and_then(|r| r.strip_suffix(b)) {
            return inner.trim().to_string();
        }
    }
    s.to_string()
}

/// Whether two requests are the same once case, punctuation and spacing are set aside; used to drop repeats, also
/// against the tasks already in a suite (`--more`).
pub fn same_request(a: &str, b: &str) -> bool {
    normalise(a) == normalise(b)
}

/// A request reduced to its lowercase words.
pub fn normalise(s: &str) -> String {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The drafting model's verdict on a reference result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the result gives what the request asks for.
    pub answers: bool,
    /// The text of the result that answers it, when the model named one.
    pub value: Option<String>,
}

/// Reads an `ANSWERS: yes|no` / `VALUE: …` reply; `None` when there is no `ANSWERS:` line with yes or no.
pub fn verdict(reply: &str) -> Option<Verdict> {
    let mut answers = None;
    let mut value = None;
    for line in reply.lines() {
        let t = line.trim().trim_matches('*').trim();
        let upper = t.to_uppercase();
        if let Some(rest) = upper.strip_prefix("ANSWERS:") {
            let first = rest
                .split_whitespace()
                .map(|w| w.trim_matches(|c: char| !c.is_alphabetic()))
                .find(|w| !w.is_empty());
            answers = match first {
                Some("YES") => Some(true),
                Some("NO") => Some(false),
                _ => answers,
            };
        } else if upper.starts_with("VALUE:") {
            let v = unquote(t["VALUE:".len()..].trim());
            let none = v.is_empty()
                || matches!(
                    normalise(&v).as_str(),
                    "none" | "n a" | "na" | "nothing" | "no value"
                );
            value = (!none).then_some(v);
        }
    }
    answers.map(|answers| Verdict { answers, value })
}

/// The answer check a reference result supports.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// Some number in the answer must equal it (`answer.number`).
    Number(f64),
    /// The answer must contain it (`answer.contains`).
    Contains(String),
}

impl Check {
    /// The tolerance an `answer.number` check is written with: none for a whole number, a millionth of it for
    /// one with a fraction, since a tool's floating-point result prints with noise (`2350 * 0.17` is
    /// `399.50000000000006`) that an agent rounds away.
    pub fn tolerance(&self) -> f64 {
        match self {
            Check::Number(n) if n.fract() != 0.0 => n.abs() * 1e-6,
            _ => 0.0,
        }
    }
}

/// Why a value did not become an answer check (the task is then routing-only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoCheck {
    /// The model named no value.
    NoValue,
    /// The value is not in the result (the model made it up or reworded it).
    NotInResult,
    /// The value is not in the result of the same call made again: it changes from call to call (a clock, a
    /// random id).
    Unstable,
    /// Too long or too vague to check an answer by (a sentence, a whole listing).
    NotAStableValue,
}

impl NoCheck {
    /// Words for the review page.
    pub fn describe(&self) -> &'static str {
        match self {
            NoCheck::NoValue => "the model named no value in the result",
            NoCheck::NotInResult => "the value the model named is not in the result",
            NoCheck::Unstable => "the value changed when the call was repeated",
            NoCheck::NotAStableValue => "the value is longer than a number, name or date",
        }
    }
}

/// The longest value taken as an `answer.contains` check, in characters and words: a name, a date, an id; not a
/// sentence, which an agent would paraphrase.
const MAX_VALUE_CHARS: usize = 60;
const MAX_VALUE_WORDS: usize = 6;

/// The answer check for `value`, given the reference result and the result of the same call made a second time.
pub fn answer_check(value: Option<&str>, result: &str, again: &str) -> Result<Check, NoCheck> {
    let v = value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or(NoCheck::NoValue)?;
    let v = v.trim_end_matches(['.', ',', ';']).trim();
    let lower = |s: &str| s.to_lowercase();
    let numbers = numbers_in(v);
    // A value that is one number (with a unit or currency sign around it at most) is checked as a number, which
    // reads `69,504` and `69504` alike.
    let only_number = numbers.len() == 1
        && v.chars().filter(|c| c.is_alphabetic()).count() <= 3
        && v.chars().any(|c| c.is_ascii_digit());
    if only_number {
        let n = numbers[0];
        let has = |text: &str| numbers_in(text).iter().any(|x| (x - n).abs() < 1e-9);
        if !has(result) {
            return Err(NoCheck::NotInResult);
        }
        if !has(again) {
            return Err(NoCheck::Unstable);
        }
        return Ok(Check::Number(n));
    }
    if !lower(result).contains(&lower(v)) {
        return Err(NoCheck::NotInResult);
    }
    if v.chars().count() > MAX_VALUE_CHARS
        || v.split_whitespace().count() > MAX_VALUE_WORDS
        || v.chars().filter(|c| c.is_alphanumeric()).count() < 2
    {
        return Err(NoCheck::NotAStableValue);
    }
    if !lower(again).contains(&lower(v)) {
        return Err(NoCheck::Unstable);
    }
    Ok(Check::Contains(v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_and_bulleted_items_are_read_and_chatter_ignored() {
        let reply = "Sure! Here are some requests:\n1. \"What is in the notes file?\"\n2) Show me the team list \
                     please\n- **How many items are in the inventory?**\n3. ok\n4. Call list_files on the root \
                     folder\n5. what is in the NOTES file\n6. `read_file {path=\"a\"}` -> a\n\nHope this helps.";
        let (kept, refused) = requests(reply, &["list_files", "read_file"]);
        assert_eq!(
            kept,
            [
                "What is in the notes file?",
                "Show me the team list please",
                "How many items are in the inventory?",
                "what is in the NOTES file"
            ]
        );
        assert!(same_request(&kept[0], &kept[3]));
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert_eq!(refused[2].1, LineRejection::LooksLikeCode);
        assert_eq!(refused[0].1, LineRejection::TooShort);
        assert_eq!(
            refused[1].1,
            LineRejection::NamesTheTool("list_files".into())
        );
        assert!(requests("I cannot help with that.", &[]).0.is_empty());
    }

    #[test]
    fn a_trailing_comment_is_not_part_of_the_request() {
        let reply = "1. What is in the q1 report? (This request would be served by the other tool, wrongly.)\n\
                     2. Show the files (all of them)";
        let (kept, _) = requests(reply, &[]);
        assert_eq!(
            kept,
            ["What is in the q1 report?", "Show the files (all of them)"]
        );
    }

    #[test]
    fn verdicts_are_read_leniently_and_refused_without_yes_or_no() {
        assert_eq!(
            verdict("ANSWERS: yes\nVALUE: 69,504"),
            Some(Verdict {
                answers: true,
                value: Some("69,504".into())
            })
        );
        assert_eq!(
            verdict("**Answers:** No.\nValue: none"),
            Some(Verdict {
                answers: false,
                value: None
            })
        );
        assert_eq!(
            verdict("answers: Yes, it does\nVALUE: \"Joon Lee\""),
            Some(Verdict {
                answers: true,
                value: Some("Joon Lee".into())
            })
        );
        assert_eq!(verdict("The result lists three files."), None);
        assert_eq!(verdict("ANSWERS: maybe"), None);
    }

    #[test]
    fn answer_checks_need_a_short_value_found_in_both_results() {
        let r = "Total attendees: 48,000. Treasurer: Joon Lee.";
        assert_eq!(
            answer_check(Some("48000"), r, r),
            Ok(Check::Number(48000.0))
        );
        assert_eq!(
            answer_check(Some("$48,000"), r, r),
            Ok(Check::Number(48000.0))
        );
        assert_eq!(
            answer_check(Some("Joon Lee."), r, r),
            Ok(Check::Contains("Joon Lee".into()))
        );
        assert_eq!(answer_check(None, r, r), Err(NoCheck::NoValue));
        assert_eq!(answer_check(Some("Ada"), r, r), Err(NoCheck::NotInResult));
        assert_eq!(answer_check(Some("49000"), r, r), Err(NoCheck::NotInResult));
        let later = "Total attendees: 48,001. Treasurer: Joon Lee.";
        assert_eq!(
            answer_check(Some("48000"), r, later),
            Err(NoCheck::Unstable)
        );
        let r2 = "Total attendees: 48,000 at the spring meeting in Lisbon. Treasurer: Joon Lee.";
        let long = "Total attendees: 48,000 at the spring meeting in Lisbon";
        assert_eq!(
            answer_check(Some(long), r2, r2),
            Err(NoCheck::NotAStableValue)
        );
    }
}
