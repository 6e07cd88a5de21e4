// Package uploads is the HTTP listener that turns upload notifications into
// imports: POST /v1/imports with an explicit request, POST /v1/events/s3 with
// an S3 event notification (plain, in an SNS envelope, or from EventBridge).
// Both go through the enqueue command line's code path (jobs.Enqueuer) and
// answer with the same JSON outcomes; the folders one notification completes
// are imported as one burst (Enqueuer.ImportMany: one transaction), each
// record keeping its own answer. With Config.GroupLinger, concurrent
// requests share a burst too (group commit, jobs.Grouper), each request
// keeping its own answer.
//
// Trust boundary. The bearer token is shared by every caller, so it proves
// only that a caller may ask for imports, not which tenant it speaks for:
//
//   - an HTTP import is an S3 import of the folder's own tenant. Only
//     s3:// folders are accepted (file:// and mem:// only with
//     Config.AllowLocalFolders, for development); the bucket must be in
//     Mapping.Buckets when that is set; the tenant, database and company
//     come from the folder's path (Mapping.Pattern), and a body naming
//     others is refused 422 with the field. Refusals write nothing.
//   - /v1/events/s3 also accepts, instead of the token, an HMAC signature
//     (X-Fleet-Timestamp, X-Fleet-Signature) or an Amazon SNS message
//     signature from an accepted topic (SNSConfig). A signature is valid
//     for a bounded time and accepted once across every replica and restart
//     (ReplayStore, in PostgreSQL).
//   - operator routes act on any tenant's work: POST
//     /v1/batches/{id}/cancel, and the River UI behind OperatorOnly. They
//     need an operator token (Config.OperatorTokens), never the
//     import token (403); a body's tenant_id is no authority. Without an
//     operator token they are not served (404). The River UI, which
//     browsers open with HTTP Basic credentials they then attach to every
//     request, refuses changes a page of another site could have sent
//     (crossSiteRefusal).
//
// Status codes: 202 enqueued, 200 already_succeeded, ignored or
// late_object (a data object of a folder already published), 409
// conflict, 422 invalid input or unmapped folder, 400 malformed body, 401
// unauthenticated, 403 the import token on an operator route (or a
// cross-site change in the River UI), 404 an operator route without an
// operator token, 413 body too large, 415 wrong content type, 500 enqueue
// failure (the batch is recorded Failed), 503 database unavailable.
package uploads

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/s3events"
)

// Defaults of Config.
const (
	MarkerDefault       = "_SUCCESS"
	MaxBodyBytesDefault = 1 << 20
	// SignedMaxBodyBytesDefault bounds a body read before its signature is
	// checked: 64 KiB. An S3 notification of one object is 1 to 3 KiB, its
	// SNS envelope about 2 KiB more.
	SignedMaxBodyBytesDefault = 64 << 10
	SignatureMaxAgeDefault    = 5 * time.Minute
	RequestTimeoutDefault     = 30 * time.Second
	// SignatureHeader carries "sha256=" + hex(HMAC-SHA256(secret, timestamp + "." + body)).
	SignatureHeader = "X-Fleet-Signature"
	// TimestampHeader carries the signing time in Unix seconds.
	TimestampHeader = "X-Fleet-Timestamp"
)

// Config configures the listener.
type Config struct {
	// Enqueuer imports the folders of the import and event routes.
	Enqueuer *jobs.Enqueuer
	// Operator runs the operator routes' actions (the cancel route), on a
	// login allowed to change batches (fleet_operator in
	// deploy/postgres/roles.sql); the door's login may not. Defaults to
	// Enqueuer.
	Operator *jobs.Enqueuer
	// Pool is pinged by /readyz (unless Reachable is set) and holds the
	// replay records of signed requests. Required when HMACSecret,
	// HMACSecrets or SNS is set.
	Pool *pgxpool.Pool
	// Reachable, if set, is asked by /readyz instead of pinging Pool
	// whether the database is reached: the process's cached answer
	// (dbhealth.Monitor.Ready), so that while the database is unreachable
	// a probe answers 503 at once, saying so, without waiting on it or
	// adding a query of its own.
	Reachable func() error
	// Schema, if set, is asked by /readyz whether the database's schema is
	// current for this build (migrations.RequireCurrent): an error answers
	// 503 "not ready: " and the error, so a door never reports ready where
	// its imports would fail.
	Schema func(context.Context) error
	// AuthToken is the import token: the bearer token every /v1 import
	// request must carry. It or ImportTokens is required unless
	// InsecureNoAuth.
	AuthToken string
	// ImportTokens, in place of AuthToken, are the import tokens in force,
	// every one accepted: old and new during a rotation, read again from
	// a file by enqueue serve (--auth-token-file). With none in force
	// (a file that cannot be read) no import token is accepted, even with
	// InsecureNoAuth.
	ImportTokens   SecretValues
	InsecureNoAuth bool
	// OperatorTokens are the only credentials of the operator routes (POST
	// /v1/batches/{id}/cancel, the River UI), which act on any tenant's
	// work, each naming its operator (who acts, in the operators' audit).
	// None may be AuthToken or HMACSecret. Nil (and no OperatorToken): the
	// operator routes answer 404. InsecureNoAuth never opens them.
	OperatorTokens *OperatorTokens
	// OperatorToken, if set and OperatorTokens is nil, is one operator
	// token, of operator LegacyOperatorName (the former way to give it).
	OperatorToken string
	// HMACSecret, if set, also authenticates /v1/events/s3 requests signed
	// with SignatureHeader and TimestampHeader.
	HMACSecret []byte
	// HMACSecrets, in place of HMACSecret, are the HMAC secrets in force:
	// a signature by any one is accepted (old and new during a rotation;
	// enqueue serve's --hmac-secret-file, read again). With none in force
	// signed requests are refused.
	HMACSecrets SecretValues
	// SignatureMaxAge bounds the age of an HMAC signature, which is
	// accepted once. Defaults to 5 minutes.
	SignatureMaxAge time.Duration
	// SNS, if set, also authenticates /v1/events/s3 requests by their
	// Amazon SNS message signature.
	SNS *SNSConfig
	// AllowLocalFolders admits file:// and mem:// folders in POST
	// /v1/imports, imported as the body's tenant. Development only: it lets
	// any holder of the token load any directory the process can read.
	AllowLocalFolders bool
	// Marker is the object whose creation completes a folder. Defaults to
	// "_SUCCESS".
	Marker string
	// ImportsWithoutMarker makes POST /v1/imports load a folder without
	// its completion marker when the body does not say (no_marker
	// absent); a body's "no_marker": false still requires it. Default
	// false: the marker is required, as on every other door.
	ImportsWithoutMarker bool
	// TenantTokens, if set, are tokens of one tenant each: POST
	// /v1/imports with one imports only its tenant's folders (another's
	// is 403), GET /v1/batches/{id} reads only its tenant's batches
	// (another's is 404, as a missing one); the event route does not take
	// them.
	TenantTokens *TenantTokens
	// MaxBadRecords is the tolerance of bad records of a POST /v1/imports
	// body that does not say (max_bad_records absent), and of the imports
	// notifications make; 0 (the default): the first bad record fails a
	// batch.
	MaxBadRecords int
	Mapping       folder.Mapping
	// MaxBodyBytes bounds the body of a request that carries the import
	// token, which is checked before the body is read. Defaults to 1 MiB.
	MaxBodyBytes int64
	// SignedMaxBodyBytes bounds the body of a request without the import
	// token (HMAC- or SNS-signed), which must be read before its signature
	// can be checked: an unauthenticated sender can make the listener read
	// this much. Defaults to SignedMaxBodyBytesDefault (64 KiB), and is
	// never more than MaxBodyBytes. SNS allows messages of up to 256 KiB;
	// raise it (to about 300 KiB: the message is JSON-escaped inside its
	// envelope) only for topics that carry messages larger than S3's.
	SignedMaxBodyBytes int64
	// RateLimit is the sustained rate, in folders per second, at which one
	// credential (the import token, the HMAC secret, one SNS topic) may
	// start imports; every authenticated request takes one token per folder
	// it would start, at least one, and RateBurst bounds how many at once
	// (and so in one request). Over the rate a request is answered 429
	// with Retry-After (503 to SNS, which retries only 5xx) and nothing is
	// imported; over the burst it is refused 422. Requests that fail
	// authentication take nothing. Zero turns the limit off; enqueue
	// serve defaults to RateLimitDefault.
	RateLimit float64
	// RateBurst defaults to RateBurstDefault when RateLimit is set.
	RateBurst int
	// RequestTimeout bounds the database work of one request. Defaults to 30 s.
	RequestTimeout time.Duration
	// GroupLinger turns on group commit (jobs.Grouper): imports of
	// concurrent requests share one transaction, and a request waits at
	// most this long for others (and only while another group's
	// transaction is in flight). Each request keeps its own answer. Zero
	// (the default here; enqueue serve defaults to
	// jobs.GroupLingerDefault) gives every request a transaction of its
	// own.
	GroupLinger time.Duration
	// GroupMax bounds the folders of one group. Defaults to
	// jobs.GroupMaxDefault.
	GroupMax int
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
}

// Server serves the upload notification API.
type Server struct {
	cfg    Config
	ready  atomic.Bool
	replay *ReplayStore
	sns    *snsVerifier
	door   *doorLimiter
	// imports runs the imports: through group commit when GroupLinger is
	// set, else one transaction per request.
	imports *jobs.Grouper
	// batches finds the published folders of data-object events
	// (s3events.FindLateObjects), through the Enqueuer's pool; nil without
	// one.
	batches s3events.LatestFinder
}

// operators are the operator tokens of c: OperatorTokens, or the one
// OperatorToken, or nil.
func (c Config) operators() *OperatorTokens {
	if c.OperatorTokens == nil && c.OperatorToken != "" {
		return StaticOperatorToken(LegacyOperatorName, c.OperatorToken)
	}
	return c.OperatorTokens
}

// anyOperatorToken says whether a value of set is one of ops.
func anyOperatorToken(ops *OperatorTokens, set SecretValues) bool {
	found := false
	for _, v := range currentValues(set) {
		if _, ok := ops.Operator(string(v)); ok {
			found = true
		}
	}
	return found
}

// ConfigError is a Config that Validate refuses; Setting names the field.
type ConfigError struct {
	Setting string
	Reason  string
}

func (e *ConfigError) Error() string { return "uploads: " + e.Setting + ": " + e.Reason }

// Validate checks the settings that need no database, all but Enqueuer and
// Pool, which New checks too: a command calls it before it connects or
// starts anything. Its errors are *ConfigError.
func (c Config) Validate() error {
	refuse := func(setting, reason string) error { return &ConfigError{Setting: setting, Reason: reason} }
	switch {
	case c.AuthToken == "" && c.ImportTokens == nil && !c.InsecureNoAuth:
		return refuse("AuthToken", "an auth token is required (or explicitly allow no auth)")
	case c.AuthToken != "" && c.ImportTokens != nil:
		return refuse("AuthToken", "set AuthToken or ImportTokens, not both")
	case len(c.HMACSecret) > 0 && c.HMACSecrets != nil:
		return refuse("HMACSecret", "set HMACSecret or HMACSecrets, not both")
	case c.MaxBadRecords < 0 || c.MaxBadRecords > folder.MaxBadRecordsCap:
		return refuse("MaxBadRecords", fmt.Sprintf("the tolerance of bad records must be between 0 and %d", folder.MaxBadRecordsCap))
	case anyOperatorToken(c.operators(), c.importTokens()):
		return refuse("OperatorToken", "the operator token must differ from the import token")
	case anyOperatorToken(c.operators(), c.hmacSecrets()):
		return refuse("OperatorToken", "the operator token must differ from the HMAC secret")
	case strings.Contains(c.Marker, "/"):
		return refuse("Marker", "the marker must be an object name, not a path")
	case c.RequestTimeout < 0:
		return refuse("RequestTimeout", "must not be negative")
	case c.SignedMaxBodyBytes < 0:
		return refuse("SignedMaxBodyBytes", "must not be negative")
	case c.RateLimit < 0 || math.IsNaN(c.RateLimit) || math.IsInf(c.RateLimit, 0):
		return refuse("RateLimit", "must be a non-negative number (0 turns the limit off)")
	case c.RateBurst < 0:
		return refuse("RateBurst", "must not be negative")
	case c.GroupLinger < 0:
		return refuse("GroupLinger", "must not be negative (0 turns group commit off)")
	case c.GroupMax < 0 || c.GroupMax > jobs.MaxBurst:
		return refuse("GroupMax", fmt.Sprintf("must be between 1 and %d", jobs.MaxBurst))
	}
	if err := c.Mapping.Validate(); err != nil {
		return refuse("Mapping", err.Error())
	}
	if c.SNS != nil {
		if err := c.SNS.validate(); err != nil {
			return refuse("SNS", err.Error())
		}
	}
	return nil
}

// New validates cfg and returns a server, not yet ready (see SetReady).
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Enqueuer == nil:
		return nil, errors.New("uploads: Enqueuer is required")
	case (len(cfg.HMACSecret) > 0 || cfg.HMACSecrets != nil || cfg.SNS != nil) && cfg.Pool == nil:
		return nil, errors.New("uploads: signed requests need the database (Pool) for replay protection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// From here on the credentials are their sets: ImportTokens and
	// HMACSecrets (nil: not configured).
	cfg.ImportTokens, cfg.HMACSecrets = cfg.importTokens(), cfg.hmacSecrets()
	if cfg.Marker == "" {
		cfg.Marker = MarkerDefault
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = MaxBodyBytesDefault
	}
	if cfg.SignedMaxBodyBytes <= 0 {
		cfg.SignedMaxBodyBytes = SignedMaxBodyBytesDefault
	}
	cfg.SignedMaxBodyBytes = min(cfg.SignedMaxBodyBytes, cfg.MaxBodyBytes)
	if cfg.RateLimit > 0 && cfg.RateBurst <= 0 {
		cfg.RateBurst = RateBurstDefault
	}
	if cfg.SignatureMaxAge <= 0 {
		cfg.SignatureMaxAge = SignatureMaxAgeDefault
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = RequestTimeoutDefault
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Operator == nil {
		cfg.Operator = cfg.Enqueuer
	}
	cfg.OperatorTokens = cfg.operators()
	s := &Server{cfg: cfg, door: newDoorLimiter(cfg.RateLimit, cfg.RateBurst)}
	s.imports = jobs.NewGrouper(cfg.Enqueuer, jobs.GroupConfig{
		Linger: cfg.GroupLinger, Max: cfg.GroupMax, Timeout: cfg.RequestTimeout,
		Metrics: metrics.NewImportGroups(cfg.Metrics.Registry),
	})
	if cfg.Pool != nil {
		s.replay = NewReplayStore(cfg.Pool)
	}
	if cfg.Enqueuer.Pool != nil {
		s.batches = batch.NewStore(cfg.Enqueuer.Pool)
	}
	if cfg.SNS != nil {
		v, err := newSNSVerifier(*cfg.SNS)
		if err != nil {
			return nil, err
		}
		s.sns = v
	}
	return s, nil
}

// SetReady says whether /readyz may answer ready (false while shutting down).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// PruneReplays deletes expired replay records every interval until ctx
// ends. Every replica may run it.
func (s *Server) PruneReplays(ctx context.Context, every time.Duration) {
	if s.replay == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		n, err := s.replay.Prune(qctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			s.cfg.Logger.Warn("pruning replay records failed", "error", err)
		case n > 0:
			s.cfg.Logger.Debug("pruned replay records", "count", n)
		}
	}
}

// Handler returns the HTTP handler of every route.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/imports", s.handleImport)
	mux.HandleFunc("POST /v1/events/s3", s.handleS3Event)
	mux.HandleFunc("GET /v1/batches/{id}", s.handleBatch)
	mux.HandleFunc("GET /v1/batches", s.handleBatches)
	mux.HandleFunc("POST /v1/batches/{id}/cancel", s.handleCancel)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Metrics.Registry, promhttp.HandlerOpts{Registry: s.cfg.Metrics.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", s.handleReady)
	return mux
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	switch {
	case s.cfg.Reachable != nil:
		if err := s.cfg.Reachable(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	case s.cfg.Pool != nil:
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.cfg.Pool.Ping(ctx); err != nil {
			http.Error(w, "not ready: database unreachable", http.StatusServiceUnavailable)
			return
		}
	}
	if s.cfg.Schema != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.cfg.Schema(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	fmt.Fprintln(w, "ready")
}

// errorBody is the JSON body of refusals.
type errorBody struct {
	Outcome string `json:"outcome"`
	Field   string `json:"field,omitempty"`
	Error   string `json:"error"`
}

func (s *Server) reply(w http.ResponseWriter, route string, status int, outcome string, body any) {
	s.cfg.Metrics.HTTPRequests.WithLabelValues(route, outcome).Inc()
	httpserver.SetOutcome(w, outcome)
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (s *Server) refuse(w http.ResponseWriter, route string, status int, outcome, field, msg string) {
	s.cfg.Logger.Warn("request refused", "route", route, "status", status, "outcome", outcome, "field", field, "error", msg)
	s.reply(w, route, status, outcome, errorBody{Outcome: outcome, Field: field, Error: msg})
}

// readBody checks the content type and reads at most limit bytes. On
// failure it has already answered.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, route string, limit int64, types ...string) ([]byte, bool) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	ok := err == nil
	if ok {
		ok = false
		for _, t := range types {
			ok = ok || mt == t
		}
	}
	if !ok {
		s.refuse(w, route, http.StatusUnsupportedMediaType, "invalid", "", "Content-Type must be "+strings.Join(types, " or "))
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		s.refuse(w, route, http.StatusRequestEntityTooLarge, "invalid", "", fmt.Sprintf("body larger than %d bytes", limit))
		return nil, false
	}
	if err != nil {
		s.refuse(w, route, http.StatusBadRequest, "invalid", "", "reading body: "+err.Error())
		return nil, false
	}
	return body, true
}

// statusOf maps an import outcome to its HTTP status.
func statusOf(outcome string) int {
	switch outcome {
	case jobs.OutcomeEnqueued:
		return http.StatusAccepted
	case jobs.OutcomeConflict, jobs.OutcomeResumable:
		return http.StatusConflict
	case jobs.OutcomeEnqueueFailed:
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// importOne runs one import and returns the HTTP status, metric outcome and
// body for it.
func (s *Server) importOne(ctx context.Context, req jobs.ImportRequest) (int, string, any) {
	client := ctx
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	res, err := s.imports.Import(ctx, req)
	var in *jobs.InputError
	switch {
	case errors.As(err, &in):
		return http.StatusUnprocessableEntity, "invalid", errorBody{Outcome: "invalid_input", Field: in.Field, Error: in.Reason}
	case err != nil && client.Err() != nil:
		// The client went away (its request context ended): not a database
		// outage. Its transaction was abandoned; it may retry.
		s.cfg.Logger.Info("client disconnected before the import finished", "tenant_id", req.TenantID, "error", err)
		return statusClientClosed, "client_closed", errorBody{Outcome: "client_closed", Error: "client disconnected"}
	case err != nil:
		s.cfg.Logger.Error("import failed: database unavailable", "error", err, "tenant_id", req.TenantID)
		return http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"}
	}
	s.addHint(ctx, &res)
	return statusOf(res.Outcome), res.Outcome, inertResult(res)
}

// ReasonParked is the reason of a conflict whose batch is parked: no
// delivery works on it until it is cancelled or resumed.
const ReasonParked = "parked"

// addHint tells an HTTP caller what it can do about a conflict or an
// already_succeeded answer, in terms of the API (JSON fields, routes),
// not of the command line. A conflict with a parked batch says so
// (reason parked): the folder stays held until the batch is cancelled
// (POST /v1/batches/{id}/cancel, which a tenant token may use on its own
// parked batch) or an operator resumes it.
func (s *Server) addHint(ctx context.Context, res *jobs.Result) {
	switch res.Outcome {
	case jobs.OutcomeAlreadySucceeded:
		res.Hint = fmt.Sprintf(`batch %d already loaded this folder successfully; to load it again, import with "reimport": true`, res.BatchID)
	case jobs.OutcomeConflict:
		id := res.RunningBatchID
		res.Hint = fmt.Sprintf("batch %d holds this folder and is still running; wait for its outcome (GET /v1/batches/%d) and import again if needed", id, id)
		if s.cfg.Enqueuer.Pool == nil || id == 0 {
			return
		}
		b, err := batch.NewStore(s.cfg.Enqueuer.Pool).Get(ctx, id)
		if err != nil || !b.Parked() {
			return // the generic hint stands
		}
		res.Reason = ReasonParked
		res.Hint = fmt.Sprintf("batch %d holds this folder and is parked: no delivery works on it until it is freed; "+
			"cancel it (POST /v1/batches/%d/cancel with your tenant token) and import again, or ask an operator to resume it", id, id)
	}
}

// enqueueFailedError is what a sender is told of a failed job insert. The
// database's own message (which names tables, constraints and values) goes
// to the log and the batch's details, not to whoever sent the request.
const enqueueFailedError = "the job could not be enqueued; the batch is recorded Failed (failed_enqueue) and the folder is free to import again"

// inertResult is res as an HTTP answer: a failed enqueue's database error
// is replaced by enqueueFailedError.
func inertResult(res jobs.Result) jobs.Result {
	if res.Outcome == jobs.OutcomeEnqueueFailed {
		res.Error = enqueueFailedError
	}
	return res
}

// statusClientClosed answers a request whose client disconnected (nginx's
// 499); nobody reads it, but logs and metrics say what happened.
const statusClientClosed = 499

// answer is the HTTP status, metric outcome and body of one import.
type answer struct {
	status  int
	outcome string
	body    any
}

// importMany imports a burst in one transaction and answers each request as
// importOne would.
func (s *Server) importMany(ctx context.Context, reqs []jobs.ImportRequest) []answer {
	if len(reqs) == 0 {
		return nil
	}
	client := ctx
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	answers := make([]answer, len(reqs))
	results, err := s.imports.ImportMany(ctx, reqs)
	switch {
	case err != nil && client.Err() != nil:
		// The client went away: not a database outage (see importOne).
		s.cfg.Logger.Info("client disconnected before the imports finished", "imports", len(reqs), "error", err)
		for i := range answers {
			answers[i] = answer{statusClientClosed, "client_closed", errorBody{Outcome: "client_closed", Error: "client disconnected"}}
		}
		return answers
	case err != nil:
		s.cfg.Logger.Error("import failed: database unavailable", "error", err, "imports", len(reqs))
		for i := range answers {
			answers[i] = answer{http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"}}
		}
		return answers
	}
	for i, res := range results {
		if res.Outcome == jobs.OutcomeInvalidInput {
			answers[i] = answer{http.StatusUnprocessableEntity, "invalid", errorBody{Outcome: res.Outcome, Field: res.Field, Error: res.Error}}
			continue
		}
		answers[i] = answer{statusOf(res.Outcome), res.Outcome, inertResult(res)}
	}
	return answers
}

const (
	routeImports = metrics.RouteImports // the ServeMux patterns, in metrics and logs
	routeEvents  = metrics.RouteEventsS3
)

func (s *Server) handleImport(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.importCallerOf(r)
	if !ok {
		s.refuse(w, routeImports, http.StatusUnauthorized, "unauthorized", "", "missing or wrong bearer token")
		return
	}
	body, ok := s.readBody(w, r, routeImports, s.cfg.MaxBodyBytes, "application/json")
	if !ok {
		return
	}
	var in ImportBody
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil || dec.More() {
		msg := "body must be one JSON object {folder[, tenant_id, tenant_database, company_id, reimport, no_marker, max_bad_records]}"
		if err != nil {
			msg += ": " + err.Error()
		}
		s.refuse(w, routeImports, http.StatusBadRequest, "invalid", "", msg)
		return
	}
	req, refusal := ResolveImportWith(s.cfg.Mapping, in, ImportRules{AllowLocal: s.cfg.AllowLocalFolders, WithoutMarker: s.cfg.ImportsWithoutMarker, MaxBadRecords: s.cfg.MaxBadRecords})
	httpserver.SetTenant(w, req.TenantID)
	if refusal != nil {
		s.cfg.Logger.Warn("import refused", "field", refusal.Field, "error", refusal.Reason)
		s.reply(w, routeImports, http.StatusUnprocessableEntity, "invalid", errorBody{Outcome: "invalid_input", Field: refusal.Field, Error: refusal.Reason})
		return
	}
	if caller.tenant != "" && req.TenantID != caller.tenant {
		s.refuse(w, routeImports, http.StatusForbidden, "forbidden", "tenant_id", "a tenant token imports only its own tenant's folders")
		return
	}
	switch admission, delay := s.door.admit(caller.credential, 1); admission {
	case rateLimited:
		s.refuseRateLimited(w, routeImports, caller.credential, 1, delay)
		return
	case overBurst: // not with a burst of at least one
	}
	status, outcome, res := s.importOne(r.Context(), req)
	s.reply(w, routeImports, status, outcome, res)
}

// eventResult is the answer for one object event.
type eventResult struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	jobs.Result
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason,omitempty"`
	// IgnoredReason says why an ignored event completes no folder
	// (s3events.IgnoredReasons).
	IgnoredReason string `json:"ignored_reason,omitempty"`
	status        int
}

// severity orders statuses so a multi-record answer reports its worst.
var severity = map[int]int{
	http.StatusOK: 0, http.StatusAccepted: 1, http.StatusConflict: 2,
	http.StatusUnprocessableEntity: 3, http.StatusInternalServerError: 4, http.StatusServiceUnavailable: 5,
	statusClientClosed: 6,
}

func (s *Server) handleS3Event(w http.ResponseWriter, r *http.Request) {
	// Refuse what can be refused before the body is read: a wrong bearer
	// token, HMAC headers without a secret, no credentials where only the
	// token is accepted. What is left is read with the small limit of a
	// body whose signature is yet to be checked.
	bearer := s.bearerOK(r)
	signedHMAC := r.Header.Get(SignatureHeader) != "" || r.Header.Get(TimestampHeader) != ""
	_, hasBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	limit := s.cfg.MaxBodyBytes
	if !bearer {
		var why string
		switch {
		case hasBearer:
			why = "missing or wrong bearer token"
		case signedHMAC && s.cfg.HMACSecrets == nil:
			why = "unauthenticated: HMAC signatures are not accepted (no --hmac-secret-file)"
		case !signedHMAC && s.sns == nil:
			why = "missing or wrong bearer token"
		}
		if why != "" {
			s.refuse(w, routeEvents, http.StatusUnauthorized, "unauthorized", "", why)
			return
		}
		limit = s.cfg.SignedMaxBodyBytes
	}
	// SNS delivers with Content-Type text/plain.
	body, ok := s.readBody(w, r, routeEvents, limit, "application/json", "text/plain")
	if !ok {
		return
	}
	var credential, replayKey string
	var maxAge time.Duration
	switch {
	case bearer:
		credential = s.bearerCredential()
	case signedHMAC:
		key, why := s.hmacOK(r, body)
		if why != "" {
			s.refuse(w, routeEvents, http.StatusUnauthorized, "unauthorized", "", "unauthenticated: "+why)
			return
		}
		credential, replayKey, maxAge = "hmac", key, s.cfg.SignatureMaxAge
	}
	n, err := s3events.ReadNotification(body)
	if err != nil {
		s.refuse(w, routeEvents, http.StatusBadRequest, "invalid", "", err.Error())
		return
	}
	msg, isSNS := n.SNS()
	if isSNS && msg.Type != s3events.SNSNotification {
		s.handleSNSControl(w, r, msg, credential != "")
		return
	}
	if credential == "" {
		// Only an SNS signature is left to authenticate the request.
		status, outcome, why := s.snsOK(r.Context(), n)
		if why != "" {
			if status == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			s.refuse(w, routeEvents, status, outcome, "", why)
			return
		}
		credential, replayKey, maxAge = "sns:"+msg.TopicArn, snsReplayKey(msg), s.sns.cfg.MaxAge
	}
	events, err := n.Events()
	if err != nil {
		s.refuse(w, routeEvents, http.StatusBadRequest, "invalid", "", err.Error())
		return
	}
	plans := s3events.PlanEvents(events, s.cfg.Marker, s.cfg.Mapping)
	folders := 0
	for _, p := range plans {
		if p.Outcome == "" {
			folders++
		}
	}
	var claimed ReplayClaim
	if replayKey != "" {
		// Claimed before the rate limit is consulted: a replay is refused
		// without spending its credential's budget.
		var status int
		var why string
		claimed, status, why = s.claim(r.Context(), replayKey, maxAge)
		if why != "" {
			outcome := "unauthorized"
			if status == http.StatusServiceUnavailable {
				outcome = "unavailable"
			}
			s.refuse(w, routeEvents, status, outcome, "", why)
			return
		}
	}
	switch admission, delay := s.door.admit(credential, folders); admission {
	case overBurst:
		s.releaseClaim(claimed)
		reason := fmt.Sprintf("this request would start %d folders; one request may start at most %d (--rate-burst)", folders, s.cfg.RateBurst)
		s.cfg.Logger.Warn("upload notification refused", "credential", credential, "folders", folders, "reason", reason)
		s.reply(w, routeEvents, http.StatusUnprocessableEntity, "invalid", errorBody{Outcome: "invalid_input", Field: "Records", Error: reason})
		return
	case rateLimited:
		// The sender may retry with the same signature.
		s.releaseClaim(claimed)
		s.refuseRateLimited(w, routeEvents, credential, folders, delay)
		return
	}
	s.importPlans(w, r, plans, claimed)
}

// importPlans imports the folders of an authenticated notification and
// answers for each of its records; claimed is the replay claim of its
// signature (zero without one), released when the answer asks the sender
// to retry.
func (s *Server) importPlans(w http.ResponseWriter, r *http.Request, plans []s3events.Planned, claimed ReplayClaim) {
	s.findLateObjects(r.Context(), plans)
	results := make([]eventResult, 0, len(plans))
	// The folders an event completes are imported together: one burst,
	// one transaction (jobs.Enqueuer.ImportMany).
	var (
		burst   []jobs.ImportRequest
		burstAt []int // burst[k] answers results[burstAt[k]]
	)
	s.countIgnored(plans)
	for _, p := range plans {
		res := eventResult{Bucket: p.Bucket, Key: p.Key, status: p.Status}
		if p.Outcome != "" {
			res.Outcome, res.Field, res.Reason, res.IgnoredReason = p.Outcome, p.Field, p.Reason, p.IgnoredReason
			metric := p.Outcome
			if metric == "invalid_input" {
				metric = "invalid"
			}
			s.cfg.Metrics.HTTPRequests.WithLabelValues(routeEvents, metric).Inc()
			res.BatchID = p.BatchID
			if p.Outcome != "ignored" && p.Outcome != s3events.OutcomeLateObject {
				s.cfg.Logger.Warn("upload notification refused", "bucket", p.Bucket, "key", p.Key, "outcome", p.Outcome, "field", p.Field, "reason", p.Reason)
			}
		} else {
			p.Request.MaxBadRecords = s.cfg.MaxBadRecords
			burst = append(burst, p.Request)
			burstAt = append(burstAt, len(results))
		}
		results = append(results, res)
	}
	for k, answer := range s.importMany(r.Context(), burst) {
		res := &results[burstAt[k]]
		s.cfg.Metrics.HTTPRequests.WithLabelValues(routeEvents, answer.outcome).Inc()
		res.status = answer.status
		switch b := answer.body.(type) {
		case jobs.Result:
			res.Result = b
		case errorBody:
			res.Outcome, res.Field, res.Reason = b.Outcome, b.Field, b.Error
		}
	}
	worst, worstOutcome, tenant := http.StatusOK, "", ""
	for i, res := range results {
		if severity[res.status] > severity[worst] || (worstOutcome == "" && res.status == worst) {
			worst, worstOutcome = res.status, res.Outcome
		}
		if i < len(plans) && plans[i].Request.TenantID != "" {
			if tenant == "" || tenant == plans[i].Request.TenantID {
				tenant = plans[i].Request.TenantID
			} else {
				tenant = "(several)"
			}
		}
	}
	httpserver.SetOutcome(w, worstOutcome)
	httpserver.SetTenant(w, tenant)
	if worst >= http.StatusInternalServerError || worst == statusClientClosed {
		// The sender retries a 5xx (or after hanging up) with the same
		// signature: let it through.
		s.releaseClaim(claimed)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(worst)
	_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
}

// countIgnored counts the ignored events of a request by reason
// (ingest_events_ignored_total) and logs the first of an unknown shape
// (an event name or eventSource no store is known to send) with what
// the store sent, once per request.
func (s *Server) countIgnored(plans []s3events.Planned) {
	logged := false
	for _, p := range plans {
		if p.Outcome != "ignored" {
			continue
		}
		s.cfg.Metrics.EventsIgnored.WithLabelValues(metrics.DoorEvents, p.IgnoredReason).Inc()
		if !logged && (p.IgnoredReason == s3events.IgnoredUnknownEvent || p.IgnoredReason == s3events.IgnoredUnknownSource) {
			logged = true
			s.cfg.Logger.Warn("object event of an unknown shape ignored", "door", metrics.DoorEvents, "bucket", p.Bucket, "key", p.Key,
				"ignored_reason", p.IgnoredReason, "reason", p.Reason)
		}
	}
}

// findLateObjects marks the events for data objects of folders already
// published late_object (one look-up for the request), and counts and
// logs each such folder once. A failed look-up leaves them ignored, as
// they were before: the answer does not depend on it, and reconcile finds
// the changed folder all the same.
func (s *Server) findLateObjects(ctx context.Context, plans []s3events.Planned) {
	if s.batches == nil {
		return
	}
	late, err := s3events.FindLateObjects(ctx, s.batches, plans)
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Logger.Warn("could not look up the folders of data-object events; answered ignored", "error", err.Error())
		}
		return
	}
	s.cfg.Metrics.LateObjectEvents.WithLabelValues(metrics.DoorEvents).Add(float64(len(late)))
	s3events.LogLateFolders(s.cfg.Logger, metrics.DoorEvents, late)
}

// bearerCredential names the credential of a request that passed
// bearerOK, for the rate limit.
func (s *Server) bearerCredential() string {
	if s.cfg.ImportTokens == nil {
		return "no_auth"
	}
	return "import_token"
}

// isSNSCredential reports whether a rate-limit credential is an SNS topic.
func isSNSCredential(credential string) bool { return strings.HasPrefix(credential, "sns:") }

// snsOK authenticates n, an SNS notification, by its signature: from an
// accepted topic (checked first, so an unknown topic never makes the
// listener fetch anything), valid, signed by SNS. It returns the status,
// outcome and reason of a refusal, or why == "".
func (s *Server) snsOK(ctx context.Context, n s3events.Notification) (status int, outcome, why string) {
	m, isSNS := n.SNS()
	switch {
	case !isSNS || s.sns == nil || m.Signature == "":
		return http.StatusUnauthorized, "unauthorized", "unauthenticated: missing credentials"
	case !s.sns.topicAccepted(m.TopicArn):
		return http.StatusUnauthorized, "unauthorized", fmt.Sprintf("unauthenticated: SNS topic %q is not accepted", m.TopicArn)
	}
	switch err := s.sns.verify(ctx, m); {
	case errors.Is(err, errSNSCertFetchLimited), errors.Is(err, errSNSCertUnavailable):
		return http.StatusServiceUnavailable, "unavailable", err.Error()
	case err != nil:
		return http.StatusUnauthorized, "unauthorized", "unauthenticated: SNS " + err.Error()
	}
	return 0, "", ""
}

// claim records a verified signature's replay key, so that it is accepted
// once, and returns the claim, or the status and reason of the refusal.
func (s *Server) claim(ctx context.Context, key string, maxAge time.Duration) (c ReplayClaim, status int, why string) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	// Kept well past the signature's own validity, so clock skew between
	// this process and the database cannot reopen the window.
	c, first, err := s.replay.Claim(ctx, key, 2*maxAge+2*time.Minute)
	switch {
	case err != nil:
		s.cfg.Logger.Error("recording a signature failed: database unavailable", "error", err)
		return ReplayClaim{}, http.StatusServiceUnavailable, "database unavailable, retry later"
	case !first:
		return ReplayClaim{}, http.StatusUnauthorized, "unauthenticated: signature already used"
	}
	return c, 0, ""
}

// releaseClaim releases c, if any, for the sender's retry.
func (s *Server) releaseClaim(c ReplayClaim) {
	if c.token == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
	defer cancel()
	if _, err := s.replay.Release(ctx, c); err != nil {
		s.cfg.Logger.Warn("releasing a signature after a failed request failed: the sender's retry will be refused", "error", err)
	}
}

// handleSNSControl answers the SNS messages that carry no objects:
// subscription and unsubscribe confirmations. A subscription confirmation
// with a valid signature is logged with its topic and counted; it is
// confirmed when AutoConfirm is set and the topic is accepted.
func (s *Server) handleSNSControl(w http.ResponseWriter, r *http.Request, msg s3events.SNSMessage, authenticated bool) {
	logger := s.cfg.Logger.With("sns_type", msg.Type, "topic_arn", msg.TopicArn, "message_id", msg.MessageID)
	ignored := func(reason string) {
		s.reply(w, routeEvents, http.StatusOK, "ignored", map[string]string{"outcome": "ignored", "reason": reason})
	}
	confirmations := func(outcome string) {
		if msg.Type == s3events.SNSSubscriptionConfirmation && s.sns != nil {
			s.cfg.Metrics.SNSConfirmations.WithLabelValues(outcome).Inc()
		}
	}
	// The topic before the signature: verifying may fetch a certificate,
	// and a topic that is not accepted must make the listener fetch
	// nothing.
	var verr error
	switch {
	case s.sns == nil:
		verr = errors.New("SNS authentication is not configured (--sns-topic-arn)")
	case !s.sns.topicAccepted(msg.TopicArn):
		confirmations("topic_not_accepted")
		logger.Warn("SNS message for a topic that is not accepted: not verified, not confirmed; add the topic to --sns-topic-arn if it is expected")
		verr = fmt.Errorf("topic %q is not accepted", msg.TopicArn)
	default:
		verr = s.sns.verify(r.Context(), msg)
		if errors.Is(verr, errSNSCertFetchLimited) || errors.Is(verr, errSNSCertUnavailable) {
			w.Header().Set("Retry-After", "1")
			s.refuse(w, routeEvents, http.StatusServiceUnavailable, "unavailable", "", verr.Error())
			return
		}
		if verr != nil {
			confirmations("invalid")
		}
	}
	if verr != nil {
		if !authenticated {
			s.refuse(w, routeEvents, http.StatusUnauthorized, "unauthorized", "", "unauthenticated: SNS "+verr.Error())
			return
		}
		logger.Warn("SNS message not verified, ignored", "error", verr.Error())
		ignored("SNS message not verified: " + verr.Error())
		return
	}
	if msg.Type == s3events.SNSUnsubscribeConfirmation {
		logger.Warn("SNS unsubscribe confirmation received")
		ignored("unsubscribe confirmation")
		return
	}
	if !s.sns.cfg.AutoConfirm {
		s.cfg.Metrics.SNSConfirmations.WithLabelValues("unconfirmed").Inc()
		logger.Warn("SNS subscription confirmation received, not confirmed: confirm it in AWS if the topic is expected",
			"auto_confirm", s.sns.cfg.AutoConfirm)
		ignored("subscription not confirmed automatically")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), snsFetchTimeout)
	defer cancel()
	if err := s.sns.confirm(ctx, msg); err != nil {
		s.cfg.Metrics.SNSConfirmations.WithLabelValues("failed").Inc()
		logger.Error("confirming the SNS subscription failed", "error", err.Error())
		s.reply(w, routeEvents, http.StatusBadGateway, "error", errorBody{Outcome: "error", Error: "confirming the subscription failed"})
		return
	}
	s.cfg.Metrics.SNSConfirmations.WithLabelValues("confirmed").Inc()
	logger.Info("SNS subscription confirmed")
	s.reply(w, routeEvents, http.StatusOK, "ignored", map[string]string{"outcome": "confirmed", "topic_arn": msg.TopicArn})
}
