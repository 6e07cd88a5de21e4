package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
)

// TestRolloutDoesNotRestartALongLoad runs a rollout through a 30 s load: a
// folder of 30 objects in S3, each read taking a second. 15 s in, the
// worker gets SIGTERM, with a shutdown grace of 5 s, and its replacement
// starts (the rollout's new pod). The load's progress (14 of 30 objects
// in 15 s) says it finishes within the drain limit, so the old worker keeps
// it past the grace and exits once it is done: the batch succeeds under its
// first lease generation, every object was read once, and the new pod never
// took the batch. Before, the grace ended the load at 20 s and the next
// delivery read the folder again from its first object.
func TestRolloutDoesNotRestartALongLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 30 s load; skipped under -short")
	}
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	s3 := s3test.Start(t)
	const bucket, prefix = "fleet-rollout", "tenants/tenant-a/tenant_db/company-1/upload-1/"
	const objects, perObject = 30, time.Second
	s3.CreateBucket(t, bucket)
	var keys []string
	for i := range objects {
		keys = append(keys, fmt.Sprintf("%spart-%02d.csv", prefix, i))
	}
	s3.PutMany(t, bucket, keys, []byte("vehicle,km\nV1,10\nV2,20\n"))
	s3.Put(t, bucket, prefix+"_SUCCESS", nil)
	s3.Slow(bucket, perObject)

	args := append([]string{"--shutdown-grace", "5s", "--progress-every", "1s"}, fastLease...)
	old := startWorkerEnv(t, dbURL, s3.Env(), args...)
	id := enqueueBatch(t, dbURL, "tenant-a", "s3://"+bucket+"/"+prefix)
	old.waitLog(`"msg":"loading folder"`, 30*time.Second)
	loadStart := time.Now()
	time.Sleep(15 * time.Second)

	before, d := getBatch(t, pool, id)
	require.Equal(t, batch.StatusRunning, before.Status)
	require.NotNil(t, before.LeaseID)
	require.True(t, strings.HasPrefix(*before.LeaseID, old.name+"/"), "held by the old pod: %s", *before.LeaseID)
	require.NotNil(t, d.Progress, "progress recorded")
	require.Less(t, d.Progress.ObjectsDone, int64(objects), "still loading at the SIGTERM")
	old.signal(syscall.SIGTERM)
	stopped := time.Now()
	newer := startWorkerEnv(t, dbURL, s3.Env(), args...)

	require.Equal(t, 0, old.wait(60*time.Second), "a clean exit")
	t.Logf("load %.1fs; SIGTERM at %.1fs; old pod exited %.1fs after it (grace 5s)",
		time.Since(loadStart).Seconds(), stopped.Sub(loadStart).Seconds(), time.Since(stopped).Seconds())
	require.Greater(t, time.Since(stopped), 5*time.Second, "kept past the grace")
	done := waitStatus(t, pool, id, batch.StatusSucceeded, 10*time.Second)
	require.Equal(t, before.LeaseGeneration, done.LeaseGeneration, "no second lease: the load was not started over")
	for _, k := range keys {
		require.Equal(t, 1, s3.Reads(bucket, k), "%s read once", k)
	}
	total, distinct := recordCopies(t, pool, done.Scope())
	require.Equal(t, 2*objects, total)
	require.Equal(t, 2*objects, distinct)
	logs := old.logs.String()
	require.Contains(t, logs, `"msg":"draining: the load will finish before the drain limit; waiting for it"`)
	require.NotContains(t, logs, "giving the load up")
	require.Zero(t, newer.metric(`ingest_lease_acquisitions_total{outcome="acquired"}`), "the new pod never took the batch")
	require.Zero(t, newer.metric(`ingest_lease_acquisitions_total{outcome="taken_over"}`))
}
