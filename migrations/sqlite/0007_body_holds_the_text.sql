-- The task, the final answer and the outcome's feedback were stored twice: as columns and inside the body. No query
-- reads or filters on them (a trajectory is read whole, from its body), and on a bulk ingest of 200,000
-- trajectories they were 420 of the 2,960 bytes each one took, all of it written twice (WAL, then checkpoint).
-- The columns that stay are the ones queries filter or group on (source, score, success, run links) and the
-- short metadata a listing may want without decoding a body.
ALTER TABLE trajectories DROP COLUMN task;
ALTER TABLE trajectories DROP COLUMN final_answer;
ALTER TABLE trajectories DROP COLUMN feedback;
