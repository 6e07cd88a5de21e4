-- The load ledger: one row per data object of each slice, replaced with
-- the slice by the load's swap (the same transaction that replaces the
-- slice's records and its stamp in curated.fleet_slices). It says which
-- files the slice stamped with batch_id came from (object_key as
-- fleet_records names it), their ETags, sizes and last-modified times as
-- the load listed them, how many records each gave, and the completion
-- marker's last-modified time (NULL without a marker); times are UTC. The
-- load stages the rows in S3 beside its records and COPYs them into
-- curated_staging.fleet_load_{batch}_{generation}_objects; the swap moves
-- them here. It is warehouse data, like SYS_LOAD_HISTORY: the operational
-- database keeps only a summary in the batch details.

CREATE TABLE IF NOT EXISTS curated.fleet_load_objects (
    tenant_id       VARCHAR(100)  NOT NULL,
    source_scope    VARCHAR(200)  NOT NULL,
    batch_id        BIGINT        NOT NULL,
    object_key      VARCHAR(1024) NOT NULL,
    etag            VARCHAR(256)  NOT NULL,
    size_bytes      BIGINT        NOT NULL,
    record_count    BIGINT        NOT NULL,
    last_modified   TIMESTAMP     NOT NULL,
    marker_modified TIMESTAMP     NULL
)
DISTSTYLE KEY
DISTKEY (tenant_id)
COMPOUND SORTKEY (tenant_id, source_scope, batch_id);

-- fleet_loader replaces the ledger rows in its swap (and creates its
-- staging table LIKE this one); fleet_reader (enqueue status --objects)
-- reads them.
GRANT SELECT, INSERT, DELETE ON curated.fleet_load_objects TO ROLE fleet_loader;
GRANT SELECT ON curated.fleet_load_objects TO ROLE fleet_reader;
