//! Importing trajectories: parsed chunks from `tooltune-ingest` are written in batches inside one transaction per
//! file, so a file is stored whole or (when it holds an invalid record and skipping was not asked for) not at all.
//!
//! Reading and parsing run on a blocking thread (parsing fans out with rayon inside the reader, and each record is
//! turned into row values, ids and JSON body included, by the thread that parsed it), and the database writes on
//! the async side (a SQLite file: on a thread of its own, see `import/sqlite.rs`); a bounded channel between them
//! keeps memory flat whatever the file size.

use crate::body::{Dictionary, StoredBody, compress, compress_with};
use crate::{Store, StoreError, q};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::Value;
use sqlx::{Any, Row, Transaction};
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::io::BufRead;
use std::sync::{Arc, OnceLock};
use tooltune_core::{DescriptionId, ToolSpec, Trajectory, canonical_json};
use tooltune_ingest::{ChunkReader, Format, IngestError};

mod sqlite;

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

/// The threads a SQLite import reads and parses on: one per core, each at a lower scheduling priority (Linux; one
/// fewer than the cores elsewhere).
///
/// SQLite's single writer thread cannot be parallelised, so every moment the readers take its core slows the whole
/// import. On rayon's global pool (a thread per core, same priority) the readers kept the writer off its core for
/// a third of the time, and sat idle whenever the channel was full: on 2 cores, 200,000 tooltune records took
/// 21.7 s; with the readers at a lower priority, 17.3 s. One reader fewer would have done the same for a format
/// that is cheap to parse, but slowed a costly one, where the writer waits on the readers rather than the other
/// way round (Langfuse: 9.7k trajectories/s with two low-priority readers, 7.2k with one). PostgreSQL writes in
/// its own processes, so its imports parse on the global pool.
///
/// `None` if the threads could not be started; the import then parses on the global pool.
fn parse_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = if cfg!(target_os = "linux") {
            cores
        } else {
            cores.saturating_sub(1).max(1)
        };
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tooltune-parse-{i}"))
            .start_handler(|_| lower_this_threads_priority())
            .build()
            .ok()
    })
    .as_ref()
}

/// Makes the calling thread yield its core to the others of the process (nice +10), so that the writer runs
/// whenever it has work. Linux schedules threads one by one, so this affects no other thread. Best effort: a
/// failure leaves the thread at its priority.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // The workspace denies unsafe code; setpriority and gettid have no safe wrapper in std.
fn lower_this_threads_priority() {
    // SAFETY: both calls take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_threads_priority() {}

/// How bodies are stored by a transaction.
#[derive(Clone)]
enum Encoding {
    /// JSON text (PostgreSQL).
    Text,
    /// LZ4 (SQLite, when no dictionary could be trained).
    Lz4,
    /// zstd with the store's dictionary (SQLite).
    Dictionary(Arc<Dictionary>),
    /// Kept as canonical JSON until a dictionary is trained on them (an import's first chunk into a SQLite store
    /// that has no dictionary yet).
    Pending,
}

impl Encoding {
    fn encode(&self, json: Vec<u8>) -> StoredBody {
        match self {
            // serde_json writes UTF-8.
            Encoding::Text => StoredBody::Json(String::from_utf8(json).unwrap_or_default()),
            Encoding::Lz4 => StoredBody::Compressed(compress(&json)),
            Encoding::Dictionary(d) => StoredBody::Compressed(compress_with(&json, d)),
            Encoding::Pending => StoredBody::Pending(json),
        }
    }
}

/// Bodies a dictionary is trained on, at most: a few hundred already capture what one log's bodies share (100 gave
/// the same compression as 1,000 on the bench's), and training on 256 takes about a tenth of a second.
const TRAINING_SAMPLES: usize = 256;
/// Bodies a dictionary is trained on, at least: fewer would make a dictionary of one small file's quirks that
/// every later import of the store then uses.
const MIN_TRAINING_SAMPLES: usize = 64;

/// A dictionary trained by an import, to be stored in its transaction.
struct NewDictionary {
    dictionary: Arc<Dictionary>,
    bytes: Vec<u8>,
    samples: usize,
}

/// Trains a dictionary with key `key` on the pending bodies of a chunk (the first [`TRAINING_SAMPLES`]), when it
/// has at least [`MIN_TRAINING_SAMPLES`], and encodes them with it (or with LZ4 when it has too few, or zstd
/// cannot train on them). Returns the encoding for the rest of the import and the new dictionary.
fn train_on(valid: &mut [Prepared], key: u32) -> (Encoding, Option<NewDictionary>) {
    let samples: Vec<&[u8]> = valid
        .iter()
        .filter_map(|p| match &p.body {
            StoredBody::Pending(b) => Some(b.as_slice()),
            _ => None,
        })
        .take(TRAINING_SAMPLES)
        .collect();
    let trained = (samples.len() >= MIN_TRAINING_SAMPLES)
        .then(|| crate::body::train(&samples))
        .flatten()
        .map(|bytes| NewDictionary {
            dictionary: Arc::new(Dictionary::new(key, &bytes)),
            samples: samples.len(),
            bytes,
        });
    let encoding = match &trained {
        Some(n) => Encoding::Dictionary(Arc::clone(&n.dictionary)),
        None => Encoding::Lz4,
    };
    encode_pending(valid, &encoding);
    (encoding, trained)
}

/// Encodes, in parallel, the bodies that were kept pending until a dictionary was trained.
fn encode_pending(valid: &mut [Prepared], encoding: &Encoding) {
    valid.par_iter_mut().for_each(|p| {
        if let StoredBody::Pending(json) = &mut p.body {
            p.body = encoding.encode(std::mem::take(json));
        }
    });
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

/// Does, in parallel as an import does, all the work an import does per trajectory before any SQL (ids, JSON body,
/// its compression for SQLite, description versions), chunk by chunk, and returns the bytes prepared. For the
/// ingest benchmark, which times the CPU side of an ingest apart from its inserts with exactly the store's code.
pub struct PrepareOnly {
    encoding: Encoding,
}

impl PrepareOnly {
    /// Prepares as for SQLite (`sqlite`: bodies compressed, the first chunk training the dictionary, as in an
    /// import into a new store) or for PostgreSQL (JSON text).
    pub fn new(sqlite: bool) -> PrepareOnly {
        PrepareOnly {
            encoding: if sqlite {
                Encoding::Pending
            } else {
                Encoding::Text
            },
        }
    }

    /// Prepares one chunk; returns the bytes prepared.
    pub fn chunk(&mut self, ts: &[Trajectory]) -> usize {
        let mut prepared: Vec<Prepared> = ts
            .par_iter()
            .map(|t| Prepared::new(t, &self.encoding))
            .collect();
        if matches!(self.encoding, Encoding::Pending) {
            self.encoding = train_on(&mut prepared, 1).0;
        }
        prepared
            .iter()
            .map(|p| p.id.len() + p.body.len() + p.tools.len())
            .sum()
    }
}

/// One trajectory turned into row values, ready to bind.
pub(crate) struct Prepared {
    id: String,
    source: String,
    score: Option<f64>,
    success: Option<i64>,
    model: Option<String>,
    client: Option<String>,
    external_id: Option<String>,
    started_at: Option<String>,
    run_id: Option<String>,
    candidate_id: Option<String>,
    rollout: Option<i64>,
    body: StoredBody,
    /// (description version, calls) in tool-list order.
    tools: Vec<(Arc<DescriptionRow>, i64)>,
}

/// One description version as stored: a row of `descriptions`.
pub(crate) struct DescriptionRow {
    id: String,
    tool: String,
    description: String,
    /// Canonical JSON of the input schema.
    schema: String,
}

/// Description versions by a hash of (tool, description): each with the schema it was computed for.
/// A decoded schema and the description version it was found to belong to.
type SchemaCopy = (Arc<Value>, Arc<DescriptionRow>);

/// Description versions by a hash of (tool, description), each with the schema copies it was found for, and how
/// many schema copies that is in all.
#[derive(Default)]
struct SeenDescriptions {
    by_text: foldhash::HashMap<u64, Vec<SchemaCopy>>,
    len: usize,
}

thread_local! {
    /// Description versions this thread has already computed, by a hash of (tool, description). A log repeats the
    /// same few tools in every record, and computing a version (canonical schema, sha256) for each of them was a
    /// fifth of an ingest's CPU time. Bounded: cleared when it holds [`SEEN_LIMIT`] schemas.
    static SEEN: RefCell<SeenDescriptions> = RefCell::new(SeenDescriptions::default());
}
const SEEN_LIMIT: usize = 4096;

fn description_row(tool: &ToolSpec) -> Arc<DescriptionRow> {
    // A fixed-seed foldhash: the key only picks a bucket of candidates that are then compared in full.
    let key = foldhash::fast::FixedState::default().hash_one((&tool.name, &tool.description));
    SEEN.with_borrow_mut(|seen| {
        let same_text =
            |row: &DescriptionRow| row.tool == tool.name && row.description == tool.description;
        let rows = seen
            .by_text
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        // Readers share one decoded schema between the records that show it: the pointer test settles those
        // without walking the schema.
        if let Some((_, row)) = rows
            .iter()
            .find(|(schema, row)| Arc::ptr_eq(schema, &tool.input_schema) && same_text(row))
        {
            return Arc::clone(row);
        }
        // The same schema decoded separately (by another reading thread, or by a reader that does not share)
        // reuses the version, and this copy is remembered too, so that its next records take the pointer test.
        let known = rows
            .iter()
            .find(|(schema, row)| *schema == tool.input_schema && same_text(row))
            .map(|(_, row)| Arc::clone(row));
        let row = known.unwrap_or_else(|| {
            let schema = canonical_json(&tool.input_schema);
            Arc::new(DescriptionRow {
                id: DescriptionId::of_canonical(&tool.name, &tool.description, &schema)
                    .as_str()
                    .to_string(),
                tool: tool.name.clone(),
                description: tool.description.clone(),
                schema,
            })
        });
        if seen.len >= SEEN_LIMIT {
            *seen = SeenDescriptions::default();
        }
        seen.len += 1;
        seen.by_text
            .entry(key)
            .or_default()
            .push((Arc::clone(&tool.input_schema), Arc::clone(&row)));
        row
    })
}

impl Prepared {
    /// Row values for `t`, its body encoded as `encoding` says.
    fn new(t: &Trajectory, encoding: &Encoding) -> Prepared {
        // The body is the trajectory without its tool list, which lives in `trajectory_tools` and `descriptions`
        // so that a description is stored once. It is the canonical JSON the id is computed from, so an ingest
        // serialises each record once.
        let (id, body) = t.id_and_body();
        let tools = t
            .tools
            .iter()
            .map(|tool| (description_row(tool), t.calls_of(&tool.name) as i64))
            .collect();
        Prepared {
            id: id.as_str().to_string(),
            source: t.meta.source.clone(),
            score: t.outcome.score,
            success: t.outcome.effective_success().map(i64::from),
            model: t.meta.model.clone(),
            client: t.meta.client.clone(),
            external_id: t.meta.external_id.clone(),
            started_at: t.meta.started_at.clone(),
            run_id: t.links.run_id.clone(),
            candidate_id: t.links.candidate_id.clone(),
            rollout: t.links.rollout.map(i64::from),
            body: encoding.encode(body),
            tools,
        }
    }
}

/// The PostgreSQL advisory lock of transactions that add description versions ("tooltune descriptions" in ASCII,
/// cut to 8 bytes: any constant no other part of tooltune uses).
const DESCRIPTIONS_LOCK: i64 = 0x746f_6f6c_6465_7363;

/// Builds the insert of `rows` rows into `table` that skips a row whose key is already there: `INSERT INTO table
/// (cols) VALUES ($1,..),(..) ON CONFLICT DO NOTHING` for PostgreSQL (`numbered`), `INSERT OR IGNORE INTO table
/// (cols) VALUES (?,..),(..)` for SQLite. The SQL for a full batch is always the same string, so the driver's
/// statement cache prepares it once.
///
/// SQLite gets plain `?` placeholders: sqlx looks up each bound parameter's name, and SQLite answers that by
/// scanning the statement's named parameters (`$N` counts as named), which made binding a 500-row batch quadratic
/// and capped ingest at about 1,500 trajectories/s.
///
/// SQLite gets `OR IGNORE` rather than `ON CONFLICT DO NOTHING` because the latter leaves the other constraints
/// (`NOT NULL`) able to abort a statement halfway, so each multi-row insert kept a statement journal: a copy of
/// every page it touched, so that it could be undone alone. That was a fifth of the SQLite thread's time in a bulk
/// ingest (measured: 12.5 s to 9.9 s for 200,000 trajectories). `OR IGNORE` would also skip a row with a `NULL` in
/// a `NOT NULL` column, but every such column is bound from a value that cannot be `None`; and a file's import
/// rolls back as a whole on any error, so no statement needs undoing alone.
fn insert_sql(table: &str, cols: &[&str], rows: usize, numbered: bool) -> String {
    let verb = if numbered {
        "INSERT INTO"
    } else {
        "INSERT OR IGNORE INTO"
    };
    let mut s = format!("{verb} {table} ({}) VALUES ", cols.join(", "));
    for r in 0..rows {
        if r > 0 {
            s.push(',');
        }
        s.push('(');
        push_placeholders(&mut s, r * cols.len() + 1, cols.len(), numbered);
        s.push(')');
    }
    if numbered {
        s.push_str(" ON CONFLICT DO NOTHING");
    }
    s
}

/// Appends `n` parameter placeholders separated by commas: `$first`, `$first+1`, .. when `numbered`, else `?`.
fn push_placeholders(s: &mut String, first: usize, n: usize, numbered: bool) {
    for i in first..first + n {
        if i > first {
            s.push(',');
        }
        if numbered {
            s.push('$');
            s.push_str(&i.to_string());
        } else {
            s.push('?');
        }
    }
}

const TRAJECTORY_COLS: &[&str] = &[
    "id",
    "source",
    "score",
    "success",
    "model",
    "client",
    "external_id",
    "started_at",
    "run_id",
    "candidate_id",
    "rollout",
    "ingested_at",
    "body",
];
const TOOL_COLS: &[&str] = &["trajectory_seq", "position", "description_key", "calls"];
const DESCRIPTION_COLS: &[&str] = &["id", "tool", "description", "input_schema", "first_seen_at"];
// Rows per statement: well under SQLite's 32,766 and PostgreSQL's 65,535 bound parameters.
const TRAJECTORY_BATCH: usize = 500;
const TOOL_BATCH: usize = 2000;
const DESCRIPTION_BATCH: usize = 500;

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

/// A transaction that trajectories are written into.
pub(crate) struct Writer {
    tx: Transaction<'static, Any>,
    /// The key of each description version this transaction has stored or found, by id. Looked up for every
    /// tool row, hence foldhash rather than SipHash.
    description_keys: foldhash::HashMap<String, i64>,
    now: String,
    /// SQLite (`?` placeholders, compressed bodies, numbered here) or PostgreSQL (`$N`, text bodies, BIGSERIAL).
    sqlite: bool,
    /// SQLite: the next sequence number to give a trajectory (tool rows are keyed by it, so they append). The
    /// transaction began IMMEDIATE, holding the write lock, so no other writer gives numbers meanwhile.
    /// PostgreSQL: `None`; the column's default draws from a sequence.
    next_seq: Option<i64>,
    /// How this transaction's bodies are stored: the store's newest dictionary if it has one (SQLite).
    encoding: Encoding,
    /// SQLite: the key a dictionary trained in this transaction gets.
    next_dictionary_key: u32,
    /// A dictionary stored by this transaction, cached in the store once it commits.
    stored_dictionary: Option<Arc<Dictionary>>,
    dictionaries: crate::body::Dictionaries,
}

impl Writer {
    pub(crate) async fn begin(store: &Store) -> Result<Writer, StoreError> {
        let sqlite = store.backend() == crate::Backend::Sqlite;
        let mut tx = if sqlite {
            store.pool().begin_with("BEGIN IMMEDIATE").await
        } else {
            store.pool().begin().await
        }
        .map_err(q("starting a transaction"))?;
        let (next_seq, encoding, next_dictionary_key) = if sqlite {
            let n: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM trajectories")
                .fetch_one(&mut *tx)
                .await
                .map_err(q("reading the trajectory sequence"))?;
            let newest: Option<i64> = sqlx::query_scalar("SELECT MAX(key) FROM body_dictionaries")
                .fetch_one(&mut *tx)
                .await
                .map_err(q("reading the newest compression dictionary"))?;
            let newest = newest.and_then(|k| u32::try_from(k).ok());
            let encoding = match newest {
                Some(key) => match store.dictionary(&mut *tx, key).await? {
                    Some(d) => Encoding::Dictionary(d),
                    None => Encoding::Pending,
                },
                None => Encoding::Pending,
            };
            (Some(n), encoding, newest.map_or(1, |k| k + 1))
        } else {
            (None, Encoding::Text, 1)
        };
        Ok(Writer {
            tx,
            description_keys: Default::default(),
            sqlite,
            now: now_text(),
            next_seq,
            encoding,
            next_dictionary_key,
            stored_dictionary: None,
            dictionaries: store.dictionaries.clone(),
        })
    }

    /// Stores a dictionary this transaction's bodies were compressed with.
    async fn store_dictionary(&mut self, trained: NewDictionary) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO body_dictionaries (key, dictionary, samples, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(i64::from(trained.dictionary.key()))
        .bind(trained.bytes.as_slice())
        .bind(trained.samples as i64)
        .bind(self.now.as_str())
        .execute(&mut *self.tx)
        .await
        .map_err(q("storing a compression dictionary"))?;
        self.encoding = Encoding::Dictionary(Arc::clone(&trained.dictionary));
        self.stored_dictionary = Some(trained.dictionary);
        Ok(())
    }

    pub(crate) async fn write(&mut self, ts: &[Trajectory]) -> Result<u64, StoreError> {
        // A few trajectories (a rollout, a test) train no dictionary: without one they are stored with LZ4.
        let encoding = match &self.encoding {
            Encoding::Pending => Encoding::Lz4,
            e => e.clone(),
        };
        let prepared: Vec<Prepared> = ts.par_iter().map(|t| Prepared::new(t, &encoding)).collect();
        self.write_prepared(&prepared).await
    }

    /// Writes a batch; returns how many trajectories were new.
    ///
    /// Statements run one at a time on the connection's worker thread; each next statement's parameters are bound
    /// on this thread while the previous one runs (binding through the `Any` driver copies every value and was a
    /// sixth of the writer's time, all of it spent waiting before).
    async fn write_prepared(&mut self, batch: &[Prepared]) -> Result<u64, StoreError> {
        // Description versions first: rows in `trajectory_tools` reference them by key.
        let mut new_descriptions = Vec::new();
        let mut new_ids = foldhash::HashSet::default();
        for p in batch {
            for (d, _) in &p.tools {
                if !self.description_keys.contains_key(&d.id) && new_ids.insert(d.id.as_str()) {
                    new_descriptions.push(d);
                }
            }
        }
        if !self.sqlite && !new_descriptions.is_empty() {
            // Two imports that bring the same new versions in different orders each hold the unique-index entry
            // of one and wait for the other's: PostgreSQL aborts one ("deadlock detected", a refused request in
            // the web load check). Transactions that add description versions take turns, until commit; the
            // versions keep the order they were first seen in (their keys), and imports of known ones never wait.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(DESCRIPTIONS_LOCK)
                .execute(&mut *self.tx)
                .await
                .map_err(q("waiting to store description versions"))?;
        }
        for chunk in new_descriptions.chunks(DESCRIPTION_BATCH) {
            let sql = insert_sql("descriptions", DESCRIPTION_COLS, chunk.len(), !self.sqlite);
            let mut query = sqlx::query(&sql);
            for d in chunk {
                query = query
                    .bind(d.id.as_str())
                    .bind(d.tool.as_str())
                    .bind(d.description.as_str())
                    .bind(d.schema.as_str())
                    .bind(self.now.as_str());
            }
            query
                .execute(&mut *self.tx)
                .await
                .map_err(q("storing description versions"))?;
            // Some were stored before this transaction (and kept their keys): read every key back.
            let mut sql = "SELECT id, key FROM descriptions WHERE id IN (".to_string();
            push_placeholders(&mut sql, 1, chunk.len(), !self.sqlite);
            sql.push(')');
            let mut query = sqlx::query(&sql);
            for d in chunk {
                query = query.bind(d.id.as_str());
            }
            for row in query
                .fetch_all(&mut *self.tx)
                .await
                .map_err(q("reading description keys"))?
            {
                self.description_keys.insert(row.get(0), row.get(1));
            }
        }

        // Trajectories. SQLite numbers them here and returns the numbers of the rows it added; PostgreSQL draws
        // them from a sequence and returns them with the ids.
        let first_seq = self.next_seq;
        let mut cols = TRAJECTORY_COLS.to_vec();
        if first_seq.is_some() {
            cols.push("seq");
        }
        let returning = if first_seq.is_some() {
            " RETURNING seq"
        } else {
            " RETURNING id, seq"
        };
        let sql = BatchSql::new(batch.len(), TRAJECTORY_BATCH, |rows| {
            insert_sql("trajectories", &cols, rows, !self.sqlite) + returning
        });
        // The sequence number of each trajectory of the batch that was added (a duplicate adds no row and keeps
        // its tool rows).
        let mut seq_of: Vec<Option<i64>> = vec![None; batch.len()];
        let position_of_id: HashMap<&str, usize> = if first_seq.is_none() {
            batch
                .iter()
                .enumerate()
                .map(|(i, p)| (p.id.as_str(), i))
                .collect()
        } else {
            HashMap::new()
        };
        let (tx, next_seq, now) = (&mut self.tx, &mut self.next_seq, self.now.as_str());
        let mut chunks = batch.chunks(TRAJECTORY_BATCH);
        let mut next = chunks
            .next()
            .map(|c| bind_trajectories(sql.for_rows(c.len()), c, now, next_seq));
        let mut added = 0;
        while let Some(query) = next.take() {
            let (inserted, following) = futures::join!(query.fetch_all(&mut **tx), async {
                chunks
                    .next()
                    .map(|c| bind_trajectories(sql.for_rows(c.len()), c, now, next_seq))
            });
            next = following;
            let inserted = inserted.map_err(q("storing trajectories"))?;
            added += inserted.len() as u64;
            for row in inserted {
                let (at, seq) = match first_seq {
                    Some(first) => {
                        let seq: i64 = row.get(0);
                        (usize::try_from(seq - first).ok(), seq)
                    }
                    None => (
                        position_of_id.get(row.get::<&str, _>(0)).copied(),
                        row.get(1),
                    ),
                };
                if let Some(slot) = at.and_then(|i| seq_of.get_mut(i)) {
                    *slot = Some(seq);
                }
            }
        }

        // Their tool lists.
        let keys = &self.description_keys;
        let mut rows: Vec<ToolRow> = Vec::with_capacity(batch.len() * 8);
        for (p, seq) in batch.iter().zip(&seq_of) {
            let Some(seq) = *seq else { continue };
            for (i, (d, calls)) in p.tools.iter().enumerate() {
                let key = keys.get(&d.id).copied().ok_or_else(|| no_key(&d.id))?;
                rows.push((seq, i as i64, key, *calls));
            }
        }
        let sqlite = self.sqlite;
        let sql = BatchSql::new(rows.len(), TOOL_BATCH, |n| {
            insert_sql("trajectory_tools", TOOL_COLS, n, !sqlite)
        });
        let mut chunks = rows.chunks(TOOL_BATCH);
        let mut next = chunks.next().map(|c| bind_tools(sql.for_rows(c.len()), c));
        while let Some(query) = next.take() {
            let (done, following) = futures::join!(query.execute(&mut **tx), async {
                chunks.next().map(|c| bind_tools(sql.for_rows(c.len()), c))
            });
            next = following;
            done.map_err(q("storing tool lists"))?;
        }
        Ok(added)
    }

    pub(crate) async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await.map_err(q("committing"))?;
        if let Some(d) = self.stored_dictionary {
            self.dictionaries.insert(d);
        }
        Ok(())
    }

    pub(crate) async fn rollback(self) -> Result<(), StoreError> {
        self.tx.rollback().await.map_err(q("rolling back"))
    }
}

/// The SQL of a batched insert of `rows` rows: one statement for a full batch, reused by every full batch (the
/// driver prepares it once), and one for the shorter last batch. Each is built only when some batch needs it.
struct BatchSql {
    batch: usize,
    full: String,
    last: String,
}

impl BatchSql {
    fn new(rows: usize, batch: usize, make: impl Fn(usize) -> String) -> BatchSql {
        let rest = rows % batch;
        BatchSql {
            batch,
            full: if rows >= batch {
                make(batch)
            } else {
                String::new()
            },
            last: if rest > 0 { make(rest) } else { String::new() },
        }
    }

    /// The statement for a batch of `n` rows (`n` is a full batch or the last one).
    fn for_rows(&self, n: usize) -> &str {
        if n == self.batch {
            &self.full
        } else {
            &self.last
        }
    }
}

/// A tool row: trajectory number, position in its tool list, description key, calls.
type ToolRow = (i64, i64, i64, i64);

type Insert<'q> = sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>;

/// The insert of `rows` (with `sql` made for as many rows), numbering them from `next_seq` on SQLite.
fn bind_trajectories<'q>(
    sql: &'q str,
    rows: &'q [Prepared],
    now: &'q str,
    next_seq: &mut Option<i64>,
) -> Insert<'q> {
    let mut query = sqlx::query(sql);
    for p in rows {
        query = query
            .bind(p.id.as_str())
            .bind(p.source.as_str())
            .bind(p.score)
            .bind(p.success)
            .bind(p.model.as_deref())
            .bind(p.client.as_deref())
            .bind(p.external_id.as_deref())
            .bind(p.started_at.as_deref())
            .bind(p.run_id.as_deref())
            .bind(p.candidate_id.as_deref())
            .bind(p.rollout)
            .bind(now);
        query = match &p.body {
            StoredBody::Json(s) => query.bind(s.as_str()),
            // A pending body is compressed before its chunk reaches the writer; were one to slip through, it is
            // the JSON itself, which reads back as a plain body.
            StoredBody::Compressed(b) | StoredBody::Pending(b) => query.bind(b.as_slice()),
        };
        if let Some(seq) = next_seq.as_mut() {
            query = query.bind(*seq);
            *seq += 1;
        }
    }
    query
}

/// The insert of `rows` (with `sql` made for as many rows).
fn bind_tools<'q>(sql: &'q str, rows: &'q [ToolRow]) -> Insert<'q> {
    let mut query = sqlx::query(sql);
    for &(seq, pos, key, calls) in rows {
        query = query.bind(seq).bind(pos).bind(key).bind(calls);
    }
    query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_sql_numbers_parameters_row_by_row() {
        assert_eq!(
            insert_sql("t", &["a", "b"], 2, true),
            "INSERT INTO t (a, b) VALUES ($1,$2),($3,$4) ON CONFLICT DO NOTHING"
        );
        assert_eq!(
            insert_sql("t", &["a", "b"], 2, false),
            "INSERT OR IGNORE INTO t (a, b) VALUES (?,?),(?,?)"
        );
    }
}
