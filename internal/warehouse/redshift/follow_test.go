package redshift_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
	"github.com/fleet/ingest/internal/warehouse/warehousetest"
)

// memJournal keeps the statement record in memory, as the batch details
// keep it across deliveries.
type memJournal struct {
	mu  sync.Mutex
	st  warehouse.Statement
	has bool
	// onRecord, if set, runs before a record is kept; its error refuses it.
	onRecord func(warehouse.Statement) error
}

func (j *memJournal) Pending() (warehouse.Statement, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.st, j.has
}

func (j *memJournal) Record(_ context.Context, st warehouse.Statement) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.onRecord != nil {
		if err := j.onRecord(st); err != nil {
			return err
		}
	}
	j.st, j.has = st, st != (warehouse.Statement{})
	return nil
}

// submissionsNamed counts the double's submissions whose name starts with
// prefix.
func (e *env) submissionsNamed(prefix string) int {
	n := 0
	for _, s := range e.double.Submissions() {
		if strings.HasPrefix(s.Name, prefix) {
			n++
		}
	}
	return n
}

// TestAKilledWorkersLoadIsFollowedNotResubmitted: a worker dies while its
// load's swap runs on the warehouse. Its statement id was recorded before
// it was awaited; the next delivery polls that same statement (the
// double sees its DescribeStatement requests) and submits nothing while it
// can still commit; once it commits, the next delivery settles on it, its
// stamp counting the bad records the first delivery staged (the next one
// read none of the folder).
func TestAKilledWorkersLoadIsFollowedNotResubmitted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := &memJournal{}
	files := map[string]string{"x.csv": csvRows("a", 4) + "bad\n", "y.ndjson": "{\"a\": 1}\n[1]\n"}
	src, objs, scope := warehousetest.Source(t, files)
	src.Tolerate(2)
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 7, Generation: 1}

	in := e.double.Inject(redshifttest.Fault{Match: swapMatch, Hold: true})
	kt := &killableTransport{}
	mortal := e.mortal(t, kt)
	errc := make(chan error, 1)
	go func() {
		_, err := mortal.Load(warehouse.WithJournal(context.Background(), j), s, src, objs, nil)
		errc <- err
	}()
	swapID := testproc.Await(t, in.Matched(), "the swap to be submitted")
	testproc.Await(t, in.Held(), "the swap to be held")
	kt.dead.Store(true)
	require.Error(t, testproc.Await(t, errc, "the dead worker's load to end"), "the dead worker never learns its outcome")
	rec, ok := j.Pending()
	require.True(t, ok, "the statement was recorded before it was awaited")
	require.Equal(t, swapID, rec.ID)
	require.Equal(t, int64(1), rec.Generation)

	submitted := len(e.double.Submissions())
	next := warehouse.Slice{TenantID: s.TenantID, SourceScope: s.SourceScope, BatchID: 7, Generation: 2}
	src2, objs2, _ := warehousetest.Source(t, files)
	type result struct {
		st  warehouse.Stamp
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := e.wh.Load(warehouse.WithJournal(context.Background(), j), next, src2, objs2, nil)
		done <- result{st, err}
	}()
	polled := e.double.Describes(swapID)
	require.Eventually(t, func() bool { return e.double.Describes(swapID) > polled+3 }, 10*time.Second, 5*time.Millisecond,
		"the next delivery polls the recorded statement")
	select {
	case r := <-done:
		t.Fatalf("the next delivery ended while the statement could still commit: %+v", r)
	default:
	}
	require.Len(t, e.double.Submissions(), submitted, "nothing is submitted while the followed statement runs")

	in.Release()
	r := testproc.Await(t, done, "the next delivery's load to end")
	require.NoError(t, r.err)
	require.Equal(t, int64(7), r.st.BatchID)
	require.Equal(t, int64(1), r.st.Generation, "the followed statement's commit is the outcome")
	require.Equal(t, int64(5), r.st.RecordCount)
	require.Equal(t, int64(2), r.st.BadRecords, "the stamp counts the bad records the followed statement committed")
	require.Equal(t, 1, e.submissionsNamed("fleet-load-copy-"), "one COPY in all")
	require.Equal(t, 1, e.submissionsNamed("fleet-load-swap-"), "one swap in all")
	_, pending := j.Pending()
	require.False(t, pending, "the record is cleared once the statement ended")
}

// TestAKilledWorkersCopyIsFollowedBeforeStagingAgain: the worker dies
// during its COPY; the next delivery follows that COPY to its end before it
// stages and copies again.
func TestAKilledWorkersCopyIsFollowedBeforeStagingAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := &memJournal{}
	files := map[string]string{"x.csv": csvRows("a", 3)}
	src, objs, scope := warehousetest.Source(t, files)
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 8, Generation: 1}
	in := e.double.Inject(redshifttest.Fault{Match: copyMatch, CopyDelay: 2 * time.Second})
	kt := &killableTransport{}
	mortal := e.mortal(t, kt)
	errc := make(chan error, 1)
	go func() {
		_, err := mortal.Load(warehouse.WithJournal(context.Background(), j), s, src, objs, nil)
		errc <- err
	}()
	copyID := testproc.Await(t, in.Matched(), "the COPY to be submitted")
	testproc.Await(t, in.Copying(), "the COPY to start")
	kt.dead.Store(true)
	require.Error(t, testproc.Await(t, errc, "the dead worker's load to end"))

	src2, objs2, _ := warehousetest.Source(t, files)
	st, err := e.wh.Load(warehouse.WithJournal(context.Background(), j), warehouse.Slice{TenantID: s.TenantID, SourceScope: s.SourceScope, BatchID: 8, Generation: 2}, src2, objs2, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Generation)
	select {
	case <-in.Done():
	default:
		t.Fatal("the next delivery committed while the first COPY still ran")
	}
	subs := e.double.Submissions()
	var order []string
	for _, sub := range subs {
		if strings.HasPrefix(sub.Name, "fleet-load-") {
			order = append(order, sub.Name)
		}
	}
	require.Equal(t, []string{"fleet-load-copy-8-1", "fleet-load-drop-8-1", "fleet-load-copy-8-2", "fleet-load-swap-8-2"}, order,
		"the first COPY is followed to its end, its staging table dropped, then this delivery copies its own")
	require.Greater(t, e.double.Describes(copyID), 0, "the first COPY was followed")
}

// TestASubmissionRecordedWithoutItsIDIsRepeatedWithItsToken: a worker's
// swap was submitted, but the worker died before recording its id (only
// the submission is recorded). The next delivery submits the same request
// with the same ClientToken; the Data API answers with the statement
// already running, which is followed: no second swap runs.
func TestASubmissionRecordedWithoutItsIDIsRepeatedWithItsToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kt := &killableTransport{}
	j := &memJournal{onRecord: func(st warehouse.Statement) error {
		if st.Kind == "redshift-load-swap" && st.ID != "" {
			kt.dead.Store(true) // the worker dies before the id is recorded
			return errors.New("the worker died")
		}
		return nil
	}}
	files := map[string]string{"x.csv": csvRows("a", 5) + "bad\n"}
	src, objs, scope := warehousetest.Source(t, files)
	src.Tolerate(1)
	s := warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 9, Generation: 1}
	in := e.double.Inject(redshifttest.Fault{Match: swapMatch, Hold: true})
	mortal := e.mortal(t, kt)
	_, err := mortal.Load(warehouse.WithJournal(context.Background(), j), s, src, objs, nil)
	require.Error(t, err)
	swapID := testproc.Await(t, in.Matched(), "the swap to be submitted")
	rec, ok := j.Pending()
	require.True(t, ok)
	require.Equal(t, "redshift-load-swap", rec.Kind)
	require.Empty(t, rec.ID, "only the submission was recorded")

	j.onRecord = nil
	done := make(chan error, 1)
	go func() {
		src2, objs2, _ := warehousetest.Source(t, files)
		_, err := e.wh.Load(warehouse.WithJournal(context.Background(), j), warehouse.Slice{TenantID: s.TenantID, SourceScope: s.SourceScope, BatchID: 9, Generation: 2}, src2, objs2, nil)
		done <- err
	}()
	require.Eventually(t, func() bool { return e.double.Repeats() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the submission is repeated with its token")
	require.Eventually(t, func() bool { rec, _ := j.Pending(); return rec.ID == swapID }, 10*time.Second, 5*time.Millisecond,
		"the token's answer is the running statement, now recorded")
	in.Release()
	require.NoError(t, testproc.Await(t, done, "the repeated load to end"))
	require.Equal(t, 1, e.submissionsNamed("fleet-load-swap-"), "one swap ran")
	st := mustStamp(t, e.wh, s)
	require.Equal(t, int64(1), st.Generation)
	require.Equal(t, int64(1), st.BadRecords, "the repeated swap moved the staged load errors")
}

// TestDescribeFailuresAreAskedAgain: DescribeStatement throttled past the
// SDK's own retries is asked again with backoff until the deadline; the
// load commits.
func TestDescribeFailuresAreAskedAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *redshift.Config) { c.LoadTimeout = 30 * time.Second })
	in := e.double.Inject(redshifttest.Fault{Match: swapMatch, Hold: true})
	done := make(chan error, 1)
	src, objs, scope := warehousetest.Source(t, map[string]string{"x.csv": csvRows("a", 2)})
	go func() {
		_, err := e.wh.Load(context.Background(), warehouse.Slice{TenantID: "tenant-1", SourceScope: scope, BatchID: 3, Generation: 1}, src, objs, nil)
		done <- err
	}()
	testproc.Await(t, in.Held(), "the swap to be held")
	e.double.Throttle(12) // more than the SDK's three attempts, several times over
	in.Release()
	require.NoError(t, testproc.Await(t, done, "the load to end"))
}
