package uploads

import (
	"crypto/sha256"
	"crypto/subtle"
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// Operator routes act on any tenant's work: POST /v1/batches/{id}/cancel
// and the River UI (every tenant's jobs, with cancel, retry and delete).
// The import token (Config.AuthToken) is shared by every sender of upload
// notifications and proves only that a caller may ask for imports, so it
// never opens them (403): they need an operator token
// (Config.OperatorTokens), which names its operator (OperatorOf). Without
// one they are not served (404).

// tokenEqual compares a presented secret with the expected one in constant
// time, lengths included (both are hashed first). An empty expected secret
// matches nothing.
func tokenEqual(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return want != "" && subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// operatorRefusal returns the operator (the name the token carries) when r
// carries an operator token, as a bearer token or, when basic is set, as
// the password of HTTP Basic authentication (any user name: it is no
// identity); otherwise the status and reason of the refusal: 403 for the
// import token, 401 for anything else.
func (s *Server) operatorRefusal(r *http.Request, basic bool) (operator string, status int, why string) {
	bearer, hasBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	_, password, hasBasic := r.BasicAuth()
	if name, ok := s.cfg.OperatorTokens.Operator(bearer); hasBearer && ok {
		return name, 0, ""
	}
	if name, ok := s.cfg.OperatorTokens.Operator(password); basic && hasBasic && ok {
		return name, 0, ""
	}
	if hasBearer && s.isImportToken(bearer) || hasBasic && s.isImportToken(password) {
		return "", http.StatusForbidden, "the import token does not authorise operator actions: use the operator token"
	}
	if basic {
		return "", http.StatusUnauthorized, "missing or wrong operator token"
	}
	return "", http.StatusUnauthorized, "missing or wrong operator token (Authorization: Bearer)"
}

// notServed is the error of an operator route without an operator token.
func notServed(what string) string {
	return what + " is not served: it needs an operator token (--operator-token-file)"
}

// OperatorOnly returns h, a route people open in a browser (the River UI,
// named by what), behind the operator token: as a bearer token, or as the
// password of HTTP Basic authentication (any user name), which browsers
// prompt for and then send with every request of the page, its API calls
// included. Without credentials it answers 401 with a Basic challenge; with
// the import token 403 (401 with the challenge when it came as a Basic
// password, so that the browser asks again). Requests that change
// something are refused 403 when a browser could have sent them from
// another site's page (crossSiteRefusal): the browser would attach the
// operator's cached credentials. Without an operator token it answers 404
// with a JSON error saying so. Nothing of h is served to a refused request.
// Every answer, refusals included, forbids framing (refuseFraming).
func (s *Server) OperatorOnly(what string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuseFraming(w.Header())
		refuse := func(status int, outcome, why string) {
			s.cfg.Logger.Warn("operator request refused", "route", what, "method", r.Method, "status", status, "outcome", outcome, "error", why)
			writeJSON(w, status, errorBody{Outcome: outcome, Error: why})
		}
		if s.cfg.OperatorTokens == nil {
			writeJSON(w, http.StatusNotFound, errorBody{Outcome: "not_served", Error: notServed(what)})
			return
		}
		operator, status, why := s.operatorRefusal(r, true)
		if status != 0 {
			if _, _, basic := r.BasicAuth(); basic {
				// A browser that was given the wrong password asks again
				// only after a 401.
				status = http.StatusUnauthorized
			}
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Basic realm="fleet-ingest operator", charset="UTF-8"`)
			}
			refuse(status, outcomeOf(status), why)
			return
		}
		if why := crossSiteRefusal(r); why != "" {
			refuse(http.StatusForbidden, "forbidden", why)
			return
		}
		h.ServeHTTP(w, r.WithContext(WithOperator(r.Context(), operator)))
	})
}

// outcomeOf is the outcome of an operatorRefusal status.
func outcomeOf(status int) string {
	if status == http.StatusForbidden {
		return "forbidden"
	}
	return "unauthorized"
}

// crossSiteRefusal says why r, a request that changes something (neither
// GET, HEAD nor OPTIONS), may come from another site's page, or "" when it
// does not. Browsers attach an operator's HTTP Basic credentials to any
// request for this origin, and a cross-site form can POST text/plain,
// which River's API decodes as JSON all the same. Browsers say where a
// request comes from: Sec-Fetch-Site, when sent (every major browser since
// 2023), must be same-origin (or none: the user's own navigation), and
// Origin, when sent, must name this host (so a proxy in front must keep the
// Host header). A request that proves neither (an old browser, or a client
// that is not one) must be Content-Type application/json, which no form can
// send; a page's script could only with a CORS preflight, never granted
// here. The River UI's own calls are same-origin text/plain: their proven
// origin, not their content type, admits them.
func crossSiteRefusal(r *http.Request) string {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return ""
	}
	site := r.Header.Get("Sec-Fetch-Site")
	if site != "" && site != "same-origin" && site != "none" {
		return "cross-site request refused: Sec-Fetch-Site is not same-origin"
	}
	origin := r.Header.Get("Origin")
	if origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return "cross-origin request refused: Origin is not this host"
		}
		return ""
	}
	if site == "same-origin" {
		return ""
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return "a request without Origin or Sec-Fetch-Site must have Content-Type application/json"
	}
	return ""
}

// refuseFraming sets the headers that keep a page of another site from
// framing an operator page (clickjacking: the operator's browser would
// attach its cached credentials to the clicks it is tricked into), and
// from having a response sniffed as another content type:
// X-Frame-Options for older browsers, the frame-ancestors directive of
// Content-Security-Policy for current ones. The policy is added, not set:
// browsers enforce every Content-Security-Policy header of a response, so
// a policy of the handler's own (the River UI, v0.22, sets none) is kept
// and still bounded by this one.
func refuseFraming(h http.Header) {
	h.Set("X-Frame-Options", "DENY")
	h.Add("Content-Security-Policy", "frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
}
