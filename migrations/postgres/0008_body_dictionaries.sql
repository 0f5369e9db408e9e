-- Compression dictionaries for trajectory bodies (see store/src/body.rs). PostgreSQL keeps bodies as JSON text
-- (TOAST compresses them), so this table stays empty there; it exists so that both dialects keep one schema.
CREATE TABLE body_dictionaries (
    key BIGINT PRIMARY KEY,
    dictionary BYTEA NOT NULL,
    samples BIGINT NOT NULL,
    created_at TEXT NOT NULL
);
