-- Compression dictionaries for trajectory bodies (see store/src/body.rs): a store trains one from the first import
-- that brings enough records, and compresses every later body with it. A body names its dictionary by key, so a
-- row here is never updated or deleted.
CREATE TABLE body_dictionaries (
    key INTEGER PRIMARY KEY,
    dictionary BLOB NOT NULL,
    samples INTEGER NOT NULL,            -- how many bodies it was trained on
    created_at TEXT NOT NULL
);
