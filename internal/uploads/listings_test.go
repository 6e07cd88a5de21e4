package uploads

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestListingsSaySupersededAndNewestFailed: with a tenant token, a folder
// whose Failed batch was followed by a Succeeded re-import shows the Failed
// one superseded_by the new id (in the batch read and in the listing),
// the newest batch no superseded_by; newest=true&status=Failed lists, page
// by page, only the folders whose newest batch failed; a bad newest is 422.
func TestListingsSaySupersededAndNewestFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"), 0o600))
	tokens, err := LoadTenantTokens(path, nil)
	require.NoError(t, err)
	f := newServer(t, pool, func(c *Config) { c.TenantTokens = tokens })
	tenantAuth := map[string]string{"Authorization": "Bearer " + tokA}

	// imp imports tenant-a's folder and ends its batch in status.
	imp := func(folder, status string) int64 {
		t.Helper()
		code, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", folder)), auth)
		require.Equal(t, http.StatusAccepted, code, out)
		id := int64(out["batch_id"].(float64))
		_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET status = $2, completed_at = now() WHERE id = $1`, id, status)
		require.NoError(t, err)
		return id
	}
	xFailed := imp("up/x", "Failed")
	xSucceeded := imp("up/x", "Succeeded") // the re-import
	yFailed := imp("up/y", "Failed")
	wFailed1 := imp("up/w", "Failed")
	wFailed2 := imp("up/w", "Failed")

	read := func(id int64) map[string]any {
		t.Helper()
		code, raw := f.get(t, "/v1/batches/"+strconv.FormatInt(id, 10), tenantAuth)
		require.Equal(t, http.StatusOK, code, string(raw))
		var m map[string]any
		require.NoError(t, json.Unmarshal(raw, &m))
		return m
	}
	require.Equal(t, float64(xSucceeded), read(xFailed)["superseded_by"], "the Failed batch names the re-import")
	require.NotContains(t, read(xSucceeded), "superseded_by", "the folder's newest is superseded by none")
	require.NotContains(t, read(yFailed), "superseded_by")
	require.Equal(t, float64(wFailed2), read(wFailed1)["superseded_by"])

	list := func(query string) (int, BatchPage, map[string]any) {
		t.Helper()
		code, raw := f.get(t, "/v1/batches?"+query, tenantAuth)
		var page BatchPage
		var m map[string]any
		require.NoError(t, json.Unmarshal(raw, &page), string(raw))
		require.NoError(t, json.Unmarshal(raw, &m))
		return code, page, m
	}
	code, page, _ := list("status=Failed")
	require.Equal(t, http.StatusOK, code)
	superseded := map[int64]int64{}
	for _, b := range page.Batches {
		superseded[b.BatchID] = b.SupersededBy
	}
	require.Equal(t, map[int64]int64{wFailed2: 0, wFailed1: wFailed2, yFailed: 0, xFailed: xSucceeded}, superseded,
		"every Failed batch, the superseded ones naming their folder's newest")

	// Folders whose newest batch failed, one a page: the cursor walks them.
	var got []int64
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		code, page, _ := list("status=Failed&newest=true&limit=1&cursor=" + cursor)
		require.Equal(t, http.StatusOK, code)
		for _, b := range page.Batches {
			require.Zero(t, b.SupersededBy)
			got = append(got, b.BatchID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []int64{wFailed2, yFailed}, got, "x's newest succeeded: not listed; w's older failure neither")
	_, page, _ = list("newest=true")
	require.Len(t, page.Batches, 3, "each folder's newest once")

	code, _, m := list("newest=yes")
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Equal(t, "newest", m["field"])
}

// TestTenantAPISaysQueuePaused: a queued batch whose River job waits in a
// paused queue shows queue_paused (the queue's name) through the tenant
// API, in its read and in the listing, as enqueue status --json does; not
// once the queue is resumed.
func TestTenantAPISaysQueuePaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	tokA, lineA, err := MintTenantToken("tenant-a")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(lineA+"\n"), 0o600))
	tokens, err := LoadTenantTokens(path, nil)
	require.NoError(t, err)
	f := newServer(t, pool, func(c *Config) { c.TenantTokens = tokens })
	tenantAuth := map[string]string{"Authorization": "Bearer " + tokA}

	code, out := f.post(t, "/v1/imports", "application/json", importBody("tenant-a", tenantFolder("tenant-a", "up/q")), auth)
	require.Equal(t, http.StatusAccepted, code, out)
	id := strconv.FormatInt(int64(out["batch_id"].(float64)), 10)
	waiting := func() (string, string) {
		t.Helper()
		code, raw := f.get(t, "/v1/batches/"+id, tenantAuth)
		require.Equal(t, http.StatusOK, code, string(raw))
		var one BatchAnswer
		require.NoError(t, json.Unmarshal(raw, &one))
		code, raw = f.get(t, "/v1/batches", tenantAuth)
		require.Equal(t, http.StatusOK, code, string(raw))
		var page BatchPage
		require.NoError(t, json.Unmarshal(raw, &page))
		require.Len(t, page.Batches, 1)
		require.Equal(t, "Running", one.Status)
		return one.QueuePaused, page.Batches[0].QueuePaused
	}
	one, listed := waiting()
	require.Empty(t, one, "the queue is not paused")
	require.Empty(t, listed)

	// What River's QueuePause (the River UI's Pause) writes.
	_, err = pool.Exec(ctx, `INSERT INTO river_queue (name, created_at, updated_at, paused_at) VALUES ($1, now(), now(), now())`, jobs.Queue)
	require.NoError(t, err)
	one, listed = waiting()
	require.Equal(t, jobs.Queue, one, "the batch read names the paused queue")
	require.Equal(t, jobs.Queue, listed, "the listing too")

	_, err = pool.Exec(ctx, `UPDATE river_queue SET paused_at = NULL WHERE name = $1`, jobs.Queue)
	require.NoError(t, err)
	one, listed = waiting()
	require.Empty(t, one, "resumed")
	require.Empty(t, listed)
}
