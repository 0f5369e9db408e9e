-- Rollouts run by `tooltune worker` processes (issue 30). The queue itself is pgmq's (installed SQL-only into the
-- `pgmq` schema by the first driver or worker that needs it, one queue per agent model and suite); these tables
-- hold what pgmq does not: the suites the jobs name, which queue serves which model and suite, the results, and
-- who is working.

-- A suite by content address (sha256 of its file), so that a worker on another machine can read the suite a job
-- names without the driver's checkout.
CREATE TABLE job_suites (
    digest TEXT PRIMARY KEY,             -- sha256 hex of the suite file
    name TEXT NOT NULL,
    text TEXT NOT NULL,                  -- the suite file itself
    origin TEXT NOT NULL,                -- the path the driver read it from (a hint for workers on the same machine)
    fixture_digest TEXT NOT NULL,        -- the fixture's content address ('' without one): a worker's copy must match
    created_at TEXT NOT NULL
);

-- One pgmq queue per (agent model, suite): a worker reads only the queues of the model it has and the suites it
-- can serve, so it never takes a job it would have to leave.
CREATE TABLE job_queues (
    queue TEXT PRIMARY KEY,              -- the pgmq queue's name
    model TEXT NOT NULL,                 -- the agent model's identity (its id and the SIMD path its greedy output needs)
    suite_digest TEXT NOT NULL REFERENCES job_suites (digest),
    created_at TEXT NOT NULL
);

-- A job's result under its content address (the rollout or screen key), written once: a job that ran twice (its
-- worker was cut off and the job was retried) keeps the first result. The trajectory travels in the row, so the
-- result and its trajectory are written together, and the driver alone stores trajectories.
CREATE TABLE job_results (
    key TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    result TEXT NOT NULL,                -- JSON: the evaluator's TaskResult
    trajectory TEXT,                     -- JSON: the rollout's trajectory (none for screens)
    infra INTEGER NOT NULL,              -- 1: the worker gave up on it (an infrastructure failure); may be replaced
    worker TEXT NOT NULL,                -- who ran it
    attempts INTEGER NOT NULL,           -- how many times the job had been taken when this was written
    model_ms DOUBLE PRECISION NOT NULL,  -- the job's share of its batch's evaluation time
    queue_ms DOUBLE PRECISION NOT NULL,  -- the job's share of the worker's queue operations (read, write, archive)
    created_at TEXT NOT NULL
);

-- Workers, as they last reported themselves (every few seconds while running).
CREATE TABLE job_workers (
    id TEXT PRIMARY KEY,                 -- host, pid and a random suffix
    host TEXT NOT NULL,
    model TEXT NOT NULL,
    started_at TEXT NOT NULL,
    last_seen TEXT NOT NULL,
    jobs_done BIGINT NOT NULL DEFAULT 0,
    failures BIGINT NOT NULL DEFAULT 0,
    state TEXT NOT NULL                  -- idle, busy, stopped
);
