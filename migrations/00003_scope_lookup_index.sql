-- Look-ups of a tenant's batches for one source scope (the newest batch of a
-- folder, the running batch holding it) use this index instead of scanning
-- every batch of the tenant.

-- +goose Up
CREATE INDEX ix_ingestion_batches_scope
    ON ingestion_batches (tenant_id, source_scope, id DESC)
    WHERE source_scope IS NOT NULL;

-- +goose Down
DROP INDEX ix_ingestion_batches_scope;
