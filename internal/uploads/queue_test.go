package uploads_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/sqstest"
	"github.com/fleet/ingest/internal/uploads"
)

// TestReadQueueMessage reads every body an SQS queue of S3 notifications
// receives, with the classification of /v1/events/s3.
func TestReadQueueMessage(t *testing.T) {
	t.Parallel()
	const key = "tenants/acme/db/c/u 1/_SUCCESS"
	want := []uploads.ObjectEvent{{Bucket: "b-1", Key: key, Created: true}}
	for _, c := range []struct {
		name, body string
		want       uploads.QueueMessage
	}{
		{"s3 event", sqstest.S3Event("b-1", key), uploads.QueueMessage{Kind: "s3", Events: want}},
		{"sns envelope", sqstest.SNSEnvelope(sqstest.S3Event("b-1", key)), uploads.QueueMessage{Kind: "sns", Events: want}},
		{"eventbridge", sqstest.EventBridgeObjectCreated("b-1", key), uploads.QueueMessage{Kind: "eventbridge", Events: want}},
		{"test event", sqstest.TestEvent("b-1"), uploads.QueueMessage{Kind: "s3", TestEvent: true}},
		{"test event via sns", sqstest.SNSEnvelope(sqstest.TestEvent("b-1")), uploads.QueueMessage{Kind: "sns", TestEvent: true}},
		{"subscription confirmation", sqstest.SNSSubscriptionConfirmation(), uploads.QueueMessage{Kind: "sns", SNSType: "SubscriptionConfirmation"}},
	} {
		got, err := uploads.ReadQueueMessage([]byte(c.body))
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
	}
	for _, body := range []string{`{}`, `not json`, `{"Records":[{}]}`, sqstest.SNSEnvelope("not json"), `{"Type":"Notification","Records":[]}`} {
		_, err := uploads.ReadQueueMessage([]byte(body))
		require.ErrorIs(t, err, uploads.ErrMalformedEvent, body)
	}
}
