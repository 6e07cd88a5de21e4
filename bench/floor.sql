-- The protocol floor: the fewest statements one trivial batch (one folder,
-- one record) needs on the real schema (ingestion_batches with its indexes,
-- River's river_job, the local warehouse's curated tables), run by pgbench
-- with no client of ours in the way (bench/floor.go, the floor rows of
-- make bench). One script run is one batch, from its reservation to its
-- completed job. Each pgbench client works on a tenant of its own
-- (floor-<client>) and a new random folder per run, so the one Running batch
-- per scope index always admits its reservation, and on a River queue of its
-- own (floor_<client>), so its fetch finds the job it inserted.
--
-- Each statement says the rule of docs/reliability.md (and package batch,
-- lease, warehouse) it serves. Anything a rule does not need is left out
-- (the lease term trail, the write audit trail, updated_at, job tags, the
-- load ledger and load errors, the slice lock of a load that finds it held,
-- the stale load termination); those are what ours pays beyond the floor.
--
-- pgbench reads a colon followed by a name as a variable, so the scope's
-- colon is chr(58), and no comment below puts a name after a colon.

\set n random(1, 1000000000000000)

-- 1. Reserve the folder and insert its job, in one transaction: a batch is
-- never Running without a job to run it, nor a job without its batch (job
-- insert fails at enqueue, nothing is left).
BEGIN;
-- At most one Running batch per (tenant, scope): the unique partial index
-- ux_ingestion_batches_running_scope decides, as Reserve does (ON CONFLICT
-- DO NOTHING; a conflict would return no row and stop this client).
INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
                               pipeline_stage, status, details, source_scope)
VALUES ('company-1', 'floor-' || :client_id::text, 'tenant_db', 'FileUpload', 'FleetS3',
        'fleet_s3_direct_to_curated', 'Running', '{"version": 1, "phase": "reserved"}',
        'fleet_s3' || chr(58) || 's3://floor-bucket/' || :client_id::text || '/' || :n::text)
ON CONFLICT (tenant_id, source_scope) WHERE status = 'Running' AND source_scope IS NOT NULL DO NOTHING
RETURNING id AS batch_id, tenant_id, source_scope \gset
-- The batch's River job (the columns River requires; the rest are defaults).
INSERT INTO river_job (args, kind, max_attempts, queue)
VALUES (jsonb_build_object('batch_id', :batch_id::bigint), 'fleet_ingest', 25, 'floor_' || :client_id::text);
COMMIT;

-- 2. River's fetch, in River's own shape (JobGetAvailable, one job): the job
-- is marked running with its attempt, so no other worker fetches it.
WITH locked_jobs AS (
    SELECT * FROM river_job
    WHERE state = 'available' AND queue = 'floor_' || :client_id::text AND scheduled_at <= now()
    ORDER BY priority ASC, scheduled_at ASC, id ASC
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE river_job
SET state = 'running', attempt = river_job.attempt + 1, attempted_at = now(),
    attempted_by = array_append(river_job.attempted_by, 'floor-' || :client_id::text)
FROM locked_jobs
WHERE river_job.id = locked_jobs.id
RETURNING river_job.id AS job_id, (river_job.args->>'batch_id')::bigint AS job_batch_id \gset

-- 3. Acquire the execution lease, committed before any work: one delivery
-- at a time works on a Running batch, and a dead holder is taken over after
-- the expiry (never a live lease, never a terminal batch). The generation
-- increases on every acquisition: it is the fencing token of every write
-- below. The expiry is read from clock_timestamp(), as acquireSQL does
-- (lease TTL 30 s, the default).
UPDATE ingestion_batches
SET execution_lease_id = 'floor/' || :client_id::text || '/' || :job_id::text,
    execution_lease_expires_at = clock_timestamp() + interval '30 seconds',
    execution_lease_generation = execution_lease_generation + 1
WHERE id = :job_batch_id
  AND status = 'Running'
  AND (execution_lease_id IS NULL OR execution_lease_expires_at <= clock_timestamp())
RETURNING execution_lease_id AS holder, execution_lease_generation AS generation \gset

-- 4. Load, in one transaction: the slice's records replaced (each record
-- loaded exactly once), stamped with the batch and generation, and the
-- load's commit recorded in the batch (a durable phase: a later delivery
-- resumes from publication, never loads again).
BEGIN;
-- The stamp first: the upsert locks the slice (its row, or its key in the
-- primary key while new) for the rest of the transaction, serialising loads
-- and publications of one slice, and writes only if no newer batch or
-- generation stamped it (the old slice never overwrites the newer one; no
-- row back would stop this client).
INSERT INTO curated.fleet_slices (tenant_id, source_scope, batch_id, lease_generation, record_count, committed_at, published_at)
VALUES (:tenant_id, :source_scope, :job_batch_id, :generation, 1, now(), NULL)
ON CONFLICT (tenant_id, source_scope) DO UPDATE
SET batch_id = EXCLUDED.batch_id, lease_generation = EXCLUDED.lease_generation,
    record_count = EXCLUDED.record_count, committed_at = EXCLUDED.committed_at, published_at = NULL
WHERE (fleet_slices.batch_id, fleet_slices.lease_generation) <= (EXCLUDED.batch_id, EXCLUDED.lease_generation)
RETURNING batch_id AS stamped \gset
-- Replace the slice: an earlier delivery's records of it are gone.
DELETE FROM curated.fleet_records WHERE tenant_id = :tenant_id AND source_scope = :source_scope;
-- The folder's one record.
INSERT INTO curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record)
VALUES (:tenant_id, :source_scope, :job_batch_id, 'a.csv', 2, '{"k": "1", "v": "x"}');
-- The fenced progress write, last, in the load's transaction: it locks the
-- batch row and writes only while the batch is Running under this exact
-- term (lease id and generation) with more than the safety margin left by
-- the database clock (3 s, a tenth of the TTL); otherwise no row comes back
-- and nothing of the load commits (stale writes refused, a commit in flight
-- at the expiry never lands, an operator cancel wins or loses as a whole).
UPDATE ingestion_batches
SET details = details || '{"phase": "publishing", "redshiftCommitted": true, "recordCount": 1}'::jsonb
WHERE id = :job_batch_id
  AND status = 'Running'
  AND execution_lease_id = :holder
  AND execution_lease_generation = :generation
  AND execution_lease_expires_at > clock_timestamp() + interval '3 seconds'
RETURNING id AS loaded \gset
COMMIT;

-- 5. Publish with the terminal write, in one transaction: the slice is
-- published once, only while it is the batch own, and the batch is
-- Succeeded exactly when its publication committed.
BEGIN;
-- The publication: the slice stamped published (only if it still carries
-- this batch and is not published yet), and its row in the outbox
-- downstream reads (fleet_publications), in one statement as publishSQL.
WITH pub AS (
    UPDATE curated.fleet_slices SET published_at = now()
    WHERE tenant_id = :tenant_id AND source_scope = :source_scope
      AND batch_id = :job_batch_id AND published_at IS NULL
    RETURNING tenant_id, source_scope, batch_id, record_count, published_at
)
INSERT INTO curated.fleet_publications (tenant_id, source_scope, batch_id, record_count, published_at)
SELECT tenant_id, source_scope, batch_id, record_count, published_at FROM pub
RETURNING id AS publication \gset
-- The fenced terminal write: Succeeded, completed, the lease released (the
-- scope is free for the next batch of the folder), under the same term and
-- margin as the progress write.
UPDATE ingestion_batches
SET status = 'Succeeded', details = details || '{"phase": "published"}'::jsonb,
    completed_at = clock_timestamp(), execution_lease_id = NULL, execution_lease_expires_at = NULL
WHERE id = :job_batch_id
  AND status = 'Running'
  AND execution_lease_id = :holder
  AND execution_lease_generation = :generation
  AND execution_lease_expires_at > clock_timestamp() + interval '3 seconds'
RETURNING id AS succeeded \gset
COMMIT;

-- 6. River's completion of the job (one job; River's completer batches
-- them): the job is completed, never run again.
UPDATE river_job SET state = 'completed', finalized_at = now()
WHERE id = :job_id AND state = 'running';
