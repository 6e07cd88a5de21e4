package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/notify/goawstest"
)

// wire records the form of every request an SNS client sends.
type wire struct {
	mu    sync.Mutex
	forms []url.Values
}

func (w *wire) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		raw, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(raw))
		form, err := url.ParseQuery(string(raw))
		if err != nil {
			return nil, err
		}
		w.mu.Lock()
		w.forms = append(w.forms, form)
		w.mu.Unlock()
	}
	return http.DefaultClient.Do(req)
}

func (w *wire) last() url.Values {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.forms[len(w.forms)-1]
}

// snsEnvelope is what SNS (here goaws) posts to an http subscription.
type snsEnvelope struct {
	Type, TopicArn, Subject, Message string
	MessageAttributes                map[string]struct{ Type, Value string }
}

// subscriber is an http endpoint subscribed to topicARN on s; it returns
// the notifications it receives (the confirmation left out).
func subscriber(t *testing.T, s *goawstest.Server, topicARN string) chan snsEnvelope {
	got := make(chan snsEnvelope, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var e snsEnvelope
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil {
			t.Errorf("an undecodable delivery: %v", err)
			return
		}
		if e.Type == "Notification" {
			got <- e
		}
	}))
	t.Cleanup(srv.Close)
	s.Subscribe(t, topicARN, srv.URL+"/sns")
	return got
}

func delivered(t *testing.T, got chan snsEnvelope) snsEnvelope {
	t.Helper()
	select {
	case e := <-got:
		return e
	default: // goaws delivers before Publish answers
		t.Fatal("nothing delivered")
		return snsEnvelope{}
	}
}

// TestSNSDelivers publishes through the Sender and a real SDK client to
// goaws, and checks what an http subscriber of the topic receives: our
// JSON as the message, the subject and the String attributes. On a FIFO
// topic the request also carries the message group and deduplication id
// (goaws ignores them: see goawstest).
func TestSNSDelivers(t *testing.T) {
	t.Parallel()
	s := goawstest.Start(t)
	standard := s.CreateTopic(t, "fleet-acme")
	fifo := s.CreateTopic(t, "fleet-acme.fifo")
	gotStandard, gotFIFO := subscriber(t, s, standard), subscriber(t, s, fifo)

	// The destinations file accepts goaws's ARNs.
	cfg, err := Parse([]byte(`{"tenants": {"acme": [
		{"name": "alerts", "kind": "sns", "topic_arn": "` + standard + `"},
		{"name": "ordered", "kind": "sns", "topic_arn": "` + fifo + `"}]}}`))
	require.NoError(t, err)
	alerts, _ := cfg.Destination("acme", "alerts")
	ordered, _ := cfg.Destination("acme", "ordered")

	w := &wire{}
	m := metrics.New()
	sender := &Sender{SNS: s.Client(func(o *sns.Options) { o.HTTPClient = w }), Metrics: m}
	n := failedNotification()
	body, err := n.Body()
	require.NoError(t, err)

	require.NoError(t, sender.Send(context.Background(), alerts, n))
	e := delivered(t, gotStandard)
	require.Equal(t, standard, e.TopicArn)
	require.Equal(t, string(body), e.Message)
	require.Equal(t, "fleet batch 42 failed", e.Subject)
	require.Len(t, e.MessageAttributes, 3)
	for name, want := range map[string]string{"idempotency_key": "batch-42-failed-3", "outcome": "failed", "tenant_id": "acme"} {
		require.Equal(t, "String", e.MessageAttributes[name].Type, name)
		require.Equal(t, want, e.MessageAttributes[name].Value, name)
	}
	form := w.last()
	require.Equal(t, "Publish", form.Get("Action"))
	require.False(t, form.Has("MessageGroupId"), "a standard topic refuses a group")
	require.False(t, form.Has("MessageDeduplicationId"))
	require.Empty(t, gotFIFO)

	require.NoError(t, sender.Send(context.Background(), ordered, n))
	require.Equal(t, string(body), delivered(t, gotFIFO).Message)
	form = w.last()
	require.Equal(t, "acme:42", form.Get("MessageGroupId"))
	require.Equal(t, DeduplicationID("batch-42-failed-3"), form.Get("MessageDeduplicationId"))
	require.Equal(t, 2.0, testutil.ToFloat64(m.NotificationsSent.WithLabelValues("sns")))
	require.Zero(t, testutil.ToFloat64(m.NotificationsFailed.WithLabelValues("sns")))

	// A topic that does not exist: an error naming the destination.
	gone := Destination{Name: "gone", Kind: KindSNS, TopicARN: standard + "-deleted"}
	err = sender.Send(context.Background(), gone, n)
	var se *SendError
	require.True(t, errors.As(err, &se), "%v", err)
	require.Equal(t, "gone", se.Name)
	require.Contains(t, err.Error(), `sns "gone" (`+gone.TopicARN+`)`)
	require.Contains(t, err.Error(), "NonExistentTopic")
	require.Equal(t, 1.0, testutil.ToFloat64(m.NotificationsFailed.WithLabelValues("sns")))
	require.Equal(t, 2.0, testutil.ToFloat64(m.NotificationsSent.WithLabelValues("sns")))
}
