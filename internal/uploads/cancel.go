package uploads

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/httpserver"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
)

const routeCancel = metrics.RouteCancel // its ServeMux pattern, in metrics and logs

// OperatorHeader is a name an operator route's caller may give itself. It
// is no identity (who acts is the name the operator token carries): it is
// kept as a free-text note of the action in the operators' audit.
const OperatorHeader = "X-Fleet-Operator"

// cancelBody is the body of POST /v1/batches/{id}/cancel.
type cancelBody struct {
	TenantID string `json:"tenant_id"`
	Reason   string `json:"reason,omitempty"`
}

// handleCancel serves POST /v1/batches/{id}/cancel with a body
// {"tenant_id", "reason"}: the same operation as enqueue cancel, for
// operators only. The body's tenant_id is no authority (tenant ids are in
// S3 paths, batch ids are sequential): the caller must carry the operator
// token as a bearer token; the import token is refused 403. HTTP Basic is
// not accepted here, so a browser never sends credentials of its own to
// this route. Answers: 200 cancelled, 404 not_found (also another tenant's
// batch) or not_served (no operator token configured), 409 not_cancellable
// (terminal already), 422 invalid input, 400 malformed body, 401
// unauthenticated, 403 forbidden, 503 database unavailable.
func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	if tenant, ok := s.tenantOf(r); ok {
		s.handleTenantCancel(w, r, tenant) // a tenant's cancel of its own batch
		return
	}
	if s.cfg.OperatorTokens == nil {
		s.refuse(w, routeCancel, http.StatusNotFound, "not_served", "", notServed("POST /v1/batches/{id}/cancel"))
		return
	}
	operator, status, why := s.operatorRefusal(r, false)
	if status != 0 {
		s.refuse(w, routeCancel, status, outcomeOf(status), "", why)
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		s.refuse(w, routeCancel, http.StatusUnprocessableEntity, "invalid", "batch_id", "must be a positive batch id")
		return
	}
	body, ok := s.readBody(w, r, routeCancel, s.cfg.MaxBodyBytes, "application/json")
	if !ok {
		return
	}
	var cb cancelBody
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cb); err != nil || dec.More() {
		msg := `body must be one JSON object {"tenant_id"[, "reason"]}`
		if err != nil {
			msg += ": " + err.Error()
		}
		s.refuse(w, routeCancel, http.StatusBadRequest, "invalid", "", msg)
		return
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	actor := audit.Actor{Name: operator, Door: audit.DoorHTTP, Note: CallerNote(r.Header.Get(OperatorHeader), cmp.Or(host, r.RemoteAddr))}
	req := jobs.CancelRequest{BatchID: id, TenantID: cb.TenantID, Reason: cb.Reason, By: actor.By() + "@" + cmp.Or(host, r.RemoteAddr), Actor: actor}
	if err := jobs.ValidateCancel(req); err != nil {
		var in *jobs.InputError
		errors.As(err, &in)
		s.refuse(w, routeCancel, http.StatusUnprocessableEntity, "invalid", in.Field, in.Reason)
		return
	}
	httpserver.SetTenant(w, req.TenantID)
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	res, err := s.cfg.Operator.Cancel(ctx, req)
	if err != nil {
		if r.Context().Err() != nil {
			s.cfg.Logger.Info("client disconnected before the cancel finished", "route", routeCancel, "batch_id", id)
			s.cfg.Metrics.HTTPRequests.WithLabelValues(routeCancel, "client_closed").Inc()
			httpserver.SetOutcome(w, "client_closed")
			return
		}
		s.cfg.Logger.Error("cancel failed: database unavailable", "error", err, "batch_id", id)
		s.reply(w, routeCancel, http.StatusServiceUnavailable, "unavailable", errorBody{Outcome: "unavailable", Error: "database unavailable, retry later"})
		return
	}
	status = http.StatusOK
	switch res.Outcome {
	case jobs.OutcomeNotFound:
		status = http.StatusNotFound
	case jobs.OutcomeNotCancellable:
		status = http.StatusConflict
	}
	s.reply(w, routeCancel, status, res.Outcome, res)
}

// CallerNote is the audit note of an operator route's request: the name
// the caller gave itself (claimed, if any) and its address.
func CallerNote(claimed, address string) string {
	if claimed != "" {
		claimed = "says " + claimed
	}
	return audit.Notes(claimed, "from "+address)
}
