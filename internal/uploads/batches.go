package uploads

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/batchview"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
)

// routeBatch and routeBatches name GET /v1/batches/{id} and GET
// /v1/batches in metrics and logs: their ServeMux patterns.
const (
	routeBatch   = metrics.RouteBatch
	routeBatches = metrics.RouteBatches
)

// BatchAnswer is the answer of GET /v1/batches/{id}: outcome "found" and
// the batch as enqueue status shows it (batchview.View: status, phase, the
// reason of a failure where one is named, the last error, progress, the
// summary of the objects its load read, its River jobs and retries).
type BatchAnswer struct {
	Outcome string `json:"outcome"`
	batchview.View
}

// handleBatch answers GET /v1/batches/{id}?tenant_id=T with the import
// token, or with a tenant token (tenant_id then optional, its tenant): the batch's BatchAnswer (200), not_found (404) for a batch that
// does not exist or is another tenant's, invalid (422) for a bad id or
// tenant id. It reads one row and writes nothing.
func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.importCallerOf(r)
	if !ok {
		s.refuse(w, routeBatch, http.StatusUnauthorized, "unauthorized", "", "missing or wrong bearer token")
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		s.refuse(w, routeBatch, http.StatusUnprocessableEntity, "invalid", "batch_id", "must be a positive batch id")
		return
	}
	tenant := r.URL.Query().Get("tenant_id")
	if caller.tenant != "" && tenant == "" {
		tenant = caller.tenant // a tenant token names its tenant
	}
	if err := batch.ValidateTenantID(tenant); err != nil {
		var verr *batch.ValidationError
		field, reason := "tenant_id", err.Error()
		if errors.As(err, &verr) {
			field, reason = verr.Field, verr.Reason
		}
		s.refuse(w, routeBatch, http.StatusUnprocessableEntity, "invalid", field, reason)
		return
	}
	httpserver.SetTenant(w, tenant)
	if admission, delay := s.door.admit(caller.credential, 1); admission == rateLimited {
		s.refuseRateLimited(w, routeBatch, caller.credential, 1, delay)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	b, err := batch.NewStore(s.cfg.Enqueuer.Pool).Get(ctx, id)
	switch {
	case errors.Is(err, batch.ErrNotFound) || (err == nil && (b.TenantID != tenant || (caller.tenant != "" && b.TenantID != caller.tenant))):
		// Another tenant's batch answers as a missing one: no existence
		// oracle for a tenant token (nor for the tenant_id a caller names).
		s.reply(w, routeBatch, http.StatusNotFound, jobs.OutcomeNotFound, errorBody{Outcome: jobs.OutcomeNotFound, Error: "no such batch for this tenant"})
		return
	case err != nil:
		if r.Context().Err() != nil {
			s.cfg.Metrics.HTTPRequests.WithLabelValues(routeBatch, "client_closed").Inc()
			httpserver.SetOutcome(w, "client_closed")
			return
		}
		s.cfg.Logger.Error("reading a batch failed: database unavailable", "error", err, "batch_id", id)
		s.reply(w, routeBatch, http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"})
		return
	}
	views := []batchview.View{batchview.Of(b, time.Now())}
	if err := addLinks(ctx, s.cfg.Enqueuer.Pool, views); err != nil {
		s.cfg.Logger.Error("reading a batch's jobs failed: database unavailable", "error", err, "batch_id", id)
		s.reply(w, routeBatch, http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"})
		return
	}
	s.reply(w, routeBatch, http.StatusOK, "found", BatchAnswer{Outcome: "found", View: views[0]})
}

// addLinks fills in views' River jobs, retries and superseding batch
// (batchview.AddLinks) and the paused queue a waiting batch waits in
// (queue_paused, as enqueue status shows it); a login that may not read
// river_queue shows no paused queue.
func addLinks(ctx context.Context, pool *pgxpool.Pool, views []batchview.View) error {
	if err := batchview.AddLinks(ctx, pool, views); err != nil {
		return err
	}
	var pgErr *pgconn.PgError
	if err := batchview.AddPausedQueues(ctx, pool, views); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42501") {
		return err
	}
	return nil
}

// BatchPage is the answer of GET /v1/batches: a page of the tenant's
// batches, newest first, the cursor of the next page (absent on the last),
// and, for one folder, its newest Succeeded batch.
type BatchPage struct {
	Outcome    string           `json:"outcome"`
	Batches    []batchview.View `json:"batches"`
	NextCursor string           `json:"next_cursor,omitempty"`
	// LastSucceededBatchID is the folder's newest Succeeded batch, when a
	// folder was asked for and it has one (it may be on no page of this
	// listing: another status or window).
	LastSucceededBatchID int64 `json:"last_succeeded_batch_id,omitempty"`
}

// handleBatches answers GET /v1/batches?[tenant_id=T][&folder=URL]
// [&status=S][&newest=true][&since=RFC3339][&until=RFC3339][&limit=N]
// [&cursor=C]: a page of the tenant's batches (the import token names the
// tenant, a tenant token is its own), newest first by reservation time,
// with the cursor of the next page. newest=true keeps each folder's newest
// batch only: with status=Failed, the folders whose newest batch failed.
// Bad parameters are 422 naming the field.
func (s *Server) handleBatches(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.importCallerOf(r)
	if !ok {
		s.refuse(w, routeBatches, http.StatusUnauthorized, "unauthorized", "", "missing or wrong bearer token")
		return
	}
	q := r.URL.Query()
	invalid := func(field, reason string) {
		s.refuse(w, routeBatches, http.StatusUnprocessableEntity, "invalid", field, reason)
	}
	f := batch.PageFilter{TenantID: q.Get("tenant_id")}
	switch {
	case caller.tenant != "" && f.TenantID == "":
		f.TenantID = caller.tenant
	case caller.tenant != "" && f.TenantID != caller.tenant:
		// Another tenant's batches are as absent as missing ones.
		s.reply(w, routeBatches, http.StatusOK, "found", BatchPage{Outcome: "found", Batches: []batchview.View{}})
		return
	}
	if err := batch.ValidateTenantID(f.TenantID); err != nil {
		invalid("tenant_id", err.Error())
		return
	}
	if v := q.Get("folder"); v != "" {
		fo, err := folder.Canonicalize(v)
		if err != nil {
			invalid("folder", err.Error())
			return
		}
		f.SourceScope = fo.Scope()
	}
	switch st := batch.Status(q.Get("status")); st {
	case "", batch.StatusRunning, batch.StatusSucceeded, batch.StatusFailed:
		f.Status = st
	default:
		invalid("status", "must be Running, Succeeded or Failed")
		return
	}
	for _, t := range []struct {
		field string
		into  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(t.field); v != "" {
			at, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				invalid(t.field, "must be an RFC 3339 time, such as 2026-12-03T10:00:00Z")
				return
			}
			*t.into = at
		}
	}
	switch q.Get("newest") {
	case "", "false":
	case "true":
		f.Newest = true
	default:
		invalid("newest", "must be true or false")
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > batch.MaxPageSize {
			invalid("limit", fmt.Sprintf("must be between 1 and %d", batch.MaxPageSize))
			return
		}
		f.Limit = n
	}
	if v := q.Get("cursor"); v != "" {
		c, err := batch.ParseCursor(v)
		if err != nil {
			invalid("cursor", "not a cursor this listing gave out")
			return
		}
		f.After = &c
	}
	httpserver.SetTenant(w, f.TenantID)
	if admission, delay := s.door.admit(caller.credential, 1); admission == rateLimited {
		s.refuseRateLimited(w, routeBatches, caller.credential, 1, delay)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	store := batch.NewStore(s.cfg.Enqueuer.Pool)
	page, next, err := store.Page(ctx, f)
	var last []batch.Batch
	if err == nil && f.SourceScope != "" {
		last, _, err = store.Page(ctx, batch.PageFilter{TenantID: f.TenantID, SourceScope: f.SourceScope, Status: batch.StatusSucceeded, Limit: 1})
	}
	if err != nil {
		if r.Context().Err() != nil {
			s.cfg.Metrics.HTTPRequests.WithLabelValues(routeBatches, "client_closed").Inc()
			httpserver.SetOutcome(w, "client_closed")
			return
		}
		s.cfg.Logger.Error("listing batches failed: database unavailable", "error", err)
		s.reply(w, routeBatches, http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"})
		return
	}
	out := BatchPage{Outcome: "found", Batches: make([]batchview.View, 0, len(page))}
	now := time.Now()
	for _, b := range page {
		out.Batches = append(out.Batches, batchview.Of(b, now))
	}
	if err := addLinks(ctx, s.cfg.Enqueuer.Pool, out.Batches); err != nil {
		s.cfg.Logger.Error("listing batches' jobs failed: database unavailable", "error", err)
		s.reply(w, routeBatches, http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"})
		return
	}
	if next != nil {
		out.NextCursor = next.String()
	}
	if len(last) > 0 {
		out.LastSucceededBatchID = last[0].ID
	}
	s.reply(w, routeBatches, http.StatusOK, "found", out)
}
