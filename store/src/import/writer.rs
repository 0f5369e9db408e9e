//! The sqlx transaction trajectories are written in: `Store::insert`'s, and an import's unless it goes into a SQLite
//! file (`sqlite.rs`). Description versions first, then trajectories, then their tool lists, in batched inserts.

use super::encoding::{Encoding, NewDictionary};
use super::rows::Prepared;
use super::sql::{
    BatchSql, DESCRIPTION_BATCH, DESCRIPTION_COLS, TOOL_BATCH, TOOL_COLS, TRAJECTORY_BATCH,
    TRAJECTORY_COLS, ToolRow, bind_tools, bind_trajectories, insert_sql, push_placeholders,
};
use super::{no_key, now_text};
use crate::body::Dictionary;
use crate::{Store, StoreError, q};
use rayon::prelude::*;
use sqlx::{Any, Row, Transaction};
use std::collections::HashMap;
use std::sync::Arc;
use tooltune_core::Trajectory;

/// The PostgreSQL advisory lock of transactions that add description versions ("tooltune descriptions" in ASCII,
/// cut to 8 bytes: any constant no other part of tooltune uses).
const DESCRIPTIONS_LOCK: i64 = 0x746f_6f6c_6465_7363;

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
    pub(super) encoding: Encoding,
    /// SQLite: the key a dictionary trained in this transaction gets.
    pub(super) next_dictionary_key: u32,
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
    pub(super) async fn store_dictionary(
        &mut self,
        trained: NewDictionary,
    ) -> Result<(), StoreError> {
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
    pub(super) async fn write_prepared(&mut self, batch: &[Prepared]) -> Result<u64, StoreError> {
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
