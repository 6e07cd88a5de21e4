package uploads

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/jobs"
)

// routeBatch is GET /v1/batches/{id}'s name in metrics and logs.
const routeBatch = "batch"

// BatchAnswer is the answer of GET /v1/batches/{id}: how the batch stands
// or how it ended — its status and phase, the reason of a failure where one
// is named (folder_incomplete, bad_records), the last error, and the
// summary of the objects its load read.
type BatchAnswer struct {
	Outcome     string                `json:"outcome"`
	BatchID     int64                 `json:"batch_id"`
	TenantID    string                `json:"tenant_id"`
	SourceScope string                `json:"source_scope"`
	Status      string                `json:"status"`
	Phase       string                `json:"phase,omitempty"`
	Reason      string                `json:"reason,omitempty"`
	Error       string                `json:"error,omitempty"`
	RecordCount int64                 `json:"record_count,omitempty"`
	Objects     *batch.ObjectsSummary `json:"objects,omitempty"`
	StartedAt   time.Time             `json:"started_at"`
	CompletedAt *time.Time            `json:"completed_at,omitempty"`
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
	s.reply(w, routeBatch, http.StatusOK, "found", answerOf(b))
}

// answerOf is the BatchAnswer of b; details this build cannot read leave
// the phase and what follows from it out.
func answerOf(b batch.Batch) BatchAnswer {
	a := BatchAnswer{Outcome: "found", BatchID: b.ID, TenantID: b.TenantID, SourceScope: b.Scope(), Status: string(b.Status),
		StartedAt: b.StartedAt, CompletedAt: b.CompletedAt}
	d, err := batch.ParseDetails(b.Details)
	if err != nil {
		return a
	}
	a.Phase, a.RecordCount, a.Objects = string(d.Phase), d.RecordCount, d.Objects
	if d.LastError != nil && b.Status != batch.StatusSucceeded {
		a.Reason, a.Error = string(d.LastError.Reason), d.LastError.Message
	}
	return a
}
