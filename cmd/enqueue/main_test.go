package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

func runCLI(t *testing.T, dbURL string, args ...string) (string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append(args, "--database-url", dbURL, "--log-level", "error"), &stdout, &stderr)
	return stdout.String(), code
}

// phased creates a Fleet batch and drives it to the given phase and status
// the way a worker would, under a lease.
func phased(t *testing.T, pool *pgxpool.Pool, tenant string, phase batch.Phase, status batch.Status, keepLease time.Duration) batch.Batch {
	t.Helper()
	ctx := context.Background()
	store := batch.NewStore(pool)
	folder := fmt.Sprintf("s3://fleet-bucket/tenants/%s/db/c/%s", tenant, phase)
	res, err := store.Reserve(ctx, batch.Reservation{
		CompanyID: "c", TenantID: tenant, TenantDatabase: "db", SourceType: batch.SourceTypeFleetS3,
		IngestionMode: batch.IngestionModeFileUpload, PipelineStage: batch.PipelineStageFleet,
		SourceScope: "fleet_s3:" + folder, Details: batch.NewDetails(folder),
	})
	require.NoError(t, err)
	b := res.Batch
	if phase == batch.PhaseReserved {
		return b
	}
	a, err := lease.NewStore(pool).Acquire(ctx, b.ID, "worker-1/job-7/attempt-1/ab12", time.Minute)
	require.NoError(t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	d.Phase = phase
	if phase != batch.PhaseLoading && phase != batch.PhaseFailedPreCommit {
		now := time.Now()
		d.RedshiftCommitted, d.CommittedAt, d.RecordCount = true, &now, 42
	}
	switch status {
	case batch.StatusRunning:
		b, err = store.WriteDetails(ctx, a.Lease.Fence(), d)
	case batch.StatusSucceeded:
		b, err = store.MarkSucceeded(ctx, a.Lease.Fence(), d)
	case batch.StatusFailed:
		b, err = store.MarkFailed(ctx, a.Lease.Fence(), d, phase, "boom: "+string(phase))
	}
	require.NoError(t, err)
	if keepLease > 0 && status == batch.StatusRunning {
		// Shorten the term only after the write, so a loaded machine cannot
		// let it run out first.
		_, ok, err := lease.NewStore(pool).Renew(ctx, a.Lease, keepLease)
		require.NoError(t, err)
		require.True(t, ok)
		b, err = store.Get(ctx, b.ID)
		require.NoError(t, err)
	}
	return b
}

func TestStatusAndList(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)

	reserved := phased(t, pool, "tenant-a", batch.PhaseReserved, batch.StatusRunning, 0)
	loading := phased(t, pool, "tenant-a", batch.PhaseLoading, batch.StatusRunning, 0)
	publishing := phased(t, pool, "tenant-a", batch.PhasePublishing, batch.StatusRunning, 0)
	stuck := phased(t, pool, "tenant-b", batch.PhaseLoading, batch.StatusRunning, time.Microsecond)
	published := phased(t, pool, "tenant-b", batch.PhasePublished, batch.StatusSucceeded, 0)
	preCommit := phased(t, pool, "tenant-b", batch.PhaseFailedPreCommit, batch.StatusFailed, 0)
	failedPub := phased(t, pool, "tenant-c", batch.PhaseFailedPublication, batch.StatusFailed, 0)
	require.Eventually(t, func() bool { // the short lease has expired
		var expired bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT now() > $1`, *stuck.LeaseExpiresAt).Scan(&expired))
		return expired
	}, 10*time.Second, 5*time.Millisecond)

	status := func(b batch.Batch) batchView {
		t.Helper()
		out, code := runCLI(t, dbURL, "status", "--batch-id", fmt.Sprint(b.ID), "--json")
		require.Equal(t, cli.ExitOK, code, out)
		var v batchView
		require.NoError(t, json.Unmarshal([]byte(out), &v))
		require.Equal(t, b.ID, v.BatchID)
		return v
	}
	v := status(reserved)
	require.Equal(t, "Running", v.Status)
	require.Equal(t, "reserved", v.Phase)
	require.Empty(t, v.LeaseHolder)
	require.Zero(t, v.LeaseGeneration)

	v = status(loading)
	require.Equal(t, "loading", v.Phase)
	require.Equal(t, "worker-1/job-7/attempt-1/ab12", v.LeaseHolder)
	require.Equal(t, int64(1), v.LeaseGeneration)
	require.NotNil(t, v.LeaseExpiresAt)
	require.NotNil(t, v.LeaseExpiresInSeconds)
	require.Greater(t, *v.LeaseExpiresInSeconds, float64(0), "a live lease expires in the future")
	require.NotNil(t, v.LeaseRenewedAt, "the acquisition counts as the last renewal")
	require.NotNil(t, v.LeaseRenewedSecondsAgo)
	require.GreaterOrEqual(t, *v.LeaseRenewedSecondsAgo, float64(0))
	require.Less(t, *v.LeaseRenewedSecondsAgo, float64(30))
	require.False(t, v.RedshiftCommitted)

	v = status(publishing)
	require.Equal(t, "publishing", v.Phase)
	require.True(t, v.RedshiftCommitted)
	require.Equal(t, int64(42), v.RecordCount)

	v = status(stuck)
	require.Less(t, *v.LeaseExpiresInSeconds, float64(0), "an expired lease shows a negative expiry")

	v = status(published)
	require.Equal(t, "Succeeded", v.Status)
	require.Equal(t, "published", v.Phase)
	require.Empty(t, v.LeaseHolder, "terminal writes release the lease")
	require.NotNil(t, v.CompletedAt)

	v = status(preCommit)
	require.Equal(t, "failed_pre_commit", v.Phase)
	require.Equal(t, "boom: failed_pre_commit", v.LastError)
	v = status(failedPub)
	require.Equal(t, "failed_publication", v.Phase)
	require.True(t, v.RedshiftCommitted)

	// The table form has a header and the row.
	out, code := runCLI(t, dbURL, "status", "--batch-id", fmt.Sprint(loading.ID))
	require.Equal(t, cli.ExitOK, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	for _, col := range []string{"BATCH", "STATUS", "PHASE", "LEASE HOLDER", "LEASE EXPIRES IN", "GEN", "AGE"} {
		require.Contains(t, lines[0], col)
	}
	require.Contains(t, lines[1], "loading")
	require.Contains(t, lines[1], "worker-1/job-7/attempt-1/ab12")

	listIDs := func(args ...string) []int64 {
		t.Helper()
		out, code := runCLI(t, dbURL, append([]string{"list", "--json"}, args...)...)
		require.Equal(t, cli.ExitOK, code, out)
		var ids []int64
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var v batchView
			require.NoError(t, json.Unmarshal([]byte(line), &v))
			ids = append(ids, v.BatchID)
		}
		return ids
	}
	require.Equal(t, []int64{failedPub.ID, preCommit.ID, published.ID, stuck.ID, publishing.ID, loading.ID, reserved.ID}, listIDs())
	require.Equal(t, []int64{stuck.ID, publishing.ID, loading.ID, reserved.ID}, listIDs("--status", "Running"))
	require.Equal(t, []int64{stuck.ID}, listIDs("--stuck"))
	require.Equal(t, []int64{preCommit.ID, published.ID, stuck.ID}, listIDs("--tenant-id", "tenant-b"))
	require.Equal(t, []int64{failedPub.ID, preCommit.ID}, listIDs("--status", "Failed", "--limit", "5"))

	out, code = runCLI(t, dbURL, "list")
	require.Equal(t, cli.ExitOK, code)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 8, "header and seven rows")

	// Refusals.
	out, code = runCLI(t, dbURL, "status", "--batch-id", "999999")
	require.Equal(t, cli.ExitNotResumable, code)
	require.Contains(t, out, `"outcome":"not_found"`)
	_, code = runCLI(t, dbURL, "status", "--batch-id", "0")
	require.Equal(t, cli.ExitInvalidInput, code)
	_, code = runCLI(t, dbURL, "list", "--status", "Sleeping")
	require.Equal(t, cli.ExitInvalidInput, code)
	_, code = runCLI(t, dbURL, "list", "--limit", "0")
	require.Equal(t, cli.ExitInvalidInput, code)

	// Per tenant: tenant-a holds two leases (loading, publishing) and one
	// batch waits (reserved); tenant-b's only Running batch lost its lease.
	out, code = runCLI(t, dbURL, "list", "--tenants", "--json")
	require.Equal(t, cli.ExitOK, code, out)
	require.Equal(t, `{"tenant_id":"tenant-a","running":2,"waiting":1}`+"\n"+`{"tenant_id":"tenant-b","running":0,"waiting":1}`+"\n", out)
	out, code = runCLI(t, dbURL, "list", "--tenants", "--tenant-id", "tenant-b")
	require.Equal(t, cli.ExitOK, code, out)
	require.Regexp(t, `\ATENANT\s+RUNNING\s+WAITING\ntenant-b\s+0\s+1\n\z`, out)
}

// hostile is what an S3 key or an error message may carry: OSC 0 (retitle
// the terminal), CSI 2J (clear it), a C1 CSI, a bidirectional override, a
// tab and invalid UTF-8.
const hostile = "tenants/t/up/\x1b]0;pwned\x07part-\x1b[2J\u009b31m\u202egnp.csv\tx\xff: line 2: bad"

// TestTableOutputIsInert: object names and errors reach the table escaped
// and the JSON output stays JSON that decodes to the very same text, with
// no byte a terminal would act on.
func TestTableOutputIsInert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	b := phased(t, pool, "tenant-x", batch.PhaseReserved, batch.StatusRunning, 0)
	a, err := lease.NewStore(pool).Acquire(ctx, b.ID, "worker-2/job-1/attempt-1/cd34", time.Minute)
	require.NoError(t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	_, err = batch.NewStore(pool).MarkFailed(ctx, a.Lease.Fence(), d, batch.PhaseFailedPreCommit, "malformed record: "+hostile)
	require.NoError(t, err)

	requireInert := func(out string) {
		t.Helper()
		for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e", "\t", "\xff"} {
			require.NotContains(t, out, bad)
		}
	}
	// The default list cuts the error out; it stays inert.
	out, code := runCLI(t, dbURL, "list")
	require.Equal(t, cli.ExitOK, code, out)
	requireInert(out)
	for _, args := range [][]string{{"status", "--batch-id", fmt.Sprint(b.ID)}, {"list", "-o", "wide"}} {
		out, code := runCLI(t, dbURL, args...)
		require.Equal(t, cli.ExitOK, code, out)
		requireInert(out)
		require.Contains(t, out, `\x1b]0;pwned\a`, "the escape shows as text")
		require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2, "one header, one row: nothing breaks the table")

		out, code = runCLI(t, dbURL, append(args, "--json")...)
		require.Equal(t, cli.ExitOK, code, out)
		requireInert(out)
		var v batchView
		require.NoError(t, json.Unmarshal([]byte(out), &v), "JSON stays JSON")
		require.Equal(t, "malformed record: "+strings.ToValidUTF8(hostile, "\uFFFD"), v.LastError, "and means the same text")
	}

	require.Equal(t, "plain text, même accentué", inert("plain text, même accentué"), "printable text is left alone")
	require.Equal(t, `"a\x1b[2Jb"`, inert("a\x1b[2Jb"))
}

// TestStatusWatchFollowsProgressUntilTerminal: status --watch prints the
// load's progress as it changes and returns once the batch is terminal.
func TestStatusWatchFollowsProgressUntilTerminal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	store := batch.NewStore(pool)
	b := phased(t, pool, "tenant-w", batch.PhaseLoading, batch.StatusRunning, 0)
	a, err := lease.NewStore(pool).Acquire(ctx, b.ID, "other", time.Minute)
	require.NoError(t, err)
	require.Equal(t, lease.Held, a.Outcome)
	fence := batch.Fence{BatchID: b.ID, LeaseID: *b.LeaseID, Generation: b.LeaseGeneration}
	progress := func(objects, records int64) {
		t.Helper()
		cur, err := store.Get(ctx, b.ID)
		require.NoError(t, err)
		d, err := batch.ParseDetails(cur.Details)
		require.NoError(t, err)
		d.Progress = &batch.Progress{ObjectsDone: objects, ObjectsTotal: 4, RecordsDone: records, At: time.Now().UTC()}
		_, err = store.WriteDetails(ctx, fence, d)
		require.NoError(t, err)
	}
	progress(1, 100)

	var stdout, stderr testproc.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"status", "--batch-id", fmt.Sprint(b.ID), "--watch", "--interval", "100ms",
			"--database-url", dbURL, "--log-level", "error"}, &stdout, &stderr)
	}()
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "1/4 objects, 100 records") }, 30*time.Second, 10*time.Millisecond)
	progress(3, 250)
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "3/4 objects, 250 records") }, 30*time.Second, 10*time.Millisecond)
	res, err := store.Cancel(ctx, batch.CancelRequest{BatchID: b.ID, TenantID: "tenant-w", By: "ops"})
	require.NoError(t, err)
	require.Equal(t, batch.Cancelled, res.Outcome)
	select {
	case c := <-code:
		require.Equal(t, cli.ExitOK, c, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("status --watch did not return once the batch was terminal")
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	require.GreaterOrEqual(t, len(lines), 3, "one line per change (not a terminal)")
	require.Contains(t, lines[len(lines)-1], "Failed cancelled")
	require.Contains(t, lines[len(lines)-1], `last error: "cancelled by ops"`)
	sawRate := false
	for _, l := range lines {
		if strings.Contains(l, "Running loading: 3/4 objects, 250 records") {
			sawRate = true
			require.Regexp(t, `3/4 objects, 250 records, \d+ rec/s, ETA \d`, l, "the rate and ETA since the watch began")
		}
	}
	require.True(t, sawRate, "%q", lines)
}
