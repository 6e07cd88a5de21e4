package batch_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// newerKeys is a details document of this version as a newer build could
// write it: keys this build does not know at the top level and inside
// nested objects.
const newerKeys = `{"version": 1, "phase": "publishing", "sourceFolder": "s3://bucket/newer", "redshiftCommitted": true,
	"committedAt": "2026-12-01T10:00:00Z", "recordCount": 5,
	"publication": {"started": true, "completed": false, "channel": "fast"},
	"objects": {"count": 2, "bytes": 30, "digest": "ab", "shards": [1, 2]},
	"lineage": {"upstream": "s3://bucket/older", "hops": 2}}`

// TestFencedWritesKeepANewerBuildsKeys: a fenced write used to replace the
// whole document with the writer's Go struct, so an older build's write
// dropped what a newer one had recorded. The keys this build does not know
// now survive its writes, Running and terminal, at the top level and
// nested, in the one fenced statement as before.
func TestFencedWritesKeepANewerBuildsKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s := batch.NewStore(pool)
	b := reserve(t, s, fleetReservation("tenant-a", "s3://bucket/newer"))
	_, err := pool.Exec(ctx, `UPDATE ingestion_batches SET details = $2 WHERE id = $1`, b.ID, newerKeys)
	require.NoError(t, err)
	l := acquire(t, pool, b.ID, "older-build/job-1/attempt-1/aa")

	got, err := s.Get(ctx, b.ID)
	require.NoError(t, err)
	d, err := batch.ParseDetails(got.Details)
	require.NoError(t, err, "a newer build's keys are no reason to refuse the document")
	d.Publication.Started = true
	_, err = s.WriteDetails(ctx, l.Fence(), d)
	require.NoError(t, err)
	requireNewerKeys(t, pool, b.ID, "publishing")

	got, err = s.Get(ctx, b.ID)
	require.NoError(t, err)
	d, err = batch.ParseDetails(got.Details)
	require.NoError(t, err)
	d.Publication.Completed = true
	done, err := s.MarkSucceeded(ctx, l.Fence(), d)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, done.Status)
	requireNewerKeys(t, pool, b.ID, "published")
}

// requireNewerKeys checks that batch id's details hold newerKeys's unknown
// keys, as they were, at phase phase.
func requireNewerKeys(t *testing.T, pool *pgxpool.Pool, id int64, phase string) {
	t.Helper()
	var raw []byte
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT details FROM ingestion_batches WHERE id = $1`, id).Scan(&raw))
	var d struct {
		Phase       string `json:"phase"`
		Publication struct {
			Channel string `json:"channel"`
		} `json:"publication"`
		Objects struct {
			Shards []int `json:"shards"`
		} `json:"objects"`
		Lineage json.RawMessage `json:"lineage"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	require.Equal(t, phase, d.Phase)
	require.Equal(t, "fast", d.Publication.Channel, "a nested key kept")
	require.Equal(t, []int{1, 2}, d.Objects.Shards, "a nested key kept")
	require.JSONEq(t, `{"upstream": "s3://bucket/older", "hops": 2}`, string(d.Lineage), "a top-level key kept")
}
