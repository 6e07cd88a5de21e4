package e2e

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/release"
)

// chaosOldCommitDefault is the earlier release of the mixed-release
// scenarios: the commit of issue 43's report, from before its details
// kept keys a newer build added (its parser refused the load-ledger
// summary "objects" and parked the batch).
const chaosOldCommitDefault = "081703a"

var chaosOldCommit = flag.String("chaos.old-commit", cmp.Or(os.Getenv("CHAOS_OLD_COMMIT"), chaosOldCommitDefault),
	"the earlier release of the mixed-release chaos scenarios: a commit of this repository (env CHAOS_OLD_COMMIT)")

// releasesScenario is a rolling upgrade from an earlier release to this
// one, under faults: workers of both releases on this release's schema,
// imports from both releases' enqueue, SIGKILLs alternating between the
// releases. New workers pause a second between a warehouse commit and its
// publication (--test-pause-before-publication), and a kill of a new
// worker aims at one holding a batch in that window: its batch, committed
// by this build and not yet published, is then delivered again, to either
// release. When the faults end the rollout ends: the old workers are
// stopped, and the new ones finish what is left.
var releasesScenario = chaosConfig{
	name: "reduced-releases", releases: &releaseMix{oldWorkers: 2}, workers: 4, tenants: 3, folders: 4, badFolders: 1,
	minRows: 20_000, maxRows: 60_000, duplicates: 2, faultEvery: 2 * time.Second, faults: []string{"kill"},
	duration: 24 * time.Second, deadline: 3 * time.Minute,
}

// releasesFullScenario is releasesScenario in make chaos: more of
// everything, and SIGSTOPs besides the kills.
var releasesFullScenario = chaosConfig{
	name: "releases", releases: &releaseMix{oldWorkers: 3}, workers: 6, tenants: 6, folders: 8, badFolders: 2,
	minRows: 40_000, maxRows: 200_000, duplicates: 3, faultEvery: 700 * time.Millisecond, faults: []string{"kill", "stop", "kill"},
	duration: 60 * time.Second, deadline: 5 * time.Minute,
}

// releaseMix runs an earlier release (-chaos.old-commit) beside this one
// in a chaos scenario: its hooks in runScenario pick each worker's and each
// import's release, the target of each fault, end the rollout, and check
// what a rollout must leave. A nil *releaseMix is a scenario of this
// release alone.
type releaseMix struct {
	// oldWorkers of the scenario's workers run the earlier release.
	oldWorkers int

	bin, commit string // the earlier release's binaries, and its commit
	kills       int
	// handoffs counts the kills of a new worker holding a batch committed
	// and not yet published, the other new workers paused.
	handoffs int
	retired  bool
}

// pausePublication is the new workers' pause between a warehouse commit
// and its publication.
const pausePublication = "2s"

// prepare builds the earlier release's binaries (or finds them built).
func (m *releaseMix) prepare(t *testing.T) {
	if m == nil {
		return
	}
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	repo, err := release.RepoRoot(ctx, ".")
	require.NoError(t, err)
	began := time.Now()
	m.bin, m.commit, err = release.Build(ctx, release.Options{Repo: repo, Commit: *chaosOldCommit})
	require.NoError(t, err)
	m.kills, m.handoffs, m.retired = 0, 0, false
	t.Logf("earlier release %s (-chaos.old-commit %s): binaries in %s (%s)", m.commit[:12], *chaosOldCommit, m.bin, time.Since(began).Round(time.Millisecond))
}

// worker returns the binary directory, name and extra flags of scenario
// n's worker i.
func (m *releaseMix) worker(n, i int) (bin, name string, flags []string) {
	if m == nil {
		return binDir, fmt.Sprintf("chaos%d-w%d", n, i), nil
	}
	if m.old(i) {
		return m.bin, fmt.Sprintf("chaos%d-old%d", n, i), nil
	}
	return binDir, fmt.Sprintf("chaos%d-new%d", n, i), []string{"--test-pause-before-publication", pausePublication}
}

func (m *releaseMix) old(i int) bool { return m != nil && i < m.oldWorkers }

// enqueueBin is the directory of the enqueue binary that sends the n-th
// notification of a folder: the releases alternate.
func (m *releaseMix) enqueueBin(n int) string {
	if m != nil && n%2 == 0 {
		return m.bin
	}
	return binDir
}

// target picks the worker a fault of kind hits. Kills alternate between
// the releases (while the old one runs) and aim at a worker of the release
// whose turn it is that holds a batch, one committed and not yet published
// first (waiting a little for one): its batch is then delivered again.
// When a new worker is killed in that window, the other new workers are
// paused (SIGSTOP) past the lease's expiry, so that the delivery goes to
// an old worker: the report's case, a batch this build loaded taken over
// by the earlier build.
func (m *releaseMix) target(ctx context.Context, rng *rand.Rand, pool *pgxpool.Pool, workers []*supervisedWorker, kind string) *supervisedWorker {
	if m == nil || kind != "kill" || m.retired {
		return workers[rng.IntN(len(workers))]
	}
	m.kills++
	candidates, release := workers[m.oldWorkers:], "new"
	if m.kills%2 == 1 {
		candidates, release = workers[:m.oldWorkers], "old"
	}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var (
			holder     string
			publishing bool
		)
		_ = pool.QueryRow(ctx, `
			SELECT execution_lease_id, details->>'phase' = 'publishing' FROM ingestion_batches
			WHERE status = 'Running' AND execution_lease_expires_at > now() AND execution_lease_id LIKE '%-' || $1 || '%'
			ORDER BY details->>'phase' = 'publishing' DESC, random() LIMIT 1`, release).Scan(&holder, &publishing)
		for _, w := range candidates {
			if holder == "" || !strings.HasPrefix(holder, w.name+"/") {
				continue
			}
			if release == "new" && publishing {
				m.handoffs++
				for _, o := range candidates {
					if o != w && o.signal(syscall.SIGSTOP) {
						time.AfterFunc(chaosTTL+2*time.Second, func() { o.signal(syscall.SIGCONT) })
					}
				}
			}
			return w
		}
	}
	return candidates[rng.IntN(len(candidates))]
}

// retire ends the rollout: the old workers get SIGTERM, as a Deployment
// replacing its last old pods, and are not restarted.
func (m *releaseMix) retire(t *testing.T, workers []*supervisedWorker) {
	if m == nil || m.retired {
		return
	}
	m.retired = true
	for _, w := range workers[:m.oldWorkers] {
		w.stopped.Store(true)
		w.signal(syscall.SIGCONT)
		w.signal(syscall.SIGTERM)
	}
	for _, w := range workers[:m.oldWorkers] {
		select {
		case <-w.exited:
		case <-time.After(30 * time.Second):
			w.signal(syscall.SIGKILL)
			<-w.exited
		}
	}
	t.Logf("rollout done: the %d workers of the earlier release are stopped", m.oldWorkers)
}

// check returns the violations of what a rollout must leave, beyond
// chaos.Check's: no batch parked (the newer workers take back what the
// older ones parked), and no batch parked by a worker of this release at
// all. It logs what the releases did.
func (m *releaseMix) check(ctx context.Context, t *testing.T, pool *pgxpool.Pool, workers []*supervisedWorker) []string {
	if m == nil {
		return nil
	}
	var violations []string
	rows, err := pool.Query(ctx, `SELECT id, status, COALESCE(parked_reason, '') FROM ingestion_batches WHERE parked_at IS NOT NULL ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var (
			id             int64
			status, reason string
		)
		require.NoError(t, rows.Scan(&id, &status, &reason))
		violations = append(violations, fmt.Sprintf("batch %d (%s) is still parked after the rollout: %s", id, status, reason))
	}
	require.NoError(t, rows.Err())
	old, current := workers[:m.oldWorkers], workers[m.oldWorkers:]
	for _, line := range logLines(current, "batch parked") {
		violations = append(violations, "a worker of this release parked a batch: "+line)
	}
	var oldTerms, newTerms int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE t->>'leaseId' LIKE '%-old%'), count(*) FILTER (WHERE t->>'leaseId' LIKE '%-new%')
		FROM ingestion_batches, jsonb_array_elements(execution_lease_terms) t`).Scan(&oldTerms, &newTerms))
	t.Logf("releases: earlier %s; lease terms held by its workers %d, by this release's %d; kills of a new worker in publication %d "+
		"(the other new workers paused); parks by the earlier release %d; take-backs by this release %d; deliveries this release left to a newer one %d",
		m.commit[:12], oldTerms, newTerms, m.handoffs, len(logLines(old, "batch parked")), len(logLines(current, "taking back a parked batch")),
		len(logLines(current, "batch left to a newer release")))
	return violations
}

// logLines returns the log lines of ws whose message starts with msg,
// each after its worker's name.
func logLines(ws []*supervisedWorker, msg string) []string {
	var out []string
	for _, w := range ws {
		for line := range strings.Lines(w.logs.String()) {
			if strings.Contains(line, `"msg":"`+msg) {
				out = append(out, w.name+": "+strings.TrimSpace(line))
			}
		}
	}
	return out
}
