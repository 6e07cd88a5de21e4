package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/fleet"
	"github.com/fleet/ingest/internal/lease"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/notify"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/warehouse"
)

// receiver is a webhook receiver: it checks every request's signature and
// answers with the status its plan gives for that attempt (200 once the
// plan runs out).
type receiver struct {
	secret []byte
	plan   []int

	mu       sync.Mutex
	attempts []receivedAttempt
}

type receivedAttempt struct {
	key, event string
	status     int
	signed     bool
	body       notify.Notification
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var n notify.Notification
	_ = json.Unmarshal(raw, &n)
	err := notify.Verify(rc.secret, raw, r.Header.Get(notify.HeaderSignature), r.Header.Get(notify.HeaderTimestamp), 5*time.Minute, time.Now())
	rc.mu.Lock()
	status := http.StatusOK
	if i := len(rc.attempts); i < len(rc.plan) {
		status = rc.plan[i]
	}
	rc.attempts = append(rc.attempts, receivedAttempt{
		key: r.Header.Get(notify.HeaderIdempotencyKey), event: r.Header.Get(notify.HeaderEvent),
		status: status, signed: err == nil, body: n,
	})
	rc.mu.Unlock()
	w.WriteHeader(status)
}

func (rc *receiver) seen() []receivedAttempt {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]receivedAttempt(nil), rc.attempts...)
}

// notifyFixture runs a River client working ingest and notification jobs,
// with a worker whose terminal writes go through the outbox.
func notifyFixture(t *testing.T, destinations string, maxAttempts int) (*fixture, *metrics.Metrics) {
	t.Helper()
	pool := pgtest.NewPool(t)
	f := newFixtureOn(t, pool, nil)
	cfg, err := notify.Parse([]byte(destinations))
	require.NoError(t, err)
	m := metrics.New()
	w, err := NewIngestWorker(WorkerConfig{
		Store:  batch.NewStore(pool).WithOutbox(NewOutbox(f.enqueuer.River)),
		Leases: lease.NewStore(pool),
		Pipelines: pipeline.Registry{batch.SourceTypeFleetS3: &fleet.Pipeline{
			AllowLocalFolders: true, Warehouse: warehouse.NewPostgres(pool), Logger: slog.New(slog.DiscardHandler)}},
		LeaseTTL: 10 * time.Second, RenewEvery: 200 * time.Millisecond,
		Metrics: m, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	client, err := NewWorkerClient(pool, w, ClientConfig{
		Concurrency: 1, FetchPollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Notify: &NotifyConfig{
			Destinations: cfg, Sender: &notify.Sender{Metrics: m},
			Concurrency: 2, MaxAttempts: maxAttempts, RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
			Metrics: m, Logger: slog.New(slog.DiscardHandler),
		},
	})
	require.NoError(t, err)
	require.NoError(t, client.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = client.Stop(ctx)
	})
	return f, m
}

// deliveryStates are the states of the delivery jobs of batch id, by
// destination, with their attempts.
func deliveryStates(t *testing.T, f *fixture, id int64) map[string]string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `
		SELECT args->>'destination', state || '/' || attempt FROM river_job
		WHERE kind = $1 AND (args->'notification'->>'batch_id')::bigint = $2`, DeliveryArgs{}.Kind(), id)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var dest, state string
		require.NoError(t, rows.Scan(&dest, &state))
		out[dest] = state
	}
	require.NoError(t, rows.Err())
	return out
}

// TestNotificationRetriesUntilTheReceiverAnswers: a batch's outcome reaches
// each destination of its tenant as its own River job. A receiver
// answering 500 three times then 200 gets the notification on the fourth
// try, every attempt signed and carrying the same idempotency key; a
// receiver that always fails is given up after the attempts bound
// (counted by kind), without holding back the other; the other tenant's
// destination hears nothing.
func TestNotificationRetriesUntilTheReceiverAnswers(t *testing.T) {
	t.Parallel()
	flaky := &receiver{secret: []byte("flaky-secret-0123456789"), plan: []int{500, 500, 500}}
	down := &receiver{secret: []byte("down-secret-0123456789"), plan: []int{500, 500, 500, 500, 500, 500, 500, 500}}
	other := &receiver{secret: []byte("other-secret-0123456789")}
	var srvs []*httptest.Server
	for _, rc := range []*receiver{flaky, down, other} {
		srv := httptest.NewServer(rc)
		t.Cleanup(srv.Close)
		srvs = append(srvs, srv)
	}
	f, m := notifyFixture(t, fmt.Sprintf(`{"tenants": {
		"tenant-a": [
			{"name": "flaky", "kind": "webhook", "url": %q, "secret": %q},
			{"name": "down", "kind": "webhook", "url": %q, "secret": %q}],
		"tenant-b": [{"name": "other", "kind": "webhook", "url": %q, "secret": %q}]}}`,
		srvs[0].URL+"/hook", flaky.secret, srvs[1].URL+"/hook", down.secret, srvs[2].URL+"/hook", other.secret), 5)

	id := f.importBatch(t, "tenant-a")
	// The flaky destination delivers on its 4th attempt, the down one is
	// given up after 5.
	var states map[string]string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if states = deliveryStates(t, f, id); states["flaky"] == "completed/4" && states["down"] == "discarded/5" {
			break
		}
	}
	require.Equal(t, map[string]string{"flaky": "completed/4", "down": "discarded/5"}, states)

	b, err := batch.NewStore(f.pool).Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, batch.StatusSucceeded, b.Status)
	key := notify.Key(b.Ref(), notify.OutcomeSucceeded, b.LeaseGeneration)

	got := flaky.seen()
	require.Len(t, got, 4)
	for i, a := range got {
		require.True(t, a.signed, "attempt %d signed with the tenant's secret", i+1)
		require.Equal(t, key, a.key)
		require.Equal(t, key, a.body.IdempotencyKey)
		require.Equal(t, "batch.succeeded", a.event)
		require.Equal(t, id, a.body.BatchID)
		require.Equal(t, "tenant-a", a.body.TenantID)
	}
	require.Equal(t, 200, got[3].status)
	require.Len(t, down.seen(), 5)
	require.Empty(t, other.seen(), "another tenant's destination hears nothing of tenant-a")

	require.Equal(t, 1.0, testutil.ToFloat64(m.NotificationsSent.WithLabelValues("webhook")))
	require.Equal(t, 8.0, testutil.ToFloat64(m.NotificationsFailed.WithLabelValues("webhook")), "3 flaky + 5 down attempts")
	require.Equal(t, 1.0, testutil.ToFloat64(m.NotificationsGivenUp.WithLabelValues("webhook")))
	require.Len(t, outcomeJobs(t, f.pool, id), 1)
}
