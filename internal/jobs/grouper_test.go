package jobs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/metrics"
)

// gate holds folder's scope in a transaction of the test, so a Grouper
// call importing it stays in flight until release is called.
func gate(t *testing.T, f *fixture, folder string) (release func()) {
	t.Helper()
	ctx := context.Background()
	r, err := reservation(importReq(folder), 0)
	require.NoError(t, err)
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = batch.NewStore(tx).ReserveMany(ctx, []batch.Reservation{r})
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(release)
	return release
}

type callResult struct {
	res []Result
	err error
	at  time.Time
}

// goImportMany runs g.ImportMany in a goroutine; its answer arrives on the
// channel.
func goImportMany(g *Grouper, reqs ...ImportRequest) <-chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		res, err := g.ImportMany(context.Background(), reqs)
		ch <- callResult{res, err, time.Now()}
	}()
	return ch
}

// waitGathered waits until the group gathering requests holds calls calls.
func waitGathered(t *testing.T, g *Grouper, calls int) {
	t.Helper()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.open != nil && g.open.calls == calls
	}, 10*time.Second, time.Millisecond)
}

// held starts a call importing a gated folder and waits until it is in
// flight: the calls after it gather for the next group.
func held(t *testing.T, f *fixture, g *Grouper, folder string) (release func(), answer <-chan callResult) {
	t.Helper()
	release = gate(t, f, folder)
	answer = goImportMany(g, importReq(folder))
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.inFlight == 1
	}, 10*time.Second, time.Millisecond)
	return release, answer
}

func histogramCount(t *testing.T, h prometheus.Histogram) (count uint64, sum float64) {
	t.Helper()
	var m dto.Metric
	require.NoError(t, h.(prometheus.Metric).Write(&m))
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// transactionsOf counts the transactions that wrote the batches and their
// jobs.
func transactionsOf(t *testing.T, f *fixture, batchIDs []int64) int {
	t.Helper()
	var xids int
	require.NoError(t, f.pool.QueryRow(context.Background(), `
		SELECT count(DISTINCT x) FROM (
			SELECT xmin::text AS x FROM ingestion_batches WHERE id = ANY($1)
			UNION ALL
			SELECT xmin::text FROM river_job WHERE (args->>'batch_id')::bigint = ANY($1)) t`, batchIDs).Scan(&xids))
	return xids
}

// TestGrouperConcurrentImportsShareOneTransaction: calls that arrive while
// another group's transaction is in flight share the next transaction
// (one xmin for all their batches and jobs, one commit counted), and each
// call is answered with the outcome of its own folder.
func TestGrouperConcurrentImportsShareOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	m := metrics.NewImportGroups(nil)
	g := NewGrouper(f.enqueuer, GroupConfig{Linger: time.Minute, Max: 100, Metrics: m})

	release, first := held(t, f, g, "s3://bucket/gate")
	const calls = 20
	answers := make([]<-chan callResult, calls)
	for i := range answers {
		answers[i] = goImportMany(g, importReq(fmt.Sprintf("s3://bucket/shared/%d", i)))
	}
	waitGathered(t, g, calls)
	require.Equal(t, float64(calls), testutil.ToFloat64(m.Waiting))
	release()

	r := <-first
	require.NoError(t, r.err)
	require.Equal(t, OutcomeEnqueued, r.res[0].Outcome)
	var ids []int64
	for i, ch := range answers {
		r := <-ch
		require.NoError(t, r.err)
		require.Len(t, r.res, 1)
		require.Equal(t, OutcomeEnqueued, r.res[0].Outcome)
		require.Positive(t, r.res[0].JobID)
		b, err := batch.NewStore(f.pool).Get(ctx, r.res[0].BatchID)
		require.NoError(t, err)
		require.Equal(t, "fleet_s3:s3://bucket/shared/"+fmt.Sprint(i), b.Scope(), "each call is answered with its own folder's batch")
		ids = append(ids, r.res[0].BatchID)
	}
	require.Equal(t, 1, transactionsOf(t, f, ids), "the gathered calls shared one transaction")
	require.Zero(t, testutil.ToFloat64(m.Waiting))
	require.Equal(t, 2.0, testutil.ToFloat64(m.Commits), "the gate's group and the shared one")
	count, sum := histogramCount(t, m.Size)
	require.Equal(t, uint64(2), count)
	require.Equal(t, float64(1+calls), sum)
}

// TestGrouperAnswersDuplicatesAndConflictsAsIfSequential: in one group, a
// folder named by two calls is reserved for the first and answers the
// second conflict with the first's batch; a folder a running batch holds
// answers conflict with that batch; a folder whose batch succeeded answers
// already_succeeded; an invalid request answers invalid_input, and Import
// refuses it before joining a group.
func TestGrouperAnswersDuplicatesAndConflictsAsIfSequential(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	running, err := f.enqueuer.Import(ctx, importReq("s3://bucket/running"))
	require.NoError(t, err)
	g := NewGrouper(f.enqueuer, GroupConfig{Linger: time.Minute})

	_, err = g.Import(ctx, importReq("s3://bucket/../escape"))
	var in *InputError
	require.ErrorAs(t, err, &in)
	require.Equal(t, "folder", in.Field)

	release, first := held(t, f, g, "s3://bucket/gate")
	dupA := goImportMany(g, importReq("s3://bucket/dup"))
	waitGathered(t, g, 1)
	dupB := goImportMany(g, importReq("s3://Bucket//dup/")) // the same folder, spelled otherwise
	waitGathered(t, g, 2)
	conflict := goImportMany(g, importReq("s3://bucket/running"))
	waitGathered(t, g, 3)
	mixed := goImportMany(g, importReq("s3://bucket/own"), importReq("s3://bucket/../escape"))
	waitGathered(t, g, 4)
	release()
	require.NoError(t, (<-first).err)

	a, b, c, d := <-dupA, <-dupB, <-conflict, <-mixed
	for _, r := range []callResult{a, b, c, d} {
		require.NoError(t, r.err)
	}
	require.Equal(t, OutcomeEnqueued, a.res[0].Outcome)
	require.Equal(t, OutcomeConflict, b.res[0].Outcome, "the second copy, as if it came after the first")
	require.Equal(t, a.res[0].BatchID, b.res[0].RunningBatchID)
	require.Equal(t, OutcomeConflict, c.res[0].Outcome)
	require.Equal(t, running.BatchID, c.res[0].RunningBatchID)
	require.Len(t, d.res, 2)
	require.Equal(t, OutcomeEnqueued, d.res[0].Outcome)
	require.Equal(t, OutcomeInvalidInput, d.res[1].Outcome)
	require.Equal(t, 1, transactionsOf(t, f, []int64{a.res[0].BatchID, d.res[0].BatchID}))

	// The same calls one after another, on a fresh database, answer the same.
	f2 := newFixture(t, nil)
	r2, err := f2.enqueuer.Import(ctx, importReq("s3://bucket/running"))
	require.NoError(t, err)
	seqA, err := f2.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://bucket/dup")})
	require.NoError(t, err)
	seqB, err := f2.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://Bucket//dup/")})
	require.NoError(t, err)
	seqC, err := f2.enqueuer.ImportMany(ctx, []ImportRequest{importReq("s3://bucket/running")})
	require.NoError(t, err)
	require.Equal(t, a.res[0].Outcome, seqA[0].Outcome)
	require.Equal(t, b.res[0].Outcome, seqB[0].Outcome)
	require.Equal(t, seqA[0].BatchID, seqB[0].RunningBatchID)
	require.Equal(t, c.res[0].Outcome, seqC[0].Outcome)
	require.Equal(t, r2.BatchID, seqC[0].RunningBatchID)
}

// TestGrouperOneFailingFolderFailsOnlyItsCall: a folder whose reservation
// fails in the database (a trigger refuses its tenant) makes the shared
// transaction fail; the group falls back to one import per call, so only
// that folder's call gets the error and every other call is enqueued.
func TestGrouperOneFailingFolderFailsOnlyItsCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	f.beforeInsert(t, "ingestion_batches", "refuse_tenant", `IF NEW.tenant_id = 'tenant-boom' THEN RAISE EXCEPTION 'storage refuses (injected)'; END IF; RETURN NEW;`)
	m := metrics.NewImportGroups(nil)
	g := NewGrouper(f.enqueuer, GroupConfig{Linger: time.Minute, Metrics: m})

	release, first := held(t, f, g, "s3://bucket/gate")
	boom := importReq("s3://bucket/boom")
	boom.TenantID = "tenant-boom"
	var answers []<-chan callResult
	for i := range 5 {
		if i == 2 {
			answers = append(answers, goImportMany(g, boom))
		} else {
			answers = append(answers, goImportMany(g, importReq(fmt.Sprintf("s3://bucket/fine/%d", i))))
		}
		waitGathered(t, g, i+1)
	}
	release()
	require.NoError(t, (<-first).err)
	for i, ch := range answers {
		r := <-ch
		if i == 2 {
			require.ErrorContains(t, r.err, "injected", "the failing folder's own call gets its error")
			continue
		}
		require.NoError(t, r.err)
		require.Equal(t, OutcomeEnqueued, r.res[0].Outcome)
	}
	require.Equal(t, 1.0, testutil.ToFloat64(m.Fallbacks))
	var n int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches WHERE tenant_id = 'tenant-a'`).Scan(&n))
	require.Equal(t, 1+4, n)
}

// TestGrouperWithoutLingerIsOneTransactionPerCall: Linger 0 turns grouping
// off: concurrent calls each commit a transaction of their own.
func TestGrouperWithoutLingerIsOneTransactionPerCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	m := metrics.NewImportGroups(nil)
	g := NewGrouper(f.enqueuer, GroupConfig{Linger: 0, Metrics: m})
	const calls = 16
	var wg sync.WaitGroup
	ids := make([]int64, calls)
	for i := range calls {
		wg.Go(func() {
			res, err := g.Import(context.Background(), importReq(fmt.Sprintf("s3://bucket/alone/%d", i)))
			require.NoError(t, err)
			require.Equal(t, OutcomeEnqueued, res.Outcome)
			ids[i] = res.BatchID
		})
	}
	wg.Wait()
	require.Equal(t, calls, transactionsOf(t, f, ids))
	require.Zero(t, testutil.ToFloat64(m.Commits))
}

// TestGrouperWaitsAtMostTheLinger: a call that arrives while another
// group's transaction is stuck goes after the linger, without waiting for
// that transaction, and its group commits while the other is still stuck.
func TestGrouperWaitsAtMostTheLinger(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	const linger = 100 * time.Millisecond
	g := NewGrouper(f.enqueuer, GroupConfig{Linger: linger})
	release, first := held(t, f, g, "s3://bucket/gate")
	start := time.Now()
	r := <-goImportMany(g, importReq("s3://bucket/prompt"), importReq("s3://bucket/prompt-2"))
	waited := r.at.Sub(start)
	require.NoError(t, r.err)
	require.Equal(t, OutcomeEnqueued, r.res[0].Outcome)
	require.Equal(t, OutcomeEnqueued, r.res[1].Outcome)
	require.GreaterOrEqual(t, waited, linger, "it waited for others for the linger")
	// Linger plus one small transaction, loosely: a loaded 2-core machine.
	require.Less(t, waited, linger+3*time.Second)
	select {
	case <-first:
		t.Fatal("the gated call finished before its gate was released")
	default:
	}
	release()
	require.NoError(t, (<-first).err)
}

// TestGrouperFullGroupGoesAtMax: a group goes as soon as it holds Max
// folders, without waiting for the linger or the transaction in flight;
// a call larger than Max is imported alone.
func TestGrouperFullGroupGoesAtMax(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	m := metrics.NewImportGroups(nil)
	g := NewGrouper(f.enqueuer, GroupConfig{Linger: time.Minute, Max: 4, Metrics: m})
	release, first := held(t, f, g, "s3://bucket/gate")
	a := goImportMany(g, importReq("s3://bucket/max/1"), importReq("s3://bucket/max/2"))
	waitGathered(t, g, 1)
	b := goImportMany(g, importReq("s3://bucket/max/3"), importReq("s3://bucket/max/4"))
	ra, rb := <-a, <-b
	require.NoError(t, ra.err)
	require.NoError(t, rb.err)
	require.Equal(t, 1, transactionsOf(t, f, []int64{ra.res[0].BatchID, ra.res[1].BatchID, rb.res[0].BatchID, rb.res[1].BatchID}))
	big, err := g.ImportMany(context.Background(), []ImportRequest{
		importReq("s3://bucket/big/1"), importReq("s3://bucket/big/2"), importReq("s3://bucket/big/3"), importReq("s3://bucket/big/4"), importReq("s3://bucket/big/5")})
	require.NoError(t, err)
	require.Len(t, big, 5)
	require.Equal(t, 1.0, testutil.ToFloat64(m.Commits), "the full group; the large call went alone")
	release()
	require.NoError(t, (<-first).err)
}
