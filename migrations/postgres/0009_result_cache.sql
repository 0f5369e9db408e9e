-- Finished results (a rollout's per-task result, an exact score) by content address, so that none is computed
-- twice: with greedy decoding a rollout is a pure function of what its key hashes (agent model, host version, the
-- descriptions shown, the task, the server's initial state), so any candidate, run or demo that asks for the same
-- key reuses the first result stored under it (first write wins). A change of model, host or suite changes the key,
-- so nothing here is ever invalidated by hand. No foreign key to `runs`: an entry outlives the run that made it.
CREATE TABLE result_cache (
    key TEXT PRIMARY KEY,                -- content address, e.g. `rollout-<sha256 hex>`
    kind TEXT NOT NULL,                  -- what the result is (rollout, screen, ...), for counting
    result TEXT NOT NULL,                -- JSON: the store does not know its shape
    trajectory_id TEXT,                  -- the rollout's trajectory, when it has one
    created_at TEXT NOT NULL
);
