package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/secretmount"
	"github.com/fleet/ingest/internal/uploads"
)

// TestCredentialsFailClosedAndRotate: one enqueue serve, its import
// tokens, HMAC secrets and tenant tokens in a directory laid out as a
// mounted Kubernetes Secret (symlinks swapped on update), read again every
// second, never restarted:
//   - the tokens file edited in place to remove tenant B's line and add a
//     malformed one (A's token pasted instead of its hash): B's token is
//     refused within the reload interval, A's still works, the line is
//     named by number only, ingest_tenant_tokens_refused_lines is 1 and the
//     reload failures count (what FleetIngestDoorTenantTokensInvalid reads:
//     prometheus/credentials_alerts_test.yaml shows it firing on them), and
//     enqueue token check refuses the same line with exit 1;
//   - the key removed from the Secret: every tenant token is refused;
//   - two import tokens, then the old one removed (Secret updates): both
//     work, then only the new one;
//   - two HMAC secrets, then the old one removed (in place): signatures by
//     both are accepted, then only the new one's;
//   - the import token file emptied: no import token is accepted, and
//     ingest_secret_file_reload_failures_total{file="auth_token_file"}
//     counts.
func TestCredentialsFailClosedAndRotate(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	mint := func(tenant string) (token, line string) {
		t.Helper()
		out, code := runEnqueue(t, dbURL, "token", "mint", "--tenant-id", tenant)
		require.Equal(t, 0, code, out)
		o := outcome(t, out)
		return o["token"].(string), o["line"].(string)
	}
	tokA, lineA := mint("acme")
	tokB, lineB := mint("globex")
	const (
		importOld, importNew = "import-token-old-0001", "import-token-new-0002"
		hmacOld, hmacNew     = "hmac-secret-old-0003", "hmac-secret-new-0004"
		reload               = time.Second
	)
	secret := map[string]string{"token": importOld + "\n", "hmac": hmacOld + "\n", "tenant-tokens": lineA + "\n" + lineB + "\n"}
	mount := secretmount.New(t, secret)
	serve, base := startServe(t, dbURL, nil,
		"--auth-token-file", mount.Path("token"), "--hmac-secret-file", mount.Path("hmac"),
		"--tenant-tokens-file", mount.Path("tenant-tokens"), "--tenant-tokens-reload", reload.String(), "--secrets-reload", reload.String())
	pid := serve.cmd.Process.Pid
	admin := "http://" + adminAddr(t, serve)

	// bearerStatus is GET /v1/batches/999999?tenant_id=acme (no such batch) with token:
	// 404 for a caller the door authenticates, 401 otherwise.
	bearerStatus := func(token string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+"/v1/batches/999999?tenant_id=acme", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Contains(t, []int{http.StatusNotFound, http.StatusUnauthorized}, resp.StatusCode)
		return resp.StatusCode
	}
	// signedStatus posts an S3 event the door ignores, signed with secret
	// (a new key each time: a signature is accepted once): 200 when the
	// signature is accepted, 401 otherwise.
	n := 0
	signedStatus := func(secret string) int {
		t.Helper()
		n++
		body := s3EventBody("fleet-uploads", fmt.Sprintf("tenants/acme/db_acme/company-1/rotation-%d/data.json", n))
		body = bytes.Replace(body, []byte("ObjectCreated:Put"), []byte("ObjectRemoved:Delete"), 1)
		sig, ts := uploads.Sign([]byte(secret), body, time.Now())
		req, err := http.NewRequest(http.MethodPost, base+"/v1/events/s3", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(uploads.SignatureHeader, sig)
		req.Header.Set(uploads.TimestampHeader, ts)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Contains(t, []int{http.StatusOK, http.StatusUnauthorized}, resp.StatusCode)
		return resp.StatusCode
	}
	metric := func(series string) float64 {
		t.Helper()
		for _, line := range strings.Split(httpGet(t, admin+"/metrics"), "\n") {
			if rest, ok := strings.CutPrefix(line, series+" "); ok {
				var v float64
				_, err := fmt.Sscan(rest, &v)
				require.NoError(t, err)
				return v
			}
		}
		t.Fatalf("series %s not exported", series)
		return 0
	}
	// within waits for cond, checked every 50 ms, and returns how long it
	// took from since.
	within := func(since time.Time, what string, cond func() bool) time.Duration {
		t.Helper()
		require.Eventually(t, cond, 30*time.Second, 50*time.Millisecond, what)
		took := time.Since(since)
		t.Logf("%s: %.2fs after the change (reload every %s)", what, took.Seconds(), reload)
		return took
	}

	require.Equal(t, http.StatusNotFound, bearerStatus(tokA))
	require.Equal(t, http.StatusNotFound, bearerStatus(tokB))
	require.Equal(t, http.StatusNotFound, bearerStatus(importOld))
	require.Equal(t, http.StatusUnauthorized, bearerStatus(importNew))
	require.Equal(t, http.StatusOK, signedStatus(hmacOld))
	require.Equal(t, http.StatusUnauthorized, signedStatus(hmacNew))
	require.Zero(t, metric("ingest_tenant_tokens_refused_lines"))

	// Tenant tokens: B's line removed and A's token pasted on a new line,
	// in one edit made in place.
	edited := time.Now()
	mount.WriteInPlace("tenant-tokens", lineA+"\nacme "+tokA+"\n")
	took := within(edited, "B's token refused", func() bool { return bearerStatus(tokB) == http.StatusUnauthorized })
	// The reload interval, plus the time a reload and a request take on a
	// loaded machine; the file was kept with every token before.
	require.Less(t, took, 3*reload, "B's token is refused within the reload interval")
	require.Equal(t, http.StatusNotFound, bearerStatus(tokA), "A's line stands")
	within(edited, "the refused line is exported and the failures counted", func() bool {
		return metric("ingest_tenant_tokens_refused_lines") == 1 && metric("ingest_tenant_tokens_reload_failures_total") >= 2
	})
	logLine := serve.waitLog(`line 2: the second field must be sha256`, 10*time.Second)
	require.NotContains(t, logLine, tokA)
	out, code := runEnqueue(t, dbURL, "token", "check", mount.Path("tenant-tokens"))
	require.Equal(t, 1, code, out)
	require.Equal(t, "invalid_lines", outcome(t, out)["outcome"])
	require.Contains(t, out, `"line":2`)
	require.NotContains(t, out, tokA)

	// The tenant tokens key removed from the Secret: the file is gone.
	secret = map[string]string{"token": secret["token"], "hmac": secret["hmac"]}
	removed := time.Now()
	mount.Update(secret)
	within(removed, "every tenant token refused once the file is gone", func() bool { return bearerStatus(tokA) == http.StatusUnauthorized })
	require.Equal(t, http.StatusUnauthorized, bearerStatus(tokB))
	require.Zero(t, metric("ingest_tenant_tokens_refused_lines"), "no line is in force")
	failures := metric("ingest_tenant_tokens_reload_failures_total")
	within(removed, "the missing file counted at every reload", func() bool { return metric("ingest_tenant_tokens_reload_failures_total") > failures })

	// The import token rotated by Secret updates: new added, old removed.
	secret["token"] = "# rotation under way\n" + importOld + "\n" + importNew + "\n"
	added := time.Now()
	mount.Update(secret)
	within(added, "the new import token accepted", func() bool { return bearerStatus(importNew) == http.StatusNotFound })
	require.Equal(t, http.StatusNotFound, bearerStatus(importOld), "both work during the rotation")
	secret["token"] = importNew + "\n"
	removed = time.Now()
	mount.Update(secret)
	took = within(removed, "the old import token refused", func() bool { return bearerStatus(importOld) == http.StatusUnauthorized })
	require.Less(t, took, 3*reload)
	require.Equal(t, http.StatusNotFound, bearerStatus(importNew))

	// The HMAC secret rotated in place.
	added = time.Now()
	mount.WriteInPlace("hmac", hmacOld+"\n"+hmacNew+"\n")
	within(added, "signatures by the new HMAC secret accepted", func() bool { return signedStatus(hmacNew) == http.StatusOK })
	require.Equal(t, http.StatusOK, signedStatus(hmacOld), "both work during the rotation")
	removed = time.Now()
	mount.WriteInPlace("hmac", hmacNew+"\n")
	took = within(removed, "signatures by the old HMAC secret refused", func() bool { return signedStatus(hmacOld) == http.StatusUnauthorized })
	require.Less(t, took, 3*reload)
	require.Equal(t, http.StatusOK, signedStatus(hmacNew))

	// The import token file emptied: fails closed, counted.
	require.Zero(t, metric(`ingest_secret_file_reload_failures_total{file="auth_token_file"}`))
	emptied := time.Now()
	secret["token"] = "# emptied by mistake\n"
	mount.Update(secret)
	within(emptied, "no import token accepted from a file without one", func() bool { return bearerStatus(importNew) == http.StatusUnauthorized })
	within(emptied, "the failed reloads counted", func() bool {
		return metric(`ingest_secret_file_reload_failures_total{file="auth_token_file"}`) >= 1
	})
	require.Zero(t, metric(`ingest_secret_file_reload_failures_total{file="hmac_secret_file"}`))

	// All of it without a restart.
	select {
	case <-serve.done:
		t.Fatalf("enqueue serve exited: %v", serve.err)
	default:
	}
	require.Equal(t, pid, serve.cmd.Process.Pid)
	require.Equal(t, 1, strings.Count(serve.logs.String(), `"msg":"listening for upload notifications"`), "started once")
	logs := serve.logs.String()
	for _, secret := range []string{tokA, tokB, strings.TrimPrefix(tokA, "fit_"), importOld, importNew, hmacOld, hmacNew} {
		require.NotContains(t, logs, secret, "no credential in the logs")
	}
}
