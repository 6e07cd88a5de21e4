-- Baseline: ingestion_batches as it stood before Fleet imports.
--
-- Batches were date-scoped (Brink POS, KDS CDC): one batch per tenant,
-- business date and pipeline stage could be marked current. Enums are stored
-- as their string names.

-- +goose Up
CREATE TABLE ingestion_batches (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    company_id      varchar(100) NOT NULL,
    tenant_id       varchar(100) NOT NULL,
    tenant_database varchar(128) NOT NULL,
    ingestion_mode  varchar(50)  NOT NULL,
    source_type     varchar(50)  NOT NULL,
    business_date   date         NULL,
    pipeline_stage  varchar(100) NOT NULL,
    status          varchar(20)  NOT NULL
        CONSTRAINT ck_ingestion_batches_status CHECK (status IN ('Running', 'Succeeded', 'Failed')),
    is_current      boolean      NOT NULL DEFAULT false,
    details         jsonb        NOT NULL DEFAULT '{}'::jsonb,
    started_at      timestamptz  NOT NULL DEFAULT now(),
    completed_at    timestamptz  NULL,
    created_at      timestamptz  NOT NULL DEFAULT now(),
    updated_at      timestamptz  NOT NULL DEFAULT now()
);

-- At most one current batch per tenant, business date and stage. Rows with a
-- NULL business date never take part.
CREATE UNIQUE INDEX ux_ingestion_batches_current
    ON ingestion_batches (tenant_id, business_date, pipeline_stage)
    WHERE is_current AND business_date IS NOT NULL;

CREATE INDEX ix_ingestion_batches_tenant_date
    ON ingestion_batches (tenant_id, business_date, pipeline_stage);

-- +goose Down
DROP TABLE ingestion_batches;
