-- The local warehouse: schema curated, standing in for Redshift.
--
-- fleet_records holds every loaded record, stamped with its batch. A slice
-- is all records of one (tenant_id, source_scope); fleet_slices says which
-- batch (and which lease generation of it) the slice is stamped with, when it
-- was committed and when published. fleet_publications is the outbox that
-- downstream consumers read, one row per published batch.
--
-- Redshift keeps primary and unique keys informational only, so the code
-- never relies on them for correctness: slice replacement and publication are
-- guarded by explicit checks inside one transaction.

-- +goose Up
CREATE SCHEMA IF NOT EXISTS curated;

CREATE TABLE curated.fleet_records (
    tenant_id    varchar(100)  NOT NULL,
    source_scope varchar(200)  NOT NULL,
    batch_id     bigint        NOT NULL,
    object_key   varchar(1024) NOT NULL,
    line_number  bigint        NOT NULL,
    record       jsonb         NOT NULL,
    loaded_at    timestamptz   NOT NULL DEFAULT now()
);
CREATE INDEX ix_fleet_records_slice ON curated.fleet_records (tenant_id, source_scope);

CREATE TABLE curated.fleet_slices (
    tenant_id        varchar(100) NOT NULL,
    source_scope     varchar(200) NOT NULL,
    batch_id         bigint       NOT NULL,
    lease_generation bigint       NOT NULL,
    record_count     bigint       NOT NULL,
    committed_at     timestamptz  NOT NULL,
    published_at     timestamptz  NULL,
    PRIMARY KEY (tenant_id, source_scope)
);

CREATE TABLE curated.fleet_publications (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    varchar(100) NOT NULL,
    source_scope varchar(200) NOT NULL,
    batch_id     bigint       NOT NULL,
    record_count bigint       NOT NULL,
    published_at timestamptz  NOT NULL
);
CREATE UNIQUE INDEX ux_fleet_publications_batch
    ON curated.fleet_publications (tenant_id, source_scope, batch_id);

-- +goose Down
DROP SCHEMA curated CASCADE;
