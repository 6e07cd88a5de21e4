package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/uploads"
)

type serveCmd struct {
	Listen         string        `name:"listen" env:"LISTEN_ADDR" default:":8080" help:"Address to listen on."`
	AuthTokenFile  string        `name:"auth-token-file" env:"ENQUEUE_AUTH_TOKEN_FILE" help:"File holding the bearer token requests must carry."`
	AuthToken      string        `name:"auth-token" env:"ENQUEUE_AUTH_TOKEN" hidden:"" help:"Bearer token (environment only; a flag value would show in ps)."`
	InsecureNoAuth bool          `name:"insecure-no-auth" help:"Accept requests without authentication. Never in production."`
	HMACSecretFile string        `name:"hmac-secret-file" env:"ENQUEUE_HMAC_SECRET_FILE" help:"File holding a shared secret; /v1/events/s3 then also accepts requests signed with X-Fleet-Timestamp and X-Fleet-Signature."`
	Marker         string        `name:"marker" env:"COMPLETION_MARKER" default:"_SUCCESS" help:"Object name whose creation completes a folder."`
	PathPattern    string        `name:"path-pattern" env:"PATH_PATTERN" default:"tenants/{tenant_id}/{tenant_database}/{company_id}/" help:"How an S3 folder maps to tenant, database and company."`
	Buckets        []string      `name:"bucket" env:"ACCEPTED_BUCKETS" help:"Accept notifications only for these buckets (repeatable; default: any)."`
	MaxBodyBytes   int64         `name:"max-body-bytes" default:"1048576" help:"Largest request body accepted."`
	ShutdownGrace  time.Duration `name:"shutdown-grace" env:"SHUTDOWN_GRACE" default:"20s" help:"On SIGTERM, how long in-flight requests may finish."`
	MaxConns       int           `name:"max-conns" env:"MAX_CONNS" default:"32" help:"Database connections, so the most imports that run at once (each is one transaction); further requests wait for a connection within the request timeout. Size it for the concurrent requests expected, within the server's max_connections."`
}

func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

func (s *serveCmd) Run(c *enqueueCLI, e *cli.Env) error {
	token := s.AuthToken
	if s.AuthTokenFile != "" {
		t, err := readSecret(s.AuthTokenFile)
		if err != nil {
			return cli.ExitError{Code: cli.ExitInvalidInput, Err: fmt.Errorf("--auth-token-file: %w", err)}
		}
		token = t
	}
	if token == "" && !s.InsecureNoAuth {
		err := errors.New("refusing to serve without authentication: set --auth-token-file or ENQUEUE_AUTH_TOKEN, or pass --insecure-no-auth")
		e.Logger.Error(err.Error())
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	var secret []byte
	if s.HMACSecretFile != "" {
		sec, err := readSecret(s.HMACSecretFile)
		if err != nil {
			return cli.ExitError{Code: cli.ExitInvalidInput, Err: fmt.Errorf("--hmac-secret-file: %w", err)}
		}
		secret = []byte(sec)
	}
	if c.DatabaseURL == "" {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: cli.ErrNoDatabaseURL}
	}
	if s.MaxConns < 1 {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--max-conns must be at least 1")}
	}
	// The database must answer at start; later outages answer 503.
	pool, err := cli.Connect(e.Ctx, c.DatabaseURL, c.Timeout, func(cfg *pgxpool.Config) { cfg.MaxConns = int32(s.MaxConns) })
	if err != nil {
		return err
	}
	defer pool.Close()
	enq, err := newEnqueuer(c, e, pool, nil, 0)
	if err != nil {
		return err
	}
	srv, err := uploads.New(uploads.Config{
		Enqueuer: enq, Pool: pool, AuthToken: token, InsecureNoAuth: s.InsecureNoAuth, HMACSecret: secret,
		Marker: s.Marker, Mapping: uploads.Mapping{Pattern: s.PathPattern, Buckets: s.Buckets},
		MaxBodyBytes: s.MaxBodyBytes, Metrics: enq.Metrics, Logger: e.Logger,
	})
	if err != nil {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: fmt.Errorf("--listen: %w", err)}
	}
	httpSrv := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      45 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	served := make(chan error, 1)
	go func() { served <- httpSrv.Serve(ln) }()
	srv.SetReady(true)
	e.Logger.Info("listening for upload notifications", "addr", ln.Addr().String(), "auth", token != "", "hmac", len(secret) > 0, "max_conns", s.MaxConns)

	select {
	case <-e.Ctx.Done():
	case err := <-served:
		return err
	}
	srv.SetReady(false)
	e.Logger.Info("shutting down: finishing in-flight requests", "grace", s.ShutdownGrace)
	ctx, cancel := context.WithTimeout(context.Background(), s.ShutdownGrace)
	defer cancel()
	if err := httpSrv.Shutdown(ctx); err != nil {
		e.Logger.Warn("grace period over with requests in flight", "error", err)
	}
	e.Logger.Info("stopped")
	return nil
}
