package uploads

import (
	"crypto/subtle"
	"net/http"
)

// Authenticated returns h behind the listener's authentication, for routes
// people open in a browser (the River UI): the bearer token as for /v1, or
// HTTP Basic authentication with the token as the password (any user name),
// which browsers prompt for and then send with every request of the page,
// its API calls included. Without credentials it answers 401 with a Basic
// challenge; nothing of h is served.
func (s *Server) Authenticated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.bearerOK(r) || s.basicOK(r) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="fleet-ingest", charset="UTF-8"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
	})
}

func (s *Server) basicOK(r *http.Request) bool {
	_, password, ok := r.BasicAuth()
	return ok && s.cfg.AuthToken != "" && subtle.ConstantTimeCompare([]byte(password), []byte(s.cfg.AuthToken)) == 1
}
