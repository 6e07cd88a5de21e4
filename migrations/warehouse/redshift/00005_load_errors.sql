-- The load errors: one row per bad record a load skipped within its
-- import's tolerance (max_bad_records, COPY's MAXERROR), replaced with the
-- slice by the load's swap (the same transaction that replaces the slice's
-- records, its stamp and its ledger), as STL_LOAD_ERRORS reports a COPY's
-- rejected lines. The worker finds bad records while it reads and stages
-- the folder: the load stages them in S3 beside its records and ledger and
-- COPYs them into curated_staging.fleet_load_{batch}_{generation}_errors;
-- the swap moves them here. ordinal numbers the slice's bad records from 1
-- in the order the load read them; line_number is where the record starts
-- in object_key; column_number is 1-based, 0 for a record refused as a
-- whole; raw_excerpt is the raw value escaped as a Go string literal, at
-- most 1 KiB (VARCHAR lengths are bytes in Redshift: 1024 holds it).

CREATE TABLE IF NOT EXISTS curated.fleet_load_errors (
    tenant_id     VARCHAR(100)  NOT NULL,
    source_scope  VARCHAR(200)  NOT NULL,
    batch_id      BIGINT        NOT NULL,
    ordinal       INTEGER       NOT NULL,
    object_key    VARCHAR(1024) NOT NULL,
    line_number   BIGINT        NOT NULL,
    column_number INTEGER       NOT NULL,
    reason        VARCHAR(1024) NOT NULL,
    raw_excerpt   VARCHAR(1024) NOT NULL
)
DISTSTYLE KEY
DISTKEY (tenant_id)
COMPOUND SORTKEY (tenant_id, source_scope, batch_id);

-- fleet_loader replaces the errors in its swap (and creates its staging
-- table LIKE this one); fleet_reader (enqueue status --errors) reads them.
GRANT SELECT, INSERT, DELETE ON curated.fleet_load_errors TO ROLE fleet_loader;
GRANT SELECT ON curated.fleet_load_errors TO ROLE fleet_reader;
