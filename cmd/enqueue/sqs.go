package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/grants"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/sqsconsumer"
)

type sqsCmd struct {
	QueueURL          string        `name:"queue-url" env:"SQS_QUEUE_URL" help:"URL of the SQS queue S3 notifications arrive in (directly, through SNS, or from an EventBridge rule). Required."`
	MaxBadRecords     int           `name:"max-bad-records" env:"MAX_BAD_RECORDS" default:"0" help:"Tolerance of bad records of the imports this door makes, unless a request says (max_bad_records): up to this many records that cannot be stored are skipped, each recorded with the slice in the warehouse's errors table; one more fails the batch. 0 to 10000; 0: the first fails it."`
	Marker            string        `name:"marker" env:"COMPLETION_MARKER" default:"_SUCCESS" help:"Object name whose creation completes a folder."`
	PathPattern       string        `name:"path-pattern" env:"PATH_PATTERN" default:"tenants/{tenant_id}/{tenant_database}/{company_id}/" help:"How an S3 folder maps to tenant, database and company (as enqueue serve and the worker)."`
	Buckets           []string      `name:"bucket" env:"ACCEPTED_BUCKETS" help:"Import folders only of these buckets (repeatable; default: any bucket whose name is a valid S3 bucket name). A message of another bucket is left for the dead-letter queue."`
	WaitTime          time.Duration `name:"wait-time" env:"SQS_WAIT_TIME" default:"20s" help:"Long poll of each receive (WaitTimeSeconds), 0s to 20s."`
	MaxMessages       int           `name:"max-messages" env:"SQS_MAX_MESSAGES" default:"10" help:"Messages per receive, 1 to 10."`
	Receivers         int           `name:"receivers" env:"SQS_RECEIVERS" default:"8" help:"Long polls in flight at once, 1 to 64 (one returns at most 10 messages; about --max-burst/10 fill a transaction)."`
	MaxBurst          int           `name:"max-burst" env:"SQS_MAX_BURST" default:"100" help:"Folders imported in one transaction at most: the receives that arrive together (see --linger) are imported together, up to this many folders."`
	Linger            time.Duration `name:"linger" env:"SQS_LINGER" default:"10ms" help:"How long a transaction waits for more receives to join it after the first arrived, 0s to 1s."`
	VisibilityTimeout time.Duration `name:"visibility-timeout" env:"SQS_VISIBILITY_TIMEOUT" default:"0s" help:"Visibility timeout of the messages received (whole seconds); 0s keeps the queue's. It must exceed --timeout: a message comes back only after it."`
	BackoffMax        time.Duration `name:"backoff-max" env:"SQS_BACKOFF_MAX" default:"30s" help:"Longest pause after a failed round (the database or SQS unavailable); pauses double from 1s."`
	AdminListen       string        `name:"admin-listen" env:"ADMIN_LISTEN_ADDR" default:":8081" help:"Address of /healthz, /readyz and /metrics."`
	MaxConns          int           `name:"max-conns" env:"MAX_CONNS" default:"4" help:"Database connections (rounds commit one at a time, on one connection)."`

	// DelayAfterCommit is for tests only: a pause between a round's commit
	// and its delete, the window a crash can fall into.
	DelayAfterCommit time.Duration `name:"test-delay-after-commit" hidden:"" help:"Tests only: pause between the commit and the delete."`

	cli.DatabaseProbeFlags
}

// sqsSettingFields names the flag behind each sqsconsumer.Config setting.
var sqsSettingFields = map[string]string{
	"QueueURL": "queue_url", "WaitTime": "wait_time", "MaxMessages": "max_messages", "Receivers": "receivers", "MaxBurst": "max_burst", "Linger": "linger",
	"VisibilityTimeout": "visibility_timeout", "ImportTimeout": "timeout", "Backoff": "backoff_max", "Mapping": "path_pattern",
}

// config checks every setting, connecting to nothing; the queue, importer
// and metrics are left for Run to fill in.
func (s *sqsCmd) config(c *enqueueCLI, e *cli.Env) (sqsconsumer.Config, error) {
	switch {
	case c.DatabaseURL == "":
		return sqsconsumer.Config{}, refuseSetting(e, "database_url", cli.ErrNoDatabaseURL)
	case c.Timeout <= 0:
		return sqsconsumer.Config{}, refuseSetting(e, "timeout", errors.New("--timeout must be positive"))
	case s.MaxConns < 1:
		return sqsconsumer.Config{}, refuseSetting(e, "max_conns", errors.New("--max-conns must be at least 1"))
	case s.WaitTime < 0:
		return sqsconsumer.Config{}, refuseSetting(e, "wait_time", errors.New("--wait-time must not be negative"))
	case s.MaxMessages < 1:
		return sqsconsumer.Config{}, refuseSetting(e, "max_messages", errors.New("--max-messages must be 1 to 10"))
	case s.Receivers < 1:
		return sqsconsumer.Config{}, refuseSetting(e, "receivers", errors.New("--receivers must be 1 to 64"))
	case s.MaxBurst < 1:
		return sqsconsumer.Config{}, refuseSetting(e, "max_burst", errors.New("--max-burst must be 1 to 1000"))
	case s.Linger < 0:
		return sqsconsumer.Config{}, refuseSetting(e, "linger", errors.New("--linger must be 0s to 1s"))
	case s.BackoffMax < time.Second:
		return sqsconsumer.Config{}, refuseSetting(e, "backoff_max", errors.New("--backoff-max must be at least 1s"))
	case s.VisibilityTimeout%time.Second != 0:
		return sqsconsumer.Config{}, refuseSetting(e, "visibility_timeout", errors.New("--visibility-timeout must be whole seconds"))
	case s.DatabaseProbeFlags.Validate() != nil:
		return sqsconsumer.Config{}, refuseSetting(e, "database_probe_interval", s.DatabaseProbeFlags.Validate())
	case s.VisibilityTimeout > 0 && s.VisibilityTimeout <= c.Timeout:
		return sqsconsumer.Config{}, refuseSetting(e, "visibility_timeout", fmt.Errorf("--visibility-timeout (%s) must exceed --timeout (%s): a message would come back while its round still runs", s.VisibilityTimeout, c.Timeout))
	}
	for _, b := range s.Buckets {
		if err := folder.ValidateBucketName(b); err != nil {
			return sqsconsumer.Config{}, refuseSetting(e, "bucket", fmt.Errorf("--bucket: %w", err))
		}
	}
	wait := s.WaitTime
	if wait == 0 {
		wait = -1 // short polls
	}
	linger := s.Linger
	if linger == 0 {
		linger = -1 // no wait
	}
	cfg := sqsconsumer.Config{
		QueueURL: s.QueueURL, Marker: s.Marker, MaxBadRecords: s.MaxBadRecords, Mapping: folder.Mapping{Pattern: s.PathPattern, Buckets: s.Buckets},
		WaitTime: wait, MaxMessages: s.MaxMessages, Receivers: s.Receivers, MaxBurst: s.MaxBurst, Linger: linger, VisibilityTimeout: s.VisibilityTimeout,
		ImportTimeout: c.Timeout, BackoffMax: s.BackoffMax, DelayAfterCommit: s.DelayAfterCommit, Logger: e.Logger,
	}
	if s.Marker == "" || strings.Contains(s.Marker, "/") {
		return sqsconsumer.Config{}, refuseSetting(e, "marker", errors.New("--marker must be an object name without '/'"))
	}
	if s.MaxBadRecords < 0 || s.MaxBadRecords > folder.MaxBadRecordsCap {
		return sqsconsumer.Config{}, refuseSetting(e, "max_bad_records", fmt.Errorf("--max-bad-records must be between 0 and %d", folder.MaxBadRecordsCap))
	}
	if err := cfg.Validate(); err != nil {
		var ce *sqsconsumer.ConfigError
		errors.As(err, &ce)
		return sqsconsumer.Config{}, refuseConfigSetting(e, sqsSettingFields, ce.Setting, ce.Reason, "")
	}
	return cfg, nil
}

func (s *sqsCmd) Run(c *enqueueCLI, e *cli.Env) error {
	cfg, err := s.config(c, e)
	if err != nil {
		return err
	}
	awsCfg, err := config.LoadDefaultConfig(e.Ctx)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	// The database must answer at start; later outages are backed off.
	pool, enq, err := connectEnqueuer(c, e, grants.Enqueue, s.MaxConns, metrics.NewSQS()) // the consumer's own metrics, not the worker's gauges frozen at zero
	if err != nil {
		return err
	}
	defer pool.Close()
	stopProbe := startDatabaseProbe(e, enq.Metrics, pool, s.DatabaseProbeFlags)
	defer stopProbe()
	enq.Metrics.AddPool(metrics.PoolEnqueue, pool)
	cfg.Queue, cfg.Importer, cfg.Metrics = sqsconsumer.NewSQSClient(awsCfg, cfg), enq, enq.Metrics
	cfg.Batches = batch.NewStore(pool) // late_object: data-object events of published folders
	consumer, err := sqsconsumer.New(cfg)
	if err != nil {
		return err
	}
	if len(s.Buckets) == 0 {
		e.Logger.Warn("no --bucket given: folders of any validly named bucket are imported; list your upload buckets")
	}
	var ready atomic.Bool
	admin, adminServed, err := startProbes(s.AdminListen, enq.Metrics, pool, &ready, e)
	if err != nil {
		return err
	}
	ready.Store(true)
	e.Logger.Info("consuming upload notifications", "addr", admin.Addr().String(), "queue_url", s.QueueURL, "buckets", s.Buckets,
		"wait_time_seconds", s.WaitTime.Seconds(), "max_messages", s.MaxMessages, "receivers", s.Receivers, "max_burst", s.MaxBurst, "linger_seconds", s.Linger.Seconds(),
		"visibility_timeout_seconds", s.VisibilityTimeout.Seconds())

	consumed := make(chan error, 1)
	go func() { consumed <- consumer.Run(e.Ctx) }()
	select {
	case err = <-consumed:
	case err = <-adminServed:
		err = fmt.Errorf("admin listener: %w", err)
	}
	ready.Store(false)
	if err == nil {
		e.Logger.Info("stopped: the round in hand was finished")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = admin.Shutdown(ctx)
	return err
}

// startProbes serves /healthz, /readyz (ready, the database reached —
// m.Database's cached answer, which never waits on it — and its schema
// current for this build, asked within 2 s: otherwise 503 with the reason)
// and /metrics on addr, a listener that refuses request bodies.
func startProbes(addr string, m *metrics.Metrics, pool *pgxpool.Pool, ready *atomic.Bool, e *cli.Env) (*httpserver.Server, <-chan error, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if err := m.Database.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := schemaReady(pool)(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	srv, err := httpserver.Listen(httpserver.Config{Addr: addr, Handler: mux, MaxConns: adminMaxConns, RefuseBodies: true,
		EvictableAfter: httpserver.EvictableAfterProbes, Logger: e.Logger})
	if err != nil {
		return nil, nil, cannotListen(e, "admin-listen", err)
	}
	served := make(chan error, 1)
	go func() {
		if err := srv.Serve(); err != nil {
			served <- err
		}
	}()
	return srv, served, nil
}
