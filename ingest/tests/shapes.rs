//! Every format in every shape (a document of one record or of several, concatenated values, a top-level array,
//! Langfuse's page envelope), plain, gzip and zstd: each fixture in `tests/fixtures/shapes` holds the records of the
//! format's JSON Lines fixture, laid out differently, and must read to exactly the same trajectories (same ids). A
//! broken structure is an error of the read that names its place.

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};
use tooltune_core::Trajectory;
use tooltune_ingest::{
    ChunkReader, Format, FormatChoice, IngestError, Parsed, ReadOptions, RecordError, Shape,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read_reader(
    mut r: ChunkReader<impl std::io::BufRead + Send>,
) -> Result<(Option<Format>, Shape, Vec<Parsed>), IngestError> {
    let mut out = Vec::new();
    while let Some(chunk) = r.next_chunk()? {
        assert!(!chunk.is_empty(), "chunks are never empty");
        out.extend(chunk);
    }
    Ok((r.format(), r.shape(), out))
}

fn read_file(
    path: &Path,
    choice: FormatChoice,
    opts: ReadOptions,
) -> Result<(Option<Format>, Shape, Vec<Parsed>), IngestError> {
    read_reader(ChunkReader::open(path, choice, opts)?)
}

fn read_bytes(
    bytes: Vec<u8>,
    name: &str,
    choice: FormatChoice,
    opts: ReadOptions,
) -> Result<(Option<Format>, Shape, Vec<Parsed>), IngestError> {
    read_reader(ChunkReader::decompressing(
        Cursor::new(bytes),
        name,
        choice,
        opts,
    )?)
}

fn trajectories(parsed: Vec<Parsed>, what: &str) -> Vec<Trajectory> {
    parsed
        .into_iter()
        .map(|p| p.result.unwrap_or_else(|e| panic!("{what}: {e}")))
        .collect()
}

/// The trajectories of the format's JSON Lines fixture, as its own test holds them to the expected ones.
fn jsonl_form(format: Format) -> Vec<Trajectory> {
    let (_, shape, parsed) = read_file(
        &fixture(&format!("{format}.jsonl")),
        FormatChoice::Fixed(format),
        ReadOptions::default(),
    )
    .expect("the JSON Lines fixture reads");
    assert_eq!(shape, Shape::Jsonl);
    trajectories(parsed, "jsonl")
}

fn assert_same(got: &[Trajectory], want: &[Trajectory], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: number of trajectories");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.id(), w.id(), "{what}: trajectory {i} has another id");
        assert_eq!(g, w, "{what}: trajectory {i}");
    }
}

/// The fixtures of one format: file, the shape it is in, and how many of the JSON Lines form's trajectories it
/// holds (a document of one record holds the first; OTLP's merges every span into one request, so holds all).
fn fixtures_of(format: Format) -> Vec<(String, Shape, Option<usize>)> {
    let mut v = vec![
        (format!("{format}.pretty.json"), Shape::Document, None),
        (format!("{format}.concatenated.json"), Shape::Document, None),
        (format!("{format}.array.json"), Shape::Array, None),
        (
            format!("{format}.document.json"),
            Shape::Document,
            (format != Format::Otel).then_some(1),
        ),
    ];
    match format {
        Format::Langfuse => {
            v.push(("langfuse.page.json".into(), Shape::Page, None));
            v.push(("langfuse.pages.json".into(), Shape::Page, None));
            v.push(("langfuse.jsonl.gz".into(), Shape::Jsonl, None));
        }
        Format::Tooltune => v.push(("tooltune.array.json.gz".into(), Shape::Array, None)),
        Format::Otel => v.push(("otel.array.json.zst".into(), Shape::Array, None)),
        Format::OpenAi => v.push(("openai.jsonl.zst".into(), Shape::Jsonl, None)),
    }
    v
}

fn check_format(format: Format) {
    let want = jsonl_form(format);
    for (name, shape, take) in fixtures_of(format) {
        let want = &want[..take.unwrap_or(want.len())];
        let path = fixture(&format!("shapes/{name}"));
        // Detected, and named; in chunks of every record, and in tiny chunks that cut the structure anywhere.
        for (choice, asked) in [
            (FormatChoice::Auto, Shape::Auto),
            (FormatChoice::Fixed(format), shape),
        ] {
            for (chunk_records, chunk_bytes) in [(2048, 8 << 20), (1, 1), (2, 700)] {
                let opts = ReadOptions {
                    chunk_records,
                    chunk_bytes,
                    shape: asked,
                    ..ReadOptions::default()
                };
                let (detected, read_shape, parsed) =
                    read_file(&path, choice, opts).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(detected, Some(format), "{name}");
                assert_eq!(read_shape, shape, "{name}");
                let got = trajectories(parsed, &name);
                assert_same(&got, want, &name);
            }
        }
    }
}

#[test]
fn tooltune_reads_alike_in_every_shape() {
    check_format(Format::Tooltune);
}

#[test]
fn openai_reads_alike_in_every_shape() {
    check_format(Format::OpenAi);
}

#[test]
fn langfuse_reads_alike_in_every_shape() {
    check_format(Format::Langfuse);
}

#[test]
fn otel_reads_alike_in_every_shape() {
    check_format(Format::Otel);
}

/// A reader handing out its bytes a few at a time, as a pipe can: every read ends somewhere inside the structure.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
    step: usize,
}

impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn short_reads_cut_records_anywhere_and_change_nothing() {
    for format in Format::ALL {
        let want = jsonl_form(format);
        for name in [
            format!("{format}.array.json"),
            format!("{format}.concatenated.json"),
        ] {
            let data = std::fs::read(fixture(&format!("shapes/{name}"))).expect("fixture");
            for step in [1, 7, 4096] {
                let reader = std::io::BufReader::with_capacity(
                    16,
                    Trickle {
                        data: data.clone(),
                        pos: 0,
                        step,
                    },
                );
                let opts = ReadOptions {
                    chunk_records: 1,
                    ..ReadOptions::default()
                };
                let r = ChunkReader::new(reader, &name, FormatChoice::Auto, opts).expect("opens");
                let (_, _, parsed) = read_reader(r).expect("reads");
                assert_same(&trajectories(parsed, &name), &want, &name);
            }
        }
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).expect("compress");
    e.finish().expect("compress")
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::encode_all(bytes, 3).expect("compress")
}

#[test]
fn gzip_and_zstd_are_read_by_name_and_by_magic_bytes() {
    for format in Format::ALL {
        let want = jsonl_form(format);
        for plain in [
            format!("{format}.jsonl"),
            format!("shapes/{format}.array.json"),
        ] {
            let bytes = std::fs::read(fixture(&plain)).expect("fixture");
            for (packed, ext) in [(gzip(&bytes), ".gz"), (zstd(&bytes), ".zst")] {
                // By name and magic alike, and by magic alone (standard input has no name).
                for name in [format!("traces{ext}"), "stdin".to_string()] {
                    let (detected, _, parsed) = read_bytes(
                        packed.clone(),
                        &name,
                        FormatChoice::Auto,
                        ReadOptions::default(),
                    )
                    .unwrap_or_else(|e| panic!("{plain} as {name}: {e}"));
                    assert_eq!(detected, Some(format));
                    assert_same(&trajectories(parsed, &plain), &want, &plain);
                }
            }
        }
    }
    // Two gzip members one after another (`cat a.gz b.gz`) read as their texts one after another.
    let line = std::fs::read(fixture("tooltune.jsonl")).expect("fixture");
    let mut twice = gzip(&line);
    twice.extend(gzip(&line));
    let (_, _, parsed) = read_bytes(
        twice,
        "t.jsonl.gz",
        FormatChoice::Auto,
        ReadOptions::default(),
    )
    .expect("reads");
    assert_eq!(parsed.len(), 2 * jsonl_form(Format::Tooltune).len());
}

#[test]
fn a_file_named_compressed_that_is_not_is_refused() {
    let err = read_bytes(
        b"{\"task\": \"x\"}\n".to_vec(),
        "traces.jsonl.gz",
        FormatChoice::Auto,
        ReadOptions::default(),
    )
    .expect_err("not gzip");
    assert!(
        err.to_string().contains("not start like gzip data"),
        "{err}"
    );
}

#[test]
fn a_gzip_file_cut_short_is_an_error_naming_the_line_reached() {
    let bytes = std::fs::read(fixture("langfuse.jsonl")).expect("fixture");
    let packed = gzip(&bytes);
    for cut in [packed.len() / 2, packed.len() - 4] {
        let err = read_bytes(
            packed[..cut].to_vec(),
            "traces.jsonl.gz",
            FormatChoice::Auto,
            ReadOptions::default(),
        )
        .expect_err("cut short");
        assert!(
            matches!(err, IngestError::Io { line: Some(_), .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.starts_with("traces.jsonl.gz:"), "{text}");
        assert!(text.contains("gzip data"), "{text}");
    }
    let packed = zstd(&bytes);
    let err = read_bytes(
        packed[..packed.len() / 2].to_vec(),
        "traces.jsonl.zst",
        FormatChoice::Auto,
        ReadOptions::default(),
    )
    .expect_err("cut short");
    assert!(err.to_string().contains("zstd data"), "{err}");
}

fn read_str(text: &str, choice: FormatChoice, shape: Shape) -> Result<Vec<Parsed>, IngestError> {
    let opts = ReadOptions {
        shape,
        ..ReadOptions::default()
    };
    read_bytes(text.as_bytes().to_vec(), "traces.json", choice, opts).map(|(_, _, p)| p)
}

fn malformed(e: IngestError) -> (u64, u64, Option<String>, String) {
    match e {
        IngestError::Malformed {
            source_name,
            line,
            column,
            place,
            message,
        } => {
            assert_eq!(source_name, "traces.json");
            (line, column, place, message)
        }
        other => panic!("not a malformed input: {other:?}"),
    }
}

const GOOD: &str = r#"{"task": "Sum notes.txt.", "tools": [{"name": "read_file"}], "steps": [{"type": "model", "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]}, {"type": "tool_result", "call_id": "c1", "name": "read_file", "content": "4"}], "final_answer": "4"}"#;

#[test]
fn broken_structures_are_refused_with_their_place() {
    // A truncated array: cut inside its third record.
    let text = format!("[\n  {GOOD},\n  {GOOD},\n  {}", &GOOD[..40]);
    let e = read_str(&text, FormatChoice::Auto, Shape::Auto).expect_err("truncated");
    assert_eq!(e.to_string().lines().count(), 1);
    let (line, column, place, message) = malformed(e);
    assert_eq!((line, column, place.as_deref()), (4, 3, Some("[2]")));
    assert!(message.contains("ends inside this value"), "{message}");
    // An array whose last `]` is missing.
    let e = read_str(
        &format!("[{GOOD}, {GOOD}\n"),
        FormatChoice::Auto,
        Shape::Auto,
    )
    .expect_err("not closed");
    let (line, _, _, message) = malformed(e);
    assert_eq!(line, 2);
    assert!(message.contains("not closed by `]`"), "{message}");

    // A page whose `data` is not a list.
    let e = read_str(
        "{\n  \"data\": {\"id\": \"t\"},\n  \"meta\": {\"page\": 1}\n}",
        FormatChoice::Fixed(Format::Langfuse),
        Shape::Auto,
    )
    .expect_err("data is an object");
    let e2 = e.to_string();
    assert!(
        e2.starts_with("traces.json:2:11: data: the page's `data` is not a list"),
        "{e2}"
    );

    // An empty document, whitespace only, and a document that is `{}`.
    let e = read_str("\n  \n", FormatChoice::Auto, Shape::Document).expect_err("empty");
    let (line, column, _, message) = malformed(e);
    assert_eq!((line, column), (3, 1));
    assert!(message.contains("empty document"), "{message}");
    let e = read_str("{\n}\n", FormatChoice::Auto, Shape::Auto).expect_err("no keys");
    assert!(e.to_string().contains("(line 1) has no keys"), "{e}");

    // Not JSON between records.
    let e = read_str(
        &format!("[{GOOD}; {GOOD}]"),
        FormatChoice::Auto,
        Shape::Auto,
    )
    .expect_err("semicolon");
    assert!(
        e.to_string()
            .contains("expected `,` or `]` after a record, found `;`"),
        "{e}"
    );
}

#[test]
fn an_empty_array_or_page_holds_no_records() {
    for text in ["[]", "  [ ]\n", "{\"data\": [], \"meta\": {\"page\": 1}}"] {
        let (format, _, parsed) = read_bytes(
            text.as_bytes().to_vec(),
            "empty.json",
            FormatChoice::Auto,
            ReadOptions::default(),
        )
        .expect("reads");
        assert_eq!(format, None, "{text}");
        assert!(parsed.is_empty());
    }
}

fn errors(parsed: &[Parsed]) -> Vec<&RecordError> {
    parsed
        .iter()
        .filter_map(|p| p.result.as_ref().err())
        .collect()
}

#[test]
fn a_bad_record_names_its_line_column_and_index_and_the_others_still_read() {
    let bad = GOOD.replace("\"type\": \"model\"", "\"type\": \"robot\"");
    // Pretty-printed array: the bad record is the second, at line 3, column 3.
    let text = format!("[\n  {GOOD},\n  {bad},\n  {GOOD}\n]\n");
    let parsed = read_str(&text, FormatChoice::Auto, Shape::Auto).expect("reads");
    assert_eq!(parsed.len(), 3);
    let e = errors(&parsed);
    assert_eq!(e.len(), 1);
    let e = e[0];
    assert_eq!((e.line, e.column), (3, Some(3)));
    let path = e.path.as_deref().expect("a path");
    assert!(path.starts_with("[1].steps[0]"), "{e}");
    // The fault's own position is in the input, on the record's line.
    assert!(e.message.contains("(line 3, column "), "{e}");
    assert!(
        e.without_line().starts_with(&format!("column 3, {path}: ")),
        "{}",
        e.without_line()
    );

    // In a page the index is `data[i]`.
    let text = format!("{{\"data\": [{GOOD},\n{bad}], \"meta\": {{}}}}");
    let parsed =
        read_str(&text, FormatChoice::Fixed(Format::Tooltune), Shape::Auto).expect("reads");
    let e = errors(&parsed);
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].line, e[0].column), (2, Some(1)));
    assert!(
        e[0].path
            .as_deref()
            .is_some_and(|p| p.starts_with("data[1].steps[0]")),
        "{}",
        e[0]
    );

    // A Langfuse page: the index comes before the record's own path.
    let page = std::fs::read_to_string(fixture("shapes/langfuse.page.json")).expect("fixture");
    let broken = page.replacen("\"startTime\": \"", "\"startTime\": 17, \"x\": \"", 1);
    assert_ne!(broken, page);
    let parsed = read_str(&broken, FormatChoice::Auto, Shape::Auto).expect("reads");
    let e = errors(&parsed);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].path
            .as_deref()
            .is_some_and(|p| p.starts_with("data[0].observations[0]")),
        "{}",
        e[0]
    );
    assert_eq!(parsed.iter().filter(|p| p.result.is_ok()).count(), 2);
}

#[test]
fn a_record_over_the_limit_is_skipped_unread_with_its_index() {
    let opts = ReadOptions {
        max_record_bytes: 1000,
        ..ReadOptions::default()
    };
    // Found complete in one read, a record over the limit is dropped; one larger than what is read ahead is found
    // over the limit while still incomplete, and read through to its end without being kept.
    for (answer, step) in [(5_000, usize::MAX), (200_000, 100)] {
        let big = GOOD.replace(
            "\"final_answer\": \"4\"",
            &format!("\"final_answer\": \"{}\"", "x".repeat(answer)),
        );
        let text = format!("[{GOOD},\n{big},\n{GOOD}]");
        let reader = std::io::BufReader::with_capacity(
            16,
            Trickle {
                data: text.into_bytes(),
                pos: 0,
                step,
            },
        );
        let r = ChunkReader::new(reader, "traces.json", FormatChoice::Auto, opts).expect("opens");
        let (_, _, parsed) = read_reader(r).expect("reads");
        assert_eq!(parsed.len(), 3);
        let e = errors(&parsed);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!((e[0].line, e[0].column), (2, Some(1)));
        assert_eq!(e[0].path.as_deref(), Some("[1]"));
        assert_eq!(
            e[0].message,
            format!(
                "record is {} bytes, over the limit of 1000 bytes",
                big.len()
            )
        );
        assert_eq!(
            parsed[2].line, 3,
            "reading goes on after the skipped record"
        );
        assert!(parsed[2].result.is_ok());
    }
}
