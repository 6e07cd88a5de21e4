package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/grants"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/uploads"
	"github.com/fleet/ingest/migrations"
)

type serveCmd struct {
	Listen            string        `name:"listen" env:"LISTEN_ADDR" default:":8080" help:"Address to listen on."`
	AdminListen       string        `name:"admin-listen" env:"ADMIN_LISTEN_ADDR" default:":8081" help:"Address of the admin listener, inside the cluster only: /healthz, /readyz and /metrics for kubelet probes and Prometheus (they refuse request bodies), and the operator surfaces, served nowhere else: POST /v1/batches/{id}/cancel with an operator token (a tenant token cancels its own batch no delivery holds on --listen), the River UI at /riverui/ and pprof at /debug/pprof/ (all with the operator token). A port of its own, so no client of --listen can starve it. Empty: no admin listener, and no cancel route, River UI or pprof."`
	AuthTokenFile     string        `name:"auth-token-file" env:"ENQUEUE_AUTH_TOKEN_FILE" help:"File of the import tokens, the bearer tokens import requests must carry: one per line (blank lines and lines starting with # skipped), every one accepted, so the token rotates without a cut-over (add the new line, move the clients, remove the old line). Read again every --secrets-reload; while it cannot be read or holds no token, no import token is accepted."`
	AuthToken         string        `name:"auth-token" env:"ENQUEUE_AUTH_TOKEN" hidden:"" help:"Import token (environment only; a flag value would show in ps)."`
	OperatorTokenFile string        `name:"operator-token-file" env:"ENQUEUE_OPERATOR_TOKEN_FILE" help:"File of operator tokens, the only credentials of POST /v1/batches/{id}/cancel and the River UI (which act on any tenant's work; the import token never opens them), one per line: \"<operator name> sha256:<hex>\", the SHA-256 of the token (enqueue token operator --name prints a token and its line). The name is who acts in the operators' audit (enqueue audit). Reloaded every --operator-tokens-reload, line by line: a line added works, a line removed stops working, a malformed line is refused (the others apply), a missing file accepts no operator token. A file holding one token itself (the former format) is still read, as operator \"operator\" (deprecated). Without it the operator surfaces are not served. No operator token may be the import token."`
	OperatorToken     string        `name:"operator-token" env:"ENQUEUE_OPERATOR_TOKEN" hidden:"" help:"One operator token, of operator \"operator\" (environment only; deprecated: use --operator-token-file)."`
	InsecureNoAuth    bool          `name:"insecure-no-auth" help:"Accept import requests without authentication. Never in production. Operator routes still need the operator token."`
	HMACSecretFile    string        `name:"hmac-secret-file" env:"ENQUEUE_HMAC_SECRET_FILE" help:"File of shared secrets, one per line (as --auth-token-file); /v1/events/s3 then also accepts requests signed with X-Fleet-Timestamp and X-Fleet-Signature by any one of them. Read again every --secrets-reload; while it cannot be read or holds no secret, no signature is accepted."`
	SecretsEvery      time.Duration `name:"secrets-reload" env:"ENQUEUE_SECRETS_RELOAD" default:"10s" help:"How often --auth-token-file and --hmac-secret-file are read again."`
	Marker            string        `name:"marker" env:"COMPLETION_MARKER" default:"_SUCCESS" help:"Object name whose creation completes a folder."`
	MaxBadRecords     int           `name:"max-bad-records" env:"MAX_BAD_RECORDS" default:"0" help:"Tolerance of bad records of the imports this door makes, unless a request says (max_bad_records): up to this many records that cannot be stored are skipped, each recorded with the slice in the warehouse's errors table; one more fails the batch. 0 to 10000; 0: the first fails it."`
	TenantTokensFile  string        `name:"tenant-tokens-file" env:"ENQUEUE_TENANT_TOKENS_FILE" help:"File of tenant tokens, one per line: \"<tenant id> sha256:<hex>\", the SHA-256 of the token, never the token (enqueue token mint prints a token and its line). A tenant token imports only its tenant's folders (POST /v1/imports; another's is 403) and reads only its tenant's batches (GET /v1/batches/{id}; another's is 404). Reloaded every --tenant-tokens-reload: a token added works, a token removed stops working, without a restart."`
	TenantTokensEvery time.Duration `name:"tenant-tokens-reload" env:"ENQUEUE_TENANT_TOKENS_RELOAD" default:"10s" help:"How often --tenant-tokens-file is read again."`
	ImportsNoMarker   bool          `name:"imports-without-marker" env:"IMPORTS_WITHOUT_MARKER" help:"POST /v1/imports loads a folder without its completion marker when the body does not say (no \"no_marker\" field): for producers that write none. A body's \"no_marker\": false still requires it. Default: required, as on every door."`
	// --path-pattern and --bucket: the rule enqueue import and retry
	// apply too.
	mappingFlags
	MaxBodyBytes   int64         `name:"max-body-bytes" default:"1048576" help:"Largest request body accepted."`
	MaxHTTPConns   int           `name:"max-http-conns" env:"MAX_HTTP_CONNS" default:"256" help:"Most open connections to the public listener (--listen), a cap of its own (the admin listener has 64). At the cap a new connection closes the one idle, or waiting for its request body, longest, once it has been so for a second; until then it waits in the kernel's accept queue."`
	SNSTopicARNs   []string      `name:"sns-topic-arn" env:"SNS_TOPIC_ARNS" help:"Accept /v1/events/s3 notifications signed by Amazon SNS for this topic (repeatable). Without it SNS signatures are not accepted."`
	SNSAutoConfirm bool          `name:"sns-auto-confirm" env:"SNS_AUTO_CONFIRM" help:"Confirm SNS subscriptions to the --sns-topic-arn topics (GET SubscribeURL, only on an Amazon SNS host). Otherwise they are logged and counted for an operator."`
	DevLocal       bool          `name:"dev-allow-local-folders" help:"Accept file:// and mem:// folders in POST /v1/imports, as the body's tenant. Development only: any holder of the token could load any directory this process can read."`
	ShutdownGrace  time.Duration `name:"shutdown-grace" env:"SHUTDOWN_GRACE" default:"20s" help:"On SIGTERM, how long in-flight requests may finish."`
	NoRiverUI      bool          `name:"no-river-ui" env:"NO_RIVER_UI" help:"Do not serve the River UI (at /riverui/ on the admin listener)."`
	MaxConns       int           `name:"max-conns" env:"MAX_CONNS" default:"32" help:"Database connections, so the most imports that run at once (each is one transaction); further requests wait for a connection within --timeout. Size it for the concurrent requests expected, within the server's max_connections."`
	// How often the operator tokens are read again (they rotate).
	OperatorTokenEvery time.Duration `name:"operator-tokens-reload" env:"ENQUEUE_OPERATOR_TOKENS_RELOAD" default:"10s" help:"How often --operator-token-file is read again."`
	// The operator surfaces' own login.
	OperatorDatabaseURL string `name:"operator-database-url" env:"OPERATOR_DATABASE_URL" help:"PostgreSQL connection string of the operator login (fleet_operator, deploy/postgres/roles.sql), used by the operator surfaces only, the cancel route and the River UI, in a pool of its own (at most 4 connections). Without it they use --database-url, which in production is the door's login (fleet_enqueue), which may not change a batch or a job. Needs --operator-token-file."`

	// The door: how much an authenticated caller may ask for, and how
	// much an unauthenticated one can make the listener read.
	SignedMaxBodyBytes int64   `name:"signed-max-body-bytes" env:"SIGNED_MAX_BODY_BYTES" default:"65536" help:"Largest body of a request without the import token (HMAC- or SNS-signed), read before its signature is checked; at most --max-body-bytes."`
	RateLimit          float64 `name:"rate-limit" env:"RATE_LIMIT" default:"500" help:"Folders per second one credential (the import token, the HMAC secret, one SNS topic) may start (size it above the fleet's upload rate: 100,000 vehicles uploading every 5 minutes is 333/s); each authenticated request takes one per folder it would start, at least one. Over it: 429 with Retry-After (503 to SNS, which retries only 5xx). 0 turns the limit off."`
	RateBurst          int     `name:"rate-burst" env:"RATE_BURST" default:"200" help:"Most folders one credential may start at once, and so in one request (more is refused 422)."`

	// Group commit: concurrent requests share one import transaction.
	GroupLinger time.Duration `name:"group-linger" env:"GROUP_LINGER" default:"2ms" help:"Group commit: imports of concurrent requests share one transaction, each request keeping its own answer. A request waits at most this long for others, and only while another group's transaction is in flight. 0 gives every request a transaction of its own."`
	GroupMax    int           `name:"group-max" env:"GROUP_MAX" default:"100" help:"Most folders one group-commit transaction imports (1 to 1000); a request of more is imported alone."`

	cli.DatabaseProbeFlags
}

// settingFields names the flag (as an invalid_input field) behind each
// uploads.Config setting that Validate may refuse.
var settingFields = map[string]string{
	"AuthToken": "auth_token_file", "OperatorToken": "operator_token_file", "Marker": "marker", "MaxBadRecords": "max_bad_records",
	"RequestTimeout": "timeout", "Mapping": "path_pattern", "SNS": "sns_topic_arn",
	"SignedMaxBodyBytes": "signed_max_body_bytes", "RateLimit": "rate_limit", "RateBurst": "rate_burst",
	"GroupLinger": "group_linger", "GroupMax": "group_max",
}

// refuseSetting reports an invalid setting as the invalid_input outcome
// (one JSON line on stdout, an error in the log) and exit code 2.
func refuseSetting(e *cli.Env, field string, err error) error {
	printJSON(e.Stdout, map[string]string{"outcome": "invalid_input", "field": field, "error": err.Error()})
	e.Logger.Error(err.Error(), "field", field)
	return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
}

// refuseConfigSetting reports a setting a Config's Validate refused, named
// by its Config field (setting), as refuseSetting does for the flag fields
// maps it to; prefix, if any, begins the message.
func refuseConfigSetting(e *cli.Env, fields map[string]string, setting, reason, prefix string) error {
	field := fields[setting]
	return refuseSetting(e, field, fmt.Errorf("%s--%s: %s", prefix, strings.ReplaceAll(field, "_", "-"), reason))
}

// connectEnqueuer opens the operational pool of a long-running command
// (serve, sqs, reconcile: at most maxConns connections; the database must
// answer at start) and the enqueuer on it, measured by m, whose database
// monitor every query of the pool that succeeds informs (m.Database.Trace).
// The caller closes the pool.
//
// As the worker does, the command does not start on a database whose
// schema is behind this build (migrations.RequireCurrent): it exits 1
// with the reason and "run `worker migrate` first" (a log line and the
// error outcome line), so a pod that started before its migrations
// restarts until they ran rather than report ready and refuse every
// import. Its /readyz asks again at every probe (schemaReady).
func connectEnqueuer(c *enqueueCLI, e *cli.Env, role grants.Role, maxConns int, m *metrics.Metrics) (*pgxpool.Pool, *jobs.Enqueuer, error) {
	pool, err := c.Globals.Connect(e.Ctx, c.Timeout, func(pc *pgxpool.Config) {
		pc.MaxConns = int32(maxConns)
		m.Database.Trace(pc)
	})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	err = migrations.RequireCurrent(ctx, pool)
	cancel()
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("not starting: %w", err)
	}
	// The login holds what roles.sql grants role (the doors: fleet_enqueue;
	// reconcile: fleet_reconcile, which alone writes its checkpoints), or
	// the command does not start (exit 10, naming what is missing).
	if err := requireGrants(e, pool, role); err != nil {
		pool.Close()
		return nil, nil, err
	}
	enq, err := newEnqueuer(c, e, pool, nil, 0)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	enq.Metrics = m
	return pool, enq, nil
}

// startDatabaseProbe probes the database of pool every
// --database-probe-interval for m.Database (ingest_database_up, /readyz)
// until the returned function is called, and returns once the first probe
// came back: from the first scrape on, the process says whether it reaches
// its database.
func startDatabaseProbe(e *cli.Env, m *metrics.Metrics, pool *pgxpool.Pool, f cli.DatabaseProbeFlags) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(e.Ctx))
	m.Database.Start(ctx, pool, f.DatabaseProbeInterval, e.Logger)
	return cancel
}

// config reads the secrets and checks every setting, connecting to nothing
// and starting nothing; the listener's Enqueuer, Pool and Metrics are left
// for Run to fill in.
func (s *serveCmd) config(c *enqueueCLI, e *cli.Env) (uploads.Config, error) {
	operators, err := s.operatorTokens(e)
	if err != nil {
		return uploads.Config{}, err
	}
	if s.SecretsEvery <= 0 {
		return uploads.Config{}, refuseSetting(e, "secrets_reload", errors.New("--secrets-reload must be positive"))
	}
	importTokens, err := loadSecrets(e, s.AuthTokenFile, "auth_token_file")
	if err != nil {
		return uploads.Config{}, err
	}
	hmacSecrets, err := loadSecrets(e, s.HMACSecretFile, "hmac_secret_file")
	if err != nil {
		return uploads.Config{}, err
	}
	token := s.AuthToken // ENQUEUE_AUTH_TOKEN, one fixed value, unless the file is given
	if importTokens != nil {
		token = ""
	}
	var sns *uploads.SNSConfig
	if len(s.SNSTopicARNs) > 0 {
		sns = &uploads.SNSConfig{TopicARNs: s.SNSTopicARNs, AutoConfirm: s.SNSAutoConfirm}
	}
	switch {
	case token == "" && importTokens == nil && !s.InsecureNoAuth:
		return uploads.Config{}, refuseSetting(e, "auth_token_file",
			errors.New("refusing to serve without authentication: set --auth-token-file or ENQUEUE_AUTH_TOKEN, or pass --insecure-no-auth"))
	case c.DatabaseURL == "":
		return uploads.Config{}, refuseSetting(e, "database_url", cli.ErrNoDatabaseURL)
	case c.Timeout <= 0:
		return uploads.Config{}, refuseSetting(e, "timeout", errors.New("--timeout must be positive"))
	case s.MaxConns < 1:
		return uploads.Config{}, refuseSetting(e, "max_conns", errors.New("--max-conns must be at least 1"))
	case s.MaxHTTPConns < 1:
		return uploads.Config{}, refuseSetting(e, "max_http_conns", errors.New("--max-http-conns must be at least 1"))
	case s.ShutdownGrace < 0:
		return uploads.Config{}, refuseSetting(e, "shutdown_grace", errors.New("--shutdown-grace must not be negative"))
	case s.RateLimit < 0:
		return uploads.Config{}, refuseSetting(e, "rate_limit", errors.New("--rate-limit must not be negative (0 turns the limit off)"))
	case s.RateLimit > 0 && s.RateBurst < 1:
		return uploads.Config{}, refuseSetting(e, "rate_burst", errors.New("--rate-burst must be at least 1"))
	case s.GroupMax < 1:
		return uploads.Config{}, refuseSetting(e, "group_max", errors.New("--group-max must be at least 1"))
	case s.SignedMaxBodyBytes < 1:
		return uploads.Config{}, refuseSetting(e, "signed_max_body_bytes", errors.New("--signed-max-body-bytes must be at least 1"))
	case s.SNSAutoConfirm && sns == nil:
		return uploads.Config{}, refuseSetting(e, "sns_auto_confirm", errors.New("--sns-auto-confirm needs --sns-topic-arn"))
	case s.DatabaseProbeFlags.Validate() != nil:
		return uploads.Config{}, refuseSetting(e, "database_probe_interval", s.DatabaseProbeFlags.Validate())
	case s.OperatorDatabaseURL != "" && operators == nil:
		return uploads.Config{}, refuseSetting(e, "operator_database_url",
			errors.New("--operator-database-url needs --operator-token-file: without the operator token no operator surface is served"))
	}
	var tenants *uploads.TenantTokens
	if s.TenantTokensFile != "" {
		if s.TenantTokensEvery <= 0 {
			return uploads.Config{}, refuseSetting(e, "tenant_tokens_reload", errors.New("--tenant-tokens-reload must be positive"))
		}
		if tenants, err = uploads.LoadTenantTokens(s.TenantTokensFile, e.Logger); err != nil {
			return uploads.Config{}, refuseSetting(e, "tenant_tokens_file", err)
		}
	}
	if s.OperatorDatabaseURL != "" {
		if err := cli.CheckDatabaseURL(s.OperatorDatabaseURL); err != nil {
			return uploads.Config{}, refuseSetting(e, "operator_database_url", fmt.Errorf("--operator-database-url: %w", err))
		}
	}
	cfg := uploads.Config{
		AuthToken: token, InsecureNoAuth: s.InsecureNoAuth, OperatorTokens: operators, SNS: sns,
		TenantTokens:      tenants,
		AllowLocalFolders: s.DevLocal, ImportsWithoutMarker: s.ImportsNoMarker, MaxBadRecords: s.MaxBadRecords,
		Marker: s.Marker, Mapping: s.mapping(),
		MaxBodyBytes: s.MaxBodyBytes, RequestTimeout: c.Timeout, Logger: e.Logger,
		SignedMaxBodyBytes: s.SignedMaxBodyBytes, RateLimit: s.RateLimit, RateBurst: s.RateBurst,
		GroupLinger: s.GroupLinger, GroupMax: s.GroupMax,
	}
	if importTokens != nil { // never a nil *reloadfile.Secrets in the interface
		cfg.ImportTokens = importTokens
	}
	if hmacSecrets != nil {
		cfg.HMACSecrets = hmacSecrets
	}
	if err := cfg.Validate(); err != nil {
		var ce *uploads.ConfigError
		errors.As(err, &ce)
		return uploads.Config{}, refuseConfigSetting(e, settingFields, ce.Setting, ce.Reason, "refusing to serve: ")
	}
	return cfg, nil
}

func (s *serveCmd) Run(c *enqueueCLI, e *cli.Env) error {
	cfg, err := s.config(c, e)
	if err != nil {
		return err
	}
	// The database must answer at start; later outages answer 503.
	pool, enq, err := connectEnqueuer(c, e, grants.Enqueue, s.MaxConns, metrics.NewServe()) // not the worker's gauges, frozen at zero here
	if err != nil {
		return err
	}
	defer pool.Close()
	stopProbe := startDatabaseProbe(e, enq.Metrics, pool, s.DatabaseProbeFlags)
	defer stopProbe()
	opPool, opEnq, err := s.connectOperator(c, e, pool, enq, cfg.OperatorTokens != nil)
	if err != nil {
		return err
	}
	if opPool != pool {
		defer opPool.Close()
	}
	enq.Metrics.AddPool(metrics.PoolEnqueue, pool)
	if opPool != pool {
		enq.Metrics.AddPool(metrics.PoolOperator, opPool)
	}
	cfg.Enqueuer, cfg.Operator, cfg.Pool, cfg.Metrics = enq, opEnq, pool, enq.Metrics
	cfg.Reachable, cfg.Schema = enq.Metrics.Database.Ready, schemaReady(pool)
	srv, err := uploads.New(cfg)
	if err != nil {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	if len(s.Buckets) == 0 {
		e.Logger.Warn("no --bucket given: folders of any validly named bucket are accepted; list your upload buckets")
	}
	if s.DevLocal {
		e.Logger.Warn("--dev-allow-local-folders: file:// and mem:// folders are accepted over HTTP; never in production")
	}
	if cfg.OperatorTokens == nil {
		e.Logger.Info("no operator token (--operator-token-file): POST /v1/batches/{id}/cancel and the River UI are not served")
	}
	// The public door: imports, event notifications and batch answers (GET
	// /v1/batches/{id}, import token), and, for
	// compatibility, probes and /metrics. The operator surfaces (the cancel
	// route, the River UI, pprof) are served on the admin listener only.
	routes := srv.Handler()
	public := http.NewServeMux()
	for _, pattern := range []string{"POST /v1/imports", "POST /v1/events/s3", "GET /v1/batches/{id}", "GET /v1/batches", "GET /metrics", "GET /healthz", "GET /readyz"} {
		public.Handle(pattern, routes)
	}
	// A tenant token cancels its own parked or not yet started batch here;
	// the operators' cancel stays on the admin listener.
	public.Handle("/v1/batches/{id}/cancel", srv.TenantCancel(adminOnly("POST /v1/batches/{id}/cancel with an operator token")))
	public.HandleFunc(riverUIPrefix+"/", adminOnly("the River UI"))
	public.HandleFunc("/debug/pprof/", adminOnly("pprof"))
	public.Handle("/", routes) // everything else: the mux's own 404 and 405
	operator := http.NewServeMux()
	operator.Handle("POST /v1/batches/{id}/cancel", routes)
	if !s.NoRiverUI {
		ui := http.NotFoundHandler() // not reached without an operator token: OperatorOnly answers
		if cfg.OperatorTokens != nil {
			if ui, err = riverUI(e.Ctx, opEnq.River, e.Logger); err != nil {
				return fmt.Errorf("river UI: %w", err)
			}
			ui = &uiActions{ui: ui, enq: opEnq, pool: opPool, log: e.Logger}
		}
		operator.Handle(riverUIPrefix+"/", srv.OperatorOnly("the River UI", ui))
	}
	operator.Handle("/debug/pprof/", srv.OperatorOnly("pprof", pprofHandler()))
	if s.AdminListen == "" {
		e.Logger.Warn("no --admin-listen: the cancel route, the River UI and pprof are not served")
	}
	handler := httpserver.Observe(public, observeDoor(cfg.Metrics, e))
	httpSrv, err := httpserver.Listen(httpserver.Config{Addr: s.Listen, Handler: handler, MaxConns: s.MaxHTTPConns, Logger: e.Logger})
	if err != nil {
		return cannotListen(e, "listen", err)
	}
	adminSrv, adminServed, err := s.startAdmin(srv, operator, cfg.Metrics, e)
	if err != nil {
		return err
	}
	pruneCtx, stopPruning := context.WithCancel(context.WithoutCancel(e.Ctx))
	defer stopPruning()
	go srv.PruneReplays(pruneCtx, time.Minute)
	if cfg.TenantTokens != nil {
		go cfg.TenantTokens.Watch(pruneCtx, s.TenantTokensEvery, func(refused int, err error) {
			cfg.Metrics.TenantTokensRefusedLines.Set(float64(refused))
			if err != nil {
				cfg.Metrics.TenantTokenReloadFailures.Inc()
			}
		})
	}
	watchSecrets(pruneCtx, cfg, s.SecretsEvery, e)
	go cfg.OperatorTokens.Watch(pruneCtx, s.OperatorTokenEvery, cfg.Metrics.SecretFileReloadFailures.WithLabelValues(metrics.SecretFileOperatorTokens).Inc)
	served := make(chan error, 1)
	go func() { served <- httpSrv.Serve() }()
	srv.SetReady(true)
	e.Logger.Info("listening for upload notifications", "addr", httpSrv.Addr().String(), "auth", cfg.AuthToken != "" || cfg.ImportTokens != nil, "operator", cfg.OperatorTokens != nil, "hmac", cfg.HMACSecrets != nil,
		"sns_topics", len(s.SNSTopicARNs), "buckets", s.Buckets, "rate_limit", s.RateLimit, "rate_burst", s.RateBurst, "group_linger_seconds", s.GroupLinger.Seconds(), "group_max", s.GroupMax, "max_conns", s.MaxConns, "max_http_conns", s.MaxHTTPConns)

	select {
	case <-e.Ctx.Done():
	case err := <-served:
		return err
	case err := <-adminServed:
		return fmt.Errorf("admin listener: %w", err)
	}
	srv.SetReady(false)
	e.Logger.Info("shutting down: finishing in-flight requests", "grace_seconds", s.ShutdownGrace.Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), s.ShutdownGrace)
	defer cancel()
	if err := httpSrv.Shutdown(ctx); err != nil {
		e.Logger.Warn("grace period over with requests in flight", "error", err)
	}
	if adminSrv != nil {
		_ = adminSrv.Shutdown(ctx)
	}
	e.Logger.Info("stopped")
	return nil
}

// operatorTokens are the operator tokens of --operator-token-file (read,
// then reloaded by Run), or the one token of ENQUEUE_OPERATOR_TOKEN
// (operator "operator", deprecated), or nil: no operator surface.
func (s *serveCmd) operatorTokens(e *cli.Env) (*uploads.OperatorTokens, error) {
	switch {
	case s.OperatorTokenFile != "":
		if s.OperatorTokenEvery <= 0 {
			return nil, refuseSetting(e, "operator_tokens_reload", errors.New("--operator-tokens-reload must be positive"))
		}
		ops, err := uploads.LoadOperatorTokens(s.OperatorTokenFile, e.Logger)
		if err != nil {
			return nil, refuseSetting(e, "operator_token_file", fmt.Errorf("--operator-token-file: %w", err))
		}
		return ops, nil
	case s.OperatorToken != "":
		e.Logger.Warn("ENQUEUE_OPERATOR_TOKEN is deprecated: its token acts as operator \"" + uploads.LegacyOperatorName +
			"\" and cannot rotate; give each operator a token of their own in --operator-token-file (enqueue token operator --name NAME)")
		return uploads.StaticOperatorToken(uploads.LegacyOperatorName, s.OperatorToken), nil
	}
	return nil, nil
}

// schemaReady is the schema check of a long-running command's /readyz:
// the database's schema is current for this build (migrations.RequireCurrent),
// or the reason it is not.
func schemaReady(pool *pgxpool.Pool) func(context.Context) error {
	return func(ctx context.Context) error { return migrations.RequireCurrent(ctx, pool) }
}

// operatorMaxConns bounds the operator surfaces' pool: a person's cancels
// and the River UI's pages.
const operatorMaxConns = 4

// connectOperator opens the pool and enqueuer of the operator surfaces on
// --operator-database-url, or returns the door's without it. When they are
// served (an operator token) it warns when their login may not cancel a batch (the
// door's login, in production, may not): the cancel route and the River
// UI's actions would then fail with permission errors.
func (s *serveCmd) connectOperator(c *enqueueCLI, e *cli.Env, pool *pgxpool.Pool, enq *jobs.Enqueuer, served bool) (*pgxpool.Pool, *jobs.Enqueuer, error) {
	opPool, opEnq := pool, enq
	if s.OperatorDatabaseURL != "" {
		var err error
		opPool, err = cli.Connect(e.Ctx, s.OperatorDatabaseURL, c.DatabasePooler, c.Timeout, func(pc *pgxpool.Config) { pc.MaxConns = operatorMaxConns })
		if err != nil {
			return nil, nil, fmt.Errorf("--operator-database-url: %w", err)
		}
		if opEnq, err = newEnqueuer(c, e, opPool, nil, 0); err != nil {
			opPool.Close()
			return nil, nil, err
		}
		opEnq.Metrics = enq.Metrics
	}
	if !served {
		return opPool, opEnq, nil
	}
	if opPool != pool {
		// The operator login holds what roles.sql grants fleet_operator, or
		// serve does not start (exit 10, naming what is missing).
		if err := requireGrants(e, opPool, grants.Operator); err != nil {
			opPool.Close()
			return nil, nil, fmt.Errorf("--operator-database-url: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	var login string
	var mayCancel bool
	err := opPool.QueryRow(ctx, `SELECT current_user, has_column_privilege('ingestion_batches', 'cancelled_at', 'UPDATE') AND has_table_privilege('river_job', 'UPDATE')`).Scan(&login, &mayCancel)
	switch {
	case err != nil:
		e.Logger.Warn("could not check the operator surfaces' database login", "error", err)
	case !mayCancel:
		e.Logger.Warn("the operator surfaces' database login may not cancel batches: the cancel route and the River UI's actions will fail; set --operator-database-url (OPERATOR_DATABASE_URL) to the operator login (fleet_operator)",
			"login", login, "operator_database_url", s.OperatorDatabaseURL != "")
	}
	return opPool, opEnq, nil
}

// observeDoor is how enqueue serve's listeners log and measure each
// request: one access line (probes and scrapes at debug level),
// ingest_http_requests_total{route,code} and
// ingest_http_request_duration_seconds{route}.
func observeDoor(m *metrics.Metrics, e *cli.Env) httpserver.ObserveConfig {
	return httpserver.ObserveConfig{
		Logger: e.Logger, Requests: m.DoorRequests, Duration: m.DoorDuration,
		QuietRoutes: []string{"GET /healthz", "GET /readyz", "GET /metrics"},
	}
}

// observeRiverUI is how the admin listener logs and measures the River
// UI's requests, apart from the door's: they are an operator's browser
// polling every few seconds, not the door's clients, and stay out of
// ingest_http_requests_total and ingest_http_request_duration_seconds (and
// so of the door's alerts). They are counted by code in
// ingest_riverui_requests_total; its polls (GET, HEAD) log at debug, its
// changes at info (their operator action lines at warn).
func observeRiverUI(m *metrics.Metrics, e *cli.Env) httpserver.ObserveConfig {
	return httpserver.ObserveConfig{Logger: e.Logger, Codes: m.RiverUIRequests, QuietReads: true}
}

// apart sends the River UI's requests (under riverUIPrefix) to ui, the
// rest to door.
func apart(door, ui http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == riverUIPrefix || strings.HasPrefix(r.URL.Path, riverUIPrefix+"/") {
			ui.ServeHTTP(w, r)
			return
		}
		door.ServeHTTP(w, r)
	})
}

// adminMaxConns caps the admin listener's connections, as the worker's
// metrics listener (--metrics-max-conns) is by default.
const adminMaxConns = 64

// startAdmin serves /healthz, /readyz and /metrics on --admin-listen, a
// port of its own that the public Service does not expose, with the
// operator surfaces of operator (the cancel route, the River UI, pprof),
// and logs its address. Probes and scrapes take no body: a request to
// their paths that carries one is answered 413 and its connection closed
// at once, whatever its method. The channel reports the
// error that stops it; both are nil without --admin-listen.
func (s *serveCmd) startAdmin(srv *uploads.Server, operator *http.ServeMux, m *metrics.Metrics, e *cli.Env) (*httpserver.Server, <-chan error, error) {
	if s.AdminListen == "" {
		e.Logger.Warn("no --admin-listen: probes and scrapes share the public port, where slow clients can starve them")
		return nil, nil, nil
	}
	routes := srv.Handler()
	mux := operator
	for _, pattern := range []string{"GET /healthz", "GET /readyz", "GET /metrics"} {
		mux.Handle(pattern, routes)
	}
	admin, err := httpserver.Listen(httpserver.Config{
		Addr: s.AdminListen, Handler: apart(httpserver.Observe(mux, observeDoor(m, e)), httpserver.Observe(mux, observeRiverUI(m, e))), MaxConns: adminMaxConns, Logger: e.Logger,
		EvictableAfter: httpserver.EvictableAfterProbes,
		// Whatever the method: a POST /metrics with a body is 413 at once,
		// not the mux's 405 after the body.
		RefuseBodiesOn: []string{"/healthz", "/readyz", "/metrics"},
	})
	if err != nil {
		return nil, nil, cannotListen(e, "admin-listen", err)
	}
	served := make(chan error, 1)
	go func() {
		if err := admin.Serve(); err != nil {
			served <- err
		}
	}()
	e.Logger.Info("admin listener started", "addr", admin.Addr().String(), "max_conns", adminMaxConns)
	return admin, served, nil
}

// adminOnly answers, on the public listener, a route that is served on the
// admin listener only: 404, saying where it is.
func adminOnly(what string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{
			"outcome": "not_served",
			"error":   what + " is served on the admin listener (--admin-listen), not on the public port",
		})
	}
}

// pprofHandler serves net/http/pprof's profiles under /debug/pprof/.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
