-- Operator control: parked batches, cancellations and the last lease renewal.
--
-- parked_at/parked_reason mark a Running batch that this build cannot work on
-- (details of an unknown version, unparsable details, a no-work phase while
-- Running, no pipeline for its source type). The sweeper never re-delivers a
-- parked batch; an operator cancels it (or a build that understands it is
-- deployed and the batch is delivered again). They are columns, not details,
-- because the details document of such a batch must never be rewritten.
--
-- cancelled_at/cancelled_by/cancel_reason record an operator's cancel, also
-- for batches whose details document this build cannot rewrite.
--
-- execution_lease_renewed_at is the database time of the lease's last
-- acquisition or renewal: operators see how long ago a holder last showed a
-- heartbeat. All nullable without defaults: catalog-only changes.

-- +goose Up
ALTER TABLE ingestion_batches
    ADD COLUMN parked_at                  timestamptz  NULL,
    ADD COLUMN parked_reason              varchar(500) NULL,
    ADD COLUMN cancelled_at               timestamptz  NULL,
    ADD COLUMN cancelled_by               varchar(200) NULL,
    ADD COLUMN cancel_reason              varchar(500) NULL,
    ADD COLUMN execution_lease_renewed_at timestamptz  NULL;

ALTER TABLE ingestion_batches
    ADD CONSTRAINT ck_ingestion_batches_parked_pair
    CHECK ((parked_at IS NULL) = (parked_reason IS NULL));

-- +goose Down
ALTER TABLE ingestion_batches
    DROP CONSTRAINT ck_ingestion_batches_parked_pair,
    DROP COLUMN execution_lease_renewed_at,
    DROP COLUMN cancel_reason,
    DROP COLUMN cancelled_by,
    DROP COLUMN cancelled_at,
    DROP COLUMN parked_reason,
    DROP COLUMN parked_at;
