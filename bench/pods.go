package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/internal/testkit/pgbouncertest"
	"github.com/fleet/ingest/migrations"
)

// Hundreds of worker pods on one primary (issue: PgBouncer, a bounded
// footprint): podCount real `worker run` processes at the default
// concurrency and --max-conns (their connection behaviour is the real
// one), every one through PgBouncer in transaction mode with
// --database-pooler transaction, against a PostgreSQL cluster of its own
// with max_connections = 100. podBatches trivial folders are enqueued in
// bursts; measured: server connections (peak, sampled), batches/s, lease
// renewals/s and lost leases (summed from every pod's /metrics).
const (
	podCountDefault = 200
	podBatches      = 2000
	podPool         = 80 // PgBouncer's default_pool_size: server connections
	podsPerProcess  = 20 // worker run --simulate-pods
)

// benchPods runs the scenario; a run that fails is recorded as a row that
// missed its target (with the reason), not as a failed bench.
func benchPods(e *env) error {
	podCount := podCountDefault
	if v, err := strconv.Atoi(os.Getenv("BENCH_PODS")); err == nil && v > 0 {
		podCount = v
	}
	if err := benchPodsRun(e, podCount); err != nil {
		e.addTarget(fmt.Sprintf("%d worker pods through PgBouncer: batches succeeded, leases lost", podCount), 0, "batches",
			fmt.Sprintf("all %d succeed, 0 lost leases", podBatches), false, oneLineErr(err))
	}
	return nil
}

func oneLineErr(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if len(s) > 5000 {
		s = s[:5000] + "…"
	}
	return s
}

func benchPodsRun(e *env, podCount int) error {
	dir := filepath.Join(e.dir, "pods")
	cluster, err := chaos.StartCluster(e.ctx, filepath.Join(dir, "pg"), "max_connections=100")
	if err != nil {
		return err
	}
	defer cluster.Stop(context.Background()) //nolint:errcheck
	direct := cluster.URL("postgres")
	pool, err := pgxpool.New(e.ctx, direct+"&pool_max_conns=4")
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Apply(e.ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	if _, err := migrations.ApplyWarehouse(e.ctx, pool); err != nil {
		return err
	}
	var maxConns int
	if err := pool.QueryRow(e.ctx, `SELECT current_setting('max_connections')::int`).Scan(&maxConns); err != nil {
		return err
	}

	// The warehouse is a database of its own, as Redshift is in production:
	// a PostgreSQL warehouse load holds its connection for its whole
	// transaction while its lease check needs another, so on the
	// operational pool 200 pods' loads would hold every server connection
	// and wait for one (README "Running at scale"). It has its own cluster
	// and PgBouncer.
	whCluster, err := chaos.StartCluster(e.ctx, filepath.Join(dir, "warehouse-pg"))
	if err != nil {
		return err
	}
	defer whCluster.Stop(context.Background()) //nolint:errcheck
	whPool, err := pgxpool.New(e.ctx, whCluster.URL("postgres")+"&pool_max_conns=2")
	if err != nil {
		return err
	}
	defer whPool.Close()
	if _, err := migrations.ApplyWarehouse(e.ctx, whPool); err != nil {
		return err
	}
	whBouncer, stopWHBouncer, err := pgbouncertest.Launch(pgbouncertest.Options{ServerURL: whCluster.URL("postgres"), PoolSize: 40, MaxClientConn: 4000})
	if err != nil {
		return err
	}
	defer stopWHBouncer()
	whURL, err := whBouncer.URLFor(whCluster.URL("postgres"))
	if err != nil {
		return err
	}

	bouncer, stopBouncer, err := pgbouncertest.Launch(pgbouncertest.Options{ServerURL: direct, PoolSize: podPool, MaxClientConn: 4000})
	if err != nil {
		return err
	}
	defer stopBouncer()
	pooled, err := bouncer.URLFor(direct)
	if err != nil {
		return err
	}

	// The pods: podsPerProcess independent workers in each worker run
	// process (--simulate-pods: each its own pools, River client, renewer,
	// sweeper, gauges and metrics listener, as a pod has). An idle worker
	// run process costs about 0.8% of a CPU here, mostly River's timers
	// and the Go runtime waking them, so 200 processes alone would keep
	// this 2-core machine busy before the first batch; the database and
	// PgBouncer see the same connections either way.
	type pod struct {
		addr string
	}
	procs := (podCount + podsPerProcess - 1) / podsPerProcess
	var (
		cmds []*exec.Cmd
		done []chan struct{} // closed when its process exited
		pods []*pod
	)
	logs, err := os.Create(filepath.Join(dir, "pods.log"))
	if err != nil {
		return err
	}
	defer logs.Close()
	started := time.Now()
	for k := range procs {
		n := min(podsPerProcess, podCount-k*podsPerProcess)
		base := 21000 + k*podsPerProcess
		args := append([]string{"run", "--metrics-addr", "127.0.0.1:" + strconv.Itoa(base), "--name", fmt.Sprintf("pod-%02d", k),
			"--simulate-pods", strconv.Itoa(n),
			"--log-level", "warn", "--dev-allow-local-folders"}, strings.Fields(os.Getenv("BENCH_PODS_EXTRA"))...)
		cmd := exec.Command(e.workerBin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+pooled, "DATABASE_POOLER=transaction", "WAREHOUSE_URL="+whURL)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
		exit := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exit) }()
		done = append(done, exit)
		for i := range n {
			pods = append(pods, &pod{addr: "127.0.0.1:" + strconv.Itoa(base+i)})
		}
	}
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
		for k, c := range cmds {
			select {
			case <-done[k]:
			case <-time.After(30 * time.Second):
				_ = c.Process.Kill()
				<-done[k]
			}
		}
	}()
	exited := func() bool {
		for _, d := range done {
			select {
			case <-d:
				return true
			default:
			}
		}
		return false
	}
	client := &http.Client{Timeout: 2 * time.Second}
	ready := func(p *pod) bool {
		resp, err := client.Get("http://" + p.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	for _, p := range pods {
		for !ready(p) {
			if exited() || time.Since(started) > 3*time.Minute {
				tail, _ := os.ReadFile(logs.Name())
				return fmt.Errorf("pod %s not ready after %s; pods' log (last 2 KiB): %s", p.addr, time.Since(started).Round(time.Second), tail[max(len(tail)-2048, 0):])
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	startup := time.Since(started)

	// Server connections, sampled from the server itself.
	var (
		mu       sync.Mutex
		peak     int
		sampling = make(chan struct{})
		sampled  = make(chan struct{})
	)
	go func() {
		defer close(sampled)
		for {
			var n int
			if err := pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&n); err == nil {
				mu.Lock()
				peak = max(peak, n)
				mu.Unlock()
			}
			select {
			case <-sampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	folderDir := filepath.Join(dir, "folders")
	if err := writeTrivialFolders(folderDir, podBatches); err != nil {
		return err
	}
	reqs := make([]jobs.ImportRequest, podBatches)
	for i := range reqs {
		d := filepath.Join(folderDir, strconv.Itoa(i))
		reqs[i] = jobs.ImportRequest{TenantID: fmt.Sprintf("tenant-%d", i%50), TenantDatabase: "tenant_db", CompanyID: "company-1", Folder: "file://" + d}
	}
	before := scrapePods(client, pods, func(p *pod) string { return p.addr })
	enq, err := e.enqueuer(pool)
	if err != nil {
		return err
	}
	runStart := time.Now()
	for i := 0; i < len(reqs); i += 100 {
		if _, err := enq.ImportMany(e.ctx, reqs[i:min(i+100, len(reqs))]); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(3 * time.Minute)
	lastLog := time.Now()
	for {
		var done int
		if err := pool.QueryRow(e.ctx, `SELECT count(*) FROM ingestion_batches WHERE status = 'Succeeded'`).Scan(&done); err != nil {
			return err
		}
		if done == podBatches {
			break
		}
		if time.Since(lastLog) >= 10*time.Second {
			e.log.Info("worker pods", "pods", podCount, "succeeded", done, "of", podBatches, "elapsed", time.Since(runStart).Round(time.Second))
			lastLog = time.Now()
		}
		if time.Now().After(deadline) {
			if f := os.Getenv("BENCH_PODS_PGBOUNCER_LOG"); f != "" {
				_ = os.WriteFile(f, []byte(bouncer.Logs()), 0o644)
			}
			close(sampling)
			<-sampled
			return fmt.Errorf("%d of %d batches succeeded in 3 minutes with %d pods: %s; PgBouncer's log (last 1 KiB): %s; the warehouse PgBouncer's log (last 1 KiB): %s",
				done, podBatches, podCount, podsDiagnosis(e, pool, whPool, logs.Name()), tailString(bouncer.Logs(), 1024), tailString(whBouncer.Logs(), 1024))
		}
		time.Sleep(200 * time.Millisecond)
	}
	elapsed := time.Since(runStart)
	close(sampling)
	<-sampled
	after := scrapePods(client, pods, func(p *pod) string { return p.addr })
	var failed int
	if err := pool.QueryRow(e.ctx, `SELECT count(*) FROM ingestion_batches WHERE status <> 'Succeeded'`).Scan(&failed); err != nil {
		return err
	}
	renewals := after["ingest_lease_renewals_total"] - before["ingest_lease_renewals_total"]
	lost := after[`ingest_lease_renewals_total{outcome="lost"}`] - before[`ingest_lease_renewals_total{outcome="lost"}`]
	lostDeliveries := after[`ingest_deliveries_total{outcome="lease_lost"}`] - before[`ingest_deliveries_total{outcome="lease_lost"}`]

	setup := fmt.Sprintf("%d workers (%d worker run processes of %d, --simulate-pods: each worker its own pools, River client, renewer and listener; --concurrency 4, default --max-conns 6: %d client connections) through PgBouncer 1.18 in transaction mode "+
		"(default_pool_size %d) with --database-pooler transaction, on a cluster with max_connections = %d; the PostgreSQL warehouse on a cluster of its own behind its own PgBouncer (40 server connections), as Redshift would be; %d trivial folders in bursts of 100; pods ready in %s",
		podCount, procs, podsPerProcess, podCount*6, podPool, maxConns, podBatches, startup.Round(time.Second))
	e.addTarget(fmt.Sprintf("%d worker pods through PgBouncer: batches succeeded, leases lost", podCount), float64(podBatches-failed), "batches",
		fmt.Sprintf("all %d succeed, 0 lost leases", podBatches), failed == 0 && lost == 0 && lostDeliveries == 0,
		fmt.Sprintf("%s; lost lease renewals %.0f, deliveries ended by a lost lease %.0f", setup, lost, lostDeliveries))
	e.addTarget(fmt.Sprintf("%d worker pods through PgBouncer: peak server connections", podCount), float64(peak), "connections",
		fmt.Sprintf("< max_connections (%d)", maxConns), peak < maxConns, "client backends in pg_stat_activity, sampled every 100 ms from pod start to the last batch (the harness's own sampling connection included)")
	e.add(fmt.Sprintf("%d worker pods through PgBouncer: batches/s", podCount), float64(podBatches)/elapsed.Seconds(), nil, "batches/s", 0, false,
		fmt.Sprintf("from the first burst to the last Succeeded, %s", elapsed.Round(time.Millisecond)))
	e.add(fmt.Sprintf("%d worker pods through PgBouncer: lease renewals/s", podCount), renewals/elapsed.Seconds(), nil, "renewals/s", 0, false,
		"ingest_lease_renewals_total summed over every pod's /metrics, before and after the run (the default lease TTL 30 s, renewed every 10 s)")
	return nil
}

// scrapePods sums, over every pod's /metrics, each sample by its full
// series name, and each metric family by its bare name.
func scrapePods[P any](client *http.Client, pods []P, addr func(P) string) map[string]float64 {
	sum := map[string]float64{}
	for _, p := range pods {
		resp, err := client.Get("http://" + addr(p) + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			if i < 0 {
				continue
			}
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				continue
			}
			series := line[:i]
			sum[series] += v
			if j := strings.IndexByte(series, '{'); j > 0 {
				sum[series[:j]] += v
			}
		}
		resp.Body.Close()
	}
	return sum
}

func tailString(s string, n int) string { return s[max(len(s)-n, 0):] }

// podsDiagnosis says where a stalled pods run stands: jobs and batches by
// state, the operational and the warehouse server's sessions by state and
// wait, the pods' last log lines.
func podsDiagnosis(e *env, pool, whPool *pgxpool.Pool, logFile string) string {
	var b strings.Builder
	sessions := `SELECT string_agg(k || '=' || n, '; ') FROM (SELECT COALESCE(state, '-') || '/' || COALESCE(wait_event, '-') || '/' || left(regexp_replace(query, '\s+', ' ', 'g'), 60) k, count(*) n
		   FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 1 ORDER BY 2 DESC LIMIT 8) x`
	for _, q := range []struct {
		pool *pgxpool.Pool
		sql  string
	}{
		{pool, `SELECT string_agg(state::text || '=' || n, ' ') FROM (SELECT state, count(*) n FROM river_job GROUP BY state) x`},
		{pool, `SELECT string_agg(status || '=' || n, ' ') FROM (SELECT status, count(*) n FROM ingestion_batches GROUP BY status) x`},
		{pool, sessions},
		{whPool, sessions},
	} {
		if q.pool == whPool {
			b.WriteString("warehouse: ")
		}
		var out *string
		if err := q.pool.QueryRow(e.ctx, q.sql).Scan(&out); err != nil {
			fmt.Fprintf(&b, "[%v] ", err)
		} else if out != nil {
			fmt.Fprintf(&b, "[%s] ", *out)
		}
	}
	tail, _ := os.ReadFile(logFile)
	fmt.Fprintf(&b, "pods' log (last 1 KiB): %s", tail[max(len(tail)-1024, 0):])
	return b.String()
}
