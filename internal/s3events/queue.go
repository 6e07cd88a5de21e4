package s3events

import (
	"encoding/json"
	"fmt"
)

// QueueMessage is the body of one SQS message of S3 notifications, read by
// the same classification as /v1/events/s3 (ReadNotification): an S3 event
// notification (direct, or SNS with raw message delivery), an SNS envelope
// (non-raw delivery) or an EventBridge event.
type QueueMessage struct {
	// Kind is "s3", "sns" or "eventbridge".
	Kind string
	// Events are the object events of the message (none for a test event
	// or an SNS control message).
	Events []ObjectEvent
	// TestEvent is set for the "s3:TestEvent" S3 sends when a bucket's
	// notifications are configured (directly or inside an SNS envelope).
	TestEvent bool
	// SNSType is the Type of an SNS envelope that is not a Notification
	// (a SubscriptionConfirmation of a cross-account subscription): it
	// carries no events and needs an operator.
	SNSType string
}

// ReadQueueMessage reads an SQS message body. The queue's access policy is
// the authority for what arrives through SQS, so an SNS envelope is
// unwrapped without verifying its signature (the HTTP route verifies it,
// because anyone can reach a listener). Errors wrap ErrMalformedEvent.
func ReadQueueMessage(body []byte) (QueueMessage, error) {
	n, err := ReadNotification(body)
	if err != nil {
		return QueueMessage{}, err
	}
	var m QueueMessage
	inner := n.body
	switch n.kind {
	case kindS3Notification:
		m.Kind = "s3"
	case kindSNS:
		m.Kind = "sns"
		if n.sns.Type != SNSNotification {
			m.SNSType = n.sns.Type
			return m, nil
		}
		inner = []byte(n.sns.Message)
	case kindEventBridge:
		m.Kind = "eventbridge"
	}
	if n.kind != kindEventBridge {
		var probe s3Notification
		if err := json.Unmarshal(inner, &probe); err != nil {
			return QueueMessage{}, fmt.Errorf("%w: S3 notification: %v", ErrMalformedEvent, err)
		}
		if probe.Event == "s3:TestEvent" && len(probe.Records) == 0 {
			m.TestEvent = true
			return m, nil
		}
	}
	if m.Events, err = n.Events(); err != nil {
		return QueueMessage{}, err
	}
	return m, nil
}
