//! The result cache: finished results (rollouts, exact scores) stored under a content address the caller computes,
//! so that a result is reused across candidates, runs and demos instead of being computed again. The key is the
//! whole truth: whatever the result depends on is hashed into it, so an entry is never updated or invalidated, and
//! the first result stored under a key is the one kept.

use crate::runs::now;
use crate::{Store, StoreError, q};
use sqlx::Row;
use std::collections::HashMap;

/// How many keys one batched lookup binds at most (one `IN (...)` list per chunk).
const LOOKUP_CHUNK: usize = 500;

/// A result stored in the cache under its content address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedResult {
    /// What the result is (e.g. `rollout`, `screen`), as the caller named it when storing it.
    pub kind: String,
    /// The result, as the caller stored it (JSON text; the store does not know its shape).
    pub result: String,
    /// The trajectory the result was computed from, when it has one.
    pub trajectory_id: Option<String>,
}

/// A `CachedResult` from a row whose first three columns are `kind, result, trajectory_id`.
fn cached_row(r: &sqlx::any::AnyRow) -> CachedResult {
    CachedResult {
        kind: r.get(0),
        result: r.get(1),
        trajectory_id: r.get(2),
    }
}

impl Store {
    /// The result stored under `key`, if any.
    pub async fn cached_result(&self, key: &str) -> Result<Option<CachedResult>, StoreError> {
        let row =
            sqlx::query("SELECT kind, result, trajectory_id FROM result_cache WHERE key = $1")
                .bind(key)
                .fetch_optional(self.pool())
                .await
                .map_err(q("looking up a cached result"))?;
        Ok(row.as_ref().map(cached_row))
    }

    /// The results stored under any of `keys`, by key; a key with no result is absent from the map. Asks in
    /// chunks of at most 500 keys, one query each.
    pub async fn cached_results(
        &self,
        keys: &[String],
    ) -> Result<HashMap<String, CachedResult>, StoreError> {
        let mut found = HashMap::new();
        for chunk in keys.chunks(LOOKUP_CHUNK) {
            let sql = format!(
                "SELECT kind, result, trajectory_id, key FROM result_cache WHERE key IN ({})",
                crate::jobs::placeholders(1, chunk.len())
            );
            let mut query = sqlx::query(&sql);
            for key in chunk {
                query = query.bind(key.as_str());
            }
            let rows = query
                .fetch_all(self.pool())
                .await
                .map_err(q("looking up cached results"))?;
            for r in &rows {
                found.insert(r.get(3), cached_row(r));
            }
        }
        Ok(found)
    }

    /// Stores `result` under `key`. A result already stored under `key` is kept (the first write wins: two
    /// computations of the same key give the same result, and the first may already have been reused).
    pub async fn cache_result(
        &self,
        key: &str,
        kind: &str,
        result: &str,
        trajectory_id: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO result_cache (key, kind, result, trajectory_id, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(key)
        .bind(kind)
        .bind(result)
        .bind(trajectory_id)
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("storing a cached result"))?;
        Ok(())
    }

    /// How many results the cache holds, of one kind or (with `None`) of every kind.
    pub async fn count_cached(&self, kind: Option<&str>) -> Result<i64, StoreError> {
        match kind {
            Some(kind) => {
                sqlx::query_scalar("SELECT COUNT(*) FROM result_cache WHERE kind = $1")
                    .bind(kind)
                    .fetch_one(self.pool())
                    .await
            }
            None => {
                sqlx::query_scalar("SELECT COUNT(*) FROM result_cache")
                    .fetch_one(self.pool())
                    .await
            }
        }
        .map_err(q("counting cached results"))
    }
}
