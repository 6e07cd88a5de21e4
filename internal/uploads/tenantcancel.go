package uploads

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/jobs"
)

// tenantCancelBody is the optional body of a tenant's POST
// /v1/batches/{id}/cancel.
type tenantCancelBody struct {
	TenantID string `json:"tenant_id,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// tenantOf returns the tenant whose token r carries as a bearer token.
func (s *Server) tenantOf(r *http.Request) (string, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", false
	}
	return s.cfg.TenantTokens.Tenant(token)
}

// TenantCancel is POST /v1/batches/{id}/cancel on the public listener: a
// request carrying a tenant token is a tenant's cancel of its own batch
// (handleTenantCancel); any other goes to other (enqueue serve's answer
// that the operators' cancel is on the admin listener).
func (s *Server) TenantCancel(other http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := s.tenantOf(r)
		if !ok {
			other.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			s.refuse(w, routeCancel, http.StatusMethodNotAllowed, "invalid", "", "method not allowed: POST")
			return
		}
		s.handleTenantCancel(w, r, tenant)
	})
}

// handleTenantCancel serves a tenant's POST /v1/batches/{id}/cancel, with
// an optional body {"reason"[, "tenant_id"]}: it cancels the tenant's own
// batch when no delivery holds it — parked, or reserved and not yet
// started — through the operators' cancel (jobs.Enqueuer.Cancel, Tenant:
// the outbox announces it as any cancel; cancelled_by is tenant:<id>; no
// row of the operators' audit). Answers: 200 cancelled; 404 not_found
// (also another tenant's batch, as reads answer); 409 not_cancellable,
// reason leased (a delivery holds it: only operators cancel running work)
// or the batch is terminal already; 403 a body naming another tenant; 422
// invalid input; 400 malformed body; 429 rate limited; 503 database
// unavailable.
func (s *Server) handleTenantCancel(w http.ResponseWriter, r *http.Request, tenant string) {
	httpserver.SetTenant(w, tenant)
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		s.refuse(w, routeCancel, http.StatusUnprocessableEntity, "invalid", "batch_id", "must be a positive batch id")
		return
	}
	var cb tenantCancelBody
	if r.ContentLength != 0 {
		body, ok := s.readBody(w, r, routeCancel, s.cfg.MaxBodyBytes, "application/json")
		if !ok {
			return
		}
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cb); err != nil || dec.More() {
			msg := `body must be empty or one JSON object {["reason", "tenant_id"]}`
			if err != nil {
				msg += ": " + err.Error()
			}
			s.refuse(w, routeCancel, http.StatusBadRequest, "invalid", "", msg)
			return
		}
	}
	if cb.TenantID != "" && cb.TenantID != tenant {
		s.refuse(w, routeCancel, http.StatusForbidden, "forbidden", "tenant_id", "a tenant token cancels only its own tenant's batches")
		return
	}
	credential := "tenant:" + tenant
	if admission, delay := s.door.admit(credential, 1); admission == rateLimited {
		s.refuseRateLimited(w, routeCancel, credential, 1, delay)
		return
	}
	req := jobs.CancelRequest{BatchID: id, TenantID: tenant, Reason: cb.Reason, By: jobs.TenantActor(tenant), Tenant: true}
	if err := jobs.ValidateCancel(req); err != nil {
		var in *jobs.InputError
		errors.As(err, &in)
		s.refuse(w, routeCancel, http.StatusUnprocessableEntity, "invalid", in.Field, in.Reason)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	res, err := s.cfg.Enqueuer.Cancel(ctx, req)
	if err != nil {
		if r.Context().Err() != nil {
			s.cfg.Metrics.HTTPRequests.WithLabelValues(routeCancel, "client_closed").Inc()
			httpserver.SetOutcome(w, "client_closed")
			return
		}
		s.cfg.Logger.Error("tenant cancel failed: database unavailable", "error", err, "batch_id", id)
		s.reply(w, routeCancel, http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"})
		return
	}
	res.PreviousHolder = "" // an expired lease's holder is the platform's, not the tenant's
	switch res.Outcome {
	case jobs.OutcomeNotFound:
		s.reply(w, routeCancel, http.StatusNotFound, jobs.OutcomeNotFound, errorBody{Outcome: jobs.OutcomeNotFound, Error: "no such batch for this tenant"})
	case jobs.OutcomeNotCancellable:
		if res.Error == "" {
			res.Error = "batch " + strconv.FormatInt(id, 10) + " has ended (" + res.Status + "): nothing to cancel"
		}
		s.reply(w, routeCancel, http.StatusConflict, res.Outcome, res)
	default:
		s.reply(w, routeCancel, http.StatusOK, res.Outcome, res)
	}
}
