package fleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

// redshiftPipeline is a Fleet pipeline on the Redshift Data API double.
func redshiftPipeline(t *testing.T, adjust func(*redshift.Config)) (*fleet.Pipeline, *redshifttest.Double, *redshift.Warehouse) {
	t.Helper()
	bucket := fmt.Sprintf("fleet-follow-staging-%d", bucketSeq.Add(1))
	s3srv.CreateBucket(t, bucket)
	double := redshifttest.Start(t, redshifttest.Options{DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: s3srv.Client(), Workgroup: "fleet", Database: "dev"})
	cfg := redshift.Config{
		WorkgroupName: "fleet", Database: "dev", IAMRole: "arn:aws:iam::123456789012:role/fleet-copy",
		Staging:      "s3://" + bucket + "/loads/",
		PollInterval: 5 * time.Millisecond, PollMax: 20 * time.Millisecond,
		LoadPollInterval: 5 * time.Millisecond, LoadPollMax: 20 * time.Millisecond,
		RetryBackoff: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}
	// Migrate with the default timeouts: a test's short QueryTimeout is
	// for its scenario, and a loaded machine may take longer than it to
	// create the schema (a CI run failed so, "applying 00001…: context
	// deadline exceeded").
	migrator, err := redshift.New(cfg, double.Client(), s3srv.Client())
	require.NoError(t, err)
	_, err = migrator.Migrate(context.Background())
	require.NoError(t, err)
	adjust(&cfg)
	wh, err := redshift.New(cfg, double.Client(), s3srv.Client())
	require.NoError(t, err)
	return &fleet.Pipeline{AllowLocalFolders: true, Warehouse: wh, Logger: slog.New(slog.DiscardHandler)}, double, wh
}

// TestALoadPastLoadTimeoutIsNotSettledAsAPreCommitFailure is the audit's
// first scenario: a load's swap is still running on the warehouse when
// LoadTimeout passes on the last attempt. The statement id is in the
// details; settling (what the worker does before recording a batch that
// exhausted its attempts) refuses while the statement can still commit, so
// the batch stays Running, never failed_pre_commit; the previous published
// slice is intact meanwhile. Once the statement commits, settling records
// the commit, and the next delivery follows it and publishes without
// loading again.
func TestALoadPastLoadTimeoutIsNotSettledAsAPreCommitFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	// The deadline passes while the statement is held, however long it
	// is; it is long enough for the first, unheld delivery on a loaded
	// machine.
	p, double, wh := redshiftPipeline(t, func(c *redshift.Config) { c.LoadTimeout = 3 * time.Second })
	folderURL := e.folder(sampleFiles)
	first := e.reserve("tenant-a", folderURL)
	require.Equal(t, pipeline.Succeeded, e.deliver(first.ID, p).Outcome)

	second := e.reserve("tenant-a", folderURL)
	in := double.Inject(redshifttest.Fault{Match: "INSERT INTO curated.fleet_records", Hold: true})
	res := e.deliver(second.ID, p)
	require.Equal(t, pipeline.Retry, res.Outcome, "%v", res.Err)
	swapID := testproc.Await(t, in.Matched(), "the swap to be submitted")
	testproc.Await(t, in.Held(), "the swap to be held")
	b, d := e.details(second.ID)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.NotNil(t, d.WarehouseStatement, "the running statement is recorded with the batch")
	require.Equal(t, swapID, d.WarehouseStatement.ID)

	_, err := p.Settle(ctx, b, d)
	require.Error(t, err, "a batch whose load can still commit is not settled (it would be failed_pre_commit)")
	st, found, err := wh.Stamp(ctx, "tenant-a", b.Scope())
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, first.ID, st.BatchID, "the previous slice is intact")
	require.NotNil(t, st.PublishedAt)

	in.Release()
	var settled batch.Details
	require.Eventually(t, func() bool {
		settled, err = p.Settle(ctx, b, d)
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "settled once the statement ended")
	require.True(t, settled.RedshiftCommitted, "once the statement ended, the commit it made is recorded")

	res = e.deliver(second.ID, p)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	swaps := 0
	for _, s := range double.Submissions() {
		if strings.HasPrefix(s.Name, "fleet-load-swap-") {
			swaps++
		}
	}
	require.Equal(t, 2, swaps, "one swap per batch: the second batch's ran once")
	_, d = e.details(second.ID)
	require.Nil(t, d.WarehouseStatement)
}

// TestAPublicationPastQueryTimeoutIsNotSettledAsFailed is the audit's
// second scenario: the publication's transaction is still running when
// QueryTimeout passes on the last attempt. Settling refuses while it can
// still commit (it would be failed_publication); once it commits, the next
// delivery follows it and succeeds, with one outbox row and one
// publication submitted.
func TestAPublicationPastQueryTimeoutIsNotSettledAsFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	// As above: the held publication outlasts the deadline, the other
	// statements of the delivery finish well within it when loaded.
	p, double, _ := redshiftPipeline(t, func(c *redshift.Config) { c.QueryTimeout = 3 * time.Second })
	b := e.reserve("tenant-a", e.folder(sampleFiles))
	in := double.Inject(redshifttest.Fault{Match: "UPDATE curated.fleet_slices SET published_at", Hold: true})
	res := e.deliver(b.ID, p)
	require.Equal(t, pipeline.Retry, res.Outcome, "%v", res.Err)
	pubID := testproc.Await(t, in.Matched(), "the publication to be submitted")
	testproc.Await(t, in.Held(), "the publication to be held")
	b, d := e.details(b.ID)
	require.True(t, d.RedshiftCommitted)
	require.NotNil(t, d.WarehouseStatement)
	require.Equal(t, pubID, d.WarehouseStatement.ID)

	_, err := p.Settle(ctx, b, d)
	require.Error(t, err, "a batch whose publication can still commit is not settled (it would be failed_publication)")

	in.Release()
	require.Eventually(t, func() bool {
		_, err = p.Settle(ctx, b, d)
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "settled once the statement ended")
	res = e.deliver(b.ID, p)
	require.Equal(t, pipeline.Succeeded, res.Outcome, "%v", res.Err)
	var pubs int
	require.NoError(t, double.Pool.QueryRow(ctx, `SELECT count(*) FROM curated.fleet_publications WHERE batch_id = $1`, b.ID).Scan(&pubs))
	require.Equal(t, 1, pubs)
	n := 0
	for _, s := range double.Submissions() {
		if strings.HasPrefix(s.Name, "fleet-publish-") {
			n++
		}
	}
	require.Equal(t, 1, n, "the publication was followed, not submitted again")
}
