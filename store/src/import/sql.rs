//! The SQL of the sqlx writer's batched inserts: statements built once per batch size, the tables' columns and
//! batch sizes, and the binding of a batch's rows.

use super::rows::Prepared;
use crate::body::StoredBody;
use sqlx::Any;

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
pub(super) fn insert_sql(table: &str, cols: &[&str], rows: usize, numbered: bool) -> String {
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
pub(super) fn push_placeholders(s: &mut String, first: usize, n: usize, numbered: bool) {
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

pub(super) const TRAJECTORY_COLS: &[&str] = &[
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
pub(super) const TOOL_COLS: &[&str] = &["trajectory_seq", "position", "description_key", "calls"];
pub(super) const DESCRIPTION_COLS: &[&str] =
    &["id", "tool", "description", "input_schema", "first_seen_at"];
// Rows per statement: well under SQLite's 32,766 and PostgreSQL's 65,535 bound parameters.
pub(super) const TRAJECTORY_BATCH: usize = 500;
pub(super) const TOOL_BATCH: usize = 2000;
pub(super) const DESCRIPTION_BATCH: usize = 500;

/// The SQL of a batched insert of `rows` rows: one statement for a full batch, reused by every full batch (the
/// driver prepares it once), and one for the shorter last batch. Each is built only when some batch needs it.
pub(super) struct BatchSql {
    batch: usize,
    full: String,
    last: String,
}

impl BatchSql {
    pub(super) fn new(rows: usize, batch: usize, make: impl Fn(usize) -> String) -> BatchSql {
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
    pub(super) fn for_rows(&self, n: usize) -> &str {
        if n == self.batch {
            &self.full
        } else {
            &self.last
        }
    }
}

/// A tool row: trajectory number, position in its tool list, description key, calls.
pub(super) type ToolRow = (i64, i64, i64, i64);

type Insert<'q> = sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>;

/// The insert of `rows` (with `sql` made for as many rows), numbering them from `next_seq` on SQLite.
pub(super) fn bind_trajectories<'q>(
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
pub(super) fn bind_tools<'q>(sql: &'q str, rows: &'q [ToolRow]) -> Insert<'q> {
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
