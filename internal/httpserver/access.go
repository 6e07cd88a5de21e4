package httpserver

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RouteUnmatched is the route of a request no ServeMux pattern matched.
const RouteUnmatched = "unmatched"

// ObserveConfig configures Observe.
type ObserveConfig struct {
	// Logger receives one access line per request. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Requests, if set, counts requests by route and code.
	Requests *prometheus.CounterVec
	// Duration, if set, observes each request's duration by route.
	Duration *prometheus.HistogramVec
	// QuietRoutes are routes (ServeMux patterns, such as "GET /healthz")
	// logged at debug level, not info: probes and scrapes, which arrive
	// every few seconds. They are counted all the same.
	QuietRoutes []string
	// Codes, if set, counts requests by status code alone: a surface whose
	// requests are kept apart from Requests (the River UI).
	Codes *prometheus.CounterVec
	// QuietReads logs every GET and HEAD request answered below 500 at
	// debug level, not info: a UI's polls. Its changes stay at info.
	QuietReads bool
}

// Observe wraps h so that every request it answers is logged once and
// measured: its route, status, duration and, when its handler recorded
// them (SetTenant, SetOutcome), its tenant and outcome.
//
// The route is the pattern of the ServeMux that chose the handler
// (Request.Pattern, set on the request as the mux dispatches it; with
// nested muxes, the innermost), so its values are bounded by the routes
// served; a request no pattern matched is RouteUnmatched. The access line
// never carries a header, the query string or the body, nor the path of a
// request no route matched, so no token, Authorization header or
// signature reaches the log.
func Observe(h http.Handler, cfg ObserveConfig) http.Handler {
	logger := cmp.Or(cfg.Logger, slog.Default())
	quiet := make(map[string]bool, len(cfg.QuietRoutes))
	for _, r := range cfg.QuietRoutes {
		quiet[r] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &accessRecorder{ResponseWriter: w}
		defer func() {
			elapsed := time.Since(start)
			status := rec.statusCode()
			if v := recover(); v != nil {
				// net/http would log the panic and cut the connection; the
				// access line and the metrics say 500, and the panic goes on.
				status = http.StatusInternalServerError
				defer panic(v)
			}
			route := cmp.Or(r.Pattern, RouteUnmatched)
			if cfg.Requests != nil {
				cfg.Requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
			}
			if cfg.Duration != nil {
				cfg.Duration.WithLabelValues(route).Observe(elapsed.Seconds())
			}
			if cfg.Codes != nil {
				cfg.Codes.WithLabelValues(strconv.Itoa(status)).Inc()
			}
			level := slog.LevelInfo
			read := r.Method == http.MethodGet || r.Method == http.MethodHead
			if (quiet[route] || cfg.QuietReads && read) && status < http.StatusInternalServerError {
				level = slog.LevelDebug
			}
			if !logger.Enabled(r.Context(), level) {
				return
			}
			tenant, outcome := rec.annotations()
			attrs := []slog.Attr{slog.String("route", route), slog.String("method", r.Method)}
			if r.Pattern != "" {
				// Only the path of a route served: an unmatched one is
				// whatever the client sent.
				attrs = append(attrs, slog.String("path", truncate(r.URL.Path, maxLoggedPath)))
			}
			attrs = append(attrs, slog.Int("status", status), slog.Float64("duration_seconds", elapsed.Seconds()),
				slog.Int64("response_bytes", rec.bytes), slog.String("remote_addr", r.RemoteAddr))
			if tenant != "" {
				attrs = append(attrs, slog.String("tenant_id", tenant))
			}
			if outcome != "" {
				attrs = append(attrs, slog.String("outcome", outcome))
			}
			logger.LogAttrs(context.WithoutCancel(r.Context()), level, "http request", attrs...)
		}()
		h.ServeHTTP(rec, r)
	})
}

// maxLoggedPath bounds the path in an access line.
const maxLoggedPath = 256

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// SetTenant records, for the access line of the request answered through
// w, the tenant it acted for. Outside Observe it does nothing.
func SetTenant(w http.ResponseWriter, tenant string) {
	if rec := recorderOf(w); rec != nil {
		rec.mu.Lock()
		rec.tenant = tenant
		rec.mu.Unlock()
	}
}

// SetOutcome records, for the access line of the request answered through
// w, the outcome of its answer (enqueued, conflict, unauthorized…).
// Outside Observe it does nothing.
func SetOutcome(w http.ResponseWriter, outcome string) {
	if rec := recorderOf(w); rec != nil {
		rec.mu.Lock()
		rec.outcome = outcome
		rec.mu.Unlock()
	}
}

// recorderOf finds Observe's recorder in w or the writers it wraps.
func recorderOf(w http.ResponseWriter) *accessRecorder {
	for w != nil {
		if rec, ok := w.(*accessRecorder); ok {
			return rec
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
	return nil
}

// accessRecorder notes the status and size of an answer. Unwrap lets
// http.ResponseController reach the connection's writer (deadlines,
// flushes, hijacking).
type accessRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64

	mu              sync.Mutex
	tenant, outcome string
}

func (a *accessRecorder) WriteHeader(code int) {
	if a.status == 0 && code >= 200 {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *accessRecorder) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	n, err := a.ResponseWriter.Write(b)
	a.bytes += int64(n)
	return n, err
}

// Flush flushes the answer, if the writer underneath can.
func (a *accessRecorder) Flush() {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	_ = http.NewResponseController(a.ResponseWriter).Flush()
}

func (a *accessRecorder) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// statusCode is the status answered: 200 if the handler wrote nothing.
func (a *accessRecorder) statusCode() int { return cmp.Or(a.status, http.StatusOK) }

func (a *accessRecorder) annotations() (tenant, outcome string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tenant, a.outcome
}
