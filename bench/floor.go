package main

import (
	"bytes"
	"cmp"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// floorScript is one trivial batch at the protocol's floor (see the
// script's own comments): what the seed's rules cannot do without, with no
// client overhead.
//
//go:embed floor.sql
var floorScript string

// floorLockKey is the advisory lock the floor's pgbench clients wait on
// after their warm-up run, until the harness has read the counters.
const floorLockKey int64 = 0x66_6c6f_6f72 // "floor"

// floorWarmup ends the script for the bench: each client's first run (warm
// set by -D) is a warm-up, after which the client idles for 1.5 s (its
// backend flushes its pending statistics: PostgreSQL 15 does once a second
// when idle) and waits at the harness's lock. So the measured window has
// every connection open, its statements prepared and its caches warm, as
// the worker processes of the end-to-end rows are started before theirs.
var floorWarmup = fmt.Sprintf(`
\if :warm
\sleep 1500 ms
SELECT pg_advisory_xact_lock_shared(%d);
\set warm 0
\endif
`, floorLockKey)

// benchFloor: the protocol floor beside ours (issue 36). For 1 and 4 worker
// processes at --concurrency 32: ours is the end-to-end run of trivial
// batches (the end-to-end rows' machinery) after an unmeasured warm-up
// burst of two batches per delivery slot, the floor floor.sql through
// pgbench with as many clients (32 × processes), on the same database in
// the same run, both measured alike (PostgreSQL CPU from /proc, WAL and
// fsyncs from pg_stat_wal, statements from pg_stat_statements, write
// transactions from the WAL's commit records).
func benchFloor(e *env) error {
	const concurrency, batches = 32, 800
	loadAtStart := loadAverage() // at the end it counts the floor's own clients
	processes := []int{1, 4}
	folderDir := filepath.Join(e.dir, "floor-trivial")
	warmAt := func(workers int) int { return 2 * concurrency * workers }
	most := processes[len(processes)-1]
	if err := writeTrivialFolders(folderDir, batches*most); err != nil {
		return err
	}
	if err := writeTrivialFolders(folderDir+"-warm", warmAt(most)*most); err != nil {
		return err
	}
	enq, err := e.enqueuer(e.pool)
	if err != nil {
		return err
	}
	// Write transactions are counted as the commit records in the WAL
	// (pg_walinspect): a transaction that wrote nothing writes none, and a
	// subtransaction (a savepoint) is part of its transaction's, where the
	// transaction ids taken count one for each.
	if err := e.exec(`CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		return err
	}
	window := max(e.phase, 5*time.Second)
	var statements strings.Builder
	for _, workers := range processes {
		clients := workers * concurrency
		label := fmt.Sprintf("%d worker process(es), concurrency %d", workers, concurrency)
		// Rounds of ours then the floor, side by side in time: the machine
		// drifts (other tenants of the host, its caches) between minutes
		// more than the two differ, so each round's ratio compares runs a
		// few seconds apart, and the round of the median ratio is reported.
		rounds := make([]floorRound, floorRounds)
		for i := range rounds {
			r := &rounds[i]
			err := e.keepingWAL(func() (err error) {
				if r.ours, err = e.trivialBatches(enq, folderDir, workers, concurrency, batches, warmAt(workers), fmt.Sprintf("ours beside the floor, %s, round %d", label, i+1)); err != nil {
					return err
				}
				r.oursWAL, err = e.walStats(r.ours.cost)
				return err
			})
			if err != nil {
				return err
			}
			err = e.keepingWAL(func() (err error) {
				if r.rate, r.floor, r.elapsed, err = e.floor(clients, window); err != nil {
					return err
				}
				r.floorWAL, err = e.walStats(r.floor)
				return err
			})
			if err != nil {
				return err
			}
			e.log.Info("floor round", "workers", workers, "round", i+1, "ours_ms", 1000*r.ours.cost.serverCPU, "floor_ms", 1000*r.floor.serverCPU, "ratio", r.ratio())
		}
		byRatio := slices.Clone(rounds)
		slices.SortFunc(byRatio, func(a, b floorRound) int { return cmp.Compare(a.ratio(), b.ratio()) })
		med := byRatio[len(byRatio)/2]
		var each []string
		for _, r := range rounds {
			each = append(each, fmt.Sprintf("%.2f/%.2f ms (%.2f)", 1000*r.ours.cost.serverCPU, 1000*r.floor.serverCPU, r.ratio()))
		}
		ours, oursWAL, floorWAL, rate, floor, elapsed := med.ours, med.oursWAL, med.floorWAL, med.rate, med.floor, med.elapsed
		o, f := ours.cost, floor
		oCommits, fCommits := oursWAL[commitRecord].count, floorWAL[commitRecord].count
		e.add(fmt.Sprintf("protocol floor (pgbench), %d clients", clients), rate, nil, "batches/s", 0, false,
			fmt.Sprintf("bench/floor.sql: one trivial batch per run, every client a tenant and a River queue of its own, %s measured after a warm-up run per client (the round of the median ratio below); per batch: %.2f transactions (%.2f writing), %.1f statements, %.0f WAL bytes, %.2f WAL fsyncs, %.2f ms PostgreSQL CPU",
				elapsed.Round(100*time.Millisecond), f.commits, fCommits, f.statements, f.walBytes, f.walSyncs, 1000*f.serverCPU))
		cpuRatio := med.ratio()
		e.results = append(e.results, Result{Scenario: "ours vs the protocol floor, " + label + ": PostgreSQL CPU per batch",
			Ours: round(1000 * o.serverCPU), Baseline: ptr(round(1000 * f.serverCPU)), Unit: "ms", Ratio: ptr(round(cpuRatio)),
			Target: "ratio <= 1.50", Met: boolPtr(cpuRatio <= 1.5),
			Note: fmt.Sprintf("ratio: ours over the floor, lower is better, the median of %d rounds of ours then the floor (ours/floor per batch, ratio: %s); CPU time of every PostgreSQL process (/proc) over the batches; ours: %d trivial batches through %d worker process(es) after a warm-up burst, the enqueue burst and the workers' maintenance included (WAL %.0f bytes, %.2f fsyncs, %.2f ms of the workers' own CPU per batch); the floor: pgbench with %d clients (WAL %.0f bytes, %.2f fsyncs per batch)",
				floorRounds, strings.Join(each, ", "), batches, workers, o.walBytes, o.walSyncs, 1000*o.workerCPU, clients, f.walBytes, f.walSyncs)})
		e.log.Info("result", "scenario", "ours vs floor: PostgreSQL CPU per batch", "workers", workers, "ours_ms", 1000*o.serverCPU, "floor_ms", 1000*f.serverCPU, "ratio", cpuRatio, "rounds", strings.Join(each, ", "))
		e.results = append(e.results, Result{Scenario: "ours vs the protocol floor, " + label + ": write transactions per batch",
			Ours: round(oCommits), Baseline: ptr(round(fCommits)), Unit: "write transactions", Ratio: ptr(round(oCommits / fCommits)),
			Target: "<= the floor's", Met: boolPtr(oCommits <= fCommits),
			Note: fmt.Sprintf("commit records in the WAL (pg_walinspect) over the batches: transactions that wrote, each once however many savepoints it had; the floor's: reserve + job, River's fetch, the acquisition, the load, the publication, River's completion (fetch and completion one job each, where River's own fetch and complete many at once); transaction ids taken (subtransactions each one more): ours %.2f, the floor %.2f; all transactions committed: ours %.2f, the floor %.2f", o.writeTxns, f.writeTxns, o.commits, f.commits)})
		e.results = append(e.results, Result{Scenario: "ours vs the protocol floor, " + label + ": statements per batch",
			Ours: round(o.statements), Baseline: ptr(round(f.statements)), Unit: "statements", Ratio: ptr(round(o.statements / f.statements)),
			Note: "pg_stat_statements calls over the batches, BEGIN, COMMIT and savepoints included (the floor's BEGIN and COMMIT, which pg_stat_statements does not see through pgbench's prepared mode, counted from the script); ours includes the harness's polls of the batches, River's maintenance and the sweeper; per statement, and WAL per record: bench/results/floor-statements.md"})
		e.add(fmt.Sprintf("ours vs the protocol floor, %s: batches/s", label), ours.rate, ptr(rate), "batches/s", 0, false,
			"information, not a target: on 2 shared cores the worker processes' own CPU competes with the server's, and the floor has no client CPU to speak of")
		e.log.Info("result", "scenario", "ours vs floor", "workers", workers, "ours_statements", o.statements, "floor_statements", f.statements,
			"ours_write_txns", oCommits, "floor_write_txns", fCommits, "ours_xids", o.writeTxns, "floor_xids", f.writeTxns,
			"ours_batches_per_s", ours.rate, "floor_batches_per_s", rate)
		fmt.Fprintf(&statements, "## %s\n\nThe round of the median ratio (%d rounds; ours/floor PostgreSQL CPU per batch, ratio: %s).\n\n%s%s\n",
			label, floorRounds, strings.Join(each, ", "), statementTable(o, f), walTable(oursWAL, floorWAL))
	}
	return e.writeResultFile("floor-statements.md", "# Statements per trivial batch: ours beside the protocol floor\n\n"+
		"Written by `go run ./bench -only floor` (and `make bench`) on "+time.Now().UTC().Format("2006-01-02 15:04 UTC")+
		" (one-minute load average of the machine at the start "+loadAtStart+")"+
		": pg_stat_statements per batch (calls, and execution time in ms, which is not all of a statement's CPU), "+
		"each statement by the first 110 characters of its normalised text, in the same run. Ours: the end-to-end run of trivial batches "+
		"(the enqueue burst, the worker processes, the harness's polls); the floor: bench/floor.sql through pgbench.\n\n"+statements.String())
}

func boolPtr(b bool) *bool { return &b }

// floorRounds is how many rounds of ours then the floor benchFloor runs
// per number of worker processes.
const floorRounds = 3

// floorRound is one round of benchFloor: ours, then the floor.
type floorRound struct {
	ours              trivialRun
	oursWAL, floorWAL map[string]walRecord
	rate              float64 // the floor's batches/s
	floor             perOp
	elapsed           time.Duration // the floor's window
}

// ratio is the round's PostgreSQL CPU per batch, ours over the floor's.
func (r floorRound) ratio() float64 { return r.ours.cost.serverCPU / r.floor.serverCPU }

// commitRecord is the WAL record of a transaction's commit.
const commitRecord = "Transaction/COMMIT"

// walRecord is what one kind of WAL record came to per operation.
type walRecord struct{ count, bytes float64 }

// keepingWAL runs fn with a replication slot that keeps the WAL written
// meanwhile, so walStats can read it whatever checkpoints ran.
func (e *env) keepingWAL(fn func() error) error {
	if err := e.exec(`SELECT pg_create_physical_replication_slot('bench_wal', true)`); err != nil {
		return err
	}
	defer e.exec(`SELECT pg_drop_replication_slot('bench_wal')`) //nolint:errcheck
	return fn()
}

// walStats reads the WAL of p's phase (pg_walinspect) and returns its
// records by resource manager and type, per operation.
func (e *env) walStats(p perOp) (map[string]walRecord, error) {
	rows, err := e.pool.Query(e.ctx, `
		SELECT "resource_manager/record_type", count, combined_size
		FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0`, p.fromLSN, p.toLSN)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]walRecord{}
	for rows.Next() {
		var (
			kind         string
			count, bytes int64
		)
		if err := rows.Scan(&kind, &count, &bytes); err != nil {
			return nil, err
		}
		out[kind] = walRecord{count: float64(count) / p.ops, bytes: float64(bytes) / p.ops}
	}
	return out, rows.Err()
}

// walTable lists the WAL records of ours and of the floor per batch, most
// bytes first.
func walTable(ours, floor map[string]walRecord) string {
	var b strings.Builder
	b.WriteString("WAL per batch by record (pg_walinspect; bytes include full-page images):\n\n| record | ours: count | ours: bytes | the floor: count | the floor: bytes |\n|---|---:|---:|---:|---:|\n")
	kinds := map[string]bool{}
	var total [2]walRecord
	for k, r := range ours {
		kinds[k] = true
		total[0].count += r.count
		total[0].bytes += r.bytes
	}
	for k, r := range floor {
		kinds[k] = true
		total[1].count += r.count
		total[1].bytes += r.bytes
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if bi, bj := ours[keys[i]].bytes+floor[keys[i]].bytes, ours[keys[j]].bytes+floor[keys[j]].bytes; bi != bj {
			return bi > bj
		}
		return keys[i] < keys[j]
	})
	fmt.Fprintf(&b, "| all | %.2f | %.0f | %.2f | %.0f |\n", total[0].count, total[0].bytes, total[1].count, total[1].bytes)
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %.3f | %.0f | %.3f | %.0f |\n", k, ours[k].count, ours[k].bytes, floor[k].count, floor[k].bytes)
	}
	return b.String()
}

// statementTable lists the statements of ours and of the floor per batch,
// most calls first.
func statementTable(ours, floor perOp) string {
	var b strings.Builder
	for _, side := range []struct {
		name string
		p    perOp
	}{{"ours", ours}, {"the floor", floor}} {
		fmt.Fprintf(&b, "%s: %.2f statements, %.3f ms statement time per batch\n\n| calls per batch | ms per batch | statement |\n|---:|---:|---|\n",
			side.name, side.p.statements, sumMillis(side.p))
		keys := make([]string, 0, len(side.p.calls))
		for q := range side.p.calls {
			keys = append(keys, q)
		}
		sort.Slice(keys, func(i, j int) bool {
			if side.p.calls[keys[i]] != side.p.calls[keys[j]] {
				return side.p.calls[keys[i]] > side.p.calls[keys[j]]
			}
			return keys[i] < keys[j]
		})
		for _, q := range keys {
			n := side.p.ops
			fmt.Fprintf(&b, "| %.3f | %.4f | `%s` |\n", float64(side.p.calls[q])/n, side.p.millis[q]/n, strings.ReplaceAll(q, "|", "\\|"))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func sumMillis(p perOp) float64 {
	var t float64
	for _, m := range p.millis {
		t += m
	}
	return t / p.ops
}

// floor runs floor.sql through pgbench with clients clients on an emptied
// database and measures the window from every client's warm-up run to the
// end, at least window: batches per second, the cost per batch and the
// window's length.
func (e *env) floor(clients int, window time.Duration) (float64, perOp, time.Duration, error) {
	if err := e.reset(); err != nil {
		return 0, perOp{}, 0, err
	}
	script := filepath.Join(e.dir, fmt.Sprintf("floor-%d.sql", clients))
	if err := os.WriteFile(script, []byte(floorScript+floorWarmup), 0o644); err != nil {
		return 0, perOp{}, 0, err
	}
	// The harness holds the lock the warmed-up clients wait for.
	lock, err := e.pool.Acquire(e.ctx)
	if err != nil {
		return 0, perOp{}, 0, err
	}
	defer lock.Release()
	if _, err := lock.Exec(e.ctx, `SELECT pg_advisory_lock($1)`, floorLockKey); err != nil {
		return 0, perOp{}, 0, err
	}
	locked := true
	unlock := func() error {
		if !locked {
			return nil
		}
		locked = false
		_, err := lock.Exec(e.ctx, `SELECT pg_advisory_unlock($1)`, floorLockKey)
		return err
	}
	defer unlock() //nolint:errcheck

	const warmupBudget = 10 * time.Second
	var out bytes.Buffer
	cmd := exec.CommandContext(e.ctx, pgbenchBin(), "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(int((warmupBudget + window).Seconds())), "-D", "warm=1", "-f", script, e.dbURL)
	cmd.Stdout, cmd.Stderr = &out, &out
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, perOp{}, 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fail := func(err error) (float64, perOp, time.Duration, error) {
		_ = unlock()
		_ = cmd.Process.Kill()
		<-exited
		return 0, perOp{}, 0, fmt.Errorf("%w; pgbench: %s", err, out.String())
	}
	for deadline := time.Now().Add(warmupBudget); ; time.Sleep(20 * time.Millisecond) {
		var waiting int
		if err := e.pool.QueryRow(e.ctx, `
			SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND ((classid::bigint << 32) | objid::bigint) = $1`, floorLockKey).Scan(&waiting); err != nil {
			return fail(err)
		}
		if waiting == clients {
			break
		}
		select {
		case err := <-exited:
			return 0, perOp{}, 0, fmt.Errorf("pgbench ended during its warm-up (%v): %s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("%d of %d pgbench clients warmed up in %s", waiting, clients, warmupBudget))
		}
	}
	// The harness's own connections flush their statistics; the clients'
	// flushed theirs while idle after their warm-up.
	for _, c := range e.pool.AcquireAllIdle(e.ctx) {
		_, _ = c.Exec(e.ctx, `SELECT pg_stat_force_next_flush()`)
		c.Release()
	}
	completed := func() (int, error) {
		var n int
		err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&n)
		return n, err
	}
	warm, err := completed()
	if err != nil {
		return fail(err)
	}
	before, err := e.readCounters()
	if err != nil {
		return fail(err)
	}
	e.log.Info("the floor's clients warmed up", "clients", clients, "after", time.Since(started).Round(time.Millisecond))
	start := time.Now()
	if err := unlock(); err != nil {
		return fail(err)
	}
	if err := <-exited; err != nil {
		return 0, perOp{}, 0, fmt.Errorf("pgbench: %v: %s", err, out.String())
	}
	elapsed := time.Since(start)
	e.settleStats()
	after, err := e.readCounters()
	if err != nil {
		return 0, perOp{}, 0, err
	}
	done, err := completed()
	if err != nil {
		return 0, perOp{}, 0, err
	}
	batches := done - warm
	if batches <= 0 {
		return 0, perOp{}, 0, fmt.Errorf("the floor completed no batch in its window: %s", out.String())
	}
	cost := newPerOp(before, after, batches, 0)
	// pg_stat_statements does not see BEGIN and COMMIT sent through
	// pgbench's prepared mode (pgx sends ours as simple queries, which it
	// counts): every run sends the script's own.
	blocks := 0
	for _, line := range strings.Split(floorScript, "\n") {
		if l := strings.TrimSpace(line); l == "BEGIN;" || l == "COMMIT;" {
			blocks++
			cost.calls[l]++
		}
	}
	cost.statements += float64(blocks)
	for _, q := range []string{"BEGIN;", "COMMIT;"} {
		cost.calls[q] *= int64(batches)
	}
	// The barrier's statements (the clients' waits, the harness's unlock)
	// ended in the window: each is a statement and a commit, no batch's.
	for q, n := range cost.calls {
		if strings.Contains(q, "pg_advisory") {
			cost.statements -= float64(n) / float64(batches)
			cost.commits -= float64(n) / float64(batches)
			delete(cost.calls, q)
			delete(cost.millis, q)
		}
	}
	return float64(batches) / elapsed.Seconds(), cost, elapsed, nil
}

// writeTrivialFolders writes n trivial folders, dir/0 … dir/n-1: one CSV
// object of one record and the completion marker.
func writeTrivialFolders(dir string, n int) error {
	for i := range n {
		d := filepath.Join(dir, fmt.Sprint(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "a.csv"), []byte("k,v\n1,x\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "_SUCCESS"), nil, 0o644); err != nil { // the completion marker the worker requires
			return err
		}
	}
	return nil
}

// writeResultFile writes a file of results beside latest.md.
func (e *env) writeResultFile(name, content string) error {
	if err := os.MkdirAll(e.out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(e.out, name), []byte(content), 0o644)
}
