-- Optimisation runs and what they did, so that a run can be resumed after a crash without redoing or losing a
-- finished rollout, and re-rendered as a report later. The optimizer's search state is stored as JSON: the store
-- does not know its shape.
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,                  -- optimize | from-traces
    suite TEXT,
    objective TEXT NOT NULL,
    config TEXT NOT NULL,                -- JSON: everything needed to resume (suite path, tools, budget, seed, models)
    status TEXT NOT NULL,                -- running | finished | failed | stopped
    state TEXT,                          -- JSON checkpoint of the search, written after every step
    elapsed_ms BIGINT NOT NULL,
    result TEXT,                         -- JSON summary once finished
    error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

-- One row per (candidate, task, rollout) evaluated in a run: the per-task scores and the facts both objectives are
-- computed from. The trajectory itself is in `trajectories` (linked by run and candidate).
CREATE TABLE run_rollouts (
    run_id TEXT NOT NULL REFERENCES runs (id),
    candidate_key TEXT NOT NULL,         -- content address of the candidate's descriptions
    task_id TEXT NOT NULL,
    rollout BIGINT NOT NULL,
    result TEXT NOT NULL,                -- JSON: the evaluator's per-task result
    trajectory_id TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, candidate_key, task_id, rollout)
);

-- Reflections (diagnosis and proposed description, or a failed proposal with every attempt).
CREATE TABLE run_proposals (
    run_id TEXT NOT NULL REFERENCES runs (id),
    proposal_key TEXT NOT NULL,          -- parent, tool and minibatch: the same request gives the stored answer
    proposal TEXT NOT NULL,              -- JSON
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, proposal_key)
);

-- Progress events, in order: what the dashboard streams and the report's per-iteration charts read.
CREATE TABLE run_events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq BIGINT NOT NULL,
    event TEXT NOT NULL,                 -- JSON
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
