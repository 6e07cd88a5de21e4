-- Batch identity in the warehouse: every row that names a batch names it
-- by its id and its uid (the operational database's
-- ingestion_batches.batch_uid, a UUID written as 36 characters), so a
-- batch the operational database forgot (a restore, a failover to a
-- standby that was behind) is never confused with a new batch handed the
-- same id. Rows written before this migration, or by a release that does
-- not know the column, hold NULL: named by id alone. Redshift adds one
-- column per ALTER TABLE, inside the migration's transaction (only
-- external tables refuse ALTER TABLE in a transaction block). The
-- staging tables of loads are created LIKE these tables, so they gain
-- the column too.

ALTER TABLE curated.fleet_slices ADD COLUMN batch_uid VARCHAR(36) NULL;
ALTER TABLE curated.fleet_publications ADD COLUMN batch_uid VARCHAR(36) NULL;
ALTER TABLE curated.fleet_load_objects ADD COLUMN batch_uid VARCHAR(36) NULL;
ALTER TABLE curated.fleet_load_errors ADD COLUMN batch_uid VARCHAR(36) NULL;
