// Package cli holds what the two binaries share: argument parsing with kong,
// exit codes, structured logging and database connections with secrets kept
// out of logs and errors.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Exit codes shared by the binaries. Scripts depend on them.
const (
	ExitOK           = 0
	ExitInfra        = 1 // database unreachable or another infrastructure failure
	ExitInvalidInput = 2 // bad flags or values; nothing was written
	ExitConflict     = 3 // a running batch holds the scope
	ExitEnqueueFail  = 4 // the job insert failed; the batch was recorded Failed
	ExitNotResumable = 5 // refused: not resumable, retryable or cancellable, or batch not found
)

// Globals are the flags every command has.
type Globals struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" help:"PostgreSQL connection string of the operational database (env DATABASE_URL)."`
	LogFormat   string `name:"log-format" env:"LOG_FORMAT" enum:"json,text" default:"json" help:"Log format on stderr: json or text."`
	LogLevel    string `name:"log-level" env:"LOG_LEVEL" enum:"debug,info,warn,error" default:"info" help:"Minimum log level."`
}

// Logger returns the slog logger the flags describe, writing to w.
func (g *Globals) Logger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(g.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if g.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// ErrNoDatabaseURL is returned when neither --database-url nor DATABASE_URL
// is set.
var ErrNoDatabaseURL = errors.New("no database: set DATABASE_URL or pass --database-url")

// Connect opens a pool on the operational database and checks that it
// answers within timeout. Errors never include the password.
func (g *Globals) Connect(ctx context.Context, timeout time.Duration) (*pgxpool.Pool, error) {
	return Connect(ctx, g.DatabaseURL, timeout, nil)
}

// Connect opens a pool on databaseURL, lets configure adjust its
// configuration, and pings it within timeout. Errors never include the
// password.
func Connect(ctx context.Context, databaseURL string, timeout time.Duration, configure func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if databaseURL == "" {
		return nil, ErrNoDatabaseURL
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %w", Redact(databaseURL), errors.New(stripSecrets(err.Error(), databaseURL)))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	if configure != nil {
		configure(cfg)
	}
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

// Parse parses args into grammar with kong. It returns the parsed context,
// or ok false with the exit code to use: 0 after --help, ExitInvalidInput
// after a usage error (the error printed to stderr).
func Parse(grammar any, args []string, stdout, stderr io.Writer, name, description string, vars kong.Vars) (kctx *kong.Context, code int, ok bool) {
	// kong would silently turn invalid UTF-8 into U+FFFD; refuse instead.
	for i, a := range args {
		if !utf8.ValidString(a) {
			fmt.Fprintf(stderr, "%s: argument %d is not valid UTF-8\n", name, i+1)
			return nil, ExitInvalidInput, false
		}
	}
	parser, err := kong.New(grammar,
		kong.Name(name),
		kong.Description(description),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exitPanic{code}) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		vars,
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
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, ExitInvalidInput, false
	}
	return kctx, ExitOK, true
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
