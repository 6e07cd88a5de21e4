package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The diagnostics of a timed phase: what the database's backends were doing
// (pg_stat_activity sampled every 10 ms), what the server did per operation
// (pg_stat_statements, pg_stat_wal, pg_stat_database: transactions, WAL
// records and fsyncs) and the server's CPU time (from /proc). They are valid
// on a loaded machine when compared within one run: every figure is a share
// or a per-operation count.

// waitSampler samples pg_stat_activity of one database every interval on a
// connection of its own and counts what each client backend was doing.
type waitSampler struct {
	conn     *pgx.Conn
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}

	mu      sync.Mutex
	samples int
	// by counts backend observations by "state | wait_event_type:wait_event".
	by map[string]int
	// byQuery counts observations of active backends by wait and statement.
	byQuery map[string]int
}

// startWaitSampler begins sampling the database of dbURL every interval.
func startWaitSampler(ctx context.Context, dbURL string, interval time.Duration) (*waitSampler, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	s := &waitSampler{conn: conn, interval: interval, stop: make(chan struct{}), done: make(chan struct{}),
		by: map[string]int{}, byQuery: map[string]int{}}
	go s.run(ctx)
	return s, nil
}

func (s *waitSampler) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := s.conn.Query(ctx, `
			SELECT COALESCE(state, ''), COALESCE(wait_event_type, ''), COALESCE(wait_event, ''),
			       left(regexp_replace(query, '\s+', ' ', 'g'), 70)
			FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
		if err != nil {
			continue
		}
		s.mu.Lock()
		s.samples++
		for rows.Next() {
			var state, wtype, wevent, query string
			if rows.Scan(&state, &wtype, &wevent, &query) != nil {
				continue
			}
			wait := "CPU (no wait event)"
			if wtype != "" {
				wait = wtype + ":" + wevent
			}
			s.by[state+" | "+wait]++
			if state == "active" {
				s.byQuery[wait+" | "+query]++
			}
		}
		s.mu.Unlock()
		rows.Close()
	}
}

// Stop ends sampling and returns a report: the share of backend
// observations per state and wait event, and the top active statements.
func (s *waitSampler) Stop() string {
	close(s.stop)
	<-s.done
	_ = s.conn.Close(context.Background())
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	total := 0
	for _, n := range s.by {
		total += n
	}
	fmt.Fprintf(&b, "%d samples every %s; %d backend observations (%.1f client backends on average)\n", s.samples, s.interval, total, float64(total)/float64(max(s.samples, 1)))
	writeShares(&b, s.by, total, 0)
	active := 0
	for _, n := range s.byQuery {
		active += n
	}
	fmt.Fprintf(&b, "active backends by wait event and statement (%d observations):\n", active)
	writeShares(&b, s.byQuery, active, 12)
	return b.String()
}

func writeShares(b *strings.Builder, counts map[string]int, total, limit int) {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	for i, k := range keys {
		if limit > 0 && i >= limit {
			break
		}
		fmt.Fprintf(b, "  %6.1f%%  %s\n", 100*float64(counts[k])/float64(max(total, 1)), k)
	}
}

// serverCounters are cumulative server-wide counters read before and after
// a phase.
type serverCounters struct {
	commits, rollbacks      int64
	walRecords, walFPI      int64
	walBytes                float64
	walWrite, walSync       int64
	statementCalls          int64
	statementExecMillis     float64
	cpuSeconds              float64
	harnessCPUSeconds       float64
	workerCPUSeconds        float64
	at                      time.Time
	topStatements           map[string]statementStat
	blocksHit, blocksRead   int64
	tuplesInserted, updated int64
	// nextXid is the next transaction id the cluster will assign: only a
	// transaction that writes takes one, so its change counts the write
	// transactions (of every database of the bench's own cluster).
	nextXid int64
	// walLSN is the WAL flushed so far (pg_current_wal_flush_lsn).
	walLSN string
}

type statementStat struct {
	calls  int64
	millis float64
}

// readCounters reads the counters of the bench database and the server's
// CPU time.
func (e *env) readCounters() (serverCounters, error) {
	c := serverCounters{at: time.Now(), topStatements: map[string]statementStat{}}
	err := e.pool.QueryRow(e.ctx, `
		SELECT d.xact_commit, d.xact_rollback, d.blks_hit, d.blks_read, d.tup_inserted, d.tup_updated,
		       w.wal_records, w.wal_fpi, w.wal_bytes::float8, w.wal_write, w.wal_sync,
		       pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_current_wal_flush_lsn()::text
		FROM pg_stat_database d, pg_stat_wal w
		WHERE d.datname = current_database()`).
		Scan(&c.commits, &c.rollbacks, &c.blocksHit, &c.blocksRead, &c.tuplesInserted, &c.updated,
			&c.walRecords, &c.walFPI, &c.walBytes, &c.walWrite, &c.walSync, &c.nextXid, &c.walLSN)
	if err != nil {
		return c, err
	}
	rows, err := e.pool.Query(e.ctx, `
		SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 110), calls, total_exec_time
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_%'`)
	if err != nil {
		return c, err
	}
	for rows.Next() {
		var (
			q string
			s statementStat
		)
		if err := rows.Scan(&q, &s.calls, &s.millis); err != nil {
			rows.Close()
			return c, err
		}
		prev := c.topStatements[q]
		c.topStatements[q] = statementStat{calls: prev.calls + s.calls, millis: prev.millis + s.millis}
		c.statementCalls += s.calls
		c.statementExecMillis += s.millis
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, err
	}
	c.cpuSeconds = serverCPUSeconds(filepath.Join(e.cluster.Dir, "data"))
	if f, ok := procStat(os.Getpid()); ok {
		c.harnessCPUSeconds = float64(f.utime+f.stime) / clockTicks
	}
	c.workerCPUSeconds = e.exitedWorkerCPU
	for _, pid := range e.workerPIDs() {
		if f, ok := procStat(pid); ok {
			c.workerCPUSeconds += float64(f.utime+f.stime) / clockTicks
		}
	}
	return c, nil
}

// counterDelta describes what the server did between two readings, per
// operation of the phase (ops).
func counterDelta(before, after serverCounters, ops, samplerQueries int, opName string) string {
	n := float64(max(ops, 1))
	secs := after.at.Sub(before.at).Seconds()
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s in %.1fs (the sampler's own %d queries left out)\n", ops, opName, secs, samplerQueries)
	fmt.Fprintf(&b, "  per %s: %.2f commits, %.2f rollbacks, %.2f statements, %.3f ms statement time, %.2f WAL records (%.3f full-page images), %.0f WAL bytes, %.3f WAL writes, %.3f WAL fsyncs, %.2f tuples inserted, %.2f updated\n",
		singular(opName),
		float64(after.commits-before.commits-int64(samplerQueries))/n, float64(after.rollbacks-before.rollbacks)/n,
		float64(after.statementCalls-before.statementCalls)/n, (after.statementExecMillis-before.statementExecMillis)/n,
		float64(after.walRecords-before.walRecords)/n, float64(after.walFPI-before.walFPI)/n,
		(after.walBytes-before.walBytes)/n, float64(after.walWrite-before.walWrite)/n, float64(after.walSync-before.walSync)/n,
		float64(after.tuplesInserted-before.tuplesInserted)/n, float64(after.updated-before.updated)/n)
	cpu := after.cpuSeconds - before.cpuSeconds
	hcpu := after.harnessCPUSeconds - before.harnessCPUSeconds
	wcpu := after.workerCPUSeconds - before.workerCPUSeconds
	fmt.Fprintf(&b, "  PostgreSQL CPU: %.2f s per second, %.1f µs per %s; harness (Go clients) CPU: %.2f s per second, %.1f µs per %s; worker processes' CPU: %.2f s per second, %.1f µs per %s\n",
		cpu/secs, 1e6*cpu/n, singular(opName), hcpu/secs, 1e6*hcpu/n, singular(opName), wcpu/secs, 1e6*wcpu/n, singular(opName))
	type row struct {
		q string
		statementStat
	}
	var rows []row
	for q, s := range after.topStatements {
		p := before.topStatements[q]
		if d := (statementStat{calls: s.calls - p.calls, millis: s.millis - p.millis}); d.calls > 0 {
			rows = append(rows, row{q, d})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].millis > rows[j].millis })
	for i, r := range rows {
		if i >= 8 {
			break
		}
		fmt.Fprintf(&b, "  %8d calls %9.1f ms (%6.3f ms each)  %s\n", r.calls, r.millis, r.millis/float64(r.calls), r.q)
	}
	return b.String()
}

// harnessApp is the application_name of the harness's own pool.
const harnessApp = "bench-harness"

// settleStats makes the server's cumulative statistics current: it waits
// (up to ten seconds) until every connection to the bench database other
// than the harness pool's is gone — a backend flushes its pending
// statistics when it exits — and asks each idle connection of the harness
// pool to flush its own (PostgreSQL 15 flushes them otherwise only after up
// to ten idle seconds). A measured phase closes the connections it opened
// (processes, pools) before it returns.
func (e *env) settleStats() {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var others int
		if err := e.pool.QueryRow(e.ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND application_name <> $1`, harnessApp).Scan(&others); err != nil || others == 0 {
			break
		}
	}
	for _, c := range e.pool.AcquireAllIdle(e.ctx) {
		_, _ = c.Exec(e.ctx, `SELECT pg_stat_force_next_flush()`)
		c.Release()
	}
}

// perOp is what the server did per operation of a measured phase.
type perOp struct {
	commits, statements, walRecords, walBytes, walSyncs float64
	// writeTxns counts transactions that wrote (took a transaction id).
	writeTxns float64
	// serverCPU, harnessCPU and workerCPU (the worker processes the
	// harness started) are CPU seconds per operation.
	serverCPU, harnessCPU, workerCPU float64
	// serverCPUPerSecond is the server's CPU seconds per second of the phase.
	serverCPUPerSecond float64
	// calls counts the phase's executions of each statement (normalised
	// text, first 110 characters), millis their execution time; ops is
	// the operations they divide into.
	calls  map[string]int64
	millis map[string]float64
	ops    float64
	// fromLSN and toLSN bound the phase's WAL (see walRecords).
	fromLSN, toLSN string
}

// newPerOp divides the counters' change by ops; samplerQueries is how many
// read-only transactions the wait-event sampler made meanwhile.
func newPerOp(before, after serverCounters, ops, samplerQueries int) perOp {
	n := float64(max(ops, 1))
	p := perOp{
		commits:            float64(after.commits-before.commits-int64(samplerQueries)) / n,
		statements:         float64(after.statementCalls-before.statementCalls) / n,
		walRecords:         float64(after.walRecords-before.walRecords) / n,
		walBytes:           (after.walBytes - before.walBytes) / n,
		walSyncs:           float64(after.walSync-before.walSync) / n,
		writeTxns:          float64(after.nextXid-before.nextXid) / n,
		serverCPU:          (after.cpuSeconds - before.cpuSeconds) / n,
		harnessCPU:         (after.harnessCPUSeconds - before.harnessCPUSeconds) / n,
		workerCPU:          (after.workerCPUSeconds - before.workerCPUSeconds) / n,
		serverCPUPerSecond: (after.cpuSeconds - before.cpuSeconds) / after.at.Sub(before.at).Seconds(),
		calls:              map[string]int64{},
		millis:             map[string]float64{},
		ops:                n,
		fromLSN:            before.walLSN,
		toLSN:              after.walLSN,
	}
	for q, s := range after.topStatements {
		if d := s.calls - before.topStatements[q].calls; d > 0 {
			p.calls[q] = d
			p.millis[q] = s.millis - before.topStatements[q].millis
		}
	}
	return p
}

// measure runs phase (a timed measurement returning how many operations it
// did) between two readings of the server's counters and returns what the
// server did per operation. When e.diagDir is set it also samples wait
// events, takes Go block and mutex profiles of the harness, and appends a
// report to e.diagnostics.
func (e *env) measure(label, opName string, phase func() (int, error)) (int, perOp, error) {
	e.settleStats()
	before, err := e.readCounters()
	if err != nil {
		return 0, perOp{}, err
	}
	var sampler *waitSampler
	if e.diagDir != "" {
		if sampler, err = startWaitSampler(e.ctx, e.dbURL, 10*time.Millisecond); err != nil {
			return 0, perOp{}, err
		}
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
		runtime.SetMutexProfileFraction(10)
	}
	ops, err := phase()
	var waits string
	if sampler != nil {
		runtime.SetBlockProfileRate(0)
		runtime.SetMutexProfileFraction(0)
		waits = sampler.Stop()
	}
	if err != nil {
		return ops, perOp{}, err
	}
	e.settleStats()
	after, err := e.readCounters()
	if err != nil {
		return ops, perOp{}, err
	}
	samples := 0
	if sampler != nil {
		samples = sampler.samples
		slug := strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "", "/", "-").Replace(label)
		for _, name := range []string{"block", "mutex"} {
			if f, err := os.Create(filepath.Join(e.diagDir, slug+"."+name+".pprof")); err == nil {
				_ = pprof.Lookup(name).WriteTo(f, 0)
				f.Close()
			}
		}
		report := fmt.Sprintf("## %s\n\n```\n%s%s```\n\n", label, counterDelta(before, after, ops, samples, opName), waits)
		e.diagnostics = append(e.diagnostics, report)
		e.log.Info("diagnostics", "scenario", label, "report", "\n"+report)
	}
	return ops, newPerOp(before, after, ops, samples), nil
}

// writeDiagnostics writes the collected diagnostics to dir/diagnostics.md.
func writeDiagnostics(dir string, reports []string) error {
	if dir == "" || len(reports) == 0 {
		return nil
	}
	head := "# Diagnostics\n\nWritten by `go run ./bench -diag " + dir + "`: for each diagnosed phase, what the server did per operation " +
		"(pg_stat_statements, pg_stat_wal, pg_stat_database deltas; PostgreSQL CPU from /proc) and what its client backends were doing " +
		"(pg_stat_activity sampled every 10 ms: `idle` = waiting for the next transaction from the client, `idle in transaction | Client:ClientRead` = " +
		"waiting for the client inside a transaction, `active | CPU` = running or runnable, `IO:WALSync` = flushing WAL at commit, `Lock`/`LWLock` = " +
		"waiting on another backend). Go block and mutex profiles of the harness process are beside this file (`go tool pprof`).\n\n" +
		"Generated " + time.Now().UTC().Format("2006-01-02 15:04 UTC") + " on " + strconv.Itoa(runtime.NumCPU()) + " CPUs.\n\n"
	return os.WriteFile(filepath.Join(dir, "diagnostics.md"), []byte(head+strings.Join(reports, "")), 0o644)
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times.
const clockTicks = 100

// serverCPUSeconds returns the CPU time (user + system) used so far by the
// PostgreSQL server whose data directory is dataDir: its postmaster, the
// children it has reaped and its live children (backends, WAL writer,
// checkpointer, ...). Zero if it cannot be read.
func serverCPUSeconds(dataDir string) float64 {
	raw, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	postmaster, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil {
		return 0
	}
	ticks := int64(0)
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		f, ok := procStat(pid)
		if !ok {
			continue
		}
		switch {
		case pid == postmaster:
			ticks += f.utime + f.stime + f.cutime + f.cstime
		case f.ppid == int64(postmaster):
			ticks += f.utime + f.stime
		}
	}
	return float64(ticks) / clockTicks
}

type statFields struct{ ppid, utime, stime, cutime, cstime int64 }

// procStat reads the parent and CPU times of a process from /proc/<pid>/stat.
func procStat(pid int) (statFields, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return statFields{}, false
	}
	// The command name (field 2) may hold spaces: split after its ')'.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return statFields{}, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return statFields{}, false
	}
	num := func(k int) int64 { v, _ := strconv.ParseInt(f[k-3], 10, 64); return v }
	return statFields{ppid: num(4), utime: num(14), stime: num(15), cutime: num(16), cstime: num(17)}, true
}

// singular names one operation: "batches" → "batch", "enqueues" → "enqueue".
func singular(ops string) string {
	if strings.HasSuffix(ops, "ches") {
		return strings.TrimSuffix(ops, "es")
	}
	return strings.TrimSuffix(ops, "s")
}
