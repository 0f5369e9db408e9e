-- SQLite's 0004 stores `trajectory_tools` WITHOUT ROWID. PostgreSQL has no rowid table to drop: its table is a
-- heap and its key an index either way, so there is nothing to change here. The file keeps the two dialects'
-- migration numbers in step.
SELECT 1;
