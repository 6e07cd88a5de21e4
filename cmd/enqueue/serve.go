package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/httpserver"
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
	MaxHTTPConns   int           `name:"max-http-conns" env:"MAX_HTTP_CONNS" default:"256" help:"Most open HTTP connections; beyond it the longest-idle one is closed."`
	SNSTopicARNs   []string      `name:"sns-topic-arn" env:"SNS_TOPIC_ARNS" help:"Accept /v1/events/s3 notifications signed by Amazon SNS for this topic (repeatable). Without it SNS signatures are not accepted."`
	SNSAutoConfirm bool          `name:"sns-auto-confirm" env:"SNS_AUTO_CONFIRM" help:"Confirm SNS subscriptions to the --sns-topic-arn topics (GET SubscribeURL, only on an Amazon SNS host). Otherwise they are logged and counted for an operator."`
	DevLocal       bool          `name:"dev-allow-local-folders" help:"Accept file:// and mem:// folders in POST /v1/imports, as the body's tenant. Development only: any holder of the token could load any directory this process can read."`
	ShutdownGrace  time.Duration `name:"shutdown-grace" env:"SHUTDOWN_GRACE" default:"20s" help:"On SIGTERM, how long in-flight requests may finish."`
	NoRiverUI      bool          `name:"no-river-ui" env:"NO_RIVER_UI" help:"Do not serve the River UI at /riverui/."`
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
	var sns *uploads.SNSConfig
	if len(s.SNSTopicARNs) > 0 {
		sns = &uploads.SNSConfig{TopicARNs: s.SNSTopicARNs, AutoConfirm: s.SNSAutoConfirm}
	} else if s.SNSAutoConfirm {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--sns-auto-confirm needs --sns-topic-arn")}
	}
	srv, err := uploads.New(uploads.Config{
		Enqueuer: enq, Pool: pool, AuthToken: token, InsecureNoAuth: s.InsecureNoAuth, HMACSecret: secret, SNS: sns,
		AllowLocalFolders: s.DevLocal,
		Marker:            s.Marker, Mapping: uploads.Mapping{Pattern: s.PathPattern, Buckets: s.Buckets},
		MaxBodyBytes: s.MaxBodyBytes, Metrics: enq.Metrics, Logger: e.Logger,
	})
	if err != nil {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	if len(s.Buckets) == 0 {
		e.Logger.Warn("no --bucket given: folders of any bucket are accepted")
	}
	if s.DevLocal {
		e.Logger.Warn("--dev-allow-local-folders: file:// and mem:// folders are accepted over HTTP; never in production")
	}
	pruneCtx, stopPruning := context.WithCancel(context.WithoutCancel(e.Ctx))
	defer stopPruning()
	go srv.PruneReplays(pruneCtx, time.Minute)
	if s.MaxHTTPConns < 1 {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--max-http-conns must be at least 1")}
	}
	handler := srv.Handler()
	if !s.NoRiverUI {
		ui, err := riverUI(e.Ctx, enq.River, e.Logger)
		if err != nil {
			return fmt.Errorf("river UI: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle(riverUIPrefix+"/", srv.Authenticated(ui))
		mux.Handle("/", handler)
		handler = mux
	}
	httpSrv, err := httpserver.Listen(httpserver.Config{Addr: s.Listen, Handler: handler, MaxConns: s.MaxHTTPConns, Logger: e.Logger})
	if err != nil {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: fmt.Errorf("--listen: %w", err)}
	}
	served := make(chan error, 1)
	go func() { served <- httpSrv.Serve() }()
	srv.SetReady(true)
	e.Logger.Info("listening for upload notifications", "addr", httpSrv.Addr().String(), "auth", token != "", "hmac", len(secret) > 0,
		"sns_topics", len(s.SNSTopicARNs), "buckets", s.Buckets, "max_conns", s.MaxConns, "max_http_conns", s.MaxHTTPConns)

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
