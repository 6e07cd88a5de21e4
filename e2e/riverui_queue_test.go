package e2e

import (
	"context"
	"fmt"
	"io"
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

// TestRiverUIQueuePauseIsAnOperatorAction drives the River UI of a real
// enqueue serve in headless Chromium, logged in as operator "ops", with a
// real worker:
//   - the queue page's Pause button pauses fleet_ingest, and serve logs it
//     as an operator action by riverui:ops@…;
//   - a batch imported then waits (Running, reserved, its job available):
//     enqueue status says the queue is paused, enqueue list marks it, the
//     worker exports ingest_queue_paused{queue="fleet_ingest"} 1;
//   - a change the gate does not know (the UI's own queue settings, PATCH,
//     sent from the page; an unknown route with the operator token) is
//     refused 403 naming what to use instead, and changes nothing;
//   - Resume (logged too) lets the batch run to Succeeded;
//   - none of the UI's requests is in the door's metrics
//     (ingest_http_requests_total), they are in
//     ingest_riverui_requests_total, and its polls are not logged at info.
func TestRiverUIQueuePauseIsAnOperatorAction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	serve, public, base := startRiverUIServe(t, dbURL)
	w := startWorker(t, dbURL, fastLease...)
	pausedAt := func() bool {
		var paused bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT paused_at IS NOT NULL FROM river_queue WHERE name = 'fleet_ingest'`).Scan(&paused))
		return paused
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_queue WHERE name = 'fleet_ingest'`).Scan(&n))
		return n == 1
	}, 30*time.Second, 50*time.Millisecond, "the worker's producer records its queue")
	require.False(t, pausedAt())

	bctx := newBrowser(t, 150*time.Second)
	login := withAuthorization("Basic " + basicAuth("ops", "ui-operator-token"))
	// click presses the queue page's button titled title, once it shows.
	click := func(title string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			sel := fmt.Sprintf(`document.querySelector('button[title=%q]')`, title)
			if _, err := chromedp.Poll[bool](sel+` !== null && !`+sel+`.disabled`, chromedp.WithPollingTimeout(60*time.Second))(ctx, tgt); err != nil {
				return fmt.Errorf("no %s button: %w", title, err)
			}
			_, err := chromedp.Evaluate[bool](`(() => { `+sel+`.click(); return true })()`)(ctx, tgt)
			return err
		})
	}

	// Pause, with the UI's own button: allowed, and logged with who.
	require.NoError(t, chromedp.Do(bctx, login, chromedp.Navigate(base+"/riverui/queues/fleet_ingest"), click("Pause")))
	require.Eventually(t, pausedAt, 30*time.Second, 50*time.Millisecond, "the UI paused the queue")
	logged := func(action string) *regexp.Regexp {
		return regexp.MustCompile(`"msg":"operator action","via":"riverui","action":"` + action + `","by":"riverui:ops@[^"]+","queue":"fleet_ingest","status":200`)
	}
	require.Eventually(t, func() bool { return logged("pause_queue").MatchString(serve.logs.String()) }, 10*time.Second, 20*time.Millisecond,
		"the pause is logged as an operator action:\n%s", serve.logs.String())
	pause := findEntry(t, auditEntries(t, dbURL), "queue_pause")
	require.Equal(t, "ops", pause.Actor, "recorded in the operators' audit as by the token's operator")
	require.Equal(t, "fleet_ingest", pause.Queue)

	// The worker's producer learns of the pause within its queue poll
	// (River: 2 s at most); a batch imported after that waits.
	time.Sleep(3 * time.Second)
	_, batchID := importSample(t, public, "tenant-q")
	require.Eventually(t, func() bool { return w.metric(`ingest_queue_paused{queue="fleet_ingest"}`) == 1 }, 20*time.Second, 100*time.Millisecond)
	require.Equal(t, 0.0, w.metric(`ingest_queue_paused{queue="fleet_notify"}`))
	time.Sleep(2 * time.Second)
	b, d := getBatch(t, pool, batchID)
	require.Equal(t, batch.StatusRunning, b.Status)
	require.Equal(t, batch.PhaseReserved, d.Phase)
	require.Equal(t, map[string]int{"available": 1}, jobStates(t, pool, batchID), "no worker takes a paused queue's job")
	text, code := runEnqueue(t, dbURL, "status", "--batch-id", itoa(batchID))
	require.Equal(t, 0, code, text)
	require.Contains(t, text, "waiting: River queue fleet_ingest is paused", "status says why the batch waits")
	require.Contains(t, text, "reserved (queue paused)")
	text, code = runEnqueue(t, dbURL, "list", "--tenant-id", "tenant-q")
	require.Equal(t, 0, code, text)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d .*reserved \(queue paused\)`, batchID), text, "list marks it")

	// Changes the gate does not know: the UI's own queue settings (sent as
	// its page sends them), and an unknown route, with the operator token.
	var patch map[string]any
	require.NoError(t, chromedp.Do(bctx, chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		v, err := chromedp.Evaluate[map[string]any](`fetch("/riverui/api/queues/fleet_ingest", {method: "PATCH", headers: {"Content-Type": "application/json"},
			body: JSON.stringify({concurrency: {global_limit: 1, local_limit: 1}})}).then(async r => ({status: r.status, body: await r.json()}))`, chromedp.EvalAwaitPromise)(ctx, tgt)
		patch = v
		return err
	})))
	require.Equal(t, float64(http.StatusForbidden), patch["status"], "%v", patch)
	require.Contains(t, patch["body"].(map[string]any)["message"], "PATCH /riverui/api/queues/fleet_ingest is not allowed through the River UI")
	var metadata string
	require.NoError(t, pool.QueryRow(ctx, `SELECT metadata::text FROM river_queue WHERE name = 'fleet_ingest'`).Scan(&metadata))
	require.NotContains(t, metadata, "concurrency", "nothing changed")
	for _, method := range []string{http.MethodPost, http.MethodDelete, http.MethodPut} {
		req, err := http.NewRequest(method, base+"/riverui/api/jobs/delete-everything", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.SetBasicAuth("ops", "ui-operator-token")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s %s", method, msg)
		require.Contains(t, resp.Header.Get("Content-Type"), "application/json")
		require.Contains(t, string(msg), "is not allowed through the River UI", method)
		require.Contains(t, string(msg), "use the enqueue commands")
	}

	// Resume: logged, and the batch runs.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(base+"/riverui/queues/fleet_ingest"), click("Resume")))
	require.Eventually(t, func() bool { return !pausedAt() }, 30*time.Second, 50*time.Millisecond, "the UI resumed the queue")
	require.Eventually(t, func() bool { return logged("resume_queue").MatchString(serve.logs.String()) }, 10*time.Second, 20*time.Millisecond)
	waitStatus(t, pool, batchID, batch.StatusSucceeded, 60*time.Second)
	text, code = runEnqueue(t, dbURL, "status", "--batch-id", itoa(batchID))
	require.Equal(t, 0, code, text)
	require.NotContains(t, text, "paused")
	require.Eventually(t, func() bool { return w.metric(`ingest_queue_paused{queue="fleet_ingest"}`) == 0 }, 20*time.Second, 100*time.Millisecond)

	// The door's metrics know nothing of the UI; its own counter does.
	metrics := httpGet(t, base+"/metrics")
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "ingest_http_request") {
			require.NotContains(t, line, "riverui", "the River UI is not the door")
		}
	}
	ui := map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		var code string
		var n float64
		if _, err := fmt.Sscanf(line, `ingest_riverui_requests_total{code=%q} %g`, &code, &n); err == nil {
			ui[code] = n
		}
	}
	require.Greater(t, ui["200"], 5.0, "the UI's pages and polls:\n%s", metrics)
	require.GreaterOrEqual(t, ui["403"], 4.0, "the refused changes")
	// Polls at debug (serve logs at info here); changes at info.
	require.NotRegexp(t, `"level":"INFO","msg":"http request","route":"[^"]*","method":"GET","path":"/riverui`, serve.logs.String())
	require.Regexp(t, `"level":"INFO","msg":"http request","route":"[^"]*","method":"PUT","path":"/riverui/api/queues/fleet_ingest/pause"`, serve.logs.String())
}
