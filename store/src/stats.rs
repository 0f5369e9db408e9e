//! Per-tool and per-description-version statistics over the stored trajectories: how often a tool was shown,
//! how often the model chose it, and how the runs that chose it ended, each rate with a 95% Wilson interval.

use crate::labels::{LabelUse, PREFERRED_LABEL, VerdictCounts, tally};
use crate::{Store, StoreError, q};
use serde::Serialize;
use sqlx::Row;
use tooltune_objectives::stats::Rate;

/// Statistics of one tool, either for one description version or (with `description_id == None`) all versions.
#[derive(Debug, Clone, Serialize)]
pub struct ToolStats {
    /// The tool name.
    pub tool: String,
    /// The description version, or `None` for the tool's total over all versions.
    pub description_id: Option<String>,
    /// The description text of this version (`None` for the total).
    pub description: Option<String>,
    /// Trajectories in which the tool was shown to the model.
    pub shown: u64,
    /// Trajectories in which the model called it at least once.
    pub chosen: u64,
    /// Calls in all, counting repeats within a trajectory.
    pub calls: u64,
    /// chosen / shown.
    pub selection_share: Rate,
    /// Successful trajectories among those that called it (and have a verdict).
    pub success_when_chosen: Rate,
    /// Where the verdicts behind `success_when_chosen` came from: the producer's outcomes, and (when labels are
    /// used) tooltune's labels where the producer wrote none.
    pub verdicts: VerdictCounts,
}

impl Store {
    /// Statistics per tool (a total row first) and per description version, tools in name order and versions by
    /// how often they were shown; verdicts from the producers' outcomes only.
    pub async fn tool_stats(&self, tool: Option<&str>) -> Result<Vec<ToolStats>, StoreError> {
        self.tool_stats_with(tool, LabelUse::Ignore).await
    }

    /// [`Store::tool_stats`], with tooltune's labels counted where the producer wrote no outcome when `labels` is
    /// [`LabelUse::Use`]; each row's `verdicts` says how many verdicts came from which source.
    pub async fn tool_stats_with(
        &self,
        tool: Option<&str>,
        labels: LabelUse,
    ) -> Result<Vec<ToolStats>, StoreError> {
        let (label_cols, label_join) = match labels {
            LabelUse::Use => (
                "COUNT(CASE WHEN tt.calls > 0 AND t.success IS NULL AND pl.source = 'judge' THEN 1 END) AS judged_j, \
                 COUNT(CASE WHEN tt.calls > 0 AND t.success IS NULL AND pl.source = 'judge' AND pl.success = 1 \
                   THEN 1 END) AS succeeded_j, \
                 COUNT(CASE WHEN tt.calls > 0 AND t.success IS NULL AND pl.source = 'heuristic' THEN 1 END) AS judged_h, \
                 COUNT(CASE WHEN tt.calls > 0 AND t.success IS NULL AND pl.source = 'heuristic' AND pl.success = 1 \
                   THEN 1 END) AS succeeded_h"
                    .to_string(),
                format!("LEFT JOIN {PREFERRED_LABEL} pl ON pl.trajectory_id = t.id"),
            ),
            LabelUse::Ignore => (
                "CAST(0 AS BIGINT), CAST(0 AS BIGINT), CAST(0 AS BIGINT), CAST(0 AS BIGINT)".to_string(),
                String::new(),
            ),
        };
        let sql = format!(
            "SELECT d.tool, d.id, d.description, \
               COUNT(*) AS shown, \
               COUNT(CASE WHEN tt.calls > 0 THEN 1 END) AS chosen, \
               CAST(COALESCE(SUM(tt.calls), 0) AS BIGINT) AS calls, \
               COUNT(CASE WHEN tt.calls > 0 AND t.success IS NOT NULL THEN 1 END) AS judged, \
               COUNT(CASE WHEN tt.calls > 0 AND t.success = 1 THEN 1 END) AS succeeded, \
               {label_cols} \
             FROM trajectory_tools tt \
             JOIN trajectories t ON t.seq = tt.trajectory_seq \
             JOIN descriptions d ON d.key = tt.description_key \
             {label_join} \
             {} \
             GROUP BY d.tool, d.id, d.description \
             ORDER BY d.tool, shown DESC, d.id",
            if tool.is_some() {
                "WHERE d.tool = $1"
            } else {
                ""
            }
        );
        let mut query = sqlx::query(&sql);
        if let Some(tool) = tool {
            query = query.bind(tool.to_string());
        }
        let rows = query
            .fetch_all(self.pool())
            .await
            .map_err(q("computing tool statistics"))?;
        let mut out: Vec<ToolStats> = Vec::new();
        let mut total_at: Option<usize> = None;
        let mut verdicts_total = VerdictCounts::default();
        for r in rows {
            let tool: String = r.get(0);
            let shown = r.get::<i64, _>(3) as u64;
            let chosen = r.get::<i64, _>(4) as u64;
            let calls = r.get::<i64, _>(5) as u64;
            let count = |i: usize| r.get::<i64, _>(i).max(0) as u64;
            let mut verdicts = VerdictCounts::default();
            tally(&mut verdicts, "producer", count(6), count(7));
            tally(&mut verdicts, "judge", count(8), count(9));
            tally(&mut verdicts, "heuristic", count(10), count(11));
            if total_at.map(|i| out[i].tool != tool).unwrap_or(true) {
                finish_total(&mut out, total_at, &verdicts_total);
                verdicts_total = VerdictCounts::default();
                total_at = Some(out.len());
                out.push(ToolStats {
                    tool: tool.clone(),
                    description_id: None,
                    description: None,
                    shown: 0,
                    chosen: 0,
                    calls: 0,
                    selection_share: Rate::wilson(0, 0),
                    success_when_chosen: Rate::wilson(0, 0),
                    verdicts: VerdictCounts::default(),
                });
            }
            if let Some(i) = total_at {
                // A tool appears once per trajectory (names are unique in a tool list), so per-version counts add
                // up to exact totals.
                out[i].shown += shown;
                out[i].chosen += chosen;
                out[i].calls += calls;
            }
            verdicts_total.add(&verdicts);
            let all = verdicts.total();
            out.push(ToolStats {
                tool,
                description_id: Some(r.get(1)),
                description: Some(r.get(2)),
                shown,
                chosen,
                calls,
                selection_share: Rate::wilson(chosen, shown),
                success_when_chosen: Rate::wilson(all.succeeded, all.judged),
                verdicts,
            });
        }
        finish_total(&mut out, total_at, &verdicts_total);
        Ok(out)
    }
}

fn finish_total(out: &mut [ToolStats], at: Option<usize>, verdicts: &VerdictCounts) {
    if let Some(i) = at {
        let t = &mut out[i];
        let all = verdicts.total();
        t.selection_share = Rate::wilson(t.chosen, t.shown);
        t.success_when_chosen = Rate::wilson(all.succeeded, all.judged);
        t.verdicts = *verdicts;
    }
}
