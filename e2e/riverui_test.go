package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/pgtest"
)

// chromiumPath finds the Debian chromium (.ci/run installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("this test needs a headless Chromium: apt-get install chromium (.ci/run does)")
	return ""
}

// TestRiverUIShowsTheJobsOfABatch loads the River UI that enqueue serve
// mounts at /riverui/ in headless Chromium and finds the job of a batch it
// enqueued; without the bearer token the UI is not served.
func TestRiverUIShowsTheJobsOfABatch(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	_, base := startServe(t, dbURL, []string{"ENQUEUE_AUTH_TOKEN=ui-token"}, "--dev-allow-local-folders")
	status, out := postJSON(t, base+"/v1/imports", "ui-token",
		map[string]any{"tenant_id": "tenant-ui", "tenant_database": "db", "company_id": "c", "folder": writeFolder(t, sample)})
	require.Equal(t, http.StatusAccepted, status, "%v", out)
	jobID := int64(out["job_id"].(float64))
	batchID := int64(out["batch_id"].(float64))

	resp, err := http.Get(base + "/riverui/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the UI is behind the same authentication")
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic")

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
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	defer cancelTimeout()

	var listed, detail string
	err = chromedp.Do(ctx,
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
				return err
			}
			_, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders,
				network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Bearer ui-token"}})
			return err
		}),
		chromedp.Navigate(base+"/riverui/jobs?state=available"),
		void(chromedp.Poll[bool](`document.body.innerText.includes("fleet_ingest")`, chromedp.WithPollingTimeout(60*time.Second))),
		text(&listed),
		chromedp.Navigate(fmt.Sprintf("%s/riverui/jobs/%d", base, jobID)),
		void(chromedp.Poll[bool](fmt.Sprintf(`document.body.innerText.includes("batch_id") && document.body.innerText.includes(%q)`, fmt.Sprint(batchID)),
			chromedp.WithPollingTimeout(60*time.Second))),
		text(&detail),
	)
	require.NoError(t, err, "listed page:\n%s\ndetail page:\n%s", listed, detail)
	require.Contains(t, listed, "fleet_ingest")
	require.Contains(t, detail, "batch_id")
	require.Contains(t, detail, fmt.Sprint(jobID))
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
