package redshift_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// TestNoTenantWaitsOnAnotherTenantsCopy: tenant A's COPY is held for 10 s
// on the warehouse. A load of tenant B submitted 1 s later commits and is
// stamped while A's COPY is still held, and a publication of tenant C
// during A's COPY completes in under 2 s. A's load then commits too.
func TestNoTenantWaitsOnAnotherTenantsCopy(t *testing.T) {
	t.Parallel()
	const copyHeld = 10 * time.Second
	e := newEnv(t, func(c *redshift.Config) { c.LoadTimeout = time.Minute })
	ctx := context.Background()

	// C is loaded (not yet published) before A starts.
	srcC, objsC, scopeC := warehousetest.Source(t, map[string]string{"c.csv": csvRows("c", 3)})
	sliceC := warehouse.Slice{TenantID: "tenant-c", SourceScope: scopeC, BatchID: 301, Generation: 1}
	_, err := e.wh.Load(ctx, sliceC, srcC, objsC, nil)
	require.NoError(t, err)

	in := e.double.Inject(redshifttest.Fault{Match: "/batch-101/", CopyDelay: copyHeld})
	srcA, objsA, scopeA := warehousetest.Source(t, map[string]string{"a.csv": csvRows("a", 5)})
	sliceA := warehouse.Slice{TenantID: "tenant-a", SourceScope: scopeA, BatchID: 101, Generation: 1}
	aDone := make(chan error, 1)
	go func() {
		_, err := e.wh.Load(ctx, sliceA, srcA, objsA, nil)
		aDone <- err
	}()
	select {
	case <-in.Copying():
	case err := <-aDone:
		t.Fatalf("A's load ended before its COPY was held: %v", err)
	}
	copyStarted := time.Now()
	time.Sleep(time.Second)

	srcB, objsB, scopeB := warehousetest.Source(t, map[string]string{"b.csv": csvRows("b", 4)})
	sliceB := warehouse.Slice{TenantID: "tenant-b", SourceScope: scopeB, BatchID: 201, Generation: 1}
	bStart := time.Now()
	stB, err := e.wh.Load(ctx, sliceB, srcB, objsB, nil)
	require.NoError(t, err)
	t.Logf("B's load committed in %s, %s after A's COPY started", time.Since(bStart), time.Since(copyStarted))
	require.Equal(t, int64(4), stB.RecordCount)
	require.Equal(t, int64(201), mustStamp(t, e.wh, sliceB).BatchID, "B is stamped")
	select {
	case <-in.Done():
		t.Fatal("B committed only after A's transaction ended: B waited on A's COPY")
	default:
	}

	pubStart := time.Now()
	stC, err := e.wh.Publish(ctx, sliceC, time.Hour, nil)
	pubTook := time.Since(pubStart)
	require.NoError(t, err)
	require.NotNil(t, stC.PublishedAt)
	t.Logf("C's publication took %s during A's COPY", pubTook)
	require.Less(t, pubTook, 2*time.Second, "a publication does not wait on another tenant's COPY")
	select {
	case <-in.Done():
		t.Fatal("C was published only after A's transaction ended")
	default:
	}
	require.Less(t, time.Since(copyStarted), copyHeld, "all of this happened while A's COPY was held")

	require.NoError(t, testproc.Await(t, aDone, "the first load to end"))
	require.Equal(t, int64(101), mustStamp(t, e.wh, sliceA).BatchID)
}
