package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/grants"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/reconcile"
)

type reconcileCmd struct {
	Bucket               string        `name:"bucket" env:"RECONCILE_BUCKET" help:"The bucket to list. Required."`
	Prefix               string        `name:"prefix" env:"RECONCILE_PREFIX" help:"List only keys under this prefix (e.g. tenants/)."`
	MaxBadRecords        int           `name:"max-bad-records" env:"MAX_BAD_RECORDS" default:"0" help:"Tolerance of bad records of the imports this door makes, unless a request says (max_bad_records): up to this many records that cannot be stored are skipped, each recorded with the slice in the warehouse's errors table; one more fails the batch. 0 to 10000; 0: the first fails it."`
	Marker               string        `name:"marker" env:"COMPLETION_MARKER" default:"_SUCCESS" help:"Object name whose existence completes a folder."`
	PathPattern          string        `name:"path-pattern" env:"PATH_PATTERN" default:"tenants/{tenant_id}/{tenant_database}/{company_id}/" help:"How an S3 folder maps to tenant, database and company (as enqueue serve, enqueue sqs and the worker)."`
	Since                string        `name:"since" help:"Only folders whose marker or any data object was last modified at or after this: an RFC 3339 time, or a duration before now (24h)."`
	DryRun               bool          `name:"dry-run" help:"Print what would be enqueued (would_enqueue) or imported again (would_reimport); write nothing."`
	RetryFailedPreCommit bool          `name:"retry-failed-pre-commit" help:"Also enqueue folders whose batches all failed, the newest before its warehouse commit (failed_pre_commit, failed_enqueue). Otherwise they are reported (failed), not retried."`
	BurstSize            int           `name:"burst-size" default:"500" help:"Folders looked up and enqueued together (one transaction)."`
	Every                time.Duration `name:"every" env:"RECONCILE_EVERY" help:"Run periodically: one period every this long, safe in every replica at once (one works per period), resumed from a checkpoint in PostgreSQL. Without it: one scan, one JSON line per folder and a summary."`
	MaxObjects           int           `name:"max-objects" env:"RECONCILE_MAX_OBJECTS" default:"100000" help:"With --every: most objects listed per period; the next period continues after the last key."`
	AdminListen          string        `name:"admin-listen" env:"ADMIN_LISTEN_ADDR" help:"With --every: address of /healthz, /readyz and /metrics."`
	MaxConns             int           `name:"max-conns" env:"MAX_CONNS" default:"4" help:"Database connections."`
	S3PathStyle          bool          `name:"s3-path-style" env:"S3_PATH_STYLE" help:"Address the bucket by path (http://host/bucket), not by host name (http://bucket.host): for S3-compatible stores (MinIO, Ceph RGW) at an endpoint of their own (AWS_ENDPOINT_URL_S3). Amazon S3 needs it not. Use the same setting as the worker."`

	// With --every only.
	cli.DatabaseProbeFlags
}

// since parses --since relative to now.
func (r *reconcileCmd) since(now time.Time) (time.Time, error) {
	if r.Since == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, r.Since); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(r.Since)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("--since %q is neither an RFC 3339 time nor a positive duration", r.Since)
	}
	return now.Add(-d), nil
}

// reconcileSettingFields names the flag behind each reconcile.Config setting.
var reconcileSettingFields = map[string]string{"Bucket": "bucket", "BurstSize": "burst_size", "MaxObjects": "max_objects", "Mapping": "path_pattern"}

func (r *reconcileCmd) config(c *enqueueCLI, e *cli.Env) (reconcile.Config, error) {
	since, err := r.since(time.Now())
	switch {
	case err != nil:
		return reconcile.Config{}, refuseSetting(e, "since", err)
	case c.DatabaseURL == "":
		return reconcile.Config{}, refuseSetting(e, "database_url", cli.ErrNoDatabaseURL)
	case c.Timeout <= 0:
		return reconcile.Config{}, refuseSetting(e, "timeout", errors.New("--timeout must be positive"))
	case r.MaxConns < 1:
		return reconcile.Config{}, refuseSetting(e, "max_conns", errors.New("--max-conns must be at least 1"))
	case r.BurstSize < 1:
		return reconcile.Config{}, refuseSetting(e, "burst_size", errors.New("--burst-size must be at least 1"))
	case r.Every < 0 || (r.Every > 0 && r.Every < time.Second):
		return reconcile.Config{}, refuseSetting(e, "every", errors.New("--every must be at least 1s"))
	case r.Every > 0 && r.DryRun:
		return reconcile.Config{}, refuseSetting(e, "dry_run", errors.New("--dry-run runs once: not with --every"))
	case r.Every > 0 && r.DatabaseProbeFlags.Validate() != nil:
		return reconcile.Config{}, refuseSetting(e, "database_probe_interval", r.DatabaseProbeFlags.Validate())
	case r.Every > 0 && r.MaxObjects < 1000:
		return reconcile.Config{}, refuseSetting(e, "max_objects", errors.New("--max-objects must be at least 1000 (a page)"))
	case r.Marker == "" || strings.Contains(r.Marker, "/"):
		return reconcile.Config{}, refuseSetting(e, "marker", errors.New("--marker must be an object name without '/'"))
	case r.MaxBadRecords < 0 || r.MaxBadRecords > folder.MaxBadRecordsCap:
		return reconcile.Config{}, refuseSetting(e, "max_bad_records", fmt.Errorf("--max-bad-records must be between 0 and %d", folder.MaxBadRecordsCap))
	}
	cfg := reconcile.Config{
		Bucket: r.Bucket, Prefix: r.Prefix, Marker: r.Marker, MaxBadRecords: r.MaxBadRecords, Mapping: folder.Mapping{Pattern: r.PathPattern},
		Since: since, DryRun: r.DryRun, RetryFailedPreCommit: r.RetryFailedPreCommit, BurstSize: r.BurstSize, Timeout: c.Timeout, Logger: e.Logger,
	}
	if r.Every > 0 {
		cfg.MaxObjects = r.MaxObjects
	}
	if err := cfg.Validate(); err != nil {
		var ce *reconcile.ConfigError
		errors.As(err, &ce)
		return reconcile.Config{}, refuseConfigSetting(e, reconcileSettingFields, ce.Setting, ce.Reason, "")
	}
	return cfg, nil
}

func (r *reconcileCmd) Run(c *enqueueCLI, e *cli.Env) error {
	cfg, err := r.config(c, e)
	if err != nil {
		return err
	}
	awsCfg, err := config.LoadDefaultConfig(e.Ctx)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	pool, enq, err := connectEnqueuer(c, e, grants.Reconcile, r.MaxConns, metrics.NewReconcile()) // the scans' own metrics, not the worker's gauges frozen at zero
	if err != nil {
		return err
	}
	defer pool.Close()
	enq.Metrics.AddPool(metrics.PoolEnqueue, pool)
	pathStyle := func(o *s3.Options) { o.UsePathStyle = r.S3PathStyle }
	cfg.S3, cfg.Pool, cfg.Importer, cfg.Metrics = s3.NewFromConfig(awsCfg, pathStyle), pool, enq, enq.Metrics
	if r.Every > 0 {
		return r.periodic(e, cfg, pool)
	}

	worst := cli.ExitOK
	cfg.Report = func(f reconcile.Folder) {
		printJSON(e.Stdout, f)
		if f.Outcome == reconcile.OutcomeEnqueueFailed {
			worst = cli.ExitEnqueueFail
		}
	}
	sum, err := reconcile.Scan(e.Ctx, cfg, "")
	printJSON(e.Stdout, map[string]any{"summary": sum})
	e.Logger.Info("reconcile finished", "objects_listed", sum.ObjectsListed, "keys_skipped", sum.KeysSkipped, "folders", sum.Folders, "outcomes", sum.Outcomes,
		"complete", sum.Complete, "duration_seconds", sum.DurationSeconds)
	if err != nil {
		return err
	}
	if worst != cli.ExitOK {
		return cli.ExitError{Code: worst}
	}
	return nil
}

// periodic runs a period at once and then every --every until the context
// ends; a period in progress stops at its next page and keeps its
// checkpoint.
func (r *reconcileCmd) periodic(e *cli.Env, cfg reconcile.Config, pool *pgxpool.Pool) error {
	stopProbe := startDatabaseProbe(e, cfg.Metrics, pool, r.DatabaseProbeFlags)
	defer stopProbe()
	var ready atomic.Bool
	var admin *httpserver.Server
	var adminServed <-chan error
	if r.AdminListen != "" {
		var err error
		if admin, adminServed, err = startProbes(r.AdminListen, cfg.Metrics, pool, &ready, e); err != nil {
			return err
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = admin.Shutdown(ctx)
		}()
	}
	ready.Store(true)
	attrs := []any{"bucket", cfg.Bucket, "prefix", cfg.Prefix, "every_seconds", r.Every.Seconds(), "max_objects", cfg.MaxObjects}
	if admin != nil {
		attrs = append(attrs, "addr", admin.Addr().String())
	}
	e.Logger.Info("reconciling periodically", attrs...)
	timer := time.NewTimer(0)
	defer timer.Stop()
	skipped := 0 // periods skipped in a row
	for {
		select {
		case <-e.Ctx.Done():
			e.Logger.Info("stopped")
			return nil
		case err := <-adminServed:
			return fmt.Errorf("admin listener: %w", err)
		case <-timer.C:
		}
		p, err := reconcile.RunPeriod(e.Ctx, cfg, r.Every)
		switch {
		case err != nil:
			if p.Outcome == "scanned" {
				skipped = 0
			}
			cfg.Metrics.ReconcileScans.WithLabelValues("failed").Inc()
			e.Logger.Error("reconcile period failed", "error", err.Error())
		case p.Outcome == "skipped":
			cfg.Metrics.ReconcileScans.WithLabelValues("skipped").Inc()
			skipped++
			attrs := []any{"reason", p.SkipReason, "skipped_consecutive", skipped, "holders", p.Holders}
			switch {
			case skipped >= reconcile.SkipsConsecutiveAlert:
				// Another replica may be the one working: the alert reads
				// every replica's count (FleetIngestReconcileSilenced).
				e.Logger.Warn("reconcile period skipped again: unless another replica scans, reconcile is silenced", attrs...)
			case p.SkipReason == reconcile.SkipLocked:
				e.Logger.Info("reconcile period skipped: another session holds the checkpoint", attrs...)
			default:
				e.Logger.Info("reconcile period skipped: a replica worked this period", attrs...)
			}
		default:
			cfg.Metrics.ReconcileScans.WithLabelValues("scanned").Inc()
			skipped = 0
			s := p.Summary
			e.Logger.Info("reconcile period finished", "start_after", p.StartAfter, "since", p.Since, "objects_listed", s.ObjectsListed, "keys_skipped", s.KeysSkipped,
				"folders", s.Folders, "outcomes", s.Outcomes, "complete", s.Complete, "last_key", s.LastKey,
				"duration_seconds", s.DurationSeconds)
		}
		timer.Reset(r.Every)
	}
}
