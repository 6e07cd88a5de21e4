// Package metrics defines the Prometheus metrics of the ingestion
// coordinator. Each binary owns a Registry (no global registration), so tests
// can scrape exactly what one process exported. Each binary registers only
// the families it moves: NewWorker the worker's (not the doors'), NewServe
// enqueue serve's, NewSQS enqueue sqs's, NewReconcile enqueue reconcile's,
// so none exports another's families frozen at zero; New registers every
// family (the one-shot commands, which serve no /metrics, and tests). A new
// family is created in build (and so registered by NewWorker unless it is
// listed among the doors'). Every field is set either way: a metric that is
// not registered can be updated and is simply not exported. AddPool exports
// a connection pool's statistics.
//
// Every labelled series is initialised for all its known label values when
// the metrics are created, so dashboards and alerts see zeros, not gaps.
//
// The gauges the worker reads from the database are the exception: they
// are exported only while their last refresh succeeded and is recent
// (DatabaseStats, TenantStats: see DatabaseGauges), so a database outage
// shows as their absence, never as their last values frozen. Every binary
// that serves /metrics exports whether it reached its database lately
// (Database: ingest_database_up and
// ingest_database_last_success_timestamp_seconds, package dbhealth).
//
// Tenant labels are bounded per process: a family labelled by tenant
// exports at most MaxTenants tenant values of its own (100 by default,
// worker run --metrics-max-tenants) and sums the other tenants under
// tenant="_other" (TenantOther), however many tenants the database holds.
// The only such family is the worker's gauge ingest_tenant_batches
// (SetTenantBatches); it keeps the tenants with the most Running batches.
// Only one worker of a fleet exports it, River's leader (jobs.RunStats);
// the others export none of its series. Its collector is unexported, so no
// caller can add a series around the bound.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fleet/ingest/internal/buildinfo"
	"github.com/fleet/ingest/internal/dbhealth"
)

// Label values, initialised at start.
var (
	ReservationOutcomes = []string{"reserved", "conflict", "enqueue_failed", "resumable"}
	// ResumeOutcomes are how the resumed batches a worker finished ended.
	ResumeOutcomes      = []string{"succeeded", "failed"}
	AcquireOutcomes     = []string{"acquired", "taken_over", "contended", "terminal", "not_found"}
	RenewalOutcomes     = []string{"renewed", "lost", "error", "busy", "revoked"}
	DeliveryOutcomes    = []string{"worked", "skipped_terminal", "snoozed_contended", "snoozed_tenant_cap", "failed", "retry", "lease_lost", "cancelled", "parked", "interrupted", "left_to_newer_release"}
	BatchOutcomes       = []string{"succeeded", "failed"}
	FailedPhases        = []string{"failed_pre_commit", "failed_publication", "superseded", "publication_expired"}
	FailureReasons      = []string{"none", "folder_incomplete", "bad_records"}
	Phases              = []string{"load", "publish"}
	JobStates           = []string{"available", "scheduled", "retryable", "running", "pending"}
	SourceTypes         = []string{"FleetS3"}
	SweepOutcomes       = []string{"redelivered", "skipped_live_delivery", "unparked"}
	HTTPRequestOutcomes = []string{"enqueued", "conflict", "invalid", "unauthorized", "unavailable", "enqueue_failed", "ignored", "unmapped", "already_succeeded", "error", "client_closed", "late_object", "forbidden"}
	// BatchRequestOutcomes are the outcomes of GET /v1/batches/{id}.
	BatchRequestOutcomes = []string{"found", "not_found", "invalid", "unauthorized", "rate_limited", "unavailable", "client_closed"}
	// CancelRequestOutcomes are the outcomes of POST /v1/batches/{id}/cancel.
	CancelRequestOutcomes = []string{"cancelled", "not_cancellable", "not_found", "invalid", "unauthorized", "forbidden", "not_served", "unavailable", "client_closed"}
)

// The door's routes: their ServeMux patterns, the one vocabulary of the
// route label of ingest_http_requests_total,
// ingest_http_request_duration_seconds and
// ingest_http_request_outcomes_total (and of the access log).
const (
	RouteImports  = "POST /v1/imports"
	RouteEventsS3 = "POST /v1/events/s3"
	RouteBatch    = "GET /v1/batches/{id}"
	RouteBatches  = "GET /v1/batches"
	RouteCancel   = "POST /v1/batches/{id}/cancel"
)

// DoorRoutes are enqueue serve's routes (ServeMux patterns) whose request
// series are initialised: their duration, their success code and the 5xx
// codes the door-errors alert watches.
var DoorRoutes = map[string]string{RouteImports: "202", RouteEventsS3: "200", RouteBatch: "200", RouteBatches: "200", RouteCancel: "200"}

// SNSConfirmationOutcomes label ingest_sns_subscription_confirmations_total.
var SNSConfirmationOutcomes = []string{"confirmed", "unconfirmed", "failed", "invalid", "topic_not_accepted"}

// SQSDeletedOutcomes label ingest_sqs_messages_deleted_total: why a message
// was acknowledged (imported: every folder it completes has a batch;
// ignored: it completes no folder; test_event: the s3:TestEvent).
var SQSDeletedOutcomes = []string{"imported", "ignored", "test_event", "late_object"}

// Doors that count late-object and ignored events (the door label of
// ingest_late_object_events_total and ingest_events_ignored_total).
const (
	DoorEvents = "events_s3"
	DoorSQS    = "sqs"
)

// EventIgnoredReasons label ingest_events_ignored_total: why an object
// event of a door completed no folder (s3events.IgnoredReasons; the
// ignored_reason of the event route's answer). unknown_event and
// unknown_source are formats nobody expected.
var EventIgnoredReasons = []string{"data_object", "not_created", "unknown_event", "unknown_source"}

// SQSLeftReasons label ingest_sqs_messages_left_total: why a message was
// left in the queue. database_unavailable, enqueue_failed and
// delete_failed come back after the visibility timeout and may succeed;
// the others never will and end in the dead-letter queue.
var SQSLeftReasons = []string{"malformed", "unmapped", "bucket_not_allowed", "invalid_input", "sns_control", "database_unavailable", "enqueue_failed", "delete_failed"}

// ReconcileOutcomes label ingest_reconcile_folders_total: what reconcile
// found for each completed folder.
var ReconcileOutcomes = []string{"enqueued", "running", "already_succeeded", "resumable", "failed", "conflict", "unmapped", "invalid_input", "enqueue_failed", "would_enqueue", "reimported", "would_reimport", "superseded"}

// ReconcileChangeReasons label ingest_reconcile_changed_total: how a
// published folder differs from its newest batch's load.
var ReconcileChangeReasons = []string{"added", "removed", "changed", "marker_rewritten"}

// Metrics are the coordinator's Prometheus metrics.
type Metrics struct {
	Registry *prometheus.Registry

	Reservations        *prometheus.CounterVec
	Resumes             *prometheus.CounterVec
	LeaseAcquisitions   *prometheus.CounterVec
	LeaseRenewals       *prometheus.CounterVec
	LeasesHeld          prometheus.Gauge
	Deliveries          *prometheus.CounterVec
	StaleWritesRejected prometheus.Counter
	BatchDuration       *prometheus.HistogramVec
	PhaseDuration       *prometheus.HistogramVec
	TakeoverDelay       prometheus.Histogram
	SweepRedeliveries   *prometheus.CounterVec
	RunningBatches      prometheus.Gauge
	StuckBatches        prometheus.Gauge
	ParkedBatches       prometheus.Gauge
	Sweeps              prometheus.Counter
	RecordsLoaded       prometheus.Counter
	BuildInfo           *prometheus.GaugeVec
	OldestRunningAge    prometheus.Gauge
	QueueDepth          *prometheus.GaugeVec
	DatabaseStatsErrors prometheus.Counter
	// DatabaseStats exports the fleet-wide gauges the worker's stats query
	// refreshes (running, stuck and parked batches, the oldest one's age,
	// the queue's jobs by state, ingest_queue_paused) only while fresh;
	// TenantStats the leader's ingest_tenant_batches and
	// ingest_river_leader, refreshed by a query of their own. See
	// DatabaseGauges.
	DatabaseStats *DatabaseGauges
	TenantStats   *DatabaseGauges
	// Database is whether this process reached its operational database
	// lately (ingest_database_up,
	// ingest_database_last_success_timestamp_seconds), exported by every
	// binary that serves /metrics; the command runs its probe.
	Database *dbhealth.Monitor

	HTTPRequests     *prometheus.CounterVec
	SNSConfirmations *prometheus.CounterVec
	// TenantTokenReloadFailures counts reloads of enqueue serve's tenant
	// tokens file that could not read it (no tenant token is accepted) or
	// refused a line (its token is not accepted).
	TenantTokenReloadFailures prometheus.Counter
	// TenantTokensRefusedLines and SecretFileReloadFailures: the
	// credential files' (credentials.go).
	TenantTokensRefusedLines prometheus.Gauge
	SecretFileReloadFailures *prometheus.CounterVec
	// QueueWait is how long jobs waited in the queue: from the job's
	// insertion to its first attempt (observed by the worker).
	QueueWait prometheus.Histogram

	// The door (enqueue serve), measured by httpserver.Observe: every
	// request by its route (the ServeMux pattern) and status code, and
	// its duration by route.
	DoorRequests *prometheus.CounterVec
	DoorDuration *prometheus.HistogramVec

	// SupersededJobs counts River jobs the sweeper finalized because their
	// delivery's lease was taken over.
	SupersededJobs prometheus.Counter

	// BatchFailures counts batches this worker ended Failed, by phase and
	// reason (ingest_batch_failures_total; reason "none" when the pipeline
	// named none). LateObjects counts objects loaded although modified
	// after their folder's completion marker.
	BatchFailures *prometheus.CounterVec
	LateObjects   prometheus.Counter
	// ForgottenStamps counts warehouse stamps of batches the operational
	// database does not know (forgotten by a restore or a failover behind
	// the warehouse) that a load of this worker took over.
	ForgottenStamps prometheus.Counter
	// LateObjectEvents counts, by door, the folders already published
	// that a request's (or message's) data-object events named: once per
	// folder and request, not per object.
	LateObjectEvents *prometheus.CounterVec
	// EventsIgnored counts, by door and reason (EventIgnoredReasons), the
	// object events that completed no folder.
	EventsIgnored *prometheus.CounterVec

	// Fairness between tenants (worker run --max-running-per-tenant).
	TenantCapDeferrals prometheus.Counter
	// RiverLeader is 1 while this worker is River's leader: the one
	// process that exports ingest_tenant_batches (jobs.RunStats).
	RiverLeader prometheus.Gauge
	// tenantBatches is ingest_tenant_batches, set only through
	// SetTenantBatches, which bounds its tenants.
	tenantBatches *tenantBatches
	// MaxTenants bounds the tenant label values of each tenant-labelled
	// family: beyond it tenants are summed under TenantOther (0: every
	// tenant is). Set it before the first update. Defaults to
	// MaxTenantsDefault.
	MaxTenants int

	// The SQS consumer (enqueue sqs).
	SQSMessagesReceived prometheus.Counter
	SQSReceiveErrors    prometheus.Counter
	SQSMessagesDeleted  *prometheus.CounterVec
	SQSMessagesLeft     *prometheus.CounterVec
	SQSReceiveDuration  prometheus.Histogram
	SQSOldestMessageAge prometheus.Gauge
	SQSReceiveCount     prometheus.Histogram

	// The reconciler (enqueue reconcile).
	ReconcileFolders       *prometheus.CounterVec
	ReconcileMissed        prometheus.Counter
	ReconcileObjectsListed prometheus.Counter
	ReconcileKeysSkipped   prometheus.Counter
	ReconcileScanDuration  prometheus.Histogram
	ReconcileScans         *prometheus.CounterVec
	// ReconcileCheckpointsIgnored counts checkpoints a period ignored
	// because they were dated after the database clock.
	ReconcileCheckpointsIgnored prometheus.Counter
	// ReconcileCheckpointsForeign counts checkpoints a period ignored
	// because someone other than reconcile moved them last (migration
	// 00115); ReconcileSkippedConsecutive is how many periods in a row
	// this replica skipped (0 after a scan).
	ReconcileCheckpointsForeign prometheus.Counter
	ReconcileSkippedConsecutive prometheus.Gauge
	// ReconcileChanged counts published folders found changed since their
	// newest batch's load, by reason; ReconcileUnsummarized those not
	// compared because that batch records no summary (an older build).
	ReconcileChanged      *prometheus.CounterVec
	ReconcileUnsummarized prometheus.Counter

	// Tenant notifications (internal/notify), by destination kind
	// (webhook, sns; NotificationKinds), never by tenant: attempts that
	// delivered, attempts that failed, notifications given up after their
	// last attempt failed (counted by the job that sends them), and
	// reloads of the destinations file that failed (the destinations last
	// read stay in force).
	NotificationsSent                *prometheus.CounterVec
	NotificationsFailed              *prometheus.CounterVec
	NotificationsGivenUp             *prometheus.CounterVec
	NotificationConfigReloadFailures prometheus.Counter

	// RiverUIRequests counts the River UI's requests on enqueue serve's
	// admin listener by code, apart from the door's (riverui.go);
	// QueuePaused is 1 for each River queue of the workers that is paused.
	RiverUIRequests *prometheus.CounterVec
	QueuePaused     *prometheus.GaugeVec

	sqs, reconcile []prometheus.Collector // the collectors of NewSQS and NewReconcile

	// The process's connection pools (AddPool), registered with the first.
	poolsOnce sync.Once
	pools     *poolCollector
}

// New creates every metric on a fresh registry, with the Go and process
// collectors, registers them all and initialises every known series: for
// the one-shot commands, which serve no /metrics, and for tests. A binary
// that serves /metrics uses its own constructor (NewWorker, NewServe,
// NewSQS, NewReconcile), which registers only the families it moves.
func New() *Metrics {
	m, all := build()
	m.register(all)
	return m
}

// NewWorker creates the metrics worker run exports: every family but the
// doors' (enqueue serve's requests, SNS confirmations, tenant token
// reloads, reservations and late-object events, the SQS consumer's and
// reconcile's), which a worker never moves and would export frozen at zero
// beside the real ones.
func NewWorker() *Metrics {
	m, all := build()
	notWorker := map[prometheus.Collector]bool{m.DoorRequests: true, m.DoorDuration: true, m.HTTPRequests: true,
		m.SNSConfirmations: true, m.TenantTokenReloadFailures: true, m.Reservations: true, m.LateObjectEvents: true, m.EventsIgnored: true}
	for _, c := range append(m.sqs, m.reconcile...) {
		notWorker[c] = true
	}
	for _, c := range all {
		if !notWorker[c] {
			m.Registry.MustRegister(c)
		}
	}
	return m
}

// NewServe creates the metrics enqueue serve exports: its requests (by
// route and code, their duration, and by outcome), the reservations it
// makes, SNS confirmations, build info and the Go and process collectors.
// The worker's lease, delivery, sweep and database-derived metrics are
// created but not registered.
func NewServe() *Metrics {
	m, _ := build()
	for _, c := range []prometheus.Collector{m.BuildInfo, m.Database, m.Reservations, m.HTTPRequests, m.DoorRequests, m.DoorDuration, m.SNSConfirmations, m.LateObjectEvents, m.EventsIgnored, m.TenantTokenReloadFailures, m.RiverUIRequests,
		m.TenantTokensRefusedLines, m.SecretFileReloadFailures} {
		m.Registry.MustRegister(c)
	}
	m.LateObjectEvents.DeleteLabelValues(DoorSQS) // enqueue sqs's door
	m.EventsIgnored.DeletePartialMatch(prometheus.Labels{"door": DoorSQS})
	return m
}

// NewSQS creates the metrics enqueue sqs exports: the consumer's (messages
// received, deleted and left, receive durations and errors), the
// reservations it makes, build info and the Go and process collectors. The
// worker's lease, delivery, sweep and database-derived metrics are created
// but not registered: frozen at zero here, they would hide the workers'.
func NewSQS() *Metrics {
	m, _ := build()
	m.register(append([]prometheus.Collector{m.BuildInfo, m.Database, m.Reservations, m.LateObjectEvents, m.EventsIgnored}, m.sqs...))
	m.LateObjectEvents.DeleteLabelValues(DoorEvents) // enqueue serve's door
	m.EventsIgnored.DeletePartialMatch(prometheus.Labels{"door": DoorEvents})
	return m
}

// NewReconcile creates the metrics enqueue reconcile exports: the scans'
// (folders by outcome, missed uploads, objects listed, keys skipped, scan
// durations), the reservations it makes, build info and the Go and process
// collectors; not the worker's.
func NewReconcile() *Metrics {
	m, _ := build()
	m.register(append([]prometheus.Collector{m.BuildInfo, m.Database, m.Reservations}, m.reconcile...))
	return m
}

func (m *Metrics) register(cs []prometheus.Collector) {
	for _, c := range cs {
		m.Registry.MustRegister(c)
	}
}

// build creates every metric, initialises its known series, and returns
// them with a registry holding only the Go and process collectors.
func build() (*Metrics, []prometheus.Collector) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var all []prometheus.Collector
	f := func(c prometheus.Collector) { all = append(all, c) }
	m := &Metrics{Registry: reg, MaxTenants: MaxTenantsDefault}

	m.Reservations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_reservations_total", Help: "Batch reservations by source type and outcome (reserved, conflict, enqueue_failed, resumable: the folder's newest batch is a failed publication to resume, nothing reserved).",
	}, []string{"source_type", "outcome"})
	m.Resumes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_resumes_total", Help: "Batches an operator resumed (enqueue resume) that this worker finished, by outcome (succeeded: published; failed).",
	}, []string{"outcome"})
	m.LeaseAcquisitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_lease_acquisitions_total", Help: "Execution lease acquisition attempts by outcome (acquired, taken_over, contended, terminal, not_found).",
	}, []string{"outcome"})
	m.LeaseRenewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_lease_renewals_total", Help: "Execution lease heartbeat renewals by outcome (renewed, lost, error, busy: the batch row was locked by another transaction, so the term was neither renewed nor lost; revoked: an operator cancelled the batch).",
	}, []string{"outcome"})
	m.LeasesHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_leases_held", Help: "Execution leases this process holds now.",
	})
	m.Deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_deliveries_total", Help: "Job deliveries by outcome.",
	}, []string{"outcome"})
	m.StaleWritesRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_stale_writes_rejected_total", Help: "State writes rejected by the database because the writer no longer held the lease.",
	})
	m.BatchDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ingest_batch_duration_seconds", Help: "Time from a batch's reservation to its terminal state, by outcome.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2.5, 14),
	}, []string{"outcome"})
	m.PhaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ingest_phase_duration_seconds", Help: "Duration of pipeline phases (load, publish).",
		Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 14),
	}, []string{"phase"})
	m.TakeoverDelay = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ingest_takeover_delay_seconds", Help: "Time from an expired lease's expiry to its takeover, by the database clock.",
		Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300},
	})
	m.SweepRedeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_sweep_redeliveries_total", Help: "Jobs the sweeper inserted for Running batches with an expired lease or orphaned without one (redelivered), or parked by a build that could not work on them while this one can (unparked); skipped_live_delivery: left to a delivery taking the batch over.",
	}, []string{"outcome"})
	m.RunningBatches = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_running_batches", Help: "Scoped batches in status Running (from the database).",
	})
	m.StuckBatches = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_stuck_batches", Help: "Running batches whose execution lease has expired (from the database).",
	})
	m.ParkedBatches = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_parked_batches", Help: "Running batches parked because the build that met them could not work on them (from the database); a worker of a build that can (after a rollout) takes them back within --orphan-after, the rest wait for an operator.",
	})
	m.Sweeps = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_sweeps_total", Help: "Sweeps for expired or orphaned batches this process ran (while holding the sweep lock).",
	})
	m.RecordsLoaded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_records_loaded_total", Help: "Records streamed into warehouse loads by this process, counted as they are read (a load that later rolls back counts too).",
	})
	m.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ingest_build_info", Help: "Always 1; the labels name the build of this binary.",
	}, []string{"version", "revision", "goversion"})
	m.OldestRunningAge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_oldest_running_batch_age_seconds", Help: "Age of the oldest Running scoped batch (from the database).",
	})
	m.QueueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ingest_queue_jobs", Help: "River jobs of the ingest queue by state (from the database).",
	}, []string{"state"})
	m.DatabaseStatsErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_database_stats_errors_total", Help: "Failed refreshes of the database-derived gauges.",
	})
	m.HTTPRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_http_request_outcomes_total", Help: "Outcomes of the door's routes (one per folder of a notification) by route (the ServeMux pattern, as in ingest_http_requests_total) and outcome.",
	}, []string{"route", "outcome"})
	m.DoorRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_http_requests_total", Help: "HTTP requests answered by enqueue serve, by route (the ServeMux pattern; unmatched: none) and status code.",
	}, []string{"route", "code"})
	m.DoorDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ingest_http_request_duration_seconds", Help: "Time from a request's headers to the end of its answer, by route (the ServeMux pattern).",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"route"})
	m.QueueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ingest_queue_wait_seconds", Help: "Time ingest jobs waited in the queue, from the job's insertion to its first attempt (a sweeper redelivery is a new job).",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
	})

	m.TenantTokenReloadFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_tenant_tokens_reload_failures_total",
		Help: "Reloads of enqueue serve's tenant tokens file (--tenant-tokens-file) that could not read it (then no tenant token is accepted) or refused a line (its token is not accepted; ingest_tenant_tokens_refused_lines counts them).",
	})
	m.SNSConfirmations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_sns_subscription_confirmations_total",
		Help: "Amazon SNS subscription confirmations received by outcome (confirmed, unconfirmed: left to an operator, failed, invalid: bad signature, topic_not_accepted: not verified, its topic is not --sns-topic-arn).",
	}, []string{"outcome"})
	f(m.SNSConfirmations)
	m.newSQS(f)
	m.newReconcile(f)
	m.newFairness(f)
	m.newNotifications(f)
	m.newRiverUI()
	m.newCredentials()
	m.SupersededJobs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_superseded_jobs_finalized_total",
		Help: "River jobs left running by a delivery whose lease was taken over (a killed or paused worker), finalized as cancelled by the sweeper.",
	})
	f(m.SupersededJobs)
	m.BatchFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_batch_failures_total",
		Help: "Batches this worker ended Failed, by phase (failed_pre_commit, failed_publication, superseded, publication_expired) and reason (folder_incomplete: the folder held no completion marker and its import did not opt out; bad_records: more records that cannot be stored than the import tolerates; none).",
	}, []string{"phase", "reason"})
	f(m.BatchFailures)
	for _, p := range FailedPhases {
		for _, r := range FailureReasons {
			m.BatchFailures.WithLabelValues(p, r)
		}
	}
	m.LateObjects = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_late_objects_total",
		Help: "Objects loaded although last modified after their folder's completion marker (written after the producer said the folder was complete).",
	})
	f(m.LateObjects)
	m.ForgottenStamps = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_forgotten_stamps_total",
		Help: "Warehouse stamps of batches the operational database does not know (forgotten by a restore from a backup or a failover to a standby that was behind) that a new batch of the folder took over; each is logged with both batches' ids and uids and shown by enqueue status.",
	})
	f(m.ForgottenStamps)
	m.LateObjectEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_late_object_events_total",
		Help: "Published folders named by data-object events (an object created after its folder's newest batch Succeeded), by door (events_s3, sqs): once per folder and request or message; enqueue reconcile imports such folders again.",
	}, []string{"door"})
	f(m.LateObjectEvents)
	initLabels(m.LateObjectEvents, []string{DoorEvents, DoorSQS})
	m.EventsIgnored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_events_ignored_total",
		Help: "Object events that completed no folder, by door (events_s3, sqs) and reason: data_object (an object that is not the marker), not_created (a removal, access, tagging… event), unknown_event (an event name no S3-compatible store is known to send), unknown_source (an eventSource that is not <store>:s3). The last two are a format nobody expected.",
	}, []string{"door", "reason"})
	f(m.EventsIgnored)
	for _, door := range []string{DoorEvents, DoorSQS} {
		for _, r := range EventIgnoredReasons {
			m.EventsIgnored.WithLabelValues(door, r)
		}
	}

	// The gauges read from the database are registered through their
	// groups, which export them only while fresh.
	m.DatabaseStats = newDatabaseGauges(m.RunningBatches, m.StuckBatches, m.ParkedBatches, m.OldestRunningAge, m.QueueDepth, m.QueuePaused)
	m.TenantStats = newDatabaseGauges(m.tenantBatches, m.RiverLeader)
	m.Database = dbhealth.New()
	for _, c := range []prometheus.Collector{m.Reservations, m.Resumes, m.LeaseAcquisitions, m.LeaseRenewals, m.LeasesHeld,
		m.Deliveries, m.StaleWritesRejected, m.BatchDuration, m.PhaseDuration, m.TakeoverDelay, m.SweepRedeliveries,
		m.DatabaseStats, m.TenantStats, m.Database, m.Sweeps, m.RecordsLoaded, m.BuildInfo, m.DatabaseStatsErrors, m.HTTPRequests,
		m.QueueWait, m.DoorRequests, m.DoorDuration} {
		f(c)
	}
	bi := buildinfo.Get()
	m.BuildInfo.WithLabelValues(bi.Version, bi.Revision, bi.GoVersion).Set(1)
	for _, st := range SourceTypes {
		for _, o := range ReservationOutcomes {
			m.Reservations.WithLabelValues(st, o)
		}
	}
	initLabels(m.Resumes, ResumeOutcomes)
	initLabels(m.LeaseAcquisitions, AcquireOutcomes)
	initLabels(m.LeaseRenewals, RenewalOutcomes)
	initLabels(m.Deliveries, DeliveryOutcomes)
	initLabels(m.SweepRedeliveries, SweepOutcomes)
	initLabels(m.SNSConfirmations, SNSConfirmationOutcomes)
	for _, o := range BatchOutcomes {
		m.BatchDuration.WithLabelValues(o)
	}
	for _, p := range Phases {
		m.PhaseDuration.WithLabelValues(p)
	}
	for _, s := range JobStates {
		m.QueueDepth.WithLabelValues(s)
	}
	for _, route := range []string{RouteImports, RouteEventsS3} {
		for _, o := range HTTPRequestOutcomes {
			m.HTTPRequests.WithLabelValues(route, o)
		}
	}
	for _, o := range BatchRequestOutcomes {
		m.HTTPRequests.WithLabelValues(RouteBatch, o)
		m.HTTPRequests.WithLabelValues(RouteBatches, o)
	}
	for _, o := range CancelRequestOutcomes {
		m.HTTPRequests.WithLabelValues(RouteCancel, o)
	}
	for route, ok := range DoorRoutes {
		m.DoorDuration.WithLabelValues(route)
		for _, code := range []string{ok, "500", "503"} {
			m.DoorRequests.WithLabelValues(route, code)
		}
	}
	return m, all
}

func (m *Metrics) newSQS(f func(prometheus.Collector)) {
	m.SQSMessagesReceived = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_sqs_messages_received_total", Help: "SQS messages received by the consumer (a redelivery counts again).",
	})
	m.SQSReceiveErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_sqs_receive_errors_total", Help: "ReceiveMessage calls that failed (SQS unreachable, throttled, or access denied).",
	})
	m.SQSMessagesDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_sqs_messages_deleted_total", Help: "SQS messages deleted after their folders' burst committed, by outcome (imported, ignored, test_event).",
	}, []string{"outcome"})
	m.SQSMessagesLeft = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_sqs_messages_left_total", Help: "SQS messages left in the queue, by reason: database_unavailable, enqueue_failed and delete_failed come back after the visibility timeout; malformed, unmapped, bucket_not_allowed, invalid_input and sns_control never succeed and reach the dead-letter queue.",
	}, []string{"reason"})
	m.SQSReceiveDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ingest_sqs_receive_duration_seconds", Help: "Duration of ReceiveMessage calls (long polls: up to the wait time when the queue is empty).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30},
	})
	m.SQSOldestMessageAge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_sqs_oldest_message_age_seconds", Help: "Age (by its SentTimestamp) of the oldest message of this consumer's last receive; 0 after a receive that returned none.",
	})
	m.SQSReceiveCount = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ingest_sqs_message_receives", Help: "ApproximateReceiveCount of the messages received (how many times SQS delivered each): above 1 is a redelivery.",
		Buckets: []float64{1, 2, 3, 5, 10, 20},
	})
	m.sqs = []prometheus.Collector{m.SQSMessagesReceived, m.SQSReceiveErrors, m.SQSMessagesDeleted, m.SQSMessagesLeft, m.SQSReceiveDuration, m.SQSOldestMessageAge, m.SQSReceiveCount}
	for _, c := range m.sqs {
		f(c)
	}
	initLabels(m.SQSMessagesDeleted, SQSDeletedOutcomes)
	initLabels(m.SQSMessagesLeft, SQSLeftReasons)
}

func (m *Metrics) newReconcile(f func(prometheus.Collector)) {
	m.ReconcileFolders = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_reconcile_folders_total", Help: "Completed folders reconcile found, by outcome.",
	}, []string{"outcome"})
	m.ReconcileMissed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_reconcile_missed_total", Help: "Completed folders without a batch that reconcile enqueued: uploads whose notification was lost.",
	})
	m.ReconcileObjectsListed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_reconcile_objects_listed_total", Help: "Objects reconcile listed (ListObjectsV2).",
	})
	m.ReconcileKeysSkipped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_reconcile_keys_skipped_total", Help: "Listed object keys reconcile skipped because no door reads them (invalid UTF-8, a control character, an encoding that does not decode); each is logged escaped.",
	})
	m.ReconcileScanDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ingest_reconcile_scan_duration_seconds", Help: "Duration of reconcile scans.",
		Buckets: prometheus.ExponentialBuckets(0.1, 3, 10),
	})
	m.ReconcileScans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_reconcile_scans_total", Help: "Reconcile periods by outcome (scanned; skipped: another session holds the checkpoint row or a replica scanned this period; failed).",
	}, []string{"outcome"})
	m.ReconcileCheckpointsIgnored = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_reconcile_checkpoints_ignored_total", Help: "Reconcile checkpoints ignored because they were dated after the database clock (no pass writes one: a login wrote it, or the clock stepped back); the pass started over.",
	})
	m.ReconcileCheckpointsForeign = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_reconcile_checkpoints_foreign_total", Help: "Reconcile checkpoints ignored because someone other than reconcile moved them last (moved_by/moved_application, migration 00115: a login that could hide missed folders); the pass started over.",
	})
	m.ReconcileSkippedConsecutive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_reconcile_periods_skipped_consecutive", Help: "Reconcile periods this replica skipped in a row (the checkpoint row locked by another session, or a replica ran this period); 0 after a period that scanned. The minimum over an install's replicas stays at 0 while any of them works.",
	})
	m.ReconcileChanged = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_reconcile_changed_total", Help: "Published folders reconcile found changed since their newest batch's load, by reason (added, removed, changed: an object's ETag; marker_rewritten), each imported again: files that arrived or changed late.",
	}, []string{"reason"})
	m.ReconcileUnsummarized = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_reconcile_unsummarized_total", Help: "Published folders reconcile could not compare with their load because their batch records no summary of the objects it loaded (loaded by a build before the summary); not imported again.",
	})
	m.reconcile = []prometheus.Collector{m.ReconcileFolders, m.ReconcileMissed, m.ReconcileObjectsListed, m.ReconcileKeysSkipped, m.ReconcileScanDuration, m.ReconcileScans, m.ReconcileCheckpointsIgnored, m.ReconcileCheckpointsForeign, m.ReconcileSkippedConsecutive, m.ReconcileChanged, m.ReconcileUnsummarized}
	for _, c := range m.reconcile {
		f(c)
	}
	initLabels(m.ReconcileFolders, ReconcileOutcomes)
	initLabels(m.ReconcileChanged, ReconcileChangeReasons)
	initLabels(m.ReconcileScans, []string{"scanned", "skipped", "failed"})
}

// NotificationKinds label the notification counters: the kinds of
// destination (notify.Kinds).
var NotificationKinds = []string{"webhook", "sns"}

func (m *Metrics) newNotifications(f func(prometheus.Collector)) {
	m.NotificationsSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_notifications_sent_total", Help: "Batch outcome notifications delivered to a tenant's destination, by kind (webhook: a 2xx answer; sns: published).",
	}, []string{"kind"})
	m.NotificationsFailed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_notifications_failed_total", Help: "Attempts to send a batch outcome notification that failed, by kind (a non-2xx answer, a redirect or a transport error; an SNS error); the attempt is retried.",
	}, []string{"kind"})
	m.NotificationsGivenUp = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_notifications_given_up_total", Help: "Batch outcome notifications given up after their last attempt failed, by kind: the tenant was not told.",
	}, []string{"kind"})
	m.NotificationConfigReloadFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ingest_notifications_config_reload_failures_total",
		Help: "Reloads of the worker's notification destinations file (--notifications-file) that could not read or parse it; the destinations last read stay in force.",
	})
	for _, c := range []*prometheus.CounterVec{m.NotificationsSent, m.NotificationsFailed, m.NotificationsGivenUp} {
		f(c)
		initLabels(c, NotificationKinds)
	}
	f(m.NotificationConfigReloadFailures)
}

func initLabels(c *prometheus.CounterVec, values []string) {
	for _, v := range values {
		c.WithLabelValues(v)
	}
}

// ObserveSince records the seconds since start in h.
func ObserveSince(h prometheus.Observer, start time.Time) {
	h.Observe(time.Since(start).Seconds())
}
