-- Who is driving a run, and until when. A driver (`tooltune optimize`, `tooltune optimize --resume`, a job of
-- `tooltune serve`) takes the lease before it runs a step and renews it while it works; another process that finds
-- an unexpired lease held by someone else does not drive the run too. A crashed driver's lease simply expires.
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_until TEXT;
