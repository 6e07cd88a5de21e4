-- When the lease sweeper last ran, fleet-wide (worker run's sweeper).
--
-- Every worker process runs a sweeper every --sweep-interval, and one sweeps
-- at a time under a transaction-scoped advisory lock; without a record of
-- the last sweep, 200 pods would sweep 40 times a second, each sweep reading
-- every Running batch and every running River job. A periodic sweep claims
-- its period by moving swept_at forward in its own transaction, and does
-- nothing when another process swept less than half an interval ago. This
-- is scheduling state, not batch state: losing the row only means the next
-- tick sweeps.

-- +goose Up
CREATE TABLE ingest_sweeps (
    name     text        PRIMARY KEY,
    swept_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE ingest_sweeps;
