//! Sessions and tool calls recorded by `tooltune proxy` (`proxy_sessions`, `proxy_calls`, migration 0011), and the
//! per-variant counts `tooltune traces stats --by variant` shows. A proxy sees JSON-RPC traffic only (no task, no
//! model turns, no answer), so these are not trajectories; see the migration for what each column holds.

use crate::runs::now;
use crate::{Store, StoreError, q};
use serde::{Deserialize, Serialize};
use sqlx::Row;

/// A session to open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewProxySession {
    /// Its id (a UUID).
    pub id: String,
    /// The upstream's program name or URL, without arguments.
    pub server: String,
    /// The A/B variant assigned; empty without variants.
    pub variant: String,
}

/// What a session learnt once the host and server had talked: the tools listed, who the host is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionFacts {
    /// The tools listed to the host, as JSON `{name: {description, description_id}}`.
    pub tools: Option<String>,
    /// The host's `clientInfo`, as JSON.
    pub client: Option<String>,
    /// The revision the server answered `initialize` with.
    pub protocol_version: Option<String>,
}

/// One recorded `tools/call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyCall {
    /// The session it belongs to.
    pub session_id: String,
    /// Its order in the session, from 0.
    pub seq: u64,
    /// The tool called.
    pub tool: String,
    /// The description version the host was shown for it, when the session listed tools.
    pub description_id: Option<String>,
    /// The arguments as JSON (redacted keys replaced), or `None` when not recorded.
    pub arguments: Option<String>,
    /// The result had `isError`, or the call got a JSON-RPC error.
    pub is_error: bool,
    /// The JSON-RPC error object, as JSON.
    pub rpc_error: Option<String>,
    /// From the request leaving the host to the response leaving the server, through the proxy.
    pub latency_ms: f64,
    /// The result as JSON (`--record full`).
    pub result: Option<String>,
    /// When the call was made (RFC 3339).
    pub called_at: String,
}

/// Counts of one variant and tool, over sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantToolCounts {
    /// The variant ('' without variants).
    pub variant: String,
    /// The tool ('' for the variant's row of sessions with no call).
    pub tool: String,
    /// Sessions of the variant in all.
    pub sessions: u64,
    /// Sessions of the variant that called the tool at least once.
    pub sessions_calling: u64,
    /// Calls of the tool in the variant's sessions.
    pub calls: u64,
    /// Those that failed (`isError` or a JSON-RPC error).
    pub errors: u64,
}

impl Store {
    /// Opens a recorded session.
    pub async fn start_proxy_session(&self, s: &NewProxySession) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO proxy_sessions (id, server, variant, started_at, dropped) VALUES ($1, $2, $3, $4, 0)",
        )
        .bind(s.id.as_str())
        .bind(s.server.as_str())
        .bind(s.variant.as_str())
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("opening a proxy session"))?;
        Ok(())
    }

    /// Records what the session learnt (fields left `None` are kept as they are).
    pub async fn update_proxy_session(
        &self,
        id: &str,
        facts: &SessionFacts,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE proxy_sessions SET tools = COALESCE($2, tools), client = COALESCE($3, client), \
             protocol_version = COALESCE($4, protocol_version) WHERE id = $1",
        )
        .bind(id)
        .bind(facts.tools.as_deref())
        .bind(facts.client.as_deref())
        .bind(facts.protocol_version.as_deref())
        .execute(self.pool())
        .await
        .map_err(q("updating a proxy session"))?;
        Ok(())
    }

    /// Stores calls in one transaction. A call already stored (same session and seq) is left as it was, so a
    /// batch written twice after a retry is stored once.
    pub async fn record_proxy_calls(&self, calls: &[ProxyCall]) -> Result<(), StoreError> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(q("starting to record proxy calls"))?;
        for c in calls {
            sqlx::query(
                "INSERT INTO proxy_calls (session_id, seq, tool, description_id, arguments, is_error, rpc_error, \
                 latency_ms, result, called_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (session_id, seq) DO NOTHING",
            )
            .bind(c.session_id.as_str())
            .bind(c.seq as i64)
            .bind(c.tool.as_str())
            .bind(c.description_id.as_deref())
            .bind(c.arguments.as_deref())
            .bind(i64::from(c.is_error))
            .bind(c.rpc_error.as_deref())
            .bind(c.latency_ms)
            .bind(c.result.as_deref())
            .bind(c.called_at.as_str())
            .execute(&mut *tx)
            .await
            .map_err(q("recording a proxy call"))?;
        }
        tx.commit()
            .await
            .map_err(q("committing recorded proxy calls"))?;
        Ok(())
    }

    /// Closes a session, with the number of calls the recorder had to drop.
    pub async fn end_proxy_session(&self, id: &str, dropped: u64) -> Result<(), StoreError> {
        sqlx::query("UPDATE proxy_sessions SET ended_at = $2, dropped = $3 WHERE id = $1")
            .bind(id)
            .bind(now())
            .bind(dropped as i64)
            .execute(self.pool())
            .await
            .map_err(q("closing a proxy session"))?;
        Ok(())
    }

    /// The recorded calls of one session, in order.
    pub async fn proxy_calls(&self, session_id: &str) -> Result<Vec<ProxyCall>, StoreError> {
        let rows = sqlx::query(
            "SELECT session_id, seq, tool, description_id, arguments, is_error, rpc_error, latency_ms, result, \
             called_at FROM proxy_calls WHERE session_id = $1 ORDER BY seq",
        )
        .bind(session_id)
        .fetch_all(self.pool())
        .await
        .map_err(q("reading proxy calls"))?;
        Ok(rows
            .iter()
            .map(|r| ProxyCall {
                session_id: r.get(0),
                seq: r.get::<i64, _>(1) as u64,
                tool: r.get(2),
                description_id: r.get(3),
                arguments: r.get(4),
                is_error: r.get::<i64, _>(5) != 0,
                rpc_error: r.get(6),
                latency_ms: r.get(7),
                result: r.get(8),
                called_at: r.get(9),
            })
            .collect())
    }

    /// Per variant and tool: sessions, sessions that called the tool, calls and failed calls. Every variant has
    /// a row per tool called in any session of any variant (zero where it was not), so variants line up.
    pub async fn proxy_variant_counts(
        &self,
        tool: Option<&str>,
    ) -> Result<Vec<VariantToolCounts>, StoreError> {
        let sessions = sqlx::query(
            "SELECT variant, COUNT(*) FROM proxy_sessions GROUP BY variant ORDER BY variant",
        )
        .fetch_all(self.pool())
        .await
        .map_err(q("counting proxy sessions"))?;
        // COUNT is a BIGINT in both dialects; SUM of an INTEGER column too (NUMERIC in PostgreSQL for BIGINT
        // input, hence the cast), which is what the `Any` driver reads as an i64.
        let calls = sqlx::query(
            "SELECT s.variant, c.tool, COUNT(DISTINCT c.session_id), COUNT(*), CAST(SUM(c.is_error) AS BIGINT) \
             FROM proxy_calls c JOIN proxy_sessions s ON s.id = c.session_id \
             GROUP BY s.variant, c.tool ORDER BY s.variant, c.tool",
        )
        .fetch_all(self.pool())
        .await
        .map_err(q("counting proxy calls"))?;
        let mut tools: Vec<String> = calls.iter().map(|r| r.get::<String, _>(1)).collect();
        tools.sort();
        tools.dedup();
        if let Some(t) = tool {
            tools.retain(|x| x == t);
        }
        let mut out = Vec::new();
        for s in &sessions {
            let variant: String = s.get(0);
            let n = s.get::<i64, _>(1) as u64;
            for t in &tools {
                let row = calls
                    .iter()
                    .find(|r| r.get::<String, _>(0) == variant && &r.get::<String, _>(1) == t);
                let get = |i: usize| row.map(|r| r.get::<i64, _>(i) as u64).unwrap_or(0);
                out.push(VariantToolCounts {
                    variant: variant.clone(),
                    tool: t.clone(),
                    sessions: n,
                    sessions_calling: get(2),
                    calls: get(3),
                    errors: get(4),
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(session: &str, seq: u64, tool: &str, is_error: bool) -> ProxyCall {
        ProxyCall {
            session_id: session.into(),
            seq,
            tool: tool.into(),
            description_id: None,
            arguments: Some(r#"{"q":"x"}"#.into()),
            is_error,
            rpc_error: None,
            latency_ms: 1.5,
            result: None,
            called_at: now(),
        }
    }

    #[tokio::test]
    async fn counts_per_variant_line_up_and_a_batch_written_twice_is_stored_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path().join("s.db").to_str().expect("utf-8"))
            .await
            .expect("open");
        for (id, variant) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
            store
                .start_proxy_session(&NewProxySession {
                    id: id.into(),
                    server: "srv".into(),
                    variant: variant.into(),
                })
                .await
                .expect("session");
        }
        let batch = vec![
            call("a1", 0, "search_docs", false),
            call("a1", 1, "search_docs", true),
            call("b1", 0, "web_search", false),
        ];
        store.record_proxy_calls(&batch).await.expect("calls");
        store.record_proxy_calls(&batch).await.expect("again");
        assert_eq!(store.proxy_calls("a1").await.expect("read").len(), 2);
        let counts = store.proxy_variant_counts(None).await.expect("counts");
        let get = |v: &str, t: &str| {
            counts
                .iter()
                .find(|c| c.variant == v && c.tool == t)
                .cloned()
                .expect("row")
        };
        let a = get("a", "search_docs");
        assert_eq!(
            (a.sessions, a.sessions_calling, a.calls, a.errors),
            (2, 1, 2, 1)
        );
        // Variant b never called search_docs, and still has its row.
        let b = get("b", "search_docs");
        assert_eq!((b.sessions, b.sessions_calling, b.calls), (1, 0, 0));
        assert_eq!(get("a", "web_search").sessions_calling, 0);
        assert_eq!(get("b", "web_search").sessions_calling, 1);
        store.end_proxy_session("a1", 3).await.expect("end");
    }
}
