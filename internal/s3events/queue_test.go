package s3events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/s3events"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// TestReadQueueMessage reads every body an SQS queue of S3 notifications
// receives, with the classification of /v1/events/s3.
func TestReadQueueMessage(t *testing.T) {
	t.Parallel()
	const key = "tenants/acme/db/c/u 1/_SUCCESS"
	want := []s3events.ObjectEvent{{Bucket: "b-1", Key: key, Created: true, Name: "ObjectCreated:Put", Source: "aws:s3"}}
	wantEB := []s3events.ObjectEvent{{Bucket: "b-1", Key: key, Created: true, Name: "Object Created", Source: "aws.s3"}}
	for _, c := range []struct {
		name, body string
		want       s3events.QueueMessage
	}{
		{"s3 event", sqstest.S3Event("b-1", key), s3events.QueueMessage{Kind: "s3", Events: want}},
		{"sns envelope", sqstest.SNSEnvelope(sqstest.S3Event("b-1", key)), s3events.QueueMessage{Kind: "sns", Events: want}},
		{"eventbridge", sqstest.EventBridgeObjectCreated("b-1", key), s3events.QueueMessage{Kind: "eventbridge", Events: wantEB}},
		{"test event", sqstest.TestEvent("b-1"), s3events.QueueMessage{Kind: "s3", TestEvent: true}},
		{"test event via sns", sqstest.SNSEnvelope(sqstest.TestEvent("b-1")), s3events.QueueMessage{Kind: "sns", TestEvent: true}},
		{"subscription confirmation", sqstest.SNSSubscriptionConfirmation(), s3events.QueueMessage{Kind: "sns", SNSType: "SubscriptionConfirmation"}},
	} {
		got, err := s3events.ReadQueueMessage([]byte(c.body))
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
	}
	for _, body := range []string{`{}`, `not json`, `{"Records":[{}]}`, sqstest.SNSEnvelope("not json"), `{"Type":"Notification","Records":[]}`} {
		_, err := s3events.ReadQueueMessage([]byte(body))
		require.ErrorIs(t, err, s3events.ErrMalformedEvent, body)
	}
}
