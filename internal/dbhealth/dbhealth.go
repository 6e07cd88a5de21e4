// Package dbhealth tells whether a long-running process reached its
// operational database lately, and exports it to Prometheus, so that an
// outage of PostgreSQL shows as such instead of as a process that answers
// /metrics with the values it read last.
//
// A Monitor records round trips to the database that succeeded: its own
// probe (Run: SELECT 1 every interval, bounded by a timeout, on the
// process's pool, which works through PgBouncer in transaction mode too)
// and every query the process runs anyway on a pool it traces (Trace). Only
// the probe records failures. The database is up when the latest outcome
// is a success (a success after the moment the last failed probe was sent)
// and that success is recent (StaleAfterIntervals probe intervals at most);
// it is down otherwise, and before any success.
//
// It exports two gauges:
//
//   - ingest_database_up: 1 while the database is up, 0 otherwise;
//   - ingest_database_last_success_timestamp_seconds: the Unix time of the
//     last round trip that succeeded (absent before the first one). It stops
//     advancing while the database is unreachable.
//
// The readiness probes of the binaries ask Ready, a cached answer that never
// waits on the database.
package dbhealth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// ProbeIntervalDefault is how often Run probes the database by default
// (--database-probe-interval).
const ProbeIntervalDefault = 10 * time.Second

// ProbeTimeoutMax bounds one probe: a probe waits at most this long, or its
// interval if shorter, for the database to answer.
const ProbeTimeoutMax = 5 * time.Second

// StaleAfterIntervals is how many probe intervals a success counts for:
// beyond them without another the database is down, whatever failed or not.
const StaleAfterIntervals = 3

// Monitor records whether this process reaches its database. The zero value
// is not usable; call New. Its methods are safe for concurrent use.
type Monitor struct {
	up, lastSuccess *prometheus.Desc

	// Unix nanoseconds: of the last round trip that succeeded, and of the
	// sending of the last probe that failed; 0 for none.
	succeeded, failed atomic.Int64
	// interval is the probe interval in nanoseconds (Run sets it).
	interval atomic.Int64

	now func() time.Time
}

// New returns a Monitor that has reached nothing yet, probing every
// ProbeIntervalDefault until Run says otherwise.
func New() *Monitor {
	m := &Monitor{
		up: prometheus.NewDesc("ingest_database_up",
			"1 while this process reaches its operational database (PostgreSQL, or the pooler in front of it): its last round trip, "+
				"a probe (SELECT 1 every --database-probe-interval) or any query, succeeded, and recently; 0 otherwise.", nil, nil),
		lastSuccess: prometheus.NewDesc("ingest_database_last_success_timestamp_seconds",
			"Unix time of this process's last round trip to its operational database that succeeded (a probe or any query); "+
				"it stops advancing while the database is unreachable. Absent before the first.", nil, nil),
		now: time.Now,
	}
	m.interval.Store(int64(ProbeIntervalDefault))
	return m
}

// Reached records a round trip to the database that succeeded at at.
func (m *Monitor) Reached(at time.Time) { storeLater(&m.succeeded, at.UnixNano()) }

// Unreached records a probe sent at sent that did not come back: the
// database is down unless something succeeds after sent.
func (m *Monitor) Unreached(sent time.Time) { storeLater(&m.failed, sent.UnixNano()) }

// storeLater stores v in a unless a holds a later time already.
func storeLater(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// staleAfter is how long a success counts for.
func (m *Monitor) staleAfter() time.Duration {
	return StaleAfterIntervals * time.Duration(m.interval.Load())
}

// LastSuccess returns the time of the last round trip that succeeded, and
// false before the first.
func (m *Monitor) LastSuccess() (time.Time, bool) {
	s := m.succeeded.Load()
	if s == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, s), true
}

// Up reports whether the database is up: the latest outcome is a success,
// at most StaleAfterIntervals probe intervals old.
func (m *Monitor) Up() bool {
	s, f := m.succeeded.Load(), m.failed.Load()
	return s != 0 && s > f && m.now().Sub(time.Unix(0, s)) <= m.staleAfter()
}

// ErrUnreachable is what Ready wraps while the database is down.
var ErrUnreachable = errors.New("database unreachable")

// Ready returns nil while the database is up, else an error wrapping
// ErrUnreachable that says when it was last reached. It never waits on
// the database: it reads what the probe and the traced queries recorded.
func (m *Monitor) Ready() error {
	if m.Up() {
		return nil
	}
	last, ok := m.LastSuccess()
	if !ok {
		return fmt.Errorf("%w: not reached since this process started", ErrUnreachable)
	}
	return fmt.Errorf("%w: last reached %ds ago", ErrUnreachable, int64(m.now().Sub(last).Seconds()))
}

// Describe sends the descriptors of the two gauges.
func (m *Monitor) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.up
	ch <- m.lastSuccess
}

// Collect sends ingest_database_up and, once there was a success,
// ingest_database_last_success_timestamp_seconds.
func (m *Monitor) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if m.Up() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(m.up, prometheus.GaugeValue, up)
	if last, ok := m.LastSuccess(); ok {
		ch <- prometheus.MustNewConstMetric(m.lastSuccess, prometheus.GaugeValue, float64(last.UnixMilli())/1000)
	}
}

// Trace makes every query of a pool opened with cfg that succeeds record a
// success (beside any query tracer cfg already has), so a busy process
// knows it reaches its database between probes, and notices its return
// as soon as any query succeeds. It costs an atomic store per query.
func (m *Monitor) Trace(cfg *pgxpool.Config) {
	t := tracer{m}
	if cfg.ConnConfig.Tracer == nil {
		cfg.ConnConfig.Tracer = t
		return
	}
	cfg.ConnConfig.Tracer = multitracer.New(cfg.ConnConfig.Tracer, t)
}

// tracer is the pgx.QueryTracer of Trace.
type tracer struct{ m *Monitor }

func (t tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t tracer) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil {
		t.m.Reached(t.m.now())
	}
}

// Querier is what a probe goes through: a pool (pgxpool.Pool) or a
// connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Probe sends SELECT 1 through db and waits at most timeout for its answer,
// recording the outcome; it returns the error of a probe that failed.
func (m *Monitor) Probe(ctx context.Context, db Querier, timeout time.Duration) error {
	sent := m.now()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var one int
	err := db.QueryRow(pctx, `SELECT 1`).Scan(&one)
	if err != nil {
		if ctx.Err() == nil {
			m.Unreached(sent)
		}
		return err
	}
	m.Reached(m.now())
	return nil
}

// Run probes db every interval (ProbeIntervalDefault if not positive),
// each probe within ProbeTimeoutMax (or the interval, if shorter), until
// ctx ends. It logs once when the database becomes unreachable (warn, with
// the probe's error and how long ago it was last reached) and once when it
// is reached again (info, unreachable_seconds: from the last success before
// to the first after, as the probe sees them). The first probe is sent at
// once; Start waits for it.
func (m *Monitor) Run(ctx context.Context, db Querier, interval time.Duration, logger *slog.Logger) {
	m.run(ctx, db, interval, logger, nil)
}

// Start sends the first probe, waits for its outcome (at most the probe's
// timeout) and then goes on probing in the background as Run does, so a
// process reports the truth from its first scrape.
func (m *Monitor) Start(ctx context.Context, db Querier, interval time.Duration, logger *slog.Logger) {
	first := make(chan struct{})
	go m.run(ctx, db, interval, logger, first)
	select {
	case <-first:
	case <-ctx.Done():
	}
}

func (m *Monitor) run(ctx context.Context, db Querier, interval time.Duration, logger *slog.Logger, first chan<- struct{}) {
	if interval <= 0 {
		interval = ProbeIntervalDefault
	}
	m.interval.Store(int64(interval))
	timeout := min(interval, ProbeTimeoutMax)
	wasUp := true // a process starts after reaching its database
	var downSince time.Time
	probe := func() {
		err := m.Probe(ctx, db, timeout)
		if ctx.Err() != nil {
			return
		}
		up := m.Up()
		switch {
		case wasUp && !up:
			downSince = m.now()
			attrs := []any{"error", errString(err), "probe_timeout_seconds", timeout.Seconds()}
			if last, ok := m.LastSuccess(); ok {
				downSince = last
				attrs = append(attrs, "last_success_seconds_ago", m.now().Sub(last).Seconds())
			}
			logger.Warn("database unreachable: ingest_database_up is 0 until it answers again", attrs...)
		case !wasUp && up:
			// From the last success before the outage to the first after.
			logger.Info("database reachable again", "unreachable_seconds", m.now().Sub(downSince).Seconds())
		case !up:
			logger.Debug("database still unreachable", "error", errString(err))
		}
		wasUp = up
	}
	probe()
	if first != nil {
		close(first)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			probe()
		}
	}
}

// errString is err's text, or "" when the probe succeeded but the success
// was too old to count (a probe that came back after its interval).
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
