-- Least-privilege roles for the Fleet ingestion coordinator.
--
-- Run as a superuser (or a role with CREATEROLE that owns the database) in
-- the operational database, after "worker migrate" has created the tables
-- (the migrating role owns them and is the only one with DDL rights):
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
--   CREATE ROLE fleet_worker_login LOGIN PASSWORD '…' IN ROLE fleet_worker;
--   CREATE ROLE fleet_enqueue_login LOGIN PASSWORD '…' IN ROLE fleet_enqueue;
--
-- fleet_worker   runs jobs: reads batches and moves them through their
--                lifecycle (status, details, lease columns; never who or
--                what a batch is for), works River's tables, loads and
--                publishes the local warehouse schema. No DDL, no inserts
--                or deletes of batches.
-- fleet_enqueue  reserves, resumes (and, for operators, cancels or
--                retries) batches and inserts River jobs; records the
--                signatures enqueue serve accepted; reads the warehouse
--                stamp to prove resumes. It can only ever set a batch
--                Running or Failed: success is the worker's to declare.
--                No DDL, no deletes of batches, no warehouse writes.
--
-- What holds, and how:
--
--   * Nobody but the table owner can change what a batch is for: UPDATE is
--     granted column by column, and tenant_id, tenant_database, company_id,
--     source_scope, source_type (and the other identity columns) are in no
--     runtime role's list. Such an UPDATE fails with SQLSTATE 42501.
--   * Row-level security on ingestion_batches: fleet_enqueue may insert or
--     update a row only into status Running or Failed (a row Succeeded by
--     it violates the policy: 42501), and may insert an s3:// batch only
--     as the tenant, database and company its folder's path names under
--     fleet_path_pattern() (below; keep it equal to --path-pattern).
--   * Sequences: USAGE only (nextval through the inserts); no role can
--     setval() River's or the batches' sequences. RLS is default-deny for every other
--     role but the owner and superusers: a new runtime role needs a policy
--     here.
--   * Only these roles and the owner may connect: CONNECT and TEMPORARY
--     are revoked from PUBLIC on this database (PostgreSQL grants both to
--     every role by default), so another application's login on the same
--     server cannot even open a session here, and no runtime role can
--     create temporary objects.
--
-- Worker pods should share one login role: a load terminates stale loads of
-- the same slice with pg_terminate_backend, which PostgreSQL allows between
-- sessions of the same role.
--
-- Idempotent; re-run after migrations that add tables or columns. To extend
-- it, add grants to the role's section below (a new column a role updates
-- goes into that role's UPDATE list; a new table into its table grants).

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

-- ---------------------------------------------------------------------------
-- Database and schemas: only the owner creates objects; only the runtime
-- roles and the owner of the tables connect.
-- ---------------------------------------------------------------------------
DO $$
DECLARE owner text;
BEGIN
    EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO fleet_worker, fleet_enqueue', current_database());
    -- The migrating role keeps its access even when it does not own the
    -- database itself.
    SELECT tableowner INTO owner FROM pg_tables WHERE schemaname = 'public' AND tablename = 'ingestion_batches';
    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %I', current_database(), owner);
END
$$;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO fleet_worker, fleet_enqueue;

-- Start from nothing on the operational table, so a re-run also removes
-- grants an earlier version of this file made.
REVOKE ALL ON ingestion_batches FROM fleet_worker, fleet_enqueue;
ALTER TABLE ingestion_batches ENABLE ROW LEVEL SECURITY;

-- ---------------------------------------------------------------------------
-- fleet_worker
-- ---------------------------------------------------------------------------
GRANT SELECT ON ingestion_batches TO fleet_worker;
-- Lifecycle columns only: fenced state writes, lease acquire/renew/release,
-- parking a batch this build cannot work on.
GRANT UPDATE (status, details, completed_at, updated_at,
              execution_lease_id, execution_lease_expires_at, execution_lease_generation,
              execution_lease_renewed_at, execution_lease_terms, parked_at, parked_reason)
    ON ingestion_batches TO fleet_worker;
-- Workers check at start that the schema is current for their build.
GRANT SELECT ON ingest_schema_migrations TO fleet_worker;
-- The lease sweeper records when it last ran, so the fleet sweeps once per
-- period rather than once per pod (migration 00060).
GRANT SELECT, INSERT, UPDATE ON ingest_sweeps TO fleet_worker;
DROP POLICY IF EXISTS fleet_worker_batches ON ingestion_batches;
CREATE POLICY fleet_worker_batches ON ingestion_batches TO fleet_worker
    USING (true) WITH CHECK (true);

-- River: workers fetch, complete, snooze, rescue, clean and elect a leader.
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'river%' LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO fleet_worker', t);
        -- enqueue serve shows River's tables in the River UI (read-only
        -- besides the job updates granted below).
        EXECUTE format('GRANT SELECT ON public.%I TO fleet_enqueue', t);
    END LOOP;
    -- USAGE alone: nextval through the inserts' defaults. SELECT (currval)
    -- is not needed and UPDATE would allow setval(), with which either
    -- role could make every later insert collide.
    FOR t IN SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' AND sequencename LIKE 'river%' LOOP
        EXECUTE format('REVOKE ALL ON SEQUENCE public.%I FROM fleet_worker, fleet_enqueue', t);
        EXECUTE format('GRANT USAGE ON SEQUENCE public.%I TO fleet_worker, fleet_enqueue', t);
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------
-- The path pattern: which tenant, database and company an S3 folder belongs
-- to. It must be the --path-pattern of enqueue serve and the worker
-- (default below); edit the literal if yours differs, and re-run.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION public.fleet_path_pattern() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 'tenants/{tenant_id}/{tenant_database}/{company_id}/'::text $$;

-- fleet_scope_names_batch is true when a batch's scope names its own
-- tenant, database and company: an s3:// scope (fleet_s3:s3://bucket/…)
-- whose key prefix matches fleet_path_pattern() segment by segment, the
-- placeholders equal to the row's values. Scopes of other schemes (file://
-- and mem://, which workers read only in development) and rows without a
-- scope (date-scoped sources) are not mapped to tenants and pass; workers
-- re-check every batch against their own --path-pattern anyway.
CREATE OR REPLACE FUNCTION public.fleet_scope_names_batch(scope text, tenant text, db text, company text)
    RETURNS boolean LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog
    AS $$
DECLARE
    want text[] := string_to_array(btrim(public.fleet_path_pattern(), '/'), '/');
    got  text[];
    expected text;
BEGIN
    IF scope IS NULL OR left(scope, 14) <> 'fleet_s3:s3://' THEN
        RETURN true;
    END IF;
    got := string_to_array(substr(scope, 15), '/'); -- bucket, then the key segments
    IF coalesce(array_length(got, 1), 0) - 1 < array_length(want, 1) THEN
        RETURN false;
    END IF;
    FOR i IN 1 .. array_length(want, 1) LOOP
        expected := CASE want[i]
            WHEN '{tenant_id}' THEN tenant
            WHEN '{tenant_database}' THEN db
            WHEN '{company_id}' THEN company
            ELSE want[i] END;
        IF got[i + 1] IS DISTINCT FROM expected THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------
-- fleet_enqueue
-- ---------------------------------------------------------------------------
GRANT SELECT ON ingestion_batches TO fleet_enqueue;
-- Reservations (Running) and recorded enqueue failures (Failed): the
-- identity of a batch is written once, here, and never updated.
GRANT INSERT (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
              business_date, pipeline_stage, status, details, source_scope, completed_at)
    ON ingestion_batches TO fleet_enqueue;
REVOKE ALL ON SEQUENCE ingestion_batches_id_seq FROM fleet_worker, fleet_enqueue;
GRANT USAGE ON SEQUENCE ingestion_batches_id_seq TO fleet_enqueue;
-- Resumes (Failed → Running) and operator transitions (→ Failed): a cancel
-- moves the lease generation on (fencing the holder), closes the revoked
-- term in the lease trail and records who asked.
GRANT UPDATE (status, details, completed_at, updated_at,
              execution_lease_id, execution_lease_expires_at, execution_lease_generation,
              execution_lease_terms, cancelled_at, cancelled_by, cancel_reason)
    ON ingestion_batches TO fleet_enqueue;
DROP POLICY IF EXISTS fleet_enqueue_read ON ingestion_batches;
CREATE POLICY fleet_enqueue_read ON ingestion_batches FOR SELECT TO fleet_enqueue
    USING (true);
DROP POLICY IF EXISTS fleet_enqueue_insert ON ingestion_batches;
CREATE POLICY fleet_enqueue_insert ON ingestion_batches FOR INSERT TO fleet_enqueue
    WITH CHECK (status IN ('Running', 'Failed')
                AND public.fleet_scope_names_batch(source_scope, tenant_id, tenant_database, company_id));
DROP POLICY IF EXISTS fleet_enqueue_update ON ingestion_batches;
CREATE POLICY fleet_enqueue_update ON ingestion_batches FOR UPDATE TO fleet_enqueue
    USING (true) WITH CHECK (status IN ('Running', 'Failed'));

-- River inserts with INSERT … ON CONFLICT DO UPDATE, which needs UPDATE;
-- enqueue cancel marks a batch's jobs cancelled (UPDATE too).
GRANT SELECT, INSERT, UPDATE ON river_job TO fleet_enqueue;
GRANT SELECT ON river_migration TO fleet_enqueue;

-- Replay records of enqueue serve's signed requests (migration 00010):
-- claim, release after a failed request, prune expired ones.
GRANT SELECT, INSERT, UPDATE, DELETE ON ingest_seen_signatures TO fleet_enqueue;

-- Checkpoints of enqueue reconcile --every (migration 00040).
GRANT SELECT, INSERT, UPDATE ON ingest_reconcile_checkpoints TO fleet_enqueue;

-- ---------------------------------------------------------------------------
-- Local warehouse (schema curated): the worker loads and publishes; enqueue
-- reads the stamp to prove resumes.
-- ---------------------------------------------------------------------------
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_namespace WHERE nspname = 'curated') THEN
        REVOKE CREATE ON SCHEMA curated FROM PUBLIC;
        GRANT USAGE ON SCHEMA curated TO fleet_worker, fleet_enqueue;
        GRANT SELECT, INSERT, DELETE ON curated.fleet_records TO fleet_worker;
        GRANT SELECT, INSERT, UPDATE ON curated.fleet_slices TO fleet_worker;
        GRANT SELECT, INSERT ON curated.fleet_publications TO fleet_worker;
        REVOKE ALL ON SEQUENCE curated.fleet_publications_id_seq FROM fleet_worker, fleet_enqueue;
        GRANT USAGE ON SEQUENCE curated.fleet_publications_id_seq TO fleet_worker;
        GRANT SELECT ON curated.fleet_slices TO fleet_enqueue;
    END IF;
END
$$;

COMMIT;
