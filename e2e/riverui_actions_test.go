package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// TestRiverUIActionsGoThroughTheBatch drives the River UI of a real
// enqueue serve in headless Chromium, logged in as operator "ops" (HTTP
// Basic, the operator token as password), while a real worker holds the
// batch's job running (its load blocked):
//   - the UI's Cancel button on that running job cancels the batch: Failed
//     with phase cancelled, cancelled by "riverui:ops@…", and the batch is
//     not re-delivered within 2 × --orphan-after (where the River-only
//     cancel used to leave it Running for the sweeper to run again);
//   - Retry of that job is refused with the UI's own error shape, naming
//     enqueue retry: the job does not turn green for a batch that did not
//     run;
//   - the UI lists jobs by tenant tag.
func TestRiverUIActionsGoThroughTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	const orphanAfter = 2 * time.Second
	serve, public, base := startRiverUIServe(t, dbURL) // the operator surfaces are on the admin listener
	w := startWorker(t, dbURL, append([]string{"--orphan-after", orphanAfter.String()}, fastLease...)...)
	release := blockLoads(t, pool)
	defer release()

	enqueue := func(tenant string) (jobID, batchID int64) { return importSample(t, public, tenant) }
	jobID, batchID := enqueue("tenant-ui")
	waitLoadBlocked(t, pool, batchID, w.name+"/")
	otherJob, otherBatch := enqueue("tenant-other")
	jobState := func(id int64) string { return riverJobState(t, pool, id) }
	require.Equal(t, "running", jobState(jobID))

	bctx := newBrowser(t, 120*time.Second)
	login := withAuthorization("Basic " + basicAuth("ops", "ui-operator-token"))

	// Cancel, with the UI's own button, on the running job's page.
	err := chromedp.Do(bctx, login,
		chromedp.Navigate(fmt.Sprintf("%s/riverui/jobs/%d", base, jobID)),
		void(chromedp.Poll[bool](`[...document.querySelectorAll("button")].some(b => b.textContent.trim() === "Cancel" && !b.disabled)`,
			chromedp.WithPollingTimeout(60*time.Second))),
		void(chromedp.Evaluate[bool](`(() => { [...document.querySelectorAll("button")].find(b => b.textContent.trim() === "Cancel").click(); return true })()`)),
	)
	require.NoError(t, err)
	b := waitStatus(t, pool, batchID, batch.StatusFailed, 30*time.Second)
	_, d := getBatch(t, pool, batchID)
	require.Equal(t, batch.PhaseCancelled, d.Phase)
	require.NotNil(t, b.CancelledBy)
	require.Regexp(t, `^riverui:ops@`, *b.CancelledBy, "the UI's operator is recorded")
	// The line is written once the cancel has committed, and reaches the
	// test through serve's stderr pipe: a moment after the status.
	logged := regexp.MustCompile(`"msg":"operator action","action":"cancel","by":"riverui:ops@[^"]+","reason":"cancelled in the River UI \(job \d+\)"`)
	require.Eventually(t, func() bool { return logged.MatchString(serve.logs.String()) }, 10*time.Second, 20*time.Millisecond,
		"the action is logged with who and why:\n%s", serve.logs.String())
	c := findEntry(t, auditEntries(t, dbURL), "cancel")
	require.Equal(t, "ops", c.Actor, "the operator the token names")
	require.Equal(t, "riverui", c.Door)
	require.Equal(t, batchID, c.BatchID)
	release()

	// Retry of the cancelled batch's job, as the UI's Retry button sends
	// it: refused, in the UI's error shape, pointing to enqueue retry.
	var retry map[string]any
	err = chromedp.Do(bctx,
		chromedp.Navigate(fmt.Sprintf("%s/riverui/jobs/%d", base, jobID)),
		void(chromedp.Poll[bool](`document.readyState === "complete"`, chromedp.WithPollingTimeout(30*time.Second))),
		chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			v, err := chromedp.Evaluate[map[string]any](fmt.Sprintf(`fetch("/riverui/api/jobs/retry", {method: "POST", headers: {"Content-Type": "application/json"},
				body: JSON.stringify({ids: ["%d"]})}).then(async r => ({status: r.status, body: await r.json()}))`, jobID), chromedp.EvalAwaitPromise)(ctx, tgt)
			retry = v
			return err
		}),
	)
	require.NoError(t, err)
	require.Equal(t, float64(http.StatusBadRequest), retry["status"], "%v", retry)
	require.Contains(t, retry["body"].(map[string]any)["message"], "enqueue retry --batch-id")

	// The UI lists jobs by tenant tag (its filter "tags:", kept in the
	// page's URL as a JSON array).
	_, thirdBatch := enqueue("tenant-third")
	other, third := fmt.Sprintf(`{"batch_id":%d}`, otherBatch), fmt.Sprintf(`{"batch_id":%d}`, thirdBatch)
	var all, listed string
	// waitText polls the page's text until ok says so, keeping the last
	// text seen in out.
	waitText := func(out *string, ok func(string) bool) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			deadline := time.Now().Add(60 * time.Second)
			for {
				v, err := chromedp.Evaluate[string](`document.body.innerText`)(ctx, tgt)
				if err != nil {
					return err
				}
				*out = v
				if ok(v) {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("page text not as expected in 60 s")
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	err = chromedp.Do(bctx,
		chromedp.Navigate(base+"/riverui/jobs?state=completed"),
		waitText(&all, func(s string) bool { return strings.Contains(s, other) && strings.Contains(s, third) }),
		chromedp.Navigate(base+"/riverui/jobs?state=completed&tags=tenant_tenant-other"),
		waitText(&listed, func(s string) bool { return strings.Contains(s, other) && !strings.Contains(s, third) }),
	)
	require.NoError(t, err, "unfiltered:\n%s\nfiltered:\n%s", all, listed)
	var tagged []int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM river_job WHERE kind = 'fleet_ingest' AND tags @> '{tenant_tenant-other}'`).Scan(&tagged))
	require.Equal(t, []int64{otherJob}, tagged)

	// The public port serves neither the UI nor pprof; the admin listener
	// serves pprof to the operator only.
	for _, path := range []string{"/riverui/", "/debug/pprof/"} {
		req, err := http.NewRequest(http.MethodGet, public+path, nil)
		require.NoError(t, err)
		req.SetBasicAuth("ops", "ui-operator-token")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "public %s", path)
	}
	for auth, want := range map[string]int{"ui-operator-token": http.StatusOK, "ui-token": http.StatusUnauthorized} {
		req, err := http.NewRequest(http.MethodGet, base+"/debug/pprof/cmdline", nil)
		require.NoError(t, err)
		req.SetBasicAuth("ops", auth)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, "admin pprof with %s", auth)
	}

	// Not re-delivered within 2 × --orphan-after, and not run.
	time.Sleep(2*orphanAfter + 2*time.Second)
	b, _ = getBatch(t, pool, batchID)
	require.Equal(t, batch.StatusFailed, b.Status, "the cancelled batch stays cancelled")
	var jobs int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FROM river_job WHERE (args->>'batch_id')::bigint = $1 AND state NOT IN ('cancelled')`, batchID).Scan(&jobs))
	require.Zero(t, jobs, "no job of the cancelled batch is queued, running or completed")
	total, _ := recordCopies(t, pool, b.Scope())
	require.Zero(t, total, "nothing of the cancelled batch reached the warehouse")
}

// basicAuth is the value of an HTTP Basic Authorization header.
func basicAuth(user, password string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
}
