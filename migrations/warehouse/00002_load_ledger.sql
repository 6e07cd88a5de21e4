-- The load ledger: one row per data object of each slice, written by the
-- load in the same transaction as the slice's records and stamp, and
-- replaced with them. It says which files the slice stamped with batch_id
-- came from (object_key as fleet_records names it), their ETags, sizes and
-- last-modified times as the load listed them, how many records each gave,
-- and the completion marker's last-modified time (NULL without a marker).
-- It is warehouse data, like Redshift's SYS_LOAD_HISTORY: the operational
-- database keeps only a summary in the batch details.

-- +goose Up
CREATE TABLE curated.fleet_load_objects (
    tenant_id       varchar(100)  NOT NULL,
    source_scope    varchar(200)  NOT NULL,
    batch_id        bigint        NOT NULL,
    object_key      varchar(1024) NOT NULL,
    etag            varchar(256)  NOT NULL,
    size_bytes      bigint        NOT NULL,
    record_count    bigint        NOT NULL,
    last_modified   timestamptz   NOT NULL,
    marker_modified timestamptz   NULL
);
CREATE INDEX ix_fleet_load_objects_slice ON curated.fleet_load_objects (tenant_id, source_scope, batch_id);

-- +goose Down
DROP TABLE curated.fleet_load_objects;
