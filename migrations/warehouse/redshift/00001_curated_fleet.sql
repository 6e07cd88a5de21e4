-- The production warehouse on Amazon Redshift: schema curated.
--
-- Applied by "worker migrate --warehouse redshift" through the Redshift Data
-- API, each file in one transaction (BatchExecuteStatement) together with its
-- row in curated.fleet_warehouse_migrations. Statements end with ";" at the
-- end of a line; no procedural bodies.
--
-- fleet_records holds every loaded record, stamped with its batch and the
-- lease generation that loaded it. A slice is all records of one
-- (tenant_id, source_scope); fleet_slices says which batch (and generation)
-- the slice is stamped with, how many records it holds, when it was
-- committed and when published (UTC, from SYSDATE: the warehouse clock).
-- fleet_publications is the outbox downstream consumers read, one row per
-- published batch.
--
-- Redshift keeps primary and unique keys informational only: nothing relies
-- on them. Slice replacement and publication are guarded by explicit checks
-- inside one transaction (see internal/warehouse/redshift).

CREATE SCHEMA IF NOT EXISTS curated;

-- Records are distributed by tenant, so one tenant's slices sit together,
-- and sorted by slice, so deleting or reading a slice touches few blocks.
CREATE TABLE IF NOT EXISTS curated.fleet_records (
    tenant_id        VARCHAR(100)  NOT NULL,
    source_scope     VARCHAR(200)  NOT NULL,
    batch_id         BIGINT        NOT NULL,
    lease_generation BIGINT        NOT NULL,
    object_key       VARCHAR(1024) NOT NULL,
    line_number      BIGINT        NOT NULL,
    record           SUPER         NOT NULL,
    loaded_at        TIMESTAMP     NOT NULL DEFAULT SYSDATE
)
DISTSTYLE KEY
DISTKEY (tenant_id)
COMPOUND SORTKEY (tenant_id, source_scope, batch_id);

CREATE TABLE IF NOT EXISTS curated.fleet_slices (
    tenant_id        VARCHAR(100) NOT NULL,
    source_scope     VARCHAR(200) NOT NULL,
    batch_id         BIGINT       NOT NULL,
    lease_generation BIGINT       NOT NULL,
    record_count     BIGINT       NOT NULL,
    committed_at     TIMESTAMP    NOT NULL,
    published_at     TIMESTAMP    NULL,
    PRIMARY KEY (tenant_id, source_scope)
)
DISTSTYLE ALL;

CREATE TABLE IF NOT EXISTS curated.fleet_publications (
    id           BIGINT IDENTITY(1, 1),
    tenant_id    VARCHAR(100) NOT NULL,
    source_scope VARCHAR(200) NOT NULL,
    batch_id     BIGINT       NOT NULL,
    record_count BIGINT       NOT NULL,
    published_at TIMESTAMP    NOT NULL,
    PRIMARY KEY (id),
    UNIQUE (tenant_id, source_scope, batch_id)
)
DISTSTYLE ALL;

-- Writers (loads and publications) take LOCK on this empty table first, so
-- they run one at a time and never fail Redshift's serializable isolation
-- check against each other, while readers of the stamps never wait for a
-- running COPY (a LOCK on fleet_slices itself would block them).
CREATE TABLE IF NOT EXISTS curated.fleet_writer_lock (
    unused BOOLEAN
)
DISTSTYLE ALL;
