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
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestStatusAndListLinkJobsAndRetries: status and list (text and --json)
// show a batch's River job ids and the batches it retries and that retry
// it, so the runbook's "retry the job of the batch" can be followed from
// their output.
func TestStatusAndListLinkJobsAndRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)

	result := func(out string) map[string]any {
		t.Helper()
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &m), out)
		return m
	}
	out, code := runCLI(t, dbURL, "import", "--tenant-id", "tenant-l", "--tenant-database", "db", "--company-id", "c", "--folder", "s3://fleet-bucket/tenants/tenant-l/db/c/l-1")
	require.Equal(t, cli.ExitOK, code, out)
	first := result(out)
	firstID, firstJob := int64(first["batch_id"].(float64)), int64(first["job_id"].(float64))

	// The batch fails before its commit, as a worker would record it.
	store := batch.NewStore(pool)
	a, err := lease.NewStore(pool).Acquire(ctx, firstID, "worker-1/job-1/attempt-1/aa", time.Minute)
	require.NoError(t, err)
	b, err := store.Get(ctx, firstID)
	require.NoError(t, err)
	d, err := batch.ParseDetails(b.Details)
	require.NoError(t, err)
	_, err = store.MarkFailed(ctx, a.Lease.Fence(), d, batch.PhaseFailedPreCommit, "bad record")
	require.NoError(t, err)

	out, code = runCLI(t, dbURL, "retry", "--batch-id", fmt.Sprint(firstID), "--tenant-id", "tenant-l")
	require.Equal(t, cli.ExitOK, code, out)
	retry := result(out)
	retryID, retryJob := int64(retry["batch_id"].(float64)), int64(retry["job_id"].(float64))
	require.NotEqual(t, firstJob, retryJob)

	status := func(id int64) batchView {
		t.Helper()
		out, code := runCLI(t, dbURL, "status", "--batch-id", fmt.Sprint(id), "--json")
		require.Equal(t, cli.ExitOK, code, out)
		var v batchView
		require.NoError(t, json.Unmarshal([]byte(out), &v))
		require.Contains(t, out, `"river_jobs":[{"job_id":`, "the JSON key names the job")
		return v
	}
	v := status(firstID)
	require.Len(t, v.RiverJobs, 1)
	require.Equal(t, firstJob, v.RiverJobs[0].JobID)
	require.Equal(t, "available", v.RiverJobs[0].State, "no worker ran it here")
	require.Equal(t, []int64{retryID}, v.RetriedBy)
	require.Zero(t, v.RetryOf)
	require.Equal(t, retryID, v.SupersededBy, "the failure is superseded by the folder's newest batch, as the door says")
	v = status(retryID)
	require.Len(t, v.RiverJobs, 1)
	require.Equal(t, retryJob, v.RiverJobs[0].JobID)
	require.Equal(t, firstID, v.RetryOf)
	require.Empty(t, v.RetriedBy)
	require.Zero(t, v.SupersededBy, "the newest is superseded by none")

	// list --json carries the same links.
	out, code = runCLI(t, dbURL, "list", "--json", "--tenant-id", "tenant-l")
	require.Equal(t, cli.ExitOK, code, out)
	byID := map[int64]batchView{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var lv batchView
		require.NoError(t, json.Unmarshal([]byte(line), &lv))
		byID[lv.BatchID] = lv
	}
	require.Equal(t, []int64{retryID}, byID[firstID].RetriedBy)
	require.Equal(t, retryID, byID[firstID].SupersededBy)
	require.Equal(t, firstJob, byID[firstID].RiverJobs[0].JobID)
	require.Equal(t, firstID, byID[retryID].RetryOf)
	require.Equal(t, retryJob, byID[retryID].RiverJobs[0].JobID)

	// And the tables.
	for _, args := range [][]string{{"list", "--tenant-id", "tenant-l", "-o", "wide"}, {"status", "--batch-id", fmt.Sprint(firstID)}} {
		out, code = runCLI(t, dbURL, args...)
		require.Equal(t, cli.ExitOK, code, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Contains(t, lines[0], "RIVER JOBS")
		require.Contains(t, lines[0], "RETRY")
		require.Contains(t, out, fmt.Sprintf("%d:available", firstJob))
		require.Contains(t, out, fmt.Sprintf("by %d", retryID))
	}
	out, code = runCLI(t, dbURL, "status", "--batch-id", fmt.Sprint(retryID))
	require.Equal(t, cli.ExitOK, code, out)
	require.Contains(t, out, fmt.Sprintf("%d:available", retryJob))
	require.Contains(t, out, fmt.Sprintf("of %d", firstID))
}

// screen is a minimal terminal of a fixed width: characters, carriage
// return, newline, ESC[K (erase to the end of the line) and automatic
// wrapping at the last column, as xterm and tmux do.
type screen struct {
	width    int
	rows     [][]rune
	row, col int
}

func (s *screen) write(out string) {
	r := []rune(out)
	for i := 0; i < len(r); i++ {
		for len(s.rows) <= s.row {
			s.rows = append(s.rows, nil)
		}
		switch {
		case r[i] == '\r':
			s.col = 0
		case r[i] == '\n':
			s.row, s.col = s.row+1, 0
		case r[i] == '\x1b' && i+2 < len(r) && r[i+1] == '[' && r[i+2] == 'K':
			if s.col < len(s.rows[s.row]) {
				s.rows[s.row] = s.rows[s.row][:s.col]
			}
			i += 2
		default:
			if s.col == s.width { // pending wrap
				s.row, s.col = s.row+1, 0
				for len(s.rows) <= s.row {
					s.rows = append(s.rows, nil)
				}
			}
			line := s.rows[s.row]
			for len(line) <= s.col {
				line = append(line, ' ')
			}
			line[s.col] = r[i]
			s.rows[s.row] = line
			s.col++
		}
	}
}

func (s *screen) used() int {
	n := 0
	for _, r := range s.rows {
		if strings.TrimSpace(string(r)) != "" {
			n++
		}
	}
	return n
}

// TestWatchRedrawFitsAnEightyColumnTerminal: redrawing status --watch's
// line in an 80-column terminal keeps it on one screen line, whatever its
// length, so no stale wrapped half is left behind; without the cut the
// same redraws leave one.
func TestWatchRedrawFitsAnEightyColumnTerminal(t *testing.T) {
	t.Parallel()
	objects, total, records := int64(1200), int64(4000), int64(9_000_000)
	renewed, expires, rate, eta := 0.4, 14.6, 51234.0, 4123.0
	v := batchView{
		BatchID: 123456, Status: "Running", Phase: "loading", ObjectsDone: &objects, ObjectsTotal: &total, RecordsDone: &records,
		RecordsPerSecond: &rate, ETASeconds: &eta, LeaseRenewedSecondsAgo: &renewed, LeaseExpiresInSeconds: &expires,
		LeaseHolder: "worker-7/job-9/attempt-1/abcd", AgeSeconds: 3600,
	}
	line := progressLine(v)
	require.Greater(t, len(line), 80, "the line is longer than the terminal: %q", line)
	require.Contains(t, line, "51234 rec/s, ETA 1h8m43s")

	fitted := &screen{width: 80}
	for i := range 5 {
		objects = int64(1200 + i)
		fitted.write(redraw(progressLine(v), 80))
	}
	fitted.write("\n")
	require.Equal(t, 1, fitted.used(), "one line on the screen: %q", fitted.rows)
	require.LessOrEqual(t, len([]rune(string(fitted.rows[0]))), 79)
	require.True(t, strings.HasSuffix(string(fitted.rows[0]), "…"), "a cut line says so")

	uncut := &screen{width: 80}
	for range 5 {
		uncut.write("\r\x1b[K" + progressLine(v))
	}
	require.Greater(t, uncut.used(), 1, "the uncut line wraps and leaves its first half behind")

	require.Equal(t, "\r\x1b[Kshort", redraw("short", 80), "a line that fits is left whole")
}

// TestWatchEstimatesRateAndETA: the rate is the records loaded since the
// first progress seen, over the worker's progress times; the ETA the
// objects left at the objects' rate; a load that starts over starts a new
// estimate.
func TestWatchEstimatesRateAndETA(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(objects, records int64, after time.Duration) batchView {
		total, at := int64(10), t0.Add(after)
		return batchView{Status: "Running", ObjectsDone: &objects, ObjectsTotal: &total, RecordsDone: &records, ProgressAt: &at}
	}
	var m rateMeter
	v := at(2, 1000, 0)
	m.estimate(&v)
	require.Nil(t, v.RecordsPerSecond, "one sample: no rate yet")
	v = at(4, 3000, 10*time.Second)
	m.estimate(&v)
	require.InDelta(t, 200, *v.RecordsPerSecond, 1e-9)
	require.InDelta(t, 30, *v.ETASeconds, 1e-9, "6 objects left at 0.2 objects/s")
	require.Contains(t, progressLine(v), "200 rec/s, ETA 30s")

	v = at(1, 100, 20*time.Second) // delivered again: started over
	m.estimate(&v)
	require.Nil(t, v.RecordsPerSecond)
	v = at(2, 600, 25*time.Second)
	m.estimate(&v)
	require.InDelta(t, 100, *v.RecordsPerSecond, 1e-9)
	require.InDelta(t, 40, *v.ETASeconds, 1e-9)
}

// TestStatusAndListSayTheQueueIsPaused: a Running batch whose job waits
// in a paused River queue is shown so — status's table and note, list's
// phase, queue_paused in the JSON — and no longer once the queue is
// resumed; a batch whose job is not waiting is never marked.
func TestStatusAndListSayTheQueueIsPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)

	importOne := func(folder string) int64 {
		t.Helper()
		out, code := runCLI(t, dbURL, "import", "--tenant-id", "tenant-p", "--tenant-database", "db", "--company-id", "c", "--folder", folder)
		require.Equal(t, cli.ExitOK, code, out)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &m), out)
		return int64(m["batch_id"].(float64))
	}
	waiting := importOne("s3://fleet-bucket/tenants/tenant-p/db/c/p/1/")
	running := importOne("s3://fleet-bucket/tenants/tenant-p/db/c/p/2/")
	_, err := pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE args @> jsonb_build_object('batch_id', $1::bigint)`, running)
	require.NoError(t, err)

	status := func(id int64, args ...string) string {
		t.Helper()
		out, code := runCLI(t, dbURL, append([]string{"status", "--batch-id", fmt.Sprint(id)}, args...)...)
		require.Equal(t, cli.ExitOK, code, out)
		return out
	}
	require.NotContains(t, status(waiting), "paused", "no queue is paused yet")

	// Paused as River's QueuePause (the River UI's Pause) records it.
	_, err = pool.Exec(ctx, `INSERT INTO river_queue (name, created_at, paused_at, updated_at) VALUES ('fleet_ingest', now(), now(), now())
		ON CONFLICT (name) DO UPDATE SET paused_at = now()`)
	require.NoError(t, err)
	out := status(waiting)
	require.Contains(t, out, "reserved (queue paused)")
	require.Contains(t, out, "waiting: River queue fleet_ingest is paused")
	var v batchView
	require.NoError(t, json.Unmarshal([]byte(status(waiting, "--json")), &v))
	require.Equal(t, "fleet_ingest", v.QueuePaused)
	require.Equal(t, "fleet_ingest", v.RiverJobs[0].Queue)
	var rv batchView
	require.NoError(t, json.Unmarshal([]byte(status(running, "--json")), &rv))
	require.Empty(t, rv.QueuePaused, "a running job is not waiting for the queue")
	require.NotContains(t, status(running), "paused")

	out, code := runCLI(t, dbURL, "list", "--tenant-id", "tenant-p")
	require.Equal(t, cli.ExitOK, code, out)
	marked := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "queue paused") {
			marked++
			require.True(t, strings.HasPrefix(line, fmt.Sprint(waiting)+" "), "only the waiting batch is marked: %q", line)
		}
	}
	require.Equal(t, 1, marked, out)

	// Resumed: nothing said.
	_, err = pool.Exec(ctx, `UPDATE river_queue SET paused_at = NULL WHERE name = 'fleet_ingest'`)
	require.NoError(t, err)
	require.NotContains(t, status(waiting), "paused")
}

// TestListNewestKeepsFoldersWhoseNewestFailed: list --tenant-id --newest
// --status Failed lists the folders whose newest batch failed, not a
// failure a later import of its folder superseded (shown by list --status
// Failed with superseded_by), as GET /v1/batches?newest=true does.
func TestListNewestKeepsFoldersWhoseNewestFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	imp := func(folder, status string) int64 {
		t.Helper()
		out, code := runCLI(t, dbURL, "import", "--tenant-id", "tenant-n", "--tenant-database", "db", "--company-id", "c", "--folder", "s3://fleet-bucket/tenants/tenant-n/db/c/"+folder)
		require.Equal(t, cli.ExitOK, code, out)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &m), out)
		id := int64(m["batch_id"].(float64))
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = $2, completed_at = now() WHERE id = $1`, id, status)
		require.NoError(t, err)
		return id
	}
	fixed := imp("a", "Failed")
	fixer := imp("a", "Succeeded")
	broken := imp("b", "Failed")

	list := func(args ...string) map[int64]batchView {
		t.Helper()
		out, code := runCLI(t, dbURL, append([]string{"list", "--json", "--tenant-id", "tenant-n", "--status", "Failed"}, args...)...)
		require.Equal(t, cli.ExitOK, code, out)
		got := map[int64]batchView{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var v batchView
			require.NoError(t, json.Unmarshal([]byte(line), &v), line)
			if v.BatchID != 0 {
				got[v.BatchID] = v
			}
		}
		return got
	}
	all := list()
	require.Len(t, all, 2)
	require.Equal(t, fixer, all[fixed].SupersededBy)
	require.Zero(t, all[broken].SupersededBy)
	newest := list("--newest")
	require.Len(t, newest, 1, "only the folder whose newest batch failed")
	require.Contains(t, newest, broken)
}
