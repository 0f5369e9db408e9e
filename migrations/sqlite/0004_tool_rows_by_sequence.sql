-- Tool rows were keyed by their trajectory's id, a sha256: each trajectory's rows landed at a random place in
-- that key's B-tree, which outgrew SQLite's page cache at a few hundred thousand trajectories and made the
-- writer the limit of a bulk ingest (200,000 trajectories took 2.3 times as long as 100,000). A trajectory now
-- also has a sequence number given in insertion order, and its tool rows are keyed by it, so they append.
ALTER TABLE trajectories ADD COLUMN seq INTEGER;
UPDATE trajectories SET seq = rowid;
CREATE UNIQUE INDEX trajectories_by_seq ON trajectories (seq);
CREATE TABLE trajectory_tools_by_seq (
    trajectory_seq INTEGER NOT NULL REFERENCES trajectories (seq),
    position INTEGER NOT NULL,           -- order in the tool list the model was shown
    description_id TEXT NOT NULL REFERENCES descriptions (id),
    tool TEXT NOT NULL,
    calls INTEGER NOT NULL,              -- how many times the model called this tool in the trajectory
    PRIMARY KEY (trajectory_seq, position)
) WITHOUT ROWID;
INSERT INTO trajectory_tools_by_seq (trajectory_seq, position, description_id, tool, calls)
    SELECT t.seq, tt.position, tt.description_id, tt.tool, tt.calls
    FROM trajectory_tools tt JOIN trajectories t ON t.id = tt.trajectory_id;
DROP TABLE trajectory_tools;
ALTER TABLE trajectory_tools_by_seq RENAME TO trajectory_tools;
CREATE INDEX trajectory_tools_by_description ON trajectory_tools (description_id);
