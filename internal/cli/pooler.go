package cli

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pooler says what is between a binary and PostgreSQL (--database-pooler,
// DATABASE_POOLER).
//
// Behind a pooler in transaction mode (PgBouncer's pool_mode = transaction,
// RDS Proxy) consecutive transactions of one client connection may run on
// different server connections, and the pooler hands a server connection to
// another client as soon as a transaction ends. So nothing may outlive a
// transaction on the server:
//
//   - prepared statements: pgx's default (QueryExecModeCacheStatement)
//     prepares named statements once per connection and reuses them, which
//     fails through a pooler with `prepared statement "stmtcache_…" does not
//     exist` or `… already exists`. PoolerTransaction switches pgx to
//     QueryExecModeExec: each statement is sent with the unnamed statement,
//     parsed, bound and executed in one round trip, so it never depends on
//     an earlier message having reached the same server connection
//     (QueryExecModeDescribeExec would: its describe and its execution are
//     two round trips);
//   - LISTEN: a pooler forwards no notifications to a client that did not
//     LISTEN on the server connection it happens to hold, so River would
//     wait for wake-ups that never come. River runs poll-only (RiverPollOnly):
//     workers fetch every --poll-interval;
//   - session settings and session-level advisory locks: the binaries use
//     only SET LOCAL / set_config(…, true) and pg_advisory_xact_lock in
//     their work. worker migrate holds a session advisory lock and session
//     settings for its whole run, so it refuses PoolerTransaction
//     (RequireDirect): run it on a direct connection.
type Pooler string

// Poolers.
const (
	// PoolerNone is a direct connection to PostgreSQL (or a pooler in
	// session mode): the default.
	PoolerNone Pooler = "none"
	// PoolerTransaction is a pooler in transaction mode.
	PoolerTransaction Pooler = "transaction"
)

// Transactional reports whether p hands server connections out per
// transaction.
func (p Pooler) Transactional() bool { return p == PoolerTransaction }

// RiverPollOnly reports whether River must poll instead of LISTEN.
func (p Pooler) RiverPollOnly() bool { return p.Transactional() }

// configure adapts a pool's configuration to p.
func (p Pooler) configure(cfg *pgxpool.Config) {
	if !p.Transactional() {
		return
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	// Nothing is cached per connection that a pooler could invalidate.
	cfg.ConnConfig.StatementCacheCapacity = 0
	cfg.ConnConfig.DescriptionCacheCapacity = 0
}
