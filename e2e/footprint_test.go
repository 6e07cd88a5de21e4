package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestWorkerConnectionFootprint: a worker at --concurrency 32 (default
// --max-conns) holds at most min(32/2, 8) + 4 = 12 connections to PostgreSQL, busy
// or idle, while it works 200 trivial folders, and works them all. The
// connections are counted at the server (pg_stat_activity of the test's
// database, every 20 ms) by an observer that is the only other session.
func TestWorkerConnectionFootprint(t *testing.T) {
	t.Parallel()
	const concurrency, folders = 32, 200
	const bound = min(concurrency/2, 8) + 4
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)

	var list []string
	for range folders {
		list = append(list, writeFolder(t, map[string]string{"_SUCCESS": "", "a.csv": "k,v\n1,2\n"}))
	}
	file := filepath.Join(t.TempDir(), "folders.txt")
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(list, "\n")+"\n"), 0o644))
	out, code := runEnqueue(t, dbURL, "import", "--tenant-id", "tenant-a", "--tenant-database", "tenant_db", "--company-id", "company-1", "--from-file", file)
	require.Equal(t, 0, code, out)
	require.Equal(t, folders, strings.Count(out, `"outcome":"enqueued"`))

	observer, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { observer.Close(context.Background()) })
	var (
		mu       sync.Mutex
		peak     int
		peakSeen string
	)
	sample := func() (conns, succeeded int) {
		var seen string
		require.NoError(t, observer.QueryRow(ctx, `
			SELECT count(*), COALESCE(string_agg(application_name || ' ' || COALESCE(state, ''), ', ' ORDER BY application_name), ''),
			       (SELECT count(*) FROM ingestion_batches WHERE status = 'Succeeded')
			FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&conns, &seen, &succeeded))
		mu.Lock()
		if conns > peak {
			peak, peakSeen = conns, seen
		}
		mu.Unlock()
		return conns, succeeded
	}

	// The enqueue process has exited; wait until its sessions are gone.
	require.Eventually(t, func() bool {
		var others int
		require.NoError(t, observer.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&others))
		return others == 0
	}, 30*time.Second, 20*time.Millisecond, "the enqueue process's sessions end")

	start := time.Now()
	w := startWorker(t, dbURL, "--concurrency", fmt.Sprint(concurrency), "--poll-interval", "200ms")
	var done int
	require.Eventually(t, func() bool {
		_, done = sample()
		return done == folders
	}, 3*time.Minute, 20*time.Millisecond, "every folder succeeds")
	elapsed := time.Since(start)
	idle := time.Now().Add(2 * time.Second) // and once the work is done
	for time.Now().Before(idle) {
		sample()
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("worker --concurrency %d: %d folders in %s (%.0f/s), peak %d connections at the server (bound %d)",
		concurrency, folders, elapsed.Round(time.Millisecond), float64(folders)/elapsed.Seconds(), peak, bound)
	t.Logf("at the peak: %s", peakSeen)
	require.LessOrEqual(t, peak, bound, "connections of one worker at --concurrency %d", concurrency)
	require.Greater(t, peak, 0, "the observer saw the worker's connections")
	require.NotContains(t, w.logs.String(), `"level":"ERROR"`)
}
