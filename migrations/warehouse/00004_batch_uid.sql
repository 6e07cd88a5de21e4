-- Batch identity in the warehouse: every row that names a batch names it by
-- its id and its uid (ingestion_batches.batch_uid, operational migration
-- 00100), so a batch the operational database forgot (a restore, a
-- failover to a standby that was behind) is never confused with a new
-- batch that was handed the same id. Rows written before this migration,
-- or by a release that does not know the column, hold NULL: named by id
-- alone.
--
-- A publication is recorded once per batch identity: the unique index
-- takes the uid in (NULL as empty), so a forgotten batch's publication
-- does not stand for a new batch of the same id. The batch_id indexes
-- keep the largest id the warehouse names (worker migrate and worker run
-- advance the batches' id sequence past it) an index read.

-- A release that does not know the column (during a rolling upgrade)
-- re-stamps a slice with ON CONFLICT DO UPDATE SET batch_id = …, which
-- would leave the previous batch's uid beside the new batch's id: a stamp
-- naming a batch that does not exist. The trigger clears the uid of a
-- stamp whose batch changed without one, so such a stamp is a legacy one
-- (named by its id), as that release wrote it.

-- +goose Up
ALTER TABLE curated.fleet_slices ADD COLUMN batch_uid varchar(36) NULL;
ALTER TABLE curated.fleet_publications ADD COLUMN batch_uid varchar(36) NULL;
ALTER TABLE curated.fleet_load_objects ADD COLUMN batch_uid varchar(36) NULL;
ALTER TABLE curated.fleet_load_errors ADD COLUMN batch_uid varchar(36) NULL;
DROP INDEX curated.ux_fleet_publications_batch;
CREATE UNIQUE INDEX ux_fleet_publications_batch
    ON curated.fleet_publications (tenant_id, source_scope, batch_id, (COALESCE(batch_uid, '')));
CREATE INDEX ix_fleet_slices_batch ON curated.fleet_slices (batch_id);
CREATE INDEX ix_fleet_publications_batch_id ON curated.fleet_publications (batch_id);

-- +goose StatementBegin
CREATE FUNCTION curated.fleet_slices_uid_follows_batch() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.batch_id IS DISTINCT FROM OLD.batch_id AND NEW.batch_uid IS NOT DISTINCT FROM OLD.batch_uid THEN
        NEW.batch_uid := NULL;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER fleet_slices_uid_follows_batch BEFORE UPDATE ON curated.fleet_slices
    FOR EACH ROW EXECUTE FUNCTION curated.fleet_slices_uid_follows_batch();

-- +goose Down
DROP TRIGGER fleet_slices_uid_follows_batch ON curated.fleet_slices;
DROP FUNCTION curated.fleet_slices_uid_follows_batch();
DROP INDEX curated.ix_fleet_publications_batch_id;
DROP INDEX curated.ix_fleet_slices_batch;
DROP INDEX curated.ux_fleet_publications_batch;
CREATE UNIQUE INDEX ux_fleet_publications_batch
    ON curated.fleet_publications (tenant_id, source_scope, batch_id);
ALTER TABLE curated.fleet_load_errors DROP COLUMN batch_uid;
ALTER TABLE curated.fleet_load_objects DROP COLUMN batch_uid;
ALTER TABLE curated.fleet_publications DROP COLUMN batch_uid;
ALTER TABLE curated.fleet_slices DROP COLUMN batch_uid;
