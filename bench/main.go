// Command bench measures the coordinator against its own physical limits and
// against River, side by side, on a PostgreSQL cluster of its own, and writes
// bench/results/latest.{json,md} and latency charts. Run it with make bench.
//
// Every figure is a ratio against a baseline measured in the same run on the
// same cluster: raw statements through pgbench, psql \copy, River's own
// no-op job throughput (information: see endToEndNote), or the protocol
// floor (bench/floor.sql through pgbench: the primary's cost per batch,
// see benchFloor).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/testkit/chaos"
	"github.com/fleet/ingest/migrations"
)

func main() {
	out := flag.String("out", "bench/results", "directory for latest.json, latest.md and the charts")
	seconds := flag.Duration("phase", 4*time.Second, "duration of each timed phase")
	trials := flag.Int("takeover-trials", 10, "SIGKILL takeover trials")
	running := flag.Duration("running", time.Minute, "how long the 10,000 running batches renew their leases")
	only := flag.String("only", "", "run only the scenarios whose name contains this (for profiling); results are still written")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the harness process (the in-process clients) to this file")
	diag := flag.String("diag", "", "write diagnostics of the diagnosed phases (wait-event samples, per-operation server counters, Go block/mutex profiles) to this directory")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := run(ctx, *out, *seconds, *trials, *only, *diag, *running); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type env struct {
	ctx        context.Context
	cluster    *chaos.Cluster
	dbURL      string
	pool       *pgxpool.Pool
	out        string // the results directory
	workerBin  string
	enqueueBin string
	dir        string
	phase      time.Duration
	log        *slog.Logger
	results    []Result
	charts     []chart
	// diagDir, when set, receives diagnostics (see diagnose).
	diagDir     string
	diagnostics []string
	// workers are the worker processes running now; exitedWorkerCPU is the
	// CPU time of those that were stopped.
	workers         []*workerProc
	exitedWorkerCPU float64
}

func run(ctx context.Context, out string, phase time.Duration, trials int, only, diagDir string, running time.Duration) error {
	start, loadAtStart := time.Now(), loadAverage()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	dir, err := os.MkdirTemp("", "fleet-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	log.Info("building the binaries")
	build := exec.CommandContext(ctx, "go", "build", "-o", dir, "./cmd/worker", "./cmd/enqueue")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the binaries: %w", err)
	}

	log.Info("starting a PostgreSQL cluster of its own (fsync on, pg_stat_statements)")
	cluster, err := chaos.StartCluster(ctx, filepath.Join(dir, "pg"), "shared_preload_libraries=pg_stat_statements")
	if err != nil {
		return err
	}
	defer cluster.Stop(context.Background()) //nolint:errcheck

	admin, err := pgxpool.New(ctx, cluster.URL("postgres"))
	if err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, `CREATE DATABASE bench`); err != nil {
		return err
	}
	admin.Close()
	e := &env{ctx: ctx, cluster: cluster, dbURL: cluster.URL("bench"), out: out, workerBin: filepath.Join(dir, "worker"), enqueueBin: filepath.Join(dir, "enqueue"), dir: dir, phase: phase, log: log, diagDir: diagDir}
	if diagDir != "" {
		if err := os.MkdirAll(diagDir, 0o755); err != nil {
			return err
		}
	}
	cfg, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 64
	cfg.ConnConfig.RuntimeParams["application_name"] = harnessApp
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	defer e.pool.Close()
	if _, err := migrations.Apply(ctx, e.pool, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	if _, err := migrations.ApplyWarehouse(ctx, e.pool); err != nil {
		return err
	}
	if _, err := e.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}

	for _, s := range []struct {
		name string
		fn   func(*env) error
	}{
		{"enqueue throughput", benchEnqueue},
		{"enqueue burst", benchBurst},
		{"HTTP door", benchHTTP},
		{"SQS consumer", benchSQS},
		{"reconcile", benchReconcile},
		{"conflict path", benchConflict},
		{"lease operations", benchLeases},
		{"10,000 running batches", func(e *env) error { return benchRunning(e, running) }},
		{"renewal cost by details size", benchRenewalDetailsSize},
		{"load phase", benchLoad},
		{"staging", benchStaging},
		{"worker idle cost", benchIdle},
		{"end to end", benchEndToEnd},
		{"protocol floor", benchFloor},
		{"fairness", benchFairness},
		{"worker pods", benchPods},
		{"takeover latency", func(e *env) error { return benchTakeover(e, trials) }},
	} {
		if only != "" && !strings.Contains(s.name, only) {
			continue
		}
		log.Info("scenario", "name", s.name)
		if err := s.fn(e); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	if err := writeReport(out, e.results, e.charts, time.Since(start), loadAtStart); err != nil {
		return err
	}
	if err := writeDiagnostics(diagDir, e.diagnostics); err != nil {
		return err
	}
	log.Info("done", "took", time.Since(start).Round(time.Second), "results", out)
	return nil
}
