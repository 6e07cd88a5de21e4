package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// rows counts what an import or a retry writes: batches and River jobs.
func rows(t *testing.T, pool *pgxpool.Pool) (batches, jobs int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM ingestion_batches), (SELECT count(*) FROM river_job)`).Scan(&batches, &jobs))
	return batches, jobs
}

// invalidLine parses the one invalid_input line of a refused command.
func invalidLine(t *testing.T, out string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1, out)
	var m map[string]string
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &m), out)
	require.Equal(t, "invalid_input", m["outcome"], out)
	return m
}

// TestImportChecksTheFolderAgainstItsTenant: enqueue import applies enqueue
// serve's rule (--path-pattern, --bucket): an s3:// folder whose path names
// another tenant, database or company, or of a bucket not accepted, is
// refused with the invalid_input line naming the field, exit 2, and
// nothing written (no batch, no job); the folder of its own tenant is
// imported; file:// folders stay the command line's (development).
func TestImportChecksTheFolderAgainstItsTenant(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	as := func(tenant, database, company, folder string, extra ...string) []string {
		return append([]string{"import", "--tenant-id", tenant, "--tenant-database", database, "--company-id", company, "--folder", folder}, extra...)
	}
	const victim = "s3://fleet-uploads/tenants/victim/vdb/vc/up-1"
	for name, tt := range map[string]struct {
		args          []string
		field, reason string
	}{
		"another tenant":    {as("attacker", "vdb", "vc", victim), "tenant_id", `the folder's path names tenant_id "victim", the request "attacker"`},
		"another database":  {as("victim", "adb", "vc", victim), "tenant_database", `names tenant_database "vdb"`},
		"another company":   {as("victim", "vdb", "ac", victim), "company_id", `names company_id "vc"`},
		"off the pattern":   {as("victim", "vdb", "vc", "s3://fleet-uploads/victim/vdb/vc/up-1"), "folder", "folder is not mapped to a tenant"},
		"bucket not listed": {as("victim", "vdb", "vc", "s3://other-bkt/tenants/victim/vdb/vc/up-1", "--bucket", "fleet-uploads"), "folder", `bucket "other-bkt" is not accepted`},
		"another pattern":   {as("victim", "vdb", "vc", victim, "--path-pattern", "uploads/{company_id}/{tenant_id}/{tenant_database}/"), "folder", "does not match"},
		"bad pattern":       {as("victim", "vdb", "vc", victim, "--path-pattern", "tenants/{tenant_id}/"), "path_pattern", "must contain {tenant_database}"},
		"bad bucket flag":   {as("victim", "vdb", "vc", victim, "--bucket", "Not_A_Bucket"), "bucket", "bucket name"},
	} {
		out, code := runCLI(t, dbURL, tt.args...)
		require.Equal(t, cli.ExitInvalidInput, code, "%s: %s", name, out)
		l := invalidLine(t, out)
		require.Equal(t, tt.field, l["field"], "%s: %s", name, out)
		require.Contains(t, l["error"], tt.reason, name)
		b, j := rows(t, pool)
		require.Zero(t, b, "%s: no batch written", name)
		require.Zero(t, j, "%s: no job written", name)
	}

	// The folder of its own tenant, of a listed bucket; under another
	// pattern, the folder that pattern maps.
	out, code := runCLI(t, dbURL, as("victim", "vdb", "vc", victim, "--bucket", "fleet-uploads")...)
	require.Equal(t, cli.ExitOK, code, out)
	out, code = runCLI(t, dbURL, as("acme", "adb", "ac", "s3://fleet-uploads/uploads/ac/acme/adb/x",
		"--path-pattern", "uploads/{company_id}/{tenant_id}/{tenant_database}/")...)
	require.Equal(t, cli.ExitOK, code, out)
	// A file:// folder: the command line's, as the request's tenant.
	out, code = runCLI(t, dbURL, as("attacker", "adb", "ac", "file://"+t.TempDir(), "--bucket", "fleet-uploads")...)
	require.Equal(t, cli.ExitOK, code, out)
	b, j := rows(t, pool)
	require.Equal(t, 3, b)
	require.Equal(t, 3, j)
}

// TestImportMappingFlagsReadServesVariables: PATH_PATTERN and
// ACCEPTED_BUCKETS, the variables enqueue serve reads, set the rule of
// enqueue import too.
func TestImportMappingFlagsReadServesVariables(t *testing.T) {
	// Not parallel: it sets the environment.
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	t.Setenv("ACCEPTED_BUCKETS", "fleet-uploads")
	t.Setenv("PATH_PATTERN", "in/{tenant_id}/{tenant_database}/{company_id}/")
	args := func(folder string) []string {
		return []string{"import", "--tenant-id", "acme", "--tenant-database", "adb", "--company-id", "ac", "--folder", folder}
	}
	out, code := runCLI(t, dbURL, args("s3://other-bkt/in/acme/adb/ac/x")...)
	require.Equal(t, cli.ExitInvalidInput, code, out)
	require.Contains(t, invalidLine(t, out)["error"], `bucket "other-bkt" is not accepted`)
	out, code = runCLI(t, dbURL, args("s3://fleet-uploads/tenants/acme/adb/ac/x")...)
	require.Equal(t, cli.ExitInvalidInput, code, out)
	require.Contains(t, invalidLine(t, out)["error"], `does not match "in/{tenant_id}/{tenant_database}/{company_id}/"`)
	b, _ := rows(t, pool)
	require.Zero(t, b)
	out, code = runCLI(t, dbURL, args("s3://fleet-uploads/in/acme/adb/ac/x")...)
	require.Equal(t, cli.ExitOK, code, out)
}

// TestImportFromFileChecksEveryLine: --from-file applies the rule line by
// line: a folder naming another tenant answers invalid_input in its place
// and is not imported, the others are, and the command exits 2.
func TestImportFromFileChecksEveryLine(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	file := filepath.Join(t.TempDir(), "folders.txt")
	require.NoError(t, os.WriteFile(file, []byte(strings.Join([]string{
		"s3://fleet-uploads/tenants/acme/adb/ac/1",
		"s3://fleet-uploads/tenants/victim/vdb/vc/2",
		"s3://other-bkt/tenants/acme/adb/ac/3",
		"s3://fleet-uploads/tenants/acme/adb/ac/4",
	}, "\n")+"\n"), 0o600))
	out, code := runCLI(t, dbURL, "import", "--tenant-id", "acme", "--tenant-database", "adb", "--company-id", "ac", "--from-file", file, "--bucket", "fleet-uploads")
	require.Equal(t, cli.ExitInvalidInput, code, out)
	var got []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		got = append(got, m)
	}
	require.Len(t, got, 4, out)
	require.Equal(t, "enqueued", got[0]["outcome"])
	require.Equal(t, "invalid_input", got[1]["outcome"])
	require.Equal(t, "tenant_id", got[1]["field"])
	require.Equal(t, "invalid_input", got[2]["outcome"])
	require.Contains(t, got[2]["error"], "is not accepted")
	require.Equal(t, "enqueued", got[3]["outcome"])
	var scopes []string
	rs, err := pool.Query(context.Background(), `SELECT source_scope FROM ingestion_batches ORDER BY id`)
	require.NoError(t, err)
	for rs.Next() {
		var s string
		require.NoError(t, rs.Scan(&s))
		scopes = append(scopes, s)
	}
	require.NoError(t, rs.Err())
	require.Equal(t, []string{"fleet_s3:s3://fleet-uploads/tenants/acme/adb/ac/1", "fleet_s3:s3://fleet-uploads/tenants/acme/adb/ac/4"}, scopes)
}

// TestRetryChecksTheBatchFolderAgainstItsTenant: a batch another door (or
// the table owner) let through, whose folder names another tenant, or
// whose bucket is not accepted, is not retried from the command line:
// exit 2, the refusal logged as the operator action, no new batch or job.
func TestRetryChecksTheBatchFolderAgainstItsTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	failed := func(tenant, folder string) batch.Batch {
		t.Helper()
		store := batch.NewStore(pool)
		res, err := store.Reserve(ctx, batch.Reservation{
			CompanyID: "vc", TenantID: tenant, TenantDatabase: "vdb", SourceType: batch.SourceTypeFleetS3,
			IngestionMode: batch.IngestionModeFileUpload, PipelineStage: batch.PipelineStageFleet,
			SourceScope: "fleet_s3:" + folder, Details: batch.NewDetails(folder),
		})
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE ingestion_batches SET status = 'Failed', completed_at = now(),
			details = jsonb_set(details, '{phase}', '"failed_pre_commit"') WHERE id = $1`, res.Batch.ID)
		require.NoError(t, err)
		return res.Batch
	}
	cross := failed("attacker", "s3://fleet-uploads/tenants/victim/vdb/vc/up-1/")
	offList := failed("victim", "s3://other-bkt/tenants/victim/vdb/vc/up-2/")
	own := failed("victim", "s3://fleet-uploads/tenants/victim/vdb/vc/up-3/")
	before, jobsBefore := rows(t, pool)

	retry := func(b batch.Batch) (string, int, []map[string]any) {
		return operatorLines(t, dbURL, "retry", "--batch-id", fmt.Sprint(b.ID), "--tenant-id", b.TenantID, "--bucket", "fleet-uploads", "--by", "alice")
	}
	for _, c := range []struct {
		b    batch.Batch
		want string
	}{{cross, `names tenant_id "victim"`}, {offList, `bucket "other-bkt" is not accepted`}} {
		b, want := c.b, c.want
		out, code, lines := retry(b)
		require.Equal(t, cli.ExitInvalidInput, code, out)
		l := invalidLine(t, out)
		require.Contains(t, l["error"], fmt.Sprintf("batch %d cannot be retried: ", b.ID))
		require.Contains(t, l["error"], want)
		require.Len(t, lines, 1, "the refused retry is an operator action line")
		require.Equal(t, "invalid_input", lines[0]["outcome"])
		require.Regexp(t, `^cli:`, lines[0]["by"])
		require.Contains(t, lines[0]["note"], "says alice")
		require.Contains(t, lines[0]["refusal"], want)
		after, jobsAfter := rows(t, pool)
		require.Equal(t, before, after, "no batch written")
		require.Equal(t, jobsBefore, jobsAfter, "no job written")
	}
	out, code, _ := retry(own)
	require.Equal(t, cli.ExitOK, code, out)
	var res map[string]any
	require.NoError(t, json.NewDecoder(bytes.NewBufferString(out)).Decode(&res))
	require.Equal(t, "enqueued", res["outcome"])
	require.Equal(t, float64(own.ID), res["retry_of"])
}
