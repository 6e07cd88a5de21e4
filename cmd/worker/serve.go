package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/drain"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/grants"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/notify"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/warehousecli"
	"github.com/fleet/ingest/migrations"
)

type runCmd struct {
	MetricsAddr          string        `name:"metrics-addr" env:"METRICS_ADDR" default:":9090" help:"Address of the HTTP listener serving /metrics, /healthz and /readyz (Prometheus and kubelet probes). It refuses request bodies (413), so no client can hold a connection by sending one slowly."`
	MetricsMaxConns      int           `name:"metrics-max-conns" env:"METRICS_MAX_CONNS" default:"64" help:"Most open connections to the metrics listener, a cap of its own. At the cap a new connection closes the one idle longest, once it has been idle 100 ms; until then it waits."`
	LeaseTTL             time.Duration `name:"lease-ttl" env:"LEASE_TTL" default:"30s" help:"Execution lease duration, on the database clock."`
	LeaseRenewEvery      time.Duration `name:"lease-renew-every" env:"LEASE_RENEW_EVERY" default:"10s" help:"Heartbeat period; must be shorter than --lease-ttl."`
	LeaseSafetyMargin    time.Duration `name:"lease-safety-margin" env:"LEASE_SAFETY_MARGIN" help:"How long before its lease's expiry (as its last renewal reported it) a delivery stops working, and how much of its term must be left, by the database clock, for a warehouse commit to start. Default (0): a tenth of --lease-ttl, at least a quarter of --lease-renew-every (3s with the defaults). Must be shorter than --lease-ttl minus --lease-renew-every."`
	MaxRunningPerTenant  int           `name:"max-running-per-tenant" env:"MAX_RUNNING_PER_TENANT" default:"0" help:"Fairness between tenants: while another tenant's batch waits for a worker, one tenant's batches running at once across the fleet (holding a lease) are at most this many; a delivery over it is snoozed (not an attempt) and the tenant's queued jobs ahead of the waiting tenant's move behind it (still due). A tenant alone uses every worker. Decided in PostgreSQL. 0: no cap."`
	Concurrency          int           `name:"concurrency" env:"CONCURRENCY" default:"4" help:"Batches this process works at once."`
	ShutdownGrace        time.Duration `name:"shutdown-grace" env:"SHUTDOWN_GRACE" default:"25s" help:"On SIGTERM, how long every running batch may go on, whatever its progress. After it, a batch goes on only if its load's progress says it finishes within --drain-max; the others are cancelled and left resumable."`
	DrainMax             time.Duration `name:"drain-max" env:"DRAIN_MAX" default:"15m" help:"On SIGTERM, how long after it a load whose progress (objects read, at the rate read so far, with a 25% margin) says it will finish by then keeps the worker running, so a rollout does not restart it from its first object; at this limit every batch still running is cancelled and left resumable. A load that shows no progress (blocked, or a Redshift COPY, which the next delivery follows rather than restarts) is cancelled when --shutdown-grace ends. The pod's terminationGracePeriodSeconds must exceed it. Below --shutdown-grace it counts as --shutdown-grace."`
	SweepInterval        time.Duration `name:"sweep-interval" env:"SWEEP_INTERVAL" default:"5s" help:"How often to look for Running batches whose lease expired (crashed workers) or that are orphaned. Fleet-wide: a tick within half of it of another process's sweep does nothing, so the fleet sweeps about once per interval whatever its number of pods."`
	OrphanAfter          time.Duration `name:"orphan-after" env:"ORPHAN_AFTER" default:"1m" help:"Re-deliver a Running batch without a lease and without a queued job after it has been untouched this long; take back a batch parked by a build that could not work on it (an older one during a rollout) after it has been parked this long, when this build can."`
	PublicationWindow    time.Duration `name:"publication-window" env:"PUBLICATION_WINDOW" default:"24h" help:"How long after its warehouse commit a batch may still be published."`
	RescueStuckJobsAfter time.Duration `name:"rescue-stuck-jobs-after" env:"RESCUE_STUCK_JOBS_AFTER" default:"2m" help:"How long a notification job may be left running (its process died, or a failover to a standby that was behind forgot its completion) before River's rescuer retries it; never less than --notify-timeout. Ingest jobs are never rescued: crash takeover goes by the lease."`
	ProgressEvery        time.Duration `name:"progress-every" env:"PROGRESS_EVERY" default:"5s" help:"How often a running load records its progress (objects and records read) in the batch."`
	StatsInterval        time.Duration `name:"stats-interval" env:"STATS_INTERVAL" default:"15s" help:"How often database-derived gauges are refreshed."`
	MetricsMaxTenants    int           `name:"metrics-max-tenants" env:"METRICS_MAX_TENANTS" default:"100" help:"Most tenants with series of their own in ingest_tenant_batches: those with the most Running batches (ties by tenant id); the others are summed under tenant=\"_other\". So /metrics holds at most 2 × (this + 1) tenant series whatever the number of tenants. 0: every tenant under _other. At most 10000."`
	PollInterval         time.Duration `name:"poll-interval" env:"POLL_INTERVAL" default:"1s" help:"River's fetch poll interval (LISTEN/NOTIFY usually wakes workers sooner)."`
	Name                 string        `name:"name" env:"POD_NAME" help:"This worker's name in lease ids and River. Defaults to the host name."`
	MaxRecordBytes       int           `name:"max-record-bytes" env:"MAX_RECORD_BYTES" default:"16777216" help:"Largest NDJSON line or CSV record (line terminator included); a folder with a larger one fails failed_pre_commit."`
	MaxColumns           int           `name:"max-columns" env:"MAX_COLUMNS" default:"4096" help:"Most columns of a CSV record; a folder with more fails failed_pre_commit."`
	MaxRecordExpansion   int           `name:"max-record-expansion" env:"MAX_RECORD_EXPANSION" default:"32" help:"Most times its CSV bytes a CSV record, and a CSV object's records together, may become as JSON, plus 4 KiB (every record repeats the header's column names); a folder with more fails failed_pre_commit. Between 2 and 1024."`
	MaxConns             int           `name:"max-conns" env:"MAX_CONNS" help:"Most connections this process holds to PostgreSQL (or the pooler in front of it), busy or idle: one for lease renewals, one for River's LISTEN (none with --database-pooler transaction), the PostgreSQL warehouse's loads (--max-conns − 4, at most --concurrency, at least 1; none with Redshift: a load holds its connection for its whole transaction, so this bounds the loads in the database at once) and the rest shared by River, lease acquisitions and checks, pipeline writes, the sweeper and gauges. Default --concurrency / 2 (rounded down, at most 8) + 4: 6 at concurrency 4, 12 from concurrency 16."`
	PathPattern          string        `name:"path-pattern" env:"PATH_PATTERN" default:"tenants/{tenant_id}/{tenant_database}/{company_id}/" help:"How an S3 folder maps to tenant, database and company; a batch whose tenant, database or company differs from what its folder's path names is parked unread. Use the same pattern as enqueue serve."`
	Buckets              []string      `name:"bucket" env:"ACCEPTED_BUCKETS" help:"Read folders only in these buckets (repeatable); a batch of another bucket is parked unread. Default: any valid S3 bucket name. Use the same list as enqueue serve."`
	Marker               string        `name:"marker" env:"COMPLETION_MARKER" default:"_SUCCESS" help:"The completion marker a folder must hold to be loaded (the object its producer writes last). A folder without it fails before any warehouse write, failed_pre_commit with reason folder_incomplete, unless its import opted out (enqueue import --no-marker, \"marker\": false). Use the same name as enqueue's doors."`
	S3PathStyle          bool          `name:"s3-path-style" env:"S3_PATH_STYLE" help:"Address buckets by path (http://host/bucket/key), not by host name (http://bucket.host/key): for S3-compatible stores (MinIO, Ceph RGW) at an endpoint of their own (AWS_ENDPOINT_URL_S3), whose buckets have no DNS names. Amazon S3 needs it not. Use the same setting as enqueue reconcile."`
	DevLocal             bool          `name:"dev-allow-local-folders" help:"Also read file:// and mem:// folders. Development only: a file:// batch loads a directory of this host into the warehouse. Without it such batches are parked unread."`
	NotificationsFile    string        `name:"notifications-file" env:"NOTIFICATIONS_FILE" help:"JSON file of each tenant's notification destinations (a Kubernetes Secret mounted as a file): webhooks (https URL and HMAC secret) and SNS topics, see docs/deploy.md. Every batch outcome (Succeeded, Failed with phase and reason, parked) is sent to its tenant's destinations through River's fleet_notify queue, at least once, with an idempotency key. Reloaded every --notifications-reload. Empty: no tenant has destinations. Only tenants with a destination get a notification job (a tenant without any costs its batches nothing)."`
	NotificationsReload  time.Duration `name:"notifications-reload" env:"NOTIFICATIONS_RELOAD" default:"10s" help:"How often --notifications-file is read again: a destination added is used, one removed no longer is, without a restart; a file that no longer parses keeps the last good one (logged and counted)."`
	NotifyConcurrency    int           `name:"notify-concurrency" env:"NOTIFY_CONCURRENCY" default:"2" help:"Notifications this process sends at once, on the fleet_notify queue (never holding a batch's lease). 0: this worker sends none (another must)."`
	NotifyMaxAttempts    int           `name:"notify-max-attempts" env:"NOTIFY_MAX_ATTEMPTS" default:"12" help:"Attempts of one notification to one destination before it is given up (ingest_notifications_given_up_total, an ERROR log line)."`
	NotifyRetryBase      time.Duration `name:"notify-retry-base" env:"NOTIFY_RETRY_BASE" default:"10s" help:"Pause after a notification's first failed attempt, doubled after each further one up to --notify-retry-max (plus up to 20% jitter). With the defaults 12 attempts span about 3.5 hours."`
	NotifyRetryMax       time.Duration `name:"notify-retry-max" env:"NOTIFY_RETRY_MAX" default:"1h" help:"Longest pause between two attempts of a notification."`
	NotifyTimeout        time.Duration `name:"notify-timeout" env:"NOTIFY_TIMEOUT" default:"30s" help:"Bound of one attempt to send a notification (the webhook's answer, the SNS publish)."`
	PauseBeforeComplete  time.Duration `name:"test-pause-before-completion" hidden:"" help:"Tests only: pause a delivery that ended its batch between the terminal write and the job's completion."`
	ClockOffset          time.Duration `name:"test-clock-offset" hidden:"" help:"Tests only: shift this process's local clock (lease deadlines) by this much."`
	PauseBeforePublish   time.Duration `name:"test-pause-before-publication" hidden:"" help:"Tests only: pause a delivery between its warehouse commit and its publication."`
	SimulatePods         int           `name:"simulate-pods" hidden:"" help:"Benchmarks only: run this many independent workers in this process, as that many pods would (each its own pools, River client, lease renewer, sweeper, gauges and metrics listener, named --name-NNN, listening on --metrics-addr's port + NNN), so a small machine can put hundreds of pods' connection behaviour on one database. 0 or 1: one worker, the production setting."`

	warehousecli.Flags
	cli.DatabaseProbeFlags
}

// minMaxConns is the smallest --max-conns, and what the default keeps
// beside the loads: the renewal connection, River's LISTEN connection (or,
// polling, one more shared connection) and two shared connections.
const minMaxConns = 4

// connBudget is how a worker's connections to PostgreSQL are split. Every
// pool is bounded, so the worker never holds more than Total.
type connBudget struct {
	// Renewals is the lease renewer's own connection.
	Renewals int32
	// Listener is River's LISTEN connection: 1, or 0 when River polls
	// (--database-pooler transaction). River takes it out of the shared
	// pool for good (it hijacks it), so the shared pool is sized without it.
	Listener int32
	// Loads is the PostgreSQL warehouse's pool: each load holds one
	// connection for its whole transaction (the COPY streams the folder),
	// so at most Loads batches load at once. 0 with Redshift, whose loads
	// hold no connection.
	Loads int32
	// Shared is everything else: River (fetches, completions, leader
	// election, maintenance), lease acquisitions, checks and releases,
	// pipeline writes, the sweeper and the gauges. Each holds a connection
	// only for a statement or a short transaction.
	Shared int32
}

// Total is the most connections the worker holds.
func (b connBudget) Total() int32 { return b.Renewals + b.Listener + b.Loads + b.Shared }

// defaultMaxConns is --max-conns when none is given: half the concurrency,
// at most 8, beside minMaxConns. More loads in the database at once did not
// load more: on two cores, 20 connections per process at concurrency 32
// (16 loads) carried 103–168 trivial batches/s at 1–4 processes against
// 139–236 with 12 (8 loads), at 20–30% more PostgreSQL CPU per batch
// (go run ./bench -only "end to end", MAX_CONNS 20 and 12 alternated).
func defaultMaxConns(concurrency int) int { return min(concurrency/2, 8) + minMaxConns }

// budget splits --max-conns (default defaultMaxConns) between the pools.
func (r *runCmd) budget(pollOnly bool) connBudget {
	total := r.MaxConns
	if total == 0 {
		total = defaultMaxConns(r.Concurrency)
	}
	b := connBudget{Renewals: 1, Listener: 1}
	if pollOnly {
		b.Listener = 0
	}
	if !r.IsRedshift() {
		b.Loads = int32(max(min(total-minMaxConns, r.Concurrency), 1))
	}
	b.Shared = int32(total) - b.Renewals - b.Listener - b.Loads
	return b
}

// mapping is the worker's own rule for which folders it reads, as whose.
func (r *runCmd) mapping() folder.Mapping {
	return folder.Mapping{Pattern: r.PathPattern, Buckets: r.Buckets}
}

func (r *runCmd) validate() error {
	switch {
	case r.LeaseTTL < time.Second:
		return errors.New("--lease-ttl must be at least 1s")
	case r.LeaseRenewEvery <= 0 || r.LeaseRenewEvery >= r.LeaseTTL:
		return fmt.Errorf("--lease-renew-every (%s) must be positive and shorter than --lease-ttl (%s)", r.LeaseRenewEvery, r.LeaseTTL)
	case r.LeaseSafetyMargin < 0 || r.LeaseSafetyMargin >= r.LeaseTTL-r.LeaseRenewEvery:
		return fmt.Errorf("--lease-safety-margin (%s) must be at least 0 and shorter than --lease-ttl minus --lease-renew-every (%s): a lease renewed on time must not reach it", r.LeaseSafetyMargin, r.LeaseTTL-r.LeaseRenewEvery)
	case r.Concurrency < 1 || r.Concurrency > 256:
		return errors.New("--concurrency must be between 1 and 256")
	case r.SimulatePods < 0:
		return errors.New("--simulate-pods must not be negative")
	case r.MaxRunningPerTenant < 0:
		return errors.New("--max-running-per-tenant must not be negative (0: no cap)")
	case r.ShutdownGrace < 0 || r.DrainMax < 0:
		return errors.New("--shutdown-grace and --drain-max must not be negative")
	case r.MaxConns != 0 && r.MaxConns < minMaxConns:
		return fmt.Errorf("--max-conns (%d) must be at least %d", r.MaxConns, minMaxConns)
	case r.MetricsMaxConns < 1:
		return errors.New("--metrics-max-conns must be at least 1")
	case r.MetricsMaxTenants < 0 || r.MetricsMaxTenants > 10000:
		return fmt.Errorf("--metrics-max-tenants (%d) must be between 0 and 10000", r.MetricsMaxTenants)
	case r.MaxRecordBytes < 1024 || r.MaxColumns < 1:
		return errors.New("--max-record-bytes must be at least 1024 and --max-columns at least 1")
	case r.MaxRecordExpansion < 2 || r.MaxRecordExpansion > 1024:
		return fmt.Errorf("--max-record-expansion (%d) must be between 2 and 1024", r.MaxRecordExpansion)
	case r.Marker == "" || strings.Contains(r.Marker, "/") || !folder.IsMarker(r.Marker):
		return fmt.Errorf("--marker %q must be an object name without '/' that starts with _ or . (a name the folder's listing does not take for data)", r.Marker)
	}
	if err := r.mapping().Validate(); err != nil {
		return fmt.Errorf("--path-pattern or --bucket: %w", err)
	}
	if err := r.DatabaseProbeFlags.Validate(); err != nil {
		return err
	}
	switch {
	case r.SweepInterval <= 0 || r.OrphanAfter <= 0 || r.PublicationWindow <= 0 || r.StatsInterval <= 0 || r.PollInterval <= 0 || r.ProgressEvery <= 0 || r.RescueStuckJobsAfter <= 0:
		return errors.New("--sweep-interval, --publication-window, --stats-interval, --poll-interval, --progress-every and --rescue-stuck-jobs-after must be positive")
	}
	return warehousecli.ExitError(r.Flags.Validate(true))
}

func (r *runCmd) Run(g *cli.Globals, e *cli.Env) error {
	if err := r.validate(); err != nil {
		var coded cli.ExitError
		if errors.As(err, &coded) {
			return err
		}
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	if g.DatabaseURL == "" {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: cli.ErrNoDatabaseURL}
	}
	if r.Name == "" {
		r.Name, _ = os.Hostname()
	}
	if r.SimulatePods > 1 {
		return r.runSimulatedPods(g, e)
	}
	return r.runOne(g, e)
}

// runSimulatedPods runs --simulate-pods workers in this process, each a
// copy of r with its own name and metrics port, until the signal context
// ends or one of them fails (which stops the others).
func (r *runCmd) runSimulatedPods(g *cli.Globals, e *cli.Env) error {
	host, port, err := net.SplitHostPort(r.MetricsAddr)
	base, perr := strconv.Atoi(port)
	if err != nil || perr != nil || base == 0 || base+r.SimulatePods > 65535 {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: fmt.Errorf("--simulate-pods needs --metrics-addr with a port (%q): pod i listens on that port + i", r.MetricsAddr)}
	}
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	errs := make([]error, r.SimulatePods)
	var wg sync.WaitGroup
	for i := range r.SimulatePods {
		pod := *r
		pod.SimulatePods = 0
		pod.Name = fmt.Sprintf("%s-%03d", r.Name, i)
		pod.MetricsAddr = net.JoinHostPort(host, strconv.Itoa(base+i))
		env := *e
		env.Ctx = ctx
		wg.Go(func() {
			if errs[i] = pod.runOne(g, &env); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runOne runs one worker until the signal context ends.
func (r *runCmd) runOne(g *cli.Globals, e *cli.Env) error {
	log := e.Logger.With("worker", r.Name)
	ctx := e.Ctx
	m := metrics.NewWorker()
	m.MaxTenants = r.MetricsMaxTenants

	sized := func(n int32, name string) func(*pgxpool.Config) {
		return func(c *pgxpool.Config) {
			// Every query that succeeds tells ingest_database_up the
			// operational database is reached.
			m.Database.Trace(c)
			c.MaxConns = n
			c.MinConns = 0
			// Connections idle for a while are closed, so an idle worker
			// holds few.
			c.MaxConnIdleTime = time.Minute
			if c.ConnConfig.RuntimeParams["application_name"] == "" {
				c.ConnConfig.RuntimeParams["application_name"] = "fleet-worker:" + name
			}
		}
	}
	conns := r.budget(g.DatabasePooler.RiverPollOnly())
	// River's LISTEN connection comes out of this pool and never goes
	// back; the pool then opens another, up to its size.
	pool, err := g.Connect(ctx, 10*time.Second, sized(conns.Shared, r.Name))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.RequireCurrent(ctx, pool); err != nil {
		return err
	}
	// The login holds what roles.sql grants fleet_worker, or the worker
	// does not start (exit 10, naming what is missing).
	if err := cli.RequireGrants(ctx, e, pool, grants.Worker); err != nil {
		return err
	}
	// Renewals get a connection of their own so the one renewal statement
	// per period never queues behind deliveries (see lease.Store.WithRenewals).
	renewPool, err := g.Connect(ctx, 10*time.Second, sized(conns.Renewals, r.Name))
	if err != nil {
		return err
	}
	defer renewPool.Close()
	wh, whName, closeWarehouse, err := r.Flags.Open(ctx, g.DatabaseURL, g.DatabasePooler, max(conns.Loads, 1), log)
	if err != nil {
		return warehousecli.ExitError(err)
	}
	defer closeWarehouse()
	advanceBatchIDs(ctx, wh, batch.NewStore(pool), log)

	m.AddPool(metrics.PoolShared, pool)
	m.AddPool(metrics.PoolRenewals, renewPool)
	if loads, ok := wh.(interface{ Pool() *pgxpool.Pool }); ok {
		m.AddPool(metrics.PoolLoads, loads.Pool())
	}
	notifyCfg, outbox, err := r.notifications(ctx, m, log)
	if err != nil {
		return err
	}
	deliveries := drain.New()
	worker, err := jobs.NewIngestWorker(jobs.WorkerConfig{
		Drain:                 deliveries,
		PauseBeforeCompletion: r.PauseBeforeComplete,
		Store:                 batch.NewStore(pool).WithOutbox(outbox),
		Leases:                lease.NewStore(pool).WithRenewals(renewPool),
		Pipelines: pipeline.Registry{
			batch.SourceTypeFleetS3: &fleet.Pipeline{
				Opener:    folder.Opener{Limits: folder.Limits{MaxRecordBytes: r.MaxRecordBytes, MaxColumns: r.MaxColumns, MaxRecordExpansion: r.MaxRecordExpansion}, S3PathStyle: r.S3PathStyle},
				Warehouse: wh, PublicationWindow: r.PublicationWindow, Logger: log, Metrics: m,
				ProgressEvery: r.ProgressEvery,
				Mapping:       r.mapping(), AllowLocalFolders: r.DevLocal,
				Marker: r.Marker, PauseBeforePublication: r.PauseBeforePublish,
			},
		},
		LeaseTTL:            r.LeaseTTL,
		RenewEvery:          r.LeaseRenewEvery,
		LeaseSafetyMargin:   r.LeaseSafetyMargin,
		MaxRunningPerTenant: r.MaxRunningPerTenant,
		FairnessDB:          pool,
		HolderPrefix:        r.Name,
		Clock:               offsetClock(r.ClockOffset),
		Metrics:             m,
		Logger:              log,
	})
	if err != nil {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	client, err := jobs.NewWorkerClient(pool, worker, jobs.ClientConfig{
		Concurrency: r.Concurrency, RescueStuckJobsAfter: r.RescueStuckJobsAfter,
		FetchPollInterval: r.PollInterval, PollOnly: g.DatabasePooler.RiverPollOnly(), ID: r.Name, Logger: log,
		Notify: notifyCfg,
	})
	if err != nil {
		return err
	}

	// The probe runs until the worker has stopped (its first outcome is
	// known before the first scrape), and outlives the drain.
	probeCtx, stopProbe := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProbe()
	m.Database.Start(probeCtx, pool, r.DatabaseProbeInterval, log)

	var ready atomic.Bool
	srv, err := httpserver.Listen(httpserver.Config{
		Addr: r.MetricsAddr, Handler: healthMux(m, &ready), MaxConns: r.MetricsMaxConns, Logger: log,
		RefuseBodies:   true, // none of its routes takes a body
		EvictableAfter: httpserver.EvictableAfterProbes,
	})
	if err != nil {
		return cli.CannotListen("metrics-addr", err)
	}
	go func() {
		if err := srv.Serve(); err != nil {
			log.Error("metrics listener failed", "error", err)
		}
	}()
	log.Info("metrics listener started", "addr", srv.Addr().String(), "max_conns", r.MetricsMaxConns)

	// River's lifetime is managed with Stop, not with the signal context.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("starting River: %w", err)
	}
	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	sweeper := &jobs.Sweeper{Pool: pool, River: client, Interval: r.SweepInterval, OrphanAfter: r.OrphanAfter, Pipelines: worker.Pipelines(), Metrics: m, Logger: log}
	go sweeper.Run(bg)
	go jobs.RunStats(bg, pool, m, r.StatsInterval, log, client.ID())
	if reg, ok := notifyCfg.Destinations.(*notify.Registry); ok && reg.Path() != "" {
		go reg.Watch(bg, r.NotificationsReload)
	}
	ready.Store(true)
	log.Info("worker started", "concurrency", r.Concurrency, "lease_ttl_seconds", r.LeaseTTL.Seconds(), "lease_renew_every_seconds", r.LeaseRenewEvery.Seconds(),
		"lease_safety_margin_seconds", cmp.Or(r.LeaseSafetyMargin, lease.DefaultSafetyMargin(r.LeaseTTL, r.LeaseRenewEvery)).Seconds(),
		"max_conns", conns.Total(), "warehouse_load_conns", conns.Loads, "database_pooler", string(g.DatabasePooler),
		"database_probe_interval_seconds", r.DatabaseProbeInterval.Seconds(), "stats_interval_seconds", r.StatsInterval.Seconds(),
		"database", cli.Redact(g.DatabaseURL), "warehouse", whName)

	<-ctx.Done()
	ready.Store(false)
	limit := max(r.DrainMax, r.ShutdownGrace)
	log.Info("shutting down: no new jobs; running batches may finish", "running", deliveries.Running(),
		"grace_seconds", r.ShutdownGrace.Seconds(), "drain_max_seconds", limit.Seconds())
	// River's Stop waits for every running delivery; the drain gives up,
	// meanwhile, those whose loads will not finish by the limit.
	stopCtx, cancelStop := context.WithTimeout(context.Background(), limit)
	go deliveries.Drain(stopCtx, drain.Policy{Grace: r.ShutdownGrace, Max: limit, Logger: log})
	err = client.Stop(stopCtx)
	cancelStop()
	if err != nil {
		log.Warn("drain limit reached: cancelling running batches; they stay resumable", "drain_max_seconds", limit.Seconds())
		cancelCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := client.StopAndCancel(cancelCtx); err != nil {
			log.Error("stopping River", "error", err)
		}
		cancel()
	}
	stopBackground()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	log.Info("worker stopped")
	return nil
}

// offsetClock returns the local clock, shifted by offset when it is not zero
// (a wall clock without Go's monotonic reading, as a skewed host would have).
func offsetClock(offset time.Duration) func() time.Time {
	if offset == 0 {
		return time.Now
	}
	return func() time.Time { return time.Now().Round(0).Add(offset) }
}

// healthMux serves /metrics, /healthz (the process is alive) and /readyz
// (the River client has started and the database is reached: the probe's
// cached answer, m.Database, so a probe never waits on an unreachable
// database nor adds a query of its own).
func healthMux(m *metrics.Metrics, ready *atomic.Bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready: River client not running", http.StatusServiceUnavailable)
			return
		}
		if err := m.Database.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// notifications builds what sends the outcome notifications: the
// destinations file (reloaded by the caller), the sender (webhooks, and SNS
// with the AWS SDK's default configuration: AWS_REGION, credentials,
// AWS_ENDPOINT_URL_SNS) and the outbox every terminal write inserts its
// notification job through.
func (r *runCmd) notifications(ctx context.Context, m *metrics.Metrics, log *slog.Logger) (*jobs.NotifyConfig, *jobs.Outbox, error) {
	bad := func(err error) (*jobs.NotifyConfig, *jobs.Outbox, error) {
		return nil, nil, cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	switch {
	case r.NotificationsReload <= 0:
		return bad(errors.New("--notifications-reload must be positive"))
	case r.NotifyConcurrency < 0:
		return bad(errors.New("--notify-concurrency must not be negative"))
	case r.NotifyMaxAttempts < 1:
		return bad(errors.New("--notify-max-attempts must be at least 1"))
	case r.NotifyRetryBase <= 0 || r.NotifyRetryMax < r.NotifyRetryBase:
		return bad(errors.New("--notify-retry-base must be positive and at most --notify-retry-max"))
	case r.NotifyTimeout <= 0:
		return bad(errors.New("--notify-timeout must be positive"))
	}
	reg, err := notify.NewRegistry(r.NotificationsFile, log, m.NotificationConfigReloadFailures)
	if err != nil {
		return bad(fmt.Errorf("--notifications-file: %w", err))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the AWS configuration for SNS notifications: %w", err)
	}
	outbox, err := jobs.NewInsertOnlyOutbox(log)
	if err != nil {
		return nil, nil, err
	}
	outbox = outbox.For(reg)
	return &jobs.NotifyConfig{
		Destinations: reg,
		Sender:       &notify.Sender{HTTP: &http.Client{Timeout: r.NotifyTimeout}, SNS: sns.NewFromConfig(awsCfg), Metrics: m},
		Concurrency:  r.NotifyConcurrency, MaxAttempts: r.NotifyMaxAttempts,
		RetryBase: r.NotifyRetryBase, RetryMax: r.NotifyRetryMax, Timeout: r.NotifyTimeout,
		Metrics: m, Logger: log,
	}, outbox, nil
}

// advanceBatchIDs moves the batches' id sequence past every batch id the
// warehouse's stamps and publications name, so that after the operational
// database went back in time (a restore, a failover to a standby that was
// behind) no batch is handed an id the warehouse still names. It runs at
// start only where it is cheap: a PostgreSQL warehouse reads two index
// maxima. A Redshift warehouse is left to worker migrate (the runbook's
// step after a restore), which reads every table, and to the loads, which
// move the sequence past any forgotten batch's stamp they take over. A
// failure is logged, not fatal: the takeover rule keeps every folder
// loadable without it.
func advanceBatchIDs(ctx context.Context, wh warehouse.Warehouse, store *batch.Store, log *slog.Logger) {
	if _, ok := wh.(*warehouse.Postgres); !ok {
		return
	}
	bound := wh.(warehouse.IDBound)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	named, err := bound.MaxBatchID(ctx, false)
	if err != nil {
		log.Warn("could not read the largest batch id the warehouse names; the id sequence is left as it is", "error", err)
		return
	}
	last, err := store.AdvanceIDs(ctx, named)
	if err != nil {
		log.Warn("could not move the batch id sequence past the warehouse's largest batch id", "warehouse_max_batch_id", named, "error", err)
		return
	}
	log.Info("batch id sequence checked against the warehouse", "warehouse_max_batch_id", named, "sequence_last_value", last)
}
