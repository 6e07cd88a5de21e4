package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/notify"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// failoverConfig is the fault of a chaos scenario that runs on a
// replicated pair (chaos.Pair) instead of the shared cluster: the
// operational database fails over while the warehouse, a database of its
// own on another server (--warehouse-url), does not.
type failoverConfig struct {
	// kind is "failover" (a synchronous standby: nothing a client saw
	// committed is lost) or "lost-tail" (asynchronous, its link
	// partitioned from partitionAfter until the crash: the commits of
	// that while, outcomes, reservations and lease terms, are lost at the
	// promote, and the enqueue driver then sends every folder again).
	kind string
	// crash is how the primary goes: its server dies, or its host.
	crash          chaos.CrashMode
	partitionAfter time.Duration
	// crashAfter is when the primary crashes and the standby is promoted.
	crashAfter time.Duration
}

// failoverScenario crashes the primary of a synchronous pair mid-load and
// promotes the standby. The full one loses the primary's host (its
// connections hang), the reduced one its server (they are reset).
func failoverScenario(full bool) chaosConfig {
	if full {
		return chaosConfig{name: "failover", workers: 3, tenants: 6, folders: 6, badFolders: 2, minRows: 40_000, maxRows: 150_000, duplicates: 3,
			duration: 45 * time.Second, deadline: 5 * time.Minute,
			failover: failoverConfig{kind: "failover", crash: chaos.CrashHost, crashAfter: 20 * time.Second}}
	}
	return chaosConfig{name: "failover", workers: 3, tenants: 3, folders: 4, badFolders: 1, minRows: 20_000, maxRows: 60_000, duplicates: 3,
		duration: 20 * time.Second, deadline: 3 * time.Minute,
		failover: failoverConfig{kind: "failover", crash: chaos.CrashProcess, crashAfter: 8 * time.Second}}
}

// lostTailScenario fails over to an asynchronous standby whose link was
// partitioned for a while during the loads, then sends every folder again.
// Small folders, so that many outcomes commit within the lost tail.
func lostTailScenario(full bool) chaosConfig {
	if full {
		return chaosConfig{name: "lost-tail", workers: 3, tenants: 6, folders: 8, badFolders: 2, minRows: 5_000, maxRows: 40_000, duplicates: 4,
			duration: 45 * time.Second, deadline: 6 * time.Minute,
			failover: failoverConfig{kind: "lost-tail", crash: chaos.CrashHost, partitionAfter: 10 * time.Second, crashAfter: 30 * time.Second}}
	}
	return chaosConfig{name: "lost-tail", workers: 3, tenants: 4, folders: 8, badFolders: 1, minRows: 10_000, maxRows: 60_000, duplicates: 3,
		duration: 12 * time.Second, deadline: 3 * time.Minute,
		failover: failoverConfig{kind: "lost-tail", crash: chaos.CrashProcess, partitionAfter: 1500 * time.Millisecond, crashAfter: 12 * time.Second}}
}

// runFailoverScenario runs a failover scenario: supervised workers and the
// enqueue driver on the pair's multi-host URL, the warehouse in a database
// of its own, every tenant notified through a local webhook receiver. The
// fault is the failover alone: no worker may have been restarted. Beyond
// chaos.CheckWith it checks batch identity (chaos.CheckIdentity) and the
// notifications: all the deliveries of one idempotency key tell one
// outcome (outcome, status, phase, batch).
func runFailoverScenario(t *testing.T, dir string, n int, cfg chaosConfig) (faults, batches, violations int) {
	ctx := context.Background()
	fo := cfg.failover
	pair, dbURL := startFailoverPair(t, filepath.Join(dir, fmt.Sprintf("pair_%d", n)), fo.kind == "failover")
	whURL := pgtest.EmptyDatabaseURL(t)
	out, code := runWorkerCommand(t, dbURL, "migrate", "--log-level", "warn", "--warehouse-url", whURL)
	require.Equal(t, 0, code, out)
	pool := pgtest.Pool(t, pair.AdminURL(failoverDatabase)) // the test's own reads never wait on a vanished host
	wh := pgtest.Pool(t, whURL)

	_, folders := chaosWorkload(t, dir, fmt.Sprintf("failover_%d", n), n, cfg)

	// Every tenant has a webhook: the receiver keeps every delivery.
	rc := &webhookReceiver{secret: []byte("chaos-failover-webhook-secret"), received: map[string][]notify.Notification{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	var hooks []string
	for ti := range cfg.tenants {
		hooks = append(hooks, fmt.Sprintf(`"tenant-%d": [{"name": "hook", "kind": "webhook", "url": %q, "secret": %q}]`, ti, srv.URL+"/fleet", rc.secret))
	}
	file := filepath.Join(t.TempDir(), "notifications.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"tenants": {`+strings.Join(hooks, ", ")+`}}`), 0o600))

	workers := make([]*supervisedWorker, cfg.workers)
	for i := range workers {
		workers[i] = &supervisedWorker{
			t: t, name: fmt.Sprintf("chaos%d-w%d", n, i), bin: binDir, url: dbURL, logs: &testproc.SyncBuffer{}, exited: make(chan struct{}),
			// A notification job whose completion the rewind forgot is
			// rescued within seconds (River's rescuer runs every 30 s).
			flags: []string{"--warehouse-url", whURL, "--notifications-file", file, "--notify-retry-base", "200ms",
				"--notify-timeout", "2s", "--rescue-stuck-jobs-after", "5s"},
		}
		go workers[i].run()
	}
	defer stopWorkers(t, workers)

	start := time.Now()
	firstWave := enqueueWave(t, folders, cfg.duplicates, cfg.duration, dbURL, nil, nil)
	var secondWave func() int64
	kinds := map[string]int{}
	var tail chaos.Tail
	var promotedAt time.Duration
	partitioned, crashed := false, false
	for {
		if time.Since(start) > cfg.deadline {
			t.Errorf("scenario %s did not finish within %s", cfg.name, cfg.deadline)
			dumpRunning(t, pool)
			break
		}
		if crashed && (secondWave != nil || fo.kind != "lost-tail") && time.Since(start) > cfg.duration && allEnded(ctx, pool, len(folders)) {
			break
		}
		time.Sleep(200 * time.Millisecond)
		switch {
		case fo.kind == "lost-tail" && !partitioned && time.Since(start) > fo.partitionAfter:
			// Replication stops; the primary goes on committing alone.
			pair.Link().Partition(time.Hour)
			partitioned = true
			kinds["partition"]++
			t.Logf("%s: the standby's link partitioned at %s", cfg.name, time.Since(start).Round(time.Millisecond))
		case !crashed && time.Since(start) > fo.crashAfter:
			tail = failover(t, pair, fo.crash)
			promotedAt = time.Since(start)
			crashed = true
			kinds["failover"]++
			if fo.kind == "lost-tail" {
				require.Positive(t, tail.Lost, "the standby must lack the tail before it is promoted")
			}
		case fo.kind == "lost-tail" && crashed && secondWave == nil:
			// Every folder again, once the first wave is in: as the
			// runbook says after a failover that lost a tail (and as
			// reconcile would find the forgotten ones).
			require.Zero(t, firstWave(), "every enqueue of the first wave answered enqueued, already_succeeded or conflict")
			t.Logf("%s: every folder sent again at %s", cfg.name, time.Since(start).Round(time.Millisecond))
			secondWave = enqueueWave(t, folders, cfg.duplicates, 5*time.Second, dbURL, nil, nil)
		}
	}
	require.Zero(t, firstWave(), "every enqueue answered enqueued, already_succeeded or conflict")
	if secondWave != nil {
		require.Zero(t, secondWave(), "every enqueue of the second wave answered enqueued, already_succeeded or conflict")
	}
	took := time.Since(start)

	// Every outcome's notification is sent (or given up) before the
	// deliveries are compared.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var pending int
		var jobs []byte
		err := pool.QueryRow(ctx, `SELECT count(*), COALESCE(jsonb_agg(jsonb_build_object('id', id, 'state', state, 'attempt', attempt,
			'attempted_at', attempted_at, 'attempted_by', attempted_by, 'args', args, 'errors', errors)), '[]')
			FROM river_job WHERE queue = 'fleet_notify' AND state NOT IN ('completed', 'cancelled', 'discarded')`).Scan(&pending, &jobs)
		if err == nil && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d notification jobs still pending two minutes after every batch ended: %s", cfg.name, pending, jobs)
			break
		}
	}

	expect := expectations(folders)
	report, err := chaos.CheckWith(ctx, pool, wh, expect)
	require.NoError(t, err)
	// Ids may repeat after a lost tail (the sequence went back with it and
	// no worker migrate followed); never after a failover that lost
	// nothing. The uid keeps batches apart either way.
	identity, err := chaos.CheckIdentity(ctx, pool, wh, expect, fo.kind != "lost-tail")
	require.NoError(t, err)
	all := slices.Concat(report.Violations, identity.Violations)
	if identity.Skipped != "" {
		t.Logf("%s: batch identity not checked: %s", cfg.name, identity.Skipped)
	}
	received, unsigned := rc.snapshot()
	if unsigned > 0 {
		all = append(all, fmt.Sprintf("%d notifications were not signed with the tenant's secret", unsigned))
	}
	deliveries, repeated := 0, 0
	for key, ns := range received {
		deliveries += len(ns)
		if len(ns) > 1 {
			repeated++
		}
		for _, n := range ns[1:] {
			if n.Outcome != ns[0].Outcome || n.Status != ns[0].Status || n.Phase != ns[0].Phase || n.BatchID != ns[0].BatchID || n.BatchUID != ns[0].BatchUID || n.Folder != ns[0].Folder {
				all = append(all, fmt.Sprintf("notification key %s told two outcomes: batch %d (%s) of %s %s %s %s, then batch %d (%s) of %s %s %s %s", key,
					ns[0].BatchID, ns[0].BatchUID, ns[0].Folder, ns[0].Outcome, ns[0].Status, ns[0].Phase, n.BatchID, n.BatchUID, n.Folder, n.Outcome, n.Status, n.Phase))
			}
		}
	}
	for _, w := range workers {
		if s := w.starts.Load(); s != 1 {
			all = append(all, fmt.Sprintf("worker %s was started %d times: it exited across the failover", w.name, s))
		}
	}
	var takeovers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches, jsonb_array_elements(execution_lease_terms) WITH ORDINALITY e(term, i) WHERE i > 1`).Scan(&takeovers))
	for _, k := range kinds {
		faults += k
	}
	blocked := 0
	for _, v := range report.Violations {
		if strings.Contains(v, "not Succeeded") {
			blocked++
		}
	}
	t.Logf("%s: %s; faults %v (%s crash at %s, %d bytes of WAL lost, promoted by %s); %d folders (%d bad), %d blocked; batches succeeded %d, failed %d; "+
		"lease terms after the first %d; warehouse uids the database forgot %d, ids named with two uids %d; notifications %d under %d keys (%d keys sent more than once); took %s",
		cfg.name, chaos.Summary(1, faults, report.Batches, len(all)), kinds, crashName(fo.crash), fo.crashAfter, tail.Lost, promotedAt.Round(time.Millisecond),
		len(folders), countBad(folders), blocked, report.Succeeded, report.Failed, takeovers, identity.Forgotten, identity.Reused,
		deliveries, len(received), repeated, took.Round(time.Second))
	for _, v := range all {
		t.Errorf("invariant violation: %s", v)
	}
	return faults, report.Batches, len(all)
}

func crashName(m chaos.CrashMode) string {
	if m == chaos.CrashHost {
		return "host"
	}
	return "server"
}
