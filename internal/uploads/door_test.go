package uploads

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/s3events"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func newServerEnqueuer(t *testing.T, pool *pgxpool.Pool) *jobs.Enqueuer {
	t.Helper()
	client, err := jobs.NewInsertClient(pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return &jobs.Enqueuer{Pool: pool, River: client, Logger: slog.New(slog.DiscardHandler)}
}

// neverEndingBody is a request body that sends nothing and never ends: a
// server that reads it waits forever.
type neverEndingBody struct{ done chan struct{} }

func (b neverEndingBody) Read([]byte) (int, error) { <-b.done; return 0, io.EOF }

// postUnread posts to path with a body that never arrives and returns the
// status, or 0 when no answer came within 5 s (the body was being read).
func postUnread(t *testing.T, f *fixture, path string, headers map[string]string) int {
	t.Helper()
	body := neverEndingBody{done: make(chan struct{})}
	defer close(body.done)
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+path, body)
	require.NoError(t, err)
	req.ContentLength = 10 << 20
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestWrongCredentialsAreRefusedBeforeTheBodyIsRead: a wrong bearer token,
// HMAC headers where no secret is set, and no credentials where only the
// token is accepted are answered 401 without reading a byte of the body
// (which here never arrives). A wrong token on /v1/events/s3 used to make
// the listener read up to --max-body-bytes first, when HMAC or SNS was set.
func TestWrongCredentialsAreRefusedBeforeTheBodyIsRead(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	withHMAC := newServer(t, pool, nil)
	tokenOnly := newServer(t, pool, func(c *Config) { c.HMACSecret = nil })
	wrong := map[string]string{"Authorization": "Bearer wrong-token"}
	sig, ts := Sign(secret, []byte("{}"), time.Now())
	for name, tc := range map[string]struct {
		f       *fixture
		path    string
		headers map[string]string
	}{
		"events: wrong token, HMAC configured":    {withHMAC, "/v1/events/s3", wrong},
		"events: wrong token and HMAC headers":    {withHMAC, "/v1/events/s3", map[string]string{"Authorization": "Bearer wrong-token", SignatureHeader: sig, TimestampHeader: ts}},
		"events: HMAC headers, no secret":         {tokenOnly, "/v1/events/s3", map[string]string{SignatureHeader: sig, TimestampHeader: ts}},
		"events: no credentials, token only":      {tokenOnly, "/v1/events/s3", nil},
		"imports: wrong token":                    {withHMAC, "/v1/imports", wrong},
		"imports: no credentials":                 {withHMAC, "/v1/imports", nil},
		"imports: HMAC headers are no credential": {withHMAC, "/v1/imports", map[string]string{SignatureHeader: sig, TimestampHeader: ts}},
	} {
		require.Equal(t, http.StatusUnauthorized, postUnread(t, tc.f, tc.path, tc.headers), name)
	}
}

// TestSignedBodiesAreReadWithASmallLimit: a request without the token is
// read with SignedMaxBodyBytes (64 KiB by default) before its HMAC or SNS
// signature is checked; one with the token keeps MaxBodyBytes.
func TestSignedBodiesAreReadWithASmallLimit(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	sns := newFakeSNS(t)
	f := newServer(t, pool, func(c *Config) {
		c.MaxBodyBytes = 1 << 20
		withSNS(sns, false, nil)(c)
	})
	padded := func(folder string, size int) []byte {
		var m map[string]any
		require.NoError(t, json.Unmarshal(s3Event("fleet-uploads", "tenants/t1/db1/c1/"+folder+"/_SUCCESS", "ObjectCreated:Put"), &m))
		m["padding"] = strings.Repeat("x", size)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return b
	}
	big := padded("hmac-big", 100<<10)
	status, out := f.post(t, "/v1/events/s3", "application/json", big, signed(big))
	require.Equal(t, http.StatusRequestEntityTooLarge, status, out)
	require.Contains(t, out["error"], fmt.Sprint(SignedMaxBodyBytesDefault))
	snsBig := sns.message(t, s3events.SNSNotification, testTopic, string(padded("sns-big", 100<<10)), "2", nil)
	status, out = f.post(t, "/v1/events/s3", "text/plain", snsBig, nil)
	require.Equal(t, http.StatusRequestEntityTooLarge, status, out)
	require.Zero(t, sns.fetches.Load(), "nothing fetched for a body refused unread")

	small := padded("hmac-small", 60<<10)
	status, out = f.post(t, "/v1/events/s3", "application/json", small, signed(small))
	require.Equal(t, http.StatusAccepted, status, out)
	status, out = f.post(t, "/v1/events/s3", "application/json", padded("token-big", 500<<10), auth)
	require.Equal(t, http.StatusAccepted, status, "the token's requests keep MaxBodyBytes: %v", out)
}

// rateLimitedPost posts and returns the status, the Retry-After header and
// the JSON body.
func rateLimitedPost(t *testing.T, f *fixture, path string, body []byte, headers map[string]string) (int, string, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, resp.Header.Get("Retry-After"), out
}

func manyFolders(n int) []byte {
	records := make([]any, n)
	for i := range records {
		records[i] = map[string]any{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
			"s3": map[string]any{"bucket": map[string]any{"name": "fleet-uploads"}, "object": map[string]any{"key": fmt.Sprintf("tenants/t%d/db1/c1/many/_SUCCESS", i)}}}
	}
	b, _ := json.Marshal(map[string]any{"Records": records})
	return b
}

// TestDoorRateLimitPerCredential: each credential has its own token
// bucket, one token per folder a request would start; over it the answer
// is 429 with Retry-After and outcome rate_limited (counted), and nothing
// is imported; a request starting more folders than the burst is refused
// 422 (one request made 1,000 batches for 1,000 tenants); requests that
// fail authentication take nothing from anyone's budget.
func TestDoorRateLimitPerCredential(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.RateLimit, c.RateBurst = 0.01, 3 })

	status, _, out := rateLimitedPost(t, f, "/v1/events/s3", manyFolders(4), auth)
	require.Equal(t, http.StatusUnprocessableEntity, status, out)
	require.Contains(t, out["error"], "at most 3")
	require.Zero(t, count(t, pool), "a request over the burst imports nothing")

	for i := range 20 {
		status, _, _ := rateLimitedPost(t, f, "/v1/imports", importBody("t1", tenantFolder("t1", fmt.Sprint("wrong-", i))), map[string]string{"Authorization": "Bearer wrong"})
		require.Equal(t, http.StatusUnauthorized, status)
	}
	status, _, out = rateLimitedPost(t, f, "/v1/events/s3", manyFolders(2), auth)
	require.Equal(t, http.StatusAccepted, status, "401s took nothing from the token's budget: %v", out)
	status, _, out = rateLimitedPost(t, f, "/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "one")), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	status, retry, out := rateLimitedPost(t, f, "/v1/imports", importBody("tenant-a", tenantFolder("tenant-a", "two")), auth)
	require.Equal(t, http.StatusTooManyRequests, status, out)
	require.Equal(t, "rate_limited", out["outcome"])
	secs, err := strconv.Atoi(retry)
	require.NoError(t, err, "Retry-After is in seconds: %q", retry)
	require.Positive(t, secs)
	require.Equal(t, float64(secs), out["retry_after_seconds"])
	require.Equal(t, 3, count(t, pool))

	// The HMAC secret is another credential, with its own budget.
	ev := s3Event("fleet-uploads", "tenants/t1/db1/c1/hmac/_SUCCESS", "ObjectCreated:Put")
	status, _, out = rateLimitedPost(t, f, "/v1/events/s3", ev, signed(ev))
	require.Equal(t, http.StatusAccepted, status, out)
	require.Equal(t, 4, count(t, pool))
	require.Equal(t, float64(1), httpCounter(t, f, routeImports, "rate_limited"))
}

func httpCounter(t *testing.T, f *fixture, route, outcome string) float64 {
	t.Helper()
	return testutilCounter(t, f, "ingest_http_request_outcomes_total", map[string]string{"route": route, "outcome": outcome})
}

func testutilCounter(t *testing.T, f *fixture, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := f.m.Registry.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
	metrics:
		for _, mt := range fam.GetMetric() {
			for _, l := range mt.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue metrics
				}
			}
			return mt.GetCounter().GetValue()
		}
	}
	return 0
}

// TestOperatorPagesRefuseFraming: every answer of an operator page,
// refusals included, forbids framing (X-Frame-Options, CSP
// frame-ancestors) and sniffing; a policy of the page's own is kept.
func TestOperatorPagesRefuseFraming(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	s, err := New(Config{Enqueuer: newServerEnqueuer(t, pool), Pool: pool, AuthToken: token, OperatorToken: operatorToken, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ui := s.OperatorOnly("the test UI", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Content-Security-Policy", "default-src 'self'")
		fmt.Fprint(w, "<html>ui</html>")
	}))
	for name, header := range map[string]string{"served": "Bearer " + operatorToken, "refused": "", "import token": "Bearer " + token} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/riverui/", nil)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		ui.ServeHTTP(rec, req)
		h := rec.Result().Header
		require.Equal(t, "DENY", h.Get("X-Frame-Options"), name)
		require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), name)
		require.Contains(t, h.Values("Content-Security-Policy"), "frame-ancestors 'none'", name)
		if name == "served" {
			require.Contains(t, h.Values("Content-Security-Policy"), "default-src 'self'", "the page's own policy is kept")
		}
	}
}
