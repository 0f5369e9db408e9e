//! Bad input is reported per record with its line, JSON path and a message a user can act on; only IO failures
//! and undetectable formats fail the read.

use std::io::{BufRead, BufReader, Cursor, Read, Write};
use tooltune_ingest::{ChunkReader, Format, FormatChoice, IngestError, Parsed, ReadOptions, Shape};

const GOOD: &str = r#"{"task": "Read notes.txt and sum the numbers in it.", "tools": [{"name": "read_file", "description": "Read a file."}, {"name": "calculator", "description": "Evaluate arithmetic."}], "steps": [{"type": "model", "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]}, {"type": "tool_result", "call_id": "c1", "name": "read_file", "content": "Attendees: 4"}, {"type": "model", "content": "69504"}], "final_answer": "69504", "outcome": {"score": 1.0}}"#;

fn read_bytes(
    bytes: Vec<u8>,
    choice: FormatChoice,
    opts: ReadOptions,
) -> (Option<Format>, Vec<Parsed>) {
    let mut r = ChunkReader::new(Cursor::new(bytes), "test.jsonl", choice, opts).expect("reader");
    let mut out = Vec::new();
    while let Some(chunk) = r.next_chunk().expect("read") {
        out.extend(chunk);
    }
    (r.format(), out)
}

fn read_str(s: &str, choice: FormatChoice) -> Vec<Parsed> {
    read_bytes(s.as_bytes().to_vec(), choice, ReadOptions::default()).1
}

fn only_error(parsed: &[Parsed], line: u64) -> tooltune_ingest::RecordError {
    let p = parsed
        .iter()
        .find(|p| p.line == line)
        .expect("a result for the line");
    p.result.clone().expect_err("an error on the line")
}

#[test]
fn invalid_utf8_names_the_byte_offset() {
    let mut bytes = format!("{GOOD}\n").into_bytes();
    bytes.extend_from_slice(b"{\"task\": \"caf\xff\"}\n");
    bytes.extend_from_slice(format!("{GOOD}\n").as_bytes());
    let (format, parsed) = read_bytes(bytes, FormatChoice::Auto, ReadOptions::default());
    assert_eq!(format, Some(Format::Tooltune));
    assert_eq!(parsed.len(), 3);
    let e = only_error(&parsed, 2);
    assert_eq!(
        e.to_string(),
        "line 2: invalid UTF-8 at byte offset 13 of the line"
    );
    assert!(parsed[0].result.is_ok() && parsed[2].result.is_ok());
}

#[test]
fn truncated_json_is_reported_with_serde_message_and_column() {
    let truncated = &GOOD[..GOOD.len() / 2];
    let parsed = read_str(
        &format!("{GOOD}\n{truncated}\n{GOOD}\n"),
        FormatChoice::Auto,
    );
    let e = only_error(&parsed, 2);
    assert!(e.message.starts_with("EOF while parsing"), "{e}");
    assert!(
        e.message.contains(&format!("(column {})", truncated.len())),
        "{e}"
    );
    assert_eq!(parsed.iter().filter(|p| p.result.is_ok()).count(), 2);
}

#[test]
fn two_records_on_one_line_are_an_error_in_json_lines() {
    let jsonl = ReadOptions {
        shape: Shape::Jsonl,
        ..ReadOptions::default()
    };
    let (_, parsed) = read_bytes(
        format!("{GOOD}{GOOD}\n").into_bytes(),
        FormatChoice::Fixed(Format::Tooltune),
        jsonl,
    );
    let e = only_error(&parsed, 1);
    assert!(e.message.starts_with("trailing characters"), "{e}");
    // Detected, the same text is a document of two concatenated records.
    let parsed = read_str(
        &format!("{GOOD}{GOOD}\n"),
        FormatChoice::Fixed(Format::Tooltune),
    );
    assert_eq!(parsed.len(), 2);
    assert!(parsed.iter().all(|p| p.result.is_ok()));
}

#[test]
fn wrong_types_report_the_json_path() {
    // OpenAI sends arguments as a JSON string; a number there is a producer bug worth pointing at.
    let openai = r#"{"model": "gpt-4o-mini", "tools": [{"type": "function", "function": {"name": "calculator"}}], "messages": [{"role": "user", "content": "What is 2+1?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": 3}}]}]}"#;
    let e = only_error(&read_str(openai, FormatChoice::Auto), 1);
    assert_eq!(
        e.path.as_deref(),
        Some("messages[1].tool_calls[0].function.arguments")
    );
    assert!(
        e.message
            .starts_with("invalid type: integer `3`, expected a string"),
        "{e}"
    );

    let bot =
        r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]}"#;
    let e = only_error(&read_str(bot, FormatChoice::Auto), 1);
    assert!(
        e.to_string().starts_with(
            "line 1: messages[1].role: unknown variant `bot`, expected one of `system`, `developer`, `user`, `assistant`, `tool`, `function`"
        ),
        "{e}"
    );

    let tooltune = r#"{"task": "t", "outcome": {"score": "high"}}"#;
    let e = only_error(&read_str(tooltune, FormatChoice::Auto), 1);
    assert_eq!(e.path.as_deref(), Some("outcome.score"));
    assert!(e.message.contains("invalid type: string \"high\""), "{e}");

    let unknown_field = r#"{"task": "t", "reward": 1}"#;
    let e = only_error(&read_str(unknown_field, FormatChoice::Auto), 1);
    assert!(e.message.starts_with("unknown field `reward`"), "{e}");

    let metadata =
        r#"{"messages": [{"role": "user", "content": "hi"}], "metadata": {"success": "maybe"}}"#;
    let e = only_error(&read_str(metadata, FormatChoice::Auto), 1);
    assert_eq!(e.path.as_deref(), Some("metadata.success"));
}

#[test]
fn a_bad_openai_tool_list_names_its_path_and_column_in_the_record() {
    // The tool list is decoded apart from the rest of the record (and cached per thread); its errors must still
    // read as if the record had been decoded whole, on every line that repeats it.
    let bad = r#"{"model": "m", "tools": [{"type": "function", "function": {"name": "calculator"}}, {"type": "function", "function": {"name": 7}}], "messages": [{"role": "user", "content": "What is 2+1?"}]}"#;
    let column = bad.find("7}").expect("the bad name") + 1;
    let parsed = read_str(&format!("{bad}\n{bad}\n"), FormatChoice::Auto);
    for line in [1, 2] {
        let e = only_error(&parsed, line);
        assert_eq!(e.path.as_deref(), Some("tools[1].function.name"), "{e}");
        assert!(
            e.message
                .starts_with("invalid type: integer `7`, expected a string")
                && e.message.ends_with(&format!("(column {column})")),
            "{e}"
        );
    }
    let not_a_list = r#"{"tools": 5, "messages": [{"role": "user", "content": "hi"}]}"#;
    let e = only_error(&read_str(not_a_list, FormatChoice::Auto), 1);
    assert_eq!(e.path.as_deref(), Some("tools"), "{e}");
    assert!(e.message.contains("expected a sequence"), "{e}");
}

#[test]
fn a_tool_call_outside_the_tool_list_is_rejected_with_its_path() {
    let tooltune = GOOD.replace(
        r#""name": "read_file", "arguments""#,
        r#""name": "web_search", "arguments""#,
    );
    let e = only_error(&read_str(&tooltune, FormatChoice::Auto), 1);
    assert_eq!(e.path.as_deref(), Some("steps[0].tool_calls[0].name"));
    assert!(
        e.message.contains("`web_search`") && e.message.contains("read_file, calculator"),
        "{e}"
    );

    let openai = r#"{"tools": [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.", "parameters": {"type": "object"}}}], "messages": [{"role": "user", "content": "Read notes.txt and sum the numbers in it."}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"notes.txt\"}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "Attendees: 4"}]}"#;
    let e = only_error(&read_str(openai, FormatChoice::Auto), 1);
    assert_eq!(e.path.as_deref(), Some("steps[0].tool_calls[0].name"));
    assert!(e.message.contains("`read_file`"), "{e}");
}

#[test]
fn openai_tool_message_must_answer_an_earlier_call() {
    let openai = r#"{"tools": [{"type": "function", "function": {"name": "calculator"}}], "messages": [{"role": "user", "content": "2+2?"}, {"role": "tool", "tool_call_id": "c9", "content": "4"}]}"#;
    let e = only_error(&read_str(openai, FormatChoice::Auto), 1);
    assert_eq!(e.path.as_deref(), Some("messages[1].tool_call_id"));
    assert!(e.message.contains("`c9`"), "{e}");
}

#[test]
fn unparsable_arguments_are_kept_as_a_string() {
    let openai = r#"{"tools": [{"type": "function", "function": {"name": "calculator"}}], "messages": [{"role": "user", "content": "What is 17% of 2350?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"2350 * 0.17\""}}]}]}"#;
    let t = read_str(openai, FormatChoice::Auto)[0]
        .result
        .clone()
        .expect("valid");
    let call = t.tool_calls().next().expect("one call");
    assert_eq!(
        call.arguments,
        serde_json::json!("{\"expression\": \"2350 * 0.17\"")
    );
}

fn huge_record(bytes: usize) -> String {
    let answer = "9".repeat(bytes);
    format!(r#"{{"task": "Print a long number.", "final_answer": "{answer}"}}"#)
}

#[test]
fn a_50_mb_line_is_skipped_over_a_lowered_limit_and_read_under_the_default() {
    const FIFTY_MB: usize = 50 * 1024 * 1024;
    let mut file = tempfile::NamedTempFile::new().expect("tempfile");
    {
        let mut w = std::io::BufWriter::new(file.as_file_mut());
        writeln!(w, "{GOOD}").expect("write");
        writeln!(w, "{}", huge_record(FIFTY_MB)).expect("write");
        writeln!(w, "{GOOD}").expect("write");
        w.flush().expect("flush");
    }
    let huge_len = huge_record(FIFTY_MB).len();

    let lowered = ReadOptions {
        max_record_bytes: 1 << 20,
        ..ReadOptions::default()
    };
    let mut r = ChunkReader::open(file.path(), FormatChoice::Auto, lowered).expect("open");
    let mut parsed = Vec::new();
    while let Some(c) = r.next_chunk().expect("read") {
        parsed.extend(c);
    }
    assert_eq!(parsed.len(), 3);
    let e = only_error(&parsed, 2);
    assert_eq!(
        e.message,
        format!("record is {huge_len} bytes, over the limit of 1048576 bytes")
    );
    assert!(parsed[0].result.is_ok());
    assert_eq!(parsed[2].line, 3, "reading resumes after the skipped line");
    assert!(parsed[2].result.is_ok());

    let mut r =
        ChunkReader::open(file.path(), FormatChoice::Auto, ReadOptions::default()).expect("open");
    let mut parsed = Vec::new();
    while let Some(c) = r.next_chunk().expect("read") {
        parsed.extend(c);
    }
    assert_eq!(parsed.len(), 3);
    let t = parsed[1]
        .result
        .as_ref()
        .expect("under the default limit it parses");
    assert_eq!(t.final_answer.as_ref().map(String::len), Some(FIFTY_MB));
    assert!(parsed[2].result.is_ok());
}

#[test]
fn an_oversized_first_record_cannot_be_detected_but_can_be_read_as_a_named_format() {
    let text = format!("{}\n{GOOD}\n", huge_record(4096));
    let small = ReadOptions {
        max_record_bytes: 1024,
        ..ReadOptions::default()
    };
    let err = ChunkReader::new(
        Cursor::new(text.clone()),
        "big.jsonl",
        FormatChoice::Auto,
        small,
    )
    .err()
    .expect("cannot detect");
    assert!(
        err.to_string().contains("over the limit of 1024 bytes"),
        "{err}"
    );
    let (_, parsed) = read_bytes(
        text.into_bytes(),
        FormatChoice::Fixed(Format::Tooltune),
        small,
    );
    assert!(parsed[0].result.is_err() && parsed[1].result.is_ok());
}

#[test]
fn an_empty_input_has_no_format_and_no_chunks() {
    for input in ["", "\n\n   \n\t\r\n"] {
        let mut r = ChunkReader::new(
            Cursor::new(input),
            "empty.jsonl",
            FormatChoice::Auto,
            ReadOptions::default(),
        )
        .expect("empty is not an error");
        assert_eq!(r.format(), None);
        assert!(r.next_chunk().expect("read").is_none());
        assert!(r.next_chunk().expect("read again").is_none());
    }
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    let mut r =
        ChunkReader::open(file.path(), FormatChoice::Auto, ReadOptions::default()).expect("open");
    assert_eq!(r.format(), None);
    assert!(r.next_chunk().expect("read").is_none());
}

#[test]
fn an_unknown_format_fails_auto_detection_with_a_reason() {
    let err = ChunkReader::new(
        Cursor::new("\n{\"prompt\": \"2+2\", \"completion\": \"4\"}\n"),
        "legacy.jsonl",
        FormatChoice::Auto,
        ReadOptions::default(),
    )
    .err()
    .expect("unknown format");
    match &err {
        IngestError::UnknownFormat {
            source_name,
            reason,
        } => {
            assert_eq!(source_name, "legacy.jsonl");
            assert!(
                reason.contains("line 2") && reason.contains("`completion`, `prompt`"),
                "{reason}"
            );
            assert!(
                reason.contains("tooltune") && reason.contains("resourceSpans"),
                "{reason}"
            );
        }
        other => panic!("expected UnknownFormat, got {other:?}"),
    }
    let err = ChunkReader::new(
        Cursor::new("<trace/>\n"),
        "x.xml",
        FormatChoice::Auto,
        ReadOptions::default(),
    )
    .err()
    .expect("not JSON");
    assert!(
        err.to_string().starts_with(
            "x.xml: cannot tell the trace format: the first record (line 1) is not a JSON object"
        ),
        "{err}"
    );

    let e = "xml".parse::<Format>().expect_err("unknown name");
    assert_eq!(
        e.to_string(),
        "unknown trace format `xml` (known formats: tooltune, openai, langfuse, otel)"
    );
    let e = "xml".parse::<FormatChoice>().expect_err("unknown choice");
    assert!(
        e.to_string()
            .contains("auto, tooltune, openai, langfuse, otel"),
        "{e}"
    );
    assert_eq!(
        "auto".parse::<FormatChoice>().expect("auto"),
        FormatChoice::Auto
    );
    for f in Format::ALL {
        assert_eq!(f.to_string().parse::<Format>().expect("round trip"), f);
        assert_eq!(
            f.to_string().parse::<FormatChoice>().expect("choice"),
            FormatChoice::Fixed(f)
        );
    }
}

#[test]
fn blank_lines_and_crlf_keep_line_numbers() {
    let parsed = read_str(&format!("\r\n{GOOD}\r\n\r\n  \n{GOOD}"), FormatChoice::Auto);
    assert_eq!(
        parsed.iter().map(|p| p.line).collect::<Vec<_>>(),
        vec![2, 5]
    );
    assert!(parsed.iter().all(|p| p.result.is_ok()));
}

#[test]
fn meta_source_is_filled_unless_a_tooltune_record_names_its_own() {
    let parsed = read_str(
        &format!(
            "{GOOD}\n{}\n",
            GOOD.replace(
                r#""outcome""#,
                r#""meta": {"source": "evaluator"}, "outcome""#
            )
        ),
        FormatChoice::Auto,
    );
    assert_eq!(
        parsed[0].result.as_ref().expect("ok").meta.source,
        "tooltune"
    );
    assert_eq!(
        parsed[1].result.as_ref().expect("ok").meta.source,
        "evaluator"
    );
}

/// A reader that fails after its first bytes, like a dropped HTTP body.
struct Failing {
    sent: bool,
}

impl Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.sent {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection reset",
            ));
        }
        self.sent = true;
        let line = format!("{GOOD}\n");
        buf[..line.len()].copy_from_slice(line.as_bytes());
        Ok(line.len())
    }
}

#[test]
fn io_failures_are_errors_of_the_read() {
    let reader: Box<dyn BufRead + Send> =
        Box::new(BufReader::with_capacity(1 << 16, Failing { sent: false }));
    let mut r = ChunkReader::new(reader, "upload", FormatChoice::Auto, ReadOptions::default())
        .expect("first line");
    let err = r.next_chunk().expect_err("io error");
    assert!(matches!(err, IngestError::Io { .. }), "{err:?}");
    // The line being read when the connection failed.
    assert_eq!(err.to_string(), "upload:2: connection reset");

    let err = ChunkReader::open(
        std::path::Path::new("no/such/file.jsonl"),
        FormatChoice::Auto,
        ReadOptions::default(),
    )
    .err()
    .expect("missing file");
    assert!(err.to_string().starts_with("no/such/file.jsonl: "), "{err}");
}
