package sqstest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// TestSQSServerSpeaksTheSDK sends, receives (with the system attributes
// the consumer reads) and deletes through the real SDK, and checks that a
// message received maxReceiveCount times moves to the dead-letter queue.
//
// Two ways the server differs from SQS, which tests work around: a long
// poll always waits its whole WaitTimeSeconds unless MaxNumberOfMessages
// arrived (SQS answers as soon as messages are there), and a message whose
// visibility timeout ends during a poll is handed out twice in that answer
// (tests short-poll, and the consumer keeps one per message id).
func TestSQSServerSpeaksTheSDK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := sqstest.Start(t)
	dlq := srv.CreateQueue(t, "dlq", nil)
	q := srv.CreateQueue(t, "q", map[string]string{
		"VisibilityTimeout": "1",
		"RedrivePolicy":     fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"2"}`, srv.QueueARN(t, dlq)),
	})
	srv.Send(t, q, "a", "b")
	c := srv.Client()
	receive := func(url string) []types.Message {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
			// The server reads the attributes' former name only (the
			// consumer sends both).
			//lint:ignore SA1019 what the server reads
			AttributeNames: []types.QueueAttributeName{"ApproximateReceiveCount", "SentTimestamp"},
		})
		require.NoError(t, err)
		return out.Messages
	}
	msgs := receive(q)
	require.Len(t, msgs, 2)
	require.Equal(t, "1", msgs[0].Attributes["ApproximateReceiveCount"])
	require.NotEmpty(t, msgs[0].Attributes["SentTimestamp"])
	var del []types.DeleteMessageBatchRequestEntry
	for i, m := range msgs {
		if aws.ToString(m.Body) == "a" {
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
		}
	}
	out, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: del})
	require.NoError(t, err)
	require.Len(t, out.Successful, 1)
	// "b" comes back once more, then moves to the DLQ.
	require.Eventually(t, func() bool { return len(receive(q)) == 1 }, 10e9, 1e8)
	require.Eventually(t, func() bool {
		receive(q)
		v, _ := srv.Counts(t, dlq)
		return v == 1
	}, 10e9, 1e8)
}
