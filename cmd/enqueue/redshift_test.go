package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

// TestResumeProvesTheSliceInRedshift: with --warehouse redshift, resume
// reads the slice's stamp through the Data API (here its double), not from
// a local schema: a batch stamped only in Redshift resumes with it and is
// refused without it; a batch Redshift does not hold is refused
// warehouse_slice_missing. The warehouse is migrated by its owner and
// read by resume as a database user of its own, holding only the
// fleet_reader role. It sets the AWS environment, so it does not run in
// parallel.
func TestResumeProvesTheSliceInRedshift(t *testing.T) {
	ctx := context.Background()
	double := migratedRedshift(t)
	var err error

	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	stamped := phased(t, pool, "tenant-r", batch.PhaseFailedPublication, batch.StatusFailed, 0)
	missing := phased(t, pool, "tenant-s", batch.PhaseFailedPublication, batch.StatusFailed, 0)
	_, err = double.Pool.Exec(ctx, `
		INSERT INTO curated.fleet_slices (tenant_id, source_scope, batch_id, lease_generation, record_count, committed_at, published_at)
		VALUES ($1, $2, $3, $4, 42, now(), NULL)`, stamped.TenantID, stamped.Scope(), stamped.ID, stamped.LeaseGeneration)
	require.NoError(t, err)

	resume := func(b batch.Batch, extra ...string) (map[string]any, int) {
		t.Helper()
		out, code := runCLI(t, dbURL, append([]string{"resume", "--batch-id", fmt.Sprint(b.ID), "--tenant-id", b.TenantID}, extra...)...)
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		return v, code
	}
	redshiftFlags := []string{"--warehouse", "redshift", "--redshift-workgroup", "fleet", "--redshift-database", "dev", "--redshift-secret-arn", readerSecret}

	// The local warehouse (the operational database's schema curated)
	// holds no slice: without --warehouse redshift nothing proves it.
	v, code := resume(stamped)
	require.Equal(t, cli.ExitNotResumable, code, v)
	require.Equal(t, "warehouse_slice_missing", v["reason"])

	v, code = resume(missing, redshiftFlags...)
	require.Equal(t, cli.ExitNotResumable, code, v)
	require.Equal(t, "warehouse_slice_missing", v["reason"])

	v, code = resume(stamped, redshiftFlags...)
	require.Equal(t, cli.ExitOK, code, v)
	require.Equal(t, "resumed", v["outcome"])
	b, err := batch.NewStore(pool).Get(ctx, stamped.ID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusRunning, b.Status)

	// Reading a stamp needs the target only; a missing one is invalid
	// input naming the flag, and nothing is written.
	v, code = resume(missing, "--warehouse", "redshift", "--redshift-database", "dev")
	require.Equal(t, cli.ExitInvalidInput, code, v)
	require.Equal(t, "invalid_input", v["outcome"])
	require.Equal(t, "redshift_workgroup", v["field"])
	b, err = batch.NewStore(pool).Get(ctx, missing.ID)
	require.NoError(t, err)
	require.Equal(t, batch.StatusFailed, b.Status)
}

// TestStatusObjectsReadsTheLedgerInRedshift: with --warehouse redshift,
// status --objects reads the load ledger through the Data API (its
// double) as a database user holding only the fleet_reader role: the
// rows of the batch the slice is stamped with, and, for an older batch,
// slice_of_another_batch (exit 8). It sets the AWS environment, so it does
// not run in parallel.
func TestStatusObjectsReadsTheLedgerInRedshift(t *testing.T) {
	ctx := context.Background()
	double := migratedRedshift(t)

	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	older := phased(t, pool, "tenant-r", batch.PhaseFailedPreCommit, batch.StatusFailed, 0)
	b := phased(t, pool, "tenant-r", batch.PhasePublished, batch.StatusSucceeded, 0)
	require.Equal(t, older.TenantID, b.TenantID)
	// phased names a folder per phase: the older batch is pointed at b's
	// scope, which the slice is written for.
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET source_scope = $2 WHERE id = $1`, older.ID, b.Scope())
	require.NoError(t, err)
	_, err = double.Pool.Exec(ctx, `
		INSERT INTO curated.fleet_slices (tenant_id, source_scope, batch_id, lease_generation, record_count, committed_at, published_at)
		VALUES ($1, $2, $3, 1, 5, now(), now())`, b.TenantID, b.Scope(), b.ID)
	require.NoError(t, err)
	_, err = double.Pool.Exec(ctx, `
		INSERT INTO curated.fleet_load_objects (tenant_id, source_scope, batch_id, object_key, etag, size_bytes, record_count, last_modified, marker_modified)
		VALUES ($1, $2, $3, 'in/a.csv', '9e107d9d372bb6826bd81d3542a419d6', 120, 3, '2026-12-01 09:00:00.5', '2026-12-01 09:30:00'),
		       ($1, $2, $3, 'in/b.csv', '"weird"etag', 40, 2, '2026-12-01 09:01:00', '2026-12-01 09:30:00'),
		       ($1, $2, $4, 'in/old.csv', 'ffff', 1, 1, '2026-11-01 09:00:00', NULL)`, b.TenantID, b.Scope(), b.ID, older.ID)
	require.NoError(t, err)

	redshiftFlags := []string{"--warehouse", "redshift", "--redshift-workgroup", "fleet", "--redshift-database", "dev", "--redshift-secret-arn", readerSecret}
	out, code := runCLI(t, dbURL, append([]string{"status", "--batch-id", fmt.Sprint(b.ID), "--objects", "--json"}, redshiftFlags...)...)
	require.Equal(t, cli.ExitOK, code, out)
	var lv struct {
		Outcome     string `json:"outcome"`
		RecordCount int64  `json:"record_count"`
		Objects     []struct {
			BatchID        int64     `json:"batch_id"`
			ObjectKey      string    `json:"object_key"`
			ETag           string    `json:"etag"`
			SizeBytes      int64     `json:"size_bytes"`
			RecordCount    int64     `json:"record_count"`
			LastModified   time.Time `json:"last_modified"`
			MarkerModified time.Time `json:"marker_modified"`
		} `json:"objects"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &lv), out)
	require.Equal(t, "ledger", lv.Outcome)
	require.Equal(t, int64(5), lv.RecordCount)
	require.Len(t, lv.Objects, 2, "the stamped batch's rows only")
	require.Equal(t, "in/a.csv", lv.Objects[0].ObjectKey)
	require.Equal(t, "9e107d9d372bb6826bd81d3542a419d6", lv.Objects[0].ETag)
	require.Equal(t, int64(120), lv.Objects[0].SizeBytes)
	require.Equal(t, int64(3), lv.Objects[0].RecordCount)
	require.Equal(t, time.Date(2026, 12, 1, 9, 0, 0, 500_000_000, time.UTC), lv.Objects[0].LastModified)
	require.Equal(t, time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC), lv.Objects[0].MarkerModified)
	require.Equal(t, `"weird"etag`, lv.Objects[1].ETag)

	out, code = runCLI(t, dbURL, append([]string{"status", "--batch-id", fmt.Sprint(older.ID), "--objects"}, redshiftFlags...)...)
	require.Equal(t, cli.ExitNoLedger, code, out)
	require.Contains(t, out, `"outcome":"slice_of_another_batch"`)
	require.Contains(t, out, fmt.Sprintf(`"slice_batch_id":%d`, b.ID))

	// The load errors, read the same way (fleet_reader may read them):
	// the stamped batch's only, and the stamp counts them.
	_, err = double.Pool.Exec(ctx, `
		INSERT INTO curated.fleet_load_errors (tenant_id, source_scope, batch_id, ordinal, object_key, line_number, column_number, reason, raw_excerpt)
		VALUES ($1, $2, $3, 1, 'in/a.csv', 4, 2, 'NUL in a value', '"bad\x00"'),
		       ($1, $2, $4, 1, 'in/old.csv', 9, 0, 'old', '"old"')`, b.TenantID, b.Scope(), b.ID, older.ID)
	require.NoError(t, err)
	out, code = runCLI(t, dbURL, append([]string{"status", "--batch-id", fmt.Sprint(b.ID), "--errors", "--json"}, redshiftFlags...)...)
	require.Equal(t, cli.ExitOK, code, out)
	var ev struct {
		Outcome    string                `json:"outcome"`
		BadRecords int64                 `json:"bad_records"`
		Errors     []warehouse.LoadError `json:"errors"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ev), out)
	require.Equal(t, "load_errors", ev.Outcome)
	require.Equal(t, int64(1), ev.BadRecords)
	require.Equal(t, []warehouse.LoadError{{BatchID: b.ID, TenantID: b.TenantID, SourceScope: b.Scope(), Ordinal: 1,
		ObjectKey: "in/a.csv", Line: 4, Column: 2, Reason: "NUL in a value", Excerpt: `"bad\x00"`}}, ev.Errors)
	out, code = runCLI(t, dbURL, append([]string{"status", "--batch-id", fmt.Sprint(b.ID), "--objects", "--json"}, redshiftFlags...)...)
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, `"bad_records":1`)
}

// The Data API identities of the Redshift tests: the schema's owner, and a
// user holding only fleet_reader, as enqueue's commands read.
const (
	ownerSecret  = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fleet-admin-AbCdEf"
	readerSecret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fleet-enqueue-AbCdEf"
)

// migratedRedshift starts a Data API double (with an S3 server), points
// this process's AWS environment at both, and migrates the warehouse as
// its owner. The environment is the process's, so its tests do not run in
// parallel.
func migratedRedshift(t *testing.T) *redshifttest.Double {
	t.Helper()
	srv := s3test.Start(t)
	double := redshifttest.Start(t, redshifttest.Options{DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: srv.Client(), Workgroup: "fleet", Database: "dev",
		Identities: map[string]redshifttest.Identity{
			redshifttest.IdentityKey(ownerSecret, "", ""):  {User: "fleet_admin", Owner: true},
			redshifttest.IdentityKey(readerSecret, "", ""): {User: "fleet_enqueue", Roles: []string{"fleet_reader"}},
		}})
	for _, kv := range append(srv.Env(), double.Env()...) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	migrator, err := redshift.OpenMigrator(context.Background(), redshift.Config{WorkgroupName: "fleet", Database: "dev", SecretARN: ownerSecret})
	require.NoError(t, err)
	_, err = migrator.Migrate(context.Background())
	require.NoError(t, err)
	return double
}
