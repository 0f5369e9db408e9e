-- The task, the final answer and the outcome's feedback were stored twice: as columns and inside the body (see the
-- SQLite migration of the same number). No query reads them; a trajectory is read whole, from its body.
ALTER TABLE trajectories DROP COLUMN task;
ALTER TABLE trajectories DROP COLUMN final_answer;
ALTER TABLE trajectories DROP COLUMN feedback;
