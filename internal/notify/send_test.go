package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fleet/ingest/internal/batch"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
)

var at = time.Date(2025, 3, 4, 5, 6, 7, 0, time.FixedZone("CET", 3600))

func failedNotification() Notification {
	return Notification{
		IdempotencyKey: Key(batch.Ref{ID: 42}, OutcomeFailed, 3),
		Outcome:        OutcomeFailed,
		BatchID:        42,
		TenantID:       "acme",
		Folder:         "fleet/acme/2025-03-04/",
		Status:         "Failed",
		Phase:          "failed_pre_commit",
		Reason:         "folder_incomplete",
		Message:        "no completion marker",
		At:             at,
	}
}

func TestKeyAndBody(t *testing.T) {
	require.Equal(t, "batch-42-failed-3", Key(batch.Ref{ID: 42}, OutcomeFailed, 3), "a legacy batch (no uid) keeps the key of its id")
	require.NotEqual(t, Key(batch.Ref{ID: 42}, OutcomeFailed, 3), Key(batch.Ref{ID: 42}, OutcomeFailed, 4), "a resumed batch failing again is another notification")
	const uid = "0f8b5e1c-3a2d-4c6e-9b7a-5d4e3f2a1b0c"
	require.Equal(t, "batch-"+uid+"-failed-3", Key(batch.Ref{ID: 42, UID: uid}, OutcomeFailed, 3))
	require.NotEqual(t, Key(batch.Ref{ID: 42, UID: uid}, OutcomeFailed, 3), Key(batch.Ref{ID: 42, UID: "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"}, OutcomeFailed, 3),
		"two batches handed the same id (the database went back in time in between) never share a key")
	body, err := failedNotification().Body()
	require.NoError(t, err)
	require.JSONEq(t, `{"idempotency_key":"batch-42-failed-3","outcome":"failed","batch_id":42,"tenant_id":"acme",
		"folder":"fleet/acme/2025-03-04/","status":"Failed","phase":"failed_pre_commit","reason":"folder_incomplete",
		"message":"no completion marker","at":"2025-03-04T04:06:07Z"}`, string(body))
	body, err = Notification{IdempotencyKey: "k", Outcome: OutcomeSucceeded, BatchID: 1, TenantID: "acme", Status: "Succeeded", At: at}.Body()
	require.NoError(t, err)
	require.JSONEq(t, `{"idempotency_key":"k","outcome":"succeeded","batch_id":1,"tenant_id":"acme","status":"Succeeded","at":"2025-03-04T04:06:07Z"}`, string(body), "empty optional fields are left out")
	require.Equal(t, "batch.parked", OutcomeParked.Event())
}

// TestSignKnownAnswer pins the signature scheme (the door's: HMAC-SHA256
// over timestamp "." body) to a value computed with openssl.
func TestSignKnownAnswer(t *testing.T) {
	body := []byte(`{"idempotency_key":"batch-42-failed-3"}`)
	sig, ts := Sign([]byte(secretA), body, time.Unix(1700000000, 0))
	require.Equal(t, "1700000000", ts)
	require.Equal(t, "sha256=a2df8f5a4d60c3bcf159e32927611736675df6d22285bb5c375c8ada5c8b5dc4", sig)
}

func TestVerify(t *testing.T) {
	body := []byte(`{"a":1}`)
	now := time.Unix(1700000000, 0)
	sig, ts := Sign([]byte(secretA), body, now)
	require.NoError(t, Verify([]byte(secretA), body, sig, ts, 5*time.Minute, now.Add(5*time.Minute)))
	require.NoError(t, Verify([]byte(secretA), body, sig, ts, 5*time.Minute, now.Add(-MaxFutureSkew)), "a sender's clock a little ahead")
	require.ErrorIs(t, Verify([]byte(secretA), []byte(`{"a":2}`), sig, ts, 5*time.Minute, now), ErrBadSignature)
	require.ErrorIs(t, Verify([]byte("another-secret-0123"), body, sig, ts, 5*time.Minute, now), ErrBadSignature)
	require.ErrorIs(t, Verify([]byte(secretA), body, sig, ts, 5*time.Minute, now.Add(5*time.Minute+time.Second)), ErrSignatureExpired)
	require.ErrorIs(t, Verify([]byte(secretA), body, sig, ts, 5*time.Minute, now.Add(-MaxFutureSkew-time.Second)), ErrSignatureExpired)
	require.ErrorIs(t, Verify([]byte(secretA), body, sig, "17e8", 5*time.Minute, now), ErrBadTimestamp)
	// The timestamp is signed: moving it forward breaks the signature.
	require.ErrorIs(t, Verify([]byte(secretA), body, sig, "1700000030", 5*time.Minute, now), ErrBadSignature)
}

// received is one request a test webhook got.
type received struct {
	header http.Header
	body   []byte
	method string
	query  string
}

// hookServer answers every request with status and records it.
func hookServer(t *testing.T, status int) (*httptest.Server, chan received) {
	got := make(chan received, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- received{header: r.Header.Clone(), body: body, method: r.Method, query: r.URL.RawQuery}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// TestWebhookDelivers: the receiver sees the headers and the body, and
// the signature verifies with Verify.
func TestWebhookDelivers(t *testing.T) {
	srv, got := hookServer(t, http.StatusNoContent)
	m := metrics.New()
	now := time.Now()
	s := &Sender{Metrics: m, Now: func() time.Time { return now }}
	d := Destination{Name: "ops-hook", Kind: KindWebhook, URL: srv.URL + "/fleet?token=tok123", Secret: secretA}
	require.NoError(t, s.Send(context.Background(), d, failedNotification()))

	r := <-got
	require.Equal(t, http.MethodPost, r.method)
	require.Equal(t, "token=tok123", r.query, "the URL is used whole")
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.Equal(t, "batch.failed", r.header.Get(HeaderEvent))
	require.Equal(t, "batch-42-failed-3", r.header.Get(HeaderIdempotencyKey))
	require.NoError(t, Verify([]byte(secretA), r.body, r.header.Get(HeaderSignature), r.header.Get(HeaderTimestamp), time.Minute, time.Now()))
	require.Equal(t, now.Unix(), mustInt(t, r.header.Get(HeaderTimestamp)))
	var n Notification
	require.NoError(t, json.Unmarshal(r.body, &n))
	want := failedNotification()
	want.At = want.At.UTC()
	require.Equal(t, want, n)
	require.NotContains(t, string(r.body)+strings.Join(flatten(r.header), " "), secretA, "the secret itself is never sent")

	require.Equal(t, 1.0, testutil.ToFloat64(m.NotificationsSent.WithLabelValues("webhook")))
	require.Zero(t, testutil.ToFloat64(m.NotificationsFailed.WithLabelValues("webhook")))
}

func TestWebhookOverTLS(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	defer srv.Close()
	d := Destination{Name: "tls", Kind: KindWebhook, URL: srv.URL + "/x", Secret: secretA}
	require.Error(t, (&Sender{}).Send(context.Background(), d, failedNotification()), "the default client checks certificates")
	require.NoError(t, (&Sender{HTTP: srv.Client()}).Send(context.Background(), d, failedNotification()))
	require.Equal(t, int32(1), hits.Load())
}

// TestWebhookFailures: a non-2xx answer, a redirect and a transport error
// are errors naming the destination and the status, never its secret or
// the URL's userinfo and query.
func TestWebhookFailures(t *testing.T) {
	m := metrics.New()
	s := &Sender{Metrics: m}
	checkErr := func(t *testing.T, err error, status int, contains ...string) {
		t.Helper()
		var se *SendError
		require.True(t, errors.As(err, &se), "%v", err)
		require.Equal(t, status, se.StatusCode)
		msg := err.Error()
		require.Contains(t, msg, `webhook "ops-hook"`)
		for _, c := range contains {
			require.Contains(t, msg, c)
		}
		for _, leak := range []string{secretA, "tok123", "bob", "pw@"} {
			require.NotContains(t, msg, leak)
		}
	}
	dest := func(base string) Destination {
		return Destination{Name: "ops-hook", Kind: KindWebhook, URL: strings.Replace(base, "http://", "http://bob:pw@", 1) + "/fleet?token=tok123", Secret: secretA}
	}

	for _, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusBadRequest, http.StatusNotFound} {
		srv, got := hookServer(t, status)
		err := s.Send(context.Background(), dest(srv.URL), failedNotification())
		checkErr(t, err, status, fmt.Sprintf("HTTP %d", status), "(http://"+srv.Listener.Addr().String()+"/fleet)")
		<-got
	}

	// A redirect, to another host or the same one, is not followed, even
	// with a client that would follow it.
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/stolen", code)
		}))
		for _, sender := range []*Sender{s, {HTTP: &http.Client{}, Metrics: m}} {
			err := sender.Send(context.Background(), dest(redirect.URL), failedNotification())
			checkErr(t, err, code, "redirect (not followed)")
		}
		redirect.Close()
	}
	require.Zero(t, elsewhere.Load(), "a redirect was followed")

	// A transport error: nothing listens.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	err = s.Send(context.Background(), dest(closed), failedNotification())
	checkErr(t, err, 0, "POST", "connection refused")

	// A timeout, through the caller's context.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // then the server notices the client leaving
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = s.Send(ctx, dest(slow.URL), failedNotification())
	checkErr(t, err, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	require.Equal(t, 4.0+6+1+1, testutil.ToFloat64(m.NotificationsFailed.WithLabelValues("webhook")))
	require.Zero(t, testutil.ToFloat64(m.NotificationsSent.WithLabelValues("webhook")))
}

// TestSendRefusesBadInput: an invalid notification or destination is an
// error before anything is sent.
func TestSendRefusesBadInput(t *testing.T) {
	srv, got := hookServer(t, http.StatusOK)
	d := Destination{Name: "h", Kind: KindWebhook, URL: srv.URL, Secret: secretA}
	s := &Sender{}
	for _, mutate := range []func(*Notification){
		func(n *Notification) { n.IdempotencyKey = "" },
		func(n *Notification) { n.Outcome = "done" },
		func(n *Notification) { n.BatchID = 0 },
		func(n *Notification) { n.TenantID = "" },
	} {
		n := failedNotification()
		mutate(&n)
		require.Error(t, s.Send(context.Background(), d, n))
	}
	short := d
	short.Secret = "short"
	require.ErrorContains(t, s.Send(context.Background(), short, failedNotification()), "secret is shorter")
	require.ErrorContains(t, s.Send(context.Background(), Destination{Name: "t", Kind: KindSNS, TopicARN: arnA}, failedNotification()), "no SNS client")
	require.ErrorContains(t, s.Send(context.Background(), Destination{Name: "x", Kind: "email"}, failedNotification()), "unknown kind")
	require.Empty(t, got)
}

func TestPublishInput(t *testing.T) {
	n := failedNotification()
	body, err := n.Body()
	require.NoError(t, err)
	in := PublishInput(arnA, n, body)
	require.Equal(t, arnA, aws.ToString(in.TopicArn))
	require.Equal(t, string(body), aws.ToString(in.Message))
	require.Equal(t, "fleet batch 42 failed", aws.ToString(in.Subject))
	require.Len(t, in.MessageAttributes, 3)
	for name, want := range map[string]string{"idempotency_key": "batch-42-failed-3", "outcome": "failed", "tenant_id": "acme"} {
		require.Equal(t, "String", aws.ToString(in.MessageAttributes[name].DataType))
		require.Equal(t, want, aws.ToString(in.MessageAttributes[name].StringValue))
	}
	require.Nil(t, in.MessageGroupId, "a standard topic takes no group")
	require.Nil(t, in.MessageDeduplicationId)

	fifo := PublishInput("arn:aws:sns:eu-west-1:123456789012:fleet-acme.fifo", n, body)
	require.Equal(t, "acme:42", aws.ToString(fifo.MessageGroupId))
	require.Equal(t, DeduplicationID("batch-42-failed-3"), aws.ToString(fifo.MessageDeduplicationId))
	require.Len(t, aws.ToString(fifo.MessageDeduplicationId), 64)
	require.NotEqual(t, DeduplicationID("batch-42-failed-3"), DeduplicationID("batch-42-failed-4"))
}

func TestMessageGroupID(t *testing.T) {
	require.Equal(t, "acme-1.x_y:7", MessageGroupID("acme-1.x_y", 7))
	require.Equal(t, "Fl%C3%B8de%20AS:7", MessageGroupID("Fløde AS", 7), "SNS allows only ASCII letters, digits and punctuation")
	require.Equal(t, "50%25:7", MessageGroupID("50%", 7), "'%' is escaped, so escapes cannot collide")
	long := MessageGroupID(strings.Repeat("é", 50), 9223372036854775807)
	require.LessOrEqual(t, len(long), 128)
	require.True(t, strings.HasSuffix(long, ":9223372036854775807"))
	require.NotEqual(t, long, MessageGroupID(strings.Repeat("è", 50), 9223372036854775807))
	for _, g := range []string{long, MessageGroupID("Fløde AS", 7)} {
		for _, c := range g {
			require.True(t, c > ' ' && c < 0x7f, "%q", g)
		}
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var v int64
	require.NoError(t, json.Unmarshal([]byte(s), &v))
	return v
}

func flatten(h http.Header) []string {
	var out []string
	for k, vs := range h {
		out = append(out, k+": "+strings.Join(vs, ","))
	}
	return out
}

// TestMetricsKnowEveryKind: the counters' kind series are initialised for
// every kind a destination can have.
func TestMetricsKnowEveryKind(t *testing.T) {
	var kinds []string
	for _, k := range Kinds {
		kinds = append(kinds, string(k))
	}
	require.ElementsMatch(t, kinds, metrics.NotificationKinds)
}
