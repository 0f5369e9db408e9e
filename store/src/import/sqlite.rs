//! A SQLite import's transaction, run through SQLite's C API on a thread of its own.
//!
//! Through sqlx, each batch of rows went from our values to the `Any` driver's copies of them (made on the async
//! thread), to SQLite's own copies (sqlx binds every text and blob `SQLITE_TRANSIENT`), into a 500-row `VALUES`
//! statement, and then every copy was freed again; that was a third of the writing side's CPU time, on a machine
//! whose two cores the parsing threads keep busy. Here one thread owns a connection of its own for the whole
//! transaction and binds each value in place (`SQLITE_STATIC`: SQLite reads our bytes where they are) into
//! one-row statements it prepares once per chunk, so the only copy of a row is the one SQLite writes to its page.
//!
//! The rows are exactly those the `Any` writer (`Writer` in the parent module) writes, which PostgreSQL imports
//! and `Store::insert` keep using; a test compares the two. This module knows the schema's tables and columns and
//! nothing of trace formats. Its `unsafe` code, all in [`ffi`], is the crate's only use of a C library beyond two
//! libc calls (a thread's priority, writeback).

use super::encoding::{Encoding, NewDictionary};
use super::no_key;
use super::rows::Prepared;
use super::sql::TRAJECTORY_COLS;
use crate::StoreError;
use crate::body::{Dictionaries, Dictionary, StoredBody};
use ffi::{Conn, Val};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use tokio::sync::oneshot;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Command {
    StoreDictionary(NewDictionary, Reply<()>),
    Write(Vec<Prepared>, Reply<u64>),
    Finish { commit: bool, reply: Reply<()> },
}

/// The async side's handle on the writing thread. Dropping it without [`SqliteWriter::commit`] rolls back.
pub(crate) struct SqliteWriter {
    commands: mpsc::Sender<Command>,
    /// How this transaction's bodies are stored (the store's newest dictionary, if it has one).
    pub(super) encoding: Encoding,
    /// The key a dictionary trained in this transaction gets.
    pub(super) next_dictionary_key: u32,
}

impl SqliteWriter {
    /// Opens a connection to the database file at `path` on a new thread and begins the import's transaction
    /// there. `Ok(None)` when SQLite cannot open the file by that name (the caller then writes through sqlx,
    /// which did open it).
    pub(crate) async fn begin(
        path: &Path,
        dictionaries: Dictionaries,
        now: String,
    ) -> Result<Option<SqliteWriter>, StoreError> {
        let (commands, inbox) = mpsc::channel();
        let (ready, started) = oneshot::channel();
        let path: PathBuf = path.to_path_buf();
        std::thread::Builder::new()
            .name("tooltune-sqlite".into())
            .spawn(move || {
                let db = match Conn::open(&path) {
                    Ok(db) => db,
                    Err(e) => {
                        tracing::debug!("SQLite's C API cannot open {}: {e}", path.display());
                        let _ = ready.send(Ok(None));
                        return;
                    }
                };
                match Tx::begin(db, dictionaries, now) {
                    Ok(tx) => {
                        let started = (tx.encoding.clone(), tx.next_dictionary_key);
                        if ready.send(Ok(Some(started))).is_ok() {
                            tx.serve(&inbox);
                        }
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            })
            .map_err(|e| StoreError::Sqlite {
                doing: "starting the writing thread",
                message: e.to_string(),
            })?;
        let Some((encoding, next_dictionary_key)) = started.await.map_err(|_| gone())?? else {
            return Ok(None);
        };
        Ok(Some(SqliteWriter {
            commands,
            encoding,
            next_dictionary_key,
        }))
    }

    async fn call<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Stores a dictionary this transaction's bodies were compressed with.
    pub(super) async fn store_dictionary(
        &mut self,
        trained: NewDictionary,
    ) -> Result<(), StoreError> {
        let dictionary = Arc::clone(&trained.dictionary);
        self.call(|reply| Command::StoreDictionary(trained, reply))
            .await?;
        self.encoding = Encoding::Dictionary(dictionary);
        Ok(())
    }

    /// Writes a batch; returns how many trajectories were new.
    pub(super) async fn write_prepared(&mut self, batch: Vec<Prepared>) -> Result<u64, StoreError> {
        self.call(|reply| Command::Write(batch, reply)).await
    }

    pub(super) async fn commit(self) -> Result<(), StoreError> {
        self.call(|reply| Command::Finish {
            commit: true,
            reply,
        })
        .await
    }

    pub(super) async fn rollback(self) -> Result<(), StoreError> {
        self.call(|reply| Command::Finish {
            commit: false,
            reply,
        })
        .await
    }
}

fn gone() -> StoreError {
    StoreError::Sqlite {
        doing: "writing",
        message: "the writing thread stopped".into(),
    }
}

/// The transaction, on the writing thread.
struct Tx {
    db: Conn,
    /// The next sequence number to give a trajectory (tool rows are keyed by it, so they append). The
    /// transaction began IMMEDIATE, holding the write lock, so no other writer gives numbers meanwhile.
    next_seq: i64,
    encoding: Encoding,
    next_dictionary_key: u32,
    /// The key of each description version this transaction has stored or found, by id.
    description_keys: foldhash::HashMap<String, i64>,
    /// A dictionary stored by this transaction, cached in the store once it commits.
    stored_dictionary: Option<Arc<Dictionary>>,
    dictionaries: Dictionaries,
    now: String,
}

impl Tx {
    fn begin(db: Conn, dictionaries: Dictionaries, now: String) -> Result<Tx, StoreError> {
        db.exec(crate::SQLITE_PRAGMAS, "configuring the connection")?;
        // Every reference an import writes is to a row it has just written or read back in this transaction, so
        // SQLite's check of each (two lookups for every tool row) only cost time: 3% of an import's CPU. The
        // store's other connections keep checking, and the store test runs SQLite's own check after imports.
        db.exec("PRAGMA foreign_keys = OFF", "configuring the connection")?;
        db.exec("BEGIN IMMEDIATE", "starting a transaction")?;
        let next_seq = db
            .prepare("SELECT COALESCE(MAX(seq), 0) + 1 FROM trajectories")?
            .query_i64(&[], "reading the trajectory sequence")?
            .unwrap_or(1);
        let newest = db
            .prepare("SELECT MAX(key) FROM body_dictionaries")?
            .query_i64(&[], "reading the newest compression dictionary")?
            .and_then(|k| u32::try_from(k).ok());
        let encoding = match newest {
            Some(key) => {
                let d = match dictionaries.get(key) {
                    Some(d) => Some(d),
                    None => db
                        .prepare("SELECT dictionary FROM body_dictionaries WHERE key = ?")?
                        .query_blob(
                            &[Val::Int(i64::from(key))],
                            "reading a compression dictionary",
                        )?
                        .map(|b| dictionaries.insert_stored(key, &b)),
                };
                d.map_or(Encoding::Pending, Encoding::Dictionary)
            }
            None => Encoding::Pending,
        };
        Ok(Tx {
            db,
            next_seq,
            encoding,
            next_dictionary_key: newest.map_or(1, |k| k + 1),
            description_keys: Default::default(),
            stored_dictionary: None,
            dictionaries,
            now,
        })
    }

    /// Runs commands until told to finish; if the handle goes away first, rolls back (by closing the connection
    /// with the transaction open).
    fn serve(mut self, inbox: &mpsc::Receiver<Command>) {
        while let Ok(command) = inbox.recv() {
            match command {
                Command::StoreDictionary(trained, reply) => {
                    let _ = reply.send(self.store_dictionary(trained));
                }
                Command::Write(batch, reply) => {
                    let _ = reply.send(self.write(&batch));
                }
                Command::Finish { commit, reply } => {
                    let _ = reply.send(self.finish(commit));
                    return;
                }
            }
        }
    }

    fn store_dictionary(&mut self, trained: NewDictionary) -> Result<(), StoreError> {
        self.db
            .prepare(
                "INSERT INTO body_dictionaries (key, dictionary, samples, created_at) VALUES (?, ?, ?, ?)",
            )?
            .execute(
                &[
                    Val::Int(i64::from(trained.dictionary.key())),
                    Val::Blob(&trained.bytes),
                    Val::Int(trained.samples as i64),
                    Val::Text(&self.now),
                ],
                "storing a compression dictionary",
            )?;
        self.encoding = Encoding::Dictionary(Arc::clone(&trained.dictionary));
        self.stored_dictionary = Some(trained.dictionary);
        Ok(())
    }

    fn write(&mut self, batch: &[Prepared]) -> Result<u64, StoreError> {
        let db = &self.db;
        let now = self.now.as_str();
        // A description version is stored the first time a tool row needs its key (before that row, which
        // references it). Some were stored before this transaction and keep their keys: the key is read back
        // either way.
        let mut insert_description = db.prepare(
            "INSERT OR IGNORE INTO descriptions (id, tool, description, input_schema, first_seen_at) \
             VALUES (?, ?, ?, ?, ?)",
        )?;
        let mut key_of = db.prepare("SELECT key FROM descriptions WHERE id = ?")?;

        // Each trajectory, then its tool list under the sequence number it got. `OR IGNORE` skips a trajectory
        // already stored (same id), which then adds no tool rows.
        let mut insert_trajectory = db.prepare(&format!(
            "INSERT OR IGNORE INTO trajectories ({}, seq) VALUES ({}?)",
            TRAJECTORY_COLS.join(", "),
            "?, ".repeat(TRAJECTORY_COLS.len())
        ))?;
        let mut insert_tool = db.prepare(
            "INSERT INTO trajectory_tools (trajectory_seq, position, description_key, calls) \
             VALUES (?, ?, ?, ?)",
        )?;
        let mut added = 0;
        for p in batch {
            let seq = self.next_seq;
            let body = match &p.body {
                StoredBody::Json(s) => Val::Text(s),
                StoredBody::Compressed(b) | StoredBody::Pending(b) => Val::Blob(b),
            };
            insert_trajectory.execute(
                &[
                    Val::Text(&p.id),
                    Val::Text(&p.source),
                    p.score.map_or(Val::Null, Val::Real),
                    p.success.map_or(Val::Null, Val::Int),
                    Val::opt_text(p.model.as_deref()),
                    Val::opt_text(p.client.as_deref()),
                    Val::opt_text(p.external_id.as_deref()),
                    Val::opt_text(p.started_at.as_deref()),
                    Val::opt_text(p.run_id.as_deref()),
                    Val::opt_text(p.candidate_id.as_deref()),
                    p.rollout.map_or(Val::Null, Val::Int),
                    Val::Text(now),
                    body,
                    Val::Int(seq),
                ],
                "storing trajectories",
            )?;
            if db.changes() == 0 {
                continue;
            }
            self.next_seq += 1;
            added += 1;
            for (position, (d, calls)) in p.tools.iter().enumerate() {
                let key = match self.description_keys.get(&d.id) {
                    Some(&key) => key,
                    None => {
                        insert_description.execute(
                            &[
                                Val::Text(&d.id),
                                Val::Text(&d.tool),
                                Val::Text(&d.description),
                                Val::Text(&d.schema),
                                Val::Text(now),
                            ],
                            "storing description versions",
                        )?;
                        let key = key_of
                            .query_i64(&[Val::Text(&d.id)], "reading description keys")?
                            .ok_or_else(|| no_key(&d.id))?;
                        self.description_keys.insert(d.id.clone(), key);
                        key
                    }
                };
                insert_tool.execute(
                    &[
                        Val::Int(seq),
                        Val::Int(position as i64),
                        Val::Int(key),
                        Val::Int(*calls),
                    ],
                    "storing tool lists",
                )?;
            }
        }
        Ok(added)
    }

    fn finish(self, commit: bool) -> Result<(), StoreError> {
        if commit {
            self.db.exec("COMMIT", "committing")?;
            if let Some(d) = self.stored_dictionary {
                self.dictionaries.insert(d);
            }
            Ok(())
        } else if self.db.in_transaction() {
            self.db.exec("ROLLBACK", "rolling back")
        } else {
            // SQLite rolls back by itself on some errors (a full disk, an I/O error); a second ROLLBACK would
            // fail and hide the error that caused the first.
            Ok(())
        }
    }
}

/// The few calls of SQLite's C API the writer needs, behind a safe interface.
#[allow(unsafe_code)] // The workspace denies unsafe code; this is SQLite's C API, each call's contract noted.
mod ffi {
    use crate::StoreError;
    use libsqlite3_sys as sys;
    use std::ffi::{CStr, CString, c_int};
    use std::marker::PhantomData;
    use std::path::Path;
    use std::ptr::{self, NonNull};

    fn failure(doing: &'static str, message: &str) -> StoreError {
        StoreError::Sqlite {
            doing,
            message: message.to_string(),
        }
    }

    /// A value to bind, borrowed: SQLite reads text and blobs where they are.
    #[derive(Clone, Copy)]
    pub(super) enum Val<'v> {
        Null,
        Int(i64),
        Real(f64),
        Text(&'v str),
        Blob(&'v [u8]),
    }

    impl<'v> Val<'v> {
        pub(super) fn opt_text(s: Option<&'v str>) -> Val<'v> {
            s.map_or(Val::Null, Val::Text)
        }
    }

    /// A connection used by one thread (opened `NOMUTEX`; it is not `Send` or `Sync`).
    pub(super) struct Conn {
        db: NonNull<sys::sqlite3>,
    }

    impl Conn {
        pub(super) fn open(path: &Path) -> Result<Conn, StoreError> {
            let name = CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|_| failure("opening the database", "the path holds a NUL byte"))?;
            let mut db = ptr::null_mut();
            // SAFETY: `name` is a NUL-terminated string that outlives the call; `db` receives a handle (or
            // null when out of memory) that we own from here on, even when the call fails.
            let rc = unsafe {
                sys::sqlite3_open_v2(
                    name.as_ptr(),
                    &mut db,
                    sys::SQLITE_OPEN_READWRITE | sys::SQLITE_OPEN_NOMUTEX,
                    ptr::null(),
                )
            };
            let Some(db) = NonNull::new(db) else {
                return Err(failure("opening the database", "out of memory"));
            };
            let conn = Conn { db };
            if rc != sys::SQLITE_OK {
                return Err(conn.error("opening the database"));
            }
            // SAFETY: a live handle; both calls only set connection options.
            unsafe {
                sys::sqlite3_extended_result_codes(conn.db.as_ptr(), 1);
                // As the sqlx pool's connections wait for a lock (see `Store::open`).
                sys::sqlite3_busy_timeout(conn.db.as_ptr(), 10_000);
            }
            Ok(conn)
        }

        /// The connection's last error, as a store error.
        fn error(&self, doing: &'static str) -> StoreError {
            // SAFETY: a live handle; the message is a NUL-terminated string owned by SQLite, copied before any
            // other call on the connection.
            let (code, message) = unsafe {
                let code = sys::sqlite3_extended_errcode(self.db.as_ptr());
                let message = CStr::from_ptr(sys::sqlite3_errmsg(self.db.as_ptr()));
                (code, message.to_string_lossy().into_owned())
            };
            StoreError::Sqlite {
                doing,
                message: format!("{message} (SQLite code {code})"),
            }
        }

        /// Runs SQL statements that return no rows (or whose rows are not needed).
        pub(super) fn exec(&self, sql: &str, doing: &'static str) -> Result<(), StoreError> {
            let sql = CString::new(sql).map_err(|_| failure(doing, "the SQL holds a NUL byte"))?;
            // SAFETY: a live handle and a NUL-terminated string that outlives the call; no callback, so no
            // callback argument and no error message to free.
            let rc = unsafe {
                sys::sqlite3_exec(
                    self.db.as_ptr(),
                    sql.as_ptr(),
                    None,
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            };
            if rc == sys::SQLITE_OK {
                Ok(())
            } else {
                Err(self.error(doing))
            }
        }

        /// Prepares one statement. The values bound to it must live as long as it does (`'v`).
        pub(super) fn prepare<'v>(&self, sql: &str) -> Result<Stmt<'_, 'v>, StoreError> {
            let len = c_int::try_from(sql.len())
                .map_err(|_| failure("preparing a statement", "the SQL is too long"))?;
            let mut stmt = ptr::null_mut();
            // SAFETY: a live handle; `sql` is read for `len` bytes during the call only (the statement keeps
            // its own copy); `stmt` receives a statement we own, or null on error or for empty SQL.
            let rc = unsafe {
                sys::sqlite3_prepare_v2(
                    self.db.as_ptr(),
                    sql.as_ptr().cast(),
                    len,
                    &mut stmt,
                    ptr::null_mut(),
                )
            };
            if rc != sys::SQLITE_OK {
                return Err(self.error("preparing a statement"));
            }
            let stmt = NonNull::new(stmt)
                .ok_or_else(|| failure("preparing a statement", "the SQL holds no statement"))?;
            Ok(Stmt {
                conn: self,
                stmt,
                values: PhantomData,
            })
        }

        /// Whether a transaction is open (SQLite leaves autocommit mode when one begins).
        pub(super) fn in_transaction(&self) -> bool {
            // SAFETY: a live handle; reads a flag.
            unsafe { sys::sqlite3_get_autocommit(self.db.as_ptr()) == 0 }
        }

        /// Rows the last completed INSERT changed: 0 when `OR IGNORE` skipped the row.
        pub(super) fn changes(&self) -> i64 {
            // SAFETY: a live handle; reads a counter.
            i64::from(unsafe { sys::sqlite3_changes(self.db.as_ptr()) })
        }
    }

    impl Drop for Conn {
        fn drop(&mut self) {
            // SAFETY: the handle is live and every statement (which borrows the connection) is finalized
            // already. Closing with a transaction open rolls it back.
            unsafe {
                sys::sqlite3_close(self.db.as_ptr());
            }
        }
    }

    /// A prepared statement of `conn`; values bound to it borrow for `'v`, which outlives it, so SQLite may read
    /// them in place until it is finalized.
    pub(super) struct Stmt<'c, 'v> {
        conn: &'c Conn,
        stmt: NonNull<sys::sqlite3_stmt>,
        values: PhantomData<&'v [u8]>,
    }

    impl<'v> Stmt<'_, 'v> {
        fn bind(&mut self, values: &[Val<'v>], doing: &'static str) -> Result<(), StoreError> {
            let s = self.stmt.as_ptr();
            for (i, v) in values.iter().enumerate() {
                let at = c_int::try_from(i + 1).unwrap_or(c_int::MAX);
                // SAFETY: a live statement; text and blobs are bound SQLITE_STATIC, which is sound because
                // they borrow for `'v`, which outlives the statement (and each is bound again before the next
                // step). Lengths are in bytes; the text is UTF-8.
                let rc = unsafe {
                    match *v {
                        Val::Null => sys::sqlite3_bind_null(s, at),
                        Val::Int(n) => sys::sqlite3_bind_int64(s, at, n),
                        Val::Real(x) => sys::sqlite3_bind_double(s, at, x),
                        Val::Text(t) => sys::sqlite3_bind_text64(
                            s,
                            at,
                            t.as_ptr().cast(),
                            t.len() as u64,
                            sys::SQLITE_STATIC(),
                            sys::SQLITE_UTF8 as u8,
                        ),
                        Val::Blob(b) => sys::sqlite3_bind_blob64(
                            s,
                            at,
                            b.as_ptr().cast(),
                            b.len() as u64,
                            sys::SQLITE_STATIC(),
                        ),
                    }
                };
                if rc != sys::SQLITE_OK {
                    return Err(self.conn.error(doing));
                }
            }
            Ok(())
        }

        /// Steps once; `Ok(true)` when a row is ready to read.
        fn step(&mut self, doing: &'static str) -> Result<bool, StoreError> {
            // SAFETY: a live statement with every parameter bound.
            match unsafe { sys::sqlite3_step(self.stmt.as_ptr()) } {
                sys::SQLITE_ROW => Ok(true),
                sys::SQLITE_DONE => Ok(false),
                _ => Err(self.conn.error(doing)),
            }
        }

        fn reset(&mut self) {
            // SAFETY: a live statement. An error of the last step was reported by `step` already.
            unsafe {
                sys::sqlite3_reset(self.stmt.as_ptr());
            }
        }

        /// Runs the statement once with `values`, ignoring any rows.
        pub(super) fn execute(
            &mut self,
            values: &[Val<'v>],
            doing: &'static str,
        ) -> Result<(), StoreError> {
            self.bind(values, doing)?;
            let stepped = self.step(doing);
            self.reset();
            stepped.map(|_| ())
        }

        /// Runs the statement with `values` and reads the first row with `read`; `None` when there is no row.
        fn query_one<T>(
            &mut self,
            values: &[Val<'v>],
            doing: &'static str,
            read: impl FnOnce(&Self) -> Option<T>,
        ) -> Result<Option<T>, StoreError> {
            self.bind(values, doing)?;
            let value = self
                .step(doing)
                .map(|row| if row { read(self) } else { None });
            self.reset();
            value
        }

        /// The first column of the first row as an integer; `None` when there is no row or it is NULL.
        pub(super) fn query_i64(
            &mut self,
            values: &[Val<'v>],
            doing: &'static str,
        ) -> Result<Option<i64>, StoreError> {
            self.query_one(values, doing, |st| {
                // SAFETY: a live statement positioned on a row (`query_one` reads only then); column 0 exists
                // in every query we run.
                unsafe {
                    let s = st.stmt.as_ptr();
                    (sys::sqlite3_column_type(s, 0) != sys::SQLITE_NULL)
                        .then(|| sys::sqlite3_column_int64(s, 0))
                }
            })
        }

        /// The first column of the first row as bytes; `None` when there is no row or it is NULL.
        pub(super) fn query_blob(
            &mut self,
            values: &[Val<'v>],
            doing: &'static str,
        ) -> Result<Option<Vec<u8>>, StoreError> {
            self.query_one(values, doing, |st| {
                // SAFETY: as in `query_i64`. The blob pointer is valid for the length SQLite reports until the
                // statement steps or resets, and is copied before that.
                unsafe {
                    let s = st.stmt.as_ptr();
                    if sys::sqlite3_column_type(s, 0) == sys::SQLITE_NULL {
                        return None;
                    }
                    let p = sys::sqlite3_column_blob(s, 0);
                    let n = usize::try_from(sys::sqlite3_column_bytes(s, 0)).unwrap_or(0);
                    Some(if p.is_null() || n == 0 {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec()
                    })
                }
            })
        }
    }

    impl Drop for Stmt<'_, '_> {
        fn drop(&mut self) {
            // SAFETY: a live statement, finalized once.
            unsafe {
                sys::sqlite3_finalize(self.stmt.as_ptr());
            }
        }
    }
}
