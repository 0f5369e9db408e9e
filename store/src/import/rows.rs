//! Trajectories turned into row values (ids, encoded body, description versions) on the threads that parse them,
//! so that the writer only binds; and the same preparation on its own for the ingest benchmark.

use super::encoding::{Encoding, train_on};
use crate::body::StoredBody;
use rayon::prelude::*;
use serde_json::Value;
use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::Arc;
use tooltune_core::{DescriptionId, ToolSpec, Trajectory, canonical_json};

/// Does, in parallel as an import does, all the work an import does per trajectory before any SQL (ids, JSON body,
/// its compression for SQLite, description versions), chunk by chunk, and returns the bytes prepared. For the
/// ingest benchmark, which times the CPU side of an ingest apart from its inserts with exactly the store's code.
pub struct PrepareOnly {
    encoding: Encoding,
}

impl PrepareOnly {
    /// Prepares as for SQLite (`sqlite`: bodies compressed, the first chunk training the dictionary, as in an
    /// import into a new store) or for PostgreSQL (JSON text).
    pub fn new(sqlite: bool) -> PrepareOnly {
        PrepareOnly {
            encoding: if sqlite {
                Encoding::Pending
            } else {
                Encoding::Text
            },
        }
    }

    /// Prepares one chunk; returns the bytes prepared.
    pub fn chunk(&mut self, ts: &[Trajectory]) -> usize {
        let mut prepared: Vec<Prepared> = ts
            .par_iter()
            .map(|t| Prepared::new(t, &self.encoding))
            .collect();
        if matches!(self.encoding, Encoding::Pending) {
            self.encoding = train_on(&mut prepared, 1).0;
        }
        prepared
            .iter()
            .map(|p| p.id.len() + p.body.len() + p.tools.len())
            .sum()
    }
}

/// One trajectory turned into row values, ready to bind.
pub(crate) struct Prepared {
    pub(super) id: String,
    pub(super) source: String,
    pub(super) score: Option<f64>,
    pub(super) success: Option<i64>,
    pub(super) model: Option<String>,
    pub(super) client: Option<String>,
    pub(super) external_id: Option<String>,
    pub(super) started_at: Option<String>,
    pub(super) run_id: Option<String>,
    pub(super) candidate_id: Option<String>,
    pub(super) rollout: Option<i64>,
    pub(super) body: StoredBody,
    /// (description version, calls) in tool-list order.
    pub(super) tools: Vec<(Arc<DescriptionRow>, i64)>,
}

/// One description version as stored: a row of `descriptions`.
pub(crate) struct DescriptionRow {
    pub(super) id: String,
    pub(super) tool: String,
    pub(super) description: String,
    /// Canonical JSON of the input schema.
    pub(super) schema: String,
}

/// Description versions by a hash of (tool, description): each with the schema it was computed for.
/// A decoded schema and the description version it was found to belong to.
type SchemaCopy = (Arc<Value>, Arc<DescriptionRow>);

/// Description versions by a hash of (tool, description), each with the schema copies it was found for, and how
/// many schema copies that is in all.
#[derive(Default)]
struct SeenDescriptions {
    by_text: foldhash::HashMap<u64, Vec<SchemaCopy>>,
    len: usize,
}

thread_local! {
    /// Description versions this thread has already computed, by a hash of (tool, description). A log repeats the
    /// same few tools in every record, and computing a version (canonical schema, sha256) for each of them was a
    /// fifth of an ingest's CPU time. Bounded: cleared when it holds [`SEEN_LIMIT`] schemas.
    static SEEN: RefCell<SeenDescriptions> = RefCell::new(SeenDescriptions::default());
}
const SEEN_LIMIT: usize = 4096;

fn description_row(tool: &ToolSpec) -> Arc<DescriptionRow> {
    // A fixed-seed foldhash: the key only picks a bucket of candidates that are then compared in full.
    let key = foldhash::fast::FixedState::default().hash_one((&tool.name, &tool.description));
    SEEN.with_borrow_mut(|seen| {
        let same_text =
            |row: &DescriptionRow| row.tool == tool.name && row.description == tool.description;
        let rows = seen
            .by_text
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        // Readers share one decoded schema between the records that show it: the pointer test settles those
        // without walking the schema.
        if let Some((_, row)) = rows
            .iter()
            .find(|(schema, row)| Arc::ptr_eq(schema, &tool.input_schema) && same_text(row))
        {
            return Arc::clone(row);
        }
        // The same schema decoded separately (by another reading thread, or by a reader that does not share)
        // reuses the version, and this copy is remembered too, so that its next records take the pointer test.
        let known = rows
            .iter()
            .find(|(schema, row)| *schema == tool.input_schema && same_text(row))
            .map(|(_, row)| Arc::clone(row));
        let row = known.unwrap_or_else(|| {
            let schema = canonical_json(&tool.input_schema);
            Arc::new(DescriptionRow {
                id: DescriptionId::of_canonical(&tool.name, &tool.description, &schema)
                    .as_str()
                    .to_string(),
                tool: tool.name.clone(),
                description: tool.description.clone(),
                schema,
            })
        });
        if seen.len >= SEEN_LIMIT {
            *seen = SeenDescriptions::default();
        }
        seen.len += 1;
        seen.by_text
            .entry(key)
            .or_default()
            .push((Arc::clone(&tool.input_schema), Arc::clone(&row)));
        row
    })
}

impl Prepared {
    /// Row values for `t`, its body encoded as `encoding` says.
    pub(super) fn new(t: &Trajectory, encoding: &Encoding) -> Prepared {
        // The body is the trajectory without its tool list, which lives in `trajectory_tools` and `descriptions`
        // so that a description is stored once. It is the canonical JSON the id is computed from, so an ingest
        // serialises each record once.
        let (id, body) = t.id_and_body();
        let tools = t
            .tools
            .iter()
            .map(|tool| (description_row(tool), t.calls_of(&tool.name) as i64))
            .collect();
        Prepared {
            id: id.as_str().to_string(),
            source: t.meta.source.clone(),
            score: t.outcome.score,
            success: t.outcome.effective_success().map(i64::from),
            model: t.meta.model.clone(),
            client: t.meta.client.clone(),
            external_id: t.meta.external_id.clone(),
            started_at: t.meta.started_at.clone(),
            run_id: t.links.run_id.clone(),
            candidate_id: t.links.candidate_id.clone(),
            rollout: t.links.rollout.map(i64::from),
            body: encoding.encode(body),
            tools,
        }
    }
}
