//! Random damage to valid records, for the differential tests of the scanner's fast paths against the serde path
//! (test code only). A mutation works on characters, so the result is always a `&str` the readers can be given, and
//! it favours what a scanner can get wrong: JSON punctuation, escapes, digits, control and multi-byte characters,
//! and copies of a span (which make duplicate keys and repeated values).

use proptest::prelude::*;

/// Characters a mutation inserts or substitutes.
const ALPHABET: &[&str] = &[
    "\"", "\\", "{", "}", "[", "]", ",", ":", " ", "\n", "0", "9", "-", "+", ".", "e", "E", "n",
    "t", "f", "\u{1}", "\u{7f}", "é", "€", "𝄞", r"\u0065", r"\ud834", r#"\""#, "null", "true",
    "1e999", "-0",
];

/// One edit: `kind` picks delete / insert / replace / copy a span, `at` and `len` are reduced modulo the text.
#[derive(Debug, Clone)]
pub(crate) struct Edit {
    kind: u8,
    at: usize,
    len: usize,
    piece: usize,
}

/// Up to `max` edits.
pub(crate) fn edits(max: usize) -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(
        (0u8..4, any::<usize>(), 1usize..40, 0..ALPHABET.len()).prop_map(
            |(kind, at, len, piece)| Edit {
                kind,
                at,
                len,
                piece,
            },
        ),
        0..=max,
    )
}

/// `text` with `edits` applied in turn.
pub(crate) fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        let n = chars.len();
        let at = if n == 0 { 0 } else { e.at % (n + 1) };
        let piece: Vec<char> = ALPHABET[e.piece].chars().collect();
        match e.kind {
            0 if at < n => {
                chars.drain(at..(at + e.len.min(3)).min(n));
            }
            1 => {
                chars.splice(at..at, piece);
            }
            2 if at < n => {
                chars.splice(at..at + 1, piece);
            }
            3 if at < n => {
                let span: Vec<char> = chars[at..(at + e.len).min(n)].to_vec();
                chars.splice(at..at, span);
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

/// The non-blank lines of JSON Lines texts (fixtures and samples, included in the test binary).
pub(crate) fn lines(texts: &[&'static str]) -> Vec<&'static str> {
    texts
        .iter()
        .flat_map(|t| t.lines())
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// Runs `check` on every record whole, then on `cases` records damaged at random; `check` says whether it compared
/// the two paths on a text (the fast path read it) or not (it gave up). Returns (compared, damaged texts tried), so
/// that a caller can require a share of comparisons: a test whose damage the scanner always refused would
/// otherwise pass without comparing anything.
pub(crate) fn differential(
    records: &[&str],
    cases: u32,
    check: impl Fn(&str) -> Result<bool, TestCaseError>,
) -> (usize, usize) {
    use proptest::test_runner::{Config, TestRunner};
    use std::sync::atomic::{AtomicUsize, Ordering};
    for (i, r) in records.iter().enumerate() {
        match check(r) {
            Ok(true) => {}
            Ok(false) => panic!("the fast path gave up on undamaged record {i}"),
            Err(e) => panic!("undamaged record {i}: {e}"),
        }
    }
    let (compared, tried) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&(any::<usize>(), edits(4)), |(pick, e)| {
        let text = apply(records[pick % records.len()], &e);
        tried.fetch_add(1, Ordering::Relaxed);
        if check(&text)? {
            compared.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    (compared.into_inner(), tried.into_inner())
}
