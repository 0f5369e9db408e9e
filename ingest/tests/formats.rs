//! Each format's fixture (the lecture's notes.txt task: a success, a failure, a recovery from a tool error) must
//! produce exactly the trajectories in its `.expected.jsonl`, under auto-detection and with the format named.

use std::path::PathBuf;
use tooltune_core::Trajectory;
use tooltune_ingest::{ChunkReader, Format, FormatChoice, Parsed, ReadOptions};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read_all(
    path: &std::path::Path,
    choice: FormatChoice,
    opts: ReadOptions,
) -> (Option<Format>, Vec<Parsed>) {
    let mut r = ChunkReader::open(path, choice, opts).expect("open");
    let mut out = Vec::new();
    while let Some(chunk) = r.next_chunk().expect("read") {
        assert!(!chunk.is_empty(), "chunks are never empty");
        out.extend(chunk);
    }
    (r.format(), out)
}

fn expected(format: Format) -> Vec<Trajectory> {
    let text = std::fs::read_to_string(fixture(&format!("{format}.expected.jsonl")))
        .expect("expected file");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("expected trajectory"))
        .collect()
}

fn check(format: Format) {
    for choice in [FormatChoice::Auto, FormatChoice::Fixed(format)] {
        // Tiny chunks make OTLP traces straddle chunk boundaries as well as lines.
        for chunk_records in [1, 2048] {
            let opts = ReadOptions {
                chunk_records,
                ..ReadOptions::default()
            };
            let (detected, parsed) = read_all(&fixture(&format!("{format}.jsonl")), choice, opts);
            assert_eq!(detected, Some(format));
            let got: Vec<Trajectory> = parsed
                .into_iter()
                .map(|p| p.result.unwrap_or_else(|e| panic!("{format}: {e}")))
                .collect();
            let want = expected(format);
            assert_eq!(got.len(), want.len(), "{format}: number of trajectories");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g,
                    w,
                    "{format} trajectory {i}:\n got {}\nwant {}",
                    serde_json::to_string(g).expect("json"),
                    serde_json::to_string(w).expect("json")
                );
            }
        }
    }
}

#[test]
fn tooltune_fixture_reads_exactly() {
    check(Format::Tooltune);
}

#[test]
fn openai_fixture_reads_exactly() {
    check(Format::OpenAi);
}

#[test]
fn langfuse_fixture_reads_exactly() {
    check(Format::Langfuse);
}

#[test]
fn otel_fixture_reads_exactly() {
    check(Format::Otel);
}

/// The same three runs logged four ways agree on what matters for optimisation: task, tools shown, tools called,
/// answer and verdict.
#[test]
fn the_four_formats_agree_on_the_runs() {
    let summary = |t: &Trajectory| {
        (
            t.task.clone(),
            t.tools
                .iter()
                .map(|x| x.description_id())
                .collect::<Vec<_>>(),
            t.tool_calls()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect::<Vec<_>>(),
            t.final_answer.clone(),
            t.outcome.effective_success(),
        )
    };
    let mut per_format = Vec::new();
    for f in Format::ALL {
        let (_, parsed) = read_all(
            &fixture(&format!("{f}.jsonl")),
            FormatChoice::Auto,
            ReadOptions::default(),
        );
        let mut s: Vec<_> = parsed
            .into_iter()
            .map(|p| summary(&p.result.expect("valid")))
            .collect();
        s.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        per_format.push((f, s));
    }
    let (first_format, first) = &per_format[0];
    for (f, s) in &per_format[1..] {
        assert_eq!(s, first, "{f} disagrees with {first_format}");
    }
    let success_answer = first
        .iter()
        .find(|s| s.4 == Some(true))
        .and_then(|s| s.3.clone())
        .expect("a successful run");
    assert!(success_answer.contains("69504"), "{success_answer}");
    assert!(first.iter().any(|s| s.4 == Some(false)), "a failing run");
}

/// The shipped samples (the README's first command ingests them) all parse, and they show several tools, two
/// description versions of one tool, successes and failures.
#[test]
fn samples_parse_and_are_varied() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples");
    for f in Format::ALL {
        let (detected, parsed) = read_all(
            &dir.join(format!("{f}.jsonl")),
            FormatChoice::Auto,
            ReadOptions::default(),
        );
        assert_eq!(detected, Some(f));
        let ts: Vec<Trajectory> = parsed
            .into_iter()
            .map(|p| p.result.unwrap_or_else(|e| panic!("sample {f}: {e}")))
            .collect();
        assert!(
            (10..=20).contains(&ts.len()),
            "{f}: {} trajectories",
            ts.len()
        );
        let mut names = std::collections::BTreeSet::new();
        let mut calc_versions = std::collections::BTreeSet::new();
        for t in &ts {
            for tool in &t.tools {
                names.insert(tool.name.clone());
                if tool.name == "calculator" {
                    calc_versions.insert(tool.description_id());
                }
            }
        }
        assert!(names.len() >= 3, "{f}: tools {names:?}");
        assert_eq!(
            calc_versions.len(),
            2,
            "{f}: calculator description versions"
        );
        let wins = ts
            .iter()
            .filter(|t| t.outcome.effective_success() == Some(true))
            .count();
        assert!(
            wins > 0 && wins < ts.len(),
            "{f}: {wins} successes of {}",
            ts.len()
        );
    }
}
