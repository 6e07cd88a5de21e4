package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgbouncertest"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/testproc"
	"github.com/fleet/ingest/internal/warehouse/redshift/redshifttest"
)

var (
	chaosFull     = flag.Bool("chaos.full", false, "run the full chaos suite (make chaos) instead of the reduced one")
	chaosScenario = flag.String("chaos.scenario", "", "run only the scenario of this name")
)

// chaosConfig sizes one scenario.
type chaosConfig struct {
	name                 string
	workers              int
	tenants, folders     int
	badFolders           int
	minRows, maxRows     int
	duplicates           int
	faultEvery           time.Duration
	faults               []string
	restartDatabaseAfter time.Duration // 0: never
	// duration is how long folders keep arriving and faults keep coming;
	// after it the scenario drains until deadline.
	duration time.Duration
	deadline time.Duration
	// warehouse is "postgres" (the local warehouse in the operational
	// database, the default) or "redshift": the workers load through the
	// Redshift Data API double, staging in an in-process S3 server.
	warehouse string
	// pgbouncer puts PgBouncer in transaction mode between the cluster
	// and every worker and enqueue process (--database-pooler
	// transaction); the workers' fault proxies sit in front of it.
	pgbouncer bool
	// releases, when set, runs an earlier release beside this one (see
	// chaos_releases_test.go).
	releases *releaseMix
	// failover runs the scenario on a replicated pair instead of the
	// shared cluster, with the primary's failover as its fault:
	// "failover" (synchronous: nothing lost) or "lost-tail" (the standby
	// behind: the operational database goes back in time). See
	// chaos_failover_test.go.
	failover failoverConfig
}

const chaosTTL = 3 * time.Second

var chaosWorkerFlags = []string{"--lease-ttl", "3s", "--lease-renew-every", "1s", "--sweep-interval", "1s",
	"--poll-interval", "200ms", "--stats-interval", "2s", "--concurrency", "2", "--shutdown-grace", "2s", "--orphan-after", "5s", "--log-level", "warn"}

func chaosScenarios() []chaosConfig {
	all := []string{"kill", "stop", "terminate", "stall", "cut"}
	if !*chaosFull {
		return []chaosConfig{{
			name: "reduced", workers: 3, tenants: 4, folders: 5, badFolders: 1, minRows: 40_000, maxRows: 120_000,
			duplicates: 3, faultEvery: time.Second, faults: all, restartDatabaseAfter: 9 * time.Second,
			duration: 20 * time.Second, deadline: 3 * time.Minute,
		}, redshiftScenario, pgbouncerScenario, releasesScenario, failoverScenario(false), lostTailScenario(false)}
	}
	return []chaosConfig{
		{name: "processes", workers: 3, tenants: 6, folders: 8, badFolders: 2, minRows: 40_000, maxRows: 200_000,
			duplicates: 3, faultEvery: 700 * time.Millisecond, faults: []string{"kill", "stop"},
			duration: 60 * time.Second, deadline: 5 * time.Minute},
		{name: "network", workers: 3, tenants: 6, folders: 8, badFolders: 2, minRows: 40_000, maxRows: 200_000,
			duplicates: 3, faultEvery: 700 * time.Millisecond, faults: []string{"terminate", "stall", "cut"},
			duration: 60 * time.Second, deadline: 5 * time.Minute},
		{name: "everything", workers: 4, tenants: 8, folders: 8, badFolders: 3, minRows: 40_000, maxRows: 200_000,
			duplicates: 4, faultEvery: 500 * time.Millisecond, faults: all, restartDatabaseAfter: 25 * time.Second,
			duration: 75 * time.Second, deadline: 6 * time.Minute},
		redshiftScenario, pgbouncerScenario, releasesFullScenario, failoverScenario(true), lostTailScenario(true),
	}
}

// pgbouncerScenario is the reduced scenario with every process connected
// through PgBouncer in transaction mode: the workers' proxies (stalls,
// cuts) in front of PgBouncer, pg_terminate_backend on the server
// connections PgBouncer last lent a worker, and the cluster restarted
// behind PgBouncer.
var pgbouncerScenario = chaosConfig{
	name: "reduced-pgbouncer", pgbouncer: true, workers: 3, tenants: 3, folders: 4, badFolders: 1, minRows: 20_000, maxRows: 60_000,
	duplicates: 3, faultEvery: time.Second, faults: []string{"kill", "stop", "terminate", "stall", "cut"}, restartDatabaseAfter: 9 * time.Second,
	duration: 20 * time.Second, deadline: 3 * time.Minute,
}

// redshiftScenario is the reduced scenario with Redshift as the warehouse:
// real worker processes configured with --warehouse redshift, reaching the
// in-test Data API double and S3 server through endpoint overrides. It is
// smaller than the PostgreSQL one: what it adds is the staging and the
// asynchronous commit, not volume.
var redshiftScenario = chaosConfig{
	name: "reduced-redshift", warehouse: "redshift", workers: 3, tenants: 3, folders: 4, badFolders: 1, minRows: 10_000, maxRows: 40_000,
	duplicates: 3, faultEvery: time.Second, faults: []string{"kill", "stop", "terminate", "stall", "cut"}, restartDatabaseAfter: 9 * time.Second,
	duration: 20 * time.Second, deadline: 3 * time.Minute,
}

// Database users of the Redshift chaos scenario: the migration runs as the
// warehouse's owner, the workers as a loader holding only the grants of
// migration 00003 (role fleet_loader), as in production.
const (
	chaosOwnerSecret  = "arn:aws:secretsmanager:us-east-1:123456789012:secret:chaos-admin-AbCdEf"
	chaosLoaderSecret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:chaos-loader-AbCdEf"
)

// redshiftWarehouse starts what --warehouse redshift reaches in a chaos
// scenario: an S3 server with the staging bucket and the Data API double,
// whose database lives on the test server (the chaos cluster restarts; the
// warehouse does not), with database users modelled. It returns the
// workers' extra environment, the migration's and the workers' flags (each
// with its own database user), and the double's database.
func redshiftWarehouse(t *testing.T) (env, migrateFlags, workerFlags []string, pool *pgxpool.Pool) {
	t.Helper()
	double, env, migrateFlags, workerFlags := redshiftDouble(t)
	return env, migrateFlags, workerFlags, double.Pool
}

// redshiftDouble starts what redshiftWarehouse does and returns the Data
// API double itself, for a test that injects faults into it or reads its
// submissions.
func redshiftDouble(t *testing.T) (double *redshifttest.Double, env, migrateFlags, workerFlags []string) {
	t.Helper()
	srv := s3test.Start(t)
	srv.CreateBucket(t, "chaos-staging")
	double = redshifttest.Start(t, redshifttest.Options{
		DatabaseURL: pgtest.EmptyDatabaseURL(t), S3: srv.Client(), Workgroup: "chaos", Database: "dev",
		Identities: map[string]redshifttest.Identity{
			redshifttest.IdentityKey(chaosOwnerSecret, "", ""):  {User: "chaos_admin", Owner: true},
			redshifttest.IdentityKey(chaosLoaderSecret, "", ""): {User: "chaos_worker", Roles: []string{"fleet_loader"}},
		},
	})
	env = append(srv.Env(), double.Env()...)
	flags := []string{"--warehouse", "redshift", "--redshift-workgroup", "chaos", "--redshift-database", "dev",
		"--redshift-iam-role", "arn:aws:iam::123456789012:role/chaos-copy", "--redshift-staging", "s3://chaos-staging/fleet/"}
	migrateFlags = append(slices.Clone(flags), "--redshift-secret-arn", chaosOwnerSecret)
	workerFlags = append(slices.Clone(flags), "--redshift-secret-arn", chaosLoaderSecret)
	return double, env, migrateFlags, workerFlags
}

// TestChaos runs workers and an enqueue driver against a throwaway
// PostgreSQL cluster while injecting faults, then checks the invariants by
// reading the database. make test runs the reduced suite; make chaos the full.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own PostgreSQL cluster; skipped under -short")
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fleet-chaos-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })

	totalFaults, totalBatches, totalViolations := 0, 0, 0
	scenarios := chaosScenarios()
	if *chaosScenario != "" {
		scenarios = slices.DeleteFunc(scenarios, func(c chaosConfig) bool { return c.name != *chaosScenario })
		require.NotEmpty(t, scenarios, "no scenario %q", *chaosScenario)
	}
	var cluster *chaos.Cluster // shared by the scenarios that do not fail over
	for i, cfg := range scenarios {
		if cfg.failover.kind != "" {
			faults, batches, violations := runFailoverScenario(t, dir, i, cfg)
			totalFaults += faults
			totalBatches += batches
			totalViolations += violations
			continue
		}
		if cluster == nil {
			cluster, err = chaos.StartCluster(ctx, filepath.Join(dir, "pg"), "fsync=off", "full_page_writes=off")
			require.NoError(t, err)
			t.Cleanup(func() { _ = cluster.Stop(context.Background()) })
		}
		faults, batches, violations := runScenario(t, cluster, dir, i, cfg)
		totalFaults += faults
		totalBatches += batches
		totalViolations += violations
	}
	summary := chaos.Summary(len(scenarios), totalFaults, totalBatches, totalViolations)
	t.Log(summary)
	fmt.Println(summary)
	require.Zero(t, totalViolations)
}

type expectedFolder struct {
	tenant, url string
	scope       string
	rows        int
	bad         bool
}

func writeChaosFolder(t *testing.T, dir string, rows int, bad bool) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	var b strings.Builder
	b.WriteString("vehicle_id,seq,lat,lon,speed\n")
	for i := range rows {
		fmt.Fprintf(&b, "VH-%05d,%d,52.%06d,13.%06d,%d\n", i%500, i, i%1000000, (i*7)%1000000, i%130)
		if bad && i == rows/2 {
			b.WriteString("broken,row\n") // a ragged row halfway: a pre-commit data failure
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "part-0.csv"), []byte(b.String()), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644))
	return "file://" + dir
}

// supervisedWorker restarts its worker process whenever it dies, like a
// Deployment does, until stopped.
type supervisedWorker struct {
	t       *testing.T
	name    string
	bin     string // the directory of the worker binary
	url     string
	env     []string // beyond DATABASE_URL
	flags   []string // beyond the chaos flags
	proxy   *chaos.Proxy
	mu      sync.Mutex
	cmd     *exec.Cmd
	logs    *testproc.SyncBuffer
	stopped atomic.Bool
	exited  chan struct{}
	// starts counts the processes started: more than one means the
	// worker died and was restarted.
	starts atomic.Int64
}

func (w *supervisedWorker) run() {
	defer close(w.exited)
	for !w.stopped.Load() {
		args := append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--name", w.name, "--dev-allow-local-folders"}, chaosWorkerFlags...)
		cmd := exec.Command(filepath.Join(w.bin, "worker"), append(args, w.flags...)...)
		cmd.Env = append(append(os.Environ(), "DATABASE_URL="+w.url), w.env...)
		cmd.Stdout, cmd.Stderr = w.logs, w.logs
		if err := cmd.Start(); err != nil {
			w.t.Errorf("starting %s: %v", w.name, err)
			return
		}
		w.starts.Add(1)
		w.mu.Lock()
		w.cmd = cmd
		w.mu.Unlock()
		_ = cmd.Wait()
		if !w.stopped.Load() {
			time.Sleep(500 * time.Millisecond)
		}
	}
}

func (w *supervisedWorker) signal(sig syscall.Signal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cmd == nil || w.cmd.Process == nil {
		return false
	}
	return w.cmd.Process.Signal(sig) == nil
}

func runScenario(t *testing.T, cluster *chaos.Cluster, dir string, n int, cfg chaosConfig) (faults, batches, violations int) {
	ctx := context.Background()
	db := fmt.Sprintf("chaos_%d", n)
	admin, err := pgxpool.New(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+db)
	require.NoError(t, err)
	admin.Close()
	dbURL := cluster.URL(db)
	var whEnv, whMigrateFlags, whFlags []string
	var whPool *pgxpool.Pool
	if cfg.warehouse == "redshift" {
		whEnv, whMigrateFlags, whFlags, whPool = redshiftWarehouse(t)
	}
	migrate := exec.Command(filepath.Join(binDir, "worker"), append([]string{"migrate", "--log-level", "warn"}, whMigrateFlags...)...)
	migrate.Env = append(append(os.Environ(), "DATABASE_URL="+dbURL), whEnv...)
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, string(out))
	cfg.releases.prepare(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	if whPool == nil {
		whPool = pool
	}

	rng, folders := chaosWorkload(t, dir, db, n, cfg)

	// The processes reach the cluster directly, or through PgBouncer.
	server, enqueueURL, poolerEnv := fmt.Sprintf("127.0.0.1:%d", cluster.Port), dbURL, []string(nil)
	if cfg.pgbouncer {
		b := pgbouncertest.Start(t, pgbouncertest.Options{ServerURL: cluster.URL("postgres"), PoolSize: 12})
		server, enqueueURL, poolerEnv = fmt.Sprintf("127.0.0.1:%d", b.Port), b.URL(t, dbURL), pooled
	}

	// Workers behind their own proxies, restarted when they die.
	workers := make([]*supervisedWorker, cfg.workers)
	for i := range workers {
		proxy, err := chaos.NewProxy(server)
		require.NoError(t, err)
		defer proxy.Close()
		bin, name, flags := cfg.releases.worker(n, i)
		workers[i] = &supervisedWorker{
			t: t, name: name, bin: bin, proxy: proxy, logs: &testproc.SyncBuffer{}, exited: make(chan struct{}), env: append(slices.Clone(whEnv), poolerEnv...), flags: append(flags, whFlags...),
			url: fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&application_name=%s", proxy.Addr(), db, name),
		}
		go workers[i].run()
	}
	defer stopWorkers(t, workers)

	// The enqueue driver: every folder enqueued several times at once
	// (duplicate notifications), spread over the first seconds.
	waitDriver := enqueueWave(t, folders, cfg.duplicates, cfg.duration, enqueueURL, poolerEnv, cfg.releases.enqueueBin)

	// Faults on a schedule until every folder has ended.
	start := time.Now()
	restarted := false
	var kinds = map[string]int{}
	// done reads the database, which may be restarting (a fault of the
	// scenario): an error means "not known to be done yet", never a failure.
	done := func() bool { return allEnded(ctx, pool, len(folders)) }
	for i := 0; ; i++ {
		if time.Since(start) > cfg.deadline {
			t.Errorf("scenario %s did not finish within %s", cfg.name, cfg.deadline)
			dumpRunning(t, pool)
			break
		}
		if i > 0 && done() && time.Since(start) > cfg.duration {
			break
		}
		time.Sleep(cfg.faultEvery)
		if time.Since(start) > cfg.duration {
			cfg.releases.retire(t, workers)
			continue // let it drain
		}
		if cfg.restartDatabaseAfter > 0 && !restarted && time.Since(start) > cfg.restartDatabaseAfter {
			took, err := cluster.Restart(ctx, "fast")
			require.NoError(t, err)
			t.Logf("%s: restarted PostgreSQL in %s", cfg.name, took.Round(time.Millisecond))
			restarted = true
			kinds["pg_restart"]++
			continue
		}
		kind := cfg.faults[i%len(cfg.faults)]
		w := cfg.releases.target(ctx, rng, pool, workers, kind)
		switch kind {
		case "kill":
			if w.signal(syscall.SIGKILL) {
				kinds[kind]++
			}
		case "stop":
			if w.signal(syscall.SIGSTOP) {
				kinds[kind]++
				time.AfterFunc(chaosTTL+2*time.Second, func() { w.signal(syscall.SIGCONT) })
			}
		case "terminate":
			var killed int
			_ = pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, w.name).Scan(&killed)
			if killed > 0 {
				kinds[kind]++
			}
		case "stall":
			w.proxy.Stall(chaosTTL + time.Second)
			kinds[kind]++
		case "cut":
			w.proxy.Cut()
			kinds[kind]++
		}
	}
	require.Zero(t, waitDriver(), "every enqueue answered enqueued or conflict")

	// Duplicate notifications after the fact: already succeeded, no new batch.
	for _, f := range folders[:min(4, len(folders))] {
		if f.bad {
			continue // a new notification of a failed folder rightly starts a new batch
		}
		out, code := runEnqueueEnv(t, enqueueURL, poolerEnv, importArgs(f.tenant, f.url)...)
		require.Equal(t, 0, code, out)
		require.Equal(t, "already_succeeded", outcome(t, out)["outcome"])
	}

	report, err := chaos.CheckWith(ctx, pool, whPool, expectations(folders))
	require.NoError(t, err)
	report.Violations = append(report.Violations, cfg.releases.check(ctx, t, pool, workers)...)
	faults = 0
	for _, c := range kinds {
		faults += c
	}
	var takeovers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingestion_batches, jsonb_array_elements(execution_lease_terms) WITH ORDINALITY e(term, i) WHERE i > 1`).Scan(&takeovers))
	t.Logf("%s: %s; faults by kind %v; %d folders (%d bad); batches succeeded %d, failed %d; lease terms after the first %d; took %s",
		cfg.name, chaos.Summary(1, faults, report.Batches, len(report.Violations)), kinds, len(folders), countBad(folders),
		report.Succeeded, report.Failed, takeovers, time.Since(start).Round(time.Second))
	for _, v := range report.Violations {
		t.Errorf("invariant violation: %s", v)
	}
	return faults, report.Batches, len(report.Violations)
}

// chaosWorkload writes the scenario's folders under dir/db: tenants ×
// folders, plus deliberately malformed folders of the first tenant, in a
// shuffled order. The random source it returns also picks the faults.
func chaosWorkload(t *testing.T, dir, db string, n int, cfg chaosConfig) (*rand.Rand, []expectedFolder) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(n)+1, 42))
	var folders []expectedFolder
	for ti := range cfg.tenants {
		for fi := range cfg.folders + cfg.badFolders {
			bad := fi >= cfg.folders && ti == 0
			if fi >= cfg.folders && !bad {
				continue
			}
			rows := cfg.minRows + rng.IntN(cfg.maxRows-cfg.minRows+1)
			url := writeChaosFolder(t, filepath.Join(dir, db, fmt.Sprintf("t%d", ti), fmt.Sprintf("f%d", fi)), rows, bad)
			f, err := folder.Canonicalize(url)
			require.NoError(t, err)
			if bad {
				rows++ // the broken row is a line too; irrelevant for bad folders
			}
			folders = append(folders, expectedFolder{tenant: fmt.Sprintf("tenant-%d", ti), url: url, scope: f.Scope(), rows: rows, bad: bad})
		}
	}
	rng.Shuffle(len(folders), func(i, j int) { folders[i], folders[j] = folders[j], folders[i] })
	return rng, folders
}

// stopWorkers stops the supervised workers (SIGTERM, then SIGKILL after
// 20 s) and shows the tail of their logs if the test failed.
func stopWorkers(t *testing.T, workers []*supervisedWorker) {
	for _, w := range workers {
		w.stopped.Store(true)
		w.signal(syscall.SIGCONT)
		w.signal(syscall.SIGTERM)
	}
	for _, w := range workers {
		select {
		case <-w.exited:
		case <-time.After(20 * time.Second):
			w.signal(syscall.SIGKILL)
			<-w.exited
		}
		if t.Failed() {
			logs := w.logs.String()
			if len(logs) > 6000 {
				logs = logs[len(logs)-6000:]
			}
			t.Logf("%s logs (tail):\n%s", w.name, logs)
		}
	}
}

// enqueueWave is the enqueue driver: every folder enqueued duplicates
// times at once (duplicate notifications), the folders spread over
// spread, the n-th enqueue run from the binaries in bin(n) (nil: this
// build's). Like a storage notification, an enqueue that met an
// unavailable database (exit 1) is delivered again. The returned function
// waits for the wave and says how many enqueues answered neither enqueued,
// already_succeeded (exit 0) nor conflict (exit 3).
func enqueueWave(t *testing.T, folders []expectedFolder, duplicates int, spread time.Duration, enqueueURL string, env []string, bin func(n int) string) (wait func() int64) {
	if bin == nil {
		bin = func(int) string { return binDir }
	}
	var driver sync.WaitGroup
	var enqueueErrors atomic.Int64
	spacing := spread / time.Duration(len(folders)+1)
	for i, f := range folders {
		driver.Go(func() {
			time.Sleep(time.Duration(i) * spacing)
			var dup sync.WaitGroup
			for d := range duplicates {
				dup.Go(func() {
					for attempt := range 30 {
						out, code := runEnqueueFrom(t, bin(i+d), enqueueURL, env, importArgs(f.tenant, f.url)...)
						if code == 0 || code == 3 {
							return
						}
						if code != 1 || attempt == 29 {
							// Said, so a failed run shows which answer it was.
							t.Logf("enqueue of %s (tenant %s) counted as an error: exit %d after %d attempt(s): %s", f.url, f.tenant, code, attempt+1, strings.TrimSpace(out))
							enqueueErrors.Add(1)
							return
						}
						time.Sleep(time.Second)
					}
				})
			}
			dup.Wait()
		})
	}
	return func() int64 {
		driver.Wait()
		return enqueueErrors.Load()
	}
}

// allEnded reports whether no batch is Running and the folders' scopes
// (n of them) all have a batch that ended. It reads a database that may be
// restarting or failing over (a fault of the scenario): an error means
// "not known to have ended yet", never a failure.
func allEnded(ctx context.Context, pool *pgxpool.Pool, n int) bool {
	var open, terminal int
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'Running'), count(DISTINCT source_scope) FILTER (WHERE status <> 'Running')
		FROM ingestion_batches`).Scan(&open, &terminal)
	return err == nil && open == 0 && terminal == n
}

// expectations are what the invariant checker expects of the folders.
func expectations(folders []expectedFolder) []chaos.Expectation {
	expect := make([]chaos.Expectation, 0, len(folders))
	for _, f := range folders {
		expect = append(expect, chaos.Expectation{TenantID: f.tenant, Scope: f.scope, Records: int64(f.rows), Bad: f.bad})
	}
	return expect
}

func countBad(folders []expectedFolder) int {
	n := 0
	for _, f := range folders {
		if f.bad {
			n++
		}
	}
	return n
}

// dumpRunning logs what is left Running and the River jobs for it.
func dumpRunning(t *testing.T, pool *pgxpool.Pool) {
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		SELECT b.id, b.details->>'phase', COALESCE(b.execution_lease_id, '-'), COALESCE((b.execution_lease_expires_at - now())::text, '-'),
		       b.execution_lease_generation, b.execution_lease_terms, b.details->'writes',
		       COALESCE((SELECT jsonb_agg(jsonb_build_object('id', j.id, 'state', j.state, 'attempt', j.attempt, 'scheduled_at', j.scheduled_at, 'args', j.args, 'errors', j.errors, 'metadata', j.metadata))
		                 FROM river_job j WHERE (j.args->>'batch_id')::bigint = b.id), '[]')
		FROM ingestion_batches b WHERE status = 'Running'`)
	if err != nil {
		t.Logf("dump: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, gen                  int64
			phase, holder, expiresIn string
			leases, writes, jobs     []byte
		)
		if err := rows.Scan(&id, &phase, &holder, &expiresIn, &gen, &leases, &writes, &jobs); err != nil {
			t.Logf("dump: %v", err)
			return
		}
		t.Logf("STILL RUNNING batch %d phase %s holder %s expires in %s gen %d\n leases %s\n writes %s\n jobs %s", id, phase, holder, expiresIn, gen, leases, writes, jobs)
	}
}
