-- Tool rows were keyed by their trajectory's id, a sha256, so a bulk ingest inserted them at random places in
-- the key's index. A trajectory now also has a sequence number given in insertion order, and its tool rows are
-- keyed by it, so they append (see the SQLite migration of the same number for the measurement).
ALTER TABLE trajectories ADD COLUMN seq BIGSERIAL;
CREATE UNIQUE INDEX trajectories_by_seq ON trajectories (seq);
CREATE TABLE trajectory_tools_by_seq (
    trajectory_seq BIGINT NOT NULL REFERENCES trajectories (seq),
    position BIGINT NOT NULL,            -- order in the tool list the model was shown
    description_id TEXT NOT NULL REFERENCES descriptions (id),
    tool TEXT NOT NULL,
    calls BIGINT NOT NULL,               -- how many times the model called this tool in the trajectory
    PRIMARY KEY (trajectory_seq, position)
);
INSERT INTO trajectory_tools_by_seq (trajectory_seq, position, description_id, tool, calls)
    SELECT t.seq, tt.position, tt.description_id, tt.tool, tt.calls
    FROM trajectory_tools tt JOIN trajectories t ON t.id = tt.trajectory_id;
DROP TABLE trajectory_tools;
ALTER TABLE trajectory_tools_by_seq RENAME TO trajectory_tools;
ALTER INDEX trajectory_tools_by_seq_pkey RENAME TO trajectory_tools_pkey;
CREATE INDEX trajectory_tools_by_description ON trajectory_tools (description_id);
