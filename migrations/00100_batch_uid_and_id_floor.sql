-- Batch identity that survives the coordinator's memory.
--
-- The operational database can go back in time while the warehouse does
-- not (a restore from a backup, a point-in-time recovery, a failover to an
-- asynchronous standby): the warehouse keeps slices, publications, ledger
-- and error rows stamped with batches the restored database has forgotten,
-- and the id sequence, restored too, would hand those ids out again.
--
-- batch_uid is a random per-batch identity (a version-4 UUID, 122 random
-- bits) that the warehouse stores beside the batch id and that tenants
-- receive (notification keys, receipts): it cannot repeat after a rewind.
-- Every new row gets one from the column's default, whoever inserts it (an
-- older release's door included); no runtime role may write the column
-- (deploy/postgres/roles.sql grants INSERT and UPDATE column by column), so
-- no login can give a batch another's identity. Rows written before this
-- migration keep NULL: a legacy batch, named by its id alone. The column is
-- added without a default and the default set afterwards, so the ALTER
-- rewrites nothing (a volatile default on ADD COLUMN would rewrite the
-- table).
--
-- ingest_advance_batch_ids(past) moves the batches' id sequence past every
-- id the warehouse still names (worker migrate, and worker run at start,
-- pass the largest one): after a rewind, no id is handed out twice. It
-- draws the missing values with nextval rather than setval, so a
-- reservation that draws an id concurrently can never be handed the same
-- id again (setval could move the sequence back below it). It owns the
-- write (SECURITY DEFINER): the runtime roles hold only USAGE on the
-- sequence, which cannot setval. It refuses a gap of more than 50 million
-- ids (a warehouse naming such an id is not one this sequence stamped:
-- see docs/runbook.md, Restore from a backup).

-- +goose Up
ALTER TABLE ingestion_batches ADD COLUMN batch_uid uuid NULL;
ALTER TABLE ingestion_batches ALTER COLUMN batch_uid SET DEFAULT gen_random_uuid();

-- +goose StatementBegin
CREATE FUNCTION ingest_advance_batch_ids(past bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    seq  regclass := pg_get_serial_sequence('public.ingestion_batches', 'id')::regclass;
    last bigint;
BEGIN
    IF past IS NULL OR past < 0 THEN
        RAISE EXCEPTION 'the batch id to advance past must be a non-negative number, not %', past
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    last := COALESCE(pg_sequence_last_value(seq), 0);
    IF last >= past THEN
        RETURN last;
    END IF;
    IF past - last > 50000000 THEN
        RAISE EXCEPTION 'batch id % is % ids past the sequence (%): refusing to draw them', past, past - last, last
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT max(nextval(seq)) INTO last FROM generate_series(1, past - last);
    RETURN last;
END
$$;
-- +goose StatementEnd

-- Functions are executable by PUBLIC by default: only the owner and the
-- roles deploy/postgres/roles.sql grants it to may call this one.
REVOKE ALL ON FUNCTION ingest_advance_batch_ids(bigint) FROM PUBLIC;

-- +goose Down
DROP FUNCTION ingest_advance_batch_ids(bigint);
ALTER TABLE ingestion_batches DROP COLUMN batch_uid;
