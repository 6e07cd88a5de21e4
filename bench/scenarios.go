package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/warehouse"
)

func (e *env) enqueuer(pool *pgxpool.Pool) (*jobs.Enqueuer, error) {
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	return &jobs.Enqueuer{Pool: pool, River: client, Logger: slog.New(slog.DiscardHandler)}, nil
}

const enqueueBaseline = `\set n random(1, 2000000000)
BEGIN;
INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope)
  VALUES ('company-1', 'tenant-bench', 'tenant_db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Running', '{"version": 1, "phase": "reserved"}', 'fleet_s3' || chr(58) || 's3://pgbench/' || :client_id::text || '-' || :n::text || '-' || random()::text);
INSERT INTO river_job (args, kind, max_attempts, queue) VALUES ('{"batch_id": 1}', 'bench_baseline', 25, 'bench_baseline');
COMMIT;
`

// benchEnqueue: reserve + River job insert committed per transaction,
// against the same two raw INSERTs per transaction sent through pgx from
// this process (the baseline of the target: the same client stack) and
// through pgbench (in the note).
func benchEnqueue(e *env) error {
	for _, clients := range []int{1, 8, 32} {
		ours, lat, cost, err := e.inProcessEnqueue(clients, fmt.Sprintf("enqueue, %d clients", clients))
		if err != nil {
			return err
		}
		if err := e.reset(); err != nil {
			return err
		}
		base, err := e.pgbench(enqueueBaseline, clients, e.phase)
		if err != nil {
			return err
		}
		if err := e.reset(); err != nil {
			return err
		}
		rawN, rawCost, err := e.measure(fmt.Sprintf("raw pgx two INSERTs, %d clients", clients), "transactions", func() (int, error) {
			n, _, err := timed(e.ctx, clients, e.phase, func(ctx context.Context, c, i int) error {
				return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope)
						VALUES ('company-1', 'tenant-bench', 'tenant_db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Running', '{"version": 1, "phase": "reserved"}', $1)`,
						fmt.Sprintf("fleet_s3:s3://pgx/%d-%d-%016x", c, i, rand.Uint64())); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue) VALUES ('{"batch_id": 1}', 'bench_baseline', 25, 'bench_baseline')`)
					return err
				})
			})
			return n, err
		})
		if err != nil {
			return err
		}
		raw := float64(rawN) / e.phase.Seconds()
		e.add(fmt.Sprintf("enqueue throughput, %d client(s)", clients), ours, ptr(raw), "enqueues/s", 0.8, false,
			fmt.Sprintf("p50 %s, p99 %s; baseline: the same two INSERTs per transaction through pgx from the harness; pgbench: %.0f/s (ours = %.2f of that); "+
				"per enqueue: PostgreSQL CPU %.0f µs (baseline %.0f µs), harness CPU %.0f µs (baseline %.0f µs)",
				percentile(lat, 50).Round(time.Microsecond), percentile(lat, 99).Round(time.Microsecond), base, ours/base,
				1e6*cost.serverCPU, 1e6*rawCost.serverCPU, 1e6*cost.harnessCPU, 1e6*rawCost.harnessCPU))
		e.charts = append(e.charts, chart{group: "enqueue", x: float64(clients), p50: percentile(lat, 50), p90: percentile(lat, 90), p99: percentile(lat, 99)})
		if clients < 8 {
			continue
		}
		grouped, glat, gcost, err := e.inProcessEnqueueWith(clients, fmt.Sprintf("enqueue through group commit, %d clients", clients), true)
		if err != nil {
			return err
		}
		e.add(fmt.Sprintf("enqueue throughput through group commit, %d client(s)", clients), grouped, ptr(raw), "enqueues/s", 0.8, false,
			fmt.Sprintf("Enqueuer.Import through jobs.Grouper (linger %s, groups of at most %d); p50 %s, p99 %s; baseline: the same two INSERTs per transaction through pgx from the harness, same run; "+
				"per enqueue: %.3f commits, PostgreSQL CPU %.0f µs, harness CPU %.0f µs",
				jobs.GroupLingerDefault, jobs.GroupMaxDefault, percentile(glat, 50).Round(time.Microsecond), percentile(glat, 99).Round(time.Microsecond),
				gcost.commits, 1e6*gcost.serverCPU, 1e6*gcost.harnessCPU))
	}
	return nil
}

// inProcessEnqueue measures Enqueuer.Import from clients goroutines of this
// process on an empty database: enqueues per second, latencies and costs.
func (e *env) inProcessEnqueue(clients int, label string) (float64, []time.Duration, perOp, error) {
	return e.inProcessEnqueueWith(clients, label, false)
}

// inProcessEnqueueWith is inProcessEnqueue, through group commit
// (jobs.Grouper at its defaults) if grouped.
func (e *env) inProcessEnqueueWith(clients int, label string, grouped bool) (float64, []time.Duration, perOp, error) {
	if err := e.reset(); err != nil {
		return 0, nil, perOp{}, err
	}
	enq, err := e.enqueuer(e.pool)
	if err != nil {
		return 0, nil, perOp{}, err
	}
	importer := jobs.NewGrouper(enq, jobs.GroupConfig{})
	if grouped {
		importer = jobs.NewGrouper(enq, jobs.GroupConfig{Linger: jobs.GroupLingerDefault})
	}
	var lat []time.Duration
	n, cost, err := e.measure(label, "enqueues", func() (n int, err error) {
		n, lat, err = timed(e.ctx, clients, e.phase, func(ctx context.Context, c, i int) error {
			res, err := importer.Import(ctx, jobs.ImportRequest{TenantID: "tenant-bench", TenantDatabase: "tenant_db", CompanyID: "company-1",
				// Random names, like the baseline's, so neither piles onto one index page.
				Folder: fmt.Sprintf("s3://bench-bucket/tenants/tenant-bench/tenant_db/company-1/%d-%d-%016x", c, i, rand.Uint64())})
			if err == nil && res.Outcome != jobs.OutcomeEnqueued {
				err = fmt.Errorf("outcome %s", res.Outcome)
			}
			return err
		})
		return n, err
	})
	return float64(n) / e.phase.Seconds(), lat, cost, err
}

// benchConflict: 32 clients importing one folder that a running batch holds.
func benchConflict(e *env) error {
	if err := e.reset(); err != nil {
		return err
	}
	enq, err := e.enqueuer(e.pool)
	if err != nil {
		return err
	}
	req := jobs.ImportRequest{TenantID: "tenant-bench", TenantDatabase: "tenant_db", CompanyID: "company-1", Folder: "s3://bench-bucket/hot/folder"}
	n, lat, err := timed(e.ctx, 32, e.phase, func(ctx context.Context, c, i int) error {
		_, err := enq.Import(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	var reservations int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM ingestion_batches WHERE `+current).Scan(&reservations); err != nil {
		return err
	}
	if reservations != 1 {
		return fmt.Errorf("%d reservations for one folder", reservations)
	}
	base, err := e.pgbench(`SELECT id FROM ingestion_batches WHERE tenant_id = 'tenant-bench' AND source_scope = 'fleet_s3' || chr(58) || 's3://bench-bucket/hot/folder' AND status = 'Running';`, 32, e.phase)
	if err != nil {
		return err
	}
	e.add("conflict path, 32 clients on one folder", float64(n-1)/e.phase.Seconds(), ptr(base), "conflicts/s", 0, false,
		fmt.Sprintf("exactly %d reservation; p99 %s; baseline: pgbench SELECT of the running batch by (tenant, scope)", reservations, percentile(lat, 99).Round(time.Microsecond)))
	e.addTarget("conflict path p99 latency", float64(percentile(lat, 99).Microseconds())/1000, "ms", "exactly one reservation", reservations == 1, "32 clients")
	return nil
}

// benchLeases: acquire and renew against a raw single-row UPDATE of the
// same table by pgbench (the target's baseline) and by pgx from the harness
// (in the note: the client stack's share).
func benchLeases(e *env) error {
	if err := e.reset(); err != nil {
		return err
	}
	const prepared = 60000
	if err := e.exec(`
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status, details, source_scope)
		SELECT 'c', 'tenant-bench', 'db', 'FileUpload', 'FleetS3', 'fleet_s3_direct_to_curated', 'Running',
		       '{"version":1,"phase":"reserved"}', 'fleet_s3:s3://bench-bucket/lease/' || g
		FROM generate_series(1, $1) g`, prepared); err != nil {
		return err
	}
	// A steady state for every phase below: after a checkpoint, one update
	// of every row writes each page's full-page image, and a vacuum clears
	// the old versions, so no phase pays for the first touch of a page.
	for _, sql := range []string{`VACUUM ANALYZE ingestion_batches`, `CHECKPOINT`,
		`UPDATE ingestion_batches SET updated_at = updated_at WHERE ` + current, `VACUUM ingestion_batches`} {
		if err := e.exec(sql); err != nil {
			return err
		}
	}
	var firstID int64
	if err := e.pool.QueryRow(e.ctx, `SELECT min(id) FROM ingestion_batches WHERE `+current).Scan(&firstID); err != nil {
		return err
	}
	lastID := firstID + prepared - 1
	leases := lease.NewStore(e.pool)
	next := firstID
	n, acq, err := e.measure("lease acquire, 1 client", "acquisitions", func() (int, error) {
		n, _, err := timed(e.ctx, 1, e.phase, func(ctx context.Context, c, i int) error {
			if next > lastID-16 {
				return fmt.Errorf("ran out of prepared batches")
			}
			a, err := leases.Acquire(ctx, next, fmt.Sprintf("bench-%d", i), time.Minute)
			next++
			if err == nil && a.Outcome != lease.Acquired {
				err = fmt.Errorf("outcome %s", a.Outcome)
			}
			return err
		})
		return n, err
	})
	if err != nil {
		return err
	}
	acquire := float64(n) / e.phase.Seconds()
	// The same access pattern: a different row of the prepared ones each time.
	rawUpdate, err := e.pgbench(fmt.Sprintf("\\set id random(%d, %d)\nUPDATE ingestion_batches SET updated_at = now() WHERE id = :id;\n", firstID, lastID), 1, e.phase)
	if err != nil {
		return err
	}
	rawPgx, rawCost, err := e.rawUpdates(1, func(c, i int) int64 { return firstID + rand.Int64N(prepared) })
	if err != nil {
		return err
	}
	e.add("lease acquire, 1 client", acquire, ptr(rawUpdate), "ops/s", 0.8, false,
		fmt.Sprintf("fresh batches, each acquisition also appending its term to execution_lease_terms; baseline: pgbench raw single-row UPDATE of a random prepared batch; "+
			"the same UPDATE through pgx from the harness: %.0f/s (ours = %.2f of that); per acquisition %.0f µs PostgreSQL CPU, %.0f WAL bytes (raw UPDATE: %.0f µs, %.0f bytes)",
			rawPgx, acquire/rawPgx, 1e6*acq.serverCPU, acq.walBytes, 1e6*rawCost.serverCPU, rawCost.walBytes))

	held := make([]lease.Lease, 8)
	for c := range held {
		a, err := leases.Acquire(e.ctx, lastID-int64(c), fmt.Sprintf("renewer-%d", c), time.Hour)
		if err != nil {
			return err
		}
		held[c] = a.Lease
	}
	for _, clients := range []int{1, 8} {
		n, ren, err := e.measure(fmt.Sprintf("lease renew, %d clients", clients), "renewals", func() (int, error) {
			n, _, err := timed(e.ctx, clients, e.phase, func(ctx context.Context, c, i int) error {
				l, ok, err := leases.Renew(ctx, held[c], time.Hour)
				if err == nil && !ok {
					err = fmt.Errorf("renewal lost")
				}
				held[c] = l
				return err
			})
			return n, err
		})
		if err != nil {
			return err
		}
		renew := float64(n) / e.phase.Seconds()
		base, err := e.pgbench(fmt.Sprintf(`UPDATE ingestion_batches SET updated_at = now() WHERE id = %d - :client_id::bigint;`, lastID), clients, e.phase)
		if err != nil {
			return err
		}
		rawPgx, rawCost, err := e.rawUpdates(clients, func(c, i int) int64 { return lastID - int64(c) })
		if err != nil {
			return err
		}
		e.add(fmt.Sprintf("lease renew, %d client(s)", clients), renew, ptr(base), "ops/s", 0.8, false,
			fmt.Sprintf("baseline: pgbench raw single-row UPDATE by id, one row per client; the same UPDATE through pgx from the harness: %.0f/s (ours = %.2f of that); "+
				"per renewal %.0f µs PostgreSQL CPU, %.0f WAL bytes (raw UPDATE: %.0f µs, %.0f bytes)",
				rawPgx, renew/rawPgx, 1e6*ren.serverCPU, ren.walBytes, 1e6*rawCost.serverCPU, rawCost.walBytes))
	}
	return nil
}

// rawUpdates measures the baseline's single-row UPDATE sent through pgx from
// this process, with clients goroutines updating the rows id(c, i).
func (e *env) rawUpdates(clients int, id func(c, i int) int64) (float64, perOp, error) {
	n, cost, err := e.measure(fmt.Sprintf("raw pgx UPDATE, %d clients", clients), "updates", func() (int, error) {
		n, _, err := timed(e.ctx, clients, e.phase, func(ctx context.Context, c, i int) error {
			_, err := e.pool.Exec(ctx, `UPDATE ingestion_batches SET updated_at = now() WHERE id = $1`, id(c, i))
			return err
		})
		return n, err
	})
	return float64(n) / e.phase.Seconds(), cost, err
}

// benchLoad: rows per second of the load phase against psql \copy of the
// same records into the same table.
func benchLoad(e *env) error {
	const rows = 200_000
	dir := filepath.Join(e.dir, "load")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var src, copyCSV strings.Builder
	src.WriteString("vehicle_id,recorded_at,latitude,longitude,speed_kmh,odometer_km,driver,status\n")
	for i := range rows {
		v := []string{fmt.Sprintf("VH-%07d", i), fmt.Sprintf("2026-11-30T10:%02d:%02dZ", i%60, (i/60)%60), fmt.Sprintf("52.%06d", i%1000000),
			fmt.Sprintf("13.%06d", (i*7)%1000000), fmt.Sprint(i % 130), fmt.Sprint(100000 + i), fmt.Sprintf("driver-%05d", i%50000), "moving"}
		src.WriteString(strings.Join(v, ",") + "\n")
		fmt.Fprintf(&copyCSV, "tenant-bench,fleet_s3:file://%s,1,%s/part-0.csv,%d,\"{\"\"vehicle_id\"\":\"\"%s\"\",\"\"recorded_at\"\":\"\"%s\"\",\"\"latitude\"\":\"\"%s\"\",\"\"longitude\"\":\"\"%s\"\",\"\"speed_kmh\"\":\"\"%s\"\",\"\"odometer_km\"\":\"\"%s\"\",\"\"driver\"\":\"\"%s\"\",\"\"status\"\":\"\"%s\"\"}\"\n",
			dir, dir, i+2, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
	}
	if err := os.WriteFile(filepath.Join(dir, "part-0.csv"), []byte(src.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644); err != nil { // the completion marker the worker requires
		return err
	}
	copyFile := filepath.Join(e.dir, "records.csv")
	if err := os.WriteFile(copyFile, []byte(copyCSV.String()), 0o644); err != nil {
		return err
	}
	f, err := folder.Canonicalize("file://" + dir)
	if err != nil {
		return err
	}
	source, err := folder.Opener{}.Open(e.ctx, f)
	if err != nil {
		return err
	}
	objs, err := source.Objects(e.ctx)
	if err != nil {
		return err
	}
	wh := warehouse.NewPostgres(e.pool)
	best := func(fn func() error) (time.Duration, error) {
		var fastest time.Duration
		for range 3 {
			if err := e.reset(); err != nil {
				return 0, err
			}
			t := time.Now()
			if err := fn(); err != nil {
				return 0, err
			}
			if d := time.Since(t); fastest == 0 || d < fastest {
				fastest = d
			}
		}
		return fastest, nil
	}
	ours, err := best(func() error {
		_, err := wh.Load(e.ctx, warehouse.Slice{TenantID: "tenant-bench", SourceScope: f.Scope(), BatchID: 1, Generation: 1}, source, objs, nil)
		return err
	})
	if err != nil {
		return err
	}
	psql, err := best(func() error {
		out, err := exec.CommandContext(e.ctx, "psql", e.dbURL, "-v", "ON_ERROR_STOP=1", "-c",
			`\copy curated.fleet_records (tenant_id, source_scope, batch_id, object_key, line_number, record) FROM '`+copyFile+`' CSV`).CombinedOutput()
		if err != nil {
			return fmt.Errorf("psql: %v: %s", err, out)
		}
		return nil
	})
	if err != nil {
		return err
	}
	e.add("load phase, 200,000 CSV rows", rows/ours.Seconds(), ptr(rows/psql.Seconds()), "rows/s", 0.8, false,
		"best of 3; ours reads and converts the CSV objects; baseline: psql \\copy of the same records already in the table's shape")
	return nil
}

// workerProc is a worker process started by the harness.
type workerProc struct {
	name string
	cmd  *exec.Cmd
	logs *os.File
}

var workerSeq int

// workerPIDs returns the worker processes the harness is running.
func (e *env) workerPIDs() []int {
	var pids []int
	for _, p := range e.workers {
		pids = append(pids, p.cmd.Process.Pid)
	}
	return pids
}

func (e *env) startWorkers(n int, extra ...string) ([]*workerProc, error) {
	var procs []*workerProc
	for range n {
		workerSeq++
		name := fmt.Sprintf("bench-w%d", workerSeq)
		logs, err := os.Create(filepath.Join(e.dir, name+".log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(e.workerBin, append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--name", name, "--log-level", "warn", "--dev-allow-local-folders"}, extra...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+e.dbURL)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, &workerProc{name: name, cmd: cmd, logs: logs})
	}
	e.workers = append(e.workers, procs...)
	// Wait until every River client registered its queue and answers.
	time.Sleep(1500 * time.Millisecond)
	return procs, nil
}

func (e *env) stopWorkers(procs []*workerProc) {
	e.workers = slices.DeleteFunc(e.workers, func(w *workerProc) bool { return slices.Contains(procs, w) })
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		p.logs.Close()
		if st := p.cmd.ProcessState; st != nil {
			e.exitedWorkerCPU += (st.UserTime() + st.SystemTime()).Seconds()
		}
	}
}

// benchIdle: statements per second and memory of a worker with nothing to do.
func benchIdle(e *env) error {
	if err := e.reset(); err != nil {
		return err
	}
	procs, err := e.startWorkers(1)
	if err != nil {
		return err
	}
	defer e.stopWorkers(procs)
	time.Sleep(2 * time.Second)
	if err := e.exec(`SELECT pg_stat_statements_reset()`); err != nil {
		return err
	}
	const window = 20 * time.Second
	time.Sleep(window)
	var calls float64
	if err := e.pool.QueryRow(e.ctx, `
		SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_statements%'`).Scan(&calls); err != nil {
		return err
	}
	idleRSS, err := rss(procs[0].cmd.Process.Pid)
	if err != nil {
		return err
	}
	e.add("worker idle cost", calls/window.Seconds(), nil, "statements/s", 0, false,
		fmt.Sprintf("pg_stat_statements over %s with default intervals (fetch poll 1 s, sweep 5 s, gauges 15 s, River maintenance)", window))
	e.add("worker resident memory, idle", float64(idleRSS)/(1<<20), nil, "MiB", 0, false, "VmRSS")
	return nil
}

// benchEndToEnd: batches per second and enqueue→Succeeded latency with a
// trivial folder and 1–4 worker processes, against River's own no-op job
// throughput with the same number of workers and concurrency.
func benchEndToEnd(e *env) error {
	// At --concurrency 4 River fetches at most 4 jobs per fetch cooldown,
	// so ours and River's no-op sit near its fetch limiter's rate; at 32
	// the figure says how fast a worker process carries batches.
	const maxWorkers = 4
	concurrencies := []int{4, 32}
	batchesAt := func(concurrency int) int { return 200 * max(1, concurrency/8) }
	folderDir := filepath.Join(e.dir, "trivial")
	most := batchesAt(concurrencies[len(concurrencies)-1])
	if err := writeTrivialFolders(folderDir, most*maxWorkers); err != nil {
		return err
	}
	enq, err := e.enqueuer(e.pool)
	if err != nil {
		return err
	}
	var peakRSS int64
	for _, concurrency := range concurrencies {
		batches := batchesAt(concurrency)
		worst := math.Inf(1)
		for workers := 1; workers <= maxWorkers; workers++ {
			ratio, rss, err := e.endToEnd(enq, folderDir, workers, concurrency, batches)
			if err != nil {
				return err
			}
			worst = min(worst, ratio)
			peakRSS = max(peakRSS, rss)
		}
		if concurrency == 32 {
			e.add(fmt.Sprintf("end to end, 1 to %d worker processes, concurrency %d: worst ratio", maxWorkers, concurrency), worst, nil, "ratio", 0, false,
				"information, not a target (see endToEndNote): the lowest of the four end-to-end ratios at this concurrency (ours over River no-op jobs at the same MaxWorkers, same run)")
		}
	}
	e.add("worker resident memory, under load", float64(peakRSS)/(1<<20), nil, "MiB", 0, false, "peak VmRSS sampled every 100 ms during the end-to-end runs")
	return nil
}

// trivialRun is what trivialBatches measured.
type trivialRun struct {
	rate    float64 // batches per second, first start to last completion
	cost    perOp   // per batch
	lat     []time.Duration
	peakRSS int64 // the workers' peak resident memory
}

// trivialBatches enqueues batches trivial folders in one burst on an
// emptied database and measures them through workers worker processes at
// --concurrency concurrency until every one succeeded (label names the
// measured phase). With warm > 0 a burst of warm folders of
// folderDir+"-warm" goes through the workers first, unmeasured: their
// connections are open and their statements prepared when the measured
// burst comes.
func (e *env) trivialBatches(enq *jobs.Enqueuer, folderDir string, workers, concurrency, batches, warm int, label string) (trivialRun, error) {
	if err := e.reset(); err != nil {
		return trivialRun{}, err
	}
	procs, err := e.startWorkers(workers, "--concurrency", fmt.Sprint(concurrency))
	if err != nil {
		return trivialRun{}, err
	}
	var peakRSS int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, p := range procs {
				if r, err := rss(p.cmd.Process.Pid); err == nil && r > peakRSS {
					peakRSS = r
				}
			}
		}
	}()
	burst := func(dir string, n int) []jobs.ImportRequest {
		reqs := make([]jobs.ImportRequest, n)
		for i := range reqs {
			reqs[i] = jobs.ImportRequest{TenantID: "tenant-bench", TenantDatabase: "tenant_db", CompanyID: "company-1",
				Folder: "file://" + filepath.Join(dir, fmt.Sprint((workers-1)*n+i))}
		}
		return reqs
	}
	if warm > 0 {
		res, err := enq.ImportMany(e.ctx, burst(folderDir+"-warm", warm))
		if err != nil {
			return trivialRun{}, err
		}
		from := res[0].BatchID
		for _, r := range res {
			from = min(from, r.BatchID)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			var done int
			if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM ingestion_batches WHERE id >= $1 AND status = 'Succeeded'`, from).Scan(&done); err != nil {
				return trivialRun{}, err
			}
			if done == warm {
				break
			}
			if time.Now().After(deadline) {
				return trivialRun{}, fmt.Errorf("%d of %d warm-up batches succeeded in a minute", done, warm)
			}
		}
	}
	reqs := burst(folderDir, batches)
	var first int64
	_, cost, err := e.measure(label, "batches", func() (int, error) {
		// One burst, as River's baseline inserts its jobs with one InsertMany.
		res, err := enq.ImportMany(e.ctx, reqs)
		if err != nil {
			return 0, err
		}
		first = res[0].BatchID
		for _, r := range res {
			first = min(first, r.BatchID)
		}
		deadline := time.Now().Add(3 * time.Minute)
		for {
			// The run's batches by their ids (the primary key), not by a
			// scan past the history: the harness's polls cost the server
			// as little as River's baseline's.
			var done int
			if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM ingestion_batches WHERE id >= $1 AND status = 'Succeeded'`, first).Scan(&done); err != nil {
				return 0, err
			}
			if done == batches {
				// Stopped workers' connections flush their statistics.
				close(stopSampling)
				<-sampled
				e.stopWorkers(procs)
				return batches, nil
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%d of %d batches succeeded in 3 minutes", done, batches)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err != nil {
		return trivialRun{}, err
	}
	var span float64
	var lat []time.Duration
	rows, err := e.pool.Query(e.ctx, `SELECT completed_at - started_at FROM ingestion_batches WHERE id >= $1 AND `+current, first)
	if err != nil {
		return trivialRun{}, err
	}
	for rows.Next() {
		var d time.Duration
		if err := rows.Scan(&d); err != nil {
			rows.Close()
			return trivialRun{}, err
		}
		lat = append(lat, d)
	}
	rows.Close()
	if err := e.pool.QueryRow(e.ctx, `SELECT EXTRACT(EPOCH FROM max(completed_at) - min(started_at)) FROM ingestion_batches WHERE id >= $1 AND `+current, first).Scan(&span); err != nil {
		return trivialRun{}, err
	}
	return trivialRun{rate: float64(batches) / span, cost: cost, lat: lat, peakRSS: peakRSS}, nil
}

// endToEnd runs batches trivial folders through workers worker processes
// at --concurrency concurrency, then as many River no-op jobs through as
// many River clients with MaxWorkers concurrency, and adds their rows: the
// rate, and the write transactions per batch. It returns the rate's ratio
// and the workers' peak resident memory.
func (e *env) endToEnd(enq *jobs.Enqueuer, folderDir string, workers, concurrency, batches int) (float64, int64, error) {
	label := fmt.Sprintf("end to end, %d worker process(es), concurrency %d", workers, concurrency)
	run, err := e.trivialBatches(enq, folderDir, workers, concurrency, batches, 0, label)
	if err != nil {
		return 0, 0, err
	}
	ours, cost, lat, peakRSS := run.rate, run.cost, run.lat, run.peakRSS
	var noop float64
	_, noopCost, err := e.measure(fmt.Sprintf("River no-op jobs, %d clients, MaxWorkers %d", workers, concurrency), "jobs", func() (int, error) {
		var err error
		noop, err = e.riverNoop(workers, concurrency, batches)
		return batches, err
	})
	if err != nil {
		return 0, 0, err
	}
	// Information, not targets: see endToEndNote. The primary's cost per
	// batch is measured against the protocol floor (benchFloor).
	e.add(label, ours, ptr(noop), "batches/s", 0, false, endToEndNote+
		fmt.Sprintf("; %d trivial batches; enqueue→Succeeded p50 %s, p99 %s; per batch: %.1f transactions (%.2f writing), %.1f statements, %.2f WAL fsyncs, %.1f ms PostgreSQL CPU, %.1f ms worker CPU; baseline: River no-op jobs, %d client(s) × MaxWorkers %d, same run",
			batches, percentile(lat, 50).Round(time.Millisecond), percentile(lat, 99).Round(time.Millisecond),
			cost.commits, cost.writeTxns, cost.statements, cost.walSyncs, 1000*cost.serverCPU, 1000*cost.workerCPU, workers, concurrency)+
		fmt.Sprintf(" (per job, client start included: %.1f transactions (%.2f writing), %.1f statements, %.2f WAL fsyncs, %.1f ms PostgreSQL CPU)",
			noopCost.commits, noopCost.writeTxns, noopCost.statements, noopCost.walSyncs, 1000*noopCost.serverCPU))
	// Write transactions per batch: everything the cluster wrote during
	// the phase (the enqueue burst, River's fetches, completions and
	// maintenance, the batch's own transactions, the sweeper) over the
	// batches; River's no-op job is the floor any job pays.
	// Compared as shown, to two decimals: the few writes of the window
	// that belong to no batch (River's leadership, the sweeper), a
	// thousandth or so per batch, are not the batch's own.
	own := cost.writeTxns - noopCost.writeTxns
	e.addTarget(label+": write transactions per batch", cost.writeTxns, "write transactions", "<= 3 besides River's own per job", math.Round(100*own) <= 300,
		fmt.Sprintf("transactions that took a transaction id (pg_current_snapshot's xmax before and after), over the batches: the enqueue burst, River's fetches, completions and maintenance, the batch's acquire+loading, load+publishing and publication+Succeeded transactions, the sweeper; River's no-op job: %.2f; the batch's own beyond River's: %.2f",
			noopCost.writeTxns, own))
	if concurrency == 32 || workers == 1 {
		e.add(label+": PostgreSQL CPU per batch", 1000*cost.serverCPU, ptr(1000*noopCost.serverCPU), "ms", 0, true,
			fmt.Sprintf("information, not a target: the primary's CPU per batch is compared with the protocol floor's (rows \"ours vs the protocol floor\"); CPU time of every PostgreSQL process (/proc) during the phase over the batches, local warehouse included; baseline: River's no-op job, %.2f ms", 1000*noopCost.serverCPU))
	}
	group := "end-to-end"
	if concurrency != 4 {
		group = fmt.Sprintf("end-to-end-c%d", concurrency)
	}
	e.charts = append(e.charts, chart{group: group, x: float64(workers), p50: percentile(lat, 50), p90: percentile(lat, 90), p99: percentile(lat, 99)})
	return ours / noop, peakRSS, nil
}

// endToEndNote says why the end-to-end rows against River's no-op jobs
// carry no target.
const endToEndNote = "information, not a target: on 2 shared cores this ratio mostly says how much more CPU a batch takes than a job that does nothing once the machine is saturated (the worker processes' CPU competes with the server's), not what the protocol costs the primary, which the rows \"ours vs the protocol floor\" measure"

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

// riverNoop measures River's own throughput for no-op jobs with clients ×
// maxWorkers workers, each client on its own pool, as the worker processes are.
func (e *env) riverNoop(clients, maxWorkers, n int) (float64, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[noopArgs]) error { return nil }))
	var started []*river.Client[pgx.Tx]
	var pools []*pgxpool.Pool
	defer func() {
		for _, c := range started {
			_ = c.Stop(context.Background())
		}
		for _, p := range pools {
			p.Close()
		}
	}()
	for i := range clients {
		pool, err := pgxpool.New(e.ctx, e.dbURL)
		if err != nil {
			return 0, err
		}
		pools = append(pools, pool)
		c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
			ID: fmt.Sprintf("noop-%d", i), Queues: map[string]river.QueueConfig{"bench_noop": {MaxWorkers: maxWorkers}}, Workers: workers,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return 0, err
		}
		if err := c.Start(e.ctx); err != nil {
			return 0, err
		}
		started = append(started, c)
	}
	time.Sleep(1500 * time.Millisecond)
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{}, InsertOpts: &river.InsertOpts{Queue: "bench_noop"}}
	}
	if _, err := started[0].InsertMany(e.ctx, params); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var done int
		if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM river_job WHERE kind = 'bench_noop' AND state = 'completed'`).Scan(&done); err != nil {
			return 0, err
		}
		if done == n {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("river completed %d of %d no-op jobs in 2 minutes", done, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var span float64
	if err := e.pool.QueryRow(e.ctx, `SELECT EXTRACT(EPOCH FROM max(finalized_at) - min(created_at)) FROM river_job WHERE kind = 'bench_noop'`).Scan(&span); err != nil {
		return 0, err
	}
	return float64(n) / span, nil
}

// benchTakeover: SIGKILL the worker holding a lease; the time until another
// worker has taken the batch over, over several trials.
func benchTakeover(e *env, trials int) error {
	const ttl = 3 * time.Second
	flags := []string{"--lease-ttl", "3s", "--lease-renew-every", "1s", "--sweep-interval", "1s", "--poll-interval", "200ms"}
	if err := e.reset(); err != nil {
		return err
	}
	enq, err := e.enqueuer(e.pool)
	if err != nil {
		return err
	}
	alive, err := e.startWorkers(2, flags...)
	if err != nil {
		return err
	}
	defer func() { e.stopWorkers(alive) }()
	var delays []time.Duration
	for trial := range trials {
		dir := filepath.Join(e.dir, "takeover", fmt.Sprint(trial))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "a.csv"), []byte("k\n1\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "_SUCCESS"), nil, 0o644); err != nil { // the completion marker the worker requires
			return err
		}
		// Hold a lock that keeps the load waiting, so the holder is caught mid-load.
		blocker, err := e.pool.Begin(e.ctx)
		if err != nil {
			return err
		}
		if _, err := blocker.Exec(e.ctx, `LOCK TABLE curated.fleet_records IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		res, err := enq.Import(e.ctx, jobs.ImportRequest{TenantID: "tenant-bench", TenantDatabase: "db", CompanyID: "c", Folder: "file://" + dir})
		if err != nil {
			return err
		}
		var holder string
		var gen int64
		for deadline := time.Now().Add(30 * time.Second); ; {
			if err := e.pool.QueryRow(e.ctx, `SELECT COALESCE(execution_lease_id, ''), execution_lease_generation FROM ingestion_batches WHERE id = $1`, res.BatchID).Scan(&holder, &gen); err != nil {
				return err
			}
			if holder != "" {
				break
			}
			if time.Now().After(deadline) {
				_ = blocker.Rollback(e.ctx)
				return fmt.Errorf("trial %d: nobody took the lease", trial)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Kill whichever worker holds it.
		var target *workerProc
		for i, p := range alive {
			if strings.HasPrefix(holder, p.name+"/") {
				target = p
				alive = append(alive[:i:i], alive[i+1:]...)
				break
			}
		}
		if target == nil {
			return fmt.Errorf("trial %d: holder %s is none of the workers", trial, holder)
		}
		_ = target.cmd.Process.Kill()
		killed := time.Now()
		_ = target.cmd.Wait()
		target.logs.Close()
		for deadline := time.Now().Add(ttl + 30*time.Second); ; {
			var g int64
			if err := e.pool.QueryRow(e.ctx, `SELECT execution_lease_generation FROM ingestion_batches WHERE id = $1`, res.BatchID).Scan(&g); err != nil {
				return err
			}
			if g > gen {
				delays = append(delays, time.Since(killed))
				break
			}
			if time.Now().After(deadline) {
				_ = blocker.Rollback(e.ctx)
				return fmt.Errorf("trial %d: no takeover within %s", trial, ttl+30*time.Second)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := blocker.Rollback(e.ctx); err != nil {
			return err
		}
		var st batch.Status
		for deadline := time.Now().Add(30 * time.Second); ; {
			if err := e.pool.QueryRow(e.ctx, `SELECT status FROM ingestion_batches WHERE id = $1`, res.BatchID).Scan(&st); err != nil {
				return err
			}
			if st == batch.StatusSucceeded {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("trial %d: batch ended %s", trial, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Replace the killed worker, as a Deployment would.
		restarted, err := e.startWorkers(1, flags...)
		if err != nil {
			return err
		}
		alive = append(alive, restarted...)
	}
	p50, p99 := percentile(delays, 50), percentile(delays, 99)
	e.addTarget(fmt.Sprintf("takeover latency p99 over %d SIGKILL trials", trials), p99.Seconds(), "s",
		fmt.Sprintf("<= TTL + 5 s = %s", ttl+5*time.Second), p99 <= ttl+5*time.Second,
		fmt.Sprintf("lease TTL %s: p50 %.2f s (%.2f × TTL), p99 %.2f s (%.2f × TTL), max %.2f s", ttl, p50.Seconds(), p50.Seconds()/ttl.Seconds(), p99.Seconds(), p99.Seconds()/ttl.Seconds(), percentile(delays, 100).Seconds()))
	return nil
}
