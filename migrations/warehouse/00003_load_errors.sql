-- The load's errors: one row per bad record a load skipped within its
-- import's tolerance (max_bad_records, COPY's MAXERROR), written by the
-- load in the same transaction as the slice's records, stamp and ledger,
-- and replaced with them, as Redshift's STL_LOAD_ERRORS reports a COPY's
-- rejected lines. ordinal numbers the slice's bad records from 1 in the
-- order the load read them; line_number is the line where the record
-- starts in object_key (as fleet_records names objects); column_number is
-- 1-based, 0 when the record as a whole was refused (an NDJSON line that
-- is not a JSON object); raw_excerpt is the raw value escaped as a Go
-- string literal, at most 1 KiB (folder.Excerpt). A load that skipped
-- none leaves the slice without rows here.

-- +goose Up
CREATE TABLE curated.fleet_load_errors (
    tenant_id     varchar(100)  NOT NULL,
    source_scope  varchar(200)  NOT NULL,
    batch_id      bigint        NOT NULL,
    ordinal       integer       NOT NULL,
    object_key    varchar(1024) NOT NULL,
    line_number   bigint        NOT NULL,
    column_number integer       NOT NULL,
    reason        varchar(1024) NOT NULL,
    raw_excerpt   varchar(1024) NOT NULL
);
CREATE INDEX ix_fleet_load_errors_slice ON curated.fleet_load_errors (tenant_id, source_scope, batch_id);

-- +goose Down
DROP TABLE curated.fleet_load_errors;
