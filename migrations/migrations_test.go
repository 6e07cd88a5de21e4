package migrations_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/migrations"
)

// TestUpgradeFromBaselineKeepsExistingBatches starts from a database at the
// baseline that already holds date-scoped batches and applies the rest.
func TestUpgradeFromBaselineKeepsExistingBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewDatabaseURLAt(t, 1))

	_, err := pool.Exec(ctx, `
		INSERT INTO ingestion_batches
			(company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			 business_date, pipeline_stage, status, is_current, details)
		VALUES
			('c1', 'tenant-a', 'db_a', 'Api', 'BrinkPos', '2026-01-02', 'brink_raw', 'Succeeded', true,  '{"rows": 10}'),
			('c1', 'tenant-a', 'db_a', 'Cdc', 'KdsCdc',   '2026-01-02', 'kds_cdc',   'Running',   false, '{}'),
			('c2', 'tenant-b', 'db_b', 'Api', 'BrinkPos', NULL,         'brink_raw', 'Failed',    false, '{"error": "x"}')`)
	require.NoError(t, err)
	type row struct {
		ID                                             int64
		Company, Tenant, Database, Mode, Source, Stage string
		Status                                         string
		Current                                        bool
		Details                                        string
	}
	read := func() []row {
		rows, err := pool.Query(ctx, `
			SELECT id, company_id, tenant_id, tenant_database, ingestion_mode, source_type,
			       pipeline_stage, status, is_current, details::text
			FROM ingestion_batches ORDER BY id`)
		require.NoError(t, err)
		defer rows.Close()
		var out []row
		for rows.Next() {
			var r row
			require.NoError(t, rows.Scan(&r.ID, &r.Company, &r.Tenant, &r.Database, &r.Mode, &r.Source, &r.Stage, &r.Status, &r.Current, &r.Details))
			out = append(out, r)
		}
		require.NoError(t, rows.Err())
		return out
	}
	before := read()
	require.Len(t, before, 3)

	report, err := migrations.Apply(ctx, pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.NotEmpty(t, report.Project)
	require.Equal(t, int64(2), report.Project[0].Version)
	require.NotEmpty(t, report.River, "River's tables come with the same command")

	require.Equal(t, before, read(), "existing rows are intact")
	var nonNull, nonZeroGen int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE source_scope IS NOT NULL OR execution_lease_id IS NOT NULL OR execution_lease_expires_at IS NOT NULL),
		       count(*) FILTER (WHERE execution_lease_generation <> 0)
		FROM ingestion_batches`).Scan(&nonNull, &nonZeroGen))
	require.Zero(t, nonNull, "new columns are NULL on existing rows")
	require.Zero(t, nonZeroGen)

	var indexDef string
	require.NoError(t, pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE indexname = 'ux_ingestion_batches_running_scope'`).Scan(&indexDef))
	require.Contains(t, indexDef, "UNIQUE")
	require.Contains(t, indexDef, "(tenant_id, source_scope)")
	require.Contains(t, indexDef, "WHERE (((status)::text = 'Running'::text) AND (source_scope IS NOT NULL))")

	// Applying again is a no-op.
	again, err := migrations.Apply(ctx, pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Empty(t, again.Project)
	require.Empty(t, again.River)
	v, err := migrations.Version(ctx, stdlib.OpenDBFromPool(pool))
	require.NoError(t, err)
	latest, err := migrations.Latest()
	require.NoError(t, err)
	require.Equal(t, latest, v)

	// No operational table other than River's and goose's was added;
	// ingest_seen_signatures holds replay records of enqueue serve's
	// authentication (digests and expiries), ingest_reconcile_checkpoints
	// where enqueue reconcile --every resumes its listing, ingest_sweeps
	// when the lease sweeper last ran, ingest_operator_actions the
	// operators' audit (who did what to batches and queues, append-only):
	// none is batch state.
	var tables []string
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename NOT LIKE 'river%' ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.Equal(t, []string{"ingest_operator_actions", "ingest_reconcile_checkpoints", "ingest_schema_migrations", "ingest_seen_signatures", "ingest_sweeps", "ingestion_batches"}, tables)
}

func TestConcurrentApplyIsSafe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewDatabaseURLAt(t, 1))
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := migrations.Apply(ctx, pool, slog.New(slog.DiscardHandler))
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	v, err := migrations.Version(ctx, stdlib.OpenDBFromPool(pool))
	require.NoError(t, err)
	latest, err := migrations.Latest()
	require.NoError(t, err)
	require.Equal(t, latest, v)
}

// TestLeaseTrailMovesOutOfDetails upgrades a database whose batches carry
// the lease trail in their details (as before migration 30): the trail moves
// to execution_lease_terms, every term closed but the one a batch still
// holds, and leaves the details documents, which keep everything else.
func TestLeaseTrailMovesOutOfDetails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewDatabaseURLAt(t, 3))
	insert := func(status, details string, leaseID *string, generation int64) int64 {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `
			INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage,
			                               status, details, source_scope, execution_lease_id, execution_lease_expires_at, execution_lease_generation)
			VALUES ('c', 't', 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', $1, $2::jsonb, 'fleet_s3:s3://b/' || ($2::jsonb->>'phase'),
			        $3::text, CASE WHEN $3::text IS NOT NULL THEN now() + interval '1 minute' END, $4)
			RETURNING id`, status, details, leaseID, generation).Scan(&id))
		return id
	}
	holder := "b"
	doneDetails := `{"version":1,"phase":"published","writes":[],"leases":[
		{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","renewals":3}]}`
	done := insert("Succeeded", doneDetails, nil, 1)
	released := insert("Running", `{"version":1,"phase":"publishing","writes":[],"leases":[
		{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","renewals":3},
		{"leaseId":"b","generation":2,"at":"2026-11-30T10:00:40Z","expiresAt":"2026-11-30T10:01:10Z","releasedAt":"2026-11-30T10:00:50Z"}]}`, nil, 2)
	held := insert("Running", `{"version":1,"phase":"loading","leases":[
		{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z"},
		{"leaseId":"b","generation":2,"at":"2026-11-30T10:00:40Z","expiresAt":"2026-11-30T10:01:10Z","renewals":1}]}`, &holder, 2)
	untouched := insert("Running", `{"version":99,"phase":"future"}`, nil, 0)

	_, err := migrations.Apply(ctx, pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	read := func(id int64) (details, terms string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT details::text, execution_lease_terms::text FROM ingestion_batches WHERE id = $1`, id).Scan(&details, &terms))
		return details, terms
	}
	// A finished batch keeps its trail in details as history (rewriting
	// every finished row would lock a large table for as long); it still
	// parses.
	d, terms := read(done)
	require.JSONEq(t, doneDetails, d)
	require.Equal(t, `[]`, terms)
	_, err = batch.ParseDetails([]byte(d))
	require.NoError(t, err)
	// A Running batch's trail moves: every term closed when none is held.
	d, terms = read(released)
	require.JSONEq(t, `{"version":1,"phase":"publishing","writes":[]}`, d)
	require.JSONEq(t, `[
		{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","closed":true},
		{"leaseId":"b","generation":2,"at":"2026-11-30T10:00:40Z","expiresAt":"2026-11-30T10:01:10Z","releasedAt":"2026-11-30T10:00:50Z","closed":true}]`, terms)
	d, terms = read(held)
	require.JSONEq(t, `{"version":1,"phase":"loading"}`, d)
	require.JSONEq(t, `[
		{"leaseId":"a","generation":1,"at":"2026-11-30T10:00:00Z","expiresAt":"2026-11-30T10:00:30Z","closed":true},
		{"leaseId":"b","generation":2,"at":"2026-11-30T10:00:40Z","expiresAt":"2026-11-30T10:01:10Z","closed":false}]`, terms,
		"the term still held stays open: its live expiry is the row's")
	d, terms = read(untouched)
	require.JSONEq(t, `{"version":99,"phase":"future"}`, d)
	require.Equal(t, `[]`, terms)
}

func TestHashIsStable(t *testing.T) {
	t.Parallel()
	a, err := migrations.Hash()
	require.NoError(t, err)
	b, err := migrations.Hash()
	require.NoError(t, err)
	require.Equal(t, a, b)
	require.Len(t, a, 64)
}

func TestRedshiftWarehouseMigrations(t *testing.T) {
	t.Parallel()
	ms, err := migrations.RedshiftWarehouse()
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	require.Equal(t, int64(1), ms[0].Version)
	require.Equal(t, "00001_curated_fleet.sql", ms[0].Name)
	require.Len(t, ms[0].Statements, 5)
	require.Equal(t, "CREATE SCHEMA IF NOT EXISTS curated", ms[0].Statements[0])
	records := ms[0].Statements[1]
	require.Contains(t, records, "CREATE TABLE IF NOT EXISTS curated.fleet_records")
	require.Contains(t, records, "record           SUPER")
	require.Contains(t, records, "DISTKEY (tenant_id)")
	require.Contains(t, records, "COMPOUND SORTKEY (tenant_id, source_scope, batch_id)")
	for _, m := range ms {
		for _, s := range m.Statements {
			require.NotContains(t, s, "--", "comments are dropped")
			require.False(t, strings.HasSuffix(s, ";"))
		}
	}
}
