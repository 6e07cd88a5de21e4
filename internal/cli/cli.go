// Package cli holds what the two binaries share: argument parsing with kong,
// exit codes, structured logging and database connections with secrets kept
// out of logs and errors.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/buildinfo"
)

// Exit codes shared by the binaries. Scripts depend on them.
const (
	ExitOK           = 0
	ExitInfra        = 1 // database unreachable or another infrastructure failure
	ExitInvalidInput = 2 // bad flags or values; nothing was written
	ExitConflict     = 3 // a running batch holds the scope
	ExitEnqueueFail  = 4 // the job insert failed; the batch was recorded Failed
	ExitNotResumable = 5 // refused: not resumable, retryable or cancellable, or batch not found
	ExitLockTimeout  = 6 // worker migrate gave way to locks held by other sessions on every attempt
	ExitResumable    = 7 // the folder's newest batch committed its load and failed publication: resume it; nothing was started
	ExitNoLedger     = 8 // status --objects: the warehouse slice (and its load ledger) belongs to another batch, or there is none
	ExitListen       = 9 // a listener could not be bound (its address is taken, or not this host's): the flag, the address and why are named
)

// CannotListen is the error of a command whose listener could not be
// bound: exit code ExitListen, its message naming the flag of the address
// (such as "admin-listen") and why (net.Listen's error says the address,
// and "address already in use" when another process holds it). The
// command reports it before it exits: as a log line (the worker's run),
// or also as the cannot_listen outcome line (enqueue's commands).
func CannotListen(flag string, err error) ExitError {
	return ExitError{Code: ExitListen, Err: fmt.Errorf("--%s: cannot listen: %w", flag, err)}
}

// Globals are the flags every command has.
type Globals struct {
	DatabaseURL    string           `name:"database-url" env:"DATABASE_URL" help:"PostgreSQL connection string of the operational database (env DATABASE_URL)."`
	DatabasePooler Pooler           `name:"database-pooler" env:"DATABASE_POOLER" enum:"none,transaction" default:"none" help:"What is between this process and PostgreSQL: none (a direct connection), or transaction (PgBouncer in transaction pooling mode, or RDS Proxy): then no named prepared statements and no LISTEN (River polls). worker migrate refuses it: it needs a direct connection."`
	LogFormat      string           `name:"log-format" env:"LOG_FORMAT" enum:"json,text" default:"json" help:"Log format on stderr: json or text."`
	LogLevel       string           `name:"log-level" env:"LOG_LEVEL" enum:"debug,info,warn,error" default:"info" help:"Minimum log level."`
	Version        kong.VersionFlag `name:"version" help:"Print the build (version, revision, Go version) and exit."`
}

// Logger returns the slog logger the flags describe, writing to w.
// Durations are logged as seconds: a time.Duration attribute becomes a
// number of seconds under its key with "_seconds" appended.
func (g *Globals) Logger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(g.LogLevel))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsSeconds}
	if g.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// durationsAsSeconds is a slog ReplaceAttr that logs durations as seconds
// (slog's JSON handler would write nanoseconds).
func durationsAsSeconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	key := a.Key
	if !strings.HasSuffix(key, "_seconds") {
		key += "_seconds"
	}
	return slog.Float64(key, a.Value.Duration().Seconds())
}

// ErrNoDatabaseURL is returned when neither --database-url nor DATABASE_URL
// is set.
var ErrNoDatabaseURL = errors.New("no database: set DATABASE_URL or pass --database-url")

// Connect opens a pool on the operational database, through the pooler
// the flags name, lets configure adjust its configuration, and checks that
// it answers within timeout. Errors never include the password.
func (g *Globals) Connect(ctx context.Context, timeout time.Duration, configure func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	return Connect(ctx, g.DatabaseURL, g.DatabasePooler, timeout, configure)
}

// PingTimeoutDefault bounds the liveness check a pool makes of a
// connection idle for more than a second before handing it out (pgxpool's
// PingTimeout; a URL's pool_ping_timeout wins). Without it the check waits
// as long as the caller's deadline, or for ever: after a failover in which
// the old primary's host vanished (no reset reaches its clients), every
// idle connection to it would hold its caller for that long instead of
// being replaced by one to the new primary.
const PingTimeoutDefault = 3 * time.Second

// Connect opens a pool on databaseURL as pooler requires (see Pooler), lets
// configure adjust its configuration, and pings it within timeout. Errors
// never include the password. It is the one place the binaries open
// database pools. A connection that has been idle is checked within
// PingTimeoutDefault before it is handed out, and new connections give up
// on a host after 5 s (a URL's connect_timeout wins): a multi-host URL
// (host1,host2 with target_session_attrs=read-write) moves on to the next
// host, so pools follow a failover.
func Connect(ctx context.Context, databaseURL string, pooler Pooler, timeout time.Duration, configure func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := parseDatabaseURL(databaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	if cfg.PingTimeout == 0 && !strings.Contains(databaseURL, "pool_ping_timeout") {
		cfg.PingTimeout = PingTimeoutDefault
	}
	if configure != nil {
		configure(cfg)
	}
	pooler.configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database %s: %w", Redact(databaseURL), err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s unreachable: %s", Redact(databaseURL), stripSecrets(err.Error(), databaseURL))
	}
	return pool, nil
}

// CheckDatabaseURL parses databaseURL as Connect does, connecting to
// nothing, so a command can refuse a bad setting before it starts. Errors
// never include the password.
func CheckDatabaseURL(databaseURL string) error {
	_, err := parseDatabaseURL(databaseURL)
	return err
}

func parseDatabaseURL(databaseURL string) (*pgxpool.Config, error) {
	if databaseURL == "" {
		return nil, ErrNoDatabaseURL
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %w", Redact(databaseURL), errors.New(stripSecrets(err.Error(), databaseURL)))
	}
	return cfg, nil
}

// Redact returns databaseURL with any password replaced, fit for logs.
func Redact(databaseURL string) string {
	u, err := url.Parse(databaseURL)
	if err != nil || u.Scheme == "" {
		// Keyword/value form or garbage: keep nothing that could be secret.
		return "(unparsable connection string)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// stripSecrets removes the password of databaseURL from msg, in case a
// driver error echoes it.
func stripSecrets(msg, databaseURL string) string {
	if u, err := url.Parse(databaseURL); err == nil {
		if p, has := u.User.Password(); has && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
		if p := u.Query().Get("password"); p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

// exitPanic carries kong's exit request (after --help) out of Parse.
type exitPanic struct{ code int }

// Invalid reports a usage error: the field (flag or argument, in
// snake_case) and why it was refused.
type Invalid func(field, reason string)

// JSONOutcome returns an Invalid that prints the documented outcome line
// {"outcome":"invalid_input","field":…,"error":…} on w (enqueue's stdout).
func JSONOutcome(w io.Writer) Invalid {
	return func(field, reason string) {
		b, _ := json.Marshal(map[string]string{"outcome": "invalid_input", "field": field, "error": reason})
		fmt.Fprintf(w, "%s\n", b)
	}
}

// JSONLog returns an Invalid that writes one JSON log entry on w (the
// worker's stderr, before its logger exists).
func JSONLog(w io.Writer) Invalid {
	return func(field, reason string) {
		l := slog.New(slog.NewJSONHandler(w, nil))
		l.Error("invalid input", "field", field, "error", reason)
	}
}

var flagInMessage = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)

// fieldOf names the input a kong error is about: the first flag it
// mentions, "command" for an unknown command or argument, else "arguments".
func fieldOf(err error) string {
	msg := err.Error()
	if m := flagInMessage.FindStringSubmatch(msg); m != nil {
		return strings.ReplaceAll(m[1], "-", "_")
	}
	if strings.Contains(msg, "unexpected argument") || strings.Contains(msg, "expected one of") {
		return "command"
	}
	return "arguments"
}

// Parse parses args into grammar with kong. It returns the parsed context,
// or ok false with the exit code to use: 0 after --help or --version,
// ExitInvalidInput after a usage error, which is reported through invalid
// (every invalid input keeps the binary's output contract, kong's own
// errors included). The "version" variable is set for --version.
func Parse(grammar any, args []string, stdout, stderr io.Writer, name, description string, vars kong.Vars, invalid Invalid) (kctx *kong.Context, code int, ok bool) {
	// kong would silently turn invalid UTF-8 into U+FFFD; refuse instead.
	for i, a := range args {
		if !utf8.ValidString(a) {
			invalid("arguments", fmt.Sprintf("argument %d is not valid UTF-8", i+1))
			return nil, ExitInvalidInput, false
		}
	}
	all := kong.Vars{"version": name + " " + buildinfo.Get().String()}
	for k, v := range vars {
		all[k] = v
	}
	parser, err := kong.New(grammar,
		kong.Name(name),
		kong.Description(description),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exitPanic{code}) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		all,
	)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, ExitInfra, false
	}
	defer func() {
		if r := recover(); r != nil {
			e, isExit := r.(exitPanic)
			if !isExit {
				panic(r)
			}
			kctx, code, ok = nil, e.code, false
		}
	}()
	kctx, err = parser.Parse(args)
	if err != nil {
		invalid(fieldOf(err), err.Error())
		return nil, ExitInvalidInput, false
	}
	return kctx, ExitOK, true
}

// MigrateHint adds "run `worker migrate`" to an error that says the schema
// is missing or behind this build: an undefined table, column or schema
// (SQLSTATE 42P01, 42703, 3F000). Other errors are returned as they are.
func MigrateHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "3F000") {
		return fmt.Errorf("the database schema is not migrated for this build (%s): run `worker migrate` first: %w", pgErr.Message, err)
	}
	return err
}

// Env is what every command of the binaries runs with.
type Env struct {
	Ctx    context.Context
	Stdout io.Writer
	Stderr io.Writer
	Logger *slog.Logger
}

// ExitError carries a specific exit code out of a command. Err, if any, has
// been reported already (as a JSON line or a log entry).
type ExitError struct {
	Code int
	Err  error
}

func (e ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

func (e ExitError) Unwrap() error { return e.Err }
