package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fleet/ingest/internal/jobs"
)

// Fairness between tenants (issue: hundreds of worker pods on one
// primary). Tenant A enqueues fairnessBacklog trivial folders in one burst
// (as import --from-file does); a second later tenant B enqueues
// fairnessFresh. Two worker processes at the default concurrency work
// them. Measured: B's slowest enqueue→Succeeded, and A's throughput
// against A alone with the same workers.
const (
	fairnessBacklog = 2000
	fairnessFresh   = 10
	fairnessCap     = 2
)

type fairnessRun struct {
	bSlowest time.Duration // B's slowest reservation→Succeeded
	aRate    float64       // A's batches/s: its batches over their span
}

func benchFairness(e *env) error {
	dir := filepath.Join(e.dir, "fairness")
	folders := func(tenant string, n int) ([]jobs.ImportRequest, error) {
		reqs := make([]jobs.ImportRequest, n)
		for i := range reqs {
			d := filepath.Join(dir, tenant, fmt.Sprint(i))
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(d, "a.csv"), []byte("k,v\n1,x\n"), 0o644); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(d, "_SUCCESS"), nil, 0o644); err != nil { // the completion marker the worker requires
				return nil, err
			}
			reqs[i] = jobs.ImportRequest{TenantID: tenant, TenantDatabase: "tenant_db", CompanyID: "company-1", Folder: "file://" + d}
		}
		return reqs, nil
	}
	backlog, err := folders("tenant-a", fairnessBacklog)
	if err != nil {
		return err
	}
	fresh, err := folders("tenant-b", fairnessFresh)
	if err != nil {
		return err
	}
	enq, err := e.enqueuer(e.pool)
	if err != nil {
		return err
	}

	run := func(withB bool, extra ...string) (fairnessRun, error) {
		var r fairnessRun
		if err := e.reset(); err != nil {
			return r, err
		}
		procs, err := e.startWorkers(2, extra...)
		if err != nil {
			return r, err
		}
		defer e.stopWorkers(procs)
		if _, err := enq.ImportMany(e.ctx, backlog); err != nil {
			return r, err
		}
		want := fairnessBacklog
		if withB {
			time.Sleep(time.Second)
			if _, err := enq.ImportMany(e.ctx, fresh); err != nil {
				return r, err
			}
			want += fairnessFresh
		}
		deadline := time.Now().Add(4 * time.Minute)
		for {
			var done int
			if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM ingestion_batches WHERE status = 'Succeeded' AND `+current).Scan(&done); err != nil {
				return r, err
			}
			if done == want {
				break
			}
			if time.Now().After(deadline) {
				return r, fmt.Errorf("%d of %d batches succeeded in 4 minutes", done, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
		var span float64
		if err := e.pool.QueryRow(e.ctx, `
			SELECT COALESCE(max(completed_at - started_at) FILTER (WHERE tenant_id = 'tenant-b'), interval '0'),
			       EXTRACT(EPOCH FROM max(completed_at) FILTER (WHERE tenant_id = 'tenant-a') - min(started_at) FILTER (WHERE tenant_id = 'tenant-a'))
			FROM ingestion_batches WHERE `+current).Scan(&r.bSlowest, &span); err != nil {
			return r, err
		}
		r.aRate = fairnessBacklog / span
		return r, nil
	}

	capFlag := []string{"--max-running-per-tenant", fmt.Sprint(fairnessCap)}
	alone, err := run(false, capFlag...)
	if err != nil {
		return fmt.Errorf("tenant A alone: %w", err)
	}
	capped, err := run(true, capFlag...)
	if err != nil {
		return fmt.Errorf("with the cap: %w", err)
	}
	uncapped, err := run(true)
	if err != nil {
		return fmt.Errorf("without the cap: %w", err)
	}
	setup := fmt.Sprintf("tenant A enqueues %d trivial folders in one burst, tenant B %d one second later; 2 worker processes at --concurrency 4", fairnessBacklog, fairnessFresh)
	e.addTarget(fmt.Sprintf("fairness: tenant B's slowest enqueue→Succeeded behind A's %d-folder backlog, --max-running-per-tenant %d", fairnessBacklog, fairnessCap),
		capped.bSlowest.Seconds(), "s", "<= 5 s", capped.bSlowest <= 5*time.Second,
		fmt.Sprintf("%s, --max-running-per-tenant %d; without the cap, same run: %.1f s", setup, fairnessCap, uncapped.bSlowest.Seconds()))
	e.add(fmt.Sprintf("fairness: tenant A's throughput beside B, vs A alone, --max-running-per-tenant %d", fairnessCap),
		capped.aRate, ptr(alone.aRate), "batches/s", 0.8, false,
		fmt.Sprintf("%s; baseline: A's %d folders alone with the same workers and cap, same run; without the cap A ran at %.1f batches/s beside B",
			setup, fairnessBacklog, uncapped.aRate))
	return nil
}
