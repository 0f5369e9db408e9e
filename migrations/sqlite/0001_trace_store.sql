-- The trace store: description versions (content-addressed, stored once), trajectories, and which description
-- versions each trajectory showed, with how often the model called each tool.
CREATE TABLE descriptions (
    id TEXT PRIMARY KEY,                 -- sha256 of (tool name, description, canonical input schema)
    tool TEXT NOT NULL,
    description TEXT NOT NULL,
    input_schema TEXT NOT NULL,          -- canonical JSON
    first_seen_at TEXT NOT NULL
);
CREATE INDEX descriptions_by_tool ON descriptions (tool);

CREATE TABLE trajectories (
    id TEXT PRIMARY KEY,                 -- sha256 of the canonical trajectory: re-ingesting adds nothing
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
    body TEXT NOT NULL                   -- the trajectory as tooltune JSON without its tool list (see trajectory_tools)
);
CREATE INDEX trajectories_by_run ON trajectories (run_id, candidate_id);
CREATE INDEX trajectories_by_ingested ON trajectories (ingested_at);

CREATE TABLE trajectory_tools (
    trajectory_id TEXT NOT NULL REFERENCES trajectories (id),
    position INTEGER NOT NULL,           -- order in the tool list the model was shown
    description_id TEXT NOT NULL REFERENCES descriptions (id),
    tool TEXT NOT NULL,
    calls INTEGER NOT NULL,              -- how many times the model called this tool in the trajectory
    PRIMARY KEY (trajectory_id, position)
);
CREATE INDEX trajectory_tools_by_description ON trajectory_tools (description_id);
