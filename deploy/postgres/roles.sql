-- Least-privilege roles for the Fleet ingestion coordinator.
--
-- Run as a superuser (or the role that owns the tables, with CREATEROLE) in
-- the operational database, after "worker migrate" has created the tables
-- (the migrating role owns them and is the only one with DDL rights; it
-- also owns the functions migration 00080 made to own the door's writes):
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
--   CREATE ROLE fleet_worker_login   LOGIN PASSWORD '…' IN ROLE fleet_worker;
--   CREATE ROLE fleet_enqueue_login  LOGIN PASSWORD '…' IN ROLE fleet_enqueue;
--   CREATE ROLE fleet_reconcile_login LOGIN PASSWORD '…' IN ROLE fleet_reconcile;
--   CREATE ROLE fleet_operator_login LOGIN PASSWORD '…' IN ROLE fleet_operator;
--
-- One group per login: a login in two groups has the union of their rights.
--
-- fleet_worker    runs jobs: reads batches and moves Running ones through
--                 their lifecycle (status, details, lease columns; never
--                 who or what a batch is for), works River's tables, loads
--                 and publishes the local warehouse schema. No DDL, no
--                 inserts or deletes of batches, no change to a batch that
--                 is no longer Running.
-- fleet_enqueue   the doors: enqueue import, enqueue serve's import and
--                 event routes, enqueue sqs. Reserves batches (INSERT,
--                 Running, or Failed to record a failed enqueue) and
--                 inserts their River jobs; claims, releases (with the
--                 claim's token) and prunes the replay records of signed
--                 requests through functions that own those writes. It
--                 changes no batch and no job after inserting them: no
--                 UPDATE of ingestion_batches at all, no UPDATE or DELETE
--                 of river_job. It cannot write reconcile's checkpoints.
-- fleet_reconcile enqueue reconcile: reserves batches and inserts their
--                 River jobs as the doors do (the same grants, none of the
--                 replay records), and is the only runtime role that keeps
--                 reconcile's checkpoints (ingest_reconcile_checkpoints).
--                 A login of its own, so that a checkpoint moved by any
--                 other login is told apart by who moved it (migration
--                 00115: moved_by), whatever application_name it sets,
--                 and the doors' login cannot move one at all (42501).
-- fleet_operator  operator actions: enqueue cancel, retry and resume, enqueue
--                 serve's cancel route and the River UI
--                 (--operator-database-url). Cancels (fenced: the lease
--                 generation moves on), resumes and retries batches that
--                 are Running or Failed, never a Succeeded one; cancels,
--                 retries and deletes River jobs, pauses queues; reads the
--                 warehouse stamp to prove resumes. Nothing only the worker
--                 does (lease renewals, parking, sweeps, warehouse writes).
--                 Prunes the batch history (enqueue prune): deletes old
--                 terminal batches that are not their folder's newest
--                 (policy fleet_operator_prune). Writes every action it
--                 takes to the operators' audit (ingest_operator_actions,
--                 append-only) and reads it (enqueue audit).
--
-- What holds, and how:
--
--   * Nobody but the table owner can change what a batch is for: UPDATE is
--     granted column by column, and tenant_id, tenant_database, company_id,
--     source_scope, source_type (and the other identity columns) are in no
--     runtime role's list. Such an UPDATE fails with SQLSTATE 42501.
--   * Row-level security on ingestion_batches: the door and the operator
--     may insert a row only into status Running or Failed (a row Succeeded
--     by them violates the policy: 42501), and an s3:// batch only as the
--     tenant, database and company its folder's path names under
--     fleet_path_pattern() (below; keep it equal to --path-pattern). The
--     operator may update only Running and Failed rows into Running or
--     Failed; the worker only Running rows. A row a policy hides from an
--     UPDATE is not changed (0 rows); a new row it refuses is 42501.
--   * Only the operator deletes batches (enqueue prune), and row-level
--     security lets it delete only Succeeded or Failed batches with a
--     source scope, not parked, completed more than a day ago, that are
--     not their folder's newest (policy fleet_operator_prune); a DELETE of
--     any other row changes nothing. The door and the worker have no
--     DELETE (42501).
--   * River's job table: the door's insert is INSERT … ON CONFLICT
--     (unique_key) DO UPDATE SET kind = river_job.kind, which needs
--     UPDATE (kind); the trigger fleet_river_job_insert_only refuses (42501)
--     any update that changes a job for a role that may update no other
--     column, so the door can insert jobs but not change one.
--   * Replay records (ingest_seen_signatures) and reconcile checkpoints: see
--     migration 00080. The door has no DELETE or UPDATE of replay records
--     (only EXECUTE of ingest_claim_signature, ingest_release_signature
--     and ingest_prune_signatures), and no role can date a checkpoint after
--     the database clock.
--   * Sequences: USAGE only (nextval through the inserts); no role can
--     setval() River's or the batches' sequences. RLS is default-deny for
--     every other role but the owner and superusers: a new runtime role
--     needs a policy here.
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
-- Idempotent; re-run after migrations that add tables or columns (and after
-- River's, which may recreate its tables): after every upgrade. Forgotten,
-- worker run, enqueue serve, sqs, reconcile and prune refuse to start
-- (exit 10) and name each privilege of this file their login lacks
-- (internal/grants, whose lists follow the sections below; the runbook's
-- "Permission denied"). Every run first revokes what the
-- runtime roles had, so it also removes grants an earlier version of this
-- file made. To extend it, add grants to the role's section below (a new
-- column a role updates goes into that role's UPDATE list; a new table into
-- its table grants).

BEGIN;
SELECT pg_advisory_xact_lock(7061101);

-- Roles are the cluster's, shared by its databases: a run in another
-- database may create one at the same time (the lock above is this
-- database's), and then this run finds it made.
DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['fleet_worker', 'fleet_enqueue', 'fleet_reconcile', 'fleet_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
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
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator', current_database());
    -- The migrating role keeps its access even when it does not own the
    -- database itself.
    SELECT tableowner INTO owner FROM pg_tables WHERE schemaname = 'public' AND tablename = 'ingestion_batches';
    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %I', current_database(), owner);
END
$$;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator;

-- ---------------------------------------------------------------------------
-- Start from nothing: every privilege the runtime roles hold on tables
-- (column privileges included), sequences and the migrations' functions
-- is revoked, and their policies dropped, so a re-run leaves exactly what
-- the sections below grant.
-- ---------------------------------------------------------------------------
DO $$
DECLARE obj text;
BEGIN
    FOR obj IN SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname IN ('public', 'curated') LOOP
        EXECUTE format('REVOKE ALL ON TABLE %s FROM fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator', obj);
    END LOOP;
    FOR obj IN SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences WHERE schemaname IN ('public', 'curated') LOOP
        EXECUTE format('REVOKE ALL ON SEQUENCE %s FROM fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator', obj);
    END LOOP;
    FOR obj IN SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'ingest\_%' LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator', obj);
    END LOOP;
    IF EXISTS (SELECT FROM pg_namespace WHERE nspname = 'curated') THEN
        REVOKE ALL ON SCHEMA curated FROM fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator;
    END IF;
END
$$;
-- Policies of this file, current and former.
DROP POLICY IF EXISTS fleet_worker_batches ON ingestion_batches;
DROP POLICY IF EXISTS fleet_worker_update ON ingestion_batches;
DROP POLICY IF EXISTS fleet_enqueue_read ON ingestion_batches;
DROP POLICY IF EXISTS fleet_enqueue_insert ON ingestion_batches;
DROP POLICY IF EXISTS fleet_enqueue_update ON ingestion_batches;
DROP POLICY IF EXISTS fleet_enqueue_cancel ON ingestion_batches;
DROP POLICY IF EXISTS fleet_operator_update ON ingestion_batches;
DROP POLICY IF EXISTS fleet_read ON ingestion_batches;
DROP POLICY IF EXISTS fleet_reserve ON ingestion_batches;
DROP POLICY IF EXISTS fleet_operator_prune ON ingestion_batches;
ALTER TABLE ingestion_batches ENABLE ROW LEVEL SECURITY;

-- Every runtime role reads every batch.
GRANT SELECT ON ingestion_batches TO fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator;
CREATE POLICY fleet_read ON ingestion_batches FOR SELECT TO fleet_worker, fleet_enqueue, fleet_reconcile, fleet_operator
    USING (true);

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
-- Reservations, by the door and by the operator's retries: Running, or
-- Failed to record an enqueue whose job insert failed (RecordFailedEnqueue).
-- The identity of a batch is written once, here, and never updated.
-- ---------------------------------------------------------------------------
GRANT INSERT (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
              business_date, pipeline_stage, status, details, source_scope, completed_at)
    ON ingestion_batches TO fleet_enqueue, fleet_reconcile, fleet_operator;
GRANT USAGE ON SEQUENCE ingestion_batches_id_seq TO fleet_enqueue, fleet_reconcile, fleet_operator;
CREATE POLICY fleet_reserve ON ingestion_batches FOR INSERT TO fleet_enqueue, fleet_reconcile, fleet_operator
    WITH CHECK (status IN ('Running', 'Failed')
                AND public.fleet_scope_names_batch(source_scope, tenant_id, tenant_database, company_id));

-- ---------------------------------------------------------------------------
-- fleet_worker
-- ---------------------------------------------------------------------------
-- Lifecycle columns of Running batches only: fenced state writes (the last
-- one moves the batch to Succeeded or Failed), lease acquire/renew/release,
-- parking a batch this build cannot work on. Every one of these statements
-- names status = 'Running' (a release of a term no longer held changes
-- nothing either way); a batch that left Running is no worker's to change.
GRANT UPDATE (status, details, completed_at, updated_at,
              execution_lease_id, execution_lease_expires_at, execution_lease_generation,
              execution_lease_renewed_at, execution_lease_terms, parked_at, parked_reason)
    ON ingestion_batches TO fleet_worker;
CREATE POLICY fleet_worker_update ON ingestion_batches FOR UPDATE TO fleet_worker
    USING (status = 'Running') WITH CHECK (true);
-- Workers, and the doors (enqueue serve, sqs, reconcile: at start and in
-- /readyz), check that the schema is current for their build.
GRANT SELECT ON ingest_schema_migrations TO fleet_worker, fleet_enqueue, fleet_reconcile;
-- The lease sweeper records when it last ran, so the fleet sweeps once per
-- period rather than once per pod (migration 00060).
GRANT SELECT, INSERT, UPDATE ON ingest_sweeps TO fleet_worker;

-- River: workers fetch, complete, snooze, rescue, clean and elect a leader;
-- they also insert jobs (notifications, redeliveries).
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'river%' LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO fleet_worker', t);
        -- The River UI shows River's tables to operators.
        EXECUTE format('GRANT SELECT ON public.%I TO fleet_operator', t);
    END LOOP;
    -- USAGE alone: nextval through the inserts' defaults. SELECT (currval)
    -- is not needed and UPDATE would allow setval(), with which any role
    -- could make every later insert collide.
    FOR t IN SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' AND sequencename LIKE 'river%' LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE public.%I TO fleet_worker', t);
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------
-- fleet_enqueue: the doors (and fleet_reconcile: enqueue reconcile)
-- ---------------------------------------------------------------------------
-- River jobs: insert, and read what was inserted (RETURNING; enqueue status
-- shows a batch's jobs). UPDATE (kind) only for the ON CONFLICT clause of
-- River's insert; the trigger below refuses any change it would make.
GRANT SELECT, INSERT ON river_job TO fleet_enqueue, fleet_reconcile;
GRANT UPDATE (kind) ON river_job TO fleet_enqueue, fleet_reconcile;
GRANT USAGE ON SEQUENCE river_job_id_seq TO fleet_enqueue, fleet_reconcile;
GRANT SELECT ON river_migration TO fleet_enqueue, fleet_reconcile;
-- River queues: read only, so that the door's GET /v1/batches shows a batch
-- waiting in a paused queue (queue_paused) as enqueue status does. Not
-- required: without it the door shows no paused queue.
GRANT SELECT ON river_queue TO fleet_enqueue;

-- A tenant's cancel of its own batch (POST /v1/batches/{id}/cancel with a
-- tenant token, enqueue serve's public listener): Running → Failed of a
-- batch no delivery holds (parked, or reserved and not yet started), the
-- columns an operator's cancel writes, and only as the cancel of the
-- batch's own tenant (cancelled_by 'tenant:' || tenant_id). The
-- policy hides a batch under a live lease from the door's login (only an
-- operator cancels running work) and lets it write nothing but a cancel
-- recorded as a tenant's. No River job is changed (a queued delivery
-- finds the batch terminal and ends).
GRANT UPDATE (status, details, completed_at, updated_at,
              execution_lease_id, execution_lease_expires_at, execution_lease_generation,
              execution_lease_terms, cancelled_at, cancelled_by, cancel_reason)
    ON ingestion_batches TO fleet_enqueue;
CREATE POLICY fleet_enqueue_cancel ON ingestion_batches FOR UPDATE TO fleet_enqueue
    USING (status = 'Running' AND (execution_lease_id IS NULL OR execution_lease_expires_at <= now()))
    WITH CHECK (status = 'Failed' AND cancelled_at IS NOT NULL AND cancelled_by = 'tenant:' || tenant_id);

-- Replay records of enqueue serve's signed requests (migration 00010):
-- read, and written only through the functions of migration 00080.
GRANT SELECT (digest, expires_at) ON ingest_seen_signatures TO fleet_enqueue;
GRANT EXECUTE ON FUNCTION ingest_claim_signature(bytea, interval),
                          ingest_release_signature(bytea, bytea),
                          ingest_prune_signatures()
    TO fleet_enqueue;

-- The batches' id sequence moved past the ids the warehouse names (a
-- restore or a failover behind the warehouse; migration 00100): a worker
-- at start and a load that takes a forgotten batch's stamp over. The
-- function only ever moves the sequence forward, by drawing values; no
-- role holds UPDATE on the sequence (setval).
GRANT EXECUTE ON FUNCTION ingest_advance_batch_ids(bigint) TO fleet_worker;

-- Checkpoints of enqueue reconcile --every (migration 00040; a time after
-- the database clock is refused by migration 00080's trigger; every write
-- records its login, migration 00115): reconcile's role only. The doors'
-- login (fleet_enqueue) neither writes nor locks them (FOR UPDATE needs
-- UPDATE): it cannot move a checkpoint or hold reconcile's row, whatever
-- application_name it sets.
GRANT SELECT, INSERT, UPDATE ON ingest_reconcile_checkpoints TO fleet_reconcile;

-- ---------------------------------------------------------------------------
-- fleet_operator
-- ---------------------------------------------------------------------------
-- Resumes (Failed → Running, or a refusal recorded in a Failed batch's
-- details) and cancels (Running → Failed: the lease generation moves on,
-- fencing the holder, the revoked term is closed in the lease trail, and
-- who asked is recorded). Never a Succeeded batch: success stays declared.
GRANT UPDATE (status, details, completed_at, updated_at,
              execution_lease_id, execution_lease_expires_at, execution_lease_generation,
              execution_lease_terms, cancelled_at, cancelled_by, cancel_reason)
    ON ingestion_batches TO fleet_operator;
CREATE POLICY fleet_operator_update ON ingestion_batches FOR UPDATE TO fleet_operator
    USING (status IN ('Running', 'Failed')) WITH CHECK (status IN ('Running', 'Failed'));

-- Retention (enqueue prune): DELETE of batches, only those row-level
-- security lets go: Succeeded or Failed Fleet batches (with a source
-- scope), completed more than a day ago, that are not the newest batch of
-- their folder. enqueue prune applies its fuller rules (the newest
-- Succeeded batch of a folder, resumable publications, retry chains:
-- internal/retention) within these; a DELETE of any other row changes
-- nothing.
GRANT DELETE ON ingestion_batches TO fleet_operator;
CREATE POLICY fleet_operator_prune ON ingestion_batches FOR DELETE TO fleet_operator
    USING (status IN ('Succeeded', 'Failed') AND source_scope IS NOT NULL AND parked_at IS NULL
           AND completed_at < now() - interval '1 day'
           AND id < (SELECT max(n.id) FROM public.ingestion_batches n
                     WHERE n.tenant_id = ingestion_batches.tenant_id AND n.source_scope = ingestion_batches.source_scope));

-- The operators' audit (migration 00110): every operator action writes
-- one row (who, what, when, why) and enqueue audit reads them. INSERT of
-- the columns the action fills only: id, at (the database clock) and login
-- (current_user) are the database's. No runtime role may UPDATE, DELETE or
-- TRUNCATE a row (and the table's trigger refuses UPDATE and DELETE to any
-- role but its owner): the audit is append-only.
GRANT SELECT ON ingest_operator_actions TO fleet_operator;
GRANT INSERT (actor, door, action, outcome, batch_id, tenant_id, queue, reason, note, details)
    ON ingest_operator_actions TO fleet_operator;

-- River: jobs of retries and resumes, a cancel's jobs marked cancelled, and
-- the River UI's actions (cancel, retry, delete jobs; pause, resume and
-- update queues).
GRANT INSERT, UPDATE, DELETE ON river_job TO fleet_operator;
GRANT UPDATE ON river_queue TO fleet_operator;
GRANT USAGE ON SEQUENCE river_job_id_seq TO fleet_operator;

-- ---------------------------------------------------------------------------
-- River's job table: inserts only, for a role that may update no column but
-- kind (the door). No other role pays more than the WHEN clause.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION public.fleet_river_job_unchanged() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    RAISE EXCEPTION 'permission denied to change River job %: role % may insert jobs, not change them', OLD.id, current_user
        USING ERRCODE = 'insufficient_privilege', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
END
$$;
CREATE OR REPLACE TRIGGER fleet_river_job_insert_only BEFORE UPDATE ON public.river_job
    FOR EACH ROW
    WHEN (NOT pg_catalog.has_column_privilege('public.river_job'::regclass, 'state', 'UPDATE')
          AND OLD IS DISTINCT FROM NEW)
    EXECUTE FUNCTION public.fleet_river_job_unchanged();

-- ---------------------------------------------------------------------------
-- Local warehouse (schema curated): the worker loads and publishes; the
-- operator reads the stamp to prove resumes, the load ledger (status
-- --objects) and the load errors (status --errors).
-- ---------------------------------------------------------------------------
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_namespace WHERE nspname = 'curated') THEN
        REVOKE CREATE ON SCHEMA curated FROM PUBLIC;
        GRANT USAGE ON SCHEMA curated TO fleet_worker, fleet_operator;
        GRANT SELECT, INSERT, DELETE ON curated.fleet_records TO fleet_worker;
        GRANT SELECT, INSERT, UPDATE ON curated.fleet_slices TO fleet_worker;
        GRANT SELECT, INSERT ON curated.fleet_publications TO fleet_worker;
        GRANT USAGE ON SEQUENCE curated.fleet_publications_id_seq TO fleet_worker;
        GRANT SELECT ON curated.fleet_slices TO fleet_operator;
        -- The load ledger: written with the slice; enqueue status --objects reads it.
        GRANT SELECT, INSERT, DELETE ON curated.fleet_load_objects TO fleet_worker;
        GRANT SELECT ON curated.fleet_load_objects TO fleet_operator;
        -- The load errors (bad records skipped within the tolerance):
        -- written with the slice; enqueue status --errors reads them.
        IF EXISTS (SELECT FROM pg_tables WHERE schemaname = 'curated' AND tablename = 'fleet_load_errors') THEN
            GRANT SELECT, INSERT, DELETE ON curated.fleet_load_errors TO fleet_worker;
            GRANT SELECT ON curated.fleet_load_errors TO fleet_operator;
        END IF;
    END IF;
END
$$;

COMMIT;
