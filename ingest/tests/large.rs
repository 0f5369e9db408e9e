//! A reader over ~50,000 generated records yields every one, in file order, in bounded chunks.

use std::io::Write;
use tooltune_ingest::{ChunkReader, FormatChoice, ReadOptions};

#[test]
fn fifty_thousand_records_come_back_all_and_in_order() {
    const N: usize = 50_000;
    let mut file = tempfile::NamedTempFile::new().expect("tempfile");
    {
        let mut w = std::io::BufWriter::new(file.as_file_mut());
        for i in 0..N {
            // Every 1000th line is blank, to check that line numbers stay those of the file.
            if i % 1000 == 999 {
                writeln!(w).expect("write");
            }
            writeln!(
                w,
                r#"{{"task": "Read notes{i}.txt and sum the numbers in it.", "tools": [{{"name": "read_file", "description": "Read a file."}}], "steps": [{{"type": "model", "tool_calls": [{{"id": "c{i}", "name": "read_file", "arguments": {{"path": "notes{i}.txt"}}}}]}}], "outcome": {{"score": {}}}}}"#,
                (i % 2) as f64
            )
            .expect("write");
        }
        w.flush().expect("flush");
    }
    let opts = ReadOptions {
        chunk_records: 1000,
        ..ReadOptions::default()
    };
    let mut r = ChunkReader::open(file.path(), FormatChoice::Auto, opts).expect("open");
    let mut i = 0usize;
    let mut chunks = 0usize;
    let mut last_line = 0u64;
    while let Some(chunk) = r.next_chunk().expect("read") {
        chunks += 1;
        assert!(
            chunk.len() <= 1000,
            "a chunk holds at most chunk_records records"
        );
        for p in chunk {
            assert!(p.line > last_line, "lines increase");
            last_line = p.line;
            let t = p.result.expect("valid");
            assert_eq!(
                t.task,
                format!("Read notes{i}.txt and sum the numbers in it.")
            );
            assert_eq!(t.meta.source, "tooltune");
            i += 1;
        }
    }
    assert_eq!(i, N);
    assert_eq!(last_line as usize, N + N / 1000);
    assert!(chunks >= N / 1000);
}
