package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/uploads"
)

// TestRiverUIGateFailsClosed: the gate in front of the River UI passes
// reads, lets a queue's pause and resume through and logs them as operator
// actions (who: the operator the token named, which queue, River's
// answer) and records them in the operators' audit (the Basic user only
// as the note), and refuses 403, in the UI's
// error shape and naming what to use instead, every other change it does
// not know — none of which reaches the UI.
func TestRiverUIGateFailsClosed(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var reached []string
	answer := http.StatusOK
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, r.Method+" "+r.URL.Path)
		w.WriteHeader(answer)
	})
	pool := pgtest.NewPool(t)
	gate := &uiActions{ui: ui, pool: pool, log: slog.New(slog.NewJSONHandler(&logs, nil))}
	do := func(method, path string) *httptest.ResponseRecorder {
		reached = nil
		req := httptest.NewRequest(method, path, strings.NewReader(`{}`))
		req = req.WithContext(uploads.WithOperator(req.Context(), "ops")) // as OperatorOnly passes it
		req.SetBasicAuth("someone", "secret")
		rec := httptest.NewRecorder()
		gate.ServeHTTP(rec, req)
		return rec
	}

	for _, c := range []struct{ method, path string }{
		{"GET", "/riverui/"}, {"GET", "/riverui/api/jobs"}, {"GET", "/riverui/api/queues/fleet_ingest"},
		{"HEAD", "/riverui/assets/x.js"}, {"OPTIONS", "/riverui/api/jobs"},
	} {
		rec := do(c.method, c.path)
		require.Equal(t, http.StatusOK, rec.Code, "%v", c)
		require.Equal(t, []string{c.method + " " + c.path}, reached, "reads pass: %v", c)
	}
	require.Empty(t, logs.String(), "reads are no operator actions")

	for _, verb := range []string{"pause", "resume"} {
		rec := do("PUT", "/riverui/api/queues/fleet_ingest/"+verb)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, []string{"PUT /riverui/api/queues/fleet_ingest/" + verb}, reached)
		require.Contains(t, logs.String(), `"msg":"operator action","via":"riverui","action":"`+verb+`_queue","by":"riverui:ops@192.0.2.1","queue":"fleet_ingest","status":200`)
	}
	logs.Reset()
	answer = http.StatusNotFound
	rec := do("PUT", "/riverui/api/queues/nosuch/pause")
	require.Equal(t, http.StatusNotFound, rec.Code, "River's answer")
	require.Contains(t, logs.String(), `"msg":"operator action failed","via":"riverui","action":"pause_queue","by":"riverui:ops@192.0.2.1","queue":"nosuch","status":404`)
	entries, err := audit.List(context.Background(), pool, audit.Filter{})
	require.NoError(t, err)
	var got []string
	for _, e := range entries {
		require.Equal(t, "ops", e.Actor)
		require.Equal(t, audit.DoorRiverUI, e.Door)
		require.Equal(t, "says someone; from 192.0.2.1", e.Note)
		got = append(got, e.Action+":"+e.Queue+":"+e.Outcome)
	}
	require.Equal(t, []string{"queue_pause:nosuch:failed", "queue_resume:fleet_ingest:done", "queue_pause:fleet_ingest:done"}, got)

	for _, c := range []struct{ method, path string }{
		{"PATCH", "/riverui/api/queues/fleet_ingest"}, // a queue's concurrency: the workers' flags
		{"POST", "/riverui/api/queues/fleet_ingest/pause"},
		{"PUT", "/riverui/api/queues/fleet_ingest/pause/x"},
		{"PUT", "/riverui/api/queues//pause"},
		{"DELETE", "/riverui/api/jobs/1"},
		{"POST", "/riverui/api/workflows/cancel"}, // a route a later (or Pro) UI adds
		{"PUT", "/riverui/api/jobs/cancel"},
		{"POST", "/riverui/api/jobs/cancel/"},
	} {
		logs.Reset()
		rec := do(c.method, c.path)
		require.Equal(t, http.StatusForbidden, rec.Code, "%v", c)
		require.Empty(t, reached, "nothing of a refused change reaches the UI: %v", c)
		require.Equal(t, "application/json; charset=utf-8", rec.Header().Get("Content-Type"))
		var body struct{ Message string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
		require.Contains(t, body.Message, c.method+" "+c.path+" is not allowed through the River UI", "%v", c)
		require.Contains(t, body.Message, "use the enqueue commands", "%v", c)
		require.Contains(t, logs.String(), `"msg":"operator action refused","via":"riverui","action":"unknown","by":"riverui:ops@192.0.2.1","method":"`+c.method+`"`)
	}
}

// TestRiverUIRequestsAreApartFromTheDoors: on the admin listener's handler
// the River UI's requests are counted in ingest_riverui_requests_total by
// code and never in the door's ingest_http_requests_total or its duration
// histogram (which its alerts watch); its polls log at debug, its changes
// at info, and the door's requests are measured as before.
func TestRiverUIRequestsAreApartFromTheDoors(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	e := &cli.Env{Ctx: context.Background(), Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	m := metrics.NewServe()
	mux := http.NewServeMux()
	mux.HandleFunc("/riverui/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusForbidden)
		}
	})
	mux.HandleFunc("POST /v1/batches/{id}/cancel", func(http.ResponseWriter, *http.Request) {})
	h := apart(httpserver.Observe(mux, observeDoor(m, e)), httpserver.Observe(mux, observeRiverUI(m, e)))
	for _, r := range []struct{ method, path string }{
		{"GET", "/riverui/"}, {"GET", "/riverui/api/jobs"}, {"GET", "/riverui/api/states"}, {"PATCH", "/riverui/api/queues/q"}, {"POST", "/v1/batches/1/cancel"},
	} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(r.method, r.path, nil))
	}
	require.Equal(t, 3.0, testutil.ToFloat64(m.RiverUIRequests.WithLabelValues("200")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.RiverUIRequests.WithLabelValues("403")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.DoorRequests.WithLabelValues("POST /v1/batches/{id}/cancel", "200")))
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "ingest_http_requests_total" && f.GetName() != "ingest_http_request_duration_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				require.NotContains(t, l.GetValue(), "riverui", "%s: the River UI is not the door", f.GetName())
			}
		}
	}
	levels := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l struct{ Level, Msg, Method, Path string }
		require.NoError(t, json.Unmarshal([]byte(line), &l))
		require.Equal(t, "http request", l.Msg)
		levels[l.Method+" "+l.Path] = l.Level
	}
	require.Equal(t, map[string]string{
		"GET /riverui/": "DEBUG", "GET /riverui/api/jobs": "DEBUG", "GET /riverui/api/states": "DEBUG",
		"PATCH /riverui/api/queues/q": "INFO", "POST /v1/batches/1/cancel": "INFO",
	}, levels)
}
