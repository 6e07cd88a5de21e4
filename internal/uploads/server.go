// Package uploads is the HTTP listener that turns upload notifications into
// imports: POST /v1/imports with an explicit request, POST /v1/events/s3 with
// an S3 event notification (plain, in an SNS envelope, or from EventBridge).
// Both go through the enqueue command line's code path (jobs.Enqueuer) and
// answer with the same JSON outcomes; the folders one notification completes
// are imported as one burst (Enqueuer.ImportMany: one transaction), each
// record keeping its own answer.
//
// Status codes: 202 enqueued, 200 already_succeeded or ignored, 409
// conflict, 422 invalid input or unmapped folder, 400 malformed body, 401
// unauthenticated, 413 body too large, 415 wrong content type, 500 enqueue
// failure (the batch is recorded Failed), 503 database unavailable.
package uploads

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
)

// Defaults of Config.
const (
	MarkerDefault          = "_SUCCESS"
	MaxBodyBytesDefault    = 1 << 20
	SignatureMaxAgeDefault = 5 * time.Minute
	RequestTimeoutDefault  = 30 * time.Second
	// SignatureHeader carries "sha256=" + hex(HMAC-SHA256(secret, timestamp + "." + body)).
	SignatureHeader = "X-Fleet-Signature"
	// TimestampHeader carries the signing time in Unix seconds.
	TimestampHeader = "X-Fleet-Timestamp"
)

// Config configures the listener.
type Config struct {
	Enqueuer *jobs.Enqueuer
	// Pool is pinged by /readyz.
	Pool *pgxpool.Pool
	// AuthToken is the bearer token every /v1 request must carry. Required
	// unless InsecureNoAuth.
	AuthToken      string
	InsecureNoAuth bool
	// HMACSecret, if set, also authenticates /v1/events/s3 requests signed
	// with SignatureHeader and TimestampHeader.
	HMACSecret []byte
	// SignatureMaxAge bounds the age of a signature, which is accepted once.
	// Defaults to 5 minutes.
	SignatureMaxAge time.Duration
	// Marker is the object whose creation completes a folder. Defaults to
	// "_SUCCESS".
	Marker  string
	Mapping Mapping
	// MaxBodyBytes defaults to 1 MiB.
	MaxBodyBytes int64
	// RequestTimeout bounds the database work of one request. Defaults to 30 s.
	RequestTimeout time.Duration
	Metrics        *metrics.Metrics
	Logger         *slog.Logger
}

// Server serves the upload notification API.
type Server struct {
	cfg    Config
	ready  atomic.Bool
	replay *replayCache
}

// New validates cfg and returns a server, not yet ready (see SetReady).
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Enqueuer == nil:
		return nil, errors.New("uploads: Enqueuer is required")
	case cfg.AuthToken == "" && !cfg.InsecureNoAuth:
		return nil, errors.New("uploads: an auth token is required (or explicitly allow no auth)")
	}
	if err := cfg.Mapping.Validate(); err != nil {
		return nil, err
	}
	if cfg.Marker == "" {
		cfg.Marker = MarkerDefault
	}
	if strings.Contains(cfg.Marker, "/") {
		return nil, errors.New("uploads: the marker must be an object name, not a path")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = MaxBodyBytesDefault
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
	return &Server{cfg: cfg, replay: &replayCache{seen: map[string]time.Time{}}}, nil
}

// SetReady says whether /readyz may answer ready (false while shutting down).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Handler returns the HTTP handler of every route.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/imports", s.handleImport)
	mux.HandleFunc("POST /v1/events/s3", s.handleS3Event)
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
	if s.cfg.Pool != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.cfg.Pool.Ping(ctx); err != nil {
			http.Error(w, "not ready: database unreachable", http.StatusServiceUnavailable)
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
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (s *Server) refuse(w http.ResponseWriter, route string, status int, outcome, field, msg string) {
	s.cfg.Logger.Warn("request refused", "route", route, "status", status, "outcome", outcome, "field", field, "error", msg)
	s.reply(w, route, status, outcome, errorBody{Outcome: outcome, Field: field, Error: msg})
}

// readBody checks the content type and reads at most MaxBodyBytes. On
// failure it has already answered.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, route string, types ...string) ([]byte, bool) {
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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		s.refuse(w, route, http.StatusRequestEntityTooLarge, "invalid", "", fmt.Sprintf("body larger than %d bytes", s.cfg.MaxBodyBytes))
		return nil, false
	}
	if err != nil {
		s.refuse(w, route, http.StatusBadRequest, "invalid", "", "reading body: "+err.Error())
		return nil, false
	}
	return body, true
}

func (s *Server) bearerOK(r *http.Request) bool {
	if s.cfg.InsecureNoAuth && s.cfg.AuthToken == "" {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && s.cfg.AuthToken != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.AuthToken)) == 1
}

// signatureOK verifies an HMAC signature over timestamp "." body, within the
// allowed age, and accepts each signature once.
func (s *Server) signatureOK(r *http.Request, body []byte) (bool, string) {
	sig, ts := r.Header.Get(SignatureHeader), r.Header.Get(TimestampHeader)
	if len(s.cfg.HMACSecret) == 0 || sig == "" || ts == "" {
		return false, "missing credentials"
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false, "bad timestamp"
	}
	age := time.Since(time.Unix(sec, 0))
	if age > s.cfg.SignatureMaxAge || age < -time.Minute {
		return false, "signature expired"
	}
	mac := hmac.New(sha256.New, s.cfg.HMACSecret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return false, "bad signature"
	}
	if !s.replay.first(sig, time.Unix(sec, 0).Add(s.cfg.SignatureMaxAge+time.Minute)) {
		return false, "signature already used"
	}
	return true, ""
}

// Sign returns the signature headers for body at t, for clients and tests.
func Sign(secret, body []byte, t time.Time) (signature, timestamp string) {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil)), ts
}

// replayCache remembers signatures until they expire.
type replayCache struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

const maxReplayEntries = 100_000

func (c *replayCache) first(sig string, until time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if exp, ok := c.seen[sig]; ok && exp.After(now) {
		return false
	}
	if len(c.seen) >= maxReplayEntries {
		for k, exp := range c.seen {
			if !exp.After(now) {
				delete(c.seen, k)
			}
		}
		if len(c.seen) >= maxReplayEntries {
			return false // refuse rather than forget: callers retry later
		}
	}
	c.seen[sig] = until
	return true
}

// statusOf maps an import outcome to its HTTP status.
func statusOf(outcome string) int {
	switch outcome {
	case jobs.OutcomeEnqueued:
		return http.StatusAccepted
	case jobs.OutcomeConflict:
		return http.StatusConflict
	case jobs.OutcomeEnqueueFailed:
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// importOne runs one import and returns the HTTP status, metric outcome and
// body for it.
func (s *Server) importOne(ctx context.Context, req jobs.ImportRequest) (int, string, any) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	res, err := s.cfg.Enqueuer.Import(ctx, req)
	var in *jobs.InputError
	switch {
	case errors.As(err, &in):
		return http.StatusUnprocessableEntity, "invalid", errorBody{Outcome: "invalid_input", Field: in.Field, Error: in.Reason}
	case err != nil:
		s.cfg.Logger.Error("import failed: database unavailable", "error", err, "tenant_id", req.TenantID)
		return http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"}
	}
	return statusOf(res.Outcome), res.Outcome, res
}

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
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	answers := make([]answer, len(reqs))
	results, err := s.cfg.Enqueuer.ImportMany(ctx, reqs)
	if err != nil {
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
		answers[i] = answer{statusOf(res.Outcome), res.Outcome, res}
	}
	return answers
}

const (
	routeImports = "imports"
	routeEvents  = "events_s3"
)

func (s *Server) handleImport(w http.ResponseWriter, r *http.Request) {
	if !s.bearerOK(r) {
		s.refuse(w, routeImports, http.StatusUnauthorized, "unauthorized", "", "missing or wrong bearer token")
		return
	}
	body, ok := s.readBody(w, r, routeImports, "application/json")
	if !ok {
		return
	}
	var req jobs.ImportRequest
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || dec.More() {
		msg := "body must be one JSON object {tenant_id, tenant_database, company_id, folder[, reimport]}"
		if err != nil {
			msg += ": " + err.Error()
		}
		s.refuse(w, routeImports, http.StatusBadRequest, "invalid", "", msg)
		return
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
	status int
}

// severity orders statuses so a multi-record answer reports its worst.
var severity = map[int]int{
	http.StatusOK: 0, http.StatusAccepted: 1, http.StatusConflict: 2,
	http.StatusUnprocessableEntity: 3, http.StatusInternalServerError: 4, http.StatusServiceUnavailable: 5,
}

func (s *Server) handleS3Event(w http.ResponseWriter, r *http.Request) {
	bearer := s.bearerOK(r)
	if !bearer && len(s.cfg.HMACSecret) == 0 {
		s.refuse(w, routeEvents, http.StatusUnauthorized, "unauthorized", "", "missing or wrong bearer token")
		return
	}
	// SNS delivers with Content-Type text/plain.
	body, ok := s.readBody(w, r, routeEvents, "application/json", "text/plain")
	if !ok {
		return
	}
	if !bearer {
		if ok, why := s.signatureOK(r, body); !ok {
			s.refuse(w, routeEvents, http.StatusUnauthorized, "unauthorized", "", "unauthenticated: "+why)
			return
		}
	}
	events, err := ParseS3Event(body)
	if err != nil {
		s.refuse(w, routeEvents, http.StatusBadRequest, "invalid", "", err.Error())
		return
	}
	results := make([]eventResult, 0, len(events))
	// The folders an event completes are imported together: one burst,
	// one transaction (jobs.Enqueuer.ImportMany).
	var (
		burst   []jobs.ImportRequest
		burstAt []int // burst[k] answers results[burstAt[k]]
	)
	for _, ev := range events {
		res := eventResult{Bucket: ev.Bucket, Key: ev.Key, status: http.StatusOK}
		dir, isMarker := folderOf(ev.Key, s.cfg.Marker)
		switch {
		case !ev.Created || !isMarker:
			res.Outcome = "ignored"
			s.cfg.Metrics.HTTPRequests.WithLabelValues(routeEvents, "ignored").Inc()
		default:
			target, err := s.cfg.Mapping.Resolve(ev.Bucket, dir)
			if err != nil {
				res.Outcome, res.Reason, res.status = "unmapped", err.Error(), http.StatusUnprocessableEntity
				s.cfg.Metrics.HTTPRequests.WithLabelValues(routeEvents, "unmapped").Inc()
				s.cfg.Logger.Warn("upload notification for an unmapped folder", "bucket", ev.Bucket, "key", ev.Key, "reason", err.Error())
				break
			}
			burst = append(burst, jobs.ImportRequest{
				TenantID: target.TenantID, TenantDatabase: target.TenantDatabase, CompanyID: target.CompanyID, Folder: target.Folder,
			})
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
	worst := http.StatusOK
	for _, res := range results {
		if severity[res.status] > severity[worst] {
			worst = res.status
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(worst)
	_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
}
