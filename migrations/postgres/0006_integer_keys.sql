-- Integer keys where a bulk ingest writes one row per shown tool (see the SQLite migration of the same number).
-- * A description version gets an integer key; tool rows reference it and no longer repeat the tool name, which
--   the description version holds.
-- * Sequence numbers are given in insertion order, so "newest ingest first" is `ORDER BY seq DESC` on the unique
--   index the sequence number already has, and the index on the ingest time is gone.
ALTER TABLE descriptions ADD COLUMN key BIGSERIAL;
ALTER TABLE descriptions ADD CONSTRAINT descriptions_key UNIQUE (key);

ALTER TABLE trajectory_tools ADD COLUMN description_key BIGINT;
UPDATE trajectory_tools tt SET description_key = d.key FROM descriptions d WHERE d.id = tt.description_id;
ALTER TABLE trajectory_tools ALTER COLUMN description_key SET NOT NULL;
ALTER TABLE trajectory_tools
    ADD CONSTRAINT trajectory_tools_description_key FOREIGN KEY (description_key) REFERENCES descriptions (key);
ALTER TABLE trajectory_tools DROP COLUMN description_id, DROP COLUMN tool;

DROP INDEX trajectories_by_ingested;
