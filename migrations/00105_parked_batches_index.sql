-- Parked batches by id (the worker's sweep takes back the parked batches
-- its build can work on, reading them in id order from where its last
-- sweep stopped; see jobs.Sweeper).
--
-- Parked batches are few, and rare: a build that cannot work on a Running
-- batch parks it (an older release during a rollout, say, or a batch no
-- build can work on, which waits for an operator). The sweep reads them
-- once per sweep interval, fleet-wide. Without this index it could only
-- read them from the index of Running batches, sorted, or walk the
-- primary key through the batches' whole history in id order, filtering
-- for the few parked ones; statistics taken while many batches were
-- parked made the planner choose the walk (or a sequential scan).
-- With it, the read is the few parked entries in id order, whatever the
-- statistics say. Only the sweep's read states source_scope IS NOT NULL
-- with parked_at IS NOT NULL, so no other statement is planned on it.
--
-- The index is built in this migration's transaction: writes to the
-- table wait while it reads it (on a large table, seconds; workers retry
-- what lock_timeout refuses meanwhile), as 00070's and 00090's did.

-- +goose Up
CREATE INDEX ix_ingestion_batches_parked
    ON ingestion_batches (id)
    WHERE status = 'Running' AND parked_at IS NOT NULL AND source_scope IS NOT NULL;

-- +goose Down
DROP INDEX ix_ingestion_batches_parked;
