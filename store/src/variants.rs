//! The A/B figures of `tooltune proxy` sessions, per variant and tool, each compared with the first variant: what
//! `tooltune traces stats --by variant` prints and the dashboard's variants page shows. Computed here, once, so
//! the two cannot drift apart.

use crate::{Store, StoreError, VariantToolCounts};
use serde::Serialize;
use tooltune_objectives::stats::{Rate, fisher_exact};

/// One variant's figures for one tool, compared with the first variant's (variants in name order).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantRow {
    /// The variant ('' without variants).
    pub variant: String,
    /// The tool.
    pub tool: String,
    /// Sessions of the variant in all.
    pub sessions: u64,
    /// Calls of the tool in the variant's sessions.
    pub calls: u64,
    /// Share of the variant's sessions that called the tool.
    pub session_share: Rate,
    /// The tool's share of all the variant's tool calls (calls within a session are not independent, so read its
    /// interval as a guide; the session share is the unit of assignment).
    pub call_share: Rate,
    /// Failed calls among the tool's calls.
    pub error_rate: Rate,
    /// Fisher's exact test of `session_share` against the first variant's (`None` for the first variant).
    pub share_p_vs_first: Option<f64>,
    /// The same for `call_share`.
    pub call_p_vs_first: Option<f64>,
    /// The same for `error_rate`.
    pub error_p_vs_first: Option<f64>,
}

/// The rows of `counts` (as [`Store::proxy_variant_counts`] gives them, unfiltered), for one tool or all. The
/// counts must be unfiltered so that a tool's share of calls is over all the variant's calls even for one tool.
pub fn variant_rows(counts: &[VariantToolCounts], tool: Option<&str>) -> Vec<VariantRow> {
    let all_calls = |variant: &str| -> u64 {
        counts
            .iter()
            .filter(|x| x.variant == variant)
            .map(|x| x.calls)
            .sum()
    };
    let mut rows = Vec::new();
    for c in counts.iter().filter(|c| tool.is_none_or(|t| t == c.tool)) {
        let first = counts.iter().find(|f| f.tool == c.tool);
        let vs_first = |f: &dyn Fn(&VariantToolCounts) -> (u64, u64)| {
            first.filter(|f| f.variant != c.variant).map(|base| {
                let (a, n) = f(base);
                let (b, m) = f(c);
                fisher_exact(a, n, b, m)
            })
        };
        rows.push(VariantRow {
            variant: c.variant.clone(),
            tool: c.tool.clone(),
            sessions: c.sessions,
            calls: c.calls,
            session_share: Rate::wilson(c.sessions_calling, c.sessions),
            call_share: Rate::wilson(c.calls, all_calls(&c.variant)),
            error_rate: Rate::wilson(c.errors, c.calls),
            share_p_vs_first: vs_first(&|x| (x.sessions_calling, x.sessions)),
            call_p_vs_first: vs_first(&|x| (x.calls, all_calls(&x.variant))),
            error_p_vs_first: vs_first(&|x| (x.errors, x.calls)),
        });
    }
    rows
}

impl Store {
    /// [`variant_rows`] over every recorded proxy session.
    pub async fn proxy_variant_rows(
        &self,
        tool: Option<&str>,
    ) -> Result<Vec<VariantRow>, StoreError> {
        Ok(variant_rows(&self.proxy_variant_counts(None).await?, tool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(
        variant: &str,
        tool: &str,
        sessions: u64,
        calling: u64,
        calls: u64,
    ) -> VariantToolCounts {
        VariantToolCounts {
            variant: variant.into(),
            tool: tool.into(),
            sessions,
            sessions_calling: calling,
            calls,
            errors: calls / 2,
        }
    }

    #[test]
    fn rows_compare_each_variant_with_the_first_and_call_shares_span_every_tool() {
        let c = vec![
            counts("a", "search_docs", 20, 5, 6),
            counts("a", "web_search", 20, 15, 18),
            counts("b", "search_docs", 20, 15, 18),
            counts("b", "web_search", 20, 5, 6),
        ];
        let rows = variant_rows(&c, Some("search_docs"));
        assert_eq!(rows.len(), 2);
        let (a, b) = (&rows[0], &rows[1]);
        assert_eq!((a.variant.as_str(), b.variant.as_str()), ("a", "b"));
        // The first variant is the baseline: no test against itself.
        assert_eq!(a.share_p_vs_first, None);
        assert_eq!(
            b.share_p_vs_first,
            Some(fisher_exact(5, 20, 15, 20)),
            "sessions calling"
        );
        // Filtered to one tool, the share of calls is still over all 24 calls of the variant.
        assert_eq!(a.call_share, Rate::wilson(6, 24));
        assert_eq!(b.call_share, Rate::wilson(18, 24));
        assert_eq!(b.call_p_vs_first, Some(fisher_exact(6, 24, 18, 24)));
        assert_eq!(b.error_rate, Rate::wilson(9, 18));
        assert_eq!(b.error_p_vs_first, Some(fisher_exact(3, 6, 9, 18)));
        assert_eq!(variant_rows(&c, None).len(), 4);
    }
}
