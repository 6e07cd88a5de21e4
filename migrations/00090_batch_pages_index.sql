-- Pages of a tenant's batches by time, newest first (the door's GET
-- /v1/batches and enqueue list --since/--until): the keyset (started_at,
-- id) of a tenant's scoped batches, so a page reads its rows from the index
-- instead of sorting every batch of the tenant. A folder's pages use
-- ix_ingestion_batches_scope (00003), whose rows for one folder are few.
--
-- The index is built in this migration's transaction: writes to the table
-- wait while it reads it (on a large table, seconds; workers retry what
-- lock_timeout refuses meanwhile), as 00070's did.

-- +goose Up
CREATE INDEX ix_ingestion_batches_tenant_started
    ON ingestion_batches (tenant_id, started_at DESC, id DESC)
    WHERE source_scope IS NOT NULL;

-- +goose Down
DROP INDEX ix_ingestion_batches_tenant_started;
