-- Integer keys where a bulk ingest writes one row per shown tool, and the sequence number as the trajectory's rowid.
-- Measured on 200,000 trajectories: each one's five tool rows carried a 64-character description id and the tool's
-- name (about 85 bytes a row, an eighth of the file), and each trajectory paid for two more index entries, one for
-- its sequence number and one for its ingest time.
-- * A description version gets an integer key (its rowid); tool rows reference it and no longer repeat the tool
--   name, which the description version holds.
-- * A trajectory's sequence number is its rowid (`INTEGER PRIMARY KEY`), so the separate index on it is gone; the
--   id keeps its unique index. Sequence numbers are given in insertion order, so "newest ingest first" is
--   `ORDER BY seq DESC`, and the index on the ingest time is gone too.
-- SQLite cannot change a table's primary key in place: the three tables are rebuilt, in an order that never leaves
-- a row pointing at a table that is being dropped.
CREATE TABLE descriptions_new (
    key INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,             -- sha256 of (tool name, description, canonical input schema)
    tool TEXT NOT NULL,
    description TEXT NOT NULL,
    input_schema TEXT NOT NULL,          -- canonical JSON
    first_seen_at TEXT NOT NULL
);
INSERT INTO descriptions_new (id, tool, description, input_schema, first_seen_at)
    SELECT id, tool, description, input_schema, first_seen_at FROM descriptions ORDER BY rowid;

CREATE TABLE tool_rows_copy AS
    SELECT tt.trajectory_seq AS trajectory_seq, tt.position AS position, d.key AS description_key, tt.calls AS calls
    FROM trajectory_tools tt JOIN descriptions_new d ON d.id = tt.description_id;
DROP TABLE trajectory_tools;

CREATE TABLE trajectories_new (
    seq INTEGER PRIMARY KEY,             -- given in insertion order; tool rows are keyed by it
    id TEXT NOT NULL UNIQUE,             -- sha256 of the canonical trajectory: re-ingesting adds nothing
    source TEXT NOT NULL,
    task TEXT NOT NULL,
    final_answer TEXT,
    score DOUBLE PRECISION,
    success INTEGER,                     -- effective success (explicit, or score >= 0.5), NULL when unknown
    feedback TEXT,
    model TEXT,
    client TEXT,
    external_id TEXT,
    started_at TEXT,
    run_id TEXT,
    candidate_id TEXT,
    rollout INTEGER,
    ingested_at TEXT NOT NULL,
    body TEXT NOT NULL                   -- the trajectory's canonical JSON without its tool list (see README.md)
);
INSERT INTO trajectories_new (seq, id, source, task, final_answer, score, success, feedback, model, client,
        external_id, started_at, run_id, candidate_id, rollout, ingested_at, body)
    SELECT seq, id, source, task, final_answer, score, success, feedback, model, client,
        external_id, started_at, run_id, candidate_id, rollout, ingested_at, body
    FROM trajectories ORDER BY seq;
DROP TABLE trajectories;
ALTER TABLE trajectories_new RENAME TO trajectories;
CREATE INDEX trajectories_by_run ON trajectories (run_id, candidate_id) WHERE run_id IS NOT NULL;

DROP TABLE descriptions;
ALTER TABLE descriptions_new RENAME TO descriptions;
CREATE INDEX descriptions_by_tool ON descriptions (tool);

CREATE TABLE trajectory_tools (
    trajectory_seq INTEGER NOT NULL REFERENCES trajectories (seq),
    position INTEGER NOT NULL,           -- order in the tool list the model was shown
    description_key INTEGER NOT NULL REFERENCES descriptions (key),
    calls INTEGER NOT NULL,              -- how many times the model called this tool in the trajectory
    PRIMARY KEY (trajectory_seq, position)
) WITHOUT ROWID;
INSERT INTO trajectory_tools (trajectory_seq, position, description_key, calls)
    SELECT trajectory_seq, position, description_key, calls FROM tool_rows_copy ORDER BY trajectory_seq, position;
DROP TABLE tool_rows_copy;
