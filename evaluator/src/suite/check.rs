//! The pure checks that score one rollout: the final answer against a task's [`AnswerCheck`], the tools called
//! against its expected calls, and the fixture checks' outcomes, with feedback a reflector can read.

use super::{AnswerCheck, CheckResult, Task};

/// The numbers in a text, in order. Thousands separators are understood (`69,504` is 69504); a `-`
/// counts as a sign only at the start or after a space or bracket, so dates (`2026-09-01`) and ranges
/// (`10-12`) yield positive numbers.
pub fn numbers_in(text: &str) -> Vec<f64> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        // A digit glued to a letter or an underscore (v2, QM-4092 is fine, x86) is part of a name.
        if i > 0 && (bytes[i - 1].is_ascii_alphabetic() || bytes[i - 1] == b'_') {
            while i < bytes.len() && bytes[i].is_ascii_alphanumeric() {
                i += 1;
            }
            continue;
        }
        let start = i;
        let negative = start > 0
            && bytes[start - 1] == b'-'
            && (start == 1
                || matches!(bytes[start - 2], b' ' | b'(' | b'=' | b':' | b'\n' | b'\t'));
        let mut digits = String::new();
        // Integer part, with thousands groups only when every group has exactly three digits.
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            digits.push(bytes[i] as char);
            i += 1;
        }
        // Thousands groups (`69,504`) only after a lead of at most three digits, and only groups of
        // exactly three digits: "4, 48000" and "1,2345" are separate numbers.
        if digits.len() <= 3 {
            while i + 3 < bytes.len()
                && bytes[i] == b','
                && bytes[i + 1..i + 4].iter().all(u8::is_ascii_digit)
                && (i + 4 == bytes.len() || !bytes[i + 4].is_ascii_digit())
            {
                digits.extend(bytes[i + 1..i + 4].iter().map(|b| *b as char));
                i += 4;
            }
        }
        if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
            digits.push('.');
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                digits.push(bytes[i] as char);
                i += 1;
            }
        }
        if let Ok(v) = digits.parse::<f64>() {
            out.push(if negative { -v } else { v });
        }
    }
    out
}

fn normalise(s: &str, ignore_case: bool) -> String {
    let t = s.trim();
    let t = t.strip_suffix('.').unwrap_or(t).trim();
    if ignore_case {
        t.to_lowercase()
    } else {
        t.to_string()
    }
}

fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

impl AnswerCheck {
    pub(super) fn is_empty(&self) -> bool {
        self.exact.is_none()
            && self.regex.is_none()
            && self.number.is_none()
            && self.contains.is_empty()
    }

    fn case(&self, s: &str) -> String {
        if self.ignore_case {
            s.to_lowercase()
        } else {
            s.to_string()
        }
    }

    /// Checks a final answer; returns the failures (empty when it passes).
    pub fn failures(&self, answer: &str) -> Vec<String> {
        let mut fails = Vec::new();
        if let Some(x) = &self.exact
            && normalise(answer, self.ignore_case) != normalise(x, self.ignore_case)
        {
            fails.push(format!("expected exactly {x:?}"));
        }
        if let Some(r) = &self.regex
            && !r.is_match(answer)
        {
            fails.push(format!("expected text matching /{}/", r.as_str()));
        }
        if let Some(n) = self.number {
            let found = numbers_in(answer);
            if !found.iter().any(|got| (got - n).abs() <= self.tolerance) {
                let tol = if self.tolerance > 0.0 {
                    format!(" (±{})", self.tolerance)
                } else {
                    String::new()
                };
                fails.push(if found.is_empty() {
                    format!(
                        "expected the number {}{tol}, but the answer contains no number",
                        fmt_num(n)
                    )
                } else {
                    format!(
                        "expected the number {}{tol}, but the answer's numbers are {}",
                        fmt_num(n),
                        found
                            .iter()
                            .map(|x| fmt_num(*x))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                });
            }
        }
        let hay = self.case(answer);
        let missing: Vec<&str> = self
            .contains
            .iter()
            .filter(|c| !hay.contains(&self.case(c)))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            fails.push(format!("expected the answer to mention {missing:?}"));
        }
        fails
    }

    /// Whether the expected answer can be found anywhere in `text` (a tool result, say): the exact
    /// string or every `contains` string occurs, the regex matches, or some number equals `number`.
    /// Used to prove a task is solvable with its owner tool and not with the others.
    pub fn found_in(&self, text: &str) -> bool {
        let hay = self.case(text);
        let exact = self
            .exact
            .as_ref()
            .is_none_or(|x| hay.contains(&normalise(x, self.ignore_case)));
        let regex = self.regex.as_ref().is_none_or(|r| r.is_match(text));
        let number = self.number.is_none_or(|n| {
            numbers_in(text)
                .iter()
                .any(|got| (got - n).abs() <= self.tolerance)
        });
        let contains = self.contains.iter().all(|c| hay.contains(&self.case(c)));
        exact && regex && number && contains
    }

    /// A short description of the expected answer, for feedback.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(x) = &self.exact {
            parts.push(format!("exactly {x:?}"));
        }
        if let Some(r) = &self.regex {
            parts.push(format!("/{}/", r.as_str()));
        }
        if let Some(n) = self.number {
            parts.push(format!("the number {}", fmt_num(n)));
        }
        if !self.contains.is_empty() {
            parts.push(format!("mentioning {:?}", self.contains));
        }
        parts.join(" and ")
    }
}

/// Whether `want` occurs in `calls` as a subsequence (in order, gaps allowed).
fn is_subsequence<S: AsRef<str>>(want: &[String], calls: &[S]) -> bool {
    let mut it = calls.iter();
    want.iter()
        .all(|w| it.by_ref().any(|c| c.as_ref() == w.as_str()))
}

impl Task {
    /// Scores one rollout from its final answer (`None` when the agent gave none, e.g. it ran out of
    /// steps) and the names of the tools it called, in order. Pure: no IO, no model.
    pub fn check<S: AsRef<str>>(
        &self,
        final_answer: Option<&str>,
        tools_called: &[S],
    ) -> CheckResult {
        self.check_with_world(final_answer, tools_called, &[])
    }

    /// [`Task::check`], plus the verdicts of the checks on the rollout's copy of the fixture (`expect_file`,
    /// `expect_command`; see `fixture::check_world`), each a check group of its own: passed, and what it found.
    pub fn check_with_world<S: AsRef<str>>(
        &self,
        final_answer: Option<&str>,
        tools_called: &[S],
        world: &[(bool, String)],
    ) -> CheckResult {
        let called: Vec<&str> = tools_called.iter().map(AsRef::as_ref).collect();
        let called_text = if called.is_empty() {
            "no tool".to_string()
        } else {
            called.join(" -> ")
        };
        let mut groups = 0usize;
        let mut passed = 0usize;
        let mut fails: Vec<String> = Vec::new();
        let mut oks: Vec<String> = Vec::new();

        if let Some(a) = &self.answer {
            groups += 1;
            match final_answer {
                None => fails.push(format!("no final answer (expected {})", a.describe())),
                Some(ans) => {
                    let f = a.failures(ans);
                    if f.is_empty() {
                        passed += 1;
                        oks.push(format!("answer is {}", a.describe()));
                    } else {
                        fails.extend(f.into_iter().map(|m| format!("answer: {m}")));
                    }
                }
            }
        }
        if !self.expect_tools.is_empty() {
            groups += 1;
            let ok = if self.expect_order {
                is_subsequence(&self.expect_tools, &called)
            } else {
                self.expect_tools
                    .iter()
                    .all(|t| called.contains(&t.as_str()))
            };
            if ok {
                passed += 1;
                oks.push(format!("called {}", self.expect_tools.join(", ")));
            } else {
                let missing: Vec<&str> = self
                    .expect_tools
                    .iter()
                    .filter(|t| !called.contains(&t.as_str()))
                    .map(String::as_str)
                    .collect();
                fails.push(if missing.is_empty() {
                    format!(
                        "tools: expected {} in this order, called {called_text}",
                        self.expect_tools.join(" -> ")
                    )
                } else {
                    format!(
                        "tools: expected {} to be called but {} was not (called {called_text})",
                        self.expect_tools.join(", "),
                        missing.join(", ")
                    )
                });
            }
        }
        if !self.forbid_tools.is_empty() {
            groups += 1;
            let bad: Vec<&str> = self
                .forbid_tools
                .iter()
                .filter(|t| called.contains(&t.as_str()))
                .map(String::as_str)
                .collect();
            if bad.is_empty() {
                passed += 1;
            } else {
                fails.push(format!(
                    "tools: {} must not be used for this task (called {called_text})",
                    bad.join(", ")
                ));
            }
        }
        for (ok, what) in world {
            groups += 1;
            if *ok {
                passed += 1;
                oks.push(what.clone());
            } else {
                fails.push(what.clone());
            }
        }
        let success = fails.is_empty();
        let score = if groups == 0 {
            0.0
        } else {
            passed as f64 / groups as f64
        };
        let feedback = if success {
            format!("passed: {} (tools: {called_text})", oks.join("; "))
        } else {
            format!("failed: {}", fails.join("; "))
        };
        CheckResult {
            success,
            score,
            feedback,
        }
    }
}
