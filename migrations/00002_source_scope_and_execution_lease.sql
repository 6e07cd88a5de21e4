-- Generic source scope and execution lease (Fleet imports).
--
-- source_scope identifies what a batch reserves (Fleet: fleet_s3:{folder});
-- the unique partial index lets PostgreSQL, not process memory, guarantee at
-- most one Running batch per tenant and scope. The execution lease columns let
-- exactly one delivery work on a Running batch at a time; the generation is a
-- fencing token that increases on every acquisition. Existing rows keep NULL
-- scope and lease, generation 0. Adding columns with constant defaults is a
-- catalog-only change in PostgreSQL 11+.

-- +goose Up
ALTER TABLE ingestion_batches
    ADD COLUMN source_scope               varchar(200) NULL,
    ADD COLUMN execution_lease_id         varchar(100) NULL,
    ADD COLUMN execution_lease_expires_at timestamptz  NULL,
    ADD COLUMN execution_lease_generation bigint       NOT NULL DEFAULT 0;

ALTER TABLE ingestion_batches
    ADD CONSTRAINT ck_ingestion_batches_lease_pair
    CHECK ((execution_lease_id IS NULL) = (execution_lease_expires_at IS NULL));

CREATE UNIQUE INDEX ux_ingestion_batches_running_scope
    ON ingestion_batches (tenant_id, source_scope)
    WHERE status = 'Running' AND source_scope IS NOT NULL;

-- +goose Down
DROP INDEX ux_ingestion_batches_running_scope;
ALTER TABLE ingestion_batches
    DROP CONSTRAINT ck_ingestion_batches_lease_pair,
    DROP COLUMN execution_lease_generation,
    DROP COLUMN execution_lease_expires_at,
    DROP COLUMN execution_lease_id,
    DROP COLUMN source_scope;
