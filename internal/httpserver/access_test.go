package httpserver

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a log sink handlers write to from their goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		out = append(out, m)
	}
	return out
}

// TestObserveLogsAndMeasuresEveryRequest: each request through Observe
// gives one access line with its route (the mux pattern, the innermost
// of nested muxes), status, duration and what the handler recorded
// (tenant, outcome); it is counted by route and code and timed by route.
// Unmatched paths share one route, probes log at debug level, and no
// token, signature or query string reaches the log.
func TestObserveLogsAndMeasuresEveryRequest(t *testing.T) {
	t.Parallel()
	inner := http.NewServeMux()
	inner.HandleFunc("POST /v1/batches/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		SetTenant(w, "acme")
		SetOutcome(w, "not_cancellable")
		w.WriteHeader(http.StatusConflict)
	})
	inner.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	inner.HandleFunc("GET /boom", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "failed", http.StatusInternalServerError)
	})
	outer := http.NewServeMux()
	outer.Handle("/", inner)

	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total"}, []string{"route", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "duration_seconds"}, []string{"route"})
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := start(t, Config{Handler: Observe(outer, ObserveConfig{
		Logger: logger, Requests: requests, Duration: duration, QuietRoutes: []string{"GET /healthz"},
	})})
	base := "http://" + s.Addr().String()

	const secret = "s3cr3t-token-value"
	do := func(method, path string, body io.Reader) int {
		req, err := http.NewRequest(method, base+path, body)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("X-Fleet-Signature", "sha256="+secret)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	require.Equal(t, http.StatusConflict, do("POST", "/v1/batches/42/cancel?token="+secret, strings.NewReader(`{"tenant_id":"acme"}`)))
	require.Equal(t, http.StatusOK, do("GET", "/healthz", nil))
	require.Equal(t, http.StatusInternalServerError, do("GET", "/boom", nil))
	require.Equal(t, http.StatusNotFound, do("GET", "/no/such/"+secret, nil))
	require.Equal(t, http.StatusNotFound, do("GET", "/another", nil))

	require.Equal(t, 1.0, testutil.ToFloat64(requests.WithLabelValues("POST /v1/batches/{id}/cancel", "409")))
	require.Equal(t, 1.0, testutil.ToFloat64(requests.WithLabelValues("GET /healthz", "200")))
	require.Equal(t, 1.0, testutil.ToFloat64(requests.WithLabelValues("GET /boom", "500")))
	require.Equal(t, 2.0, testutil.ToFloat64(requests.WithLabelValues(RouteUnmatched, "404")))
	require.Equal(t, 4, testutil.CollectAndCount(requests), "routes are patterns, never paths")
	require.Equal(t, 4, testutil.CollectAndCount(duration))

	lines := logs.lines(t)
	require.Len(t, lines, 4, "one line per request; the probe only at debug level")
	cancel := lines[0]
	require.Equal(t, "http request", cancel["msg"])
	require.Equal(t, "POST /v1/batches/{id}/cancel", cancel["route"])
	require.Equal(t, "/v1/batches/42/cancel", cancel["path"])
	require.Equal(t, float64(409), cancel["status"])
	require.Equal(t, "acme", cancel["tenant_id"])
	require.Equal(t, "not_cancellable", cancel["outcome"])
	require.Greater(t, cancel["duration_seconds"], 0.0)
	require.Equal(t, float64(500), lines[1]["status"])
	require.Equal(t, RouteUnmatched, lines[2]["route"])
	for _, l := range lines {
		for key := range l {
			require.NotContains(t, strings.ToLower(key), "authorization")
			require.NotContains(t, strings.ToLower(key), "signature")
		}
	}
	require.NotContains(t, logs.b.String(), secret, "no token, signature or query string in the access log")
}

// TestObserveRecordsThroughWrappers: SetOutcome finds Observe's record
// through writers that wrap it (with Unwrap), and a handler that writes
// nothing is logged as 200.
func TestObserveRecordsThroughWrappers(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /quiet", func(w http.ResponseWriter, _ *http.Request) {
		SetOutcome(wrapped{w}, "ignored")
	})
	s := start(t, Config{Handler: Observe(mux, ObserveConfig{Logger: logger})})
	res, err := http.Get("http://" + s.Addr().String() + "/quiet")
	require.NoError(t, err)
	res.Body.Close()
	lines := logs.lines(t)
	require.Len(t, lines, 1)
	require.Equal(t, float64(200), lines[0]["status"])
	require.Equal(t, "ignored", lines[0]["outcome"])
	require.NotContains(t, lines[0], "tenant_id")
}

type wrapped struct{ http.ResponseWriter }

func (w wrapped) Unwrap() http.ResponseWriter { return w.ResponseWriter }
