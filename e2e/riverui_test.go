package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testdeps"
)

// chromiumPath finds the Debian chromium: CHROMIUM_BIN (make test sets it,
// installing chromium as root), else chromium, chromium-browser or
// google-chrome on PATH. Missing, it fails the test (skips it under -short).
func chromiumPath(t *testing.T) string {
	t.Helper()
	names := []string{"chromium", "chromium-browser", "google-chrome"}
	if bin := os.Getenv("CHROMIUM_BIN"); bin != "" {
		names = []string{bin}
	}
	var err error
	for _, name := range names {
		var p string
		if p, err = exec.LookPath(name); err == nil {
			return p
		}
	}
	testdeps.Missing(t, "a headless Chromium", "apt-get install chromium", err)
	return ""
}

// TestRiverUIShowsTheJobsOfABatch loads the River UI that enqueue serve
// mounts at /riverui/ in headless Chromium, with the operator token, finds
// the job of a batch it enqueued and cancels another with the UI's own
// Cancel button. A page of another site, submitting a text/plain form to
// River's API in the same browser (which attaches the operator's
// credentials), cancels nothing. Without the operator token, or with the
// import token, the UI is not served.
func TestRiverUIShowsTheJobsOfABatch(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	_, public, base := startRiverUIServe(t, dbURL) // the River UI is on the admin listener
	enqueue := func() (jobID, batchID int64) { return importSample(t, public, "tenant-ui") }
	jobID, batchID := enqueue()
	targetJob, _ := enqueue()    // what the other site's page tries to cancel
	cancelledJob, _ := enqueue() // what the operator cancels in the UI
	jobState := func(id int64) string { return riverJobState(t, pool, id) }

	for name, tc := range map[string]struct {
		auth   string
		status int
	}{
		"no credentials":        {"", http.StatusUnauthorized},
		"import token":          {"Bearer ui-token", http.StatusForbidden},
		"import token as Basic": {"Basic " + base64.StdEncoding.EncodeToString([]byte("ops:ui-token")), http.StatusUnauthorized}, // the browser asks again
	} {
		req, err := http.NewRequest(http.MethodGet, base+"/riverui/", nil)
		require.NoError(t, err)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, tc.status, resp.StatusCode, name)
		if tc.status == http.StatusUnauthorized {
			require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic", "browsers are asked for the operator token")
		}
	}

	// The other site: another host name for the loopback address, so the
	// browser deems it cross-site.
	formTarget := base + "/riverui/api/jobs/cancel"
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="POST" enctype="text/plain" action="%s">`+
			`<input type="hidden" name='{"ids":["%d"],"x":"' value='"}'></form>`+
			`<script>document.getElementById("f").submit()</script>`, formTarget, targetJob)
	}))
	defer other.Close()
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)

	bctx := newBrowser(t, 90*time.Second)

	var listed, detail, attack string
	err := chromedp.Do(bctx,
		// The operator's credentials go with every request of this
		// browser, to any site, as cached HTTP Basic credentials would.
		withAuthorization("Bearer ui-operator-token"),
		chromedp.Navigate(otherURL),
		void(chromedp.Poll[bool](fmt.Sprintf(`location.href === %q && document.readyState === "complete"`, formTarget),
			chromedp.WithPollingTimeout(60*time.Second))),
		text(&attack),
		chromedp.Navigate(base+"/riverui/jobs?state=available"),
		void(chromedp.Poll[bool](`document.body.innerText.includes("fleet_ingest")`, chromedp.WithPollingTimeout(60*time.Second))),
		text(&listed),
		chromedp.Navigate(fmt.Sprintf("%s/riverui/jobs/%d", base, jobID)),
		void(chromedp.Poll[bool](fmt.Sprintf(`document.body.innerText.includes("batch_id") && document.body.innerText.includes(%q)`, fmt.Sprint(batchID)),
			chromedp.WithPollingTimeout(60*time.Second))),
		text(&detail),
		// The UI's own Cancel button: a same-origin text/plain POST.
		chromedp.Navigate(fmt.Sprintf("%s/riverui/jobs/%d", base, cancelledJob)),
		void(chromedp.Poll[bool](`[...document.querySelectorAll("button")].some(b => b.textContent.trim() === "Cancel" && !b.disabled)`,
			chromedp.WithPollingTimeout(60*time.Second))),
		void(chromedp.Evaluate[bool](`(() => { [...document.querySelectorAll("button")].find(b => b.textContent.trim() === "Cancel").click(); return true })()`)),
	)
	require.NoError(t, err, "attack page:\n%s\nlisted page:\n%s\ndetail page:\n%s", attack, listed, detail)
	require.Contains(t, attack, "cross-site request refused", "River's API answered the other site's form")
	require.Contains(t, listed, "fleet_ingest")
	require.Contains(t, detail, "batch_id")
	require.Contains(t, detail, fmt.Sprint(jobID))
	require.Eventually(t, func() bool { return jobState(cancelledJob) == "cancelled" }, 60*time.Second, 50*time.Millisecond,
		"the UI's Cancel button cancels the job")
	require.Equal(t, "available", jobState(targetJob), "the other site's form cancelled nothing")
}

// TestRiverUIIsNotServedWithoutAnOperatorToken: enqueue serve without
// --operator-token-file says so at start and answers /riverui/ 404 with a
// JSON error naming the flag, to the import token too.
func TestRiverUIIsNotServedWithoutAnOperatorToken(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	serve, _ := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=ui-token"})
	base := "http://" + adminAddr(t, serve)
	require.Contains(t, serve.logs.String(), "the River UI are not served")
	for _, auth := range []string{"", "Bearer ui-token"} {
		req, err := http.NewRequest(http.MethodGet, base+"/riverui/", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var out map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		require.Equal(t, "not_served", out["outcome"])
		require.Contains(t, out["error"], "--operator-token-file")
	}
}

// void drops an action's value.
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, t)
		return chromedp.Void{}, err
	}
}

// text stores the page's visible text in out.
func text(out *string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		v, err := chromedp.Evaluate[string](`document.body.innerText`)(ctx, t)
		*out = v
		return chromedp.Void{}, err
	}
}

// startRiverUIServe starts enqueue serve with the import token ui-token
// and the operator token ui-operator-token, operator "ops"'s in its
// operator tokens file, local folders allowed. It returns serve, its
// public URL and its admin listener's URL (where the River UI and pprof
// are).
func startRiverUIServe(t *testing.T, dbURL string) (serve *workerProc, public, admin string) {
	t.Helper()
	tokens := operatorTokensFile(t, t.TempDir(), [2]string{"ops", "ui-operator-token"})
	serve, public = startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=ui-token"}, "--operator-token-file", tokens, "--dev-allow-local-folders")
	return serve, public, "http://" + adminAddr(t, serve)
}

// importSample imports the sample folder for tenant through serve's
// public URL with the import token ui-token, returning the job and batch.
func importSample(t *testing.T, public, tenant string) (jobID, batchID int64) {
	t.Helper()
	status, out := postJSON(t, public+"/v1/imports", "ui-token",
		map[string]any{"tenant_id": tenant, "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.Equal(t, http.StatusAccepted, status, "%v", out)
	return int64(out["job_id"].(float64)), int64(out["batch_id"].(float64))
}

// riverJobState is the state of River job id.
func riverJobState(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var state string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&state))
	return state
}

// newBrowser starts a headless Chromium for the test, closed when it
// ends, and returns a tab's context that times out after timeout.
func newBrowser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("mute-audio", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancelAlloc)
	bctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	bctx, cancelTimeout := context.WithTimeout(bctx, timeout)
	t.Cleanup(cancelTimeout)
	return bctx
}

// withAuthorization sends the Authorization header authorization with
// every request of the browser from then on, to any site, as cached HTTP
// Basic credentials would be.
func withAuthorization(authorization string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders,
			network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": authorization}})
		return err
	})
}
