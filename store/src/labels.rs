//! Labels tooltune wrote for trajectories whose producer wrote no outcome (`trajectory_labels`, migration 0010):
//! from heuristics over the log, or from a judge model. They are kept apart from the producer's outcome, which
//! stays in the trajectory untouched, and every figure computed with them says where its verdicts came from.
//!
//! When labels are used ([`LabelUse::Use`]), a trajectory's verdict is the producer's when it wrote one, else its
//! preferred label: a judge's over the heuristics' (the judge reads the answer; the rules only see failure signs),
//! among judges the newest.

use crate::runs::now;
use crate::{Store, StoreError, q};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use std::fmt;
use std::str::FromStr;
use tooltune_core::TrajectoryId;

/// Who wrote a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelSource {
    /// Rules over the log (`tooltune_reflection::heuristics`).
    Heuristic,
    /// A grader model (`tooltune_reflection::judge`).
    Judge,
}

impl LabelSource {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            LabelSource::Heuristic => "heuristic",
            LabelSource::Judge => "judge",
        }
    }

    fn from_stored(s: &str) -> Option<Self> {
        match s {
            "heuristic" => Some(LabelSource::Heuristic),
            "judge" => Some(LabelSource::Judge),
            _ => None,
        }
    }
}

impl fmt::Display for LabelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether figures over the store use tooltune's labels where the producer wrote no outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelUse {
    /// The producer's outcome first; a stored label only where the producer wrote none.
    #[default]
    Use,
    /// Only the producer's outcomes.
    Ignore,
}

impl FromStr for LabelUse {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "use" => Ok(LabelUse::Use),
            "ignore" => Ok(LabelUse::Ignore),
            other => Err(format!("`{other}`: expected use or ignore")),
        }
    }
}

/// A label to store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewLabel {
    /// The trajectory labelled.
    pub trajectory_id: String,
    /// Who labelled it.
    pub source: LabelSource,
    /// The judge's model id; empty for heuristics.
    pub model: String,
    /// Score in [0, 1], when the labeller gave one.
    pub score: Option<f64>,
    /// The verdict.
    pub success: bool,
    /// The rules that fired, or the judge's line.
    pub feedback: String,
    /// JSON the store keeps as it is (rule or template version, the judge's replies).
    pub detail: Option<String>,
}

/// A stored label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Label {
    /// The label as written.
    #[serde(flatten)]
    pub label: NewLabel,
    /// When it was written (RFC 3339).
    pub created_at: String,
}

/// Where the verdicts behind a figure came from: how many of each source, and how many of those succeeded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictCounts {
    /// Verdicts the producer wrote.
    pub producer: Tally,
    /// Verdicts from a judge's label (only where the producer wrote none).
    pub judge: Tally,
    /// Verdicts from the heuristics' label (only where neither the producer nor a judge gave one).
    pub heuristic: Tally,
}

/// Verdicts of one source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Trajectories with a verdict from this source.
    pub judged: u64,
    /// Successful ones among them.
    pub succeeded: u64,
}

impl VerdictCounts {
    /// All sources together.
    pub fn total(&self) -> Tally {
        Tally {
            judged: self.producer.judged + self.judge.judged + self.heuristic.judged,
            succeeded: self.producer.succeeded + self.judge.succeeded + self.heuristic.succeeded,
        }
    }

    pub(crate) fn add(&mut self, other: &VerdictCounts) {
        for (a, b) in [
            (&mut self.producer, other.producer),
            (&mut self.judge, other.judge),
            (&mut self.heuristic, other.heuristic),
        ] {
            a.judged += b.judged;
            a.succeeded += b.succeeded;
        }
    }
}

/// A trajectory chosen for labelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToLabel {
    /// Its id.
    pub id: TrajectoryId,
    /// The producer's verdict (only present when trajectories with one were asked for).
    pub producer_success: Option<bool>,
}

/// The preferred label of each trajectory, as a derived table `(trajectory_id, success, source, feedback)`: the judge's
/// over the heuristics', among several the newest (ties broken by model id, so the choice is stable).
pub(crate) const PREFERRED_LABEL: &str = "(SELECT l.trajectory_id, l.success, l.source, l.feedback FROM trajectory_labels l \
     WHERE NOT EXISTS (SELECT 1 FROM trajectory_labels o WHERE o.trajectory_id = l.trajectory_id AND \
       ((CASE o.source WHEN 'judge' THEN 1 ELSE 0 END) > (CASE l.source WHEN 'judge' THEN 1 ELSE 0 END) \
        OR ((CASE o.source WHEN 'judge' THEN 1 ELSE 0 END) = (CASE l.source WHEN 'judge' THEN 1 ELSE 0 END) \
            AND (o.created_at > l.created_at OR (o.created_at = l.created_at AND o.model > l.model))))))";

impl Store {
    /// Stores labels in one transaction. A label for the same trajectory, source and model as a stored one
    /// replaces it. A trajectory that is not in the store is refused, with its id.
    pub async fn save_labels(&self, labels: &[NewLabel]) -> Result<(), StoreError> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(q("starting to store labels"))?;
        let at = now();
        for l in labels {
            // COUNT is a BIGINT in both dialects, which is what the `Any` driver reads as an i64.
            let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM trajectories WHERE id = $1")
                .bind(l.trajectory_id.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(q("checking a labelled trajectory"))?;
            if exists == 0 {
                return Err(StoreError::NotFound {
                    what: format!("trajectory {}", l.trajectory_id),
                });
            }
            sqlx::query(
                "INSERT INTO trajectory_labels \
                   (trajectory_id, source, model, score, success, feedback, detail, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (trajectory_id, source, model) DO UPDATE SET score = excluded.score, \
                   success = excluded.success, feedback = excluded.feedback, detail = excluded.detail, \
                   created_at = excluded.created_at",
            )
            .bind(l.trajectory_id.as_str())
            .bind(l.source.as_str())
            .bind(l.model.as_str())
            .bind(l.score)
            .bind(i64::from(l.success))
            .bind(l.feedback.as_str())
            .bind(l.detail.as_deref())
            .bind(at.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q("storing a label"))?;
        }
        tx.commit().await.map_err(q("committing labels"))?;
        Ok(())
    }

    /// Every label of a trajectory, judges first, newest first.
    pub async fn labels(&self, id: &TrajectoryId) -> Result<Vec<Label>, StoreError> {
        let rows = sqlx::query(
            "SELECT trajectory_id, source, model, score, success, feedback, detail, created_at \
             FROM trajectory_labels WHERE trajectory_id = $1 \
             ORDER BY CASE source WHEN 'judge' THEN 0 ELSE 1 END, created_at DESC, model",
        )
        .bind(id.as_str())
        .fetch_all(self.pool())
        .await
        .map_err(q("loading labels"))?;
        rows.iter()
            .map(|r| {
                let source: String = r.get(1);
                Ok(Label {
                    label: NewLabel {
                        trajectory_id: r.get(0),
                        source: LabelSource::from_stored(&source).ok_or_else(|| {
                            StoreError::Corrupt {
                                id: id.to_string(),
                                message: format!("label source `{source}`"),
                            }
                        })?,
                        model: r.get(2),
                        score: r.get(3),
                        success: r.get::<i64, _>(4) != 0,
                        feedback: r.get(5),
                        detail: r.get(6),
                    },
                    created_at: r.get(7),
                })
            })
            .collect()
    }

    /// How many labels the store holds, of one source or (with `None`) of both.
    pub async fn count_labels(&self, source: Option<LabelSource>) -> Result<u64, StoreError> {
        let n: i64 = match source {
            Some(s) => {
                sqlx::query_scalar("SELECT COUNT(*) FROM trajectory_labels WHERE source = $1")
                    .bind(s.as_str())
                    .fetch_one(self.pool())
                    .await
            }
            None => {
                sqlx::query_scalar("SELECT COUNT(*) FROM trajectory_labels")
                    .fetch_one(self.pool())
                    .await
            }
        }
        .map_err(q("counting labels"))?;
        Ok(n.max(0) as u64)
    }

    /// Trajectories to label, newest ingest first: those whose producer wrote no outcome, except the evaluator's
    /// rollouts without one (infrastructure failures, which have no verdict to find). With `with_outcome`, also
    /// those with an outcome (the evaluator's rollouts included), to measure a labeller against it. Optionally
    /// only those that showed `tool`, ingested at or after `since`, at most `limit`.
    pub async fn trajectories_to_label(
        &self,
        tool: Option<&str>,
        since: Option<&str>,
        with_outcome: bool,
        limit: u64,
    ) -> Result<Vec<ToLabel>, StoreError> {
        let sql = format!(
            "SELECT t.id, t.success FROM trajectories t WHERE \
               ((t.success IS NULL AND t.source <> 'evaluator') OR ($1 = 1 AND t.success IS NOT NULL)) \
               AND t.ingested_at >= $2 {} ORDER BY t.seq DESC LIMIT $3",
            if tool.is_some() {
                "AND EXISTS (SELECT 1 FROM trajectory_tools tt JOIN descriptions d ON d.key = tt.description_key \
                   WHERE tt.trajectory_seq = t.seq AND d.tool = $4)"
            } else {
                ""
            }
        );
        let mut query = sqlx::query(&sql)
            .bind(i64::from(with_outcome))
            .bind(since.unwrap_or("").to_string())
            .bind(limit.min(i64::MAX as u64) as i64);
        if let Some(tool) = tool {
            query = query.bind(tool.to_string());
        }
        let rows = query
            .fetch_all(self.pool())
            .await
            .map_err(q("listing trajectories to label"))?;
        Ok(rows
            .into_iter()
            .map(|r| ToLabel {
                id: TrajectoryId::from_stored(r.get(0)),
                producer_success: r.get::<Option<i64>, _>(1).map(|s| s != 0),
            })
            .collect())
    }
}

/// The same derived table with no rows: figures that ignore labels run the same query over it.
pub(crate) const NO_LABEL: &str =
    "(SELECT trajectory_id, success, source, feedback FROM trajectory_labels WHERE 1 = 0)";

/// A failing trajectory and where its verdict came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failing {
    /// Its id.
    pub id: TrajectoryId,
    /// `producer`, `judge` or `heuristic`.
    pub verdict_source: String,
    /// The label's feedback, when the verdict is a label (the producer's feedback is in the trajectory).
    pub label_feedback: Option<String>,
}

impl Store {
    /// [`Store::failing_for_tool`] with labels used where the producer wrote no outcome (when `labels` is
    /// [`LabelUse::Use`]): the failing trajectories, newest first, each with the source of its verdict, and the
    /// verdicts of every judged trajectory that showed the tool, counted by source.
    pub async fn failing_for_tool_with(
        &self,
        tool: &str,
        since: Option<&str>,
        limit: u64,
        labels: LabelUse,
    ) -> Result<(Vec<Failing>, VerdictCounts), StoreError> {
        let pl = match labels {
            LabelUse::Use => PREFERRED_LABEL,
            LabelUse::Ignore => NO_LABEL,
        };
        let from = format!(
            "FROM trajectories t JOIN trajectory_tools tt ON tt.trajectory_seq = t.seq \
             JOIN descriptions d ON d.key = tt.description_key \
             LEFT JOIN {pl} pl ON pl.trajectory_id = t.id \
             WHERE d.tool = $1 AND t.ingested_at >= $2 AND t.source <> 'evaluator'"
        );
        let rows = sqlx::query(&format!(
            "SELECT t.id, CASE WHEN t.success IS NULL THEN pl.source ELSE 'producer' END, \
               CASE WHEN t.success IS NULL THEN pl.feedback END {from} \
               AND (t.success = 0 OR (t.success IS NULL AND pl.success = 0)) \
             ORDER BY t.seq DESC LIMIT $3"
        ))
        .bind(tool.to_string())
        .bind(since.unwrap_or("").to_string())
        .bind(limit.min(i64::MAX as u64) as i64)
        .fetch_all(self.pool())
        .await
        .map_err(q("listing failing trajectories"))?;
        let failing = rows
            .into_iter()
            .map(|r| Failing {
                id: TrajectoryId::from_stored(r.get(0)),
                verdict_source: r.get::<Option<String>, _>(1).unwrap_or_default(),
                label_feedback: r.get(2),
            })
            .collect();
        let c = sqlx::query(&format!(
            "SELECT COUNT(CASE WHEN t.success IS NOT NULL THEN 1 END), \
               COUNT(CASE WHEN t.success = 1 THEN 1 END), \
               COUNT(CASE WHEN t.success IS NULL AND pl.source = 'judge' THEN 1 END), \
               COUNT(CASE WHEN t.success IS NULL AND pl.source = 'judge' AND pl.success = 1 THEN 1 END), \
               COUNT(CASE WHEN t.success IS NULL AND pl.source = 'heuristic' THEN 1 END), \
               COUNT(CASE WHEN t.success IS NULL AND pl.source = 'heuristic' AND pl.success = 1 THEN 1 END) \
             {from}"
        ))
        .bind(tool.to_string())
        .bind(since.unwrap_or("").to_string())
        .fetch_one(self.pool())
        .await
        .map_err(q("counting judged trajectories"))?;
        let n = |i: usize| c.get::<i64, _>(i).max(0) as u64;
        let mut counts = VerdictCounts::default();
        tally(&mut counts, "producer", n(0), n(1));
        tally(&mut counts, "judge", n(2), n(3));
        tally(&mut counts, "heuristic", n(4), n(5));
        Ok((failing, counts))
    }
}

/// Adds one verdict of `source` (`producer`, `judge`, `heuristic`) to `counts`.
pub(crate) fn tally(counts: &mut VerdictCounts, source: &str, judged: u64, succeeded: u64) {
    let t = match source {
        "producer" => &mut counts.producer,
        "judge" => &mut counts.judge,
        _ => &mut counts.heuristic,
    };
    t.judged += judged;
    t.succeeded += succeeded;
}
