-- Staging tables: a load COPYs into a table of its own,
-- curated_staging.fleet_load_{batch}_{lease generation}, created by the
-- load (CREATE TABLE … (LIKE curated.fleet_records INCLUDING DEFAULTS)),
-- in a transaction that takes no shared lock. Only the short swap that
-- moves the staged rows into curated.fleet_records and stamps the slice
-- runs under curated.fleet_writer_lock, and it drops the staging table. So
-- a long COPY of one tenant never holds up another tenant's load or any
-- publication.
--
-- A staging table left by a delivery that died is dropped by the next
-- load of the batch that fails, or stays until an operator drops it
-- (DROP TABLE curated_staging.fleet_load_…); it holds nothing readers see.

CREATE SCHEMA IF NOT EXISTS curated_staging;
