package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/notify"
	"github.com/fleet/ingest/internal/notify/goawstest"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// webhookReceiver is a tenant's webhook: it checks each request's
// signature and keeps every notification it is sent, by idempotency key.
type webhookReceiver struct {
	secret []byte

	mu       sync.Mutex
	received map[string][]notify.Notification
	unsigned int
}

func (rc *webhookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if notify.Verify(rc.secret, raw, r.Header.Get(notify.HeaderSignature), r.Header.Get(notify.HeaderTimestamp), 5*time.Minute, time.Now()) != nil {
		rc.unsigned++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var n notify.Notification
	if json.Unmarshal(raw, &n) != nil || n.IdempotencyKey != r.Header.Get(notify.HeaderIdempotencyKey) {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.received[n.IdempotencyKey] = append(rc.received[n.IdempotencyKey], n)
	w.WriteHeader(http.StatusNoContent)
}

// snapshot is what was received: each key's notifications.
func (rc *webhookReceiver) snapshot() (map[string][]notify.Notification, int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return maps.Clone(rc.received), rc.unsigned
}

// TestNotificationsSurviveAWorkerKilledAfterTheOutcome: a worker writes a
// success and a failure and is SIGKILLed before River hears that either
// delivery ended (the jobs are left running). The notifications, inserted
// with the terminal writes, are still delivered by another worker: the
// receiver sees exactly the two outcomes' idempotency keys, each once
// after de-duplication, signed with the tenant's secret, with the outcome,
// phase and reason; and one notification job per outcome exists.
func TestNotificationsSurviveAWorkerKilledAfterTheOutcome(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)

	rc := &webhookReceiver{secret: []byte("tenant-n-webhook-secret"), received: map[string][]notify.Notification{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "notifications.json")
	require.NoError(t, os.WriteFile(file, fmt.Appendf(nil,
		`{"tenants": {"tenant-n": [{"name": "hook", "kind": "webhook", "url": %q, "secret": %q}]}}`,
		srv.URL+"/fleet", rc.secret), 0o600))

	// The victim writes the outcomes but sends no notification itself
	// (--notify-concurrency 0), and stops between each terminal write and
	// its job's completion.
	victim := startWorker(t, dbURL, append(fastLease, "--concurrency", "2", "--notifications-file", file,
		"--notify-concurrency", "0", "--test-pause-before-completion", "10m")...)
	okID := enqueueBatch(t, dbURL, "tenant-n", writeFolder(t, sample))
	incomplete := maps.Clone(sample)
	delete(incomplete, "_SUCCESS")
	failedID := enqueueBatch(t, dbURL, "tenant-n", writeFolder(t, incomplete))

	ok := waitStatus(t, pool, okID, batch.StatusSucceeded, 60*time.Second)
	failed := waitStatus(t, pool, failedID, batch.StatusFailed, 60*time.Second)
	require.Eventually(t, func() bool {
		return strings.Count(victim.logs.String(), "pausing between the batch's terminal write and the job's completion") == 2
	}, 30*time.Second, 20*time.Millisecond)
	victim.signal(syscall.SIGKILL)
	victim.wait(10 * time.Second)
	require.Equal(t, 1, jobStates(t, pool, okID)["running"], "River never heard the delivery end")
	require.Equal(t, 1, jobStates(t, pool, failedID)["running"])
	got, _ := rc.snapshot()
	require.Empty(t, got, "nothing sent before the kill")

	startWorker(t, dbURL, append(fastLease, "--notifications-file", file, "--notify-retry-base", "200ms")...)
	okKey := notify.Key(ok.Ref(), notify.OutcomeSucceeded, ok.LeaseGeneration)
	failedKey := notify.Key(failed.Ref(), notify.OutcomeFailed, failed.LeaseGeneration)
	require.Eventually(t, func() bool {
		got, _ := rc.snapshot()
		return len(got[okKey]) > 0 && len(got[failedKey]) > 0
	}, 60*time.Second, 50*time.Millisecond, "both outcomes delivered")
	// Nothing more arrives: no third outcome, no copy under another key.
	time.Sleep(2 * time.Second)
	got, unsigned := rc.snapshot()
	require.Zero(t, unsigned)
	require.ElementsMatch(t, []string{okKey, failedKey}, slices.Collect(maps.Keys(got)), "each outcome once after de-duplication by key")
	for key, ns := range got {
		t.Logf("%s: received %d time(s)", key, len(ns))
	}

	s := got[okKey][0]
	require.Equal(t, notify.OutcomeSucceeded, s.Outcome)
	require.Equal(t, "Succeeded", s.Status)
	require.Equal(t, "tenant-n", s.TenantID)
	require.Equal(t, strings.TrimPrefix(ok.Scope(), "fleet_s3:"), s.Folder)
	require.True(t, strings.HasPrefix(s.Folder, "file:///"), s.Folder)
	f := got[failedKey][0]
	require.Equal(t, notify.OutcomeFailed, f.Outcome)
	require.Equal(t, string(batch.PhaseFailedPreCommit), f.Phase)
	require.Equal(t, string(batch.ReasonFolderIncomplete), f.Reason)

	var outcomeJobs int
	require.NoError(t, pool.QueryRow(t.Context(), `
		SELECT count(*) FROM river_job WHERE kind = 'fleet_outcome'
		AND (args->'notification'->>'batch_id')::bigint IN ($1, $2)`, okID, failedID).Scan(&outcomeJobs))
	require.Equal(t, 2, outcomeJobs, "one notification job per outcome")
}

// TestWorkerPublishesOutcomesToAnSNSTopic: a tenant whose destination is
// an SNS topic hears its batch's outcome there: the worker process
// publishes with the AWS SDK's default configuration (here pointed at a
// goaws process by AWS_ENDPOINT_URL_SNS), the message is the notification
// and carries its idempotency key as an attribute.
func TestWorkerPublishesOutcomesToAnSNSTopic(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	sns := goawstest.Start(t)
	topic := sns.CreateTopic(t, "fleet-tenant-s")

	type envelope struct {
		Type, TopicArn, Message string
		MessageAttributes       map[string]struct{ Type, Value string }
	}
	got := make(chan envelope, 10)
	sub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var e envelope
		if json.NewDecoder(r.Body).Decode(&e) == nil && e.Type == "Notification" {
			got <- e
		}
	}))
	t.Cleanup(sub.Close)
	sns.Subscribe(t, topic, sub.URL+"/sns")

	file := filepath.Join(t.TempDir(), "notifications.json")
	require.NoError(t, os.WriteFile(file, fmt.Appendf(nil,
		`{"tenants": {"tenant-s": [{"name": "topic", "kind": "sns", "topic_arn": %q}]}}`, topic), 0o600))
	startWorkerEnv(t, dbURL, sns.Env(), append(fastLease, "--notifications-file", file)...)
	id := enqueueBatch(t, dbURL, "tenant-s", writeFolder(t, sample))
	b := waitStatus(t, pool, id, batch.StatusSucceeded, 60*time.Second)

	var e envelope
	select {
	case e = <-got:
	case <-time.After(60 * time.Second):
		t.Fatalf("no SNS message within 60 s; goaws logs:\n%s", sns.Logs())
	}
	require.Equal(t, topic, e.TopicArn)
	var n notify.Notification
	require.NoError(t, json.Unmarshal([]byte(e.Message), &n))
	key := notify.Key(b.Ref(), notify.OutcomeSucceeded, b.LeaseGeneration)
	require.Equal(t, key, n.IdempotencyKey)
	require.Equal(t, notify.OutcomeSucceeded, n.Outcome)
	require.Equal(t, "tenant-s", n.TenantID)
	require.Equal(t, key, e.MessageAttributes["idempotency_key"].Value)
}

// TestANotificationJobLeftRunningIsRescued: an outcome's notification job
// is left running with nobody working it, as a process that died during
// its fan-out leaves it, or a failover to a standby that was behind (the
// job's completion was in the lost tail). River's rescuer retries it after
// --rescue-stuck-jobs-after and the tenant is notified. Before, the
// outcome job took the disabled timeout of the ingest jobs (-1), which
// River never rescues: it stayed running and nothing was sent (found by
// the chaos scenario lost-tail).
func TestANotificationJobLeftRunningIsRescued(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	rc := &webhookReceiver{secret: []byte("tenant-r-webhook-secret"), received: map[string][]notify.Notification{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "notifications.json")
	require.NoError(t, os.WriteFile(file, fmt.Appendf(nil,
		`{"tenants": {"tenant-r": [{"name": "hook", "kind": "webhook", "url": %q, "secret": %q}]}}`, srv.URL+"/fleet", rc.secret), 0o600))

	const key = "batch-6f1c0e52-7f0a-4c1e-9a57-2d7b8c1e0f44-succeeded-1"
	_, err := pool.Exec(context.Background(), `
		INSERT INTO river_job (kind, queue, args, state, attempt, attempted_at, attempted_by, max_attempts, priority, scheduled_at)
		VALUES ('fleet_outcome', 'fleet_notify', $1, 'running', 1, now() - interval '10 minutes', '{gone}', 25, 1, now() - interval '10 minutes')`,
		fmt.Sprintf(`{"notification": {"idempotency_key": %q, "outcome": "succeeded", "batch_id": 7, "batch_uid": "6f1c0e52-7f0a-4c1e-9a57-2d7b8c1e0f44",
			"tenant_id": "tenant-r", "status": "Succeeded", "phase": "published", "at": "2026-12-05T10:00:00Z"}}`, key))
	require.NoError(t, err)
	start := time.Now()
	startWorker(t, dbURL, append(slices.Clone(fastLease), "--notifications-file", file, "--notify-timeout", "2s", "--rescue-stuck-jobs-after", "1s")...)
	require.Eventually(t, func() bool {
		got, _ := rc.snapshot()
		return len(got[key]) > 0
	}, 2*time.Minute, 200*time.Millisecond, "the outcome left running was never notified")
	t.Logf("rescued and notified after %s", time.Since(start).Round(time.Millisecond))
}
