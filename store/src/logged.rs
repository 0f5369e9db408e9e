//! The logged runs `suite from-traces` makes tasks from: every stored trajectory that is a log of real use (not
//! one of the evaluator's rollouts), filtered by the tools it showed, by when it ran and by where its verdict came
//! from, each with that verdict (the producer's outcome, else tooltune's preferred label when labels are used).

use crate::labels::{LabelUse, NO_LABEL, PREFERRED_LABEL};
use crate::{Store, StoreError, q};
use sqlx::Row;
use tooltune_core::TrajectoryId;

/// Which logged runs to read.
#[derive(Debug, Clone, Default)]
pub struct LoggedFilter {
    /// Only runs that showed one of these tools (empty: any).
    pub tools: Vec<String>,
    /// Only runs that started (else were ingested) at or after this RFC 3339 time or `YYYY-MM-DD` date.
    pub since: Option<String>,
    /// Only runs that started (else were ingested) at or before this time, or on or before this date (a date
    /// includes its whole day).
    pub until: Option<String>,
    /// Only runs whose verdict came from one of these sources (`producer`, `judge`, `heuristic`); empty: any,
    /// unjudged runs included.
    pub verdict_sources: Vec<String>,
    /// Whether tooltune's labels count where the producer wrote no outcome.
    pub labels: LabelUse,
    /// At most this many runs, the earliest logged first.
    pub limit: u64,
}

/// A logged run's id and verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedVerdict {
    /// The trajectory.
    pub id: TrajectoryId,
    /// Its verdict; `None` when nobody judged it.
    pub success: Option<bool>,
    /// `producer`, `judge` or `heuristic`; `None` when unjudged.
    pub verdict_source: Option<String>,
}

impl Store {
    /// The logged runs that pass `filter`, in the order they were stored, with their verdicts. The time compared
    /// is the run's own start (`started_at`) when the producer logged one, else when it was ingested; times are
    /// compared as RFC 3339 text, so they should share a time zone (the readers write UTC).
    pub async fn logged_runs(
        &self,
        filter: &LoggedFilter,
    ) -> Result<Vec<LoggedVerdict>, StoreError> {
        let pl = match filter.labels {
            LabelUse::Use => PREFERRED_LABEL,
            LabelUse::Ignore => NO_LABEL,
        };
        let when = "COALESCE(t.started_at, t.ingested_at)";
        let mut sql = format!(
            "SELECT t.id, CASE WHEN t.success IS NULL THEN pl.success ELSE t.success END, \
               CASE WHEN t.success IS NULL THEN pl.source ELSE 'producer' END \
             FROM trajectories t LEFT JOIN {pl} pl ON pl.trajectory_id = t.id \
             WHERE t.source <> 'evaluator'"
        );
        let mut binds: Vec<String> = Vec::new();
        let next = |v: &str, binds: &mut Vec<String>| {
            binds.push(v.to_string());
            format!("${}", binds.len())
        };
        if let Some(s) = &filter.since {
            sql.push_str(&format!(" AND {when} >= {}", next(s, &mut binds)));
        }
        if let Some(u) = &filter.until {
            // A date (or any prefix of a time) includes every time it begins: compare that many characters.
            let p = next(u, &mut binds);
            sql.push_str(&format!(" AND SUBSTR({when}, 1, LENGTH({p})) <= {p}"));
        }
        if !filter.tools.is_empty() {
            let list: Vec<String> = filter.tools.iter().map(|t| next(t, &mut binds)).collect();
            sql.push_str(&format!(
                " AND t.seq IN (SELECT tt.trajectory_seq FROM trajectory_tools tt \
                 JOIN descriptions d ON d.key = tt.description_key WHERE d.tool IN ({}))",
                list.join(", ")
            ));
        }
        if !filter.verdict_sources.is_empty() {
            let list: Vec<String> = filter
                .verdict_sources
                .iter()
                .map(|s| next(s, &mut binds))
                .collect();
            sql.push_str(&format!(
                " AND (CASE WHEN t.success IS NULL THEN pl.source ELSE 'producer' END) IN ({})",
                list.join(", ")
            ));
        }
        sql.push_str(&format!(
            " ORDER BY t.seq LIMIT {}",
            filter.limit.min(i64::MAX as u64)
        ));
        let mut query = sqlx::query(&sql);
        for b in &binds {
            query = query.bind(b.clone());
        }
        let rows = query
            .fetch_all(self.pool())
            .await
            .map_err(q("listing logged runs"))?;
        Ok(rows
            .into_iter()
            .map(|r| LoggedVerdict {
                id: TrajectoryId::from_stored(r.get(0)),
                success: r.get::<Option<i64>, _>(1).map(|s| s != 0),
                verdict_source: r.get(2),
            })
            .collect())
    }
}
