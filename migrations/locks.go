package migrations

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of Config.
const (
	// LockTimeoutDefault is the default Config.LockTimeout: well under the
	// workers' lease renewal period (10 s), so a renewal queued behind a
	// migration that waits for a lock is late by at most this much.
	LockTimeoutDefault = 5 * time.Second
	// LockAttemptsDefault is the default Config.LockAttempts.
	LockAttemptsDefault = 10
	// LockBackoffDefault is the default Config.LockBackoff.
	LockBackoffDefault = time.Second
	// LockBackoffMax caps the wait between attempts.
	LockBackoffMax = 30 * time.Second
)

// Config says how Apply and ApplyWarehouse run the migrations.
//
// Every migration statement runs with PostgreSQL's lock_timeout set to
// LockTimeout. A statement such as ALTER TABLE ingestion_batches needs an
// ACCESS EXCLUSIVE lock; while it waits for one (behind any open
// transaction that read the table, a dashboard query or an idle psql), every
// later statement on the table queues behind it, the workers' lease
// renewals included. With the timeout the migration gives way instead: its
// transaction rolls back, the queue drains, the sessions it waited for are
// logged, and the run is tried again after a backoff, up to LockAttempts
// times. Migrations already applied stay applied (each runs in its own
// transaction), so a later attempt continues where the last stopped.
type Config struct {
	// LockTimeout bounds how long one statement waits for a lock. Defaults
	// to LockTimeoutDefault.
	LockTimeout time.Duration
	// LockAttempts bounds the attempts of a run that gives way to locks.
	// Defaults to LockAttemptsDefault.
	LockAttempts int
	// LockBackoff is the wait after the first attempt that gave way; it
	// doubles after each, up to LockBackoffMax. Defaults to
	// LockBackoffDefault.
	LockBackoff time.Duration
	// Logger receives a warning each time a migration gives way, naming
	// the sessions it waited for. Defaults to discarding.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.LockTimeout <= 0 {
		c.LockTimeout = LockTimeoutDefault
	}
	if c.LockAttempts <= 0 {
		c.LockAttempts = LockAttemptsDefault
	}
	if c.LockBackoff <= 0 {
		c.LockBackoff = LockBackoffDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Blocker is a session a migration waited for: what pg_stat_activity says of
// it, never its query text (it may hold values).
type Blocker struct {
	PID             int32
	ApplicationName string
	User            string
	// State is idle, active, idle in transaction, …; empty when the
	// migrating role may not see other roles' sessions (pg_read_all_stats).
	State      string
	XactStart  *time.Time
	QueryStart *time.Time
	// Relation and Mode are the lock the migration waited for.
	Relation string
	Mode     string
}

func (b Blocker) String() string {
	s := fmt.Sprintf("pid %d (application_name %q, user %q, state %q", b.PID, b.ApplicationName, b.User, b.State)
	if b.XactStart != nil {
		s += ", transaction started " + b.XactStart.UTC().Format(time.RFC3339)
	}
	if b.QueryStart != nil {
		s += ", last query started " + b.QueryStart.UTC().Format(time.RFC3339)
	}
	s += ")"
	if b.Relation != "" {
		s += fmt.Sprintf(" holding %s against the migration's %s", b.Relation, b.Mode)
	}
	return s
}

func (b Blocker) attrs() []any {
	return []any{"blocker_pid", b.PID, "blocker_application_name", b.ApplicationName, "blocker_user", b.User,
		"blocker_state", b.State, "blocker_xact_start", b.XactStart, "blocker_query_start", b.QueryStart,
		"relation", b.Relation, "lock_mode", b.Mode}
}

// LockTimeoutError is Apply's error when a migration gave way to locks held
// by other sessions on every attempt. cmd/worker exits with
// cli.ExitLockTimeout for it.
type LockTimeoutError struct {
	Attempts    int
	LockTimeout time.Duration
	// Blockers are the sessions the last attempt waited for, when seen.
	Blockers []Blocker
	Err      error
}

func (e *LockTimeoutError) Error() string {
	var who string
	switch len(e.Blockers) {
	case 0:
		who = "sessions that ended before they could be named"
	default:
		names := make([]string, len(e.Blockers))
		for i, b := range e.Blockers {
			names[i] = b.String()
		}
		who = strings.Join(names, "; ")
	}
	return fmt.Sprintf("migration gave way %d times (lock_timeout %s) to locks held by %s: end that session or let it finish, then run worker migrate again: %v",
		e.Attempts, e.LockTimeout, who, e.Err)
}

func (e *LockTimeoutError) Unwrap() error { return e.Err }

// isLockTimeout reports whether err is PostgreSQL's lock_not_available
// (55P03), which lock_timeout raises.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// migrationPool opens a pool like pool whose sessions run with lock_timeout
// and an application_name of their own (fleet-migrate:{random}), by which
// the watcher finds them in pg_stat_activity.
func migrationPool(ctx context.Context, pool *pgxpool.Pool, lockTimeout time.Duration) (*pgxpool.Pool, string, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	tag := "fleet-migrate:" + hex.EncodeToString(b[:])
	cfg := pool.Config()
	cfg.MaxConns = 4
	cfg.MinConns = 0
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		_, err := c.Exec(ctx, `SELECT set_config('lock_timeout', $1, false), set_config('application_name', $2, false)`,
			fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1)), tag)
		return err
	}
	mp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("connecting for migrations: %w", err)
	}
	return mp, tag, nil
}

// blockersSQL names the sessions that a session of the migration (by its
// application_name) waits for, and the lock it waits for.
const blockersSQL = `
	SELECT b.pid, COALESCE(b.application_name, ''), COALESCE(b.usename::text, ''), COALESCE(b.state, ''),
	       b.xact_start, b.query_start,
	       COALESCE(l.relation::regclass::text, l.locktype, ''), COALESCE(l.mode, '')
	FROM pg_stat_activity w
	CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS bp(pid)
	JOIN pg_stat_activity b ON b.pid = bp.pid
	LEFT JOIN LATERAL (
		SELECT relation, locktype, mode FROM pg_locks WHERE pid = w.pid AND NOT granted LIMIT 1) l ON true
	WHERE w.application_name = $1 AND w.wait_event_type = 'Lock'
	ORDER BY b.xact_start NULLS LAST, b.pid`

// watcher polls for the sessions the migration waits for while an attempt
// runs, so that when the attempt gives way it can say whom to (once the
// statement is cancelled there is nothing left to ask).
type watcher struct {
	mu   sync.Mutex
	last []Blocker
}

func (w *watcher) seen() []Blocker {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// watch polls every until ctx ends.
func (w *watcher) watch(ctx context.Context, pool *pgxpool.Pool, tag string, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		bs, err := queryBlockers(ctx, pool, tag)
		if err != nil || len(bs) == 0 {
			continue
		}
		w.mu.Lock()
		w.last = bs
		w.mu.Unlock()
	}
}

func queryBlockers(ctx context.Context, pool *pgxpool.Pool, tag string) ([]Blocker, error) {
	rows, err := pool.Query(ctx, blockersSQL, tag)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Blocker
	for rows.Next() {
		var b Blocker
		if err := rows.Scan(&b.PID, &b.ApplicationName, &b.User, &b.State, &b.XactStart, &b.QueryStart, &b.Relation, &b.Mode); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// withLockRetries runs attempt, on a pool whose sessions have lock_timeout,
// until it does not give way to a lock or the attempts are spent; see
// Config. what names the migrations for logs.
func (c Config) withLockRetries(ctx context.Context, pool *pgxpool.Pool, what string, attempt func(ctx context.Context, mp *pgxpool.Pool) error) error {
	c = c.withDefaults()
	mp, tag, err := migrationPool(ctx, pool, c.LockTimeout)
	if err != nil {
		return err
	}
	defer mp.Close()
	backoff := c.LockBackoff
	var earlier []Blocker // the blockers an earlier attempt named
	for n := 1; ; n++ {
		w := &watcher{}
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.watch(wctx, pool, tag, min(max(c.LockTimeout/4, 10*time.Millisecond), 250*time.Millisecond))
		}()
		err := attempt(ctx, mp)
		stop()
		<-done
		if !isLockTimeout(err) {
			return err
		}
		blockers := w.seen()
		if len(blockers) == 0 {
			// The statement was cancelled between two polls: ask once
			// more, in case the blocker is still there.
			blockers, _ = queryBlockers(ctx, pool, tag)
		}
		if len(blockers) == 0 {
			// On a busy machine the wait can end between polls; a session
			// an earlier attempt named that is still there is the likely
			// blocker, and still worth naming.
			blockers = stillThere(ctx, pool, earlier)
		}
		if len(blockers) > 0 {
			earlier = blockers
		}
		if n >= c.LockAttempts {
			return &LockTimeoutError{Attempts: n, LockTimeout: c.LockTimeout, Blockers: blockers, Err: err}
		}
		attrs := []any{"migrations", what, "attempt", n, "attempts", c.LockAttempts, "lock_timeout_seconds", c.LockTimeout.Seconds(),
			"retry_in_seconds", backoff.Seconds(), "blockers", len(blockers)}
		if len(blockers) > 0 {
			attrs = append(attrs, blockers[0].attrs()...)
		}
		c.Logger.Warn("migration gave way to a lock held by another session; retrying", attrs...)
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting to retry migrations after a lock timeout: %w", ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, LockBackoffMax)
	}
}

// stillThere returns those of bs whose sessions still exist.
func stillThere(ctx context.Context, pool *pgxpool.Pool, bs []Blocker) []Blocker {
	var out []Blocker
	for _, b := range bs {
		var alive bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, b.PID).Scan(&alive); err == nil && alive {
			out = append(out, b)
		}
	}
	return out
}
