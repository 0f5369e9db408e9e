-- Labels written by tooltune for trajectories whose producer wrote no outcome (`tooltune traces label`): from
-- heuristics over the log itself, or from a judge model. They live apart from the producer's outcome, which stays
-- in the trajectory's body and columns untouched (a body is what the trajectory's content address hashes), so a
-- reader always knows which verdict came from whom, and can ignore ours. One label per trajectory, source and
-- judge model: labelling again with the same source and model replaces it.
CREATE TABLE trajectory_labels (
    trajectory_id TEXT NOT NULL REFERENCES trajectories (id),
    source TEXT NOT NULL,                -- heuristic | judge
    model TEXT NOT NULL,                 -- the judge's model id; '' for heuristics
    score DOUBLE PRECISION,              -- in [0, 1]; NULL when the labeller gave none
    success BIGINT NOT NULL,             -- 0/1
    feedback TEXT NOT NULL,              -- the rules that fired, or the judge's one line
    detail TEXT,                         -- JSON: rule or template version, the judge's replies
    created_at TEXT NOT NULL,
    PRIMARY KEY (trajectory_id, source, model)
);
