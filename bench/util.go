package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Result is one row of latest.json.
type Result struct {
	Scenario string   `json:"scenario"`
	Ours     float64  `json:"ours"`
	Baseline *float64 `json:"baseline"`
	Unit     string   `json:"unit"`
	Ratio    *float64 `json:"ratio"`
	Target   string   `json:"target"`
	Met      *bool    `json:"met"`
	Note     string   `json:"note,omitempty"`
}

// add records a result. With a baseline, ratio is ours/baseline (or
// baseline/ours when lowerIsBetter); target is the minimum ratio, 0 for none.
func (e *env) add(scenario string, ours float64, baseline *float64, unit string, target float64, lowerIsBetter bool, note string) {
	r := Result{Scenario: scenario, Ours: round(ours), Baseline: baseline, Unit: unit, Note: note}
	if baseline != nil && *baseline > 0 && ours > 0 {
		ratio := ours / *baseline
		if lowerIsBetter {
			ratio = *baseline / ours
		}
		ratio = round(ratio)
		r.Ratio = &ratio
		if target > 0 {
			met := ratio >= target
			r.Target = fmt.Sprintf("ratio >= %.2f", target)
			r.Met = &met
		}
		rb := round(*baseline)
		r.Baseline = &rb
	}
	e.results = append(e.results, r)
	e.log.Info("result", "scenario", scenario, "ours", r.Ours, "baseline", deref(r.Baseline), "unit", unit, "ratio", deref(r.Ratio))
}

// addTarget records a result with an absolute target (met computed by the
// caller).
func (e *env) addTarget(scenario string, ours float64, unit, target string, met bool, note string) {
	e.results = append(e.results, Result{Scenario: scenario, Ours: round(ours), Unit: unit, Target: target, Met: &met, Note: note})
	e.log.Info("result", "scenario", scenario, "ours", round(ours), "unit", unit, "target", target, "met", met)
}

func deref(p *float64) any {
	if p == nil {
		return "-"
	}
	return *p
}

func ptr(f float64) *float64 { return &f }

func round(f float64) float64 {
	switch {
	case f >= 100:
		return float64(int64(f + 0.5))
	default:
		v, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'g', 4, 64), 64)
		return v
	}
}

// latencies collects durations from several goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// percentile returns the p-th percentile (0..100), nearest rank.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(idx, 0), len(s)-1)]
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// pgbench runs a custom script for d with clients and returns transactions
// per second.
func (e *env) pgbench(script string, clients int, d time.Duration) (float64, error) {
	return e.pgbenchArgs(script, clients, d)
}

// pgbenchArgs is pgbench with extra arguments.
func (e *env) pgbenchArgs(script string, clients int, d time.Duration, extra ...string) (float64, error) {
	f := filepath.Join(e.dir, fmt.Sprintf("script-%d.sql", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		return 0, err
	}
	bin := pgbenchBin()
	args := append([]string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 2)),
		"-T", strconv.Itoa(int(d.Seconds())), "-f", f}, extra...)
	cmd := exec.CommandContext(e.ctx, bin, append(args, e.dbURL)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %v: %s", err, out)
	}
	m := tpsRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps: %s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// pgbenchBin is the pgbench on PATH, else Debian's newest.
func pgbenchBin() string {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench"); len(m) > 0 {
		return m[len(m)-1]
	}
	return "pgbench"
}

// pgbenchLatencies runs pgbench as pgbench does, with a log of every
// transaction (--log), and returns its rate and the transactions'
// latencies.
func (e *env) pgbenchLatencies(script string, clients int, d time.Duration) (float64, []time.Duration, error) {
	dir, err := os.MkdirTemp(e.dir, "pgbench-log-*")
	if err != nil {
		return 0, nil, err
	}
	defer os.RemoveAll(dir)
	tps, err := e.pgbenchArgs(script, clients, d, "--log", "--log-prefix", filepath.Join(dir, "tx"))
	if err != nil {
		return 0, nil, err
	}
	logs, err := filepath.Glob(filepath.Join(dir, "tx*"))
	if err != nil {
		return 0, nil, err
	}
	var lat []time.Duration
	for _, name := range logs {
		b, err := os.ReadFile(name)
		if err != nil {
			return 0, nil, err
		}
		// client_id transaction_no time_us script_no time_epoch time_us_frac
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			us, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				return 0, nil, fmt.Errorf("pgbench log %s: %q", name, line)
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
	}
	if len(lat) == 0 {
		return 0, nil, fmt.Errorf("pgbench wrote no transaction log in %s", dir)
	}
	return tps, lat, nil
}

func (e *env) exec(sql string, args ...any) error {
	_, err := e.pool.Exec(e.ctx, sql, args...)
	return err
}

// historyBatches is how many finished batches reset leaves in
// ingestion_batches, so that every scenario runs against a table with a
// history and current planner statistics, as in production (an empty,
// never-analysed table makes the planner guess).
const historyBatches = 20_000

// current selects the batches a scenario made, leaving out the history.
const current = `source_scope NOT LIKE 'fleet\_s3:s3://history-bucket/%'`

// reset empties the tables the scenarios write, then records a history of
// finished batches of 200 tenants (the bench tenant among them) and
// analyses the tables.
func (e *env) reset() error {
	if err := e.exec(`TRUNCATE ingestion_batches, river_job, curated.fleet_records, curated.fleet_slices, curated.fleet_publications, curated.fleet_load_objects, curated.fleet_load_errors`); err != nil {
		return err
	}
	if err := e.exec(`
		INSERT INTO ingestion_batches (company_id, tenant_id, tenant_database, ingestion_mode, source_type, pipeline_stage, status,
		                               details, source_scope, completed_at)
		SELECT 'company-1', CASE WHEN g % 200 = 0 THEN 'tenant-bench' ELSE 'tenant-' || (g % 200) END, 'tenant_db', 'FileUpload', 'FleetS3',
		       'fleet_s3_direct_to_curated', 'Succeeded', '{"version": 1, "phase": "published"}',
		       'fleet_s3:s3://history-bucket/' || g, now()
		FROM generate_series(1, $1) g`, historyBatches); err != nil {
		return err
	}
	return e.exec(`ANALYZE ingestion_batches, river_job`)
}

// rss returns the resident set size of a process in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// timed runs fn in clients goroutines until d has passed and returns the
// operations done and their latencies.
func timed(ctx context.Context, clients int, d time.Duration, fn func(ctx context.Context, client, i int) error) (int, []time.Duration, error) {
	var (
		wg    sync.WaitGroup
		lat   latencies
		mu    sync.Mutex
		first error
		count int
	)
	deadline := time.Now().Add(d)
	for c := range clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				t := time.Now()
				if err := fn(ctx, c, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				lat.add(time.Since(t))
				mu.Lock()
				count++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return count, lat.d, first
}
