package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

// copyStatement matches the COPY of a load's staging step (and nothing
// else the Redshift warehouse submits).
const copyStatement = "COPY curated_staging."

// TestAKilledWorkersRedshiftCopyIsFollowedNotResubmitted: a worker process
// is SIGKILLed while the Data API runs its load's COPY. The statement id
// was recorded with the batch before the worker awaited it, so the worker
// that takes the batch over polls that same statement and submits no COPY
// of its own while it may still run. (The COPY fills a staging table of
// the killed delivery's generation, which the follower drops once the COPY
// has ended; it then stages and copies its own, and only its swap writes
// the slice.) The batch's records reach the warehouse exactly once.
func TestAKilledWorkersRedshiftCopyIsFollowedNotResubmitted(t *testing.T) {
	t.Parallel()
	const (
		copyDelay = 8 * time.Second
		ttl       = 3 * time.Second // fastLease
	)
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	double, env, migrateFlags, workerFlags := redshiftDouble(t)
	migrate := exec.Command(filepath.Join(binDir, "worker"), append([]string{"migrate", "--log-level", "warn"}, migrateFlags...)...)
	migrate.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL), env...)
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, string(out))

	in := double.Inject(redshifttest.Fault{Match: copyStatement, CopyDelay: copyDelay})
	workerArgs := append(append([]string(nil), workerFlags...), fastLease...)
	victim := startWorkerEnv(t, dbURL, env, workerArgs...)
	id := enqueueBatch(t, dbURL, "tenant-a", writeFolder(t, sample))

	var copyID string
	select {
	case copyID = <-in.Matched():
	case <-time.After(20 * time.Second):
		t.Fatal("the load's COPY was never submitted")
	}
	select {
	case <-in.Copying():
	case <-time.After(10 * time.Second):
		t.Fatal("the load's COPY never started")
	}
	// The worker records the statement id before it awaits it.
	var held batch.Batch
	require.Eventually(t, func() bool {
		b, d := getBatch(t, pool, id)
		held = b
		st := d.WarehouseStatement
		return st != nil && st.ID == copyID
	}, 5*time.Second, 20*time.Millisecond, "the COPY's statement id was never recorded with the batch")
	require.NotNil(t, held.LeaseID)
	require.True(t, strings.HasPrefix(*held.LeaseID, victim.name+"/"), "the victim holds the batch")

	victim.signal(syscall.SIGKILL)
	killed := time.Now()
	victim.wait(10 * time.Second)
	select {
	case <-in.Done():
		t.Fatal("the COPY ended before its worker was killed")
	default:
	}
	polledBefore := double.Describes(copyID)

	// The worker that takes over follows the recorded COPY; until that
	// COPY has ended it submits no other.
	copies := func() []string {
		var out []string
		for _, sub := range double.Submissions() {
			for _, sql := range sub.SQLs {
				if strings.Contains(sql, copyStatement) {
					// One submission: the load's COPY transaction copies
					// the records and the ledger.
					out = append(out, sub.ID)
					break
				}
			}
		}
		return out
	}
	startWorkerEnv(t, dbURL, env, workerArgs...)
	ended := false
	for deadline := time.Now().Add(30 * time.Second); !ended; {
		select {
		case <-in.Done():
			ended = true
		case <-time.After(20 * time.Millisecond):
			require.True(t, time.Now().Before(deadline), "the killed worker's COPY never ended")
		}
		if !ended {
			require.Equal(t, []string{copyID}, copies(), "no second COPY while the first may still run")
		}
	}
	require.Greater(t, double.Describes(copyID), polledBefore, "the worker that took over polled the recorded COPY")
	done := waitStatus(t, pool, id, batch.StatusSucceeded, 30*time.Second)
	t.Logf("SIGKILL → Succeeded %.1fs (COPY held %s, lease TTL %s); COPY statements: %v", time.Since(killed).Seconds(), copyDelay, ttl, copies())
	require.Greater(t, done.LeaseGeneration, held.LeaseGeneration, "the batch was taken over")
	require.LessOrEqual(t, len(copies()), 2, "at most the new delivery's own COPY after the followed one ended")
	_, d := getBatch(t, pool, id)
	require.Nil(t, d.WarehouseStatement, "the record is cleared once the statement ended")

	total, distinct := recordCopies(t, double.Pool, done.Scope())
	require.Equal(t, sampleRecords, total, "exactly one copy of each record")
	require.Equal(t, sampleRecords, distinct)
}
