-- Two indexes that every ingested trajectory paid for and no query used (measured on a bulk ingest of 50,000
-- trajectories: the SQLite thread's time went from about 3.5 s to 2.6 s).
-- * Tool rows by description version: every query that reads tool rows scans them by tool name or whole (the
--   statistics), and joins `descriptions` through its primary key; five entries per trajectory went to an index
--   nothing read. Description versions are never deleted, so no foreign-key check needs it either.
-- * Trajectories by run: only tooltune's own rollouts have a run, but every logged trajectory added a (NULL, NULL)
--   entry. The index now holds only rows with a run, which is what looking up a run's rollouts needs: a lookup
--   by `run_id = ?` implies `run_id IS NOT NULL`, so it can still use the index.
DROP INDEX trajectory_tools_by_description;
DROP INDEX trajectories_by_run;
CREATE INDEX trajectories_by_run ON trajectories (run_id, candidate_id) WHERE run_id IS NOT NULL;
