-- Database roles of the components, each with only what it needs.
--
-- fleet_loader (the worker): loads and publishes. It writes the records,
-- the stamps and the outbox, takes the writer lock (LOCK needs a write
-- privilege on the lock table), and creates, fills and drops its loads'
-- staging tables in curated_staging (their owner, so it may drop them).
-- It reads nothing else and cannot change the schema.
--
-- fleet_reader (enqueue resume): reads the slice stamps, to prove a failed
-- publication's slice is still its batch's. Nothing else.
--
-- The identity that applies these migrations ("worker migrate --warehouse
-- redshift") owns the schema; the components never run as it.
--
-- How a component's database user receives its role (see the README,
-- "Running against Redshift"): on Redshift Serverless, a user derived from
-- the caller's IAM role gets the database roles named by that IAM role's
-- RedshiftDbRoles principal tag (fleet_loader for the worker's role,
-- fleet_reader for enqueue's); with one database user per component (a
-- Secrets Manager secret, or DbUser on a provisioned cluster), an
-- administrator runs GRANT ROLE fleet_loader TO <user> once.

CREATE ROLE fleet_loader;
CREATE ROLE fleet_reader;

GRANT USAGE ON SCHEMA curated TO ROLE fleet_loader;
GRANT SELECT, INSERT, DELETE ON curated.fleet_records TO ROLE fleet_loader;
GRANT SELECT, INSERT, UPDATE, DELETE ON curated.fleet_slices TO ROLE fleet_loader;
GRANT SELECT, INSERT ON curated.fleet_publications TO ROLE fleet_loader;
GRANT SELECT, UPDATE, DELETE ON curated.fleet_writer_lock TO ROLE fleet_loader;
GRANT USAGE, CREATE ON SCHEMA curated_staging TO ROLE fleet_loader;

GRANT USAGE ON SCHEMA curated TO ROLE fleet_reader;
GRANT SELECT ON curated.fleet_slices TO ROLE fleet_reader;
