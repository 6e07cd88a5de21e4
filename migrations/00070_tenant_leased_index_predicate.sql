-- The fairness index of 00050 out of reach of the lease statements.
--
-- Every lease statement addresses one batch by its primary key and says
-- status = 'Running' AND execution_lease_id = $n, which implies the
-- predicate of 00050's partial index (status = 'Running' AND
-- execution_lease_id IS NOT NULL). So the planner could take that index for
-- them: a scan of every leased batch, filtered by id. It did whenever the
-- index's statistics were older than its contents (an ANALYZE while few
-- batches were leased, then many acquisitions): a renewal read all 9,500
-- leased batches of the benchmark (4.6 ms, 700 buffers, where the primary
-- key reads 3), and renewals ran at a fifth of a raw UPDATE.
--
-- The predicate now also requires source_scope IS NOT NULL, which holds for
-- every leased batch (only scoped batches take leases) and which only the
-- fairness counts state: no lease statement mentions source_scope, so the
-- index is no candidate for them whatever the statistics say.
--
-- The index is rebuilt in this migration's transaction: the build reads
-- the table while writes to it wait (on a large table, seconds; workers
-- retry what lock_timeout refuses meanwhile).

-- +goose Up
DROP INDEX ix_ingestion_batches_tenant_leased;
CREATE INDEX ix_ingestion_batches_tenant_leased
    ON ingestion_batches (tenant_id)
    WHERE status = 'Running' AND execution_lease_id IS NOT NULL AND source_scope IS NOT NULL;

-- +goose Down
DROP INDEX ix_ingestion_batches_tenant_leased;
CREATE INDEX ix_ingestion_batches_tenant_leased
    ON ingestion_batches (tenant_id)
    WHERE status = 'Running' AND execution_lease_id IS NOT NULL;
