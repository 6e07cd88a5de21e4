package uploads

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/jobs"
)

// operatorRoute serves a handler that counts what reaches it behind
// OperatorOnly, on a listener configured by mod.
func operatorRoute(t *testing.T, mod func(*Config)) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	cfg := Config{Enqueuer: &jobs.Enqueuer{}, AuthToken: token, OperatorToken: operatorToken}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	var reached atomic.Int64
	hs := httptest.NewServer(s.OperatorOnly("the River UI", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})))
	t.Cleanup(hs.Close)
	return hs, &reached
}

func basic(password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("anyone:"+password))
}

func do(t *testing.T, method, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{"ids":["1"]}`))
	require.NoError(t, err)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// TestRiverUINeedsTheOperatorToken: the River UI shows and changes every
// tenant's jobs, so the import token shared by notification senders never
// opens it; the operator token does, as a bearer token or as the password
// of HTTP Basic authentication (which browsers prompt for).
func TestRiverUINeedsTheOperatorToken(t *testing.T) {
	t.Parallel()
	hs, reached := operatorRoute(t, nil)
	for name, tc := range map[string]struct {
		auth   string
		status int
	}{
		"none":                       {"", http.StatusUnauthorized},
		"wrong bearer":               {"Bearer nope", http.StatusUnauthorized},
		"wrong password":             {basic("nope"), http.StatusUnauthorized},
		"operator token, other case": {"Bearer " + strings.ToUpper(operatorToken), http.StatusUnauthorized},
		"import token, bearer":       {"Bearer " + token, http.StatusForbidden},
		"import token, basic":        {basic(token), http.StatusUnauthorized}, // the browser asks again
		"operator token, bearer":     {"Bearer " + operatorToken, http.StatusNoContent},
		"operator token, basic":      {basic(operatorToken), http.StatusNoContent},
	} {
		before := reached.Load()
		resp := do(t, http.MethodGet, hs.URL+"/riverui/jobs", map[string]string{"Authorization": tc.auth})
		require.Equal(t, tc.status, resp.StatusCode, name)
		if tc.status == http.StatusUnauthorized {
			require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic", "%s: browsers are asked for credentials", name)
		}
		if tc.status != http.StatusNoContent {
			require.Equal(t, before, reached.Load(), "%s: nothing of the UI is served", name)
		}
	}
}

// TestInsecureNoAuthNeverOpensOperatorRoutes: --insecure-no-auth lets
// imports through without a token, never the operator routes.
func TestInsecureNoAuthNeverOpensOperatorRoutes(t *testing.T) {
	t.Parallel()
	hs, reached := operatorRoute(t, func(c *Config) { c.AuthToken, c.InsecureNoAuth = "", true })
	require.Equal(t, http.StatusUnauthorized, do(t, http.MethodGet, hs.URL+"/riverui/", nil).StatusCode)
	require.Equal(t, http.StatusUnauthorized, do(t, http.MethodGet, hs.URL+"/riverui/", map[string]string{"Authorization": "Bearer "}).StatusCode)
	require.Zero(t, reached.Load())
	require.Equal(t, http.StatusNoContent, do(t, http.MethodGet, hs.URL+"/riverui/", map[string]string{"Authorization": "Bearer " + operatorToken}).StatusCode)
}

// TestRiverUIIsNotServedWithoutAnOperatorToken: with no operator token,
// the River UI answers 404 with a JSON error naming what it needs, to the
// import token too.
func TestRiverUIIsNotServedWithoutAnOperatorToken(t *testing.T) {
	t.Parallel()
	hs, reached := operatorRoute(t, func(c *Config) { c.OperatorToken = "" })
	for _, a := range []string{"", "Bearer " + token, basic(token)} {
		req, err := http.NewRequest(http.MethodGet, hs.URL+"/riverui/", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", a)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var out errorBody
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		require.Equal(t, "not_served", out.Outcome)
		require.Contains(t, out.Error, "--operator-token-file")
	}
	require.Zero(t, reached.Load())
}

// TestRiverUIRefusesCrossSiteChanges: a browser attaches an operator's
// HTTP Basic credentials to any request for the listener's origin, and
// River's API decodes a text/plain body as JSON, so a page of another site
// could cancel jobs with a form. Changes must come from the UI's own
// origin (Sec-Fetch-Site, Origin) or be application/json.
func TestRiverUIRefusesCrossSiteChanges(t *testing.T) {
	t.Parallel()
	hs, reached := operatorRoute(t, nil)
	host := strings.TrimPrefix(hs.URL, "http://")
	op := basic(operatorToken)
	for name, tc := range map[string]struct {
		method string
		hdr    map[string]string
		status int
	}{
		// A cross-site form, as browsers send it.
		"cross-site form":          {http.MethodPost, map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		"same-site form":           {http.MethodPost, map[string]string{"Content-Type": "text/plain", "Origin": "http://other.local", "Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
		"cross-site JSON":          {http.MethodPost, map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		"old browser, other site":  {http.MethodPost, map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, http.StatusForbidden},
		"sandboxed page":           {http.MethodPost, map[string]string{"Content-Type": "application/json", "Origin": "null"}, http.StatusForbidden},
		"origin mismatch, JSON":    {http.MethodPost, map[string]string{"Content-Type": "application/json", "Origin": "http://" + host + ".evil.example"}, http.StatusForbidden},
		"origin on another port":   {http.MethodPost, map[string]string{"Content-Type": "application/json", "Origin": "http://127.0.0.1:1"}, http.StatusForbidden},
		"no origin, form":          {http.MethodPost, map[string]string{"Content-Type": "text/plain"}, http.StatusForbidden},
		"no origin, url-encoded":   {http.MethodPost, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusForbidden},
		"no origin, multipart":     {http.MethodPost, map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, http.StatusForbidden},
		"no origin, no type":       {http.MethodPut, nil, http.StatusForbidden},
		"cross-site DELETE":        {http.MethodDelete, map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		"user navigation, form":    {http.MethodPost, map[string]string{"Content-Type": "text/plain", "Sec-Fetch-Site": "none"}, http.StatusForbidden},
		"UI call, modern browser":  {http.MethodPost, map[string]string{"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"}, http.StatusNoContent},
		"UI call, no origin sent":  {http.MethodPut, map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusNoContent},
		"UI call, old browser":     {http.MethodPost, map[string]string{"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://" + host}, http.StatusNoContent},
		"origin is not this Host":  {http.MethodPost, map[string]string{"Content-Type": "text/plain", "Origin": "http://" + host, "Sec-Fetch-Site": "same-origin", "Host": "proxy.example"}, http.StatusForbidden},
		"API client, JSON":         {http.MethodPost, map[string]string{"Content-Type": "application/json"}, http.StatusNoContent},
		"API client, JSON charset": {http.MethodPatch, map[string]string{"Content-Type": "application/json; charset=utf-8"}, http.StatusNoContent},
		"GET from anywhere":        {http.MethodGet, map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, http.StatusNoContent},
	} {
		hdr := map[string]string{"Authorization": op}
		for k, v := range tc.hdr {
			hdr[k] = v
		}
		before := reached.Load()
		resp := do(t, tc.method, hs.URL+"/riverui/api/jobs/cancel", hdr)
		require.Equal(t, tc.status, resp.StatusCode, name)
		if tc.status == http.StatusForbidden {
			require.Equal(t, before, reached.Load(), "%s: River's API is never reached", name)
		}
	}
}

// TestOperatorTokenMustDifferFromTheImportToken: a listener whose operator
// token equals its import token (or HMAC secret) would give every
// notification sender the operator routes: it refuses to start.
func TestOperatorTokenMustDifferFromTheImportToken(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"import token": {Enqueuer: &jobs.Enqueuer{}, AuthToken: token, OperatorToken: token},
		"HMAC secret":  {Enqueuer: &jobs.Enqueuer{}, AuthToken: token, OperatorToken: string(secret), HMACSecret: secret},
	} {
		err := cfg.Validate()
		var ce *ConfigError
		require.ErrorAs(t, err, &ce, name)
		require.Equal(t, "OperatorToken", ce.Setting, name)
		_, err = New(cfg)
		require.Error(t, err, name)
	}
	require.NoError(t, Config{Enqueuer: &jobs.Enqueuer{}, AuthToken: token, OperatorToken: operatorToken}.Validate())
	require.NoError(t, Config{Enqueuer: &jobs.Enqueuer{}, AuthToken: token}.Validate(), "no operator token: operator routes off")
}
