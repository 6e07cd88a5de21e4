// Package postgres_test holds PostgreSQL to roles.sql: each runtime login
// (the door, the operator, the worker) does what its binaries need and
// nothing the others do. The binaries themselves run under these logins in
// e2e (TestLeastPrivilegeRoles and the tests that call applyRoles).
package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/uploads"
)

// logins is a database with roles.sql applied, a superuser's pool, and
// one login of each runtime role.
type logins struct {
	admin, door, operator, worker, reconcile *pgxpool.Pool
	// posing is a session of the door's login that names itself
	// fleet-ingest-reconcile (application_name), as any client may.
	posing *pgxpool.Pool
}

// newLogins applies roles.sql, then grants what its previous version
// granted the door, and applies it again: a re-run leaves only what the
// file grants now.
func newLogins(t *testing.T) logins {
	t.Helper()
	dbURL := pgtest.NewDatabaseURL(t)
	admin := pgtest.Pool(t, dbURL)
	pgtest.ApplyRoles(t, admin)
	_, err := admin.Exec(context.Background(), `
		GRANT UPDATE (status, details, completed_at, updated_at, execution_lease_id, execution_lease_expires_at,
		              execution_lease_generation, execution_lease_terms, cancelled_at, cancelled_by, cancel_reason)
		    ON ingestion_batches TO fleet_enqueue;
		CREATE POLICY fleet_enqueue_update ON ingestion_batches FOR UPDATE TO fleet_enqueue
		    USING (true) WITH CHECK (status IN ('Running', 'Failed'));
		CREATE POLICY fleet_worker_batches ON ingestion_batches TO fleet_worker USING (true) WITH CHECK (true);
		GRANT SELECT, INSERT, UPDATE ON river_job TO fleet_enqueue;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ingest_seen_signatures TO fleet_enqueue;
		GRANT USAGE ON SCHEMA curated TO fleet_enqueue;
		GRANT SELECT ON curated.fleet_slices TO fleet_enqueue;
		GRANT SELECT, INSERT, UPDATE ON ingest_reconcile_checkpoints TO fleet_enqueue;`)
	require.NoError(t, err)
	pgtest.ApplyRoles(t, admin)
	doorURL := pgtest.LoginAs(t, admin, dbURL, "fleet_enqueue")
	posing, err := url.Parse(doorURL)
	require.NoError(t, err)
	q := posing.Query()
	q.Set("application_name", "fleet-ingest-reconcile")
	posing.RawQuery = q.Encode()
	return logins{
		admin:     admin,
		door:      pgtest.Pool(t, doorURL),
		posing:    pgtest.Pool(t, posing.String()),
		operator:  pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, "fleet_operator")),
		worker:    pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, "fleet_worker")),
		reconcile: pgtest.Pool(t, pgtest.LoginAs(t, admin, dbURL, "fleet_reconcile")),
	}
}

// requireCode runs sql and requires PostgreSQL to refuse it with code.
// Statements without a parameter are run without args.
func requireCode(t *testing.T, pool *pgxpool.Pool, code, sql string, args ...any) {
	t.Helper()
	if !strings.Contains(sql, "$1") {
		args = nil
	}
	_, err := pool.Exec(context.Background(), sql, args...)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: not refused (%v)", sql, err)
	require.Equal(t, code, pgErr.Code, "%s: %v", sql, err)
}

// requireDenied runs sql and requires a permission error (42501: a missing
// privilege, a row-level security policy's refusal, or the river_job
// trigger).
func requireDenied(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	requireCode(t, pool, "42501", sql, args...)
}

// requireNoRowChanged runs sql, which row-level security lets through but
// filters: it must change nothing.
func requireNoRowChanged(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
	require.Zero(t, tag.RowsAffected(), sql)
}

func newEnqueuer(t *testing.T, pool *pgxpool.Pool) *jobs.Enqueuer {
	t.Helper()
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return &jobs.Enqueuer{
		Pool: pool, River: client, Logger: slog.New(slog.DiscardHandler),
		Verifier: batch.SliceVerifierFunc(func(context.Context, string, string) (batch.Ref, bool, error) { return batch.Ref{}, false, nil }),
	}
}

func importFolder(t *testing.T, enq *jobs.Enqueuer, tenant, upload string) jobs.Result {
	t.Helper()
	res, err := enq.Import(context.Background(), jobs.ImportRequest{
		TenantID: tenant, TenantDatabase: "db", CompanyID: "c",
		Folder: "s3://fleet-uploads/tenants/" + tenant + "/db/c/" + upload,
	})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeEnqueued, res.Outcome, "%+v", res)
	return res
}

// succeededBatch inserts, as the table owner, a batch of tenant that the
// worker declared Succeeded.
func succeededBatch(t *testing.T, admin *pgxpool.Pool, tenant, upload string) int64 {
	t.Helper()
	folder := "s3://fleet-uploads/tenants/" + tenant + "/db/c/" + upload
	d := batch.NewDetails(folder)
	d.Phase, d.RedshiftCommitted = batch.PhasePublished, true
	raw, err := d.Marshal()
	require.NoError(t, err)
	var id int64
	require.NoError(t, admin.QueryRow(context.Background(), `
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope, completed_at)
		VALUES ('c', $1, 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Succeeded', $2, $3, now())
		RETURNING id`, tenant, string(raw), "fleet_s3:"+folder).Scan(&id))
	return id
}

func status(t *testing.T, pool *pgxpool.Pool, id int64) (batch.Status, int64) {
	t.Helper()
	var s batch.Status
	var generation int64
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status, execution_lease_generation FROM ingestion_batches WHERE id = $1`, id).Scan(&s, &generation))
	return s, generation
}

// probeArgs is a job kind with unique insert options, so a second insert
// takes River's ON CONFLICT … DO UPDATE path.
type probeArgs struct {
	N int `json:"n"`
}

func (probeArgs) Kind() string { return "roles_probe" }

// TestDoorLoginReservesAndInsertsButChangesNothing: the door's login
// (fleet_enqueue) imports folders (a reservation and its River job in one
// transaction), records failed enqueues, inserts unique jobs twice (River's
// ON CONFLICT path) and claims, releases and prunes replay records; and it
// cannot move another tenant's Succeeded batch to Failed, bump the lease
// generation of Running batches (fencing every worker), change or delete a
// River job, delete or release another request's replay record, date a
// reconcile checkpoint in the future, or read the warehouse.
func TestDoorLoginReservesAndInsertsButChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newLogins(t)
	door := newEnqueuer(t, db.door)

	// What the door does.
	running := importFolder(t, door, "tenant-a", "up-1")
	r := batch.Reservation{
		CompanyID: "c", TenantID: "tenant-a", TenantDatabase: "db", SourceType: batch.SourceTypeFleetS3,
		IngestionMode: batch.IngestionModeFileUpload, PipelineStage: batch.PipelineStageFleet,
		SourceScope: "fleet_s3:s3://fleet-uploads/tenants/tenant-a/db/c/up-2", Details: batch.NewDetails("s3://fleet-uploads/tenants/tenant-a/db/c/up-2"),
	}
	failed, err := batch.NewStore(db.door).RecordFailedEnqueue(ctx, r, "injected")
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, failed.Status)
	for range 2 {
		err := pgx.BeginFunc(ctx, db.door, func(tx pgx.Tx) error {
			res, err := door.River.InsertManyTx(ctx, tx, []river.InsertManyParams{
				{Args: probeArgs{N: 1}, InsertOpts: &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}},
			})
			if err == nil && len(res) != 1 {
				err = errors.New("no result")
			}
			return err
		})
		require.NoError(t, err, "River's insert, its ON CONFLICT … DO UPDATE path included, works as the door")
	}
	var probes int
	require.NoError(t, db.admin.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'roles_probe'`).Scan(&probes))
	require.Equal(t, 1, probes, "the second unique insert was a duplicate")

	replays := uploads.NewReplayStore(db.door)
	claim, first, err := replays.Claim(ctx, "hmac:captured", time.Hour)
	require.NoError(t, err)
	require.True(t, first)
	_, first, err = replays.Claim(ctx, "hmac:captured", time.Hour)
	require.NoError(t, err)
	require.False(t, first)
	_, err = replays.Prune(ctx)
	require.NoError(t, err)
	var digests int
	require.NoError(t, db.door.QueryRow(ctx, `SELECT count(*) FROM ingest_seen_signatures WHERE expires_at > now()`).Scan(&digests))
	require.Equal(t, 1, digests, "the door reads the replay records; Prune left the live one")

	// What the door may not do.
	other := succeededBatch(t, db.admin, "tenant-b", "done")
	acq, err := lease.NewStore(db.worker).Acquire(ctx, running.BatchID, "worker-1", time.Hour)
	require.NoError(t, err)
	require.Equal(t, lease.Acquired, acq.Outcome)
	// A batch no delivery holds, which its tenant may cancel (the public
	// cancel route): the door's policy lets it write only that cancel.
	idle := importFolder(t, door, "tenant-a", "up-3")
	for _, sql := range []string{
		`UPDATE ingestion_batches SET status = 'Failed', completed_at = now() WHERE id = $1`,
		`UPDATE ingestion_batches SET details = details || '{"phase": "failed_pre_commit"}' WHERE id = $1`,
		`UPDATE ingestion_batches SET status = 'Failed', cancelled_at = now(), cancelled_by = 'tenant:tenant-b' WHERE id = $1`,
	} {
		requireNoRowChanged(t, db.door, sql, other)           // Succeeded: not the door's to change
		requireNoRowChanged(t, db.door, sql, running.BatchID) // under a live lease: an operator's
	}
	for _, sql := range []string{
		`UPDATE ingestion_batches SET execution_lease_generation = execution_lease_generation + 1 WHERE id = $1`,
		`UPDATE ingestion_batches SET cancelled_at = now(), cancelled_by = 'door' WHERE id = $1`,
		`UPDATE ingestion_batches SET status = 'Failed', completed_at = now() WHERE id = $1`,
		// A cancel of tenant-a's batch recorded as another tenant's, or as
		// no one's (issue 45: the name is the batch's own tenant).
		`UPDATE ingestion_batches SET status = 'Failed', cancelled_at = now(), cancelled_by = 'tenant:tenant-b' WHERE id = $1`,
		`UPDATE ingestion_batches SET status = 'Failed', cancelled_at = now(), cancelled_by = 'tenant:' WHERE id = $1`,
		`UPDATE ingestion_batches SET status = 'Failed', cancelled_by = 'tenant:tenant-a' WHERE id = $1`,
	} {
		requireDenied(t, db.door, sql, idle.BatchID) // only a cancel recorded as its own tenant's
	}
	requireDenied(t, db.door, `DELETE FROM ingestion_batches WHERE id = $1`, other)
	s, _ := status(t, db.admin, other)
	require.Equal(t, batch.StatusSucceeded, s)
	_, generation := status(t, db.admin, running.BatchID)
	require.Equal(t, acq.Lease.Generation, generation, "the holder is not fenced")
	// The tenant's cancel through the door's login: refused under a live
	// lease, done for the idle batch (its jobs left to end on their own).
	res, err := door.Cancel(ctx, jobs.CancelRequest{BatchID: running.BatchID, TenantID: "tenant-a", By: jobs.TenantActor("tenant-a"), Tenant: true})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeNotCancellable, res.Outcome)
	require.Equal(t, jobs.ReasonLeased, res.Reason)
	res, err = door.Cancel(ctx, jobs.CancelRequest{BatchID: idle.BatchID, TenantID: "tenant-a", By: jobs.TenantActor("tenant-a"), Reason: "wrong upload", Tenant: true})
	require.NoError(t, err)
	require.Equal(t, "cancelled", res.Outcome)
	s, _ = status(t, db.admin, idle.BatchID)
	require.Equal(t, batch.StatusFailed, s)
	s, _ = status(t, db.admin, running.BatchID)
	require.Equal(t, batch.StatusRunning, s)

	for _, sql := range []string{
		`UPDATE river_job SET state = 'cancelled', finalized_at = now()`,
		`UPDATE river_job SET args = '{"batch_id": 1}' WHERE id = $1`,
		`UPDATE river_job SET kind = 'other' WHERE id = $1`,
		`DELETE FROM river_job WHERE id = $1`,
		`INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, id) VALUES ('{}', 'x', 1, 1, 'default', 'available', $1)
		 ON CONFLICT (id) DO UPDATE SET kind = 'rewritten'`,
		`TRUNCATE river_job`,
	} {
		requireDenied(t, db.door, sql, running.JobID)
	}
	var kind, state string
	require.NoError(t, db.admin.QueryRow(ctx, `SELECT kind, state FROM river_job WHERE id = $1`, running.JobID).Scan(&kind, &state))
	require.Equal(t, jobs.IngestArgs{}.Kind(), kind)
	require.Equal(t, "available", state)

	digest := []byte("0123456789abcdef0123456789abcdef")
	_, err = db.admin.Exec(ctx, `INSERT INTO ingest_seen_signatures (digest, expires_at, claim_hash) VALUES ($1, now() + interval '1 hour', sha256('secret'))`, digest)
	require.NoError(t, err)
	for _, sql := range []string{
		`DELETE FROM ingest_seen_signatures WHERE digest = $1`,
		`UPDATE ingest_seen_signatures SET expires_at = now() WHERE digest = $1`,
		`INSERT INTO ingest_seen_signatures (digest, expires_at) VALUES (sha256($1), now())`,
		`SELECT claim_hash FROM ingest_seen_signatures WHERE digest = $1`,
	} {
		requireDenied(t, db.door, sql, digest)
	}
	for _, token := range [][]byte{nil, {}, []byte("guess")} {
		var released bool
		require.NoError(t, db.door.QueryRow(ctx, `SELECT ingest_release_signature($1, $2)`, digest, token).Scan(&released))
		require.False(t, released, "released without the claim's token")
	}
	requireCode(t, db.door, "22023", `SELECT ingest_claim_signature($1, interval '-1 hour')`, digest)
	require.NoError(t, db.door.QueryRow(ctx, `SELECT count(*) FROM ingest_seen_signatures WHERE digest = $1`, digest).Scan(&digests))
	require.Equal(t, 1, digests, "the unexpired record stays")
	released, err := replays.Release(ctx, claim)
	require.NoError(t, err)
	require.True(t, released, "the claim's own token releases it")

	// Reconcile's checkpoints are not the door's (issue 44): it cannot
	// write one, lock reconcile's row or read them, not even naming itself
	// fleet-ingest-reconcile.
	var app string
	require.NoError(t, db.posing.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&app))
	require.Equal(t, "fleet-ingest-reconcile", app)
	_, err = db.admin.Exec(ctx, `INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ('fleet-uploads', '')`)
	require.NoError(t, err)
	for _, pool := range []*pgxpool.Pool{db.door, db.posing} {
		for _, sql := range []string{
			`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, start_after) VALUES ('fleet-uploads', 'other/', 'zzz')`,
			`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ('fleet-uploads', '') ON CONFLICT (bucket, prefix) DO UPDATE SET start_after = 'zzz'`,
			`UPDATE ingest_reconcile_checkpoints SET start_after = 'zzz', covered_since = now(), last_run_at = now()`,
			`SELECT 1 FROM ingest_reconcile_checkpoints FOR UPDATE NOWAIT`,
			`SELECT count(*) FROM ingest_reconcile_checkpoints`,
			`DELETE FROM ingest_reconcile_checkpoints`,
		} {
			requireDenied(t, pool, sql)
		}
	}
	var startAfter, adminLogin string
	var movedBy *string
	require.NoError(t, db.admin.QueryRow(ctx, `SELECT start_after, moved_by, current_user FROM ingest_reconcile_checkpoints`).Scan(&startAfter, &movedBy, &adminLogin))
	require.Empty(t, startAfter, "the door moved the checkpoint")
	require.Equal(t, adminLogin, deref(movedBy), "only the admin's write is recorded")

	// The door reads River's queues (queue_paused in GET /v1/batches),
	// and changes none (above and below: no pause).
	_, err = db.door.Exec(ctx, `SELECT name FROM river_queue WHERE paused_at IS NOT NULL`)
	require.NoError(t, err, "the door reads river_queue")
	for _, sql := range []string{
		`SELECT count(*) FROM curated.fleet_slices`,
		`SELECT count(*) FROM curated.fleet_load_objects`,
		`SELECT count(*) FROM curated.fleet_load_errors`,
		`UPDATE ingest_sweeps SET swept_at = now()`,
		`INSERT INTO river_leader (leader_id, elected_at, expires_at) VALUES ('door', now(), now() + interval '1 hour')`,
		`UPDATE river_queue SET paused_at = now()`,
	} {
		requireDenied(t, db.door, sql)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestReconcileLoginKeepsTheCheckpoints: reconcile's login
// (fleet_reconcile) reserves a folder's batch and inserts its job as the
// door does, and is the runtime role that writes reconcile's checkpoints:
// each write records it as the mover (migration 00115); it cannot date
// one after the database clock (migration 00080), delete one, change a
// batch, or do what only the door does with replay records.
func TestReconcileLoginKeepsTheCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newLogins(t)
	reconcile := newEnqueuer(t, db.reconcile)
	res := importFolder(t, reconcile, "tenant-a", "up-1")
	require.NotZero(t, res.JobID)
	var jobs int
	require.NoError(t, db.admin.QueryRow(ctx, `SELECT count(*) FROM river_job`).Scan(&jobs))
	require.Equal(t, 1, jobs, "the folder's job was inserted")

	requireCode(t, db.reconcile, "23514", `INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, last_run_at) VALUES ('fleet-uploads', '', '9999-01-01')`)
	_, err := db.reconcile.Exec(ctx, `INSERT INTO ingest_reconcile_checkpoints (bucket, prefix, last_run_at) VALUES ('fleet-uploads', '', now())`)
	require.NoError(t, err, "a checkpoint of now is reconcile's to write")
	for _, set := range []string{`last_run_at = '9999-01-01'`, `covered_since = '9999-01-01'`, `pass_started_at = now() + interval '1 minute'`} {
		requireCode(t, db.reconcile, "23514", `UPDATE ingest_reconcile_checkpoints SET `+set)
	}
	var movedBy, self string
	require.NoError(t, db.reconcile.QueryRow(ctx, `SELECT moved_by, current_user FROM ingest_reconcile_checkpoints`).Scan(&movedBy, &self))
	require.Equal(t, self, movedBy)
	require.True(t, strings.HasPrefix(self, "test_fleet_reconcile_"), self)
	for _, sql := range []string{
		`DELETE FROM ingest_reconcile_checkpoints`,
		`UPDATE ingestion_batches SET status = 'Failed'`,
		`UPDATE river_job SET state = 'cancelled'`,
		`DELETE FROM river_job`,
		`SELECT count(*) FROM ingest_seen_signatures`,
		`SELECT ingest_prune_signatures()`,
		`SELECT count(*) FROM curated.fleet_slices`,
	} {
		requireDenied(t, db.reconcile, sql)
	}
}

// TestOperatorLoginCancelsRetriesResumesButNeverUndoesSuccess: the
// operator's login (fleet_operator) cancels a Running batch (its jobs
// cancelled), retries it and works River's jobs as the River UI does; a
// Succeeded batch is not_cancellable and not_resumable (row-level security
// hides it from the operator's updates: a direct UPDATE changes nothing),
// and nothing only the worker does is the operator's.
func TestOperatorLoginCancelsRetriesResumesButNeverUndoesSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newLogins(t)
	op := newEnqueuer(t, db.operator)
	running := importFolder(t, newEnqueuer(t, db.door), "tenant-a", "up-1")
	acq, err := lease.NewStore(db.worker).Acquire(ctx, running.BatchID, "worker-1", time.Hour)
	require.NoError(t, err)

	res, err := op.Cancel(ctx, jobs.CancelRequest{BatchID: running.BatchID, TenantID: "tenant-a", By: "test"})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeCancelled, res.Outcome, "%+v", res)
	require.Equal(t, []int64{running.JobID}, res.CancelledJobs)
	s, generation := status(t, db.admin, running.BatchID)
	require.Equal(t, batch.StatusFailed, s)
	require.Greater(t, generation, acq.Lease.Generation, "the holder is fenced")
	res, err = op.Retry(ctx, jobs.RetryRequest{BatchID: running.BatchID, TenantID: "tenant-a", By: "test"})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeEnqueued, res.Outcome, "%+v", res)
	retried := res
	// The River UI's actions on a job that is not a Running batch's.
	_, err = op.River.JobRetry(ctx, running.JobID)
	require.NoError(t, err)
	_, err = op.River.JobCancel(ctx, running.JobID)
	require.NoError(t, err)
	_, err = op.River.JobDelete(ctx, running.JobID)
	require.NoError(t, err)
	_, err = db.admin.Exec(ctx, `INSERT INTO river_queue (name, created_at, metadata, updated_at) VALUES ('default', now(), '{}', now())`)
	require.NoError(t, err)
	require.NoError(t, op.River.QueuePause(ctx, river.QueueDefault, nil))
	require.NoError(t, op.River.QueueResume(ctx, river.QueueDefault, nil))

	done := succeededBatch(t, db.admin, "tenant-b", "done")
	res, err = op.Cancel(ctx, jobs.CancelRequest{BatchID: done, TenantID: "tenant-b", By: "test"})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeNotCancellable, res.Outcome, "a Succeeded batch is not cancellable (not missing): %+v", res)
	require.Equal(t, string(batch.StatusSucceeded), res.Status)
	res, err = op.Resume(ctx, jobs.ResumeRequest{BatchID: done, TenantID: "tenant-b", By: "test"})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeNotResumable, res.Outcome, "%+v", res)
	require.Equal(t, batch.ReasonSucceeded, res.Reason)
	for _, sql := range []string{
		`UPDATE ingestion_batches SET status = 'Failed', completed_at = now() WHERE id = $1`,
		`UPDATE ingestion_batches SET details = details || '{"phase": "failed_publication"}' WHERE id = $1`,
		`UPDATE ingestion_batches SET execution_lease_generation = execution_lease_generation + 1 WHERE id = $1`,
	} {
		requireNoRowChanged(t, db.operator, sql, done)
	}
	s, _ = status(t, db.admin, done)
	require.Equal(t, batch.StatusSucceeded, s)

	for _, sql := range []string{
		`UPDATE ingestion_batches SET status = 'Succeeded' WHERE id = $1`,
		`UPDATE ingestion_batches SET tenant_id = 'evil' WHERE id = $1`,
		`UPDATE ingestion_batches SET execution_lease_renewed_at = now() WHERE id = $1`,
		`UPDATE ingestion_batches SET parked_at = now(), parked_reason = 'x' WHERE id = $1`,
	} {
		requireDenied(t, db.operator, sql, retried.BatchID)
	}
	// The operator prunes history (enqueue prune), but row-level security
	// lets no Running batch go.
	requireNoRowChanged(t, db.operator, `DELETE FROM ingestion_batches WHERE id = $1`, retried.BatchID)
	for _, sql := range []string{
		`INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope)
		 VALUES ('c', 'tenant-a', 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Succeeded', '{}', 'fleet_s3:s3://fleet-uploads/tenants/tenant-a/db/c/x')`,
		`UPDATE ingest_sweeps SET swept_at = now()`,
		`INSERT INTO ingest_sweeps (name, swept_at) VALUES ('x', now())`,
		`DELETE FROM ingest_seen_signatures`,
		`SELECT ingest_claim_signature(sha256('x'), interval '1 hour')`,
		`SELECT ingest_prune_signatures()`,
		`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ('b', '')`,
		`INSERT INTO curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record) VALUES ('t','s',1,'k',1,'{}')`,
		`UPDATE curated.fleet_slices SET published_at = now()`,
		`INSERT INTO curated.fleet_load_objects (tenant_id, source_scope, batch_id, object_key, etag, size_bytes, record_count, last_modified) VALUES ('t','s',1,'k','e',1,1,now())`,
		`DELETE FROM curated.fleet_load_objects`,
		`INSERT INTO curated.fleet_load_errors (tenant_id, source_scope, batch_id, ordinal, object_key, line_number, column_number, reason, raw_excerpt) VALUES ('t','s',1,1,'k',1,0,'r','x')`,
		`DELETE FROM curated.fleet_load_errors`,
		`INSERT INTO river_leader (leader_id, elected_at, expires_at) VALUES ('operator', now(), now() + interval '1 hour')`,
		`CREATE TABLE sneaky (i int)`,
	} {
		requireDenied(t, db.operator, sql)
	}
	_, err = db.operator.Exec(ctx, `SELECT count(*) FROM curated.fleet_load_objects`)
	require.NoError(t, err, "the operator reads the load ledger (status --objects)")
	_, err = db.operator.Exec(ctx, `SELECT count(*) FROM curated.fleet_load_errors`)
	require.NoError(t, err, "the operator reads the load errors (status --errors)")
}

// TestWorkerLoginChangesOnlyRunningBatchesLifecycle: the worker's login
// (fleet_worker) takes, renews and releases a lease of a Running batch and
// parks it; it cannot insert a batch, re-tenant one, record a cancel,
// change a batch that left Running (a failed one made to look committed,
// a succeeded one failed), or write replay records or checkpoints.
func TestWorkerLoginChangesOnlyRunningBatchesLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newLogins(t)
	door := newEnqueuer(t, db.door)
	running := importFolder(t, door, "tenant-a", "up-1")
	cancelled := importFolder(t, door, "tenant-a", "up-2")
	res, err := newEnqueuer(t, db.operator).Cancel(ctx, jobs.CancelRequest{BatchID: cancelled.BatchID, TenantID: "tenant-a", By: "test"})
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeCancelled, res.Outcome)
	done := succeededBatch(t, db.admin, "tenant-b", "done")

	leases := lease.NewStore(db.worker)
	acq, err := leases.Acquire(ctx, running.BatchID, "worker-1", time.Hour)
	require.NoError(t, err)
	renewed, held, err := leases.Renew(ctx, acq.Lease, time.Hour)
	require.NoError(t, err)
	require.True(t, held)
	_, err = batch.NewStore(db.worker).Park(ctx, renewed.Fence(), "test")
	require.NoError(t, err)
	released, err := leases.Release(ctx, renewed)
	require.NoError(t, err)
	require.True(t, released)
	_, err = leases.Acquire(ctx, cancelled.BatchID, "worker-1", time.Hour)
	require.NoError(t, err, "a terminal batch answers an outcome, not an error")

	for _, sql := range []string{
		`INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status) VALUES ('c','t','d','Api','BrinkPos','s','Running')`,
		`UPDATE ingestion_batches SET tenant_id = 'evil' WHERE id = $1`,
		`UPDATE ingestion_batches SET source_scope = 'fleet_s3:s3://evil/x' WHERE id = $1`,
		`UPDATE ingestion_batches SET cancelled_at = now() WHERE id = $1`,
		`UPDATE ingestion_batches SET cancelled_by = 'worker', cancel_reason = 'x' WHERE id = $1`,
		`DELETE FROM ingestion_batches WHERE id = $1`,
	} {
		requireDenied(t, db.worker, sql, running.BatchID)
	}
	for _, id := range []int64{cancelled.BatchID, done} {
		for _, sql := range []string{
			`UPDATE ingestion_batches SET details = details || '{"phase": "failed_publication", "redshiftCommitted": true}' WHERE id = $1`,
			`UPDATE ingestion_batches SET status = 'Running', completed_at = NULL WHERE id = $1`,
			`UPDATE ingestion_batches SET status = 'Failed' WHERE id = $1`,
			`UPDATE ingestion_batches SET execution_lease_id = 'w', execution_lease_expires_at = now() + interval '1 hour' WHERE id = $1`,
		} {
			requireNoRowChanged(t, db.worker, sql, id)
		}
	}
	s, _ := status(t, db.admin, done)
	require.Equal(t, batch.StatusSucceeded, s)
	var phase string
	require.NoError(t, db.admin.QueryRow(ctx, `SELECT details->>'phase' FROM ingestion_batches WHERE id = $1`, cancelled.BatchID).Scan(&phase))
	require.Equal(t, string(batch.PhaseCancelled), phase)

	for _, sql := range []string{
		`INSERT INTO ingest_seen_signatures (digest, expires_at) VALUES (sha256('x'), now() + interval '1 hour')`,
		`DELETE FROM ingest_seen_signatures`,
		`SELECT ingest_claim_signature(sha256('x'), interval '1 hour')`,
		`SELECT ingest_release_signature(sha256('x'), 'x')`,
		`INSERT INTO ingest_reconcile_checkpoints (bucket, prefix) VALUES ('b', '')`,
		`UPDATE ingest_reconcile_checkpoints SET last_run_at = now()`,
		`CREATE TABLE sneaky (i int)`,
	} {
		requireDenied(t, db.worker, sql)
	}

	// The load ledger is written with the slice, by the worker's loads.
	_, err = db.worker.Exec(ctx, `
		INSERT INTO curated.fleet_load_objects (tenant_id, source_scope, batch_id, object_key, etag, size_bytes, record_count, last_modified)
		VALUES ('t', 's', 1, 'k', 'e', 1, 1, now())`)
	require.NoError(t, err, "the worker writes the load ledger")
	_, err = db.worker.Exec(ctx, `DELETE FROM curated.fleet_load_objects WHERE tenant_id = 't'`)
	require.NoError(t, err, "and replaces it")
	// So are the load errors.
	_, err = db.worker.Exec(ctx, `
		INSERT INTO curated.fleet_load_errors (tenant_id, source_scope, batch_id, ordinal, object_key, line_number, column_number, reason, raw_excerpt)
		VALUES ('t', 's', 1, 1, 'k', 3, 2, 'r', '"x"')`)
	require.NoError(t, err, "the worker writes the load errors")
	_, err = db.worker.Exec(ctx, `DELETE FROM curated.fleet_load_errors WHERE tenant_id = 't'`)
	require.NoError(t, err, "and replaces them")
}

// TestNoLoginWritesABatchsUID: a batch's uid (migration 00100) comes from
// the column's default and no runtime login may write it, so none can
// give a batch another's identity; only the worker may move the id
// sequence forward, through ingest_advance_batch_ids, and no login may
// setval it.
func TestNoLoginWritesABatchsUID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newLogins(t)
	res := importFolder(t, newEnqueuer(t, db.door), "tenant-a", "uid-1")
	require.NotEmpty(t, res.BatchUID, "the door's receipt names the uid the default gave")
	// The same row the door may insert (Failed: an enqueue that failed),
	// refused only for naming a uid.
	const copyRow = `INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			pipeline_stage, status, details, source_scope, completed_at%s)
		SELECT company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			pipeline_stage, 'Failed', details, source_scope, now()%s
		FROM ingestion_batches WHERE id = $1`
	for _, pool := range []*pgxpool.Pool{db.door, db.operator} {
		requireDenied(t, pool, fmt.Sprintf(copyRow, ", batch_uid", ", gen_random_uuid()"), res.BatchID)
		_, err := pool.Exec(ctx, fmt.Sprintf(copyRow, "", ""), res.BatchID)
		require.NoError(t, err, "the row without a uid is one the login may insert")
	}
	for _, pool := range []*pgxpool.Pool{db.door, db.operator, db.worker} {
		requireDenied(t, pool, `UPDATE ingestion_batches SET batch_uid = gen_random_uuid() WHERE id = $1`, res.BatchID)
		requireDenied(t, pool, `SELECT setval(pg_get_serial_sequence('ingestion_batches', 'id'), 1000000)`)
	}
	for _, pool := range []*pgxpool.Pool{db.door, db.operator} {
		requireDenied(t, pool, `SELECT ingest_advance_batch_ids($1)`, int64(1000))
	}
	last, err := batch.NewStore(db.worker).AdvanceIDs(ctx, 1000)
	require.NoError(t, err)
	require.GreaterOrEqual(t, last, int64(1000))
	next := importFolder(t, newEnqueuer(t, db.door), "tenant-a", "uid-3")
	require.Greater(t, next.BatchID, int64(1000))
}
