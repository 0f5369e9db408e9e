//! Importing trajectories: parsed chunks from `tooltune-ingest` are written in batches inside one transaction per
//! file, so a file is stored whole or (when it holds an invalid record and skipping was not asked for) not at all.
//!
//! Reading and parsing run on a blocking thread (parsing fans out with rayon inside the reader, and each record is
//! turned into row values, ids and JSON body included, by the thread that parsed it), and the database writes on
//! the async side (a SQLite file: on a thread of its own, see `import/sqlite.rs`); a bounded channel between them
//! keeps memory flat whatever the file size.

use crate::{Store, StoreError};
use encoding::{Encoding, NewDictionary, encode_pending, train_on};
use priority::parse_pool;
use rows::Prepared;
use serde::Serialize;
use std::io::BufRead;
use tooltune_ingest::{ChunkReader, Format, IngestError};

mod encoding;
mod priority;
mod rows;
mod sql;
mod sqlite;
mod writer;

pub use rows::PrepareOnly;
pub(crate) use writer::Writer;

/// How an import treats invalid records.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImportOptions {
    /// Store the valid records of a file that also has invalid ones (and list the skipped ones), instead of
    /// rejecting the whole file.
    pub skip_invalid: bool,
}

/// An invalid record that was not stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedRecord {
    /// 1-based line of the record in its file.
    pub line: u64,
    /// What was wrong, with the JSON path where there is one.
    pub message: String,
}

/// Progress of a running import, reported after each chunk.
#[derive(Debug, Clone, Copy)]
pub struct ImportProgress {
    /// Records read so far (valid and invalid).
    pub records: u64,
}

/// What an import did.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    /// The file or request name.
    pub source_name: String,
    /// The format read (`None` for an empty input).
    pub format: Option<String>,
    /// Records read.
    pub records: u64,
    /// Trajectories newly stored.
    pub added: u64,
    /// Valid trajectories that were already in the store.
    pub already_present: u64,
    /// Invalid records that were skipped (only with `skip_invalid`).
    pub skipped: Vec<SkippedRecord>,
}

impl Store {
    /// Imports everything a reader yields. See the module docs for the all-or-nothing rule.
    pub async fn import<R>(
        &self,
        reader: ChunkReader<R>,
        source_name: &str,
        opts: ImportOptions,
        mut progress: impl FnMut(ImportProgress) + Send,
    ) -> Result<ImportReport, StoreError>
    where
        R: BufRead + Send + 'static,
    {
        let format = reader.format().map(|f: Format| f.to_string());
        let sqlite = self.backend() == crate::Backend::Sqlite;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<PreparedChunk, StoreError>>(2);
        let pool = if sqlite { parse_pool() } else { None };
        // The transaction begins first: it knows the store's dictionary, which the readers compress with.
        // A SQLite file is written through SQLite's C API (see `import/sqlite.rs`).
        let sqlite_writer = match self.sqlite_file.as_deref() {
            Some(path) => {
                sqlite::SqliteWriter::begin(path, self.dictionaries.clone(), now_text()).await?
            }
            None => None,
        };
        let mut writer = match sqlite_writer {
            Some(w) => ImportWriter::Sqlite(w),
            None => ImportWriter::Any(Writer::begin(self).await?),
        };
        // Until this function returns, commit included.
        let _writeback = self
            .sqlite_file
            .as_deref()
            .and_then(crate::writeback::Writeback::start);
        let mut encoding = writer.encoding();
        let dictionary_key = writer.next_dictionary_key();
        let reading = tokio::task::spawn_blocking(move || {
            let mut reader = reader;
            let mut read_all = move || {
                // A chunk parsed while the dictionary was trained on the one before it.
                let mut held: Option<Result<Option<PreparedChunk>, IngestError>> = None;
                loop {
                    // Rows are prepared as part of the parallel parse (see `next_chunk_with`).
                    let next = match held.take() {
                        Some(next) => next,
                        None => read_prepared(&mut reader, &encoding),
                    };
                    let mut prepared = match next {
                        Ok(Some(c)) => c,
                        Ok(None) => break,
                        Err(e) => {
                            let _ = tx.blocking_send(Err(e.into()));
                            break;
                        }
                    };
                    if matches!(encoding, Encoding::Pending) {
                        // zstd's trainer runs on one thread, for a tenth of a second or more, and nothing else
                        // could run meanwhile: the writer waits for this chunk. The next chunk is parsed at the
                        // same time instead, its bodies kept pending too, and compressed once the dictionary is
                        // there.
                        let pending = &encoding;
                        let ((trained_encoding, trained), mut ahead) = rayon::join(
                            || train_on(&mut prepared.valid, dictionary_key),
                            || read_prepared(&mut reader, pending),
                        );
                        encoding = trained_encoding;
                        prepared.trained = trained;
                        if let Ok(Some(ahead)) = &mut ahead {
                            encode_pending(&mut ahead.valid, &encoding);
                        }
                        held = Some(ahead);
                    }
                    if tx.blocking_send(Ok(prepared)).is_err() {
                        // The writer gave up (a database error); stop reading.
                        break;
                    }
                }
            };
            match pool {
                Some(pool) => pool.install(read_all),
                None => read_all(),
            }
        });

        let mut report = ImportReport {
            source_name: source_name.to_string(),
            format,
            records: 0,
            added: 0,
            already_present: 0,
            skipped: Vec::new(),
        };
        let mut failed: Option<StoreError> = None;
        while let Some(chunk) = rx.recv().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            report.records += chunk.records;
            report.skipped.extend(chunk.invalid);
            // Once a record is invalid and skipping is off, the file will be rolled back: keep reading only to
            // report every invalid record, and stop writing.
            if opts.skip_invalid || report.skipped.is_empty() {
                if let Some(trained) = chunk.trained
                    && let Err(e) = writer.store_dictionary(trained).await
                {
                    failed = Some(e);
                    break;
                }
                let n = chunk.valid.len() as u64;
                match writer.write_prepared(chunk.valid).await {
                    Ok(added) => {
                        report.added += added;
                        report.already_present += n - added;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            progress(ImportProgress {
                records: report.records,
            });
        }
        drop(rx);
        // The reading thread cannot panic short of a bug; if it did, the error surfaces as a missing chunk count.
        let _ = reading.await;
        if let Some(e) = failed {
            writer.rollback().await?;
            return Err(e);
        }
        if !opts.skip_invalid && !report.skipped.is_empty() {
            writer.rollback().await?;
            return Err(StoreError::Rejected {
                source_name: source_name.to_string(),
                errors: report.skipped,
            });
        }
        writer.commit().await?;
        Ok(report)
    }
}

/// The next chunk of a reader as rows, bodies stored as `encoding` says.
fn read_prepared<R: BufRead + Send>(
    reader: &mut ChunkReader<R>,
    encoding: &Encoding,
) -> Result<Option<PreparedChunk>, IngestError> {
    Ok(reader
        .next_chunk_with(&|t| Prepared::new(&t, encoding))?
        .map(split_chunk))
}

pub(crate) struct PreparedChunk {
    records: u64,
    valid: Vec<Prepared>,
    invalid: Vec<SkippedRecord>,
    /// The dictionary the chunk's bodies were compressed with, when this chunk trained it.
    trained: Option<NewDictionary>,
}

/// Separates a chunk's prepared rows from its invalid records.
fn split_chunk(chunk: Vec<tooltune_ingest::Parsed<Prepared>>) -> PreparedChunk {
    let records = chunk.len() as u64;
    let mut invalid = Vec::new();
    let mut valid = Vec::with_capacity(chunk.len());
    for p in chunk {
        match p.result {
            Ok(row) => valid.push(row),
            // The line is a field of its own, which every caller prints beside the message.
            Err(e) => invalid.push(SkippedRecord {
                line: p.line,
                message: e.without_line(),
            }),
        }
    }
    PreparedChunk {
        records,
        valid,
        invalid,
        trained: None,
    }
}

/// A description version whose key could not be read back after it was stored.
fn no_key(id: &str) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        message: "description version has no key after it was stored".into(),
    }
}

/// The time an import's rows are stamped with (`ingested_at`, `first_seen_at`).
fn now_text() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// An import's transaction: on its own thread through SQLite's C API for a SQLite file, through sqlx otherwise.
enum ImportWriter {
    Any(Writer),
    Sqlite(sqlite::SqliteWriter),
}

impl ImportWriter {
    fn encoding(&self) -> Encoding {
        match self {
            ImportWriter::Any(w) => w.encoding.clone(),
            ImportWriter::Sqlite(w) => w.encoding.clone(),
        }
    }

    fn next_dictionary_key(&self) -> u32 {
        match self {
            ImportWriter::Any(w) => w.next_dictionary_key,
            ImportWriter::Sqlite(w) => w.next_dictionary_key,
        }
    }

    async fn store_dictionary(&mut self, trained: NewDictionary) -> Result<(), StoreError> {
        match self {
            ImportWriter::Any(w) => w.store_dictionary(trained).await,
            ImportWriter::Sqlite(w) => w.store_dictionary(trained).await,
        }
    }

    async fn write_prepared(&mut self, batch: Vec<Prepared>) -> Result<u64, StoreError> {
        match self {
            ImportWriter::Any(w) => w.write_prepared(&batch).await,
            ImportWriter::Sqlite(w) => w.write_prepared(batch).await,
        }
    }

    async fn commit(self) -> Result<(), StoreError> {
        match self {
            ImportWriter::Any(w) => w.commit().await,
            ImportWriter::Sqlite(w) => w.commit().await,
        }
    }

    async fn rollback(self) -> Result<(), StoreError> {
        match self {
            ImportWriter::Any(w) => w.rollback().await,
            ImportWriter::Sqlite(w) => w.rollback().await,
        }
    }
}
