-- Least-privilege roles for the Fleet ingestion coordinator.
--
-- Run as a superuser (or a role with CREATEROLE) in the operational
-- database, after "worker migrate" has created the tables (the migrating
-- role owns them and is the only one with DDL rights):
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
--   CREATE ROLE fleet_worker_login LOGIN PASSWORD '…' IN ROLE fleet_worker;
--   CREATE ROLE fleet_enqueue_login LOGIN PASSWORD '…' IN ROLE fleet_enqueue;
--
-- fleet_worker   runs jobs: reads and updates batches (never inserts or
--                deletes them), works River's tables, loads and publishes
--                the local warehouse schema. No DDL.
-- fleet_enqueue  reserves and resumes batches and inserts River jobs; reads
--                the warehouse stamp to prove resumes. No DDL, no deletes,
--                no warehouse writes.
--
-- Worker pods should share one login role: a load terminates stale loads of
-- the same slice with pg_terminate_backend, which PostgreSQL allows between
-- sessions of the same role.
--
-- Idempotent; re-run after migrations that add tables.

BEGIN;
SELECT pg_advisory_xact_lock(7061101);

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fleet_worker') THEN
        CREATE ROLE fleet_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fleet_enqueue') THEN
        CREATE ROLE fleet_enqueue NOLOGIN;
    END IF;
END
$$;

-- Only the owner creates objects.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO fleet_worker, fleet_enqueue;

-- Operational table.
GRANT SELECT, UPDATE ON ingestion_batches TO fleet_worker;
GRANT SELECT, INSERT, UPDATE ON ingestion_batches TO fleet_enqueue;
GRANT USAGE, SELECT ON SEQUENCE ingestion_batches_id_seq TO fleet_enqueue;
-- Workers check at start that the schema is current for their build.
GRANT SELECT ON ingest_schema_migrations TO fleet_worker;

-- River: workers fetch, complete, snooze, rescue, clean and elect a leader;
-- enqueue only inserts (and reads for unique inserts).
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'river%' LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO fleet_worker', t);
        -- enqueue serve shows River's tables in the River UI (read-only
        -- besides the job updates granted below).
        EXECUTE format('GRANT SELECT ON public.%I TO fleet_enqueue', t);
    END LOOP;
    FOR t IN SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' AND sequencename LIKE 'river%' LOOP
        EXECUTE format('GRANT USAGE, SELECT, UPDATE ON SEQUENCE public.%I TO fleet_worker, fleet_enqueue', t);
    END LOOP;
END
$$;
-- River inserts with INSERT … ON CONFLICT DO UPDATE, which needs UPDATE;
-- enqueue cancel marks a batch's jobs cancelled (UPDATE too).
GRANT SELECT, INSERT, UPDATE ON river_job TO fleet_enqueue;
GRANT SELECT ON river_migration TO fleet_enqueue;

-- Local warehouse (schema curated).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_namespace WHERE nspname = 'curated') THEN
        REVOKE CREATE ON SCHEMA curated FROM PUBLIC;
        GRANT USAGE ON SCHEMA curated TO fleet_worker, fleet_enqueue;
        GRANT SELECT, INSERT, DELETE ON curated.fleet_records TO fleet_worker;
        GRANT SELECT, INSERT, UPDATE ON curated.fleet_slices TO fleet_worker;
        GRANT SELECT, INSERT ON curated.fleet_publications TO fleet_worker;
        GRANT USAGE, SELECT ON SEQUENCE curated.fleet_publications_id_seq TO fleet_worker;
        GRANT SELECT ON curated.fleet_slices TO fleet_enqueue;
    END IF;
END
$$;

COMMIT;
