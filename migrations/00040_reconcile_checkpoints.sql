-- Checkpoints of enqueue reconcile --every, one row per (bucket, prefix).
--
-- Reconcile lists a bucket for completed folders without a batch. S3 cannot
-- list by time, so a complete pass lists every key; the checkpoint lets a
-- pass span periods (start_after: the last key of the previous period, the
-- ListObjectsV2 StartAfter of the next) and lets later passes skip markers
-- that a finished pass already checked (covered_since: when that pass
-- began). Replicas take the row with an advisory lock in the transaction
-- that reads and writes it, so one of them works per period. This is
-- scheduling state of the reconciler, not batch state: it holds no tenant
-- data, and losing it only makes the next pass check everything again.

-- +goose Up
CREATE TABLE ingest_reconcile_checkpoints (
    bucket          varchar(63)   NOT NULL,
    prefix          varchar(1024) NOT NULL,
    start_after     varchar(1024) NOT NULL DEFAULT '',
    pass_started_at timestamptz   NULL,
    covered_since   timestamptz   NULL,
    last_run_at     timestamptz   NULL,
    PRIMARY KEY (bucket, prefix)
);

-- +goose Down
DROP TABLE ingest_reconcile_checkpoints;
