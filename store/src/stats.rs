//! Per-tool and per-description-version statistics over the stored trajectories: how often a tool was shown,
//! how often the model chose it, and how the runs that chose it ended, each rate with a 95% Wilson interval.

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
}

impl Store {
    /// Statistics per tool (a total row first) and per description version, tools in name order and versions by
    /// how often they were shown.
    pub async fn tool_stats(&self, tool: Option<&str>) -> Result<Vec<ToolStats>, StoreError> {
        let sql = format!(
            "SELECT d.tool, d.id, d.description, \
               COUNT(*) AS shown, \
               COUNT(CASE WHEN tt.calls > 0 THEN 1 END) AS chosen, \
               CAST(COALESCE(SUM(tt.calls), 0) AS BIGINT) AS calls, \
               COUNT(CASE WHEN tt.calls > 0 AND t.success IS NOT NULL THEN 1 END) AS judged, \
               COUNT(CASE WHEN tt.calls > 0 AND t.success = 1 THEN 1 END) AS succeeded \
             FROM trajectory_tools tt \
             JOIN trajectories t ON t.seq = tt.trajectory_seq \
             JOIN descriptions d ON d.key = tt.description_key \
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
        let mut judged_total = 0u64;
        let mut succeeded_total = 0u64;
        for r in rows {
            let tool: String = r.get(0);
            let shown = r.get::<i64, _>(3) as u64;
            let chosen = r.get::<i64, _>(4) as u64;
            let calls = r.get::<i64, _>(5) as u64;
            let judged = r.get::<i64, _>(6) as u64;
            let succeeded = r.get::<i64, _>(7) as u64;
            if total_at.map(|i| out[i].tool != tool).unwrap_or(true) {
                finish_total(&mut out, total_at, succeeded_total, judged_total);
                (judged_total, succeeded_total) = (0, 0);
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
                });
            }
            if let Some(i) = total_at {
                // A tool appears once per trajectory (names are unique in a tool list), so per-version counts add
                // up to exact totals.
                out[i].shown += shown;
                out[i].chosen += chosen;
                out[i].calls += calls;
            }
            judged_total += judged;
            succeeded_total += succeeded;
            out.push(ToolStats {
                tool,
                description_id: Some(r.get(1)),
                description: Some(r.get(2)),
                shown,
                chosen,
                calls,
                selection_share: Rate::wilson(chosen, shown),
                success_when_chosen: Rate::wilson(succeeded, judged),
            });
        }
        finish_total(&mut out, total_at, succeeded_total, judged_total);
        Ok(out)
    }
}

fn finish_total(out: &mut [ToolStats], at: Option<usize>, succeeded: u64, judged: u64) {
    if let Some(i) = at {
        let t = &mut out[i];
        t.selection_share = Rate::wilson(t.chosen, t.shown);
        t.success_when_chosen = Rate::wilson(succeeded, judged);
    }
}
