package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/uploads"
)

// uiActions puts the River UI's job actions on ingest jobs through the
// batch protocol, so that the UI and the batch never disagree:
//
//   - Cancel on a job of a Running batch cancels the batch, as enqueue
//     cancel does (fenced: lease revoked, Failed with phase cancelled, every
//     job of the batch cancelled), recorded as by "riverui:<operator>@<address>"
//     (the operator is the name the operator token carries; the HTTP
//     Basic user name is no identity) with the reason "cancelled in the
//     River UI".
//   - Retry on a job whose batch is not Running is refused: re-running the
//     job would not run the batch (it would find it terminal and complete,
//     a green job for a batch that did not run). The answer names the
//     command that does: enqueue retry.
//   - Delete of a job of a Running batch is refused: the batch would wait
//     for the orphan sweeper; cancel it instead.
//
// The gate fails closed: read-only requests (GET, HEAD, OPTIONS) pass; the
// job actions above and a queue's pause and resume (PUT
// /api/queues/{name}/pause|resume) are the only changes it lets through.
// Each action it lets through is recorded in the operators' audit
// (internal/audit) with who: the operator the token names (the Basic user
// name is only the note): a cancel of a Running batch in the cancel's
// transaction, River's own actions once River answered.
// Pausing and resuming a queue is an operator action: allowed, and logged
// once with who (riverui:<operator>@<address>), the queue and River's answer,
// as every operator action is (jobs.OperatorLog). A paused queue shows:
// enqueue status and list name it for the batches waiting in it, the
// workers export ingest_queue_paused{queue} and FleetIngestQueuePaused
// fires after 15 minutes. Any other change (PATCH /api/queues/{name},
// which would set a queue's concurrency behind the workers' flags, and
// whatever route a later River UI adds) is refused 403, in the UI's error
// shape, naming what to use instead.
//
// Jobs that are not ingest jobs are the UI's own. An action on ingest jobs
// is logged once with who and what: a cancel by Enqueuer.Cancel, the rest
// here.
type uiActions struct {
	ui   http.Handler
	enq  *jobs.Enqueuer
	pool *pgxpool.Pool
	log  *slog.Logger
}

// uiActionBodyLimit bounds the body of a UI action (up to 1,000 job ids).
const uiActionBodyLimit = 64 << 10

// uiJob is a job named by a UI action, with its batch when it is an
// ingest job.
type uiJob struct {
	id          int64
	ingest      bool
	batchID     int64
	tenant      string
	batchStatus string
}

func (a *uiActions) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	action := ""
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		// Read-only: the pages, their assets and the API's polls.
		a.ui.ServeHTTP(w, r)
		return
	case http.MethodPost:
		switch r.URL.Path {
		case riverUIPrefix + "/api/jobs/cancel":
			action = "cancel"
		case riverUIPrefix + "/api/jobs/retry":
			action = "retry"
		case riverUIPrefix + "/api/jobs/delete":
			action = "delete"
		}
	case http.MethodPut:
		if queue, verb, ok := uiQueueAction(r.URL.Path); ok {
			a.queueAction(w, r, queue, verb)
			return
		}
	}
	if action == "" {
		a.refuse(w, r)
		return
	}
	actor, who := uiOperator(r)
	body, err := io.ReadAll(io.LimitReader(r.Body, uiActionBodyLimit+1))
	if err != nil || len(body) > uiActionBodyLimit {
		uiError(w, http.StatusBadRequest, "request body unreadable or over 64 KiB")
		return
	}
	var req struct {
		IDs []json.RawMessage `json:"ids"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.IDs) == 0 {
		uiError(w, http.StatusBadRequest, `body must be {"ids": [job ids]}`)
		return
	}
	ids := make([]int64, 0, len(req.IDs))
	for _, raw := range req.IDs {
		id, err := strconv.ParseInt(strings.Trim(string(raw), `"`), 10, 64)
		if err != nil || id <= 0 {
			uiError(w, http.StatusBadRequest, "job ids must be positive integers")
			return
		}
		ids = append(ids, id)
	}
	found, err := a.lookup(r, ids)
	if err != nil {
		a.log.Error("River UI action: reading the jobs failed", "action", action, "by", who, "error", err)
		uiError(w, http.StatusServiceUnavailable, "database unavailable, retry later")
		return
	}

	var rest []int64 // forwarded to the UI's own endpoint
	for _, id := range ids {
		j, ok := found[id]
		if !ok || !j.ingest {
			rest = append(rest, id)
			continue
		}
		running := j.batchStatus == string(batch.StatusRunning)
		switch action {
		case "cancel":
			if !running {
				rest = append(rest, id)
				continue
			}
			res, err := a.enq.Cancel(r.Context(), jobs.CancelRequest{
				BatchID: j.batchID, TenantID: j.tenant, By: who, Actor: actor,
				Reason: fmt.Sprintf("cancelled in the River UI (job %d)", id),
			})
			var inputErr *jobs.InputError
			if errors.As(err, &inputErr) {
				uiError(w, http.StatusBadRequest, fmt.Sprintf("cancelling batch %d of job %d: %s", j.batchID, id, err))
				return
			}
			if err != nil {
				a.log.Error("River UI cancel failed", "by", who, "job_id", id, "batch_id", j.batchID, "error", err)
				uiError(w, http.StatusServiceUnavailable, fmt.Sprintf("cancelling batch %d of job %d failed: database unavailable, retry later", j.batchID, id))
				return
			}
			if res.Outcome != jobs.OutcomeCancelled {
				rest = append(rest, id) // terminal meanwhile: the job is River's
			}
		case "retry":
			if !running {
				a.log.Warn(jobs.OperatorLog+" refused", "via", "riverui", "action", "retry", "by", who, "job_id", id,
					"batch_id", j.batchID, "tenant_id", j.tenant, "batch_status", j.batchStatus)
				uiError(w, http.StatusBadRequest, fmt.Sprintf(
					"Job %d belongs to batch %d, which is %s: retrying the job would not run the batch. "+
						"Retry the batch with: enqueue retry --batch-id %d --tenant-id %q", id, j.batchID, j.batchStatus, j.batchID, j.tenant))
				return
			}
			rest = append(rest, id)
		case "delete":
			if running {
				a.log.Warn(jobs.OperatorLog+" refused", "via", "riverui", "action", "delete", "by", who, "job_id", id,
					"batch_id", j.batchID, "tenant_id", j.tenant)
				uiError(w, http.StatusBadRequest, fmt.Sprintf(
					"Job %d is a delivery of batch %d, which is Running: deleting it would leave the batch to the orphan sweeper. "+
						"Cancel the batch instead (Cancel, or enqueue cancel --batch-id %d --tenant-id %q).", id, j.batchID, j.batchID, j.tenant))
				return
			}
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
		return
	}
	a.log.Warn(jobs.OperatorLog, "via", "riverui", "action", action, "by", who, "job_ids", rest)
	fwd, _ := json.Marshal(map[string][]string{"ids": int64Strings(rest)})
	r2 := r.Clone(r.Context())
	r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(fwd)), int64(len(fwd))
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	a.ui.ServeHTTP(rec, r2)
	a.record(r, audit.Action{Actor: actor, Action: "job_" + action, Outcome: uiOutcome(rec.status),
		Details: map[string]any{"job_ids": rest, "status": rec.status}})
}

// uiOutcome is the audit outcome of an action River's UI answered with
// status.
func uiOutcome(status int) string {
	if status >= 300 {
		return "failed"
	}
	return "done"
}

// record writes an action River's UI carried out (in River's own
// transaction, which has committed by now) to the operators' audit. A
// failure to record is logged: the action cannot be taken back.
func (a *uiActions) record(r *http.Request, act audit.Action) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	if err := audit.Record(ctx, a.pool, act); err != nil {
		a.log.Error("River UI action done but not recorded in the operators' audit", "action", act.Action, "by", act.Actor.By(), "queue", act.Queue, "error", err)
	}
}

// uiQueueAction parses a queue action's path,
// /riverui/api/queues/{name}/pause or …/resume.
func uiQueueAction(path string) (queue, verb string, ok bool) {
	rest, ok := strings.CutPrefix(path, riverUIPrefix+"/api/queues/")
	if !ok {
		return "", "", false
	}
	queue, verb, ok = strings.Cut(rest, "/")
	if !ok || queue == "" || strings.Contains(verb, "/") || verb != "pause" && verb != "resume" {
		return "", "", false
	}
	return queue, verb, true
}

// queueAction lets the UI pause or resume queue and logs it as an operator
// action, with River's answer.
func (a *uiActions) queueAction(w http.ResponseWriter, r *http.Request, queue, verb string) {
	actor, who := uiOperator(r)
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	a.ui.ServeHTTP(rec, r)
	attrs := []any{"via", "riverui", "action", verb + "_queue", "by", who, "queue", queue, "status", rec.status}
	if rec.status >= 300 {
		a.log.Warn(jobs.OperatorLog+" failed", attrs...)
	} else {
		a.log.Warn(jobs.OperatorLog, attrs...)
	}
	a.record(r, audit.Action{Actor: actor, Action: "queue_" + verb, Outcome: uiOutcome(rec.status), Queue: queue,
		Details: map[string]any{"status": rec.status}})
}

// statusRecorder keeps the status code of an answer.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// refuse answers a change the gate does not know: 403, nothing forwarded.
func (a *uiActions) refuse(w http.ResponseWriter, r *http.Request) {
	_, who := uiOperator(r)
	a.log.Warn(jobs.OperatorLog+" refused", "via", "riverui", "action", "unknown", "by", who, "method", r.Method, "path", truncatePath(r.URL.Path))
	uiError(w, http.StatusForbidden, fmt.Sprintf(
		"%s %s is not allowed through the River UI: it changes River's state behind the batches. "+
			"The UI may cancel, retry and delete jobs (through the batch) and pause or resume a queue; "+
			"for anything else use the enqueue commands (enqueue cancel, retry, resume) or the workers' flags (--concurrency).",
		r.Method, truncatePath(r.URL.Path)))
}

// truncatePath bounds a path that comes from the client, for a log line
// or an answer.
func truncatePath(p string) string {
	if len(p) > 200 {
		return p[:200] + "…"
	}
	return p
}

func (a *uiActions) lookup(r *http.Request, ids []int64) (map[int64]uiJob, error) {
	found := map[int64]uiJob{}
	rows, err := a.pool.Query(r.Context(), `
		SELECT j.id, b.id IS NOT NULL, COALESCE(b.id, 0), COALESCE(b.tenant_id, ''), COALESCE(b.status, '')
		FROM river_job j
		LEFT JOIN ingestion_batches b ON j.kind = $2 AND b.id = (j.args->>'batch_id')::bigint
		WHERE j.id = ANY($1)`, ids, jobs.IngestArgs{}.Kind())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var j uiJob
		if err := rows.Scan(&j.id, &j.ingest, &j.batchID, &j.tenant, &j.batchStatus); err != nil {
			return nil, err
		}
		found[j.id] = j
	}
	return found, rows.Err()
}

// uiOperator is who asks: the operator the request's token names
// (uploads.OperatorOf), through the River UI, with what the browser says of
// itself (the HTTP Basic user name, else the X-Fleet-Operator header) and
// its address as the note; and how the action's log line and a cancel
// name them, "riverui:<operator>@<address>".
func uiOperator(r *http.Request) (audit.Actor, string) {
	user, _, _ := r.BasicAuth()
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	address := cmp.Or(host, r.RemoteAddr)
	name, _ := uploads.OperatorOf(r.Context())
	actor := audit.Actor{Name: name, Door: audit.DoorRiverUI, Note: uploads.CallerNote(cmp.Or(user, r.Header.Get(uploads.OperatorHeader)), address)}
	return actor, actor.By() + "@" + address
}

// uiError answers in the River UI's own error shape, which it shows.
func uiError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"message": msg})
}

func int64Strings(ids []int64) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return out
}
