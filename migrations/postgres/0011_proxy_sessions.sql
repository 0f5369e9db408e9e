-- Sessions recorded by `tooltune proxy`, which sits between a host and an MCP server. A proxy sees the JSON-RPC
-- traffic only: which descriptions the host was shown and which tools it called, with what arguments, whether the
-- call failed and how long it took. It never sees the task, the model's turns or the final answer, so these rows
-- are not trajectories (a trajectory has a task and an outcome): they feed selection and error figures per
-- variant (`tooltune traces stats --by variant`), not reflection.
CREATE TABLE proxy_sessions (
    id TEXT PRIMARY KEY,                 -- a UUID per client session
    server TEXT NOT NULL,                -- the upstream's program name or URL (never its arguments: they may hold secrets)
    variant TEXT NOT NULL,               -- the A/B variant this session was assigned; '' without variants
    tools TEXT,                          -- JSON: the tools listed to the host, {name: {description, description_id}}
    client TEXT,                         -- the host's clientInfo from initialize, as JSON
    protocol_version TEXT,               -- the revision the server answered initialize with
    started_at TEXT NOT NULL,
    ended_at TEXT,
    dropped INTEGER NOT NULL DEFAULT 0   -- calls not recorded because the recorder fell behind
);

CREATE TABLE proxy_calls (
    session_id TEXT NOT NULL REFERENCES proxy_sessions (id),
    seq INTEGER NOT NULL,                -- order of the call within its session
    tool TEXT NOT NULL,
    description_id TEXT,                 -- the version of the tool's description the host was shown, when it listed
    arguments TEXT,                      -- JSON, with --redact keys replaced
    is_error INTEGER NOT NULL,           -- 1: the result had isError or the call got a JSON-RPC error
    rpc_error TEXT,                      -- the JSON-RPC error object, when there was one
    latency_ms DOUBLE PRECISION NOT NULL,
    result TEXT,                         -- the result, with --record full only
    called_at TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX proxy_sessions_by_variant ON proxy_sessions (variant);
